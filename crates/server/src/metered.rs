//! The metering layer on top of each client's export device (its view, or
//! its read-only grant): counts each request, its bytes and its time into
//! the client's [`Pair`] of counters, so that a read-only image many
//! clients share is still counted per client. Relaxed atomics and two
//! clock reads per request; everything else passes through.

use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::{BlockDev, ErrorKind, Extent, Result, WriteFlags, ZeroFlags};

use crate::metrics::{OpKind, Pair, READ_ONLY_WRITE};

/// `next`, counted into `pair`.
pub struct Metered {
    next: Arc<dyn BlockDev>,
    pair: Arc<Pair>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Metered {
    pub fn new(
        next: Arc<dyn BlockDev>,
        pair: Arc<Pair>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Metered {
        Metered {
            next,
            pair,
            metrics,
        }
    }

    #[inline]
    fn count<T>(&self, k: OpKind, bytes: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t0 = Instant::now();
        let r = f();
        let nanos = t0.elapsed().as_nanos() as u64;
        self.pair.op(k).record(bytes, nanos, r.is_ok());
        if let Err(e) = &r {
            if e.kind() == ErrorKind::ReadOnly {
                self.metrics.refused(READ_ONLY_WRITE);
            }
        }
        r
    }
}

impl BlockDev for Metered {
    roamdisk_blockdev::layer!("metered", next);
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let n = buf.len() as u64;
        self.count(OpKind::Read, n, || self.next.read_at(buf, off))
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.count(OpKind::Write, buf.len() as u64, || {
            self.next.write_at(buf, off, flags)
        })
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.count(OpKind::WriteZeroes, len, || {
            self.next.write_zeroes(off, len, flags)
        })
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.count(OpKind::Trim, len, || self.next.trim(off, len, flags))
    }
    fn flush(&self) -> Result<()> {
        self.count(OpKind::Flush, 0, || self.next.flush())
    }
    // Not a client's request (a disconnect without FLUSH): passed on
    // uncounted; the default would call `flush` and count one.
    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.count(OpKind::BlockStatus, 0, || self.next.block_status(off, len))
    }
}
