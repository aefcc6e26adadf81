//! The overlay map's file format: a 64-byte header and a log of 32-byte
//! records with chained CRC-32C checksums, closed by COMMIT records.
//!
//! Byte layout, replay rules and crash argument:
//! `docs/formats/overlay-map.md`. The header's middle (bytes 12..60) belongs
//! to the user of the map ([`MapHeader`]: the cow overlay, the cas
//! session); everything else is here, once. Pure encoding and parsing (no
//! I/O), fuzzed by `fuzz/fuzz_targets/overlay_map.rs`.

pub use crate::header::{u32_at, u64_at};
use crate::header::{Frame, FrameError};

crate::offsets! {
    // The header's fields; magic and version are the frame's
    // ([`crate::header`]).
    from crate::header::FIELDS;
    H_BODY: BODY_SIZE, H_CRC: 4;
    /// Size of the header in bytes.
    pub HEADER_SIZE == 64
}
/// Size of the format-specific part of the header (bytes 12..60).
pub const BODY_SIZE: usize = 48;

crate::offsets! {
    // A record's fields.
    R_KIND: 1, R_STATE: 1, R_RESERVED: 2, R_COUNT: 4, R_START: 8, R_RESERVED2: 12, R_CRC: 4;
    /// Size of one record in bytes.
    pub RECORD_SIZE == 32
}

/// Record kind: set `count` units from `start` to `state`.
pub const KIND_SET: u8 = 1;
/// Record kind: commit every SET since the previous commit; `start` holds
/// the commit sequence number (1, 2, 3, ... in each file).
pub const KIND_COMMIT: u8 = 2;

/// Why a map file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("file is {0} bytes, shorter than the {HEADER_SIZE}-byte header")]
    Truncated(usize),
    #[error("bad magic: not a roamdisk {0}")]
    BadMagic(&'static str),
    #[error("unsupported version {found} (this build reads version {supported})")]
    BadVersion { found: u32, supported: u32 },
    #[error("header checksum mismatch: the header is damaged")]
    BadHeaderCrc,
    #[error("{0}")]
    BadField(String),
}

/// The format-specific part of a map header: what a map is about (a cow
/// overlay's cluster size, a session's base version...). Implemented by
/// each user of the overlay-map engine.
pub trait MapHeader: Clone + Send + Sync + 'static {
    /// Bytes 0..8 of the file.
    const MAGIC: [u8; 8];
    /// The version this build writes and reads.
    const VERSION: u32;
    /// The largest valid state value (states are 2 bits: at most 3).
    const MAX_STATE: u8;
    /// What the file is, for errors ("cow map", "session map").
    const WHAT: &'static str;
    /// Write the fields into `body` (bytes 12..60 of the header; it comes
    /// zeroed, so reserved bytes need no code).
    fn encode_body(&self, body: &mut [u8; BODY_SIZE]);
    /// Parse and validate the fields (reserved bytes must be zero).
    fn parse_body(body: &[u8; BODY_SIZE]) -> Result<Self, MapError>;
    /// How many units (clusters, sectors) the map covers.
    fn units(&self) -> u64;
    /// Called on the header of every compacted map before it is written
    /// (the cow map counts its generations here).
    fn compacted(&mut self) {}
}

/// The frame of `H`'s header: its magic and version, the checksum at 60.
fn frame<H: MapHeader>() -> Frame {
    Frame {
        magic: H::MAGIC,
        version: H::VERSION,
        crc_at: H_CRC,
    }
}

/// Encode the 64-byte header.
pub fn encode_header<H: MapHeader>(h: &H) -> [u8; HEADER_SIZE] {
    let mut b = [0u8; HEADER_SIZE];
    let mut body = [0u8; BODY_SIZE];
    h.encode_body(&mut body);
    b[H_BODY..H_CRC].copy_from_slice(&body);
    frame::<H>().seal(&mut b);
    b
}

/// Parse and validate a header from the start of `b`.
pub fn parse_header<H: MapHeader>(b: &[u8]) -> Result<H, MapError> {
    frame::<H>().check(b).map_err(|e| match e {
        FrameError::Truncated(n) => MapError::Truncated(n),
        FrameError::BadMagic => MapError::BadMagic(H::WHAT),
        FrameError::BadVersion(found) => MapError::BadVersion {
            found,
            supported: H::VERSION,
        },
        FrameError::BadCrc => MapError::BadHeaderCrc,
    })?;
    H::parse_body(b[H_BODY..H_CRC].try_into().expect("body"))
}

