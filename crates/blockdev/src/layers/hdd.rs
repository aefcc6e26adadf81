//! `hdd[seek=T,rpm=R,rate=B,near=N,head=NAME,charge=all|writes,report=FILE]:NEXT`
//! — NEXT behind an
//! emulated spinning disk: one head, so requests are served one at a
//! time in arrival order, each taking a positioning time (an average seek
//! plus half a revolution) unless it starts at or just after where the
//! previous one ended, plus its transfer at the media rate. The data
//! itself goes to NEXT; the layer only makes each request wait until the
//! emulated disk would have finished it.
//!
//! For the TransCom experiments (issue 13): the seed's server keeps its
//! images on one 15,000 rpm disk, and a server cache only matters when a
//! miss costs what a miss on such a disk costs. On this machine a golden
//! image in the page cache answers in microseconds, so without this layer
//! a cache could not win anything. The model is deliberately the one the
//! seed's queueing model assumes (a fixed service demand per miss), so
//! that `roamdisk model mva` can be given the same numbers and its
//! prediction set beside the measurement.
//!
//! Several layers of one process may share one disk (`head=NAME`): a
//! server whose golden image and whose clients' overlays live on the same
//! spindle charges golden reads (under its cache) and overlay writes (over
//! each view, `charge=writes`: the view's reads reach the golden image's
//! layer below and are charged there) to one queue.
//!
//! Not modelled: seek time growing with distance, command queueing
//! (NCQ reordering), a write cache. A flush costs nothing (the emulated
//! disk writes through). Block status says "data" everywhere: a disk has
//! no holes, and NEXT is usually a sparse file standing in for it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::dev::{Alloc, BlockDev, Extent, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::layers::report::{write_report, ReportAt};

/// The emulated disk's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HddSpec {
    /// Average seek time.
    pub seek: Duration,
    /// Spindle speed; half a revolution is added to every positioning.
    pub rpm: u32,
    /// Media transfer rate, bytes per second (0: transfers take no time).
    pub rate: u64,
    /// A request starting less than this many bytes after the end of the
    /// previous one needs no positioning (the drive's read-ahead and
    /// track buffer).
    pub near: u64,
}

impl HddSpec {
    /// The seed's server disk: a 15,000 rpm drive (3.4 ms average seek,
    /// 2 ms rotational latency, 100 MB/s media rate).
    pub const FIFTEEN_K: HddSpec = HddSpec {
        seek: Duration::from_micros(3400),
        rpm: 15_000,
        rate: 100_000_000,
        near: 128 << 10,
    };

    /// Seek plus half a revolution.
    pub fn positioning(&self) -> Duration {
        let half_turn = if self.rpm == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(30.0 / self.rpm as f64)
        };
        self.seek + half_turn
    }

    fn transfer(&self, bytes: u64) -> Duration {
        if self.rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(bytes as f64 / self.rate as f64)
        }
    }
}

/// The head: where it is and when it is free.
struct Head {
    /// End of the last request served (where the head is).
    pos: u64,
    /// When the disk has finished every request accepted so far.
    free_at: Option<Instant>,
}

/// What the emulated disk did, in the report file (JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct HddStats {
    /// Reads and writes served.
    pub requests: u64,
    /// Of those, the ones that needed positioning.
    pub positioned: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Total service time (the disk's busy time), seconds.
    pub busy_seconds: f64,
    /// Total time requests waited for the disk (queueing + service),
    /// seconds.
    pub response_seconds: f64,
}

/// One emulated disk: its head and its counters, shared by every layer
/// naming it.
pub struct Disk {
    spec: HddSpec,
    head: Mutex<Head>,
    requests: AtomicU64,
    positioned: AtomicU64,
    bytes: AtomicU64,
    busy_ns: AtomicU64,
    response_ns: AtomicU64,
}

impl Disk {
    pub fn new(spec: HddSpec) -> Arc<Disk> {
        Arc::new(Disk {
            spec,
            head: Mutex::new(Head {
                pos: 0,
                free_at: None,
            }),
            requests: AtomicU64::new(0),
            positioned: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            response_ns: AtomicU64::new(0),
        })
    }

