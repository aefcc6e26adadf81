//! `roamdisk resume`: start a session of a (suspended) version on this
//! host and serve it at once, fetching its memory image and recorded
//! working set first — from the host's shared cache, lookaside media
//! (the resume set `roamdisk suspend --to-media` wrote), then the store.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{Access, BlockDev, Progress};
use roamdisk_chunkstore::repo::{check_rev, resolve};
use roamdisk_nbd::Listen;
use roamdisk_roam::cache::SharedChoice;
use roamdisk_roam::session::dev::{CasDev, PrefetchStatus, SessionOpen};
use roamdisk_roam::view::{GatherStats, VersionView};
use serde::Serialize;

use super::cas::{short, StoreArgs};
use super::checkout::{new_session, serve_one};

/// Resume a version on this host: create a session of USER/IMAGE[@REV]
/// (the latest version by default: what `roamdisk suspend` committed) in
/// --session DIR, write its memory image (--memory-out) and configuration
/// (--config-out) for the VMM, and fetch the disk chunks its last session
/// read, in the order it read them. With --socket or --listen the disk is
/// served over NBD at once, while that fetch goes on in the background
/// (reads of chunks not yet here are fetched on demand); without, the
/// command waits until the working set is on this host and exits, and
/// `roamdisk serve cas:DIR` serves it.
///
/// Chunks come from the host's shared cache, then from lookaside media
/// (--lookaside: the folder `roamdisk suspend --to-media` wrote, an old
/// image file, a block device; kept in the session for later opens),
/// then from the store. Every chunk is verified against its id: a wrong
/// or damaged medium costs speed, never correctness. The report says how
/// many bytes came from each, and how much of the version this host now
/// holds (the hoard level; `roamdisk hoard` fetches the rest).
///
/// DIR may be a session already on this version (it is reused).
///
/// Examples:
///   roamdisk resume alice/desktop --session ~/s/alice --lookaside /media/usb/alice \
///       --memory-out /tmp/vm.mem --socket /tmp/vm.sock
///   roamdisk resume alice/desktop@monday --session ~/s/old --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// USER/IMAGE[@VERSION|@TAG|@DATE].
    version: String,
    /// The session folder (created, or a session already on this version).
    #[arg(long, value_name = "DIR")]
    session: PathBuf,
    /// The image the session commits to (default: the one resumed).
    #[arg(long = "as", value_name = "USER/IMAGE")]
    as_image: Option<String>,
    /// The session's private cache: raw (a sparse file) or lbs.
    #[arg(long, default_value = "raw")]
    cache: String,
    /// Lookaside media tried before the store; repeat for several.
    #[arg(long, value_name = "PATH")]
    lookaside: Vec<PathBuf>,
    /// Write the version's memory image here (for the VMM to restore).
    #[arg(long, value_name = "FILE")]
    memory_out: Option<PathBuf>,
    /// Write the version's VM configuration file here.
    #[arg(long, value_name = "FILE")]
    config_out: Option<PathBuf>,
    /// The host's shared cache: a folder, or off (default
    /// $ROAMDISK_SHARED_CACHE, else ~/.cache/roamdisk/shared).
    #[arg(long, value_name = "DIR")]
    shared_cache: Option<String>,
    /// Serve the session over NBD on this Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Serve the session over NBD on this TCP address.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    st: StoreArgs,
}

/// What a resume did, for `--json` and the report.
#[derive(Serialize)]
struct Report {
    version: String,
    session: PathBuf,
    /// Memory image bytes by source.
    memory: GatherStats,
    /// The working set: chunks that had to come, and by source.
    working_set: PrefetchStatus,
    /// Chunks lookaside media had but failed verification (damaged or
    /// stale media), fetched elsewhere instead.
    lookaside_rejected: u64,
    /// Distinct chunks of the version in the shared cache, and in all.
    hoard_cached: u64,
    hoard_chunks: u64,
    seconds: f64,
}

