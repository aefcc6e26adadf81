//! Handing a suspended VM's state to a QEMU started with `-incoming
//! defer` (`roamdisk resume --qmp`), over QMP:
//!
//! * **lazily** (a page image, QEMU with `postcopy-ram`, Linux
//!   userfaultfd): `postcopy-ram` on, `migrate-incoming` on a private
//!   socket, and [`Engine`] plays the postcopy source — the guest runs
//!   once its device state is in, its pages follow on demand and in the
//!   background ([`crate::memory::postcopy`]);
//! * **taken over**: a QEMU left `postcopy-paused` by a `resume` that died
//!   gets `migrate-recover`, tells which pages it holds, and gets the
//!   rest;
//! * **eagerly** (`--eager`, a QEMU or host without postcopy — said why —,
//!   or a version whose memory is a stream, from earlier builds): the
//!   whole stream, then `cont`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roamdisk_blockdev::{Progress, Result};
use roamdisk_chunkstore::error::{bad_arg, context};
use roamdisk_qmp::Qmp;
use serde::Serialize;
use serde_json::json;

use crate::fetch::GatherStats;
use crate::memory::postcopy::{Engine, EngineOptions, LazyStats};
use crate::memory::workset;
use crate::qemu::{connect_incoming, failed, private_socket, vmm};
use crate::view::VersionView;

/// How to hand the state over.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// How long to wait for QEMU's QMP socket to answer.
    pub wait: Duration,
    /// Leave the VM paused once it has its state.
    pub paused: bool,
    /// The whole state first, never lazily.
    pub eager: bool,
    /// Report a page the guest waits on for longer than this.
    pub watchdog: Duration,
    /// The session folder: the memory working set is written there.
    pub session: Option<PathBuf>,
    /// Set while the memory is split between QEMU and this process: the
    /// served disk writes through ([`crate::resume::WriteThrough`]).
    pub write_through: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// When the command started (its times are reported from there too).
    pub started: Option<Instant>,
    /// Chunks fetched per fault ([`EngineOptions::fault_group`]).
    pub fault_group: usize,
}

/// What [`restore_vm`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Restored {
    /// `lazy`, `recovered` (a paused postcopy taken over) or `eager`.
    pub mode: &'static str,
    /// Why not lazily, when it could have been.
    pub eager_because: Option<String>,
    /// The memory image's bytes by source (eager: all of it; lazy: what
    /// came so far, [`Restored::lazy`] has the rest).
    pub memory: GatherStats,
    /// The VM's run state once it had what it needs to run.
    pub state: String,
    /// Seconds from QEMU's QMP answering to the VM running (its vCPUs
    /// started: a lazy resume's guest then runs as its pages come).
    pub seconds: f64,
    /// The same from the command's start.
    pub seconds_since_start: Option<f64>,
    /// Lazy: the pages, and seconds until the last one was in QEMU.
    pub lazy: Option<LazyStats>,
    /// Seconds from QEMU's QMP answering (and from the command's start)
    /// until every page is in QEMU.
    pub all_memory_seconds: Option<f64>,
    pub all_memory_since_start: Option<f64>,
    /// Chunks lookaside media held but that failed verification (damaged
    /// or stale), fetched elsewhere, by the end.
    pub lookaside_rejected: u64,
}

/// What a hand-over tells as it goes (the CLI draws it).
pub trait RestoreEvents {
    /// The VM runs (or is paused, as asked): for a lazy resume, long
    /// before its memory has all arrived.
    fn running(&mut self, r: &Restored);
    /// A lazy resume's pages so far (every few hundred milliseconds).
    fn memory(&mut self, _s: &LazyStats) {}
}

/// Why the QEMU behind `q` cannot take memory lazily (`None`: it can,
/// and `postcopy-ram` is on now).
fn postcopy_refused(q: &mut Qmp) -> Option<String> {
    if let Some(why) = huge_pages(q) {
        return Some(why);
    }
    match q.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "postcopy-ram", "state": true}]})),
    ) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "QEMU refused postcopy ({e}; it needs Linux userfaultfd: root, CAP_SYS_PTRACE, /dev/userfaultfd or vm.unprivileged_userfaultfd=1)"
        )),
    }
}

