//! How `roamdisk trace stats` shows its statistics: LBS Table 3's columns
//! per partition, the request mix, sizes, sequentiality, working sets and
//! reuse, a line per client; the same as JSON; and its plots.

use std::collections::BTreeMap;
use std::path::Path;

use roamdisk_trace::convert::file::Converted;
use roamdisk_trace::format::TraceError;
use roamdisk_trace::stats::{self, GroupStats, Stats, Table3Row};
use roamdisk_trace::synth::{self, Kind, Written};

use crate::args::device_pair;
use crate::plot::{bar_chart, line_chart, LineChart, Series};

/// The statistics as JSON, with LBS Table 3's row per partition added.
pub fn stats_json(s: &Stats) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(s)?;
    v["table3"] = serde_json::to_value(
        s.partitions
            .iter()
            .map(|(d, g)| (d.to_string(), Table3Row::from(g)))
            .collect::<BTreeMap<_, _>>(),
    )?;
    Ok(v)
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

/// The statistics as tables; partitions named by `names`, at most
/// `max_clients` clients listed.
pub fn print_stats(path: &Path, s: &Stats, names: &BTreeMap<u32, String>, max_clients: usize) {
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

/// Plots STEM-sizes, STEM-reuse and STEM-mix (.png and .svg).
pub fn plot_stats(stem: &Path, s: &Stats, quiet: bool) -> anyhow::Result<()> {
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

/// Partition names for the tables: "android" (the seed's Table 2), or a
/// list such as 0=/,1=/home; none when `s` is `None`.
pub fn partition_names(s: Option<&str>) -> anyhow::Result<BTreeMap<u32, String>> {
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
                let (d, name) = device_pair(kv, "--names", "NAME")?;
                m.insert(d, name.trim().to_string());
            }
        }
    }
    Ok(m)
}

/// What `trace synth` wrote, in a line.
pub fn synth_summary(k: Kind, w: &Written, out: &Path) -> String {
    let names: Vec<String> = w
        .devices
        .iter()
        .map(|d| match (k, synth::android::partition_name(*d)) {
            (Kind::Android(_), Some(name)) => format!("{d}={name}"),
            _ => d.to_string(),
        })
        .collect();
    format!(
        "wrote {} records to {} ({} clients, devices {}, {:.1} s of trace)",
        w.records,
        out.display(),
        w.clients.len(),
        names.join(","),
        w.last_ns as f64 / 1e9
    )
}

/// Tell what `trace convert` did: a warning for a truncated input, an
/// error when no record came out (`action`: the blkparse action asked
/// for), else (unless `quiet`) the records and lines and the host name of
/// each client id.
pub fn show_conversion(
    c: &Converted,
    input: &Path,
    out: &Path,
    action: &str,
    quiet: bool,
) -> anyhow::Result<()> {
    let rep = &c.report;
    if let Some(e) = &c.truncated {
        eprintln!(
            "roamdisk: warning: {e}; the {} valid records were copied",
            rep.records
        );
    }
    if c.records == 0 {
        anyhow::bail!(
            "{}: no records ({} lines read, {} skipped); wrong --from, or no '{action}' events (--action)?",
            input.display(),
            rep.lines,
            rep.skipped,
        );
    }
    if !quiet {
        eprintln!(
            "roamdisk: wrote {} records to {} ({} lines read, {} skipped)",
            c.records,
            out.display(),
            rep.lines,
            rep.skipped
        );
        for (i, h) in rep.clients.iter().enumerate() {
            eprintln!("roamdisk: client {i} = host {h}");
        }
    }
    Ok(())
}

/// A trace reading error, with what to do about a truncated trace.
pub fn with_hint(e: TraceError) -> anyhow::Error {
    if e.is_truncated() {
        anyhow::anyhow!(
            "{e}\nhint: a trace whose recorder was killed ends without its end marker; `roamdisk trace convert` copies the valid records into a new file"
        )
    } else {
        e.into()
    }
}
