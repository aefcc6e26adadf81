//! The index of an image version: one record per chunk with the chunk's
//! name (and convergent key, in encrypted stores) and the 2-bit state of
//! each of its 512-byte sectors (seed: Machine Bank, Figure 3). Byte layout:
//! `docs/formats/cas-index.md`. Pure encoding and parsing, no I/O (a fuzz target).
//!
//! In a committed version every sector is `EMPTY` (its data is in the
//! chunk) or `ZERO` (it reads as zeroes); a chunk whose sectors are all
//! `ZERO` is stored as no chunk at all (name all zeroes). `CLEAN` and
//! `DIRTY` appear only in a session's private-cache map.

use crate::bytes::{Reader, Writer};
use crate::chunk::Key;
use crate::error::{bad_arg, corrupt};
use crate::hash::{ChunkId, HashKind, ID_LEN};
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 8] = *b"RDCASIDX";
pub const VERSION: u32 = 1;
pub const FLAG_KEYS: u32 = 1;
pub const FLAG_ZSTD: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_KEYS | FLAG_ZSTD;

/// Size of the header. Its fields are written and read in order, named,
/// by [`Index::encode`] and [`Index::parse`] (as in the version package
/// and the catalog), so no offset table repeats the spec.
pub const HEADER_SIZE: usize = 64;

/// Sector size (bytes) and its shift.
pub const SECTOR: u64 = 512;
pub const SECTOR_SHIFT: u8 = 9;
/// Default chunk size: 64 KiB, the seed's optimum (Figures 4-5).
pub const DEFAULT_CHUNK: u32 = 64 * 1024;
pub const MIN_CHUNK: u32 = 4096;
pub const MAX_CHUNK: u32 = 4 << 20;
/// Largest disk an index describes (16 TiB).
pub const MAX_DISK: u64 = 16 << 40;
/// Largest decompressed index accepted (1 GiB: 16 TiB in 1 MiB chunks,
/// 2 TiB in 64 KiB chunks).
pub const MAX_RAW: usize = 1 << 30;

/// Per-sector state (2 bits; the seed's encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SectorState {
    /// 00: not in the private cache; data is in the version's chunk.
    Empty = 0,
    /// 01: reads as zeroes.
    Zero = 1,
    /// 10: the private cache holds data ready for reading.
    Clean = 2,
    /// 11: written in this session (the private cache holds it).
    Dirty = 3,
}

impl SectorState {
    pub fn from_bits(b: u8) -> SectorState {
        match b & 3 {
            0 => SectorState::Empty,
            1 => SectorState::Zero,
            2 => SectorState::Clean,
            _ => SectorState::Dirty,
        }
    }
}

/// Whether a chunk size is acceptable: a power of two, 4 KiB..4 MiB.
pub fn valid_chunk_size(c: u32) -> bool {
    c.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&c)
}

/// The index of one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    pub hash: HashKind,
    pub chunk_size: u32,
    pub disk_size: u64,
    /// Chunk names; `ChunkId::ZERO` = no chunk (all sectors zero).
    pub ids: Vec<ChunkId>,
    /// Convergent keys, one per record, or empty when not encrypted.
    pub keys: Vec<Key>,
    /// 2-bit sector states, `state_bytes()` per record.
    pub states: Vec<u8>,
}

impl Index {
    /// An index of `disk_size` bytes with every chunk absent (all zero).
    pub fn new_zero(
        hash: HashKind,
        chunk_size: u32,
        disk_size: u64,
        encrypted: bool,
    ) -> Result<Index> {
        if !valid_chunk_size(chunk_size) {
            return Err(bad_arg(format!(
                "chunk size {chunk_size} must be a power of two from 4 KiB to 4 MiB"
            )));
        }
        if !disk_size.is_multiple_of(SECTOR) || disk_size == 0 || disk_size > MAX_DISK {
            return Err(bad_arg(format!(
                "disk size {disk_size} must be a non-zero multiple of 512 bytes, at most 16 TiB"
            )));
        }
        let n = disk_size.div_ceil(chunk_size as u64) as usize;
        let sb = (chunk_size as u64 / SECTOR / 4) as usize;
        Ok(Index {
            hash,
            chunk_size,
            disk_size,
            ids: vec![ChunkId::ZERO; n],
            keys: if encrypted {
                vec![[0; 32]; n]
            } else {
                Vec::new()
            },
            states: vec![0x55; n * sb],
        })
    }

