//! The cow overlay's allocation map file (`OVERLAY.cowmap`).
//!
//! Byte layout and crash-consistency argument: `docs/formats/cow-map.md`.
//! This module is pure parsing and encoding (no I/O), so it can be fuzzed.

/// File magic, bytes 0..8 of the header.
pub const MAGIC: [u8; 8] = *b"RDCOWMAP";
/// Current format version.
pub const VERSION: u32 = 1;

// Header field offsets (chained, never bare numbers).
const H_MAGIC: usize = 0;
const H_VERSION: usize = H_MAGIC + 8;
const H_HEADER_SIZE: usize = H_VERSION + 4;
const H_CLUSTER_SIZE: usize = H_HEADER_SIZE + 4;
const H_FLAGS: usize = H_CLUSTER_SIZE + 4;
const H_VIRTUAL_SIZE: usize = H_FLAGS + 4;
const H_GENERATION: usize = H_VIRTUAL_SIZE + 8;
const H_RESERVED: usize = H_GENERATION + 8;
const H_CRC: usize = 60;
/// Size of the header in bytes.
pub const HEADER_SIZE: usize = H_CRC + 4;
const _: () = assert!(H_RESERVED <= H_CRC);

// Record field offsets.
const R_KIND: usize = 0;
const R_STATE: usize = R_KIND + 1;
const R_RESERVED: usize = R_STATE + 1;
const R_COUNT: usize = R_RESERVED + 2;
const R_START: usize = R_COUNT + 4;
const R_CRC: usize = 28;
/// Size of one record in bytes.
pub const RECORD_SIZE: usize = R_CRC + 4;
const _: () = assert!(R_START + 8 <= R_CRC);

/// Record kind: set `count` clusters from `start` to `state`.
pub const KIND_SET: u8 = 1;
/// Record kind: commit every SET since the previous commit; `start` holds
/// the commit sequence number.
pub const KIND_COMMIT: u8 = 2;

/// Smallest and largest cluster sizes accepted.
pub const MIN_CLUSTER: u32 = 4096;
pub const MAX_CLUSTER: u32 = 4 << 20;

/// Per-cluster state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Not in the overlay: reads fall through to the base.
    Base = 0,
    /// The whole cluster is in the overlay file.
    Data = 1,
    /// Reads as zeroes; no data in the overlay, base not consulted.
    Zero = 2,
}

impl State {
    pub fn from_u8(v: u8) -> Option<State> {
        match v {
            0 => Some(State::Base),
            1 => Some(State::Data),
            2 => Some(State::Zero),
            _ => None,
        }
    }
}

/// The validated header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub cluster_size: u32,
    pub virtual_size: u64,
    pub generation: u64,
}

/// Why a map file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("file is {0} bytes, shorter than the {HEADER_SIZE}-byte header")]
    Truncated(usize),
    #[error("bad magic: not a roamdisk cow map")]
    BadMagic,
    #[error("unsupported version {0} (this build reads version {VERSION})")]
    BadVersion(u32),
    #[error("header checksum mismatch: the header is damaged")]
    BadHeaderCrc,
    #[error("header size {0} is not {HEADER_SIZE}")]
    BadHeaderSize(u32),
    #[error("cluster size {0} is not a power of two between 4 KiB and 4 MiB")]
    BadClusterSize(u32),
    #[error("unknown header flags {0:#x}")]
    BadFlags(u32),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Whether `c` is an acceptable cluster size.
pub fn valid_cluster_size(c: u32) -> bool {
    c.is_power_of_two() && (MIN_CLUSTER..=MAX_CLUSTER).contains(&c)
}