/// The checksum that seeds the record chain: the header's own.
pub fn chain_seed(header: &[u8; HEADER_SIZE]) -> u32 {
    u32_at(header, H_CRC)
}

/// Encode one record, chained to the previous record's checksum.
pub fn encode_record(kind: u8, state: u8, count: u32, start: u64, prev: u32) -> [u8; RECORD_SIZE] {
    let mut r = [0u8; RECORD_SIZE];
    r[R_KIND] = kind;
    r[R_STATE] = state;
    r[R_COUNT..R_START].copy_from_slice(&count.to_le_bytes());
    r[R_START..R_RESERVED2].copy_from_slice(&start.to_le_bytes());
    let crc = crc32c::crc32c_append(prev, &r[..R_CRC]);
    r[R_CRC..].copy_from_slice(&crc.to_le_bytes());
    r
}

/// The checksum stored in an encoded record (the next record's seed).
pub fn record_crc(r: &[u8; RECORD_SIZE]) -> u32 {
    u32_at(r, R_CRC)
}

/// One committed run of unit states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub count: u32,
    pub state: u8,
}

/// The result of replaying a map file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay<H> {
    pub header: H,
    /// Committed runs, in log order (later runs override earlier ones).
    pub runs: Vec<Run>,
    /// Bytes of the file that hold the header and committed records.
    pub valid_len: usize,
    /// Bytes after `valid_len` that were discarded (torn or uncommitted).
    pub discarded: usize,
    /// Last commit sequence number (0 when none).
    pub last_seq: u64,
    /// The chain checksum after the last committed record.
    pub chain: u32,
}

impl<H> Replay<H> {
    /// Records (SET and COMMIT) in the committed part of the file.
    pub fn records(&self) -> u64 {
        ((self.valid_len - HEADER_SIZE) / RECORD_SIZE) as u64
    }
}

/// Replay a whole map file. The header must be valid; the record log is
/// read up to the last intact COMMIT, and anything after it is reported as
/// discarded (a crash between writing records and committing them, or a
/// torn write). A run outside the map, an unknown kind or state, non-zero
/// reserved bytes or an out-of-sequence COMMIT end the log like damage.
pub fn replay<H: MapHeader>(b: &[u8]) -> Result<Replay<H>, MapError> {
    let header = parse_header::<H>(b)?;
    let units = header.units();
    let mut chain = u32_at(b, H_CRC);
    let mut out = Replay {
        header,
        runs: Vec::new(),
        valid_len: HEADER_SIZE,
        discarded: 0,
        last_seq: 0,
        chain,
    };
    let mut pending = Vec::new();
    let mut pos = HEADER_SIZE;
    while pos + RECORD_SIZE <= b.len() {
        let r = &b[pos..pos + RECORD_SIZE];
        let crc = crc32c::crc32c_append(chain, &r[..R_CRC]);
        if crc != u32_at(r, R_CRC)
            || r[R_RESERVED..R_COUNT] != [0, 0]
            || r[R_RESERVED2..R_CRC].iter().any(|&x| x != 0)
        {
            break;
        }
        let count = u32_at(r, R_COUNT);
        let start = u64_at(r, R_START);
        match r[R_KIND] {
            KIND_SET => {
                let state = r[R_STATE];
                let in_range =
                    count > 0 && start.checked_add(count as u64).is_some_and(|e| e <= units);
                if state > H::MAX_STATE || !in_range {
                    break;
                }
                pending.push(Run {
                    start,
                    count,
                    state,
                });
            }
            KIND_COMMIT => {
                if r[R_STATE] != 0 || count != 0 || start != out.last_seq + 1 {
                    break;
                }
                out.runs.append(&mut pending);
                out.last_seq = start;
                out.valid_len = pos + RECORD_SIZE;
                out.chain = crc;
            }
            _ => break,
        }
        chain = crc;
        pos += RECORD_SIZE;
    }
    out.discarded = b.len() - out.valid_len;
    Ok(out)
}

