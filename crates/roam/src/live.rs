//! A running QEMU, suspended here and resumed there (ISR with the VM
//! live), over QMP and QEMU's own migration stream:
//!
//! * [`save_vm`]: stop the VM (`stop`: QEMU drains and flushes its disks),
//!   `migrate` to a private Unix socket this process listens on, and chunk
//!   and upload the stream into the store as it arrives
//!   ([`upload_memory_stream`]): no file the size of RAM.
//! * [`restore_vm`]: a QEMU started with `-incoming defer` gets
//!   `migrate-incoming` on a private socket, this process writes the
//!   version's memory image into it as its chunks arrive (shared cache,
//!   lookaside media, store), then `cont`.
//!
//! A VM migrated while stopped arrives stopped (QEMU keeps the source's
//! run state), hence the `cont`.

use std::io::ErrorKind as IoKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use roamdisk_blockdev::{ErrorKind, Op, Progress, Result};
use roamdisk_chunkstore::commit::upload_memory_stream;
use roamdisk_chunkstore::error::{bad_arg, err};
use roamdisk_chunkstore::store::Store;
use roamdisk_chunkstore::upload::{UploadStats, Uploader};
use roamdisk_chunkstore::version::Memory;
use roamdisk_qmp::{Migration, Qmp};
use serde::Serialize;
use serde_json::json;

use crate::fetch::GatherStats;
use crate::private_dir::PrivateDir;
use crate::view::VersionView;

/// A QMP failure as the program's error.
pub fn vmm(e: roamdisk_qmp::Error) -> roamdisk_blockdev::Error {
    let kind = match &e {
        roamdisk_qmp::Error::Connect { .. } => ErrorKind::NotFound,
        roamdisk_qmp::Error::Refused { .. } => ErrorKind::InvalidArgument,
        _ => ErrorKind::Io,
    };
    err(kind, Op::Open, e.to_string())
}

/// `NAME.sock` in a new private folder (removed with it).
fn private_socket(name: &str) -> Result<(PrivateDir, PathBuf)> {
    let dir = PrivateDir::new(name).map_err(|e| io(e, "a private folder for a socket"))?;
    let path = dir.path().join(format!("{name}.sock"));
    Ok((dir, path))
}

/// `cont` after a failure: what became of the VM, for the error.
pub(crate) fn continue_vm(qmp: &mut Qmp) -> &'static str {
    match qmp.execute("cont", None) {
        Ok(_) => "the VM runs on",
        Err(_) => "the VM may be stopped: check it (QMP query-status) and continue it (QMP cont)",
    }
}

/// An error unless `view` keeps a memory image to resume.
pub fn require_memory(view: &VersionView) -> Result<()> {
    if view.version.memory.size == 0 {
        return Err(bad_arg(format!(
            "version {} keeps no memory image (it was not suspended with --qmp or --memory): boot the VM on the disk instead (no --qmp)",
            view.id.short()
        )));
    }
    Ok(())
}

fn io(e: std::io::Error, what: &str) -> roamdisk_blockdev::Error {
    err(ErrorKind::Io, Op::Read, format!("{what}: {e}"))
}

fn failed(m: &Migration, side: &str) -> roamdisk_blockdev::Error {
    err(
        ErrorKind::Io,
        Op::Read,
        format!(
            "QEMU's {side} migration ended {}{}",
            m.status,
            m.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ),
    )
}

/// How long QEMU may take to connect to (or listen on) the migration
/// socket once asked.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an outgoing migration may send nothing before it is given up
/// (the store stalled; the VM runs on).
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The memory image a live suspend took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Saved {
    #[serde(skip)]
    pub memory: Memory,
    /// Bytes of the migration stream (the memory image's size).
    pub bytes: u64,
    /// What storing them took (chunks, new and reused objects).
    pub upload: UploadStats,
    /// The VM was running (not paused) when the suspend began.
    pub was_running: bool,
    /// Seconds from `stop` to the whole stream stored.
    pub seconds: f64,
    /// The process that served the session, asked to end (SIGTERM) once
    /// QEMU had quit.
    pub server_ended: Option<u32>,
}