    pub fn encrypted(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn records(&self) -> usize {
        self.ids.len()
    }

    /// Sectors per chunk.
    pub fn chunk_sectors(&self) -> usize {
        (self.chunk_size as u64 / SECTOR) as usize
    }

    /// Bytes of state per record.
    pub fn state_bytes(&self) -> usize {
        self.chunk_sectors() / 4
    }

    /// Bytes of disk covered by record `i` (the last may be short).
    pub fn chunk_len(&self, i: usize) -> usize {
        let start = i as u64 * self.chunk_size as u64;
        (self.disk_size - start).min(self.chunk_size as u64) as usize
    }

    pub fn state(&self, i: usize, sector: usize) -> SectorState {
        let b = self.states[i * self.state_bytes() + sector / 4];
        SectorState::from_bits(b >> ((sector % 4) * 2))
    }

    pub fn set_state(&mut self, i: usize, sector: usize, s: SectorState) {
        let at = i * self.state_bytes() + sector / 4;
        let shift = (sector % 4) * 2;
        self.states[at] = (self.states[at] & !(3 << shift)) | ((s as u8) << shift);
    }

    /// The state bytes of record `i`.
    pub fn record_states(&self, i: usize) -> &[u8] {
        let sb = self.state_bytes();
        &self.states[i * sb..(i + 1) * sb]
    }

    /// The EMPTY/ZERO states of chunk content, and whether it is all
    /// zero. Sectors past the end of short content are ZERO.
    pub fn content_states(&self, data: &[u8]) -> (bool, Vec<u8>) {
        let mut states = vec![0u8; self.state_bytes()];
        let mut all_zero = true;
        for (j, byte) in states.iter_mut().enumerate() {
            let mut v = 0u8;
            for k in 0..4 {
                let s = (j * 4 + k) * SECTOR as usize;
                let zero = s >= data.len()
                    || crate::hash::is_zero(&data[s..(s + SECTOR as usize).min(data.len())]);
                if zero {
                    v |= 1 << (k * 2);
                } else {
                    all_zero = false;
                }
            }
            *byte = v;
        }
        (all_zero, states)
    }

    /// Set record `i` from its name, key and states (from
    /// [`Index::content_states`]). All-ZERO states make it no chunk.
    pub fn set_record_states(&mut self, i: usize, id: ChunkId, key: Option<Key>, states: &[u8]) {
        let sb = self.state_bytes();
        self.states[i * sb..(i + 1) * sb].copy_from_slice(states);
        let all_zero = states.iter().all(|&b| b == 0x55);
        self.ids[i] = if all_zero { ChunkId::ZERO } else { id };
        if !self.keys.is_empty() {
            self.keys[i] = if all_zero {
                [0; 32]
            } else {
                key.unwrap_or([0; 32])
            };
        }
    }

    /// Set record `i` from chunk content: its name, key and per-sector
    /// EMPTY/ZERO states. An all-zero chunk becomes no chunk.
    pub fn set_record(&mut self, i: usize, id: ChunkId, key: Option<Key>, data: &[u8]) {
        let (_, states) = self.content_states(data);
        self.set_record_states(i, id, key, &states);
    }

    /// Mark record `i` as no chunk (all zero).
    pub fn set_zero(&mut self, i: usize) {
        let sb = self.state_bytes();
        self.states[i * sb..(i + 1) * sb].fill(0x55);
        self.ids[i] = ChunkId::ZERO;
        if !self.keys.is_empty() {
            self.keys[i] = [0; 32];
        }
    }

    /// Copy record `i` of `other` (same geometry) into this index.
    pub fn copy_record(&mut self, i: usize, other: &Index) {
        let sb = self.state_bytes();
        self.states[i * sb..(i + 1) * sb].copy_from_slice(other.record_states(i));
        self.ids[i] = other.ids[i];
        if !self.keys.is_empty() {
            self.keys[i] = other.keys.get(i).copied().unwrap_or([0; 32]);
        }
    }

    pub fn key(&self, i: usize) -> Option<&Key> {
        self.keys.get(i)
    }

    /// Bytes of non-zero chunks (logical data the version holds).
    pub fn data_bytes(&self) -> u64 {
        (0..self.records())
            .filter(|&i| !self.ids[i].is_zero())
            .map(|i| self.chunk_len(i) as u64)
            .sum()
    }

    /// Encode: header plus records, zstd-compressed with `zstd_level`
    /// (`None`: stored raw).
    pub fn encode(&self, zstd_level: Option<i32>) -> Vec<u8> {
        let sb = self.state_bytes();
        let rec = ID_LEN + if self.encrypted() { 32 } else { 0 } + sb;
        let mut raw = Vec::with_capacity(rec * self.records());
        for i in 0..self.records() {
            raw.extend_from_slice(&self.ids[i].0);
            if self.encrypted() {
                raw.extend_from_slice(&self.keys[i]);
            }
            raw.extend_from_slice(self.record_states(i));
        }
        let mut flags = if self.encrypted() { FLAG_KEYS } else { 0 };
        let payload = match zstd_level {
            Some(l) => {
                flags |= FLAG_ZSTD;
                zstd::bulk::compress(&raw, l).expect("zstd compress")
            }
            None => raw,
        };
        let mut w = Writer::new();
        w.bytes(&MAGIC)
            .u32(VERSION)
            .u32(flags)
            .u8(self.hash as u8)
            .u8(SECTOR_SHIFT)
            .u16(0)
            .u32(self.chunk_size)
            .u64(self.disk_size)
            .u64(self.records() as u64)
            .u64(payload.len() as u64)
            .u32(crc32c::crc32c(&payload))
            .zeros(8)
            .crc();
        debug_assert_eq!(w.buf.len(), HEADER_SIZE);
        w.bytes(&payload);
        w.buf
    }

    /// Parse and validate an index. With `committed`, only EMPTY and ZERO
    /// states are accepted and a record's name must be zero exactly when
    /// all its sectors are ZERO.
    pub fn parse(b: &[u8], committed: bool) -> Result<Index> {
        let mut r = Reader::new(b, "index");
        r.frame(&MAGIC, VERSION)?;
        let flags = r.u32("flags")?;
        let hash = HashKind::from_u8(r.u8("hash")?)?;
        let shift = r.u8("sector shift")?;
        let res0 = r.u16("reserved")?;
        let chunk_size = r.u32("chunk size")?;
        let disk_size = r.u64("disk size")?;
        let records = r.u64("records")?;
        let payload_len = r.u64("payload length")?;
        let payload_crc = r.u32("payload crc")?;
        let res1 = r.u64("reserved")?;
        r.header_crc()?;
        if flags & !KNOWN_FLAGS != 0 || res0 != 0 || res1 != 0 || shift != SECTOR_SHIFT {
            return Err(corrupt(format!(
                "index header has unknown flags {flags:#x} or sector shift {shift}"
            )));
        }
        if !valid_chunk_size(chunk_size) {
            return Err(corrupt(format!("index chunk size {chunk_size} is invalid")));
        }
        if disk_size == 0 || disk_size % SECTOR != 0 || disk_size > MAX_DISK {
            return Err(corrupt(format!("index disk size {disk_size} is invalid")));
        }
        let n = disk_size.div_ceil(chunk_size as u64);
        if records != n {
            return Err(corrupt(format!(
                "index has {records} records but a {disk_size}-byte disk in {chunk_size}-byte chunks needs {n}"
            )));
        }
        if payload_len != r.remaining() as u64 {
            return Err(corrupt(format!(
                "index payload is {} bytes but its header says {payload_len} (truncated index)",
                r.remaining()
            )));
        }
        let payload = r.bytes(payload_len as usize, "payload")?;
        if crc32c::crc32c(payload) != payload_crc {
            return Err(corrupt(
                "index payload checksum mismatch: the index is damaged",
            ));
        }
        let encrypted = flags & FLAG_KEYS != 0;
        let sb = (chunk_size as u64 / SECTOR / 4) as usize;
        let rec = ID_LEN + if encrypted { 32 } else { 0 } + sb;
        let raw_len = rec
            .checked_mul(n as usize)
            .filter(|&l| l <= MAX_RAW)
            .ok_or_else(|| {
                corrupt(format!(
                    "index of {n} records is larger than this build reads"
                ))
            })?;
        let raw = if flags & FLAG_ZSTD != 0 {
            let d = crate::chunk::decompress_bounded(payload, raw_len)
                .map_err(|e| corrupt(format!("index payload does not decompress: {e}")))?;
            if d.len() != raw_len {
                return Err(corrupt(format!(
                    "index records are {} bytes, expected {raw_len}",
                    d.len()
                )));
            }
            d
        } else {
            if payload.len() != raw_len {
                return Err(corrupt(format!(
                    "index records are {} bytes, expected {raw_len}",
                    payload.len()
                )));
            }
            payload.to_vec()
        };
        let mut idx = Index {
            hash,
            chunk_size,
            disk_size,
            ids: Vec::with_capacity(n as usize),
            keys: Vec::new(),
            states: Vec::with_capacity(n as usize * sb),
        };
        for (i, r) in raw.chunks_exact(rec).enumerate() {
            let id = ChunkId::from_slice(&r[..ID_LEN]);
            let st = &r[rec - sb..];
            if committed {
                let mut all_zero = true;
                for &byte in st {
                    for k in 0..4 {
                        match (byte >> (k * 2)) & 3 {
                            0 => all_zero = false,
                            1 => {}
                            v => {
                                return Err(corrupt(format!(
                                    "index record {i} has sector state {v} (CLEAN/DIRTY) in a committed version"
                                )))
                            }
                        }
                    }
                }
                if all_zero != id.is_zero() {
                    return Err(corrupt(format!(
                        "index record {i}: name and sector states disagree about whether the chunk is all zero"
                    )));
                }
            }
            idx.ids.push(id);
            if encrypted {
                let mut k = [0u8; 32];
                k.copy_from_slice(&r[ID_LEN..ID_LEN + 32]);
                idx.keys.push(k);
            }
            idx.states.extend_from_slice(st);
        }
        Ok(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(encrypted: bool) -> Index {
        let mut idx =
            Index::new_zero(HashKind::Blake3, 65536, 5 * 65536 + 4096, encrypted).unwrap();
        let mut data = vec![0u8; 65536];
        data[512 * 3] = 1;
        idx.set_record(1, HashKind::Blake3.hash(&data), Some([3; 32]), &data);
        let short = vec![9u8; 4096];
        idx.set_record(5, HashKind::Blake3.hash(&short), Some([4; 32]), &short);
        idx
    }

    #[test]
    fn round_trips_and_states() {
        for enc in [false, true] {
            let idx = sample(enc);
            assert_eq!(idx.records(), 6);
            assert_eq!(idx.state(1, 3), SectorState::Empty);
            assert_eq!(idx.state(1, 4), SectorState::Zero);
            assert_eq!(idx.state(5, 7), SectorState::Empty);
            assert_eq!(idx.state(5, 8), SectorState::Zero, "past the end");
            assert!(idx.ids[0].is_zero());
            for level in [None, Some(3)] {
                let b = idx.encode(level);
                assert_eq!(Index::parse(&b, true).unwrap(), idx);
            }
        }
    }

    #[test]
    fn damage_and_truncation_are_reported() {
        let b = sample(false).encode(Some(3));
        for cut in [0, 10, HEADER_SIZE - 1, HEADER_SIZE, b.len() - 1] {
            let e = Index::parse(&b[..cut], true).unwrap_err();
            assert_eq!(e.kind(), roamdisk_blockdev::ErrorKind::Corrupt, "cut {cut}");
        }
        for i in [0, 9, 20, 40, 70, b.len() - 2] {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(Index::parse(&bad, true).is_err(), "byte {i}");
        }
    }

    #[test]
    fn session_states_rejected_in_committed_index() {
        let mut idx = sample(false);
        idx.set_state(1, 0, SectorState::Dirty);
        let b = idx.encode(None);
        assert!(Index::parse(&b, true).is_err());
        assert_eq!(Index::parse(&b, false).unwrap(), idx);
    }
}
