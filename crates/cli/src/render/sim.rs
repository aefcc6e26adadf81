//! How `roamdisk sim` shows a run: per level, the policies' hits and
//! misses at every size split by temporal distance (the seed's Table 2
//! form at one size), the exact LRU curve, and the plots.

use std::path::Path;

use roamdisk_blockdev::units::format_size;
use roamdisk_cachesim::policy::{PolicyKind, PolicySpec};
use roamdisk_cachesim::run::Run;
use roamdisk_cachesim::sim::{HitMiss, LevelReport, SimReport};

use crate::plot::{Charts, LineChart, Series};

/// Rows of the Table 2 form at one capacity: (label, short, long), LRU
/// from the exact curve when it was computed.
fn rows_at(
    level: &LevelReport,
    specs: &[PolicySpec],
    cap: usize,
) -> Vec<(String, HitMiss, HitMiss)> {
    let mut rows = Vec::new();
    for spec in specs {
        let label = spec.label();
        if let Some(r) = level
            .results
            .iter()
            .find(|r| r.policy == label && r.capacity == cap)
        {
            rows.push((label, r.short, r.long));
        } else if spec.kind == PolicyKind::Lru {
            if let Some(curve) = &level.lru {
                let (s, l) = curve.at(cap);
                rows.push((label, s, l));
            }
        }
    }
    rows
}

fn level_title(level: &LevelReport) -> String {
    match &level.client {
        None => "single level (the server sees every access)".into(),
        Some(c) => format!(
            "two levels: {} client cache of {} blocks per client ({}) in front of the server",
            c.policy,
            c.capacity,
            if c.write_through {
                "writes through"
            } else {
                "write hits absorbed"
            }
        ),
    }
}

fn k(n: u64) -> String {
    if n >= 10_000 {
        format!("{}k", (n + 500) / 1000)
    } else {
        n.to_string()
    }
}

/// Show a run: its report as JSON, or as tables (every level, every
/// size, the `focus_cap` one marked as the seed's Table 2 form, and the
/// exact LRU curve); with `plot`, the plots too.
pub fn show(
    run: &Run,
    specs: &[PolicySpec],
    focus_cap: usize,
    json: bool,
    plot: Option<&Path>,
) -> anyhow::Result<()> {
    let (r, capacities, working_set) = (&run.report, &run.capacities[..], run.working_set);
    let bs = r.block_size;
    if json {
        outln!("{}", serde_json::to_string_pretty(r)?);
    } else {
        let split = r.split.to_string();
        outln!(
            "trace: {} requests, {} block accesses of {} ({} reads, {} writes), {} clients",
            r.requests,
            r.accesses,
            format_size(bs),
            r.reads,
            r.writes,
            r.clients
        );
        outln!(
            "working set: {} blocks ({}) under {:?} sharing, {} private copies",
            r.distinct_keys,
            format_size(r.distinct_keys * bs),
            r.sharing,
            r.private_copies
        );
        for (li, level) in r.levels.iter().enumerate() {
            outln!("\nlevel {}: {}", li + 1, level_title(level));
            if let Some(c) = &level.client {
                let all = c.reads.plus(&c.writes);
                outln!(
                    "  client caches: {} clients, hit ratio {:.2}% (reads {:.2}%, writes {:.2}%)",
                    c.clients,
                    100.0 * all.hit_ratio(),
                    100.0 * c.reads.hit_ratio(),
                    100.0 * c.writes.hit_ratio()
                );
            }
            outln!(
                "  server: {} accesses, {} distinct blocks; temporal distance < {split}: {} ({:.1}%), ≥ {split}: {} (of which {} first accesses)",
                level.server_accesses,
                level.distinct,
                level.short,
                100.0 * level.short as f64 / level.server_accesses.max(1) as f64,
                level.server_accesses - level.short,
                level.cold
            );
            for &cap in capacities {
                let rows = rows_at(level, specs, cap);
                let lru_misses = rows
                    .iter()
                    .find(|r| r.0 == "LRU")
                    .map(|r| r.1.misses + r.2.misses);
                outln!(
                    "\n  server cache {} ({} blocks, {:.2}% of the working set){}",
                    format_size(cap as u64 * bs),
                    cap,
                    100.0 * cap as f64 / working_set as f64,
                    if cap == focus_cap {
                        "  [Table 2 form]"
                    } else {
                        ""
                    }
                );
                outln!(
                    "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
                    "policy",
                    format!("<{split} hit"),
                    format!("<{split} miss"),
                    format!("≥{split} hit"),
                    format!("≥{split} miss"),
                    "hit %",
                    "vs LRU"
                );
                for (label, s, l) in &rows {
                    let all = s.plus(l);
                    let vs = lru_misses
                        .filter(|&m| m > 0)
                        .map(|m| {
                            format!("{:+.1}%", 100.0 * (all.misses as f64 - m as f64) / m as f64)
                        })
                        .unwrap_or_default();
                    outln!(
                        "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>9.2} {:>9}",
                        label,
                        k(s.hits),
                        k(s.misses),
                        k(l.hits),
                        k(l.misses),
                        100.0 * all.hit_ratio(),
                        vs
                    );
                }
            }
            if let Some(curve) = &level.lru {
                let maxd = curve.max_distance().max(1);
                outln!(
                    "\n  exact LRU hit ratio by size (stack distances; only cold misses beyond {} blocks = {}):",
                    maxd,
                    format_size(maxd as u64 * bs)
                );
                let mut c = 1usize;
                let mut line = String::new();
                while c < maxd * 2 {
                    line.push_str(&format!(
                        "  {}:{:.1}%",
                        format_size(c as u64 * bs),
                        100.0 * curve.hit_ratio(c)
                    ));
                    c *= 2;
                }
                outln!("  {}", line.trim_start());
            }
        }
    }
    if let Some(stem) = plot {
        let charts = plots(stem, r, specs, capacities, focus_cap)?;
        if !json {
            outln!();
            charts.report();
        }
    }
    Ok(())
}

