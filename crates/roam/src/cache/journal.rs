//! The shared cache's journal: an append-only log of what entered, was
//! referenced in, and left the cache (`docs/formats/cas-shared-cache.md`).
//!
//! ```text
//! header (20 bytes)
//!   0  magic    8   "RDSCJRN\0"
//!   8  version  4   u32 LE = 1
//!  12  flags    4   u32 LE = 0 (reserved)
//!  16  crc      4   CRC-32C of bytes 0..16
//! record (41 bytes), repeated
//!   0  kind     1   1 = insert, 2 = touch, 3 = evict
//!   1  id      32   chunk id
//!  33  size     4   u32 LE: bytes of the chunk (insert), 0 otherwise
//!  37  crc      4   CRC-32C of bytes 0..37
//! ```
//!
//! Records are only appended under the cache's lock, whole, so a bad
//! record can only be a torn tail: decoding stops there, and the next
//! writer truncates it away.

use roamdisk_chunkstore::hash::{ChunkId, ID_LEN};

pub const MAGIC: [u8; 8] = *b"RDSCJRN\0";
pub const VERSION: u32 = 1;

roamdisk_blockdev::offsets! {
    H_MAGIC: 8, H_VERSION: 4, H_FLAGS: 4, H_CRC: 4;
    /// Header length.
    pub HEADER_LEN == 20
}

roamdisk_blockdev::offsets! {
    R_KIND: 1, R_ID: ID_LEN, R_SIZE: 4, R_CRC: 4;
    /// Record length.
    pub RECORD_LEN == 41
}

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The chunk's file is in the cache (its size in bytes).
    Insert(u32),
    /// The chunk was referenced (a hit, or kept because it is pinned).
    Touch,
    /// The chunk's file left the cache (or never entered it).
    Evict,
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub id: ChunkId,
}

/// Why a journal's header is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("the journal is {0} bytes, shorter than its 20-byte header")]
    Short(usize),
    #[error("not a shared-cache journal (bad magic)")]
    Magic,
    #[error("the journal header's checksum does not match")]
    Checksum,
    #[error("journal version {0} is not supported (this build reads version 1)")]
    Version(u32),
}

pub fn encode_header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[H_MAGIC..H_VERSION].copy_from_slice(&MAGIC);
    h[H_VERSION..H_FLAGS].copy_from_slice(&VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&h[..H_CRC]);
    h[H_CRC..].copy_from_slice(&crc.to_le_bytes());
    h
}

pub fn check_header(b: &[u8]) -> Result<(), HeaderError> {
    if b.len() < HEADER_LEN {
        return Err(HeaderError::Short(b.len()));
    }
    if b[H_MAGIC..H_VERSION] != MAGIC {
        return Err(HeaderError::Magic);
    }
    if crc32c::crc32c(&b[..H_CRC]) != u32_at(b, H_CRC) {
        return Err(HeaderError::Checksum);
    }
    match u32_at(b, H_VERSION) {
        VERSION => Ok(()),
        v => Err(HeaderError::Version(v)),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Record {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut r = [0u8; RECORD_LEN];
        let (kind, size) = match self.kind {
            Kind::Insert(s) => (1, s),
            Kind::Touch => (2, 0),
            Kind::Evict => (3, 0),
        };
        r[R_KIND] = kind;
        r[R_ID..R_SIZE].copy_from_slice(&self.id.0);
        r[R_SIZE..R_CRC].copy_from_slice(&size.to_le_bytes());
        let crc = crc32c::crc32c(&r[..R_CRC]);
        r[R_CRC..].copy_from_slice(&crc.to_le_bytes());
        r
    }

    /// One record, or `None` if the bytes are not a whole valid record.
    pub fn decode(b: &[u8]) -> Option<Record> {
        if b.len() < RECORD_LEN || crc32c::crc32c(&b[..R_CRC]) != u32_at(b, R_CRC) {
            return None;
        }
        let size = u32_at(b, R_SIZE);
        let kind = match (b[R_KIND], size) {
            (1, s) => Kind::Insert(s),
            (2, 0) => Kind::Touch,
            (3, 0) => Kind::Evict,
            _ => return None,
        };
        let id = ChunkId::from_slice(&b[R_ID..R_SIZE]);
        if id.is_zero() {
            return None;
        }
        Some(Record { kind, id })
    }
}

/// Decode the records of `body` (the bytes after the header) up to the
/// first one that is not whole and valid. Returns the records and how
/// many bytes of `body` they cover.
pub fn decode_records(body: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::with_capacity(body.len() / RECORD_LEN);
    let mut at = 0;
    while let Some(r) = body.get(at..).and_then(Record::decode) {
        out.push(r);
        at += RECORD_LEN;
    }
    (out, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ChunkId {
        ChunkId([n; ID_LEN])
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_log() {
        let recs = [
            Record {
                kind: Kind::Insert(65536),
                id: id(1),
            },
            Record {
                kind: Kind::Touch,
                id: id(1),
            },
            Record {
                kind: Kind::Evict,
                id: id(2),
            },
        ];
        let mut body: Vec<u8> = recs.iter().flat_map(|r| r.encode()).collect();
        assert_eq!(decode_records(&body), (recs.to_vec(), 3 * RECORD_LEN));
        for cut in 0..RECORD_LEN {
            let (r, n) = decode_records(&body[..2 * RECORD_LEN + cut]);
            assert_eq!((r.len(), n), (2, 2 * RECORD_LEN));
        }
        for bit in 0..RECORD_LEN * 8 {
            let mut b = body.clone();
            b[RECORD_LEN + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_records(&b).0.len(), 1, "bit {bit}");
        }
        body[0] = 9;
        assert!(decode_records(&body).0.is_empty());
    }

    #[test]
    fn header_is_checked() {
        let h = encode_header();
        check_header(&h).unwrap();
        assert_eq!(check_header(&h[..5]), Err(HeaderError::Short(5)));
        let mut bad = h;
        bad[0] = b'X';
        assert_eq!(check_header(&bad), Err(HeaderError::Magic));
        let mut bad = h;
        bad[H_FLAGS] = 1;
        assert_eq!(check_header(&bad), Err(HeaderError::Checksum));
        let mut v2 = h;
        v2[H_VERSION] = 2;
        let crc = crc32c::crc32c(&v2[..H_CRC]);
        v2[H_CRC..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(check_header(&v2), Err(HeaderError::Version(2)));
    }
}
