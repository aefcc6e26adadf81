//! `throttle[rate=R,latency=D,burst=B]:NEXT` — NEXT behind an emulated
//! network link ([`crate::throttle`]): reads and writes each cross their
//! own direction of a link of `rate` (token bucket of depth `burst`), and
//! every request waits `latency`. For the seeds' bandwidth experiments on
//! one machine; everything else passes through.

use std::sync::Arc;

use crate::dev::{BlockDev, Extent, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::throttle::{Link, LinkSpec};

pub struct ThrottleDev {
    next: Arc<dyn BlockDev>,
    down: Link,
    up: Link,
}

impl ThrottleDev {
    pub fn new(next: Arc<dyn BlockDev>, spec: LinkSpec) -> ThrottleDev {
        ThrottleDev {
            next,
            down: Link::new(spec),
            up: Link::new(spec),
        }
    }
}

impl BlockDev for ThrottleDev {
    crate::layer!("throttle", next);
    fn describe(&self) -> String {
        let s = self.down.spec();
        format!(
            "throttle (rate {} B/s, latency {:?}, burst {} B)",
            s.rate, s.latency, s.burst
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.down.pass(buf.len() as u64);
        self.next.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.up.pass(buf.len() as u64);
        self.next.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        self.up.pass(0);
        self.next.flush()
    }
    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.up.pass(0);
        self.next.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.up.pass(0);
        self.next.write_zeroes(off, len, flags)
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.down.pass(0);
        self.next.block_status(off, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::mem::MemDev;
    use std::time::{Duration, Instant};

    #[test]
    fn reads_take_as_long_as_the_link_says_and_data_passes() {
        let mem = Arc::new(MemDev::new(1 << 20));
        mem.write_at(&[7u8; 4096], 0, WriteFlags::default())
            .unwrap();
        let t = ThrottleDev::new(
            mem,
            LinkSpec {
                rate: 1 << 20,
                latency: Duration::from_millis(5),
                burst: 0,
            },
        );
        let mut buf = vec![0u8; 128 << 10];
        let t0 = Instant::now();
        t.read_at(&mut buf, 0).unwrap();
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(130), "{took:?}");
        assert!(buf[..4096].iter().all(|&b| b == 7) && buf[4096..].iter().all(|&b| b == 0));
    }
}