/// Show the working-set fetch until it is done.
fn wait(status: &Mutex<PrefetchStatus>, progress: &dyn Progress) -> PrefetchStatus {
    let now = || status.lock().clone();
    progress.phase("fetching the working set", now().bytes);
    loop {
        let s = now();
        progress.set(s.got.bytes);
        if s.done {
            progress.end();
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sources(g: &GatherStats) -> String {
    format!(
        "{} from the shared cache, {} from lookaside media, {} fetched",
        format_size(g.shared_cache_bytes),
        format_size(g.lookaside_bytes),
        format_size(g.store_bytes)
    )
}

fn print_report(r: &Report, name: &str) {
    println!(
        "resumed {name}@{} in {} ({:.2} s)",
        short(&r.version),
        r.session.display(),
        r.seconds
    );
    if r.memory.chunks > 0 {
        println!(
            "  memory image {}: {}",
            format_size(r.memory.bytes),
            sources(&r.memory)
        );
    }
    let w = &r.working_set;
    println!(
        "  working set  {} chunks ({}): {}{}",
        w.chunks,
        format_size(w.bytes),
        sources(&w.got),
        w.error
            .as_ref()
            .map(|e| format!("; stopped early: {e}"))
            .unwrap_or_default()
    );
    if r.lookaside_rejected > 0 {
        println!(
            "  lookaside    {} chunks on the media failed verification (damaged or stale) and were fetched instead",
            r.lookaside_rejected
        );
    }
    println!(
        "  hoard level  {} of {} chunks of the version on this host ({:.0}%)",
        r.hoard_cached,
        r.hoard_chunks,
        r.hoard_cached as f64 * 100.0 / r.hoard_chunks.max(1) as f64
    );
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    check_rev(&a.version)?;
    let store = a.st.open(false)?;
    let key = a.st.key()?;
    let (name, entry) = resolve(&*store, &a.version)?;
    let existing = a.session.join("session.toml").exists();
    if !existing {
        // The package from the resume set when it holds it: only the
        // catalog then crosses the network before the disk is served.
        let (view, package) = VersionView::open_with_package(
            store.clone(),
            entry.version,
            key.as_ref(),
            &a.lookaside,
        )
        .with_context(|| format!("cannot resume {name}@{}", entry.version.short()))?;
        let target = a.as_image.clone().unwrap_or_else(|| name.clone());
        new_session(
            &a.session,
            &a.st,
            &store,
            (&view, &package),
            &target,
            &a.cache,
            &a.lookaside,
        )?;
    }
    let opts = SessionOpen {
        store: a.st.store.clone(),
        key_file: a.st.key_file.clone(),
        credentials: a.st.credentials(),
        shared_cache: SharedChoice::parse(a.shared_cache.as_deref()),
        lookaside: if existing {
            a.lookaside.clone()
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let dev = Arc::new(CasDev::open(&a.session, &opts, &super::registry())?);
    let view = dev.base();
    if view.id != entry.version {
        bail!(
            "{} holds a session on version {}, not {name}@{}: resume into a new folder, or commit and remove that session",
            a.session.display(),
            view.id.short(),
            entry.version.short()
        );
    }
    let status = dev.start_prefetch();
    dev.start_readahead();
    if let Some(p) = &a.config_out {
        std::fs::write(p, &view.version.config)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let memory = match &a.memory_out {
        Some(p) => {
            let mut f = std::fs::File::create(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            let s = view.write_memory(&mut f)?;
            f.sync_all()?;
            s
        }
        None => GatherStats::default(),
    };
    let report = move |ws: PrefetchStatus| {
        let (cached, chunks) = match view.shared_cache() {
            Some(sc) => {
                let ids = view.chunk_ids();
                let n = sc
                    .contains_many(&ids)
                    .map(|v| v.iter().filter(|x| **x).count());
                (n.unwrap_or(0) as u64, ids.len() as u64)
            }
            None => (0, view.chunk_ids().len() as u64),
        };
        Report {
            version: view.id.to_hex(),
            session: a.session.clone(),
            memory,
            working_set: ws,
            lookaside_rejected: view.lookaside().map(|l| l.stats().bad).unwrap_or(0),
            hoard_cached: cached,
            hoard_chunks: chunks,
            seconds: t0.elapsed().as_secs_f64(),
        }
    };
    let show = move |r: &Report, json: bool| {
        if json {
            println!("{}", serde_json::to_string_pretty(r).expect("serialisable"));
        } else if !quiet {
            print_report(r, &name);
        }
    };
    let mut listen: Vec<Listen> = a.socket.iter().cloned().map(Listen::Unix).collect();
    listen.extend(a.listen.map(Listen::Tcp));
    let json = a.st.json;
    let progress = a.st.progress(quiet);
    if listen.is_empty() {
        let ws = wait(&status, &progress);
        progress.finish();
        show(&report(ws), json);
        return Ok(());
    }
    // Serve at once; report when the working set is here.
    let st = status.clone();
    std::thread::spawn(move || {
        let ws = wait(&st, &progress);
        progress.finish();
        show(&report(ws), json);
    });
    let describe = dev.describe();
    serve_one(dev, Access::ReadWrite, &describe, listen, quiet)
}