/// Encode `runs` as SET records followed by one COMMIT with sequence
/// number `seq`, chained from `chain`; returns the bytes and the new chain.
pub fn encode_commit(runs: &[Run], seq: u64, mut chain: u32) -> (Vec<u8>, u32) {
    let mut buf = Vec::with_capacity((runs.len() + 1) * RECORD_SIZE);
    for run in runs {
        let r = encode_record(KIND_SET, run.state, run.count, run.start, chain);
        chain = record_crc(&r);
        buf.extend_from_slice(&r);
    }
    let r = encode_record(KIND_COMMIT, 0, 0, seq, chain);
    chain = record_crc(&r);
    buf.extend_from_slice(&r);
    (buf, chain)
}

/// A minimal header for the format's own tests and the engine's
/// (`overlay/mod.rs`).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestHeader {
    pub units: u64,
}

#[cfg(test)]
impl MapHeader for TestHeader {
    const MAGIC: [u8; 8] = *b"RDTESTMP";
    const VERSION: u32 = 1;
    const MAX_STATE: u8 = 3;
    const WHAT: &'static str = "test map";
    fn encode_body(&self, body: &mut [u8; BODY_SIZE]) {
        body[..8].copy_from_slice(&self.units.to_le_bytes());
    }
    fn parse_body(body: &[u8; BODY_SIZE]) -> Result<Self, MapError> {
        if body[8..].iter().any(|&x| x != 0) {
            return Err(MapError::BadField("reserved bytes are not zero".into()));
        }
        Ok(TestHeader {
            units: u64_at(body, 0),
        })
    }
    fn units(&self) -> u64 {
        self.units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(runs: &[(u64, u32, u8)], commit: bool) -> Vec<u8> {
        let hb = encode_header(&TestHeader { units: 100 });
        let mut chain = chain_seed(&hb);
        let mut v = hb.to_vec();
        for &(s, c, st) in runs {
            let r = encode_record(KIND_SET, st, c, s, chain);
            chain = record_crc(&r);
            v.extend_from_slice(&r);
        }
        if commit {
            v.extend_from_slice(&encode_record(KIND_COMMIT, 0, 0, 1, chain));
        }
        v
    }

    #[test]
    fn committed_runs_replay() {
        let f = file_with(&[(0, 4, 1), (10, 2, 2)], true);
        let r = replay::<TestHeader>(&f).unwrap();
        assert_eq!(r.runs.len(), 2);
        assert_eq!(r.discarded, 0);
        assert_eq!(r.last_seq, 1);
        assert_eq!(r.records(), 3);
    }

    #[test]
    fn encode_commit_matches_record_by_record() {
        let hb = encode_header(&TestHeader { units: 100 });
        let runs = [
            Run {
                start: 0,
                count: 4,
                state: 1,
            },
            Run {
                start: 10,
                count: 2,
                state: 2,
            },
        ];
        let (buf, _) = encode_commit(&runs, 1, chain_seed(&hb));
        let mut f = hb.to_vec();
        f.extend_from_slice(&buf);
        assert_eq!(f, file_with(&[(0, 4, 1), (10, 2, 2)], true));
    }

    #[test]
    fn uncommitted_tail_is_discarded() {
        let f = file_with(&[(0, 4, 1)], false);
        let r = replay::<TestHeader>(&f).unwrap();
        assert!(r.runs.is_empty());
        assert_eq!(r.discarded, RECORD_SIZE);
    }

    #[test]
    fn every_truncation_and_bitflip_is_safe() {
        let f = file_with(&[(0, 4, 1), (10, 2, 2)], true);
        for n in 0..f.len() {
            let _ = replay::<TestHeader>(&f[..n]);
        }
        for i in HEADER_SIZE..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x40;
            let r = replay::<TestHeader>(&g).unwrap();
            assert!(r.runs.is_empty(), "flip at {i} must drop the commit");
        }
        for i in 0..HEADER_SIZE {
            let mut g = f.clone();
            g[i] ^= 0x01;
            assert!(
                replay::<TestHeader>(&g).is_err(),
                "flip at header byte {i} must be caught"
            );
        }
    }

    #[test]
    fn out_of_range_run_and_bad_state_are_rejected() {
        let f = file_with(&[(99, 2, 1)], true);
        assert!(replay::<TestHeader>(&f).unwrap().runs.is_empty());
        let f = file_with(&[(0, 2, 4)], true);
        assert!(replay::<TestHeader>(&f).unwrap().runs.is_empty());
    }
}