impl Header {
    /// Encode the 64-byte header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC);
        b[H_VERSION..H_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[H_HEADER_SIZE..H_HEADER_SIZE + 4].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[H_CLUSTER_SIZE..H_CLUSTER_SIZE + 4].copy_from_slice(&self.cluster_size.to_le_bytes());
        b[H_FLAGS..H_FLAGS + 4].copy_from_slice(&0u32.to_le_bytes());
        b[H_VIRTUAL_SIZE..H_VIRTUAL_SIZE + 8].copy_from_slice(&self.virtual_size.to_le_bytes());
        b[H_GENERATION..H_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        let crc = crc32c::crc32c(&b[..H_CRC]);
        b[H_CRC..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parse and validate a header from the start of `b`.
    pub fn parse(b: &[u8]) -> Result<Header, MapError> {
        if b.len() < HEADER_SIZE {
            return Err(MapError::Truncated(b.len()));
        }
        if b[H_MAGIC..H_MAGIC + 8] != MAGIC {
            return Err(MapError::BadMagic);
        }
        let version = u32_at(b, H_VERSION);
        if version != VERSION {
            return Err(MapError::BadVersion(version));
        }
        if crc32c::crc32c(&b[..H_CRC]) != u32_at(b, H_CRC) {
            return Err(MapError::BadHeaderCrc);
        }
        let hs = u32_at(b, H_HEADER_SIZE);
        if hs as usize != HEADER_SIZE {
            return Err(MapError::BadHeaderSize(hs));
        }
        let cluster_size = u32_at(b, H_CLUSTER_SIZE);
        if !valid_cluster_size(cluster_size) {
            return Err(MapError::BadClusterSize(cluster_size));
        }
        let flags = u32_at(b, H_FLAGS);
        if flags != 0 {
            return Err(MapError::BadFlags(flags));
        }
        Ok(Header {
            cluster_size,
            virtual_size: u64_at(b, H_VIRTUAL_SIZE),
            generation: u64_at(b, H_GENERATION),
        })
    }

    /// The checksum that seeds the record chain.
    pub fn chain_seed(b: &[u8; HEADER_SIZE]) -> u32 {
        u32_at(b, H_CRC)
    }

    /// Number of clusters covering the virtual size.
    pub fn clusters(&self) -> u64 {
        self.virtual_size.div_ceil(self.cluster_size as u64)
    }
}

/// Encode one record, chained to the previous record's checksum.
pub fn encode_record(
    kind: u8,
    state: u8,
    count: u32,
    start: u64,
    prev_crc: u32,
) -> [u8; RECORD_SIZE] {
    let mut r = [0u8; RECORD_SIZE];
    r[R_KIND] = kind;
    r[R_STATE] = state;
    r[R_COUNT..R_COUNT + 4].copy_from_slice(&count.to_le_bytes());
    r[R_START..R_START + 8].copy_from_slice(&start.to_le_bytes());
    let crc = crc32c::crc32c_append(prev_crc, &r[..R_CRC]);
    r[R_CRC..].copy_from_slice(&crc.to_le_bytes());
    r
}

/// The checksum stored in an encoded record.
pub fn record_crc(r: &[u8; RECORD_SIZE]) -> u32 {
    u32_at(r, R_CRC)
}

/// One committed run of cluster states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub count: u32,
    pub state: State,
}

/// The result of replaying a map file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub header: Header,
    /// Committed runs, in log order (later runs override earlier ones).
    pub runs: Vec<Run>,
    /// Bytes of the file that hold the header and committed records.
    pub valid_len: usize,
    /// Bytes after `valid_len` that were discarded (torn or uncommitted tail).
    pub discarded: usize,
    /// Last commit sequence number (0 when none).
    pub last_seq: u64,
    /// The chain checksum after the last committed record.
    pub chain: u32,
}

/// Replay a whole map file. The header must be valid; the record log is
/// read up to the last intact commit, and anything after it is reported as
/// discarded (a crash between writing records and committing them, or a
/// torn write). Runs outside the virtual size are treated as damage too.
pub fn replay(b: &[u8]) -> Result<Replay, MapError> {
    let header = Header::parse(b)?;
    let mut hb = [0u8; HEADER_SIZE];
    hb.copy_from_slice(&b[..HEADER_SIZE]);
    let clusters = header.clusters();
    let mut chain = Header::chain_seed(&hb);
    let mut committed_chain = chain;
    let mut pos = HEADER_SIZE;
    let mut valid_len = HEADER_SIZE;
    let mut pending: Vec<Run> = Vec::new();
    let mut runs = Vec::new();
    let mut last_seq = 0u64;
    while pos + RECORD_SIZE <= b.len() {
        let r = &b[pos..pos + RECORD_SIZE];
        let crc = crc32c::crc32c_append(chain, &r[..R_CRC]);
        if crc != u32_at(r, R_CRC) || r[R_RESERVED] != 0 || r[R_RESERVED + 1] != 0 {
            break;
        }
        if r[R_START + 8..R_CRC].iter().any(|&x| x != 0) {
            break;
        }
        let count = u32_at(r, R_COUNT);
        let start = u64_at(r, R_START);
        match r[R_KIND] {
            KIND_SET => {
                let Some(state) = State::from_u8(r[R_STATE]) else {
                    break;
                };
                let in_range = count > 0
                    && start
                        .checked_add(count as u64)
                        .is_some_and(|e| e <= clusters);
                if !in_range {
                    break;
                }
                pending.push(Run {
                    start,
                    count,
                    state,
                });
            }
            KIND_COMMIT => {
                if start != last_seq + 1 || count != 0 || r[R_STATE] != 0 {
                    break;
                }
                last_seq = start;
                runs.append(&mut pending);
                valid_len = pos + RECORD_SIZE;
                committed_chain = crc;
            }
            _ => break,
        }
        chain = crc;
        pos += RECORD_SIZE;
    }
    Ok(Replay {
        header,
        runs,
        valid_len,
        discarded: b.len() - valid_len,
        last_seq,
        chain: committed_chain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(runs: &[(u64, u32, u8)], commit: bool) -> Vec<u8> {
        let h = Header {
            cluster_size: 65536,
            virtual_size: 100 * 65536,
            generation: 1,
        };
        let hb = h.encode();
        let mut chain = Header::chain_seed(&hb);
        let mut v = hb.to_vec();
        for &(s, c, st) in runs {
            let r = encode_record(KIND_SET, st, c, s, chain);
            chain = record_crc(&r);
            v.extend_from_slice(&r);
        }
        if commit {
            let r = encode_record(KIND_COMMIT, 0, 0, 1, chain);
            v.extend_from_slice(&r);
        }
        v
    }

    #[test]
    fn committed_runs_replay() {
        let f = file_with(&[(0, 4, 1), (10, 2, 2)], true);
        let r = replay(&f).unwrap();
        assert_eq!(r.runs.len(), 2);
        assert_eq!(r.discarded, 0);
        assert_eq!(r.last_seq, 1);
    }

    #[test]
    fn uncommitted_tail_is_discarded() {
        let f = file_with(&[(0, 4, 1)], false);
        let r = replay(&f).unwrap();
        assert!(r.runs.is_empty());
        assert_eq!(r.discarded, RECORD_SIZE);
    }

    #[test]
    fn every_truncation_and_bitflip_is_safe() {
        let f = file_with(&[(0, 4, 1), (10, 2, 2)], true);
        for n in 0..f.len() {
            let _ = replay(&f[..n]);
        }
        for i in HEADER_SIZE..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x40;
            let r = replay(&g).unwrap();
            assert!(r.runs.is_empty(), "flip at {i} must drop the commit");
        }
        for i in 0..HEADER_SIZE {
            let mut g = f.clone();
            g[i] ^= 0x01;
            assert!(
                replay(&g).is_err(),
                "flip at header byte {i} must be caught"
            );
        }
    }

    #[test]
    fn out_of_range_run_is_rejected() {
        let f = file_with(&[(99, 2, 1)], true);
        assert!(replay(&f).unwrap().runs.is_empty());
    }
}
