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

/// A sparse RAM disk.
pub struct MemDev {
    size: u64,
    shards: Vec<Shard>,
}

impl MemDev {
    /// A zero-filled device of `size` bytes using no memory until written.
    pub fn new(size: u64) -> Self {
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

    fn zero(&self, off: u64, len: u64) {
        Self::each_page(off, len, |page, in_page, n, _| {
            let mut shard = self.shard(page).write();
            if n == PAGE as usize {
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
}
