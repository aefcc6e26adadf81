//! `roamdisk resume`: start a session of a (suspended) version on this
//! host and serve it at once, fetching its memory image and recorded
//! working set first — from the host's shared cache, lookaside media
//! (the resume set `roamdisk suspend --to-media` wrote), then the store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use clap::Parser;
use roamdisk_blockdev::units::{parse_duration, Bare};
use roamdisk_blockdev::{Access, BlockDev};
use roamdisk_nbd::{Ended, Listen, Until};
use roamdisk_roam::memory::handoff::{restore_vm, RestoreOptions};
use roamdisk_roam::resume::{resume, ResumeOptions, Resumed};
use roamdisk_roam::session::dev::SessionOpen;

use crate::render::resume::{print_report, Events};
use crate::serve::serve_one;
use crate::store_args::StoreArgs;

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
/// (--lookaside: the folder `roamdisk suspend --to-media` wrote or the
/// folder above it, such as the key's mount point; an old image file; a
/// block device; kept in the session for later opens), then from the
/// store. Every chunk is verified against its id: a wrong, damaged,
/// empty or unplugged medium costs speed and a warning, never
/// correctness. The report says how
/// many bytes came from each, and how much of the version this host now
/// holds (the hoard level; `roamdisk hoard` fetches the rest).
///
/// DIR may be a session already on this version (it is reused).
///
/// A running VM (suspended with `roamdisk suspend --qmp`): give --qmp
/// SOCKET and start QEMU as before but with `-incoming defer` and that QMP
/// socket, its disk on the --socket this command serves (or let --exec
/// start it). The guest carries on where it stopped: same boot, same
/// processes. Its memory goes lazily: QEMU gets the device state and the
/// VM runs at once (postcopy); each page the guest touches is fetched
/// when it does (shared cache, media, store), the rest follows in the
/// background, the pages it touched first last time first. Until every
/// page is in QEMU this command must keep running: if it dies, run it
/// again (same arguments) to take over. Lazy needs QEMU's postcopy-ram
/// and Linux userfaultfd (root, CAP_SYS_PTRACE, /dev/userfaultfd or
/// vm.unprivileged_userfaultfd=1); without them, with --eager, or for a
/// version suspended by an earlier build, QEMU gets the whole image
/// first, then `cont` (a line says why). --paused leaves the VM paused.
/// With --exec, serving ends when the command exits
/// (QEMU powered off or quit).
///
/// Examples:
///   roamdisk resume alice/desktop --session ~/s/alice --lookaside /media/usb/alice \
///       --socket /tmp/vm.sock --qmp /tmp/vm.qmp --exec 'qemu-system-x86_64 -m 2G \
///       -drive file=nbd:unix:/tmp/vm.sock,format=raw,if=virtio \
///       -qmp unix:/tmp/vm.qmp,server=on,wait=off -incoming defer'
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
    /// Live resume: the QMP socket of a QEMU started with `-incoming
    /// defer`; it gets the VM's state, then `cont`.
    #[arg(long, value_name = "PATH", conflicts_with = "memory_out")]
    qmp: Option<PathBuf>,
    /// How long to wait for the QMP socket to answer (QEMU starting).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "120s",
        requires = "qmp"
    )]
    qmp_wait: String,
    /// Leave the VM paused once QEMU has its state.
    #[arg(long, requires = "qmp")]
    paused: bool,
    /// Hand QEMU the whole memory image before the VM runs (no postcopy).
    #[arg(long, requires = "qmp")]
    eager: bool,
    /// Report a page the guest has waited on for this long (it is still
    /// fetched, however long the store or the link is away).
    #[arg(long, value_name = "DURATION", default_value = "10s", requires = "qmp")]
    watchdog: String,
    /// Chunks fetched per page fault: the faulted one and the rest of its
    /// aligned group of N (fewer round trips on a link of long latency,
    /// more bytes); 0, the default, chooses by the link's latency and rate
    /// as measured.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "qmp",
          value_parser = clap::value_parser!(u64).range(0..=32))]
    fault_group: u64,
    /// Run this command with `sh -c` once the disk is served (your QEMU,
    /// ROAMDISK_NBD_URI set to the disk); serving ends when it exits.
    #[arg(long, value_name = "COMMAND")]
    exec: Option<String>,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let serving = a.socket.is_some() || a.listen.is_some();
    if (a.qmp.is_some() || a.exec.is_some()) && !serving {
        bail!("--qmp and --exec need the disk served: add --socket PATH or --listen ADDR:PORT");
    }
    let started = std::time::Instant::now();
    let qmp_wait = parse_duration(&a.qmp_wait, Bare::Seconds)?;
    let watchdog = parse_duration(&a.watchdog, Bare::Seconds)?;
    let store = a.st.open(false)?;
    let key = a.st.key()?;
    let o = ResumeOptions {
        version: a.version.clone(),
        session: a.session.clone(),
        new: a
            .st
            .new_session(a.as_image.clone().unwrap_or_default(), &a.cache)?,
        lookaside: a.lookaside.clone(),
        open: SessionOpen {
            store: a.st.store.clone(),
            key_file: a.st.key_file.clone(),
            credentials: a.st.credentials(),
            host: crate::env::get().host(),
            ..Default::default()
        },
        shared_cache: crate::env::get().shared_cache_choice(a.shared_cache.as_deref()),
        memory_out: a.memory_out.clone(),
        config_out: a.config_out.clone(),
    };
    let r = Arc::new(resume(&store, key.as_ref(), &o, &super::registry())?);
    let json = a.st.json;
    let show = move |r: &Resumed, progress: crate::progress::Reporter| {
        let ws = r.wait(&progress);
        progress.finish();
        let report = r.report(ws);
        if json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&report).expect("serialisable")
            );
        } else if !quiet {
            print_report(&report, &r.name);
        }
    };
    let mut listen: Vec<Listen> = a.socket.iter().cloned().map(Listen::Unix).collect();
    listen.extend(a.listen.map(Listen::Tcp));
    let progress = a.st.progress(quiet);
    if listen.is_empty() {
        show(&r, progress);
        return Ok(());
    }
    // Serve at once; report when the working set is here.
    let bg = r.clone();
    std::thread::spawn(move || show(&bg, progress));
    let failed = Arc::new(parking_lot::Mutex::new(None));
    if a.qmp.is_some() {
        // Before serving: nothing to hand QEMU.
        roamdisk_roam::live::require_memory(&r.dev.base())?;
    }
    let mut restoring = None;
    if let Some(qmp) = a.qmp.clone() {
        // Hand QEMU the VM's state once it is up, beside the serving; a
        // failure ends serving (QEMU cannot run that VM).
        let (view, failed, json) = (r.dev.base(), failed.clone(), a.st.json);
        let o = RestoreOptions {
            wait: qmp_wait,
            paused: a.paused,
            eager: a.eager,
            watchdog,
            session: Some(a.session.clone()),
            write_through: Some(r.served.on.clone()),
            started: Some(started),
            fault_group: a.fault_group as usize,
        };
        let progress = a.st.progress(quiet);
        restoring = Some(std::thread::spawn(move || {
            let mut ev = Events::new(json, quiet);
            match restore_vm(&view, &qmp, &o, &progress, &mut ev) {
                Ok(res) => {
                    progress.finish();
                    ev.done(&res);
                }
                Err(e) => {
                    progress.finish();
                    tracing::error!("the VM could not be resumed: {e}");
                    *failed.lock() = Some(e.to_string());
                    // SAFETY: raise(3) with a valid signal number; the
                    // server's handler ends serving with a flush.
                    unsafe { libc::raise(libc::SIGTERM) };
                }
            }
        }));
    }
    let describe = r.dev.describe();
    let until = a.exec.clone().map_or(Until::Signal, Until::Exec);
    let ended = serve_one(
        r.served.clone(),
        Access::ReadWrite,
        &describe,
        listen,
        until,
        quiet,
    )?;
    // A QEMU that rejected the state exits, and so may the --exec command:
    // the handoff's own error, if it comes within a few seconds, says why.
    if let Some(h) = restoring {
        let t0 = std::time::Instant::now();
        while !h.is_finished() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    if let Some(e) = failed.lock().take() {
        bail!("the VM could not be resumed: {e}");
    }
    match ended {
        Ended::Exited(st) if !st.success() => bail!("the --exec command failed ({st})"),
        _ => Ok(()),
    }
}
