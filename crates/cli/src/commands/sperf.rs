//! `roamdisk sperf`: I/O-pattern bandwidth, the seed's Figures 1-5.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::parse_size;
use roamdisk_workload::sperf::{self, Curve, Measured, Pattern, Point, Sweep};
use roamdisk_workload::target::{Target, TargetOptions};

use crate::plot::{line_chart, LineChart, Series};
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

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

fn list<T>(s: &str, f: impl Fn(&str) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(f)
        .collect()
}

fn size(s: &str) -> anyhow::Result<u64> {
    parse_size(s).map_err(anyhow::Error::msg)
}

fn pattern(s: &str, au: u64) -> anyhow::Result<Pattern> {
    let parts: Vec<&str> = s.split(':').collect();
    Ok(match parts.as_slice() {
        ["sequential"] | ["seq"] => Pattern::Sequential,
        ["random"] => Pattern::Random,
        ["stride", n] => Pattern::Strided {
            stride: n
                .parse()
                .with_context(|| format!("stride:N needs a number of blocks, not '{n}'"))?,
        },
        ["writers", n] | ["writers", n, _] => Pattern::Partitioned {
            writers: n
                .parse()
                .ok()
                .filter(|&w: &u64| w > 0)
                .with_context(|| format!("writers:N needs a count, not '{n}'"))?,
            distance: match parts.get(2) {
                Some(d) => size(d)?,
                None => 2 * au,
            },
        },
        _ => bail!("unknown pattern '{s}' (sequential, random, stride:N, writers:N[:DISTANCE])"),
    })
}

fn ram_only(spec: &str) -> bool {
    spec.starts_with("mem:") || spec.contains(":mem:")
}

fn label(t: &str) -> String {
    if t.len() <= 40 {
        t.to_string()
    } else {
        format!(
            "{}…",
            &t[..t.char_indices().nth(39).map_or(t.len(), |c| c.0)]
        )
    }
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
    if let Some(bs) = &a.bs {
        if let Some((f, t)) = bs.split_once('-') {
            sweep.sizes = sperf::block_sizes(size(f)?, size(t)?);
        }
    }
    // Every (figure, target, curve, x, point) to measure.
    let mut jobs: Vec<(u32, usize, String, f64, Point)> = Vec::new();
    if figures.is_empty() {
        let sizes = match &a.bs {
            Some(bs) if !bs.contains('-') => list(bs, size)?,
            Some(_) => sweep.sizes.clone(),
            None => vec![4096, 64 << 10, 1 << 20],
        };
        let pats = list(&a.pattern, |p| pattern(p, au))?;
        let wps = list(&a.write_pct, |w| {
            w.parse::<u32>()
                .ok()
                .filter(|&w| w <= 100)
                .with_context(|| format!("--write-pct: '{w}' is not 0-100"))
        })?;
        for (ti, _) in targets.iter().enumerate() {
            for p in &pats {
                for &w in &wps {
                    for &bs in &sizes {
                        let name = format!("{} {}% writes", p.label(), w);
                        jobs.push((
                            0,
                            ti,
                            name,
                            (bs >> 10) as f64,
                            Point {
                                pattern: *p,
                                bs,
                                write_pct: w,
                                area,
                                bytes,
                                seed: a.seed,
                            },
                        ));
                    }
                }
            }
        }
    } else {
        for &f in &figures {
            for ti in 0..targets.len() {
                for (name, x, p) in sperf::figure_points(f, &sweep) {
                    jobs.push((f, ti, name, x, p));
                }
            }
        }
    }
    let prog = Reporter::phase_of(
        Output::human(quiet),
        "measuring",
        jobs.len() as u64,
        Unit::Items,
    );
    let mut results: Vec<(u32, usize, String, f64, Measured)> = Vec::new();
    for (i, (f, ti, name, x, p)) in jobs.into_iter().enumerate() {
        let t = &targets[ti];
        let dev = t.connect()?;
        let m = sperf::measure(dev.as_ref(), &p, &|| t.simulated_ns()).with_context(|| {
            format!("measuring {} {} B on {}", p.pattern.label(), p.bs, t.name())
        })?;
        results.push((f, ti, name, x, m));
        prog.set(i as u64 + 1);
    }
    prog.finish();
    if a.json {
        let v: Vec<_> = results
            .iter()
            .map(|(f, ti, name, x, m)| {
                serde_json::json!({"figure": f, "target": targets[*ti].name(), "curve": name, "x": x, "result": m})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
    }
    let multi = targets.len() > 1;
    let groups: Vec<u32> = if figures.is_empty() {
        vec![0]
    } else {
        figures.clone()
    };
    for f in groups {
        let mut curves: Vec<Curve> = Vec::new();
        for (ti, t) in targets.iter().enumerate() {
            let mine: Vec<(String, f64, Measured)> = results
                .iter()
                .filter(|r| r.0 == f && r.1 == ti)
                .map(|r| (r.2.clone(), r.3, r.4.clone()))
                .collect();
            for mut c in sperf::curves(f, &mine) {
                if multi {
                    c.name = format!("{}: {}", label(t.name()), c.name);
                }
                curves.push(c);
            }
        }
        let simulated = results.iter().any(|r| r.4.simulated);
        let (title, x_label, y_label, log_x) = match f {
            0 => ("Bandwidth by block size", "block size (KiB)", "MB/s", true),
            1 => (
                "Fig. 1: bandwidth by block size and ordering",
                "block size (KiB)",
                "MB/s",
                true,
            ),
            2 => (
                "Fig. 2: sequential:random write bandwidth",
                "block size (KiB)",
                "ratio",
                true,
            ),
            3 => (
                "Fig. 3: write bandwidth by stride",
                "stride (KiB)",
                "MB/s",
                true,
            ),
            4 => (
                "Fig. 4: interleaved sequential writers 2 AU apart",
                "writers",
                "MB/s",
                false,
            ),
            _ => (
                "Fig. 5: bandwidth by write share",
                "writes (%)",
                "MB/s",
                false,
            ),
        };
        if !a.json {
            outln!(
                "{title}{}",
                if simulated {
                    " (simulated card time)"
                } else {
                    ""
                }
            );
            for c in &curves {
                let pts: Vec<String> = c
                    .points
                    .iter()
                    .map(|(x, y)| format!("{x}:{y:.3}"))
                    .collect();
                outln!("  {:<40} {}", c.name, pts.join("  "));
            }
            outln!("  ({x_label} : {y_label})");
            outln!();
        }
        if let Some(dir) = &a.plot {
            let stem = if f == 0 {
                dir.join("sperf")
            } else {
                dir.join(format!("sperf-fig{f}"))
            };
            let series: Vec<Series> = curves
                .iter()
                .map(|c| Series {
                    name: c.name.clone(),
                    points: c.points.clone(),
                })
                .collect();
            let (png, _) = line_chart(
                &stem,
                &LineChart {
                    title,
                    x_label,
                    y_label,
                    log_x,
                    log_y: f == 2 || f == 3 || f == 1,
                    series: &series,
                },
            )?;
            if !quiet {
                eprintln!("roamdisk: wrote {} (and .svg)", png.display());
            }
        }
    }
    Ok(())
}