/// `blocks` blocks of `bs` bytes in MiB.
fn mib(blocks: usize, bs: u64) -> f64 {
    blocks as f64 * bs as f64 / 1048576.0
}

fn lru_series(level: &LevelReport, bs: u64, lo: usize, hi: usize, name: String) -> Option<Series> {
    let curve = level.lru.as_ref()?;
    let mut pts = Vec::new();
    let mut c = lo.max(1) as f64;
    while c <= hi as f64 * 1.0001 {
        let cap = c.round() as usize;
        pts.push((mib(cap, bs), curve.hit_ratio(cap)));
        c *= 2f64.powf(0.25);
    }
    Some(Series { name, points: pts })
}

/// The simulated hit ratio of `policy` at `level` against the cache size
/// (MiB), at every simulated capacity.
fn policy_series(
    level: &LevelReport,
    bs: u64,
    capacities: &[usize],
    policy: &str,
    name: String,
) -> Series {
    let points = capacities
        .iter()
        .filter_map(|&c| {
            level
                .results
                .iter()
                .find(|x| x.policy == policy && x.capacity == c)
                .map(|x| (mib(c, bs), x.all().hit_ratio()))
        })
        .collect();
    Series { name, points }
}

fn plots(
    stem: &Path,
    r: &SimReport,
    specs: &[PolicySpec],
    capacities: &[usize],
    focus_cap: usize,
) -> anyhow::Result<Charts> {
    let bs = r.block_size;
    let (lo, hi) = (capacities[0], *capacities.last().unwrap());
    // A logarithmic axis only labels decades: use it for wide ranges.
    let log_x = hi >= 8 * lo;
    let mut charts = Charts::new(stem, "sim");
    let single = &r.levels[0];

    // Hit ratio vs size per policy.
    let mut series = Vec::new();
    for spec in specs {
        let label = spec.label();
        if spec.kind == PolicyKind::Lru && single.lru.is_some() && label == "LRU" {
            if let Some(s) = lru_series(single, bs, lo, hi, "LRU (exact)".into()) {
                series.push(s);
            }
            continue;
        }
        series.push(policy_series(single, bs, capacities, &label, label.clone()));
    }
    charts.line(
        "hit-ratio",
        &LineChart {
            title: &format!("Server cache hit ratio, {} blocks", format_size(bs)),
            x_label: "cache size (MiB)",
            y_label: "hit ratio",
            log_x,
            log_y: false,
            series: &series,
        },
    )?;

    // Table 2: misses by temporal distance at the focus size, one chart
    // per class.
    let split = r.split.to_string();
    let rows = rows_at(single, specs, focus_cap);
    let size = format_size(focus_cap as u64 * bs);
    for (suffix, title, pick) in [
        (
            "table2-short",
            format!("Misses at temporal distance < {split}, server cache {size}"),
            0usize,
        ),
        (
            "table2-long",
            format!(
                "Misses at temporal distance ≥ {split} (incl. {} first accesses), server cache {size}",
                single.cold
            ),
            1,
        ),
    ] {
        let bars: Vec<(String, f64)> = rows
            .iter()
            .map(|(label, s, l)| {
                let hm = if pick == 0 { s } else { l };
                (label.clone(), hm.misses as f64)
            })
            .collect();
        charts.bar(suffix, &title, "misses", &bars)?;
    }

    // Two-level view.
    if r.levels.len() > 1 {
        let first = specs
            .iter()
            .find(|s| !(s.kind == PolicyKind::Lru && single.lru.is_some()))
            .map(|s| s.label());
        let mut series = Vec::new();
        for level in &r.levels {
            let who = match &level.client {
                None => "no client cache".to_string(),
                Some(c) => format!(
                    "client {} ({:.0}% hits)",
                    format_size(c.capacity as u64 * bs),
                    100.0 * c.reads.plus(&c.writes).hit_ratio()
                ),
            };
            if let Some(label) = &first {
                series.push(policy_series(
                    level,
                    bs,
                    capacities,
                    label,
                    format!("{label}, {who}"),
                ));
            }
            if let Some(s) = lru_series(level, bs, lo, hi, format!("LRU, {who}")) {
                series.push(s);
            }
        }
        charts.line(
            "two-level",
            &LineChart {
                title: "Server hit ratio behind client caches",
                x_label: "server cache size (MiB)",
                y_label: "server hit ratio",
                log_x,
                log_y: false,
                series: &series,
            },
        )?;
    }
    Ok(charts)
}