/// A RAM block of huge pages on the destination (HMP `info ramblock`):
/// pages are served 4 KiB at a time only.
fn huge_pages(q: &mut Qmp) -> Option<String> {
    let out = q
        .execute(
            "human-monitor-command",
            Some(json!({"command-line": "info ramblock"})),
        )
        .ok()?;
    let text = out.as_str()?;
    text.lines().skip(1).find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let size = format!("{} {}", w.get(1)?, w.get(2)?);
        (size != "4 KiB").then(|| {
            format!(
                "RAM block {} is of {size} pages (only 4 KiB pages are served lazily)",
                w[0]
            )
        })
    })
}

/// Hand the memory image of `view` to the QEMU behind `qmp`, telling
/// `events` as it goes; the progress shows the pages still to come (bytes
/// of stored pages) and carries the notes (a page that stalls).
pub fn restore_vm(
    view: &Arc<VersionView>,
    qmp: &Path,
    o: &RestoreOptions,
    progress: &dyn Progress,
    events: &mut dyn RestoreEvents,
) -> Result<Restored> {
    crate::live::require_memory(view)?;
    let mut q = Qmp::connect(qmp, o.wait).map_err(vmm)?;
    let t0 = Instant::now();
    let m = q.migration().map_err(vmm)?;
    if m.status == "postcopy-paused" {
        if view.version.pages.is_none() {
            return Err(bad_arg("this QEMU waits for a postcopy source, but the version's memory is a stream: resume into a new QEMU"));
        }
        return lazy(view, &mut q, o, true, t0, progress, events);
    }
    let state = q.run_state().map_err(vmm)?;
    if state != "inmigrate" {
        return Err(bad_arg(format!(
            "the QEMU behind {} is {state}, not waiting for a VM's state: start it with `-incoming defer`",
            qmp.display()
        )));
    }
    let because = match (&view.version.pages, o.eager) {
        (None, _) => None,
        (Some(_), true) => Some("--eager".to_string()),
        (Some(_), false) => postcopy_refused(&mut q),
    };
    if view.version.pages.is_some() && because.is_none() {
        return lazy(view, &mut q, o, false, t0, progress, events);
    }
    if let (Some(why), false) = (&because, o.eager) {
        progress.note(&format!(
            "the memory goes to QEMU whole, before the VM runs: {why}"
        ));
    }
    let mut r = eager(view, &mut q, o, t0)?;
    r.eager_because = because;
    r.all_memory_seconds = Some(r.seconds);
    r.seconds_since_start = o.started.map(|s| s.elapsed().as_secs_f64());
    r.all_memory_since_start = r.seconds_since_start;
    events.running(&r);
    Ok(r)
}

/// The whole stream, then `cont` (unless paused).
fn eager(view: &VersionView, q: &mut Qmp, o: &RestoreOptions, t0: Instant) -> Result<Restored> {
    let (_dir, sock) = private_socket("incoming")?;
    q.execute(
        "migrate-incoming",
        Some(json!({ "uri": format!("unix:{}", sock.display()) })),
    )
    .map_err(vmm)?;
    let mut stream = connect_incoming(&sock)?;
    let memory = crate::checkout::write_memory(view, &mut stream)
        .map_err(|e| context(e, "the VM's memory image could not be handed to QEMU"))?;
    drop(stream);
    let m = q
        .wait_migration(Duration::from_secs(600), |_| true)
        .map_err(vmm)?;
    if m.status != "completed" {
        return Err(failed(&m, "incoming"));
    }
    let state = settle(q, o, t0)?;
    Ok(Restored {
        mode: "eager",
        memory,
        state,
        seconds: t0.elapsed().as_secs_f64(),
        ..Default::default()
    })
}

/// Wait for the run state to leave `inmigrate`, then `cont` or leave it
/// paused as asked; the state.
fn settle(q: &mut Qmp, o: &RestoreOptions, t0: Instant) -> Result<String> {
    let mut state = q.run_state().map_err(vmm)?;
    while matches!(state.as_str(), "inmigrate" | "prelaunch")
        && t0.elapsed() < o.wait + Duration::from_secs(600)
    {
        std::thread::sleep(Duration::from_millis(10));
        state = q.run_state().map_err(vmm)?;
    }
    if state == "paused" && !o.paused {
        q.execute("cont", None).map_err(vmm)?;
        state = q.run_state().map_err(vmm)?;
    } else if state == "running" && o.paused {
        q.execute("stop", None).map_err(vmm)?;
        state = q.run_state().map_err(vmm)?;
    }
    Ok(state)
}

