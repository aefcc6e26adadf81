//! `throttle[rate=R,latency=D,burst=B,link=NAME,report=FILE]:NEXT` —
//! NEXT behind an emulated network link ([`crate::throttle`]): reads and
//! writes each cross their own direction of a link of `rate` (token bucket
//! of depth `burst`), and every request waits `latency`. For the seeds'
//! bandwidth experiments on one machine; everything else passes through.
//!
//! Data crosses the link when it would on a network: a write's bytes
//! before NEXT gets them, a read's after NEXT has answered (the reply
//! comes back over the link). On a link shared by many clients the order
//! matters: a read's request reaches the server at once and its disk
//! works while earlier replies still queue at the server's port, instead
//! of the disk waiting for the port.
//!
//! With `link=NAME` every throttle layer of the process naming the same
//! link shares it ([`Duplex::named`]): one token bucket per direction for
//! all of them, as the clients of a server share its port. `report=FILE`
//! writes the link's counters (of every layer on it) as JSON at each
//! flush and at close.

use std::path::PathBuf;
use std::sync::Arc;

use crate::dev::{BlockDev, Extent, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::layers::report::{write_report, ReportAt};
use crate::throttle::{Duplex, DuplexStats, LinkSpec};

pub struct ThrottleDev {
    next: Arc<dyn BlockDev>,
    link: Arc<Duplex>,
    report: Option<PathBuf>,
}

impl ThrottleDev {
    /// `next` behind a link of its own.
    pub fn new(next: Arc<dyn BlockDev>, spec: LinkSpec) -> ThrottleDev {
        ThrottleDev::on(next, Duplex::new(spec), None)
    }

    /// `next` behind `link`, maybe shared with other layers.
    pub fn on(next: Arc<dyn BlockDev>, link: Arc<Duplex>, report: Option<PathBuf>) -> ThrottleDev {
        ThrottleDev { next, link, report }
    }

    /// The link's counters (of every layer on it).
    pub fn stats(&self) -> DuplexStats {
        self.link.stats()
    }

    fn write_report(&self, at: ReportAt) {
        if let Some(path) = &self.report {
            write_report("throttle", path, &self.stats(), at);
        }
    }
}

impl Drop for ThrottleDev {
    fn drop(&mut self) {
        self.write_report(ReportAt::Close);
    }
}

impl BlockDev for ThrottleDev {
    crate::layer!("throttle", next);
    fn describe(&self) -> String {
        let s = self.link.spec();
        format!(
            "throttle (rate {} B/s, latency {:?}, burst {} B)",
            s.rate, s.latency, s.burst
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let r = self.next.read_at(buf, off);
        self.link.down.pass(buf.len() as u64);
        r
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.link.up.pass(buf.len() as u64);
        self.next.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        self.link.up.pass(0);
        self.write_report(ReportAt::Flush);
        self.next.flush()
    }
    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.link.up.pass(0);
        self.next.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.link.up.pass(0);
        self.next.write_zeroes(off, len, flags)
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let r = self.next.block_status(off, len);
        self.link.down.pass(0);
        r
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

    /// NEXT below, seeing what the link had carried when a request
    /// reached it.
    struct Probe {
        mem: Arc<MemDev>,
        link: Arc<Duplex>,
        seen: parking_lot::Mutex<Vec<(&'static str, u64)>>,
    }

    impl BlockDev for Probe {
        crate::layer!("probe", mem);
        fn size(&self) -> u64 {
            self.mem.size()
        }
        fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
            let n = self.link.down.stats().requests;
            self.seen.lock().push(("read", n));
            self.mem.read_at(buf, off)
        }
        fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
            let n = self.link.up.stats().requests;
            self.seen.lock().push(("write", n));
            self.mem.write_at(buf, off, flags)
        }
    }

    #[test]
    fn writes_cross_before_next_and_reads_after_it() {
        let link = Duplex::new(LinkSpec {
            rate: 1 << 30,
            latency: Duration::ZERO,
            burst: 0,
        });
        let probe = Arc::new(Probe {
            mem: Arc::new(MemDev::new(1 << 20)),
            link: link.clone(),
            seen: Default::default(),
        });
        let t = ThrottleDev::on(probe.clone(), link.clone(), None);
        t.write_at(&[1u8; 4096], 0, WriteFlags::default()).unwrap();
        t.read_at(&mut [0u8; 4096], 0).unwrap();
        assert_eq!(*probe.seen.lock(), [("write", 1), ("read", 0)]);
        assert_eq!(link.stats().down.requests, 1);
    }

    /// Two stacks on one named link (`link=NAME`, through the registry)
    /// share its rate; a third on another name does not; the report is
    /// the shared link's.
    #[test]
    fn layers_naming_one_link_share_its_rate_and_report_it() {
        let (d, report) = crate::testkit::scratch("link.json");
        let r = crate::spec::Registry::with_builtin();
        let open = |s: &str| r.build(s, crate::dev::Access::ReadWrite).unwrap();
        let a = open(&format!(
            "throttle[rate=1M,burst=0,link=test-layers,report={}]:mem:1M",
            report.display()
        ));
        let b = open("throttle[rate=1M,burst=0,link=test-layers]:mem:1M");
        let c = open("throttle[rate=1M,burst=0,link=test-layers-other]:mem:1M");
        let mut buf = vec![0u8; 100 << 10];
        // Alone: 100 KiB at 1 MiB/s is about 98 ms.
        let t0 = Instant::now();
        c.read_at(&mut buf, 0).unwrap();
        let alone = t0.elapsed();
        // a and b at once on one link: the second waits for the first.
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| a.read_at(&mut vec![0u8; 100 << 10], 0).unwrap());
            s.spawn(|| b.read_at(&mut vec![0u8; 100 << 10], 0).unwrap());
        });
        let shared = t0.elapsed();
        assert!(alone >= Duration::from_millis(95), "{alone:?}");
        assert!(shared >= Duration::from_millis(190), "{shared:?}");
        a.flush().unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(j["rate"], 1 << 20);
        assert_eq!(j["down"]["bytes"], 2 * (100 << 10));
        assert_eq!(j["down"]["requests"], 2);
        assert_eq!(j["up"]["requests"], 1, "the flush");
        // Another rate on a link in use is refused.
        let e = r
            .build(
                "throttle[rate=2M,link=test-layers]:mem:1M",
                crate::dev::Access::ReadWrite,
            )
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("link 'test-layers' is already open"), "{e}");
        for bad in ["link=", "link=a/b", "report="] {
            let e = r
                .build(
                    &format!("throttle[rate=1M,{bad}]:mem:1M"),
                    crate::dev::Access::ReadWrite,
                )
                .err()
                .expect("refused")
                .to_string();
            assert!(
                e.contains("e.g.") || e.contains("give a file name"),
                "{bad}: {e}"
            );
        }
        drop(d);
    }
}
