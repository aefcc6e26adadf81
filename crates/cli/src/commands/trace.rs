//! `roamdisk trace`: trace statistics, synthetic workloads, converters.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use roamdisk_trace::convert::{blkparse, msr, ConvertReport};
use roamdisk_trace::format::{Format, Reader, Record, TraceError, Writer};
use roamdisk_trace::stats::{self, GroupStats, Stats, StatsOptions, Table3Row};
use roamdisk_trace::synth::{self, Kind, SynthOptions};

use crate::plot::{bar_chart, line_chart, LineChart, Series};
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

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

fn parse_names(s: Option<&str>) -> anyhow::Result<BTreeMap<u32, String>> {
    let mut m = BTreeMap::new();
    match s {
        None => {}
        Some("android") => {
            for d in 0..5u32 {
                if let Some(n) = synth::android::partition_name(d) {
                    m.insert(d, n.to_string());
                }
            }
        }
        Some(list) => {
            for kv in list.split(',').filter(|p| !p.trim().is_empty()) {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--names: '{kv}' is not DEVICE=NAME"))?;
                let d: u32 = k
                    .trim()
                    .parse()
                    .with_context(|| format!("--names: '{k}' is not a device number"))?;
                m.insert(d, v.trim().to_string());
            }
        }
    }
    Ok(m)
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Read a whole trace with a progress bar over its bytes.
fn read_trace(path: &Path, quiet: bool, mut f: impl FnMut(&Record)) -> anyhow::Result<u64> {
    let reader = Reader::open(path)?;
    let size = file_size(path);
    let p = Reporter::phase_of(Output::human(quiet), "reading", size.max(1), Unit::Bytes);
    let per_byte = match reader.format() {
        Format::Binary => 5.0,
        Format::Csv => 30.0,
    };
    let mut n = 0u64;
    for r in reader {
        let r = r.map_err(|e| match e {
            TraceError::Truncated { .. } => anyhow::anyhow!(
                "{e}\nhint: a trace whose recorder was killed ends without its end marker; `roamdisk trace convert` copies the valid records into a new file"
            ),
            e => e.into(),
        })?;
        f(&r);
        n += 1;
        if n.is_multiple_of(65536) {
            p.set(((n as f64 * per_byte) as u64).min(size));
        }
    }
    p.finish();
    Ok(n)
}

fn run_stats(a: StatsArgs, quiet: bool) -> anyhow::Result<()> {
    let names = parse_names(a.names.as_deref())?;
    let block = roamdisk_blockdev::units::parse_size(&a.block)
        .map_err(anyhow::Error::msg)
        .context("--block")?;
    if block == 0 {
        bail!("--block must be at least 1 byte");
    }
    let mut an = stats::Analyzer::new(StatsOptions { block });
    let n = read_trace(&a.trace, quiet, |r| an.add(r))?;
    if n == 0 {
        bail!("{}: the trace holds no records", a.trace.display());
    }
    let s = an.finish();
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["table3"] = serde_json::to_value(
            s.partitions
                .iter()
                .map(|(d, g)| (d.to_string(), Table3Row::from(g)))
                .collect::<BTreeMap<_, _>>(),
        )?;
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_stats(&a.trace, &s, &names, a.max_clients);
    }
    if let Some(stem) = &a.plot {
        plot_stats(stem, &s, quiet)?;
    }
    Ok(())
}

fn kib(b: u64) -> f64 {
    b as f64 / 1024.0
}

fn fmt_skip(p: Option<f64>) -> String {
    p.map_or("NA".into(), |v| format!("{v:.0}"))
}

fn table3_line(name: &str, g: &GroupStats) -> String {
    let r = Table3Row::from(g);
    format!(
        "{name:<10} | {:>9.0} {:>7} {:>6} {:>6} {:>6} {:>5} | {:>9.0} {:>7} {:>6} {:>6} {:>6} {:>5} | {:>6.0} {:>8.0}",
        r.read.kib,
        r.read.count,
        r.read.small,
        r.read.medium,
        r.read.large,
        fmt_skip(r.read.skip_pct),
        r.write.kib,
        r.write.count,
        r.write.small,
        r.write.medium,
        r.write.large,
        fmt_skip(r.write.skip_pct),
        r.write_pct,
        r.barrier_pct
    )
}

