//! One error type for every layer: a stable [`ErrorKind`] plus context
//! (layer, operation, offset, path) and an optional OS error.
//!
//! The kind is what callers branch on (the NBD server maps it to an errno);
//! the context is what a human reads. Messages say what to do next where
//! there is something to do.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The stable classification of an error. New kinds may be added; existing
/// ones never change meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A caller passed an argument that is malformed (bad spec, bad size,
    /// misaligned request, unknown flag).
    InvalidArgument,
    /// The request touches bytes outside the device.
    OutOfRange,
    /// A write-like operation on a read-only device.
    ReadOnly,
    /// The operation is not supported by this stack (e.g. fast zero).
    Unsupported,
    /// The backing storage is full (ENOSPC, EDQUOT, EFBIG).
    NoSpace,
    /// The operating system denied access to a file.
    PermissionDenied,
    /// A file or object named by the user does not exist.
    NotFound,
    /// An I/O error from the backing storage.
    Io,
    /// On-disk data failed validation (bad magic, checksum, truncation).
    Corrupt,
    /// The server or device is shutting down.
    Shutdown,
}

impl ErrorKind {
    /// Short lowercase name used in messages and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::OutOfRange => "out-of-range",
            ErrorKind::ReadOnly => "read-only",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::NoSpace => "no-space",
            ErrorKind::PermissionDenied => "permission-denied",
            ErrorKind::NotFound => "not-found",
            ErrorKind::Io => "io",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Shutdown => "shutdown",
        }
    }
}

/// The block-device operation during which an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Open,
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
    Cache,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write-zeroes",
            Op::BlockStatus => "block-status",
            Op::Cache => "cache",
        }
    }

    /// Whether the operation changes the device's contents.
    pub fn is_write(self) -> bool {
        matches!(self, Op::Write | Op::Trim | Op::WriteZeroes)
    }
}

/// An error from a block device or from building a stack.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    op: Op,
    layer: String,
    offset: Option<u64>,
    path: Option<PathBuf>,
    message: String,
    source: Option<io::Error>,
}

/// Result alias used throughout the block layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` raised by `layer` during `op`.
    pub fn new(
        kind: ErrorKind,
        op: Op,
        layer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            op,
            layer: layer.into(),
            offset: None,
            path: None,
            message: message.into(),
            source: None,
        }
    }

    /// An error wrapping an OS error; the kind is derived from the errno.
    pub fn io(op: Op, layer: impl Into<String>, err: io::Error) -> Self {
        let kind = kind_of_io(&err);
        Error {
            source: Some(err),
            ..Error::new(kind, op, layer, String::new())
        }
    }

    /// Attach the byte offset the operation was at.
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Attach the file the operation was on.
    pub fn path(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }

    /// Replace the human message.
    pub fn msg(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn op(&self) -> Op {
        self.op
    }
    pub fn layer(&self) -> &str {
        &self.layer
    }
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }
    pub fn file(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The raw OS errno, when the error came from the OS.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.as_ref().and_then(|e| e.raw_os_error())
    }
}

fn kind_of_io(err: &io::Error) -> ErrorKind {
    match err.raw_os_error() {
        Some(libc_errno::ENOSPC) | Some(libc_errno::EDQUOT) | Some(libc_errno::EFBIG) => {
            ErrorKind::NoSpace
        }
        Some(libc_errno::EROFS) => ErrorKind::ReadOnly,
        Some(libc_errno::EOPNOTSUPP) => ErrorKind::Unsupported,
        _ => match err.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidArgument,
            io::ErrorKind::UnexpectedEof => ErrorKind::Corrupt,
            _ => ErrorKind::Io,
        },
    }
}

/// The few Linux errno values the classification needs (stable ABI values).
mod libc_errno {
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EDQUOT: i32 = 122;
    pub const EOPNOTSUPP: i32 = 95;
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.layer, self.op.as_str())?;
        if let Some(off) = self.offset {
            write!(f, " at offset {off}")?;
        }
        if let Some(p) = &self.path {
            write!(f, " on {}", p.display())?;
        }
        match (&self.message, &self.source) {
            (m, Some(e)) if !m.is_empty() => write!(f, ": {m}: {e}"),
            (_, Some(e)) => write!(f, ": {e}"),
            (m, None) => write!(f, ": {m}"),
        }
    }
}

// `Display` already includes the OS error's text, so it is not exposed as a
// `source` too (error reporters would print it twice).
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_kinds_are_classified() {
        let e = Error::io(Op::Write, "raw", io::Error::from_raw_os_error(28));
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        let e = Error::io(Op::Open, "raw", io::Error::from_raw_os_error(2));
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn display_carries_context() {
        let e = Error::new(ErrorKind::OutOfRange, Op::Read, "cow", "past the end").at(4096);
        assert_eq!(e.to_string(), "cow: read at offset 4096: past the end");
    }
}
