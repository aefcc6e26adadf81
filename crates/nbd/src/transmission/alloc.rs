//! What the server knows of an export's allocation, so that structured
//! READs need not ask the stack every time.

use std::sync::atomic::{AtomicU64, Ordering};

use roamdisk_blockdev::{Alloc, BlockDev};

/// Smallest chunk `AllocMap` tracks, and the most chunks it keeps.
const ALLOC_MIN_CHUNK_SHIFT: u32 = 26;
const ALLOC_MAX_CHUNKS: u64 = 1 << 16;
/// A chunk with holes is looked at again once writes into it add up to
/// this fraction of it (1/8).
const ALLOC_RELEARN_SHIFT: u32 = 3;
/// Chunk state: bit 0 all data, bit 1 has holes, bits 2-31 KiB written since
/// learnt, bits 32-63 count trims and zeroings.
const CHUNK_DATA: u64 = 1;
const CHUNK_MIXED: u64 = 2;
const CHUNK_KIB: u64 = 4;
const CHUNK_KIB_MASK: u64 = 0xffff_fffc;
const CHUNK_GEN: u64 = 1 << 32;

/// Which chunks of an export read as data throughout, shared by the
/// export's connections, so that a structured READ there needs no
/// block-status lookup (two `lseek`s on a raw file) to choose between data
/// and hole chunks.
///
/// A chunk is learnt with one block-status call over it and forgotten by
/// any trim or zeroing that touches it (they may punch holes); a chunk with
/// holes is learnt again once enough has been written into it. A chunk
/// wrongly taken for data would only cost a hole sent as zeroes, never
/// wrong contents; the trim count keeps a trim racing a lookup from even
/// that.
pub(crate) struct AllocMap {
    shift: u32,
    size: u64,
    chunks: Box<[AtomicU64]>,
}

impl AllocMap {
    pub(crate) fn new(size: u64) -> AllocMap {
        let mut shift = ALLOC_MIN_CHUNK_SHIFT;
        while size.div_ceil(1 << shift) > ALLOC_MAX_CHUNKS {
            shift += 1;
        }
        let n = size.div_ceil(1 << shift) as usize;
        AllocMap {
            shift,
            size,
            chunks: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Chunk indexes covering `[off, off+len)`; empty unless the range is
    /// non-empty and inside the export.
    fn span(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        match off.checked_add(len) {
            Some(end) if len > 0 && end <= self.size => {
                (off >> self.shift) as usize..((end - 1) >> self.shift) as usize + 1
            }
            _ => 0..0,
        }
    }

    /// Whether `[off, off+len)` is known to read as data throughout,
    /// learning chunks from `dev` as needed.
    pub(super) fn is_data(&self, dev: &dyn BlockDev, off: u64, len: u64) -> bool {
        let span = self.span(off, len);
        let mut all = !span.is_empty();
        let relearn = (1u64 << (self.shift - 10 - ALLOC_RELEARN_SHIFT)) * CHUNK_KIB;
        for i in span {
            let w = self.chunks[i].load(Ordering::Acquire);
            let known = if w & CHUNK_DATA != 0 {
                true
            } else if w & CHUNK_MIXED != 0 && w & CHUNK_KIB_MASK < relearn {
                false
            } else {
                self.learn(dev, i, w)
            };
            all &= known;
        }
        all
    }

    /// Ask `dev` about chunk `i`, last seen as `w`; true if it is all data.
    fn learn(&self, dev: &dyn BlockDev, i: usize, w: u64) -> bool {
        let start = (i as u64) << self.shift;
        let len = (1u64 << self.shift).min(self.size - start);
        let learnt = match dev.block_status(start, len) {
            Ok(e)
                if e.first()
                    .is_some_and(|e| e.state == Alloc::Data && e.len >= len) =>
            {
                CHUNK_DATA
            }
            Ok(_) => CHUNK_MIXED,
            Err(_) => return false,
        };
        // Fails if a trim or zeroing got in: then nothing is learnt.
        let now = (w & !(CHUNK_DATA | CHUNK_MIXED | CHUNK_KIB_MASK)) | learnt;
        let set = self.chunks[i].compare_exchange(w, now, Ordering::AcqRel, Ordering::Relaxed);
        set.is_ok() && learnt == CHUNK_DATA
    }

    /// A write landed: chunks with holes may have fewer.
    pub(super) fn wrote(&self, off: u64, len: u64) {
        let kib = len.div_ceil(1024).min(CHUNK_KIB_MASK / CHUNK_KIB) * CHUNK_KIB;
        for c in &self.chunks[self.span(off, len)] {
            if c.load(Ordering::Relaxed) & CHUNK_MIXED != 0 {
                let _ = c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                    let written = ((w & CHUNK_KIB_MASK) + kib).min(CHUNK_KIB_MASK);
                    Some((w & !CHUNK_KIB_MASK) | written)
                });
            }
        }
    }