    /// The disk called `name` in this process, made with `spec` if no
    /// layer holds it now; a different `spec` for a disk in use is an
    /// error (one spindle has one set of parameters).
    pub fn named(name: &str, spec: HddSpec) -> Result<Arc<Disk>> {
        static DISKS: OnceLock<Mutex<HashMap<String, Weak<Disk>>>> = OnceLock::new();
        let mut disks = DISKS.get_or_init(Default::default).lock();
        disks.retain(|_, d| d.strong_count() > 0);
        if let Some(d) = disks.get(name).and_then(Weak::upgrade) {
            if d.spec != spec {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    Op::Open,
                    "hdd",
                    format!(
                        "head '{name}' is already open with other settings ({:?}); give every layer on it the same",
                        d.spec
                    ),
                ));
            }
            return Ok(d);
        }
        let d = Disk::new(spec);
        disks.insert(name.to_string(), Arc::downgrade(&d));
        Ok(d)
    }
}

pub struct HddDev {
    next: Arc<dyn BlockDev>,
    disk: Arc<Disk>,
    /// Reads are charged too (`charge=all`), not only writes.
    charge_reads: bool,
    report: Option<PathBuf>,
}

impl HddDev {
    /// `next` on a disk of its own.
    pub fn new(next: Arc<dyn BlockDev>, spec: HddSpec, report: Option<PathBuf>) -> HddDev {
        HddDev::on(next, Disk::new(spec), true, report)
    }

    /// `next` on `disk`, maybe shared with other layers; reads are
    /// charged only if `charge_reads`.
    pub fn on(
        next: Arc<dyn BlockDev>,
        disk: Arc<Disk>,
        charge_reads: bool,
        report: Option<PathBuf>,
    ) -> HddDev {
        HddDev {
            next,
            disk,
            charge_reads,
            report,
        }
    }

    pub fn spec(&self) -> HddSpec {
        self.disk.spec
    }

    /// Queue a request of `len` bytes at `off` arriving at `now`: the time
    /// it completes on the emulated disk.
    fn schedule(&self, off: u64, len: u64, now: Instant) -> Instant {
        let d = &*self.disk;
        let mut h = d.head.lock();
        let near = off >= h.pos && off - h.pos < d.spec.near;
        let mut service = d.spec.transfer(len);
        if !near {
            service += d.spec.positioning();
            d.positioned.fetch_add(1, Ordering::Relaxed);
        }
        let start = h.free_at.map_or(now, |t| t.max(now));
        let done = start + service;
        h.free_at = Some(done);
        h.pos = off.saturating_add(len);
        drop(h);
        d.requests.fetch_add(1, Ordering::Relaxed);
        d.bytes.fetch_add(len, Ordering::Relaxed);
        d.busy_ns
            .fetch_add(service.as_nanos() as u64, Ordering::Relaxed);
        d.response_ns
            .fetch_add((done - now).as_nanos() as u64, Ordering::Relaxed);
        done
    }

    /// Run `io` as a request of `len` bytes at `off` on the emulated disk:
    /// the data moves at once, the caller returns when the disk would
    /// have finished.
    fn serve<T>(&self, off: u64, len: u64, io: impl FnOnce() -> Result<T>) -> Result<T> {
        let done = self.schedule(off, len, Instant::now());
        let r = io();
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
        r
    }

