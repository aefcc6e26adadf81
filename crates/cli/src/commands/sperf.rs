//! `roamdisk sperf`: I/O-pattern bandwidth, the seed's Figures 1-5.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_workload::sperf::{self, Custom, Pattern, Sweep};
use roamdisk_workload::target::{Target, TargetOptions};

use crate::args::list;
use crate::progress::{Output, Reporter};
use crate::render::sperf::show;

/// Measure bandwidth of I/O patterns within the first --area bytes of a
/// target (the seed's sperf): sequential, random, strided (a stride of N
/// blocks between requests) and partitioned (N interleaved sequential
/// writers --distance apart), for any block size and read/write mix.
/// --figure runs the sweeps of the seed's figures: 1 bandwidth against
/// block size (sequential/random, read/write), 2 the sequential:random
/// write ratio, 3 write bandwidth against stride (4 and 256 KiB), 4 against
/// the number of interleaved writers 2 AUs apart (256 KiB), 5 against the
/// write share (sequential and random order).
///
/// Time is the simulated card time when the target holds a flashsim layer,
/// else wall-clock time. Targets are as in `roamdisk replay` (stack,
/// O_DIRECT file or device, NBD URI); give several to compare them.
/// Writing destroys the data in the area: targets other than RAM stacks
/// need --destructive.
///
/// Examples:
///   roamdisk sperf flashsim:class6:mem:128M --figure all --plot out/sd
///   roamdisk sperf flashsim:class6:mem:128M flashsim:class4:mem:128M flashsim:class10:mem:128M --figure 2,4 --plot out/cards
///   roamdisk sperf /dev/mmcblk0 --destructive --pattern random --bs 4K,64K,1M --write-pct 100
///   roamdisk sperf 'nbd+unix:///?socket=/tmp/s.sock' --pattern sequential --bs 64K
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Targets to measure (stack, file or device, NBD URI).
    #[arg(required = true)]
    targets: Vec<String>,
    /// Figures to sweep: a list of 1-5, or "all".
    #[arg(long, value_name = "LIST")]
    figure: Option<String>,
    /// Patterns (without --figure): sequential, random, stride:N,
    /// writers:N[:DISTANCE], comma-separated.
    #[arg(long, default_value = "sequential,random")]
    pattern: String,
    /// Block sizes, comma-separated (without --figure), or the range of
    /// the figures' sweeps as FROM-TO.
    #[arg(long, value_name = "LIST")]
    bs: Option<String>,
    /// Percent of requests that are writes, comma-separated (without
    /// --figure).
    #[arg(long, value_name = "LIST", default_value = "0,100")]
    write_pct: String,
    /// The area requests stay in.
    #[arg(long, value_name = "SIZE", default_value = "128M")]
    area: String,
    /// Bytes per measurement (at least 32 requests).
    #[arg(long, value_name = "SIZE", default_value = "16M")]
    bytes: String,
    /// Allocation unit: the partitioned writers of Figure 4 are 2 AUs apart.
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    au: String,
    /// Block size of Figure 5.
    #[arg(long, value_name = "SIZE", default_value = "4K")]
    mix_bs: String,
    /// Random seed of random patterns and mixes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Open files and block devices through the page cache.
    #[arg(long)]
    no_direct: bool,
    /// Allow writing into targets that are not RAM stacks.
    #[arg(long)]
    destructive: bool,
    /// Write plots DIR/sperf-figN.png and .svg (or DIR/sperf.png without
    /// --figure).
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Print every measurement as JSON.
    #[arg(long)]
    json: bool,
}

fn size(s: &str) -> anyhow::Result<u64> {
    Ok(roamdisk_blockdev::units::parse_size(s)?)
}

fn ram_only(spec: &str) -> bool {
    spec.starts_with("mem:") || spec.contains(":mem:")
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let area = size(&a.area)?;
    let bytes = size(&a.bytes)?;
    let au = size(&a.au)?;
    let reg = super::registry();
    let figures: Vec<u32> = match a.figure.as_deref() {
        None => Vec::new(),
        Some("all") => vec![1, 2, 3, 4, 5],
        Some(f) => list(f, |x| {
            x.parse::<u32>()
                .ok()
                .filter(|n| (1..=5).contains(n))
                .with_context(|| format!("--figure: '{x}' is not 1-5 or all"))
        })?,
    };
    let writes = !figures.is_empty()
        || list(&a.write_pct, |x| Ok(x.parse::<u32>().unwrap_or(1)))?
            .iter()
            .any(|&w| w > 0);
    let mut targets = Vec::new();
    for t in &a.targets {
        if writes && !a.destructive && !ram_only(t) {
            bail!(
                "sperf writes into the first {} of '{t}', destroying its data; add --destructive if that is what you want",
                a.area
            );
        }
        let tg = Target::open(
            &reg,
            t,
            &TargetOptions {
                read_only: !writes,
                direct: !a.no_direct,
            },
        )
        .with_context(|| format!("cannot open {t}"))?;
        if tg.size() < area {
            bail!(
                "'{t}' has {} bytes, less than --area {}; use a smaller --area or a larger target",
                tg.size(),
                a.area
            );
        }
        targets.push(tg);
    }
    let mut sweep = Sweep {
        area,
        bytes,
        seed: a.seed,
        au,
        mix_bs: size(&a.mix_bs)?,
        ..Sweep::default()
    };
    if let Some((f, t)) = a.bs.as_deref().and_then(|bs| bs.split_once('-')) {
        sweep.sizes = sperf::block_sizes(size(f)?, size(t)?);
    }
    let jobs = if figures.is_empty() {
        let custom = Custom {
            sizes: match &a.bs {
                Some(bs) if !bs.contains('-') => list(bs, size)?,
                Some(_) => sweep.sizes.clone(),
                None => vec![4096, 64 << 10, 1 << 20],
            },
            patterns: list(&a.pattern, |p| Ok(Pattern::parse(p, au)?))?,
            write_pcts: list(&a.write_pct, |w| {
                w.parse::<u32>()
                    .ok()
                    .filter(|&w| w <= 100)
                    .with_context(|| format!("--write-pct: '{w}' is not 0-100"))
            })?,
            area,
            bytes,
            seed: a.seed,
        };
        sperf::custom_jobs(&custom, targets.len())
    } else {
        sperf::figure_jobs(&figures, &sweep, targets.len())
    };
    let prog = Reporter::new(Output::human(quiet));
    let results = sperf::measure_jobs(&targets, jobs, &prog)?;
    prog.finish();
    show(
        &targets,
        &figures,
        &results,
        a.json,
        a.plot.as_deref(),
        quiet,
    )
}
