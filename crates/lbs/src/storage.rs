//! Where an LBS image's two files live. The data file is any
//! [`BlockDev`](roamdisk_blockdev::BlockDev) (a raw file opened with
//! O_DIRECT in production, a crash-simulating device in tests); the
//! metadata log is a [`LogStore`]: append, sync, read back, and replace
//! atomically.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use roamdisk_blockdev::testkit::{Countdown, Rng, SECTOR};

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

fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
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
        sync_dir(path)?;
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
        let tmp = Self::temp_path(&self.path);
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        sync_dir(&self.path)?;
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

#[derive(Default)]
struct CrashLogState {
    durable: Vec<u8>,
    live: Vec<u8>,
}

/// A log in memory that can lose, or tear at sector granularity, whatever
/// was appended after its last sync. Shares a [`Countdown`] with the data
/// device so a crash can hit any I/O of the image.
#[derive(Clone)]
pub struct CrashLog {
    state: Arc<Mutex<CrashLogState>>,
    countdown: Arc<Countdown>,
}

fn power_off() -> std::io::Error {
    std::io::Error::other("simulated power loss")
}

impl CrashLog {
    pub fn new(initial: Vec<u8>, countdown: Arc<Countdown>) -> CrashLog {
        CrashLog {
            state: Arc::new(Mutex::new(CrashLogState {
                durable: initial.clone(),
                live: initial,
            })),
            countdown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CrashLogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a reboot finds: the durable prefix plus some of the unsynced
    /// tail, possibly torn at sector granularity (sectors of the tail may be
    /// missing or, past the first missing one, hold old garbage).
    pub fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let st = self.lock();
        let mut img = st.durable.clone();
        let tail = &st.live[st.durable.len().min(st.live.len())..];
        if tail.is_empty() || st.live.len() < st.durable.len() {
            return img;
        }
        let keep = rng.below(tail.len() as u64 + 1) as usize;
        img.extend_from_slice(&tail[..keep]);
        // Tear: one sector in the kept part may hold zeroes (never written).
        if keep > 0 && rng.chance(1, 3) {
            let start = img.len() - keep;
            let s = start + rng.below(keep as u64) as usize;
            let s0 = s - s % SECTOR;
            let e = (s0 + SECTOR).min(img.len());
            img[s0.max(start)..e].fill(0);
        }
        img
    }

    /// The content a reader sees now.
    pub fn live(&self) -> Vec<u8> {
        self.lock().live.clone()
    }
}

impl LogStore for CrashLog {
    fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
        if self.countdown.crashed() {
            return Err(power_off());
        }
        Ok(self.lock().live.clone())
    }
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        self.lock().live.extend_from_slice(bytes);
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        let mut st = self.lock();
        st.durable = st.live.clone();
        Ok(())
    }
    fn replace(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        let mut st = self.lock();
        st.live = bytes.to_vec();
        st.durable = bytes.to_vec();
        Ok(())
    }
    fn len(&self) -> u64 {
        self.lock().live.len() as u64
    }
    fn describe(&self) -> String {
        "crash-log".into()
    }
}
