//! The session's write-ahead log (`SESSION/wal`): what makes a guest
//! flush one synchronous write to one preallocated file.
//!
//! Without it a flush syncs the private cache (a sparse file: every sync
//! after new writes commits the file system's journal for the blocks they
//! allocated) and then appends and syncs the map's records: two syncs in
//! order, ~2x a raw image's flush. With it a flush copies what the guest
//! wrote since the last one (the states of the sectors touched, and the
//! bytes of those that hold data) into one record, appends it to this
//! file, whose blocks were written once when it was made, and syncs it
//! once. The private cache and the map are brought up to date later, at a
//! *checkpoint* (the cache synced, the map's records appended and synced,
//! then the log restarted under a new generation): when the log is full,
//! at a clean close, and before the map is compacted or rebased. Opening
//! the session replays the records of the current generation into the
//! private cache and the map, then checkpoints.
//!
//! Byte layout and the crash argument: `docs/formats/cas-session.md`
//! ("The write-ahead log"). The encoding and [`replay`] are pure (fuzz
//! target `cas_session_wal`); [`WalFile`] does the file's I/O.

use std::sync::Arc;

use roamdisk_blockdev::vfs::{VFile, Vfs};
use std::path::{Path, PathBuf};

use roamdisk_blockdev::header::{put_u32, put_u64, u32_at, u64_at, Frame, FrameError};
use roamdisk_blockdev::overlay::Run;
use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::index::SECTOR;

pub const MAGIC: [u8; 8] = *b"RDCASWAL";
pub const VERSION: u32 = 1;
/// A record's first bytes.
pub const RECORD_MAGIC: [u8; 8] = *b"RDWALREC";

roamdisk_blockdev::offsets! {
    // A header slot (two at the start of the file, at 0 and SLOT_SIZE).
    from roamdisk_blockdev::header::FIELDS;
    S_FLAGS: 4, S_GENERATION: 8, S_CAPACITY: 8, S_LOG_ID: 8, S_RESERVED: 468, S_CRC: 4;
    /// Size of a header slot.
    pub SLOT_SIZE == 512
}

roamdisk_blockdev::offsets! {
    // A record's header.
    R_MAGIC: 8, R_GENERATION: 8, R_SEQ: 8, R_RUNS: 4, R_EXTENTS: 4, R_DATA: 8, R_LEN: 8,
    R_CHAIN: 4, R_LOG_ID: 8, R_CRC: 4;
    /// Size of a record's header.
    pub RECORD_HEADER == 64
}

/// Size of a run or an extent entry.
pub const ENTRY_SIZE: usize = 16;
/// Where the records start.
pub const RECORDS_AT: u64 = 4096;
/// Records are padded to this.
pub const ALIGN: u64 = SECTOR;
/// The smallest and largest capacity a header may give.
pub const MIN_CAPACITY: u64 = 64 << 10;
pub const MAX_CAPACITY: u64 = 1 << 30;

const SLOT: Frame = Frame {
    magic: MAGIC,
    version: VERSION,
    crc_at: S_CRC,
};

/// Why a log was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    #[error("neither header slot is valid ({0}; {1})")]
    NoHeader(String, String),
    #[error("record {seq} at byte {at} is whole but cannot be reached: a record or header slot before it is damaged, and the flushes it holds were acknowledged")]
    Damaged { seq: u64, at: u64 },
    #[error("the header gives {capacity} bytes but the file has {len}")]
    Short { capacity: u64, len: u64 },
}

/// The current generation, the bytes records may use, and the log's
/// identity (random, made with the log: a copy of another log's records,
/// say inside a guest's data, is never taken for one of this log's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub generation: u64,
    pub capacity: u64,
    pub id: u64,
}

/// A header slot for `h`.
pub fn encode_slot(h: &Head) -> [u8; SLOT_SIZE] {
    let mut b = [0u8; SLOT_SIZE];
    put_u64(&mut b, S_GENERATION, h.generation);
    put_u64(&mut b, S_CAPACITY, h.capacity);
    put_u64(&mut b, S_LOG_ID, h.id);
    SLOT.seal(&mut b);
    b
}

