//! Talking to QEMU: its QMP errors as ours, the private sockets its
//! migrations go through, and the shared pieces of suspend (`live.rs`)
//! and the lazy resume (`memory/lazy.rs`).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use roamdisk_blockdev::{ErrorKind, Op, Result};
use roamdisk_chunkstore::error::err;
use roamdisk_qmp::Migration;

use crate::private_dir::PrivateDir;

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
pub(crate) fn private_socket(name: &str) -> Result<(PrivateDir, PathBuf)> {
    let dir = PrivateDir::new(name).map_err(|e| io(e, "a private folder for a socket"))?;
    let path = dir.path().join(format!("{name}.sock"));
    Ok((dir, path))
}

pub fn io(e: std::io::Error, what: &str) -> roamdisk_blockdev::Error {
    err(ErrorKind::Io, Op::Read, format!("{what}: {e}"))
}

/// A migration that ended badly, as the program's error.
pub fn failed(m: &Migration, side: &str) -> roamdisk_blockdev::Error {
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
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connect to the socket QEMU listens on after `migrate-incoming` (or
/// `migrate-recover`), waiting for it to appear.
pub fn connect_incoming(sock: &Path) -> Result<UnixStream> {
    let t0 = Instant::now();
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return Ok(s),
            Err(_) if t0.elapsed() < CONNECT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(e, "QEMU's incoming migration socket")),
        }
    }
}