fn print_stats(path: &Path, s: &Stats, names: &BTreeMap<u32, String>, max_clients: usize) {
    let t = &s.total;
    outln!(
        "{}: {} requests, {} clients, {} partitions, {:.3} s",
        path.display(),
        t.requests(),
        s.clients.len(),
        s.partitions.len(),
        t.duration_s()
    );
    outln!();
    outln!("LBS Table 3 columns per partition (KB = KiB; sizes: 1 = below 2 KiB, <=4 = 2-4 KiB, >4 = above 4 KiB)");
    outln!(
        "{:<10} | {:>9} {:>7} {:>6} {:>6} {:>6} {:>5} | {:>9} {:>7} {:>6} {:>6} {:>6} {:>5} | {:>6} {:>8}",
        "partition", "read KB", "count", "1", "<=4", ">4", "skip%", "write KB", "count", "1", "<=4", ">4",
        "skip%", "write%", "barrier%"
    );
    for (d, g) in &s.partitions {
        let name = names.get(d).cloned().unwrap_or_else(|| d.to_string());
        outln!("{}", table3_line(&name, g));
    }
    if s.partitions.len() > 1 {
        outln!("{}", table3_line("all", t));
    }
    outln!();
    let total_n = t.requests().max(1) as f64;
    let total_b = (t.read.bytes + t.write.bytes + t.trim_bytes + t.zero_bytes).max(1) as f64;
    outln!(
        "{:<13} {:>10} {:>7} {:>14} {:>7}",
        "mix",
        "count",
        "%",
        "KiB",
        "%"
    );
    for (name, c, b) in [
        ("read", t.read.count, t.read.bytes),
        ("write", t.write.count, t.write.bytes),
        ("trim", t.trim_count, t.trim_bytes),
        ("write-zeroes", t.zero_count, t.zero_bytes),
        ("flush", t.flushes, 0),
    ] {
        outln!(
            "{name:<13} {c:>10} {:>7.2} {:>14.0} {:>7.2}",
            100.0 * c as f64 / total_n,
            kib(b),
            100.0 * b as f64 / total_b
        );
    }
    outln!();
    if let Some(min) = s.min_size {
        let (top, share) = s.most_frequent_size().unwrap_or((0, 0.0));
        outln!(
            "sizes: min {:.1} KiB, max {:.1} KiB, mean {:.2} KiB, most frequent {:.1} KiB ({:.1}%), at most 4 KiB {:.1}%",
            kib(min as u64),
            kib(s.max_size as u64),
            s.mean_size() / 1024.0,
            kib(top as u64),
            100.0 * share,
            100.0 * s.share_at_most(4096)
        );
    }
    let seq = |d: &stats::DirStats| {
        d.sequential_pct()
            .map_or("-".into(), |v| format!("{v:.1}%"))
    };
    outln!(
        "sequential requests: reads {}, writes {}, all {:.1}%",
        seq(&t.read),
        seq(&t.write),
        100.0 * (t.read.sequential + t.write.sequential) as f64 / t.rw_count().max(1) as f64
    );
    let mib = |blocks: u64| blocks as f64 * s.block as f64 / 1048576.0;
    outln!(
        "working set ({} B blocks): read {:.1} MiB, written {:.1} MiB, either {:.1} MiB; read:write {:.3}",
        s.block,
        mib(s.read_working_set_blocks),
        mib(s.write_working_set_blocks),
        mib(t.working_set_blocks),
        s.read_working_set_blocks as f64 / s.write_working_set_blocks.max(1) as f64
    );
    let reused: u64 = s.reuse.iter().sum();
    let mut median = String::from("-");
    let mut acc = 0;
    for (i, c) in s.reuse.iter().enumerate() {
        acc += c;
        if reused > 0 && acc * 2 >= reused {
            median = if i == 0 {
                "0".into()
            } else {
                format!("< {}", 1u64 << i)
            };
            break;
        }
    }
    outln!(
        "reuse distance (block accesses in between): {} first accesses, {} re-accesses, median {}",
        s.cold_accesses,
        reused,
        median
    );
    outln!();
    outln!(
        "{:>8} {:>10} {:>12} {:>12} {:>8} {:>7} {:>9} {:>10}",
        "client",
        "requests",
        "read KiB",
        "write KiB",
        "barrier%",
        "seq%",
        "WS MiB",
        "seconds"
    );
    for (c, g) in s.clients.iter().take(max_clients) {
        outln!(
            "{c:>8} {:>10} {:>12.0} {:>12.0} {:>8.1} {:>7.1} {:>9.1} {:>10.3}",
            g.requests(),
            kib(g.read.bytes),
            kib(g.write.bytes),
            g.barrier_pct(),
            100.0 * (g.read.sequential + g.write.sequential) as f64 / g.rw_count().max(1) as f64,
            mib(g.working_set_blocks),
            g.duration_s()
        );
    }
    if s.clients.len() > max_clients {
        outln!(
            "... {} more clients (--max-clients, or --json)",
            s.clients.len() - max_clients
        );
    }
}