/// Parse one header slot.
pub fn parse_slot(b: &[u8]) -> std::result::Result<Head, String> {
    SLOT.check(b).map_err(|e| match e {
        FrameError::Truncated(n) => format!("{n} bytes"),
        FrameError::BadMagic => "bad magic".into(),
        FrameError::BadVersion(v) => format!("version {v}, this build reads {VERSION}"),
        FrameError::BadCrc => "checksum mismatch".into(),
    })?;
    if u32_at(b, S_FLAGS) != 0 || b[S_RESERVED..S_CRC].iter().any(|&x| x != 0) {
        return Err("reserved bytes set".into());
    }
    let h = Head {
        generation: u64_at(b, S_GENERATION),
        capacity: u64_at(b, S_CAPACITY),
        id: u64_at(b, S_LOG_ID),
    };
    if h.generation == 0 {
        return Err("generation 0".into());
    }
    if !h.capacity.is_multiple_of(ALIGN) || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&h.capacity) {
        return Err(format!("capacity {}", h.capacity));
    }
    Ok(h)
}

/// The current header (the valid slot of the higher generation) and the
/// chain value of its first record (the slot's checksum).
pub fn current(b: &[u8]) -> std::result::Result<(Head, u32), WalError> {
    let slot = |i: usize| {
        let s = b.get(i * SLOT_SIZE..(i + 1) * SLOT_SIZE).unwrap_or(&[]);
        parse_slot(s).map(|h| (h, SLOT.stored_crc(s)))
    };
    match (slot(0), slot(1)) {
        (Ok(a), Ok(b)) => Ok(if b.0.generation > a.0.generation {
            b
        } else {
            a
        }),
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
        (Err(a), Err(b)) => Err(WalError::NoHeader(a, b)),
    }
}

/// Where the header slot of generation `g` goes.
pub fn slot_offset(generation: u64) -> u64 {
    (generation % 2) * SLOT_SIZE as u64
}

/// Sectors `[start, start + count)` that hold data (their bytes follow in
/// the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub start: u64,
    pub count: u32,
}

/// One flush: the states of the sectors it touched and the bytes of
/// those that hold data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub runs: Vec<Run>,
    pub extents: Vec<Extent>,
    pub data: Vec<u8>,
}

/// A record's length on disk.
pub fn record_len(runs: usize, extents: usize, data: usize) -> u64 {
    let raw = (RECORD_HEADER + (runs + extents) * ENTRY_SIZE + data) as u64;
    raw.div_ceil(ALIGN) * ALIGN
}

/// Encode a record of `head`'s log and generation that follows a record
/// (or header slot) whose checksum is `chain`; returns it and its checksum.
pub fn encode_record(head: &Head, chain: u32, r: &Record) -> (Vec<u8>, u32) {
    let len = record_len(r.runs.len(), r.extents.len(), r.data.len()) as usize;
    let mut b = vec![0u8; len];
    b[R_MAGIC..R_GENERATION].copy_from_slice(&RECORD_MAGIC);
    put_u64(&mut b, R_GENERATION, head.generation);
    put_u64(&mut b, R_SEQ, r.seq);
    put_u32(&mut b, R_RUNS, r.runs.len() as u32);
    put_u32(&mut b, R_EXTENTS, r.extents.len() as u32);
    put_u64(&mut b, R_DATA, r.data.len() as u64);
    put_u64(&mut b, R_LEN, len as u64);
    put_u32(&mut b, R_CHAIN, chain);
    put_u64(&mut b, R_LOG_ID, head.id);
    let mut at = RECORD_HEADER;
    for run in &r.runs {
        put_u64(&mut b, at, run.start);
        put_u32(&mut b, at + 8, run.count);
        b[at + 12] = run.state;
        at += ENTRY_SIZE;
    }
    for e in &r.extents {
        put_u64(&mut b, at, e.start);
        put_u32(&mut b, at + 8, e.count);
        at += ENTRY_SIZE;
    }
    b[at..at + r.data.len()].copy_from_slice(&r.data);
    let crc = record_crc(&b);
    put_u32(&mut b, R_CRC, crc);
    (b, crc)
}

