//! Where an LBS image's two files live. The data file is any
//! [`BlockDev`](roamdisk_blockdev::BlockDev) (a raw file opened with
//! O_DIRECT in production, a crash-simulating device in tests); the
//! metadata log is a [`LogStore`]: append, sync, read back, and replace
//! atomically.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use roamdisk_blockdev::durable;

/// An append-only log with atomic replacement.
pub trait LogStore: Send {
    /// The whole current content.
    fn read_all(&mut self) -> std::io::Result<Vec<u8>>;
    /// Append at the end (not durable until `sync`).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Make everything appended durable.
    fn sync(&mut self) -> std::io::Result<()>;
    /// Replace the whole content atomically and durably: after a crash the
    /// log holds either the old content or `bytes`.
    fn replace(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> u64;
    /// Whether the log is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A description for messages (the path).
    fn describe(&self) -> String;
}

/// The `.lbsm` file. Replacement writes `.lbsm2`, fsyncs it, renames it
/// over `.lbsm` and fsyncs the directory.
pub struct FileLog {
    path: PathBuf,
    file: File,
    len: u64,
}

impl FileLog {
    /// Open an existing log.
    pub fn open(path: &Path, writable: bool) -> std::io::Result<FileLog> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let len = file.metadata()?.len();
        Ok(FileLog {
            path: path.to_path_buf(),
            file,
            len,
        })
    }

    /// Create a new log holding `bytes` (fails if it exists).
    pub fn create(path: &Path, bytes: &[u8]) -> std::io::Result<FileLog> {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        durable::sync_parent(path)?;
        Ok(FileLog {
            path: path.to_path_buf(),
            file: f,
            len: bytes.len() as u64,
        })
    }

    /// The second file used during replacement.
    pub fn temp_path(path: &Path) -> PathBuf {
        let mut s = path.as_os_str().to_owned();
        s.push("2");
        PathBuf::from(s)
    }
}

impl LogStore for FileLog {
    fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut v, 0)?;
        Ok(v)
    }
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(bytes, self.len)?;
        self.len += bytes.len() as u64;
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn replace(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        durable::write_atomically_via(&self.path, &Self::temp_path(&self.path), bytes)?;
        self.file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        self.len = bytes.len() as u64;
        Ok(())
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
