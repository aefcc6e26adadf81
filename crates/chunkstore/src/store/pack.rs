//! Pack files (`RDPK`): many stored objects in one file, followed by an
//! index of where each one is. Pure encoding and parsing (no I/O); the
//! local store writes, reads and repacks them (`store/local/packs.rs`).
//! Byte layout: `docs/formats/cas-pack.md`.
//!
//! Every object in a pack is a whole envelope (`docs/formats/cas-chunk.md`),
//! byte for byte what a loose object file holds, so a read from a pack is
//! verified exactly like a read of a loose object.

use crate::error::corrupt;
use crate::hash::{ChunkId, HashKind, ID_LEN};
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 4] = *b"RDPK";
pub const VERSION: u8 = 1;

roamdisk_blockdev::offsets! {
    // Header, at offset 0.
    H_MAGIC: 4, H_VERSION: 1, H_HASH: 1, H_RESERVED: 10;
    /// Size of the pack header; the first object starts here.
    pub HEADER_SIZE == 16
}

roamdisk_blockdev::offsets! {
    // Index entry.
    X_ID: ID_LEN, X_OFFSET: 8, X_LEN: 4, X_RESERVED: 4;
    /// Size of one index entry.
    pub ENTRY_SIZE == 48
}

roamdisk_blockdev::offsets! {
    // Trailer: the last bytes of the file.
    T_INDEX_OFFSET: 8, T_COUNT: 4, T_RESERVED: 4, T_CHECKSUM: 32, T_MAGIC: 4, T_RESERVED2: 4;
    /// Size of the trailer.
    pub TRAILER_SIZE == 56
}

/// Smallest object a pack may locate: an envelope header.
const MIN_OBJECT: u32 = crate::chunk::HEADER_SIZE as u32;

/// Length of a pack's name: 32 hex digits and `.pack`.
const NAME_LEN: usize = 32 + 5;

/// Whether a file or object name is a pack's (`<32 hex digits>.pack`).
pub fn is_pack_name(n: &str) -> bool {
    n.len() == NAME_LEN && n.ends_with(".pack") && n[..32].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where one object lies in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub id: ChunkId,
    /// Offset of the envelope from the start of the pack file.
    pub offset: u64,
    /// Length of the envelope (header and payload).
    pub len: u32,
}

/// The parsed trailer: where the index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub index_offset: u64,
    pub count: u32,
    checksum: [u8; 32],
    raw_head: [u8; T_CHECKSUM],
}

/// The header of a new pack in a store using `hash`.
pub fn header(hash: HashKind) -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    h[H_MAGIC..H_MAGIC + 4].copy_from_slice(&MAGIC);
    h[H_VERSION] = VERSION;
    h[H_HASH] = hash as u8;
    h
}

/// Check a pack header (the file's first [`HEADER_SIZE`] bytes) against
/// the store's hash function.
pub fn parse_header(b: &[u8], hash: HashKind) -> Result<()> {
    if b.len() < HEADER_SIZE || b[H_MAGIC..H_MAGIC + 4] != MAGIC {
        return Err(corrupt("bad magic: not a roamdisk pack"));
    }
    if b[H_VERSION] != VERSION {
        return Err(corrupt(format!(
            "pack format version {} (this build reads {VERSION})",
            b[H_VERSION]
        )));
    }
    if b[H_RESERVED..HEADER_SIZE].iter().any(|&x| x != 0) {
        return Err(corrupt("pack header: reserved bytes are not zero"));
    }
    let h = HashKind::from_u8(b[H_HASH])?;
    if h != hash {
        return Err(corrupt(format!(
            "pack was written with {} but this store uses {}",
            h.name(),
            hash.name()
        )));
    }
    Ok(())
}

