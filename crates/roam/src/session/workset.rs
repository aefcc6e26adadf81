//! The working set a session records (Machine Bank 3.3, ISR resume): the
//! disk chunks the guest read from the base version, in the order it
//! first read them — a boot's reads come first. `roamdisk suspend` (and
//! every update commit) stores the list with the version; a session of
//! that version fetches it in this order in the background, so a resumed
//! guest finds what it is about to read already on the host.
//!
//! `SESSION/working-set` (format `docs/formats/cas-working-set.md`) is
//! rewritten at flushes that found new chunks, by rename and without
//! fsync: it is a hint, and a damaged or lost file costs speed only (it
//! is then ignored, and recording starts again).

use parking_lot::Mutex;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::bytes::{Reader, Writer};
use roamdisk_chunkstore::error::io;

pub const MAGIC: [u8; 8] = *b"RDCASWKS";
pub const VERSION: u32 = 1;
pub const FILE: &str = "working-set";

/// Least time between two saves made by flushes ([`Recorder::save_due`]).
pub const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The chunks a session read from its base, first touch first.
pub struct Recorder {
    /// One bit per disk chunk: already recorded.
    seen: Vec<AtomicU64>,
    order: Mutex<Vec<u32>>,
    /// Length of `order` when last saved.
    saved: AtomicUsize,
    /// When the file was last written (a flush writes it at most every
    /// [`SAVE_EVERY`]).
    last_save: Mutex<Option<std::time::Instant>>,
}

impl Recorder {
    /// A recorder for a disk of `records` chunks, starting from `order`.
    pub fn new(records: usize, order: Vec<u32>) -> Recorder {
        let seen: Vec<AtomicU64> = (0..records.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        for &c in &order {
            seen[c as usize / 64].fetch_or(1 << (c % 64), Ordering::Relaxed);
        }
        let saved = AtomicUsize::new(order.len());
        Recorder {
            seen,
            order: Mutex::new(order),
            saved,
            last_save: Mutex::new(None),
        }
    }

    /// The session's recording from `dir` (an absent or damaged file is
    /// an empty recording; damage is logged).
    pub fn load(dir: &Path, records: usize) -> Recorder {
        let p = dir.join(FILE);
        let order = match std::fs::read(&p) {
            Ok(b) => decode(&b, records).unwrap_or_else(|e| {
                tracing::warn!("{}: {e}; recording the working set again", p.display());
                Vec::new()
            }),
            Err(_) => Vec::new(),
        };
        Recorder::new(records, order)
    }

    /// Record a read of chunk `c` (cheap when it is already recorded).
    pub fn touch(&self, c: usize) {
        let (w, bit) = (c / 64, 1u64 << (c % 64));
        let Some(word) = self.seen.get(w) else { return };
        if word.load(Ordering::Relaxed) & bit != 0 {
            return;
        }
        if word.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            self.order.lock().push(c as u32);
        }
    }

    /// The recorded chunks, first touch first.
    pub fn order(&self) -> Vec<u32> {
        self.order.lock().clone()
    }

    /// [`Recorder::save`], unless the file was written less than
    /// [`SAVE_EVERY`] ago: flushes come in bursts (a boot issues dozens),
    /// and the file is a hint, so it need not follow every one of them.
    /// Closing the session saves it whatever the time.
    pub fn save_due(&self, dir: &Path) -> Result<()> {
        {
            let last = self.last_save.lock();
            if last.is_some_and(|t| t.elapsed() < SAVE_EVERY) {
                return Ok(());
            }
        }
        self.save(dir)
    }

    /// Write the recording to `dir` if it grew since the last save.
    pub fn save(&self, dir: &Path) -> Result<()> {
        // Checked and encoded under the lock: no copy of the list on the
        // flushes that found nothing new.
        let (bytes, len) = {
            let order = self.order.lock();
            if order.len() == self.saved.load(Ordering::Relaxed) {
                return Ok(());
            }
            (encode(&order), order.len())
        };
        let p = dir.join(FILE);
        // A hint, rewritten every few seconds: whole for readers, not
        // synced (docs/formats/cas-working-set.md).
        roamdisk_blockdev::durable::write_unsynced(&p, &bytes).map_err(|e| io(Op::Write, e, &p))?;
        self.saved.store(len, Ordering::Relaxed);
        *self.last_save.lock() = Some(std::time::Instant::now());
        Ok(())
    }
}

/// The file's bytes: header, the chunk numbers, a CRC-32C of all before.
pub fn encode(order: &[u32]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&MAGIC).u32(VERSION).u32(order.len() as u32);
    for &c in order {
        w.u32(c);
    }
    w.crc();
    w.buf
}

/// Parse a recording of a disk of `records` chunks.
pub fn decode(b: &[u8], records: usize) -> Result<Vec<u32>> {
    let body = b
        .len()
        .checked_sub(4)
        .ok_or_else(|| roamdisk_chunkstore::error::corrupt("working-set file is truncated"))?;
    let mut crc = Reader::new(b, "working-set file");
    crc.bytes(body, "body")?;
    crc.header_crc()?;
    let mut r = Reader::new(&b[..body], "working-set file");
    r.frame(&MAGIC, VERSION)?;
    let order = roamdisk_chunkstore::version::read_working_set(&mut r, records)?;
    r.finish()?;
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_first_touches_once_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let r = Recorder::new(200, vec![]);
        for c in [5, 3, 5, 130, 3, 0] {
            r.touch(c);
        }
        r.touch(999); // beyond the disk: ignored
        assert_eq!(r.order(), vec![5, 3, 130, 0]);
        r.save(dir.path()).unwrap();
        let again = Recorder::load(dir.path(), 200);
        assert_eq!(again.order(), vec![5, 3, 130, 0]);
        again.touch(5);
        again.touch(7);
        assert_eq!(again.order(), vec![5, 3, 130, 0, 7]);
    }

    #[test]
    fn damage_is_refused_and_loads_as_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let b = encode(&[1, 2, 3]);
        assert_eq!(decode(&b, 10).unwrap(), vec![1, 2, 3]);
        for cut in 0..b.len() {
            assert!(decode(&b[..cut], 10).is_err(), "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, 10).is_err(), "flip at {i}");
        }
        assert!(decode(&b, 3).is_err(), "chunk 3 of a 3-chunk disk");
        std::fs::write(dir.path().join(FILE), &b[..7]).unwrap();
        assert!(Recorder::load(dir.path(), 10).order().is_empty());
    }
}