/// A whole record's CRC-32C, its CRC field taken as zero (no copy: a
/// record may hold megabytes).
fn record_crc(rec: &[u8]) -> u32 {
    let head = crc32c::crc32c_append(crc32c::crc32c(&rec[..R_CRC]), &[0; 4]);
    crc32c::crc32c_append(head, &rec[R_CRC + 4..])
}

/// What the bytes at a position are.
enum Found {
    /// A whole record of this generation with its checksum: its length.
    Record(Record, u64, u32),
    /// Not a whole record that could follow: the end of the log (or a
    /// torn last record, or damage: [`cut_off`] tells).
    End,
}

fn entry_ok(start: u64, count: u32, sectors: u64) -> bool {
    count > 0
        && start
            .checked_add(count as u64)
            .is_some_and(|e| e <= sectors)
}

/// Read the record at the start of `b`, expected to be of `head`'s log
/// and generation with sequence number `seq`, on a disk of `sectors`
/// sectors.
fn parse_record(b: &[u8], head: &Head, seq: u64, sectors: u64) -> Found {
    if b.len() < RECORD_HEADER
        || b[R_MAGIC..R_GENERATION] != RECORD_MAGIC
        || u64_at(b, R_GENERATION) != head.generation
        || u64_at(b, R_SEQ) != seq
        || u64_at(b, R_LOG_ID) != head.id
    {
        return Found::End;
    }
    let runs = u32_at(b, R_RUNS) as u64;
    let extents = u32_at(b, R_EXTENTS) as u64;
    let data = u64_at(b, R_DATA);
    let len = u64_at(b, R_LEN);
    let want = (runs + extents)
        .checked_mul(ENTRY_SIZE as u64)
        .and_then(|x| x.checked_add(RECORD_HEADER as u64))
        .and_then(|x| x.checked_add(data))
        .and_then(|x| x.div_ceil(ALIGN).checked_mul(ALIGN));
    if want != Some(len) || len > b.len() as u64 {
        return Found::End;
    }
    let rec = &b[..len as usize];
    let crc = u32_at(rec, R_CRC);
    if record_crc(rec) != crc {
        return Found::End;
    }
    let mut at = RECORD_HEADER;
    let mut out = Record {
        seq,
        runs: Vec::with_capacity(runs as usize),
        extents: Vec::with_capacity(extents as usize),
        data: Vec::new(),
    };
    for _ in 0..runs {
        let (start, count, state) = (u64_at(rec, at), u32_at(rec, at + 8), rec[at + 12]);
        if !entry_ok(start, count, sectors) || state > 3 || rec[at + 13..at + 16] != [0; 3] {
            return Found::End;
        }
        out.runs.push(Run {
            start,
            count,
            state,
        });
        at += ENTRY_SIZE;
    }
    let mut sum = 0u64;
    for _ in 0..extents {
        let (start, count) = (u64_at(rec, at), u32_at(rec, at + 8));
        if !entry_ok(start, count, sectors) || u32_at(rec, at + 12) != 0 {
            return Found::End;
        }
        sum = match sum.checked_add(count as u64 * SECTOR) {
            Some(x) if x <= data => x,
            _ => return Found::End,
        };
        out.extents.push(Extent { start, count });
        at += ENTRY_SIZE;
    }
    if sum != data || rec[at + data as usize..].iter().any(|&x| x != 0) {
        return Found::End;
    }
    out.data = rec[at..at + data as usize].to_vec();
    Found::Record(out, len, crc)
}

/// The generation and sequence number of a whole record of log `id` at
/// the start of `b` (its magic, a sane length and its checksum right),
/// whatever it follows.
fn whole_record(b: &[u8], id: u64) -> Option<(u64, u64)> {
    if b.len() < RECORD_HEADER
        || b[R_MAGIC..R_GENERATION] != RECORD_MAGIC
        || u64_at(b, R_LOG_ID) != id
    {
        return None;
    }
    let len = u64_at(b, R_LEN);
    if len < RECORD_HEADER as u64 || !len.is_multiple_of(ALIGN) || len > b.len() as u64 {
        return None;
    }
    (record_crc(&b[..len as usize]) == u32_at(b, R_CRC))
        .then(|| (u64_at(b, R_GENERATION), u64_at(b, R_SEQ)))
}