fn plot_stats(stem: &Path, s: &Stats, quiet: bool) -> anyhow::Result<()> {
    let total: u64 = s.sizes.values().sum();
    let mut buckets: BTreeMap<u32, u64> = BTreeMap::new();
    for (&size, &c) in &s.sizes {
        let b = size.max(1).next_power_of_two().max(512);
        *buckets.entry(b).or_default() += c;
    }
    let bars: Vec<(String, f64)> = buckets
        .iter()
        .map(|(b, c)| {
            let label = if *b >= 1024 {
                format!("≤{}K", b / 1024)
            } else {
                format!("≤{b}")
            };
            (label, 100.0 * *c as f64 / total.max(1) as f64)
        })
        .collect();
    let mut written = Vec::new();
    if !bars.is_empty() {
        let (png, _) = bar_chart(
            &stem.with_file_name(format!("{}-sizes", file_stem(stem))),
            "Request sizes",
            "% of reads and writes",
            &bars,
        )?;
        written.push(png);
    }
    let reused: u64 = s.reuse.iter().sum();
    if reused > 0 {
        let last = s.reuse.iter().rposition(|&c| c > 0).unwrap_or(0);
        let mut acc = 0u64;
        let pts: Vec<(f64, f64)> = s.reuse[..=last]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                acc += c;
                (2f64.powi(i as i32), 100.0 * acc as f64 / reused as f64)
            })
            .collect();
        let (png, _) = line_chart(
            &stem.with_file_name(format!("{}-reuse", file_stem(stem))),
            &LineChart {
                title: "Reuse distance",
                x_label: "block accesses between two accesses of a block (less than)",
                y_label: "% of re-accesses",
                log_x: true,
                log_y: false,
                series: &[Series {
                    name: "cumulative".into(),
                    points: pts,
                }],
            },
        )?;
        written.push(png);
    }
    let t = &s.total;
    let (png, _) = bar_chart(
        &stem.with_file_name(format!("{}-mix", file_stem(stem))),
        "Request mix by bytes",
        "MiB",
        &[
            ("read".into(), t.read.bytes as f64 / 1048576.0),
            ("write".into(), t.write.bytes as f64 / 1048576.0),
            ("trim".into(), t.trim_bytes as f64 / 1048576.0),
            ("write-zeroes".into(), t.zero_bytes as f64 / 1048576.0),
        ],
    )?;
    written.push(png);
    if !quiet {
        for w in written {
            eprintln!("roamdisk: wrote {} (and .svg)", w.display());
        }
    }
    Ok(())
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "trace".into())
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
    let k = Kind::parse(&kind).map_err(anyhow::Error::msg)?;
    let opts = SynthOptions {
        seed: a.seed,
        scale: a.scale,
        requests: a.requests,
        clients: a.clients,
    };
    let expected: u64 = match k {
        Kind::Android(i) => {
            let t = &synth::android::TRACES[i];
            let per: u64 = t
                .partitions
                .iter()
                .map(|p| {
                    let rw = p.read.count + p.write.count;
                    rw + rw * p.barrier_pct as u64 / 100
                })
                .sum();
            (per as f64 * a.scale) as u64 * a.clients.unwrap_or(1) as u64
        }
        Kind::Desktop => {
            a.requests.unwrap_or(synth::desktop::DEFAULT_REQUESTS) * a.clients.unwrap_or(1) as u64
        }
        Kind::Boot => {
            let n = a.requests.unwrap_or(synth::boot::DEFAULT_REQUESTS)
                * a.clients.unwrap_or(synth::boot::DEFAULT_CLIENTS) as u64;
            n + n / 80
        }
        Kind::VpcBoot | Kind::VpcOffice => {
            let p = if k == Kind::VpcBoot {
                synth::vpc::VpcParams::boot()
            } else {
                synth::vpc::VpcParams::office()
            };
            a.requests.unwrap_or(p.requests) * a.clients.unwrap_or(1) as u64
        }
    };
    let gen = synth::generate(k, &opts).map_err(anyhow::Error::msg)?;
    let mut w = Writer::create(&out, Format::from_path(&out))?;
    let p = Reporter::phase_of(
        Output::human(quiet),
        "generating",
        expected.max(1),
        Unit::Items,
    );
    let mut n = 0u64;
    let mut last = 0u64;
    let mut devices = std::collections::BTreeSet::new();
    let mut clients = std::collections::BTreeSet::new();
    for r in gen {
        w.write(&r)?;
        devices.insert(r.device);
        clients.insert(r.client);
        last = r.time_ns;
        n += 1;
        if n.is_multiple_of(65536) {
            p.set(n.min(expected));
        }
    }
    w.finish()?;
    p.finish();
    if !quiet {
        let names: Vec<String> = devices
            .iter()
            .map(|d| match (k, synth::android::partition_name(*d)) {
                (Kind::Android(_), Some(name)) => format!("{d}={name}"),
                _ => d.to_string(),
            })
            .collect();
        eprintln!(
            "roamdisk: wrote {n} records to {} ({} clients, devices {}, {:.1} s of trace)",
            out.display(),
            clients.len(),
            names.join(","),
            last as f64 / 1e9
        );
    }
    Ok(())
}

