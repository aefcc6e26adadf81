//! `roamdisk replay`: replay a trace against a stack or an NBD export.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_trace::format::payload::sidecar_path;
use roamdisk_workload::replay::{
    self, DataSource, Grouping, ReplayOptions, ReplayReport, TargetMap, Timing,
};
use roamdisk_workload::target::TargetOptions;

use crate::plot::bar_chart;
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

/// Replay a trace (blksim; IOEmu for many clients). The trace is loaded
/// into one command stream per client and partition (--per client: one
/// per client), then each stream runs in its own thread, one request at a
/// time, so every flush waits for all earlier requests of its stream and
/// holds back all later ones (end-to-end barrier semantics). Requests go
/// as fast as possible, or at their recorded times (--timing recorded).
/// Reports the runtime, requests/s, latency percentiles per op, and the
/// runtime of every client (and of every stream with --one-at-a-time).
///
/// TARGET is a stack spec (mem:4G, raw:disk.img, flashsim:class6:raw:sd.img,
/// ...), a file or block device (opened with O_DIRECT unless --no-direct),
/// or an NBD URI (nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH,
/// with TLS nbds://[USER@]HOST:PORT/EXPORT?tls-psk-file=FILE or
/// ?tls-certificates=DIR; one connection per stream). "{client}" and
/// "{device}" in a target are replaced per stream, e.g.
/// nbd+unix:///vm{client}?socket=/tmp/s.sock, or
/// nbds://c{client}@HOST:PORT/golden?tls-psk-file=keys.psk for one PSK
/// identity per emulated client (c0, c1, ...).
/// When the stack holds a flashsim layer, the simulated card time is
/// reported too.
///
/// Written data is a fixed pattern that depends only on the offset; with
/// --data recorded it is the data the trace layer recorded (trace[data=on]),
/// which reproduces the recorded image byte for byte.
///
/// Examples:
///   roamdisk replay contacts.rdtrace mem:2G
///   roamdisk replay contacts.rdtrace flashsim:class6:mem:2G --one-at-a-time
///   roamdisk replay boot.rdtrace 'nbd+unix:///?socket=/tmp/golden.sock' --per client
///   roamdisk replay win.rdtrace 'nbd+unix:///?socket=/tmp/s.sock' --clients 50 --stagger 100
///   roamdisk replay desk.rdtrace 'nbds://c{client}@disks.lab/golden?tls-psk-file=keys.psk' --clients 4 --per client
///   roamdisk replay copy.rdtrace raw:fresh.img --data recorded
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The trace (binary or CSV).
    trace: PathBuf,
    /// Where requests go (see above); may be omitted when --map covers
    /// every device.
    target: Option<String>,
    /// A target for one device: DEVICE=TARGET (repeatable).
    #[arg(long, value_name = "DEV=TARGET")]
    map: Vec<String>,
    /// Replay a single-client trace as N clients in parallel.
    #[arg(long, value_name = "N")]
    clients: Option<u32>,
    /// Start each replicated client this many milliseconds after the
    /// previous one.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    stagger: u64,
    /// fast (as fast as possible) or recorded (at the recorded times).
    #[arg(long, default_value = "fast")]
    timing: String,
    /// With --timing recorded: play this many times faster.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Streams: partition (one per client and partition, as blksim) or
    /// client (one per client, as IOEmu).
    #[arg(long, default_value = "partition")]
    per: String,
    /// Run the streams one after another instead of together (blksim).
    #[arg(long)]
    one_at_a_time: bool,
    /// Written data: pattern, recorded (TRACE.data), or a payload file.
    #[arg(long, default_value = "pattern")]
    data: String,
    /// Open files and block devices through the page cache.
    #[arg(long)]
    no_direct: bool,
    /// Count failed requests and go on instead of stopping at the first.
    #[arg(long)]
    keep_going: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Write STEM-clients (runtime per client) and STEM-latency (.png, .svg).
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let timing = match a.timing.as_str() {
        "fast" => Timing::Fast,
        "recorded" => {
            if !(a.speed > 0.0 && a.speed.is_finite()) {
                bail!("--speed must be a positive number");
            }
            Timing::Recorded { speed: a.speed }
        }
        o => bail!("--timing must be fast or recorded, not '{o}'"),
    };
    let grouping = match a.per.as_str() {
        "partition" => Grouping::Partition,
        "client" => Grouping::Client,
        o => bail!("--per must be partition or client, not '{o}'"),
    };
    let data = match a.data.as_str() {
        "pattern" => DataSource::Pattern,
        "recorded" => {
            let p = sidecar_path(&a.trace);
            if !p.exists() {
                bail!(
                    "{} does not exist: record with trace[data=on]:FILE:... to keep the written data",
                    p.display()
                );
            }
            DataSource::Recorded(p)
        }
        path => DataSource::Recorded(PathBuf::from(path)),
    };
    if a.clients == Some(0) {
        bail!("--clients must be at least 1");
    }
    let mut map = BTreeMap::new();
    for m in &a.map {
        let (d, t) = m
            .split_once('=')
            .with_context(|| format!("--map '{m}' is not DEVICE=TARGET"))?;
        let d: u32 = d
            .trim()
            .parse()
            .with_context(|| format!("--map: '{d}' is not a device number"))?;
        map.insert(d, t.to_string());
    }
    if a.target.is_none() && map.is_empty() {
        bail!("give a TARGET (e.g. mem:4G or nbd+unix:///?socket=PATH) or --map DEVICE=TARGET");
    }
    let opts = ReplayOptions {
        timing,
        grouping,
        one_at_a_time: a.one_at_a_time,
        clients: a.clients,
        stagger: Duration::from_millis(a.stagger),
        data,
        keep_going: a.keep_going,
    };
    let size = std::fs::metadata(&a.trace).map(|m| m.len()).unwrap_or(1);
    let lp = Reporter::phase_of(Output::human(quiet), "loading", size.max(1), Unit::Bytes);
    let loaded = replay::load(&a.trace, &opts, &|n| lp.set((n * 5).min(size)))
        .with_context(|| format!("cannot load {}", a.trace.display()))?;
    lp.finish();
    if loaded.records() == 0 {
        bail!("{}: the trace holds no records", a.trace.display());
    }
    let targets = TargetMap::new(
        a.target.clone(),
        map,
        super::registry(),
        TargetOptions {
            read_only: false,
            direct: !a.no_direct,
        },
    );
    let total = loaded.requests();
    let p = Reporter::phase_of(Output::human(quiet), "replaying", total.max(1), Unit::Items);
    let rep = replay::replay(&loaded, &targets, &opts, &|d, _| p.set(d))?;
    p.finish();
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_report(&rep, a.one_at_a_time, loaded.streams());
    }
    if let Some(stem) = &a.plot {
        plot_report(stem, &rep, quiet)?;
    }
    if rep.errors > 0 {
        bail!(
            "{} request(s) failed; first: {}",
            rep.errors,
            rep.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

fn print_report(r: &ReplayReport, per_stream: bool, streams: usize) {
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

fn plot_report(stem: &std::path::Path, r: &ReplayReport, quiet: bool) -> anyhow::Result<()> {
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
