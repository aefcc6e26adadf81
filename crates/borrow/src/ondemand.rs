//! [`FetchDev`]: VM state copied in on demand. Each 4 KiB unit is read
//! from the portable medium the first time the guest touches it and
//! written into the borrowed disk (not counted as a guest modification);
//! later accesses go to the borrowed disk only.
//!
//! Fetches and writes to units not yet fetched are serialized by one
//! lock, so a fetch never lands over a guest write and a reader never
//! sees a unit half-way through.

use parking_lot::Mutex;
use std::sync::Arc;

use roamdisk_blockdev::{Alloc, BlockDev, Caps, Extent, Result, WriteFlags, ZeroFlags};

use crate::bits::Bits;
use crate::dev::BorrowDev;
use crate::plan::UNIT;

/// Largest single fetch.
const FETCH_CHUNK: u64 = 1 << 20;

pub struct FetchDev {
    inner: Arc<BorrowDev>,
    source: Arc<dyn BlockDev>,
    fetched: Bits,
    lock: Mutex<()>,
    size: u64,
}

impl FetchDev {
    /// `inner` must be exactly as large as `source`.
    pub fn new(inner: Arc<BorrowDev>, source: Arc<dyn BlockDev>) -> FetchDev {
        let size = source.size();
        FetchDev {
            fetched: Bits::new(size.div_ceil(UNIT)),
            inner,
            source,
            lock: Mutex::new(()),
            size,
        }
    }

    fn units(&self, off: u64, len: u64) -> (u64, u64) {
        (
            off / UNIT,
            (off + len).div_ceil(UNIT).min(self.size.div_ceil(UNIT)),
        )
    }

    fn all_fetched(&self, off: u64, len: u64) -> bool {
        let (a, b) = self.units(off, len);
        !(a..b).any(|u| !self.fetched.get(u))
    }

    /// Fetch the units of `[u0, u1)` not fetched yet, except those `skip`
    /// says will be overwritten whole. Caller holds the lock.
    fn fetch(&self, u0: u64, u1: u64, skip: impl Fn(u64) -> bool) -> Result<()> {
        let mut u = u0;
        while u < u1 {
            if self.fetched.get(u) {
                u += 1;
                continue;
            }
            if skip(u) {
                self.fetched.put_range(u, u + 1, true);
                u += 1;
                continue;
            }
            let mut v = u + 1;
            while v < u1 && !self.fetched.get(v) && !skip(v) && (v - u) * UNIT < FETCH_CHUNK {
                v += 1;
            }
            let off = u * UNIT;
            let end = (v * UNIT).min(self.size);
            let mut buf = vec![0u8; (end - off) as usize];
            self.source.read_at(&mut buf, off)?;
            if buf.iter().any(|&b| b != 0) {
                self.inner.write_unmarked(&buf, off)?;
            }
            self.fetched.put_range(u, v, true);
            u = v;
        }
        Ok(())
    }

    /// Units fetched so far, in bytes.
    pub fn fetched_bytes(&self) -> u64 {
        self.fetched.count() * UNIT
    }

    /// Run a write-like operation on `[off, off + len)`: units it covers
    /// whole need no fetch, partial ones are fetched first.
    fn write_like(&self, off: u64, len: u64, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if len == 0 || self.all_fetched(off, len) {
            return f();
        }
        let _g = self.lock.lock();
        let (a, b) = self.units(off, len);
        let end = off + len;
        let whole = |u: u64| {
            u * UNIT >= off
                && ((u + 1) * UNIT <= end || (u + 1) * UNIT >= self.size && end == self.size)
        };
        self.fetch(a, b, whole)?;
        f()
    }
}

impl BlockDev for FetchDev {
    roamdisk_blockdev::layer!("borrow-fetch");
    fn describe(&self) -> String {
        format!(
            "on-demand copy-in from {} into {}",
            self.source.describe(),
            self.inner.describe()
        )
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        if !self.all_fetched(off, buf.len() as u64) {
            let _g = self.lock.lock();
            let (a, b) = self.units(off, buf.len() as u64);
            self.fetch(a, b, |_| false)?;
        }
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.write_like(off, buf.len() as u64, || {
            self.inner.write_at(buf, off, flags)
        })
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.write_like(off, len, || self.inner.trim(off, len, flags))
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.write_like(off, len, || self.inner.write_zeroes(off, len, flags))
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let (a, b) = self.units(off, len);
        let mut u = a;
        while u < b && self.fetched.get(u) {
            u += 1;
        }
        if u > a {
            return self.inner.block_status(off, len.min(u * UNIT - off));
        }
        // Not fetched yet: whatever the source holds, reported as data.
        let n = len.min(UNIT - off % UNIT);
        Ok(vec![Extent {
            len: n,
            state: Alloc::Data,
        }])
    }
}
