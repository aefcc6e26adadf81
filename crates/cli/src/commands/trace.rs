//! `roamdisk trace`: trace statistics, synthetic workloads, converters.

use std::io::{BufReader, ErrorKind};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use roamdisk_blockdev::units::parse_size;
use roamdisk_trace::convert::blkparse::BlkparseOptions;
use roamdisk_trace::convert::file::{convert_file, ConvertOptions, Input, Source};
use roamdisk_trace::convert::msr::MsrOptions;
use roamdisk_trace::format::{write_csv, TraceError};
use roamdisk_trace::stats::{self, StatsOptions};
use roamdisk_trace::synth::{self, Kind, SynthOptions};

use crate::progress::{Output, Reporter};
use crate::render::trace::{
    partition_names, plot_stats, print_stats, show_conversion, stats_json, synth_summary, with_hint,
};

/// Block-I/O traces: statistics, synthetic workloads, conversion.
///
/// A trace holds one record per request: time (ns), client, device
/// (partition), op (read, write, trim, write-zeroes, flush), offset,
/// length, fragment. Files are binary (compact, checksummed; any name) or
/// CSV (named *.csv); every command reads both. Record one from a live
/// server with the trace layer, e.g. `roamdisk serve trace:vm.rdtrace:raw:vm.img`,
/// and replay one with `roamdisk replay`. Format: docs/formats/trace.md.
///
/// Examples:
///   roamdisk trace synth android-contacts -o contacts.rdtrace
///   roamdisk trace stats contacts.rdtrace --names android --plot out/contacts
///   roamdisk trace synth desktop --clients 15 --requests 200000 -o desk.rdtrace
///   roamdisk trace synth boot --clients 50 -o boot.rdtrace
///   roamdisk trace convert sda.blkparse.txt -o sda.rdtrace
///   roamdisk trace convert CAMRESWEBA03-lvm0.csv --from msr -o web.rdtrace
///   roamdisk trace cat contacts.rdtrace --limit 20
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Stats(StatsArgs),
    Synth(SynthArgs),
    Convert(ConvertArgs),
    Cat(CatArgs),
}

/// Statistics of a trace: LBS Table 3's columns per partition (KB and
/// counts read and written, the 1 / <=4 / >4 KB size split, skip %, write
/// %, barrier %), the request mix by count and bytes, sizes,
/// sequentiality, working sets, reuse distances, and a line per client.
///
/// Definitions: size classes are below 2 KiB, 2-4 KiB, above 4 KiB; skip %
/// is non-sequential requests per 512-byte sector accessed (the seed's
/// "block accesses not adjacent to a previous access"); a request is
/// sequential when it starts where the previous request of the same client,
/// partition and direction ended; write % and barrier % are per reads plus
/// writes; working sets count distinct --block blocks; reuse distance is
/// the number of block accesses between two accesses of a block.
///
/// Examples:
///   roamdisk trace stats contacts.rdtrace --names android
///   roamdisk trace stats desk.rdtrace --plot out/desk --json > desk.json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct StatsArgs {
    /// The trace (binary or CSV).
    trace: PathBuf,
    /// Partition names: "android" (the seed's Table 2: 0=/system, 1=/data,
    /// 2=/cache, 3=/sdcard, 4=/flex) or a list such as 0=/,1=/home.
    #[arg(long, value_name = "NAMES")]
    names: Option<String>,
    /// Block size of working sets and reuse distances.
    #[arg(long, value_name = "SIZE", default_value = "4K")]
    block: String,
    /// Write plots STEM-sizes, STEM-reuse and STEM-mix (.png and .svg).
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
    /// Print the statistics as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Clients listed in the per-client table (all are in --json).
    #[arg(long, value_name = "N", default_value_t = 20)]
    max_clients: usize,
}