/// After the log ended at `at` (the next record would have been `seq` of
/// `generation`): a whole record further on of this generation with a
/// later number, or of a newer generation, means acknowledged flushes
/// were cut off by damage (to a record, or to the newer header slot).
fn cut_off(b: &[u8], at: u64, head: &Head, seq: u64) -> Option<(u64, u64)> {
    let mut p = RECORDS_AT;
    while (p as usize) < b.len() {
        if let Some((g, s)) = whole_record(&b[p as usize..], head.id) {
            if g > head.generation || (g == head.generation && s >= seq && p >= at) {
                return Some((s, p));
            }
        }
        p += ALIGN;
    }
    None
}

/// A replayed log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub head: Head,
    /// The records of the current generation, in order.
    pub records: Vec<Record>,
    /// Where the next record goes, and what it chains to.
    pub end: u64,
    pub chain: u32,
}

/// Replay a whole log file (`b`) of a disk of `sectors` sectors: the
/// records of the current generation up to the first that is not one (the
/// end, or a torn last record: its flush was never acknowledged). A record
/// that fails its checksum while the next one is whole is damage, not a
/// torn end: an error, since flushes after it were acknowledged.
pub fn replay(b: &[u8], sectors: u64) -> std::result::Result<Replay, WalError> {
    let (head, mut chain) = current(b)?;
    if (b.len() as u64) < head.capacity {
        return Err(WalError::Short {
            capacity: head.capacity,
            len: b.len() as u64,
        });
    }
    let b = &b[..head.capacity as usize];
    let mut at = RECORDS_AT;
    let mut records = Vec::new();
    loop {
        let seq = records.len() as u64 + 1;
        let here = b.get(at as usize..).unwrap_or(&[]);
        match parse_record(here, &head, seq, sectors) {
            Found::Record(r, len, crc) => {
                if u32_at(here, R_CHAIN) != chain {
                    return Err(WalError::Damaged { seq, at });
                }
                records.push(r);
                chain = crc;
                at += len;
            }
            Found::End => {
                // The end, or a torn last record, unless a whole record
                // that should come later is further on.
                if let Some((seq, at)) = cut_off(b, at, &head, seq + 1) {
                    return Err(WalError::Damaged { seq, at });
                }
                break;
            }
        }
    }
    Ok(Replay {
        head,
        records,
        end: at,
        chain,
    })
}

/// The log file of a writable session: where the next record goes.
pub struct WalFile {
    path: PathBuf,
    file: Arc<dyn VFile>,
    head: Head,
    end: u64,
    chain: u32,
    seq: u64,
    /// An append or a restart failed: bytes of a record, or a header
    /// slot of a newer generation, may be on disk that this state does not
    /// account for. Nothing is appended until a restart succeeds, and that
    /// restart skips past `spent`.
    broken: bool,
    /// The highest generation a header slot may have been written for.
    spent: u64,
}

/// The capacity of a new log, and the most it grows to (doubling at a
/// checkpoint that found it full).
pub const FIRST_CAPACITY: u64 = 8 << 20;
pub const GROWN_CAPACITY: u64 = 64 << 20;

fn io_err(op: Op, path: &Path) -> impl Fn(std::io::Error) -> roamdisk_blockdev::Error + '_ {
    move |e| io(op, e, path)
}