/// Stop the VM behind `qmp` and store its migration stream with `up` as a
/// memory image of `chunk_size` chunks. On failure the VM runs on as it
/// did (`cont` if it was running) and the error says so; on success it is
/// stopped, its state is in the store, and it must not run again here
/// (its disk is about to be committed).
pub fn save_vm(
    qmp: &mut Qmp,
    up: &mut Uploader<'_, dyn Store>,
    chunk_size: u32,
    encrypted: bool,
    progress: &dyn Progress,
) -> Result<Saved> {
    let t0 = Instant::now();
    let state = qmp.run_state().map_err(vmm)?;
    if state != "running" && state != "paused" {
        return Err(bad_arg(format!(
            "the VM behind {} is {state}: only a running or paused VM can be suspended",
            qmp.path().display()
        )));
    }
    let was_running = state == "running";
    if was_running {
        if let Err(e) = qmp.execute("stop", None) {
            // `stop` drains the guest's disks and may time out here; QEMU
            // may stop later. Do not leave it so without saying.
            let back = continue_vm(qmp);
            return Err(roamdisk_chunkstore::error::context(
                vmm(e),
                format!("QEMU did not stop the VM; nothing was stored and {back}"),
            ));
        }
    }
    let before = up.stats;
    let r = migrate_out(qmp, up, chunk_size, encrypted, progress);
    match r {
        Ok(memory) => Ok(Saved {
            bytes: memory.size,
            memory,
            upload: up.stats - before,
            was_running,
            seconds: t0.elapsed().as_secs_f64(),
            server_ended: None,
        }),
        Err(e) => {
            let back = if was_running {
                continue_vm(qmp)
            } else {
                "the VM stays paused"
            };
            Err(roamdisk_chunkstore::error::context(
                e,
                format!("the VM's state could not be stored; nothing was committed and {back}"),
            ))
        }
    }
}

