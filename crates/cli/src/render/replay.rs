//! How `roamdisk replay` shows its report: tables and bar charts.

use std::path::Path;

use roamdisk_workload::replay::ReplayReport;

use crate::plot::bar_chart;

/// The report as tables: totals, latency per op, a line per client (per
/// stream with `per_stream`) and the spread of client runtimes.
pub fn print_report(r: &ReplayReport, per_stream: bool, streams: usize) {
    outln!(
        "replayed {} requests ({:.1} MiB) in {} streams: {:.3} s, {:.0} requests/s, {:.1} MB/s",
        r.requests,
        r.bytes as f64 / 1048576.0,
        streams,
        r.wall_s,
        r.requests_per_s,
        r.bytes as f64 / r.wall_s.max(1e-9) / 1e6
    );
    if let Some(s) = r.simulated_s {
        outln!("simulated card time: {s:.3} s");
    }
    outln!();
    outln!(
        "{:<13} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "op",
        "count",
        "MiB",
        "mean µs",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs"
    );
    for (name, o) in &r.ops {
        outln!(
            "{name:<13} {:>10} {:>12.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            o.count,
            o.bytes as f64 / 1048576.0,
            o.mean_us,
            o.p50_us,
            o.p90_us,
            o.p99_us,
            o.p999_us,
            o.max_us
        );
    }
    outln!();
    let rows = if per_stream { &r.streams } else { &r.clients };
    outln!(
        "{:>8} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7}",
        "client",
        if per_stream { "device" } else { "" },
        "requests",
        "MiB",
        "seconds",
        "late",
        "errors"
    );
    for c in rows {
        outln!(
            "{:>8} {:>9} {:>10} {:>10.1} {:>10.3} {:>8} {:>7}",
            c.client,
            c.device.map(|d| d.to_string()).unwrap_or_default(),
            c.requests,
            c.bytes as f64 / 1048576.0,
            c.runtime_s,
            c.late,
            c.errors
        );
    }
    if r.clients.len() > 1 {
        let times: Vec<f64> = r.clients.iter().map(|c| c.runtime_s).collect();
        let min = times.iter().copied().fold(f64::MAX, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        outln!(
            "per-client runtime: min {min:.3} s, mean {mean:.3} s, max {max:.3} s over {} clients",
            times.len()
        );
    }
}

/// Plots STEM-clients (runtime per client) and STEM-latency (.png, .svg).
pub fn plot_report(stem: &Path, r: &ReplayReport, quiet: bool) -> anyhow::Result<()> {
    let name = |suffix: &str| {
        let s = stem
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "replay".into());
        stem.with_file_name(format!("{s}-{suffix}"))
    };
    let bars: Vec<(String, f64)> = r
        .clients
        .iter()
        .map(|c| (c.client.to_string(), c.runtime_s))
        .collect();
    let (a, _) = bar_chart(&name("clients"), "Runtime per client", "seconds", &bars)?;
    let lat: Vec<(String, f64)> = r
        .ops
        .iter()
        .flat_map(|(n, o)| {
            [
                (format!("{n} p50"), o.p50_us),
                (format!("{n} p99"), o.p99_us),
            ]
        })
        .collect();
    let (b, _) = bar_chart(&name("latency"), "Latency per op", "µs", &lat)?;
    if !quiet {
        eprintln!(
            "roamdisk: wrote {} and {} (and .svg)",
            a.display(),
            b.display()
        );
    }
    Ok(())
}
