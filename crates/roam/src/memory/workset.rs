//! The memory working set a lazy resume records: the chunks of the page
//! image (block, chunk) the guest touched first, in order, written to
//! `SESSION/memory-working-set` (`docs/formats/cas-working-set.md`, the
//! `RDMEMWKS` file) when the memory has all arrived. The next suspend of
//! the session keeps it in the new version's page image, and the next
//! lazy resume pushes those chunks first. A hint: a lost or damaged file
//! costs speed only (it is ignored, with a warning).

use std::path::Path;

use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::bytes::{Reader, Writer};
use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::memimage::MemoryPages;

pub const MAGIC: [u8; 8] = *b"RDMEMWKS";
pub const VERSION: u32 = 1;
pub const FILE: &str = "memory-working-set";
/// Most chunks a recording holds.
pub const MAX: usize = 1 << 20;

/// The file's bytes: header, the (block, chunk) pairs, a CRC-32C.
pub fn encode(order: &[(u32, u32)]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&MAGIC).u32(VERSION).u32(order.len() as u32);
    for &(b, c) in order {
        w.u32(b).u32(c);
    }
    w.crc();
    w.buf
}

/// Parse a recording (structure only: the pairs are checked against an
/// image by [`fit`]).
pub fn decode(b: &[u8]) -> Result<Vec<(u32, u32)>> {
    let body = b
        .len()
        .checked_sub(4)
        .ok_or_else(|| corrupt("memory working-set file is truncated"))?;
    let mut crc = Reader::new(b, "memory working-set file");
    crc.bytes(body, "body")?;
    crc.header_crc()?;
    let mut r = Reader::new(&b[..body], "memory working-set file");
    r.frame(&MAGIC, VERSION)?;
    let n = r.u32("count")? as usize;
    if n > MAX || n.saturating_mul(8) != r.remaining() {
        return Err(corrupt(format!(
            "memory working-set file of {n} chunks in {} bytes",
            r.remaining()
        )));
    }
    (0..n)
        .map(|_| Ok((r.u32("block")?, r.u32("chunk")?)))
        .collect()
}

/// Write the recording into the session folder `dir`.
pub fn save(dir: &Path, order: &[(u32, u32)]) -> Result<()> {
    let p = dir.join(FILE);
    roamdisk_blockdev::durable::write_atomically(&p, &encode(order))
        .map_err(|e| io(Op::Write, e, &p))
}

/// The recording in `dir`, if there is a sound one (damage is logged and
/// ignored).
pub fn load(dir: &Path) -> Option<Vec<(u32, u32)>> {
    let p = dir.join(FILE);
    let b = std::fs::read(&p).ok()?;
    match decode(&b) {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!(
                "{}: {e}; ignored (the base version's memory working set is kept instead)",
                p.display()
            );
            None
        }
    }
}

/// The pairs of `order` that name a chunk of `pages`, each once, in order
/// (a recording made on another image keeps what still fits).
pub fn fit(order: &[(u32, u32)], pages: &MemoryPages) -> Vec<(u32, u32)> {
    let mut seen = std::collections::HashSet::new();
    order
        .iter()
        .copied()
        .filter(|&(b, c)| {
            pages
                .blocks
                .get(b as usize)
                .is_some_and(|blk| (c as usize) < blk.index.records())
                && seen.insert((b, c))
        })
        .collect()
}

/// The memory working set a new page image of the session in `dir`
/// keeps: the one its last lazy resume recorded, else its base's (what
/// still fits `pages`).
pub fn carried(dir: &Path, pages: &MemoryPages, base: Option<&MemoryPages>) -> Vec<(u32, u32)> {
    match load(dir) {
        Some(o) if !o.is_empty() => fit(&o, pages),
        _ => base.map(|b| fit(&b.working_set, pages)).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_round_trips_and_damage_is_refused() {
        let o = vec![(0, 5), (0, 2), (3, 0)];
        let b = encode(&o);
        assert_eq!(decode(&b).unwrap(), o);
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x04;
            assert!(decode(&bad).is_err(), "flip at {i}");
        }
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &o).unwrap();
        assert_eq!(load(dir.path()), Some(o));
        std::fs::write(dir.path().join(FILE), b"junk").unwrap();
        assert_eq!(load(dir.path()), None);
    }
}