/// `migrate` to a socket of ours; the stream uploaded as it comes.
fn migrate_out(
    qmp: &mut Qmp,
    up: &mut Uploader<'_, dyn Store>,
    chunk_size: u32,
    encrypted: bool,
    progress: &dyn Progress,
) -> Result<Memory> {
    let (_dir, sock) = private_socket("migrate")?;
    let listener = UnixListener::bind(&sock).map_err(|e| io(e, "the migration socket"))?;
    // QEMU paces a migration (128 MiB/s by default) for a VM that runs
    // meanwhile; this one is stopped: let it go as fast as the store takes.
    let old_bandwidth = qmp
        .execute("query-migrate-parameters", None)
        .ok()
        .and_then(|p| p["max-bandwidth"].as_u64());
    let _ = qmp.execute(
        "migrate-set-parameters",
        Some(json!({ "max-bandwidth": 1u64 << 40 })),
    );
    let r = (|| {
        qmp.execute(
            "migrate",
            Some(json!({ "uri": format!("unix:{}", sock.display()) })),
        )
        .map_err(vmm)?;
        let stream = accept(&listener, qmp)?;
        std::thread::scope(|scope| {
            let reader = stream
                .try_clone()
                .map_err(|e| io(e, "the migration socket"))?;
            let upload = scope.spawn(move || {
                let shut = reader.try_clone();
                // The stream's length is not known ahead (zero pages take
                // a few bytes each): the progress shows bytes so far.
                let r = upload_memory_stream(up, reader, chunk_size, encrypted, 0, progress);
                if r.is_err() {
                    // QEMU is told at once (its writes fail): the
                    // migration ends as failed instead of waiting on us.
                    if let Ok(s) = shut {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                }
                r
            });
            // A stream that stops moving (a store that stalls without
            // failing) ends the wait: the migration is cancelled below.
            let mut last = (0u64, Instant::now());
            let m = qmp.wait_migration(Duration::from_secs(24 * 3600), |m| {
                if m.transferred != last.0 {
                    last = (m.transferred, Instant::now());
                }
                last.1.elapsed() < STALL_TIMEOUT
            });
            if matches!(&m, Ok(m) if !m.ended()) {
                let _ = qmp.execute("migrate_cancel", None);
            }
            if !matches!(&m, Ok(m) if m.status == "completed") {
                // Unblock the upload: the stream will not end by itself.
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            let memory = upload.join().expect("the memory upload does not panic");
            // The store's failure is the cause when there is one (QEMU
            // then only saw its socket closed).
            match (memory, m) {
                (Err(e), _) => Err(e),
                (Ok(_), Err(e)) => Err(vmm(e)),
                (Ok(_), Ok(m)) if !m.ended() => Err(err(
                    ErrorKind::Io,
                    Op::Write,
                    format!(
                        "the VM's state stopped moving ({} bytes sent, nothing for {} s): the store stalls",
                        m.transferred,
                        STALL_TIMEOUT.as_secs()
                    ),
                )),
                (Ok(_), Ok(m)) if m.status != "completed" => Err(failed(&m, "outgoing")),
                (Ok(memory), Ok(_)) => Ok(memory),
            }
        })
    })();
    if r.is_err() {
        if let Some(b) = old_bandwidth {
            let _ = qmp.execute(
                "migrate-set-parameters",
                Some(json!({ "max-bandwidth": b })),
            );
        }
    }
    r
}

/// The connection QEMU makes to `listener` after `migrate`, or its
/// migration's failure.
fn accept(listener: &UnixListener, qmp: &mut Qmp) -> Result<UnixStream> {
    listener
        .set_nonblocking(true)
        .map_err(|e| io(e, "the migration socket"))?;
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| io(e, "the migration socket"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == IoKind::WouldBlock => {
                let m = qmp.migration().map_err(vmm)?;
                if m.ended() {
                    return Err(failed(&m, "outgoing"));
                }
                if t0.elapsed() > CONNECT_TIMEOUT {
                    let _ = qmp.execute("migrate_cancel", None);
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        format!(
                            "QEMU did not connect to the migration socket within {} s",
                            CONNECT_TIMEOUT.as_secs()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(e, "the migration socket")),
        }
    }
}

/// What [`restore_vm`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Restored {
    /// The memory image's bytes by source.
    pub memory: GatherStats,
    /// The VM's run state at the end (`running`, or `paused` when asked
    /// to leave it so).
    pub state: String,
    /// Seconds from QEMU's QMP answering to the VM running again.
    pub seconds: f64,
}

/// Hand the memory image of `view` to the QEMU behind the QMP socket
/// `qmp` (started with `-incoming defer`; waited for up to `wait`), then
/// `cont` it unless `paused`.
pub fn restore_vm(
    view: &VersionView,
    qmp: &Path,
    wait: Duration,
    paused: bool,
) -> Result<Restored> {
    require_memory(view)?;
    let mut q = Qmp::connect(qmp, wait).map_err(vmm)?;
    let t0 = Instant::now();
    let state = q.run_state().map_err(vmm)?;
    if state != "inmigrate" {
        return Err(bad_arg(format!(
            "the QEMU behind {} is {state}, not waiting for a VM's state: start it with `-incoming defer`",
            qmp.display()
        )));
    }
    let (_dir, sock) = private_socket("incoming")?;
    q.execute(
        "migrate-incoming",
        Some(json!({ "uri": format!("unix:{}", sock.display()) })),
    )
    .map_err(vmm)?;
    let mut stream = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < CONNECT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(e, "QEMU's incoming migration socket")),
        }
    };
    let memory = crate::checkout::write_memory(view, &mut stream).map_err(|e| {
        roamdisk_chunkstore::error::context(e, "the VM's memory image could not be handed to QEMU")
    })?;
    drop(stream);
    let m = q
        .wait_migration(Duration::from_secs(600), |_| true)
        .map_err(vmm)?;
    if m.status != "completed" {
        return Err(failed(&m, "incoming"));
    }
    // The run state follows the migration's end by a moment.
    let mut state = q.run_state().map_err(vmm)?;
    while state == "inmigrate" && t0.elapsed() < wait + Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(20));
        state = q.run_state().map_err(vmm)?;
    }
    if state == "paused" && !paused {
        q.execute("cont", None).map_err(vmm)?;
        state = q.run_state().map_err(vmm)?;
    }
    Ok(Restored {
        memory,
        state,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Wait until no process holds the lock of the session in `dir`. After
/// `grace`, the process holding it (the `roamdisk serve` or `resume` of
/// the session, found in /proc/locks) is asked to end with SIGTERM: it
/// flushes and closes the session. Returns that process, if one was
/// asked; an error if the lock is still held after `timeout`.
pub fn end_server(dir: &Path, grace: Duration, timeout: Duration) -> Result<Option<u32>> {
    let lock_path = dir.join("lock");
    let t0 = Instant::now();
    let mut asked = None;
    loop {
        let f = roamdisk_chunkstore::error::open_lock_file(&lock_path)?;
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(asked),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
            // No flock on this file system: nobody can be told apart.
            Err(_) => return Ok(asked),
        }
        if asked.is_none() && t0.elapsed() >= grace {
            if let Some(pid) = lock_holder(&f) {
                tracing::info!(pid, session = %dir.display(), "ending the process serving the session");
                // SAFETY: kill(2) with a pid read from /proc/locks for this
                // very lock and a valid signal number; it touches no memory.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                asked = Some(pid);
            }
        }
        if t0.elapsed() > timeout {
            return Err(err(
                ErrorKind::PermissionDenied,
                Op::Open,
                format!(
                    "the session {} is still open in another process after {} s{}: stop it, then run this again",
                    dir.display(),
                    timeout.as_secs(),
                    asked.map(|p| format!(" (pid {p}, asked to end)")).unwrap_or_default()
                ),
            ));
        }
        drop(f);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The process holding a `flock` on `f`, from /proc/locks.
fn lock_holder(f: &std::fs::File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let md = f.metadata().ok()?;
    let (major, minor) = (libc::major(md.dev()), libc::minor(md.dev()));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.get(1) != Some(&"FLOCK") {
            return None;
        }
        // pid 0: a holder in another pid namespace (or gone); never
        // signal that, ourselves or init.
        let pid: u32 = w.get(4)?.parse().ok()?;
        if pid <= 1 || pid > i32::MAX as u32 || pid == std::process::id() {
            return None;
        }
        let mut id = w.get(5)?.split(':');
        let ma = u32::from_str_radix(id.next()?, 16).ok()?;
        let mi = u32::from_str_radix(id.next()?, 16).ok()?;
        let ino: u64 = id.next()?.parse().ok()?;
        (ma == major && mi == minor && ino == md.ino()).then_some(pid)
    })
}
