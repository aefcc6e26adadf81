//! The session map file (`SESSION/states`): the 2-bit state of every
//! sector of a session's disk (EMPTY / ZERO / CLEAN / DIRTY, as in the
//! index) and the version the session is based on. An append-only log of
//! state runs, committed at every flush after the private cache's data is
//! durable, compacted through a temporary file and an atomic rename. Byte
//! layout and crash argument: `docs/formats/cas-session.md`. Pure encoding
//! and parsing (a fuzz target).

use crate::hash::ChunkId;

pub const MAGIC: [u8; 8] = *b"RDCASSES";
pub const VERSION: u32 = 1;

const H_MAGIC: usize = 0;
const H_VERSION: usize = H_MAGIC + 8;
const H_FLAGS: usize = H_VERSION + 4;
const H_DISK_SIZE: usize = H_FLAGS + 4;
const H_BASE: usize = H_DISK_SIZE + 8;
const H_RESERVED: usize = H_BASE + 32;
const H_CRC: usize = H_RESERVED + 4;
pub const HEADER_SIZE: usize = H_CRC + 4;
const _: () = assert!(HEADER_SIZE == 64);

const R_KIND: usize = 0;
const R_STATE: usize = R_KIND + 1;
const R_RESERVED: usize = R_STATE + 1;
const R_COUNT: usize = R_RESERVED + 2;
const R_START: usize = R_COUNT + 4;
const R_RESERVED2: usize = R_START + 8;
const R_CRC: usize = R_RESERVED2 + 12;
pub const RECORD_SIZE: usize = R_CRC + 4;
const _: () = assert!(RECORD_SIZE == 32);

pub const KIND_SET: u8 = 1;
pub const KIND_COMMIT: u8 = 2;

/// The validated header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub disk_size: u64,
    pub base: ChunkId,
}

/// A run of sectors set to one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub count: u32,
    pub state: u8,
}

/// The result of reading a map file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub header: Header,
    /// Committed runs in order (later ones override earlier ones).
    pub runs: Vec<Run>,
    /// Chain value after the last committed record.
    pub chain: u32,
    pub last_seq: u64,
    /// Length of the committed prefix of the file.
    pub valid_len: usize,
    /// Bytes after it (an uncommitted or torn tail), ignored.
    pub discarded: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("file is {0} bytes, shorter than the {HEADER_SIZE}-byte header")]
    Truncated(usize),
    #[error("bad magic: not a roamdisk session map")]
    BadMagic,
    #[error("unsupported version {0} (this build reads version {VERSION})")]
    BadVersion(u32),
    #[error("header checksum mismatch: the header is damaged")]
    BadHeaderCrc,
    #[error("bad header field: {0}")]
    BadField(&'static str),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8"))
}

impl Header {
    pub fn sectors(&self) -> u64 {
        self.disk_size / 512
    }

    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC);
        b[H_VERSION..H_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[H_DISK_SIZE..H_DISK_SIZE + 8].copy_from_slice(&self.disk_size.to_le_bytes());
        b[H_BASE..H_BASE + 32].copy_from_slice(&self.base.0);
        let crc = crc32c::crc32c(&b[..H_CRC]);
        b[H_CRC..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8]) -> Result<Header, MapError> {
        if b.len() < HEADER_SIZE {
            return Err(MapError::Truncated(b.len()));
        }
        if b[H_MAGIC..H_MAGIC + 8] != MAGIC {
            return Err(MapError::BadMagic);
        }
        let v = u32_at(b, H_VERSION);
        if v != VERSION {
            return Err(MapError::BadVersion(v));
        }
        if crc32c::crc32c(&b[..H_CRC]) != u32_at(b, H_CRC) {
            return Err(MapError::BadHeaderCrc);
        }
        if u32_at(b, H_FLAGS) != 0 || u32_at(b, H_RESERVED) != 0 {
            return Err(MapError::BadField("flags"));
        }
        let disk_size = u64_at(b, H_DISK_SIZE);
        if disk_size == 0 || !disk_size.is_multiple_of(512) || disk_size > crate::index::MAX_DISK {
            return Err(MapError::BadField("disk size"));
        }
        let base = ChunkId::from_slice(&b[H_BASE..H_BASE + 32]);
        if base.is_zero() {
            return Err(MapError::BadField("base version"));
        }
        Ok(Header { disk_size, base })
    }

    /// The chain seed: the header's checksum.
    pub fn chain_seed(encoded: &[u8; HEADER_SIZE]) -> u32 {
        u32_at(encoded, H_CRC)
    }
}