/// Generate a synthetic trace of one of the seeds' workloads; the same
/// --seed gives the same trace. Kinds:
///
///   android-boot, android-contacts, android-email, android-slideshow,
///   android-browsing
///       the five traces of LBS Table 3, per partition (devices 0=/system,
///       1=/data, 2=/cache, 3=/sdcard, 4=/flex); --scale 5 repeats the
///       workload five times, as the seed's evaluation does
///   desktop
///       the TransCom desktop mix: 0.5-64 KB requests, 60% of 4 KB, 70% at
///       most 4 KB, read:write traffic 1:3, working sets 4:5, half
///       sequential; --requests per client (default 100000)
///   boot
///       a boot storm: --clients (default 50) boot one shared image;
///       mostly sequential reads, a shared hot set, few writes; --requests
///       per client (default 4000)
///   vpc-boot, vpc-office
///       Machine Bank's own traces (section 3.3, Figures 4-5): Windows XP
///       under Virtual PC booting, and launching Word, Excel and
///       PowerPoint. Almost all reads are 64 or 32 KiB at 32 KiB-aligned
///       offsets of a 2.9 GB installed system (a 768 MiB page file follows,
///       written, never read); boot: 65% of reads sequential, 10% writes,
///       1800 requests; office: 40% sequential ("a lot of random reads"),
///       5% writes, 1100 requests. The lengths give the seed's ~30 s and
///       ~20 s fetch stall at 64 KiB. For `roamdisk model blocksize`;
///       --clients N makes N independent VMs
///
/// Examples:
///   roamdisk trace synth android-email -o email.rdtrace
///   roamdisk trace synth android-boot --scale 5 --seed 7 -o boot5.rdtrace
///   roamdisk trace synth desktop --clients 15 -o desk.csv
///   roamdisk trace synth vpc-boot -o xp-boot.rdtrace
///   roamdisk trace synth --list
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct SynthArgs {
    /// The workload (see --list).
    #[arg(required_unless_present = "list")]
    kind: Option<String>,
    /// Output trace (*.csv for CSV, anything else binary).
    #[arg(short, long, value_name = "FILE", required_unless_present = "list")]
    output: Option<PathBuf>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Android traces: length as a multiple of the published trace.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Number of clients (each an independent copy, except for boot where
    /// they share one boot script).
    #[arg(long, value_name = "N")]
    clients: Option<u32>,
    /// Desktop, boot and vpc-*: requests per client.
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
    /// List the workloads.
    #[arg(long)]
    list: bool,
}

/// Convert a blkparse text dump or an MSR-Cambridge CSV trace (or a trace
/// in the other of our two formats) into a trace.
///
/// blkparse: default output of `blkparse -i DEV` (or `btrace`); the events
/// of one action are kept (--action, default D: requests dispatched to the
/// driver); device = MAJOR<<20|MINOR, client = process id. MSR:
/// Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime lines;
/// client = host name in order of appearance, device = DiskNumber, time in
/// ns since the first line. Input "-" reads stdin.
///
/// Examples:
///   blkparse -i sda | roamdisk trace convert - -o sda.rdtrace
///   roamdisk trace convert sda.txt --action Q --single-client -o sda.rdtrace
///   roamdisk trace convert usr_0.csv --from msr -o usr0.rdtrace
///   roamdisk trace convert usr0.rdtrace -o usr0.csv
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ConvertArgs {
    /// Input file, or - for stdin.
    input: PathBuf,
    /// Output trace (*.csv for CSV, anything else binary).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Input format: blkparse, msr, or trace (binary or CSV); detected
    /// when not given.
    #[arg(long, value_name = "FORMAT")]
    from: Option<String>,
    /// blkparse: the action whose events become records (Q, D, C, ...).
    #[arg(long, default_value = "D")]
    action: String,
    /// blkparse: record every request as client 0, not its process id.
    #[arg(long)]
    single_client: bool,
    /// MSR: keep absolute times (ns since 1601) instead of times since the
    /// first line.
    #[arg(long)]
    absolute_time: bool,
}

/// Print a trace's records as CSV.
///
/// Example:
///   roamdisk trace cat contacts.rdtrace --limit 20
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct CatArgs {
    trace: PathBuf,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Stats(s) => run_stats(s, quiet),
        Cmd::Synth(s) => run_synth(s, quiet),
        Cmd::Convert(c) => run_convert(c, quiet),
        Cmd::Cat(c) => run_cat(c),
    }
}

fn run_stats(a: StatsArgs, quiet: bool) -> anyhow::Result<()> {
    let names = partition_names(a.names.as_deref())?;
    let block = parse_size(&a.block).context("--block")?;
    if block == 0 {
        bail!("--block must be at least 1 byte");
    }
    let p = Reporter::new(Output::human(quiet));
    let s = stats::analyze_file(&a.trace, StatsOptions { block }, &p).map_err(with_hint)?;
    p.finish();
    if s.total.requests() == 0 {
        bail!("{}: the trace holds no records", a.trace.display());
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&stats_json(&s)?)?);
    } else {
        print_stats(&a.trace, &s, &names, a.max_clients);
    }
    if let Some(stem) = &a.plot {
        plot_stats(stem, &s, quiet)?;
    }
    Ok(())
}

fn run_synth(a: SynthArgs, quiet: bool) -> anyhow::Result<()> {
    if a.list {
        for (name, _, title) in Kind::all() {
            outln!("{name:<20} {title}");
        }
        return Ok(());
    }
    let (Some(kind), Some(out)) = (a.kind, a.output) else {
        bail!("give a workload and -o FILE (see --list)");
    };
    let k = Kind::parse(&kind)?;
    let opts = SynthOptions {
        seed: a.seed,
        scale: a.scale,
        requests: a.requests,
        clients: a.clients,
    };
    let p = Reporter::new(Output::human(quiet));
    let w = synth::write(k, &opts, &out, &p)?;
    p.finish();
    if !quiet {
        eprintln!("roamdisk: {}", synth_summary(k, &w, &out));
    }
    Ok(())
}

fn run_convert(a: ConvertArgs, quiet: bool) -> anyhow::Result<()> {
    let stdin = a.input.as_os_str() == "-";
    let from = a.from.as_deref().map(str::parse::<Source>).transpose()?;
    let input = if stdin {
        Input::Stream(Box::new(BufReader::new(std::io::stdin().lock())))
    } else {
        Input::File(a.input.clone())
    };
    let opts = ConvertOptions {
        from,
        blkparse: BlkparseOptions {
            action: a.action.clone(),
            single_client: a.single_client,
        },
        msr: MsrOptions {
            absolute_time: a.absolute_time,
        },
    };
    let p = Reporter::new(Output::human(quiet || stdin));
    let c = convert_file(input, &a.output, &opts, &p)?;
    p.finish();
    show_conversion(&c, &a.input, &a.output, &a.action, quiet)
}

fn run_cat(a: CatArgs) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match write_csv(&a.trace, a.limit, &mut out) {
        Err(TraceError::Io { source, .. }) if source.kind() == ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
