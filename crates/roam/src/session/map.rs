//! The session map file (`SESSION/states`): the 2-bit state of every
//! sector of a session's disk (EMPTY / ZERO / CLEAN / DIRTY, as in the
//! index) and the version the session is based on. It is the overlay-map
//! engine's log ([`roamdisk_blockdev::overlay`]) with this header. Byte
//! layout: `docs/formats/cas-session.md` (header and states) and
//! `docs/formats/overlay-map.md` (log, replay, crash argument). Pure
//! encoding and parsing (a fuzz target).

use roamdisk_blockdev::overlay::log::{u32_at, u64_at, MapError, MapHeader, BODY_SIZE};

use roamdisk_chunkstore::hash::ChunkId;

pub const MAGIC: [u8; 8] = *b"RDCASSES";
pub const VERSION: u32 = 1;
/// Header flag: the session keeps a write-ahead log (`SESSION/wal`,
/// `super::wal`) whose records a reader must apply. Written into every
/// map this build makes, so that a build from before the log, which
/// refuses any flag, never opens the session and misses its flushes.
pub const FLAG_WAL: u32 = 1;

roamdisk_blockdev::offsets! {
    // The header body's fields (file offset = 12 + body offset).
    B_FLAGS: 4, B_DISK_SIZE: 8, B_BASE: 32, B_RESERVED: 4;
    == BODY_SIZE
}

/// The validated header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub disk_size: u64,
    pub base: ChunkId,
}

impl Header {
    pub fn sectors(&self) -> u64 {
        self.disk_size / 512
    }
}

fn bad(field: &str) -> MapError {
    MapError::BadField(format!("bad header field: {field}"))
}

impl MapHeader for Header {
    const MAGIC: [u8; 8] = MAGIC;
    const VERSION: u32 = VERSION;
    const MAX_STATE: u8 = 3;
    const WHAT: &'static str = "session map";

    fn encode_body(&self, b: &mut [u8; BODY_SIZE]) {
        b[B_FLAGS..B_DISK_SIZE].copy_from_slice(&FLAG_WAL.to_le_bytes());
        b[B_DISK_SIZE..B_BASE].copy_from_slice(&self.disk_size.to_le_bytes());
        b[B_BASE..B_RESERVED].copy_from_slice(&self.base.0);
    }

    fn parse_body(b: &[u8; BODY_SIZE]) -> Result<Header, MapError> {
        if u32_at(b, B_FLAGS) & !FLAG_WAL != 0 || u32_at(b, B_RESERVED) != 0 {
            return Err(bad("flags"));
        }
        let disk_size = u64_at(b, B_DISK_SIZE);
        if disk_size == 0
            || !disk_size.is_multiple_of(512)
            || disk_size > roamdisk_chunkstore::index::MAX_DISK
        {
            return Err(bad("disk size"));
        }
        let base = ChunkId::from_slice(&b[B_BASE..B_RESERVED]);
        if base.is_zero() {
            return Err(bad("base version"));
        }
        Ok(Header { disk_size, base })
    }

    fn units(&self) -> u64 {
        self.sectors()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::overlay::log::{
        self, encode_record, record_crc, replay, Run, HEADER_SIZE, KIND_COMMIT, KIND_SET,
        RECORD_SIZE,
    };

    #[test]
    fn replay_stops_at_torn_tail() {
        let h = Header {
            disk_size: 1 << 20,
            base: ChunkId([1; 32]),
        };
        let hb = log::encode_header(&h);
        assert_eq!(&hb[0..8], b"RDCASSES");
        assert_eq!(u32_at(&hb, 12), FLAG_WAL);
        assert_eq!(u64_at(&hb, 16), 1 << 20);
        assert_eq!(&hb[24..56], &[1u8; 32]);
        let mut b = hb.to_vec();
        let mut chain = log::chain_seed(&hb);
        let r1 = encode_record(KIND_SET, 3, 8, 0, chain);
        chain = record_crc(&r1);
        let c1 = encode_record(KIND_COMMIT, 0, 0, 1, chain);
        chain = record_crc(&c1);
        let r2 = encode_record(KIND_SET, 1, 4, 100, chain);
        b.extend_from_slice(&r1);
        b.extend_from_slice(&c1);
        b.extend_from_slice(&r2);
        let rep = replay::<Header>(&b).unwrap();
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
            assert!(replay::<Header>(&b[..cut]).is_err());
        }
        let mut bad = b.clone();
        bad[HEADER_SIZE + 9] ^= 1;
        assert!(replay::<Header>(&bad).unwrap().runs.is_empty());
    }
}
