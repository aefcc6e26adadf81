//! `roamdisk replay`: replay a trace against a stack or an NBD export.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_trace::format::payload::sidecar_path;
use roamdisk_workload::replay::{self, DataSource, Grouping, ReplayOptions, TargetMap, Timing};
use roamdisk_workload::target::TargetOptions;

use crate::args::device_pair;
use crate::progress::{Output, Reporter};
use crate::render::replay::{plot_report, print_report};

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
        let (d, t) = device_pair(m, "--map", "TARGET")?;
        map.insert(d, t);
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
    let p = Reporter::new(Output::human(quiet));
    let loaded = replay::load(&a.trace, &opts, &p)
        .with_context(|| format!("cannot load {}", a.trace.display()))?;
    p.finish();
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
    let rep = replay::replay(&loaded, &targets, &opts, &p)?;
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