impl WalFile {
    /// Make a new log of `capacity` bytes at `path` (zero-filled, so no
    /// flush allocates blocks), generation 1, replacing any file there.
    pub fn create(fs: &dyn Vfs, path: &Path, capacity: u64) -> Result<WalFile> {
        let err = io_err(Op::Open, path);
        let head = Head {
            generation: 1,
            capacity,
            id: new_log_id()?,
        };
        let slot = encode_slot(&head);
        let mut b = vec![0u8; capacity as usize];
        let at = slot_offset(1) as usize;
        b[at..at + SLOT_SIZE].copy_from_slice(&slot);
        fs.write_atomically(path, &b).map_err(&err)?;
        let f = fs.open(path, true).map_err(&err)?;
        Ok(WalFile {
            path: path.to_path_buf(),
            file: f,
            head,
            end: RECORDS_AT,
            chain: SLOT.stored_crc(&slot),
            seq: 0,
            broken: false,
            spent: 1,
        })
    }

    /// Read and replay the log at `path` (`None` if there is none), open
    /// for writing when `writable`.
    pub fn read(
        fs: &dyn Vfs,
        path: &Path,
        sectors: u64,
        writable: bool,
    ) -> Result<Option<(Replay, Arc<dyn VFile>)>> {
        let f = match fs.open(path, writable) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(Op::Open, e, path)),
        };
        let len = f.len().map_err(|e| io(Op::Open, e, path))?;
        let mut b = vec![0u8; len.min(MAX_CAPACITY) as usize];
        f.read_exact_at(&mut b, 0)
            .map_err(|e| io(Op::Open, e, path))?;
        let r = replay(&b, sectors).map_err(|e| {
            corrupt(format!(
                "the session's write-ahead log is unusable: {e}. It holds flushed writes not yet in the session map; keep a copy of the session folder and report it"
            ))
            .path(path)
        })?;
        if !r.records.is_empty() {
            tracing::info!(
                "{}: {} flushes to bring into the session",
                path.display(),
                r.records.len()
            );
        }
        Ok(Some((r, f)))
    }

    /// The log at `path` after its records were applied and checkpointed
    /// (the caller's job): a new generation starts, empty.
    pub fn after_replay(path: &Path, r: &Replay, file: Arc<dyn VFile>) -> Result<WalFile> {
        let mut w = WalFile {
            path: path.to_path_buf(),
            file,
            head: r.head,
            end: r.end,
            chain: r.chain,
            seq: r.records.len() as u64,
            broken: false,
            spent: r.head.generation,
        };
        w.restart(false)?;
        Ok(w)
    }

    /// Bytes left for records.
    pub fn free(&self) -> u64 {
        self.head.capacity - self.end
    }

    /// Whether this generation holds no record (a restart would change
    /// nothing the replay does).
    pub fn is_empty(&self) -> bool {
        self.seq == 0 && !self.broken
    }

    /// Whether the log could grow at its next restart.
    pub fn can_grow(&self) -> bool {
        self.head.capacity < GROWN_CAPACITY
    }

    /// Append `r` (its sequence number is set here) and sync it. `Ok(false)`:
    /// it does not fit; nothing was written.
    pub fn append(&mut self, mut r: Record) -> Result<bool> {
        let len = record_len(r.runs.len(), r.extents.len(), r.data.len());
        if len > self.free() || self.broken {
            return Ok(false);
        }
        r.seq = self.seq + 1;
        let (b, crc) = encode_record(&self.head, self.chain, &r);
        let err = io_err(Op::Flush, &self.path);
        let written = self
            .file
            .write_all_at(&b, self.end)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // The record may reach the disk anyway (write-back): it must
            // never replay, so this generation ends at the next restart.
            self.broken = true;
            return Err(err(e));
        }
        self.end += len;
        self.chain = crc;
        self.seq += 1;
        Ok(true)
    }

    /// Start a new generation (every record so far is checkpointed: the
    /// private cache synced and the map's records appended and synced), at
    /// twice the capacity when `grow`. On failure nothing more is appended
    /// until a later restart succeeds (flushes checkpoint meanwhile).
    pub fn restart(&mut self, grow: bool) -> Result<()> {
        let err = io_err(Op::Flush, &self.path);
        let mut h = Head {
            generation: self.head.generation.max(self.spent) + 1,
            ..self.head
        };
        self.spent = h.generation;
        if grow && self.can_grow() {
            let cap = (self.head.capacity * 2).min(GROWN_CAPACITY);
            let len = self.file.len().map_err(&err)?;
            if len < cap {
                write_zeros(&*self.file, len, cap).map_err(&err)?;
                self.file.sync_data().map_err(&err)?;
            }
            h.capacity = cap;
        }
        let slot = encode_slot(&h);
        let written = self
            .file
            .write_all_at(&slot, slot_offset(h.generation))
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // The slot may be on disk: records of the old generation would
            // not replay after it. None is appended until a restart to a
            // generation past it succeeds.
            self.broken = true;
            return Err(err(e));
        }
        self.broken = false;
        self.head = h;
        self.end = RECORDS_AT;
        self.chain = SLOT.stored_crc(&slot);
        self.seq = 0;
        Ok(())
    }
}

