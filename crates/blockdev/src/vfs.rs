//! The file calls a layer keeps its own files through (positional reads
//! and writes, syncs, whole-file reads and crash-safe replacement), so
//! that crash tests run the very code production runs on a simulated file
//! system that loses power (`testkit::simfs::SimFs`). [`Os`] is the real
//! file system; every layer uses it outside tests.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

pub use crate::durable::Os;

/// A file system a layer's files live on.
pub trait Vfs: Send + Sync {
    /// Open an existing file, for reading and, with `write`, writing.
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn VFile>>;
    /// Create `path`, which must not exist, empty, open for reading and
    /// writing.
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn VFile>>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// The whole content of `path`.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Replace `path` with `bytes` crash-safely: a reboot finds the old
    /// file or the new one ([`crate::durable::write_atomically`]).
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Remove the name `path` (durable only after its directory's sync).
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// An open file of a [`Vfs`].
#[allow(
    clippy::len_without_is_empty,
    reason = "a file's length, as File::metadata().len()"
)]
pub trait VFile: Send + Sync {
    /// Fill `buf` from `off`; reading past the end is an error.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Write all of `buf` at `off` (not durable before a sync).
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// `fdatasync`: the data written so far, and the size, are durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Set the file's length (growing it with zeroes).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Make `[off, off+len)` read as zeroes and, where the file system
    /// can, release its space; the size does not change. Not durable
    /// before a sync.
    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()>;
    /// The file itself, where it is a real one (for `flock`).
    fn os_file(&self) -> Option<&File> {
        None
    }
}

impl VFile for File {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, off)
    }
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, off)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        rustix::fs::fallocate(self, flags, off, len).map_err(io::Error::from)
    }
    fn os_file(&self) -> Option<&File> {
        Some(self)
    }
}

impl Vfs for Os {
    fn open(&self, path: &Path, write: bool) -> io::Result<Arc<dyn VFile>> {
        let f = OpenOptions::new().read(true).write(write).open(path)?;
        Ok(Arc::new(f))
    }
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(f))
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        crate::durable::write_atomically(path, bytes)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// The real file system, shared.
pub fn os() -> Arc<dyn Vfs> {
    Arc::new(Os)
}