    /// The disk's counters (of every layer on it).
    pub fn stats(&self) -> HddStats {
        let d = &*self.disk;
        HddStats {
            requests: d.requests.load(Ordering::Relaxed),
            positioned: d.positioned.load(Ordering::Relaxed),
            bytes: d.bytes.load(Ordering::Relaxed),
            busy_seconds: d.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            response_seconds: d.response_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    fn write_report(&self, at: ReportAt) {
        if let Some(path) = &self.report {
            write_report("hdd", path, &self.stats(), at);
        }
    }
}

impl Drop for HddDev {
    fn drop(&mut self) {
        self.write_report(ReportAt::Close);
    }
}

impl BlockDev for HddDev {
    crate::layer!("hdd", next);
    fn describe(&self) -> String {
        let s = self.disk.spec;
        format!(
            "hdd (seek {:?}, {} rpm, {} B/s, near {} B{})",
            s.seek,
            s.rpm,
            s.rate,
            s.near,
            if self.charge_reads {
                ""
            } else {
                ", writes only"
            }
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        if !self.charge_reads {
            return self.next.read_at(buf, off);
        }
        let len = buf.len() as u64;
        self.serve(off, len, || self.next.read_at(buf, off))
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.serve(off, buf.len() as u64, || {
            self.next.write_at(buf, off, flags)
        })
    }
    fn flush(&self) -> Result<()> {
        self.write_report(ReportAt::Flush);
        self.next.flush()
    }
    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.next.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.serve(off, len, || self.next.write_zeroes(off, len, flags))
    }
    /// A disk has no holes: everything is data, so the layers above read
    /// it (and pay for it) instead of skipping what NEXT, a sparse file
    /// standing in for the disk, has never had written.
    fn block_status(&self, _off: u64, len: u64) -> Result<Vec<Extent>> {
        Ok(vec![Extent {
            len,
            state: Alloc::Data,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::mem::MemDev;

    fn spec() -> HddSpec {
        HddSpec {
            seek: Duration::from_millis(3),
            rpm: 15_000,
            rate: 100_000_000,
            near: 128 << 10,
        }
    }

    #[test]
    fn random_requests_queue_behind_one_head_and_sequential_ones_do_not_seek() {
        let d = HddDev::new(Arc::new(MemDev::new(1 << 30)), spec(), None);
        let t0 = Instant::now();
        // Three random 4 KiB reads arriving together: served one after
        // the other, 5 ms + 41 µs each.
        let a = d.schedule(500 << 20, 4096, t0);
        let b = d.schedule(100 << 20, 4096, t0);
        let c = d.schedule(900 << 20, 4096, t0);
        let one = Duration::from_secs_f64(0.005 + 4096.0 / 1e8);
        assert_eq!(a - t0, one);
        assert_eq!(b - t0, one * 2);
        assert_eq!(c - t0, one * 3);
        // Continuing where the last ended (or a little later): transfer only.
        let e = d.schedule((900 << 20) + 4096, 65536, c);
        assert_eq!(e - c, Duration::from_secs_f64(65536.0 / 1e8));
        let f = d.schedule((900 << 20) + 4096 + 65536 + 8192, 4096, e);
        assert_eq!(f - e, Duration::from_secs_f64(4096.0 / 1e8));
        // Backwards is a seek.
        let g = d.schedule(0, 4096, f);
        assert_eq!(g - f, one);
        let s = d.stats();
        assert_eq!((s.requests, s.positioned), (6, 4));
        assert_eq!(s.bytes, 4096 * 5 + 65536);
    }

    #[test]
    fn layers_on_one_head_queue_together_and_writes_only_skips_reads() {
        let disk = Disk::named("test-shared", spec()).unwrap();
        let a = HddDev::on(Arc::new(MemDev::new(1 << 30)), disk.clone(), true, None);
        let b = HddDev::on(Arc::new(MemDev::new(1 << 30)), disk, false, None);
        let t0 = Instant::now();
        let one = Duration::from_secs_f64(0.005 + 4096.0 / 1e8);
        assert_eq!(a.schedule(500 << 20, 4096, t0) - t0, one);
        assert_eq!(b.schedule(100 << 20, 4096, t0) - t0, one * 2);
        assert_eq!(a.stats(), b.stats());
        let mut buf = [0u8; 4096];
        let t1 = Instant::now();
        b.read_at(&mut buf, 0).unwrap();
        assert!(
            t1.elapsed() < Duration::from_millis(4),
            "{:?}",
            t1.elapsed()
        );
        assert_eq!(b.stats().requests, 2);
        // Another spec for a head in use is refused.
        let other = HddSpec {
            rpm: 7200,
            ..spec()
        };
        let e = Disk::named("test-shared", other)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("other settings"), "{e}");
        drop((a, b));
        assert!(Disk::named("test-shared", other).is_ok());
    }

    #[test]
    fn an_idle_disk_starts_at_once_and_data_passes_through() {
        let d = HddDev::new(Arc::new(MemDev::new(1 << 20)), spec(), None);
        d.write_at(&[9u8; 4096], 8192, WriteFlags::default())
            .unwrap();
        let mut buf = [1u8; 4096];
        // Sequential after the write: transfer only, no 5 ms positioning.
        // Each read follows the one before; the fastest of five is taken,
        // so that a thread descheduled on a loaded machine is no failure.
        let fastest = (1..=5)
            .map(|i| {
                let t0 = Instant::now();
                d.read_at(&mut buf, 8192 + 4096 * i).unwrap();
                assert_eq!(buf, [0u8; 4096]);
                t0.elapsed()
            })
            .min()
            .unwrap();
        assert!(fastest < Duration::from_millis(4), "{fastest:?}");
        // Back to the write: a seek.
        let t1 = Instant::now();
        d.read_at(&mut buf, 8192).unwrap();
        assert!(
            t1.elapsed() >= Duration::from_millis(5),
            "{:?}",
            t1.elapsed()
        );
        assert_eq!(buf, [9u8; 4096]);
    }
}
