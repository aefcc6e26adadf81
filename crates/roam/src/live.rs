//! A running QEMU suspended here, over QMP and QEMU's own migration
//! stream ([`save_vm`]): stop the VM (`stop`: QEMU drains and flushes its
//! disks), `migrate` to a private Unix socket this process listens on,
//! and store the stream as a page image as it arrives
//! ([`crate::memory::build`]): no file the size of RAM. Resuming it is
//! [`crate::memory::handoff`].

use std::io::ErrorKind as IoKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use roamdisk_blockdev::{ErrorKind, Op, Progress, Result};
use roamdisk_chunkstore::error::{bad_arg, err};
use roamdisk_chunkstore::memimage::{MemoryPages, FLAG_RETURN_PATH};
use roamdisk_chunkstore::store::Store;
use roamdisk_chunkstore::upload::{UploadStats, Uploader};
use roamdisk_qmp::Qmp;
use serde::Serialize;
use serde_json::json;

use crate::memory::build::upload_vm_state;
use crate::qemu::{failed, io, private_socket, vmm, CONNECT_TIMEOUT};
use crate::view::VersionView;

/// `cont` after a failure: what became of the VM, for the error.
pub(crate) fn continue_vm(qmp: &mut Qmp) -> &'static str {
    match qmp.execute("cont", None) {
        Ok(_) => "the VM runs on",
        Err(_) => "the VM may be stopped: check it (QMP query-status) and continue it (QMP cont)",
    }
}

/// An error unless `view` keeps a memory image to resume.
pub fn require_memory(view: &VersionView) -> Result<()> {
    if !view.has_memory() {
        return Err(bad_arg(format!(
            "version {} keeps no memory image (it was not suspended with --qmp or --memory): boot the VM on the disk instead (no --qmp)",
            view.id.short()
        )));
    }
    Ok(())
}

/// How long an outgoing migration may send nothing before it is given up
/// (the store stalled; the VM runs on).
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The memory image a live suspend took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Saved {
    #[serde(skip)]
    pub pages: Option<MemoryPages>,
    /// Bytes of the migration stream.
    pub bytes: u64,
    /// Bytes of RAM, of it in stored (not all-zero) chunks, and pages of
    /// zeroes in the stream.
    pub ram_bytes: u64,
    pub data_bytes: u64,
    pub zero_pages: u64,
    /// What storing them took (chunks, new and reused objects).
    pub upload: UploadStats,
    /// The VM was running (not paused) when the suspend began.
    pub was_running: bool,
    /// Seconds from `stop` to the whole stream stored.
    pub seconds: f64,
    /// The process that served the session, asked to end (SIGTERM) once
    /// QEMU had quit.
    pub server_ended: Option<u32>,
    /// Chunks of the memory working set kept with the image.
    pub working_set_chunks: usize,
}

/// Wait while the VM behind `q` still receives its own memory (resumed
/// lazily, its pages still arriving): it can be suspended once that is
/// over. Seconds waited.
pub fn wait_incoming(q: &mut Qmp, progress: &dyn Progress) -> Result<f64> {
    let t0 = Instant::now();
    let mut told = false;
    loop {
        let m = q.migration().map_err(vmm)?;
        if !matches!(
            m.status.as_str(),
            "postcopy-active" | "postcopy-paused" | "postcopy-recover"
        ) {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if m.status == "postcopy-paused" {
            return Err(bad_arg(
                "the VM's memory is still arriving and its source has stopped (QEMU's postcopy is paused): run `roamdisk resume ... --qmp` again to finish it, then suspend",
            ));
        }
        if !told {
            progress.note("the VM's memory is still arriving from its last resume: waiting for the rest before suspending");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
        Ok((pages, bytes)) => Ok(Saved {
            bytes,
            ram_bytes: pages.ram_bytes(),
            data_bytes: pages.data_bytes(),
            zero_pages: pages.zero_pages,
            pages: Some(pages),
            upload: up.stats - before,
            was_running,
            seconds: t0.elapsed().as_secs_f64(),
            server_ended: None,
            working_set_chunks: 0,
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
) -> Result<(MemoryPages, u64)> {
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
    // A source with a return path (postcopy-ram, left on by a lazy resume
    // whose helper died, or return-path) waits for its destination's word
    // that it is done, which a stream read to its end never gives: both
    // off for this migration, back on if it fails.
    let was_on = stream_capabilities_off(qmp);
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
                let counted = Counted::new(reader);
                let bytes = counted.count.clone();
                // The stream's length is not known ahead (zero pages take
                // a few bytes each): the progress shows bytes so far.
                let r = upload_vm_state(up, counted, chunk_size, encrypted, progress);
                match (&r, shut) {
                    // A source that opened a return path waits for the
                    // destination's SHUT before it calls the migration done.
                    (Ok(p), Ok(mut s)) if p.flags & FLAG_RETURN_PATH != 0 => {
                        let mut b = Vec::new();
                        roamdisk_migration::write::rp_shut(&mut b, 0);
                        let _ = std::io::Write::write_all(&mut s, &b);
                    }
                    (Ok(_), _) => {}
                    // QEMU is told at once (its writes fail): the
                    // migration ends as failed instead of waiting on us.
                    (Err(_), Ok(s)) => {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                    (Err(_), Err(_)) => {}
                }
                r.map(|p| (p, bytes.load(std::sync::atomic::Ordering::Relaxed)))
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
        if !was_on.is_empty() {
            let caps: Vec<_> = was_on
                .iter()
                .map(|c| json!({"capability": c, "state": true}))
                .collect();
            let _ = qmp.execute(
                "migrate-set-capabilities",
                Some(json!({ "capabilities": caps })),
            );
        }
        if let Some(b) = old_bandwidth {
            let _ = qmp.execute(
                "migrate-set-parameters",
                Some(json!({ "max-bandwidth": b })),
            );
        }
    }
    r
}

/// Turn off the capabilities that give a stream a return path; those that
/// were on.
fn stream_capabilities_off(qmp: &mut Qmp) -> Vec<String> {
    let Ok(caps) = qmp.execute("query-migrate-capabilities", None) else {
        return Vec::new();
    };
    let on: Vec<String> = caps
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"].as_bool() == Some(true))
        .filter_map(|c| c["capability"].as_str())
        .filter(|c| matches!(*c, "postcopy-ram" | "return-path"))
        .map(str::to_string)
        .collect();
    if !on.is_empty() {
        let off: Vec<_> = on
            .iter()
            .map(|c| json!({"capability": c, "state": false}))
            .collect();
        let _ = qmp.execute(
            "migrate-set-capabilities",
            Some(json!({ "capabilities": off })),
        );
    }
    on
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

/// A reader that counts the bytes read through it.
struct Counted<R> {
    r: R,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R> Counted<R> {
    fn new(r: R) -> Counted<R> {
        Counted {
            r,
            count: Default::default(),
        }
    }
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.r.read(buf)?;
        self.count
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}