/// The index and trailer of a pack whose objects end at `index_offset`:
/// `entries` are sorted by id (they must be distinct); the checksum
/// covers `header`, the index and the trailer's first fields.
pub fn encode_tail(
    header: &[u8; HEADER_SIZE],
    entries: &mut [Entry],
    index_offset: u64,
) -> Vec<u8> {
    entries.sort_unstable_by_key(|e| e.id);
    let mut out = Vec::with_capacity(entries.len() * ENTRY_SIZE + TRAILER_SIZE);
    for e in entries.iter() {
        let mut x = [0u8; ENTRY_SIZE];
        x[X_ID..X_ID + ID_LEN].copy_from_slice(&e.id.0);
        x[X_OFFSET..X_OFFSET + 8].copy_from_slice(&e.offset.to_le_bytes());
        x[X_LEN..X_LEN + 4].copy_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&x);
    }
    let mut t = [0u8; TRAILER_SIZE];
    t[T_INDEX_OFFSET..T_INDEX_OFFSET + 8].copy_from_slice(&index_offset.to_le_bytes());
    t[T_COUNT..T_COUNT + 4].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    let sum = checksum(header, &out, &t[..T_CHECKSUM]);
    t[T_CHECKSUM..T_CHECKSUM + 32].copy_from_slice(&sum);
    t[T_MAGIC..T_MAGIC + 4].copy_from_slice(&MAGIC);
    out.extend_from_slice(&t);
    out
}

/// The trailer's checksum: BLAKE3 of the header, the index and the
/// trailer's first 16 bytes.
pub fn checksum(header: &[u8], index: &[u8], trailer_head: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(index);
    h.update(trailer_head);
    *h.finalize().as_bytes()
}

fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

impl Trailer {
    /// Parse the last [`TRAILER_SIZE`] bytes of a pack of `file_len`
    /// bytes: the index must lie between the header and the trailer and
    /// fill that space exactly.
    pub fn parse(t: &[u8], file_len: u64) -> Result<Trailer> {
        if file_len < (HEADER_SIZE + TRAILER_SIZE) as u64 || t.len() != TRAILER_SIZE {
            return Err(corrupt(format!(
                "pack of {file_len} bytes is too short for its header and trailer"
            )));
        }
        if t[T_MAGIC..T_MAGIC + 4] != MAGIC {
            return Err(corrupt(
                "pack trailer has no magic (a truncated or overwritten pack)",
            ));
        }
        if le32(t, T_RESERVED) != 0 || le32(t, T_RESERVED2) != 0 {
            return Err(corrupt("pack trailer: reserved bytes are not zero"));
        }
        let index_offset = le64(t, T_INDEX_OFFSET);
        let count = le32(t, T_COUNT);
        let index_len = count as u64 * ENTRY_SIZE as u64;
        if index_offset < HEADER_SIZE as u64
            || index_offset.checked_add(index_len + TRAILER_SIZE as u64) != Some(file_len)
        {
            return Err(corrupt(format!(
                "pack index of {count} entries at offset {index_offset} does not fit a file of {file_len} bytes"
            )));
        }
        let mut checksum = [0u8; 32];
        checksum.copy_from_slice(&t[T_CHECKSUM..T_CHECKSUM + 32]);
        let mut raw_head = [0u8; T_CHECKSUM];
        raw_head.copy_from_slice(&t[..T_CHECKSUM]);
        Ok(Trailer {
            index_offset,
            count,
            checksum,
            raw_head,
        })
    }

    /// Bytes of the index.
    pub fn index_len(&self) -> usize {
        self.count as usize * ENTRY_SIZE
    }

