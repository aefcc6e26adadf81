//! Error helpers. The crate uses the project's one error type
//! ([`roamdisk_blockdev::Error`]: a stable kind plus context); these build
//! it with the layer name `cas` and a message that names the chunk,
//! version, catalog or file at fault and says what to do next.

use roamdisk_blockdev::{Error, ErrorKind, Op};

/// The layer name used in every error of this crate.
pub const LAYER: &str = "cas";

pub fn err(kind: ErrorKind, op: Op, msg: impl Into<String>) -> Error {
    Error::new(kind, op, LAYER, msg)
}

pub fn corrupt(msg: impl Into<String>) -> Error {
    err(ErrorKind::Corrupt, Op::Read, msg)
}

pub fn bad_arg(msg: impl Into<String>) -> Error {
    err(ErrorKind::InvalidArgument, Op::Open, msg)
}

pub fn not_found(msg: impl Into<String>) -> Error {
    err(ErrorKind::NotFound, Op::Read, msg)
}

pub fn io(op: Op, e: std::io::Error, path: &std::path::Path) -> Error {
    Error::io(op, LAYER, e).path(path)
}

/// Prefix an error's message with context, keeping its kind and source.
pub fn context(e: Error, what: impl std::fmt::Display) -> Error {
    let m = if e.message().is_empty() {
        what.to_string()
    } else {
        format!("{what}: {}", e.message())
    };
    e.msg(m)
}

/// Open (creating if needed) the file a folder's users `flock`.
pub fn open_lock_file(path: &std::path::Path) -> roamdisk_blockdev::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| io(Op::Open, e, path))
}

/// [`open_lock_file`] and take its exclusive `flock`, waiting for it: held
/// until the file is dropped.
pub fn lock_exclusive(path: &std::path::Path) -> roamdisk_blockdev::Result<std::fs::File> {
    let f = open_lock_file(path)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io(Op::Write, e.into(), path))?;
    Ok(f)
}