/// Guess the input format from the first bytes.
fn detect(path: &Path) -> anyhow::Result<&'static str> {
    if Reader::open(path).is_ok() {
        return Ok("trace");
    }
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    for line in BufReader::new(f).lines().take(50) {
        let line = line.unwrap_or_default();
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        if blkparse::parse_line(l, 1).ok().flatten().is_some() {
            return Ok("blkparse");
        }
        if l.split(',').count() == 7 {
            return Ok("msr");
        }
    }
    bail!(
        "{}: cannot tell the format (not a roamdisk trace, blkparse text or MSR CSV); say it with --from",
        path.display()
    )
}

fn run_convert(a: ConvertArgs, quiet: bool) -> anyhow::Result<()> {
    let stdin = a.input.as_os_str() == "-";
    let from = match (&a.from, stdin) {
        (Some(f), _) => f.clone(),
        (None, true) => "blkparse".into(),
        (None, false) => detect(&a.input)?.into(),
    };
    let mut w = Writer::create(&a.output, Format::from_path(&a.output))?;
    let input: Box<dyn BufRead> = if stdin {
        Box::new(BufReader::new(std::io::stdin().lock()))
    } else {
        Box::new(BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(&a.input)
                .with_context(|| format!("cannot open {}", a.input.display()))?,
        ))
    };
    let p = Reporter::phase_of(
        Output::human(quiet || stdin),
        "converting",
        file_size(&a.input).max(1),
        Unit::Bytes,
    );
    let mut sink = |r: &Record| -> Result<(), TraceError> {
        w.write(r)?;
        if w.count().is_multiple_of(65536) {
            p.set(w.count() * 40);
        }
        Ok(())
    };
    let at = |e: TraceError| anyhow::anyhow!("{}: {e}", a.input.display());
    let rep: ConvertReport = match from.as_str() {
        "blkparse" => blkparse::convert(
            input,
            &blkparse::BlkparseOptions {
                action: a.action.clone(),
                single_client: a.single_client,
            },
            &mut sink,
        )
        .map_err(at)?,
        "msr" => msr::convert(
            input,
            &msr::MsrOptions {
                absolute_time: a.absolute_time,
            },
            &mut sink,
        )
        .map_err(at)?,
        "trace" => {
            if stdin {
                bail!("--from trace needs a file, not stdin");
            }
            let mut rep = ConvertReport::default();
            let mut truncated = None;
            for r in Reader::open(&a.input)? {
                match r {
                    Ok(r) => {
                        sink(&r)?;
                        rep.records += 1;
                    }
                    Err(e) if e.is_truncated() => {
                        truncated = Some(e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(e) = truncated {
                eprintln!(
                    "roamdisk: warning: {e}; the {} valid records were copied",
                    rep.records
                );
            }
            rep
        }
        other => bail!("--from must be blkparse, msr or trace, not '{other}'"),
    };
    p.finish();
    let n = w.count();
    w.finish()?;
    if n == 0 {
        bail!(
            "{}: no records ({} lines read, {} skipped); wrong --from, or no '{}' events (--action)?",
            a.input.display(),
            rep.lines,
            rep.skipped,
            a.action
        );
    }
    if !quiet {
        eprintln!(
            "roamdisk: wrote {n} records to {} ({} lines read, {} skipped)",
            a.output.display(),
            rep.lines,
            rep.skipped
        );
        for (i, h) in rep.clients.iter().enumerate() {
            eprintln!("roamdisk: client {i} = host {h}");
        }
    }
    Ok(())
}

fn run_cat(a: CatArgs) -> anyhow::Result<()> {
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    writeln!(out, "{}", roamdisk_trace::format::csvfmt::HEADER)?;
    for (i, r) in Reader::open(&a.trace)?.enumerate() {
        if a.limit.is_some_and(|l| i as u64 >= l) {
            break;
        }
        let r = r?;
        let res = writeln!(out, "{}", roamdisk_trace::format::csvfmt::CsvRow(&r));
        if let Err(e) = res {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
    }
    out.flush().or_else(|e| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    Ok(())
}