    /// A trim or zeroing ran (successfully or not): forget what is known.
    pub(super) fn punched(&self, off: u64, len: u64) {
        for c in &self.chunks[self.span(off, len)] {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                Some((w & !(CHUNK_DATA | CHUNK_MIXED | CHUNK_KIB_MASK)).wrapping_add(CHUNK_GEN))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::layers::mem::MemDev;
    use roamdisk_blockdev::WriteFlags;

    const MIB: u64 = 1 << 20;

    #[test]
    fn alloc_map_learns_data_chunks_and_forgets_them_on_trim() {
        let dev = MemDev::new(256 * MIB);
        let map = AllocMap::new(dev.size());
        assert_eq!(map.chunks.len(), 4);
        dev.write_at(&vec![1u8; 64 << 20], 0, WriteFlags::default())
            .unwrap();
        assert!(map.is_data(&dev, 4096, 4096));
        // The second chunk has holes, and a read spanning both is not all data.
        assert!(!map.is_data(&dev, 64 * MIB + 4096, 4096));
        assert!(!map.is_data(&dev, 64 * MIB - 4096, 8192));
        dev.trim(0, 65536, WriteFlags::default()).unwrap();
        map.punched(0, 65536);
        assert!(!map.is_data(&dev, 4096, 4096));
        // Out of range or empty: never known.
        assert!(!map.is_data(&dev, 256 * MIB - 4096, 8192));
        assert!(!map.is_data(&dev, 0, 0));
        assert!(map.span(u64::MAX - 10, 100).is_empty());
    }

    #[test]
    fn alloc_map_looks_again_at_a_chunk_with_holes_after_enough_writes() {
        let dev = MemDev::new(64 * MIB);
        let map = AllocMap::new(dev.size());
        assert!(!map.is_data(&dev, 0, 4096));
        // Fill the chunk; the map notices only once 1/8 of it was written.
        let piece = vec![7u8; (4 * MIB) as usize];
        for i in 0..16 {
            dev.write_at(&piece, i * 4 * MIB, WriteFlags::default())
                .unwrap();
            if i == 0 {
                map.wrote(0, 4 * MIB);
                assert!(!map.is_data(&dev, 0, 4096));
            }
        }
        map.wrote(4 * MIB, 4 * MIB);
        assert!(map.is_data(&dev, 0, 4096));
    }

    #[test]
    fn alloc_map_learns_nothing_when_a_trim_races_the_lookup() {
        let dev = MemDev::new(64 * MIB);
        dev.write_at(&vec![1u8; 64 << 20], 0, WriteFlags::default())
            .unwrap();
        let map = AllocMap::new(dev.size());
        let seen = map.chunks[0].load(Ordering::Acquire);
        map.punched(0, 4096);
        assert!(!map.learn(&dev, 0, seen));
        assert_eq!(map.chunks[0].load(Ordering::Acquire) & CHUNK_DATA, 0);
    }
}