/// Encode one record, chained to `prev`.
pub fn encode_record(kind: u8, state: u8, count: u32, start: u64, prev: u32) -> [u8; RECORD_SIZE] {
    let mut r = [0u8; RECORD_SIZE];
    r[R_KIND] = kind;
    r[R_STATE] = state;
    r[R_COUNT..R_COUNT + 4].copy_from_slice(&count.to_le_bytes());
    r[R_START..R_START + 8].copy_from_slice(&start.to_le_bytes());
    let crc = crc32c::crc32c_append(prev, &r[..R_CRC]);
    r[R_CRC..].copy_from_slice(&crc.to_le_bytes());
    r
}

/// The checksum of an encoded record (the next record's chain seed).
pub fn record_crc(r: &[u8; RECORD_SIZE]) -> u32 {
    u32_at(r, R_CRC)
}

/// Read a map file: validate the header, apply every run up to the last
/// valid COMMIT, ignore the rest.
pub fn replay(b: &[u8]) -> Result<Replay, MapError> {
    let header = Header::parse(b)?;
    let sectors = header.sectors();
    let mut chain = u32_at(b, H_CRC);
    let mut pos = HEADER_SIZE;
    let mut pending = Vec::new();
    let mut out = Replay {
        header,
        runs: Vec::new(),
        chain,
        last_seq: 0,
        valid_len: HEADER_SIZE,
        discarded: 0,
    };
    while pos + RECORD_SIZE <= b.len() {
        let r = &b[pos..pos + RECORD_SIZE];
        if crc32c::crc32c_append(chain, &r[..R_CRC]) != u32_at(r, R_CRC)
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
                if state > 3
                    || count == 0
                    || start.checked_add(count as u64).is_none_or(|e| e > sectors)
                {
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
                out.chain = u32_at(r, R_CRC);
            }
            _ => break,
        }
        chain = u32_at(r, R_CRC);
        pos += RECORD_SIZE;
    }
    out.discarded = b.len() - out.valid_len;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_stops_at_torn_tail() {
        let h = Header {
            disk_size: 1 << 20,
            base: ChunkId([1; 32]),
        };
        let hb = h.encode();
        let mut b = hb.to_vec();
        let mut chain = Header::chain_seed(&hb);
        let r1 = encode_record(KIND_SET, 3, 8, 0, chain);
        chain = record_crc(&r1);
        let c1 = encode_record(KIND_COMMIT, 0, 0, 1, chain);
        chain = record_crc(&c1);
        let r2 = encode_record(KIND_SET, 1, 4, 100, chain);
        b.extend_from_slice(&r1);
        b.extend_from_slice(&c1);
        b.extend_from_slice(&r2);
        let rep = replay(&b).unwrap();
        assert_eq!(
            rep.runs,
            vec![Run {
                start: 0,
                count: 8,
                state: 3
            }]
        );
        assert_eq!(rep.discarded, RECORD_SIZE);
        assert_eq!(rep.header, h);
        for cut in 0..HEADER_SIZE {
            assert!(replay(&b[..cut]).is_err());
        }
        let mut bad = b.clone();
        bad[HEADER_SIZE + 9] ^= 1;
        assert!(replay(&bad).unwrap().runs.is_empty());
    }
}
