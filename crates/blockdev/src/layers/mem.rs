//! `mem:SIZE` — a sparse in-memory disk. Volatile: its contents die with the
//! process. Pages are allocated on first write; trimmed or zeroed whole
//! pages are freed, so allocation status is exact at page granularity.

use parking_lot::RwLock;
use std::collections::HashMap;

use crate::dev::{push_extent, Alloc, BlockDev, Caps, Extent, WriteFlags, ZeroFlags};
use crate::error::Result;

const PAGE_SHIFT: u32 = 16;
const PAGE: u64 = 1 << PAGE_SHIFT;
const SHARDS: usize = 64;

type Shard = RwLock<HashMap<u64, Box<[u8]>>>;

/// Ranges of up to this many pages are walked page by page; wider ones
/// (past the pages held, too) by the pages held.
const WALK_PAGES: usize = 4096;
/// The most extents one `block_status` of a wide range returns.
const MAX_EXTENTS: usize = 4096;

/// The largest `mem:` device: what NBD clients such as QEMU take (a
/// signed 64-bit size).
pub const MAX_SIZE: u64 = i64::MAX as u64 & !511;

/// A sparse RAM disk.
pub struct MemDev {
    size: u64,
    shards: Vec<Shard>,
}

impl MemDev {
    /// A zero-filled device of `size` bytes (at most [`MAX_SIZE`]) using
    /// no memory until written.
    pub fn new(size: u64) -> Self {
        assert!(
            size <= MAX_SIZE,
            "a mem device of {size} bytes is past MAX_SIZE"
        );
        MemDev {
            size,
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, page: u64) -> &Shard {
        &self.shards[(page as usize) % SHARDS]
    }

    /// Walk `[off, off+len)` page by page: `f(page, offset_in_page, len_in_page, pos_in_range)`.
    fn each_page(off: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut pos = 0u64;
        while pos < len {
            let abs = off + pos;
            let page = abs >> PAGE_SHIFT;
            let in_page = (abs & (PAGE - 1)) as usize;
            let n = ((PAGE as usize) - in_page).min((len - pos) as usize);
            f(page, in_page, n, pos as usize);
            pos += n as u64;
        }
    }

    /// Number of pages holding data (for tests and `info`).
    pub fn allocated_pages(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// The pages holding data in `[off, off+len)`, sorted, found from the
    /// pages held rather than by walking the range: a device may be
    /// exabytes, and a request may cover all of it.
    fn held_in(&self, off: u64, len: u64) -> Vec<u64> {
        let (first, last) = (off >> PAGE_SHIFT, (off + len - 1) >> PAGE_SHIFT);
        let mut v: Vec<u64> = self
            .shards
            .iter()
            .flat_map(|s| {
                let s = s.read();
                s.keys()
                    .copied()
                    .filter(|p| (first..=last).contains(p))
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether a range spans more pages than are held (then it is cheaper
    /// to visit the held ones).
    fn wide(&self, len: u64) -> bool {
        let pages = len >> PAGE_SHIFT;
        pages > WALK_PAGES as u64 && pages > self.allocated_pages() as u64
    }

    /// Whether `[start, end)` is all of `page` there is (the last page of
    /// a device whose size is not a multiple of pages is shorter).
    fn whole(&self, page: u64, start: u64, end: u64) -> bool {
        start == page << PAGE_SHIFT && (end - start == PAGE || end == self.size)
    }

    fn zero(&self, off: u64, len: u64) {
        if self.wide(len) {
            for page in self.held_in(off, len) {
                let start = (page << PAGE_SHIFT).max(off);
                let end = ((page + 1) << PAGE_SHIFT).min(off + len);
                let mut shard = self.shard(page).write();
                if self.whole(page, start, end) {
                    shard.remove(&page);
                } else if let Some(p) = shard.get_mut(&page) {
                    let at = (start & (PAGE - 1)) as usize;
                    p[at..at + (end - start) as usize].fill(0);
                }
            }
            return;
        }
        Self::each_page(off, len, |page, in_page, n, _| {
            let mut shard = self.shard(page).write();
            let start = (page << PAGE_SHIFT) + in_page as u64;
            if self.whole(page, start, start + n as u64) {
                shard.remove(&page);
            } else if let Some(p) = shard.get_mut(&page) {
                p[in_page..in_page + n].fill(0);
            }
        });
    }
}

impl BlockDev for MemDev {
    crate::layer!("mem");
    fn describe(&self) -> String {
        format!("mem:{}", self.size)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps {
            can_flush: false,
            ..Caps::FULL
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        Self::each_page(off, buf.len() as u64, |page, in_page, n, pos| {
            let shard = self.shard(page).read();
            match shard.get(&page) {
                Some(p) => buf[pos..pos + n].copy_from_slice(&p[in_page..in_page + n]),
                None => buf[pos..pos + n].fill(0),
            }
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, _flags: WriteFlags) -> Result<()> {
        Self::each_page(off, buf.len() as u64, |page, in_page, n, pos| {
            let mut shard = self.shard(page).write();
            let p = shard
                .entry(page)
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            p[in_page..in_page + n].copy_from_slice(&buf[pos..pos + n]);
        });
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn trim(&self, off: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        self.zero(off, len);
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, _flags: ZeroFlags) -> Result<()> {
        self.zero(off, len);
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        if self.wide(len) {
            let end = off + len;
            let mut pos = off;
            for page in self.held_in(off, len) {
                if out.len() >= MAX_EXTENTS {
                    return Ok(out); // a prefix, as the trait allows
                }
                let start = (page << PAGE_SHIFT).max(off);
                let stop = ((page + 1) << PAGE_SHIFT).min(end);
                for (state, to) in [(Alloc::Hole, start), (Alloc::Data, stop)] {
                    push_extent(
                        &mut out,
                        Extent {
                            len: to - pos,
                            state,
                        },
                    );
                    pos = to;
                }
            }
            push_extent(
                &mut out,
                Extent {
                    len: end - pos,
                    state: Alloc::Hole,
                },
            );
            return Ok(out);
        }
        Self::each_page(off, len, |page, _, n, _| {
            let present = self.shard(page).read().contains_key(&page);
            let state = if present { Alloc::Data } else { Alloc::Hole };
            push_extent(
                &mut out,
                Extent {
                    len: n as u64,
                    state,
                },
            );
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_trim() {
        let d = MemDev::new(1 << 20);
        d.write_at(b"hello", PAGE - 2, WriteFlags::default())
            .unwrap();
        let mut b = [0u8; 5];
        d.read_at(&mut b, PAGE - 2).unwrap();
        assert_eq!(&b, b"hello");
        assert_eq!(d.allocated_pages(), 2);
        d.trim(0, PAGE, WriteFlags::default()).unwrap();
        assert_eq!(d.allocated_pages(), 1);
        d.read_at(&mut b, PAGE - 2).unwrap();
        assert_eq!(&b, b"\0\0llo");
        let st = d.block_status(0, 1 << 20).unwrap();
        assert_eq!(
            st[0],
            Extent {
                len: PAGE,
                state: Alloc::Hole
            }
        );
        assert_eq!(
            st[1],
            Extent {
                len: PAGE,
                state: Alloc::Data
            }
        );
    }

    /// The old page-by-page answer, for comparison.
    fn walked(d: &MemDev, off: u64, len: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        MemDev::each_page(off, len, |page, _, n, _| {
            let state = if d.shard(page).read().contains_key(&page) {
                Alloc::Data
            } else {
                Alloc::Hole
            };
            push_extent(
                &mut out,
                Extent {
                    len: n as u64,
                    state,
                },
            );
        });
        out
    }

    #[test]
    fn a_range_wider_than_the_pages_held_is_answered_from_them() {
        let w = WriteFlags::default();
        // As the page walk on a device it can still walk.
        let small = MemDev::new(1 << 30);
        for at in [0, PAGE * 3 + 100, (1 << 29) - 3, (1 << 30) - 10] {
            small.write_at(b"0123456789", at, w).unwrap();
        }
        for (off, len) in [(0, 1 << 30), (77, (1 << 30) - 77), (PAGE * 3 + 1, 1 << 29)] {
            assert!(small.wide(len));
            assert_eq!(
                small.block_status(off, len).unwrap(),
                walked(&small, off, len)
            );
        }
        // The largest device, whole, at once (it used to walk 2^47 pages).
        let d = MemDev::new(MAX_SIZE);
        let spots = [0, PAGE * 3 + 100, 1 << 40, MAX_SIZE - 10];
        for at in spots {
            d.write_at(b"0123456789", at, w).unwrap();
        }
        let st = d.block_status(0, MAX_SIZE).unwrap();
        assert_eq!(st.iter().map(|e| e.len).sum::<u64>(), MAX_SIZE);
        let mut pos = 0;
        let mut data = Vec::new();
        for e in &st {
            if e.state == Alloc::Data {
                data.push((pos, e.len));
            }
            pos += e.len;
        }
        assert_eq!(
            data,
            vec![
                (0, PAGE),
                (PAGE * 3, PAGE),
                (1 << 40, PAGE),
                (MAX_SIZE & !(PAGE - 1), MAX_SIZE % PAGE)
            ]
        );
        // A trim of all but the first 5 bytes frees every whole page and
        // zeroes the rest of the first.
        d.trim(5, MAX_SIZE - 5, w).unwrap();
        assert_eq!(d.allocated_pages(), 1);
        let mut b = [9u8; 10];
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"01234\0\0\0\0\0");
        d.read_at(&mut b, MAX_SIZE - 10).unwrap();
        assert_eq!(b, [0; 10]);
    }
}
