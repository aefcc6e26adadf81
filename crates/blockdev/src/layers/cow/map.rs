//! The cow overlay's map file (`OVERLAY.cowmap`): the overlay-map engine's
//! log ([`crate::overlay`]) with the cow header and the cluster states.
//!
//! Byte layout: `docs/formats/cow-map.md` (header fields and states) and
//! `docs/formats/overlay-map.md` (the log, replay and crash argument).
//! Pure parsing and encoding (no I/O), fuzzed.

use std::path::{Path, PathBuf};

use crate::overlay::log::{u32_at, u64_at, MapError, MapHeader, BODY_SIZE};

/// File magic, bytes 0..8 of the header.
pub const MAGIC: [u8; 8] = *b"RDCOWMAP";
/// Current format version.
pub const VERSION: u32 = 1;

crate::offsets! {
    // The header body's fields (file offset = 12 + body offset).
    B_HEADER_SIZE: 4, B_CLUSTER_SIZE: 4, B_FLAGS: 4, B_VIRTUAL_SIZE: 8, B_GENERATION: 8,
    B_RESERVED: 20;
    == BODY_SIZE
}

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
    /// Incremented at every compaction.
    pub generation: u64,
}

/// Whether `c` is an acceptable cluster size.
pub fn valid_cluster_size(c: u32) -> bool {
    c.is_power_of_two() && (MIN_CLUSTER..=MAX_CLUSTER).contains(&c)
}

/// The map file that belongs to an overlay.
pub fn map_path(overlay: &Path) -> PathBuf {
    crate::durable::with_suffix(overlay, ".cowmap")
}

impl MapHeader for Header {
    const MAGIC: [u8; 8] = MAGIC;
    const VERSION: u32 = VERSION;
    const MAX_STATE: u8 = State::Zero as u8;
    const WHAT: &'static str = "cow map";

    fn encode_body(&self, b: &mut [u8; BODY_SIZE]) {
        let hs = crate::overlay::log::HEADER_SIZE as u32;
        b[B_HEADER_SIZE..B_CLUSTER_SIZE].copy_from_slice(&hs.to_le_bytes());
        b[B_CLUSTER_SIZE..B_FLAGS].copy_from_slice(&self.cluster_size.to_le_bytes());
        b[B_VIRTUAL_SIZE..B_GENERATION].copy_from_slice(&self.virtual_size.to_le_bytes());
        b[B_GENERATION..B_RESERVED].copy_from_slice(&self.generation.to_le_bytes());
    }

    fn parse_body(b: &[u8; BODY_SIZE]) -> Result<Header, MapError> {
        let hs = u32_at(b, B_HEADER_SIZE);
        if hs as usize != crate::overlay::log::HEADER_SIZE {
            return Err(MapError::BadField(format!(
                "header size {hs} is not {}",
                crate::overlay::log::HEADER_SIZE
            )));
        }
        let cluster_size = u32_at(b, B_CLUSTER_SIZE);
        if !valid_cluster_size(cluster_size) {
            return Err(MapError::BadField(format!(
                "cluster size {cluster_size} is not a power of two between 4 KiB and 4 MiB"
            )));
        }
        let flags = u32_at(b, B_FLAGS);
        if flags != 0 {
            return Err(MapError::BadField(format!(
                "unknown header flags {flags:#x}"
            )));
        }
        Ok(Header {
            cluster_size,
            virtual_size: u64_at(b, B_VIRTUAL_SIZE),
            generation: u64_at(b, B_GENERATION),
        })
    }

    fn units(&self) -> u64 {
        self.clusters()
    }

    fn compacted(&mut self) {
        self.generation += 1;
    }
}

impl Header {
    /// Number of clusters covering the virtual size.
    pub fn clusters(&self) -> u64 {
        self.virtual_size.div_ceil(self.cluster_size as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overlay::log::{self, encode_record, record_crc, KIND_COMMIT, KIND_SET};

    fn file_with(runs: &[(u64, u32, u8)]) -> Vec<u8> {
        let h = Header {
            cluster_size: 65536,
            virtual_size: 100 * 65536,
            generation: 1,
        };
        let hb = log::encode_header(&h);
        let mut chain = log::chain_seed(&hb);
        let mut v = hb.to_vec();
        for &(s, c, st) in runs {
            let r = encode_record(KIND_SET, st, c, s, chain);
            chain = record_crc(&r);
            v.extend_from_slice(&r);
        }
        v.extend_from_slice(&encode_record(KIND_COMMIT, 0, 0, 1, chain));
        v
    }

    #[test]
    fn header_round_trips_at_the_documented_offsets() {
        let f = file_with(&[(0, 4, 1), (10, 2, 2)]);
        assert_eq!(&f[0..8], b"RDCOWMAP");
        assert_eq!(u32_at(&f, 12), 64);
        assert_eq!(u32_at(&f, 16), 65536);
        assert_eq!(u64_at(&f, 24), 100 * 65536);
        assert_eq!(u64_at(&f, 32), 1);
        let r = log::replay::<Header>(&f).unwrap();
        assert_eq!(r.runs.len(), 2);
        assert_eq!(r.header.clusters(), 100);
    }

    #[test]
    fn bad_fields_and_a_state_past_zero_are_refused() {
        let f = file_with(&[(0, 4, 3)]);
        assert!(log::replay::<Header>(&f).unwrap().runs.is_empty());
        let h = Header {
            cluster_size: 3000,
            virtual_size: 1 << 20,
            generation: 1,
        };
        let e = log::replay::<Header>(&log::encode_header(&h)).unwrap_err();
        assert!(e.to_string().contains("cluster size 3000"), "{e}");
    }
}
