//! In-memory images on crash-simulating storage, for tests and fuzzing:
//! the crash-simulating log ([`CrashLog`]) beside blockdev's `CrashDev`.

use parking_lot::Mutex;
use std::sync::Arc;

use roamdisk_blockdev::testkit::{Countdown, CrashDev, Rng, SECTOR};
use roamdisk_blockdev::{BlockDev, Result};

use crate::create::{plan, CreateOptions};
use crate::format::MetaHeader;
use crate::image::{Lbs, LbsOptions};
use crate::storage::LogStore;

/// An image whose data device and log live in memory and can crash.
pub struct MemImage {
    pub data: Arc<CrashDev>,
    pub log: CrashLog,
    pub key: Option<[u8; 64]>,
    pub header: MetaHeader,
}

impl MemImage {
    /// A freshly created image.
    pub fn new(o: &CreateOptions, countdown: Arc<Countdown>) -> MemImage {
        let (header, ds, key) = plan(o).expect("valid options");
        let mut img = vec![0u8; header.geometry.data_file_len() as usize];
        let sb = ds.encode();
        img[..sb.len()].copy_from_slice(&sb);
        MemImage {
            data: Arc::new(CrashDev::from_image(img, countdown.clone())),
            log: CrashLog::new(header.encode(), countdown),
            key,
            header,
        }
    }

    /// Open the image (the handles share this image's storage).
    pub fn open(&self, opts: LbsOptions) -> Result<Lbs> {
        Lbs::open(
            self.data.clone() as Arc<dyn BlockDev>,
            Box::new(self.log.clone()),
            self.key,
            opts,
        )
    }

    /// The image a power loss would leave, on fresh storage counted by
    /// `countdown`.
    pub fn after_crash(&self, rng: &mut Rng, countdown: Arc<Countdown>) -> MemImage {
        MemImage {
            data: Arc::new(CrashDev::from_image(
                self.data.crash_image(rng),
                countdown.clone(),
            )),
            log: CrashLog::new(self.log.crash_image(rng), countdown),
            key: self.key,
            header: self.header.clone(),
        }
    }

    /// The current data-file bytes (for attack tests).
    pub fn data_bytes(&self) -> Vec<u8> {
        self.data.live()
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

    /// What a reboot finds: the durable prefix plus some of the unsynced
    /// tail, possibly torn at sector granularity (sectors of the tail may be
    /// missing or, past the first missing one, hold old garbage).
    pub fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let st = self.state.lock();
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
        self.state.lock().live.clone()
    }
}

impl LogStore for CrashLog {
    fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
        if self.countdown.crashed() {
            return Err(power_off());
        }
        Ok(self.state.lock().live.clone())
    }
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        self.state.lock().live.extend_from_slice(bytes);
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        let mut st = self.state.lock();
        // `durable` is always a prefix of `live` (appends extend `live`,
        // `replace` sets both): copy only the new tail.
        let CrashLogState { durable, live } = &mut *st;
        durable.extend_from_slice(&live[durable.len()..]);
        Ok(())
    }
    fn replace(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.countdown.spend() {
            return Err(power_off());
        }
        let mut st = self.state.lock();
        st.live = bytes.to_vec();
        st.durable = bytes.to_vec();
        Ok(())
    }
    fn len(&self) -> u64 {
        self.state.lock().live.len() as u64
    }
    fn describe(&self) -> String {
        "crash-log".into()
    }
}