    /// Parse the index (the `index_len()` bytes at `index_offset`), given
    /// the pack's header: checksum, strictly ascending ids, every object
    /// inside the object area.
    pub fn parse_index(&self, header: &[u8], index: &[u8]) -> Result<Vec<Entry>> {
        if index.len() != self.index_len() || header.len() < HEADER_SIZE {
            return Err(corrupt("pack index is truncated"));
        }
        if checksum(&header[..HEADER_SIZE], index, &self.raw_head) != self.checksum {
            return Err(corrupt(
                "pack index does not match its checksum (damaged pack)",
            ));
        }
        let mut out = Vec::with_capacity(self.count as usize);
        for x in index.chunks_exact(ENTRY_SIZE) {
            let e = Entry {
                id: ChunkId::from_slice(&x[X_ID..X_ID + ID_LEN]),
                offset: le64(x, X_OFFSET),
                len: le32(x, X_LEN),
            };
            if le32(x, X_RESERVED) != 0 {
                return Err(corrupt(format!(
                    "pack index entry of {}: reserved bytes are not zero",
                    e.id
                )));
            }
            if e.len < MIN_OBJECT
                || e.offset < HEADER_SIZE as u64
                || e.offset
                    .checked_add(e.len as u64)
                    .is_none_or(|end| end > self.index_offset)
            {
                return Err(corrupt(format!(
                    "pack index puts object {} ({} bytes at offset {}) outside the object area",
                    e.id, e.len, e.offset
                )));
            }
            if out.last().is_some_and(|p: &Entry| p.id >= e.id) {
                return Err(corrupt(format!(
                    "pack index is not sorted by id at object {}",
                    e.id
                )));
            }
            out.push(e);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole pack of `objects` (id, bytes), as a writer lays it out.
    fn pack(objects: &[(ChunkId, Vec<u8>)]) -> Vec<u8> {
        let h = header(HashKind::Blake3);
        let mut out = h.to_vec();
        let mut entries = Vec::new();
        for (id, b) in objects {
            entries.push(Entry {
                id: *id,
                offset: out.len() as u64,
                len: b.len() as u32,
            });
            out.extend_from_slice(b);
        }
        let at = out.len() as u64;
        out.extend(encode_tail(&h, &mut entries, at));
        out
    }

    fn read(p: &[u8]) -> Result<Vec<Entry>> {
        parse_header(p, HashKind::Blake3)?;
        let t = Trailer::parse(&p[p.len() - TRAILER_SIZE..], p.len() as u64)?;
        let a = t.index_offset as usize;
        t.parse_index(&p[..HEADER_SIZE], &p[a..a + t.index_len()])
    }

    fn objects() -> Vec<(ChunkId, Vec<u8>)> {
        (0..5u8)
            .map(|i| (ChunkId([9 - i; 32]), vec![i; 16 + i as usize * 10]))
            .collect()
    }

    #[test]
    fn round_trip_sorted_by_id() {
        let objs = objects();
        let p = pack(&objs);
        let e = read(&p).unwrap();
        assert_eq!(e.len(), 5);
        assert!(e.windows(2).all(|w| w[0].id < w[1].id));
        for x in &e {
            let (_, b) = objs.iter().find(|(id, _)| *id == x.id).unwrap();
            let a = x.offset as usize;
            assert_eq!(&p[a..a + x.len as usize], &b[..]);
        }
        // An empty pack is valid.
        assert!(read(&pack(&[])).unwrap().is_empty());
    }

    #[test]
    fn damage_anywhere_in_header_index_or_trailer_is_refused() {
        let p = pack(&objects());
        let objects_end = p.len() - 5 * ENTRY_SIZE - TRAILER_SIZE;
        for i in (0..HEADER_SIZE).chain(objects_end..p.len()) {
            let mut bad = p.clone();
            bad[i] ^= 0x10;
            assert!(read(&bad).is_err(), "byte {i} flipped");
        }
        for cut in [1, 7, TRAILER_SIZE, p.len() - 1] {
            assert!(read(&p[..p.len() - cut]).is_err(), "cut {cut}");
        }
        assert!(parse_header(&p, HashKind::Sha256).is_err());
    }

    #[test]
    fn entries_outside_the_object_area_or_unsorted_are_refused() {
        let h = header(HashKind::Blake3);
        let check = |mut entries: Vec<Entry>, area: u64| {
            let mut p = h.to_vec();
            p.resize(area as usize, 0);
            // encode_tail sorts; unsorted input is tested by swapping after.
            let tail = encode_tail(&h, &mut entries, area);
            p.extend(tail);
            read(&p)
        };
        let e = |id: u8, offset: u64, len: u32| Entry {
            id: ChunkId([id; 32]),
            offset,
            len,
        };
        assert!(check(vec![e(1, 16, 16), e(2, 32, 16)], 48).is_ok());
        assert!(
            check(vec![e(1, 16, 16), e(2, 40, 16)], 48).is_err(),
            "past the end"
        );
        assert!(check(vec![e(1, 8, 16)], 48).is_err(), "inside the header");
        assert!(
            check(vec![e(1, u64::MAX - 8, 16)], 48).is_err(),
            "wraps around"
        );
        assert!(
            check(vec![e(1, 16, 4)], 48).is_err(),
            "shorter than an envelope"
        );
        assert!(
            check(vec![e(1, 16, 16), e(1, 32, 16)], 48).is_err(),
            "duplicate id"
        );
    }
}