/// A new log's identity: random.
fn new_log_id() -> Result<u64> {
    let mut b = [0u8; 8];
    roamdisk_chunkstore::secret::fill_random(&mut b, "a write-ahead log's id")?;
    Ok(u64::from_le_bytes(b))
}

/// Write zeros over `[a, b)` of `f`.
fn write_zeros(f: &dyn VFile, a: u64, b: u64) -> std::io::Result<()> {
    let z = vec![0u8; 1 << 20];
    let mut at = a;
    while at < b {
        let n = (b - at).min(z.len() as u64) as usize;
        f.write_all_at(&z[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::vfs::Os;

    fn log_with(records: &[Record], capacity: u64) -> Vec<u8> {
        let mut b = vec![0u8; capacity as usize];
        let h = Head {
            generation: 7,
            capacity,
            id: 42,
        };
        let slot = encode_slot(&h);
        b[SLOT_SIZE..2 * SLOT_SIZE].copy_from_slice(&slot);
        let mut chain = SLOT.stored_crc(&slot);
        let mut at = RECORDS_AT as usize;
        for r in records {
            let (e, crc) = encode_record(&h, chain, r);
            b[at..at + e.len()].copy_from_slice(&e);
            at += e.len();
            chain = crc;
        }
        b
    }

    fn rec(seq: u64, start: u64, fill: u8) -> Record {
        Record {
            seq,
            runs: vec![
                Run {
                    start,
                    count: 2,
                    state: 3,
                },
                Run {
                    start: start + 2,
                    count: 5,
                    state: 1,
                },
            ],
            extents: vec![Extent { start, count: 2 }],
            data: vec![fill; 1024],
        }
    }

    #[test]
    fn a_data_length_that_overflows_when_aligned_ends_the_log() {
        // Found by the fuzzer (cas_session_wal): a length field near 2^64
        // overflowed the rounding to whole sectors.
        let head = Head {
            generation: 1,
            capacity: MIN_CAPACITY,
            id: 7,
        };
        let mut b = vec![0u8; RECORD_HEADER];
        b[R_MAGIC..R_GENERATION].copy_from_slice(&RECORD_MAGIC);
        put_u64(&mut b, R_GENERATION, 1);
        put_u64(&mut b, R_SEQ, 1);
        put_u64(&mut b, R_LOG_ID, 7);
        put_u64(&mut b, R_DATA, u64::MAX - RECORD_HEADER as u64);
        put_u64(&mut b, R_LEN, 0);
        assert!(matches!(parse_record(&b, &head, 1, 1 << 20), Found::End));
    }

    #[test]
    fn records_replay_in_order_and_a_torn_last_one_ends_the_log() {
        let rs = [rec(1, 0, 1), rec(2, 8, 2), rec(3, 16, 3)];
        let b = log_with(&rs, MIN_CAPACITY);
        let r = replay(&b, 64).unwrap();
        assert_eq!(r.head.generation, 7);
        assert_eq!(r.records, rs);
        // The last record torn anywhere: the first two remain.
        let third = RECORDS_AT + 2 * record_len(2, 1, 1024);
        for cut in [0u64, 10, 64, 100, 600] {
            let mut t = b.clone();
            t[(third + cut) as usize] ^= 0x40;
            assert_eq!(replay(&t, 64).unwrap().records, rs[..2]);
        }
        // The first record damaged while the second is whole: an error
        // (naming the first record it cannot reach).
        let mut d = b.clone();
        d[RECORDS_AT as usize + 200] ^= 1;
        assert!(matches!(
            replay(&d, 64),
            Err(WalError::Damaged { seq: 2, .. })
        ));
        // The same with the damage in the record's sequence number, where
        // nothing tells the record from the end of the log but what
        // follows.
        let mut d = b.clone();
        d[RECORDS_AT as usize + 16] ^= 1;
        assert!(matches!(replay(&d, 64), Err(WalError::Damaged { .. })));
        // Another log's records (a copy inside a guest's data, say) are
        // never this log's, whole as they may be.
        let mut other = log_with(&rs, MIN_CAPACITY);
        other[SLOT_SIZE..2 * SLOT_SIZE].copy_from_slice(&encode_slot(&Head {
            generation: 7,
            capacity: MIN_CAPACITY,
            id: 43,
        }));
        assert!(replay(&other, 64).unwrap().records.is_empty());
        // Records of another generation (an older one, left behind) end it.
        let mut old = b.clone();
        let s0 = encode_slot(&Head {
            generation: 8,
            capacity: MIN_CAPACITY,
            id: 42,
        });
        old[..SLOT_SIZE].copy_from_slice(&s0);
        let r = replay(&old, 64).unwrap();
        assert_eq!((r.head.generation, r.records.len()), (8, 0));
        // A slot damaged: the other one rules.
        let mut s = old.clone();
        s[20] ^= 1;
        assert_eq!(replay(&s, 64).unwrap().records, rs);
        s[SLOT_SIZE + 20] ^= 1;
        assert!(matches!(replay(&s, 64), Err(WalError::NoHeader(..))));
        // The newer slot damaged while its generation has records: the
        // older slot must not pass for the truth.
        let mut n = old.clone();
        let h8 = Head {
            generation: 8,
            capacity: MIN_CAPACITY,
            id: 42,
        };
        let (r8, _) = encode_record(&h8, SLOT.stored_crc(&s0), &rec(1, 30, 5));
        n[RECORDS_AT as usize..RECORDS_AT as usize + r8.len()].copy_from_slice(&r8);
        assert_eq!(replay(&n, 64).unwrap().records.len(), 1);
        n[20] ^= 1;
        assert!(matches!(replay(&n, 64), Err(WalError::Damaged { .. })));
        // Entries past the disk's end are not accepted.
        assert!(replay(&b, 20).unwrap().records.len() < 3);
        // Cut short: an error naming the lengths.
        assert!(matches!(
            replay(&b[..2000], 64),
            Err(WalError::Short { .. })
        ));
    }

    #[test]
    fn a_file_log_appends_restarts_grows_and_replays() {
        let (_d, p) = roamdisk_blockdev::testkit::scratch("wal");
        WalFile::create(&Os, &p, MIN_CAPACITY).unwrap();
        let (r, f) = WalFile::read(&Os, &p, 1 << 20, true).unwrap().unwrap();
        assert!(r.records.is_empty());
        let mut w = WalFile::after_replay(&p, &r, f).unwrap();
        assert!(w.append(rec(0, 0, 9)).unwrap());
        assert!(w.append(rec(0, 100, 8)).unwrap());
        let (r, _) = WalFile::read(&Os, &p, 1 << 20, false).unwrap().unwrap();
        assert_eq!(r.records.len(), 2);
        assert_eq!(r.records[1].data, vec![8; 1024]);
        // Too big for what is left: refused, nothing written.
        let big = Record {
            seq: 0,
            runs: vec![],
            extents: vec![Extent {
                start: 0,
                count: 200,
            }],
            data: vec![1; 200 * 512],
        };
        assert!(!w.append(big.clone()).unwrap());
        w.restart(true).unwrap();
        assert!(w.append(big).unwrap());
        let (r, _) = WalFile::read(&Os, &p, 1 << 20, false).unwrap().unwrap();
        assert_eq!(r.head.capacity, 2 * MIN_CAPACITY);
        assert_eq!(r.records.len(), 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 * MIN_CAPACITY);
    }
}