#[allow(clippy::too_many_arguments, reason = "one hand-over's settings")]
fn lazy(
    view: &Arc<VersionView>,
    q: &mut Qmp,
    o: &RestoreOptions,
    recover: bool,
    t0: Instant,
    progress: &dyn Progress,
    events: &mut dyn RestoreEvents,
) -> Result<Restored> {
    let notes: Arc<parking_lot::Mutex<Vec<String>>> = Default::default();
    let sink = notes.clone();
    let engine = Engine::new(
        view.clone(),
        EngineOptions {
            watchdog: o.watchdog,
            note: Arc::new(move |m: &str| sink.lock().push(m.to_string())),
            fault_group: o.fault_group,
        },
    );
    let (_dir, sock) = private_socket("incoming")?;
    let uri = json!({ "uri": format!("unix:{}", sock.display()) });
    let through = |on: bool| {
        if let Some(w) = &o.write_through {
            w.store(on, std::sync::atomic::Ordering::Release);
        }
    };
    through(true);
    if recover {
        q.execute("migrate-recover", Some(uri)).map_err(vmm)?;
        let s = connect_incoming(&sock)?;
        let had = engine.recover(s).map_err(|e| {
            context(e, "QEMU's paused postcopy could not be taken over (the version stays whole in the store: start a new QEMU and resume it there)")
        })?;
        progress.note(&format!(
            "took over QEMU's paused postcopy: it holds {had} pages, the rest follow"
        ));
    } else {
        if o.paused {
            // In `inmigrate`, `stop` only says: do not start at the end.
            q.execute("stop", None).map_err(vmm)?;
        }
        q.execute("migrate-incoming", Some(uri)).map_err(vmm)?;
        let s = connect_incoming(&sock)?;
        engine.start(s)?;
    }
    // Running once RUN is through (recovered: it ran already).
    let state = loop {
        if let Some(why) = engine.failure() {
            return Err(roamdisk_chunkstore::error::err(
                roamdisk_blockdev::ErrorKind::Io,
                roamdisk_blockdev::Op::Read,
                why,
            ));
        }
        for n in std::mem::take(&mut *notes.lock()) {
            progress.note(&n);
        }
        let st = q.run_state().map_err(vmm)?;
        if !matches!(st.as_str(), "inmigrate" | "prelaunch") {
            break st;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let state = match (state.as_str(), o.paused) {
        ("paused", false) if !recover => {
            q.execute("cont", None).map_err(vmm)?;
            q.run_state().map_err(vmm)?
        }
        _ => state,
    };
    let mut r = Restored {
        mode: if recover { "recovered" } else { "lazy" },
        state,
        seconds: t0.elapsed().as_secs_f64(),
        seconds_since_start: o.started.map(|s| s.elapsed().as_secs_f64()),
        lazy: Some(engine.stats()),
        ..Default::default()
    };
    r.memory = engine.stats().sources;
    events.running(&r);
    let total = engine.stats().pages_to_send * 4096;
    progress.phase("memory arriving", total);
    let done = engine.wait(Duration::from_millis(250), |s| {
        progress.set(total - s.missing_pages * 4096);
        for n in std::mem::take(&mut *notes.lock()) {
            progress.note(&n);
        }
        events.memory(s);
    });
    progress.end();
    if done.is_ok() {
        through(false);
    }
    let s = done.map_err(|e| {
        context(
            e,
            "the VM's memory did not all arrive; QEMU keeps the guest waiting on what it lacks (run `roamdisk resume ... --qmp` again to take over; the version stays whole in the store)",
        )
    })?;
    // QEMU says it is over too; postcopy-ram back off (a later suspend's
    // migration then has QEMU's defaults).
    let m = q
        .wait_migration(Duration::from_secs(120), |_| true)
        .map_err(vmm)?;
    if m.status != "completed" {
        return Err(failed(&m, "incoming"));
    }
    let _ = q.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "postcopy-ram", "state": false}]})),
    );
    if let Some(dir) = &o.session {
        let touched = engine.touched();
        if !touched.is_empty() {
            if let Err(e) = workset::save(dir, &touched) {
                progress.note(&format!("the memory working set is not kept: {e}"));
            }
        }
    }
    r.memory = s.sources;
    r.all_memory_seconds = Some(t0.elapsed().as_secs_f64());
    r.all_memory_since_start = o.started.map(|s| s.elapsed().as_secs_f64());
    r.lookaside_rejected = view.lookaside().map_or(0, |l| l.stats().bad);
    r.lazy = Some(s);
    Ok(r)
}
