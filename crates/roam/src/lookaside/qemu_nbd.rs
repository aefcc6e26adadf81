//! qcow2 lookaside media, read through qemu's own tools: a `qemu-nbd`
//! child serves the image's virtual disk, read-only, on a private Unix
//! socket, and our NBD client (`roamdisk_nbd::client`) reads it like any
//! export.
//!
//! Why `qemu-nbd` and not `qemu-img`: a medium is hashed once in chunks,
//! then read a chunk at a time, at random, for as long as the session
//! runs. `qemu-nbd` gives exactly that — random access to the virtual
//! disk, reading only the clusters asked for, with qemu itself handling
//! compressed clusters, backing files, extended L2 entries and external
//! data files — and its block status lets indexing skip unallocated
//! clusters. `qemu-img convert` (or `qemu-img dd`) would first copy the
//! whole virtual disk to a raw file: disk space as large as the image's
//! virtual size and the time of a full copy at every open, before the
//! first chunk. Parsing qcow2 ourselves would be a second implementation
//! of a format qemu owns.
//!
//! Lifetime: `qemu-nbd` runs without `--persistent` and with one client
//! allowed, so it exits when our one connection closes — when the medium
//! is dropped, and also when this process dies however it dies. Its socket
//! folder (mode 0700: the socket reads the whole image) is removed as
//! soon as the connection is made; nothing reconnects.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roamdisk_blockdev::{BlockDev, ErrorKind, Op, Result};
use roamdisk_nbd::client::{NbdAddr, NbdDev, NbdOptions, NbdUri};

use roamdisk_chunkstore::error::{err, io};

/// The first four bytes of every qcow2 image (`QFI\xfb`).
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// How long `qemu-nbd` may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether `file` starts with the qcow2 magic.
pub fn is_qcow2(file: &File) -> bool {
    let mut m = [0u8; 4];
    matches!(file.read_at(&mut m, 0), Ok(4)) && m == QCOW2_MAGIC
}

/// A qcow2 image's virtual disk, served by a `qemu-nbd` child.
pub struct Qcow2 {
    /// Dropped first: closing the connection ends `qemu-nbd`.
    dev: Option<NbdDev>,
    child: Child,
}

/// Why a qcow2 image could not be served.
pub enum StartError {
    /// `qemu-nbd` is not installed, or could not run: an error to report.
    Tool(roamdisk_blockdev::Error),
    /// `qemu-nbd` refused the image (damaged, or not qcow2 after all):
    /// what it said. The medium is skipped.
    Image(String),
}

impl Qcow2 {
    /// Start `qemu-nbd` on the qcow2 image `path` and connect to it.
    pub fn open(path: &Path) -> std::result::Result<Qcow2, StartError> {
        let dir = crate::private_dir::PrivateDir::new("qemu-nbd")
            .map_err(|e| StartError::Tool(io(Op::Open, e, path)))?;
        Qcow2::start(path, dir.path())
    }

    fn start(path: &Path, dir: &Path) -> std::result::Result<Qcow2, StartError> {
        let sock = dir.join("nbd.sock");
        let log_path = dir.join("qemu-nbd.log");
        let log = File::create(&log_path).map_err(|e| StartError::Tool(io(Op::Open, e, dir)))?;
        let mut socket_arg = std::ffi::OsString::from("--socket=");
        socket_arg.push(&sock);
        let spawned = Command::new("qemu-nbd")
            .args(["--read-only", "--format=qcow2", "--shared=1"])
            .arg(socket_arg)
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let msg = if e.kind() == std::io::ErrorKind::NotFound {
                    "is a qcow2 image, which roamdisk reads through qemu-nbd, and qemu-nbd is not installed: install qemu-utils (Debian, Ubuntu) or qemu-img (Fedora), or convert the image to raw with qemu-img convert -O raw".to_string()
                } else {
                    format!("is a qcow2 image, which roamdisk reads through qemu-nbd, and qemu-nbd cannot be run: {e}")
                };
                return Err(StartError::Tool(
                    err(
                        ErrorKind::NotFound,
                        Op::Open,
                        format!("this lookaside medium {msg}"),
                    )
                    .path(path),
                ));
            }
        };
        let said = || {
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .trim()
                .replace('\n', "; ")
        };
        let uri = NbdUri {
            addr: NbdAddr::Unix(sock.clone()),
            export: String::new(),
            tls: None,
        };
        let opts = NbdOptions {
            reconnect_tries: 0,
            ..Default::default()
        };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let m = said();
                return Err(StartError::Image(if m.is_empty() {
                    format!("qemu-nbd exited ({st})")
                } else {
                    m
                }));
            }
            if sock.exists() {
                match NbdDev::connect_with(&uri, opts.clone(), true) {
                    Ok(dev) => {
                        return Ok(Qcow2 {
                            dev: Some(dev),
                            child,
                        })
                    }
                    Err(e) if t0.elapsed() > START_TIMEOUT => {
                        stop(&mut child);
                        return Err(StartError::Image(format!("{e}; qemu-nbd said: {}", said())));
                    }
                    // Bound but not yet listening: try again.
                    Err(_) => {}
                }
            } else if t0.elapsed() > START_TIMEOUT {
                stop(&mut child);
                return Err(StartError::Image(format!(
                    "qemu-nbd did not listen within {} s: {}",
                    START_TIMEOUT.as_secs(),
                    said()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The virtual disk's size.
    pub fn size(&self) -> u64 {
        self.dev().size()
    }

    fn dev(&self) -> &NbdDev {
        self.dev.as_ref().expect("connected until dropped")
    }

    /// Read `buf.len()` bytes of the virtual disk at `off`.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.dev().read_at(buf, off)
    }

    /// Where, from `off` on, the virtual disk reads as zeroes: `Some(end)`
    /// if `[off, end)` is unallocated or zero, `None` if `off` holds data
    /// up to `end` (the second value). Errors say nothing is known.
    pub fn extent_at(&self, off: u64, len: u64) -> Option<(bool, u64)> {
        let e = self.dev().block_status(off, len).ok()?;
        let first = e.first()?;
        let zero = first.state != roamdisk_blockdev::Alloc::Data;
        Some((zero, off + first.len))
    }
}

/// End `qemu-nbd` (a child this process started) and reap it.
fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Qcow2 {
    fn drop(&mut self) {
        // Our connection closes: qemu-nbd (one client, not persistent)
        // exits by itself; give it a moment, then make sure.
        drop(self.dev.take());
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop(&mut self.child);
    }
}
