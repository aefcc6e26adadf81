//! Whether requests run inline on the connection's task or on the
//! blocking pool: small ones from how long recent ones took ([`Pace`]),
//! large ones also from how many connections are busy ([`BusyConns`]).

use std::sync::atomic::{AtomicIsize, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One eligible request in this many is measured (a `getrusage` costs
/// about 0.4 µs here, twice per measured request).
const SAMPLE_EVERY: u32 = 4;
/// Eligible requests run inline unless `BLOCKED_MAX` of the last `WINDOW`
/// measured ones blocked: a blocking stack blocks nearly every time, a
/// page cache now and then.
const WINDOW: u32 = 32;
const BLOCKED_MAX: u32 = 8;
/// A request counts as blocked only if it also took longer than this (plus
/// `SLOW_NS_PER_KIB` per KiB): short waits for a lock another connection
/// holds (two writers of one file) are not worth a thread hand-off.
const SLOW_BASE: Duration = Duration::from_micros(200);
const SLOW_NS_PER_KIB: u64 = 1000;

/// Whether inline-eligible requests run inline, from whether recent ones
/// blocked (wherever they ran).
///
/// "Blocked" means the thread running the request gave up its CPU to wait
/// (a voluntary context switch: a disk read, a network fetch, a lock) and
/// the request was slow, which is what stalls the requests behind an inline
/// one. Elapsed time alone cannot tell that from a busy machine, where a
/// request waits for a CPU wherever it runs: with many connections copying
/// at once, timing alone put every large request on the pool and kept it
/// there.
#[derive(Default)]
pub(super) struct Pace {
    /// Bits 0-7: requests measured in this window; 8-15: blocked ones;
    /// 16: offload.
    state: AtomicU32,
    /// Eligible requests seen, for sampling.
    seen: AtomicU32,
}

const PACE_BLOCKED: u32 = 1 << 8;
const PACE_OFFLOAD: u32 = 1 << 16;

/// A measured request's starting point.
pub(super) struct Probe(i64, Instant);

/// Voluntary context switches of the calling thread so far.
fn voluntary_switches() -> i64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is
    // a valid, zeroed `rusage` on this stack.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is valid on Linux.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    if rc == 0 {
        r.ru_nvcsw
    } else {
        0
    }
}

impl Pace {
    pub(super) fn inline(&self) -> bool {
        self.state.load(Ordering::Relaxed) & PACE_OFFLOAD == 0
    }

    /// Call on the thread about to run an eligible request: `Some` when
    /// this one is measured.
    pub(super) fn start(&self) -> Option<Probe> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(SAMPLE_EVERY)
            .then(|| Probe(voluntary_switches(), Instant::now()))
    }

    /// Call on the same thread when the request, of `len` bytes, is done.
    pub(super) fn finish(&self, probe: Option<Probe>, len: u32) {
        if let Some(Probe(before, start)) = probe {
            let limit = SLOW_BASE + Duration::from_nanos(SLOW_NS_PER_KIB * (len as u64 >> 10));
            self.observe(start.elapsed() > limit && voluntary_switches() != before);
        }
    }

    /// Account a measured request that did or did not block.
    fn observe(&self, blocked: bool) {
        let was = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                let seen = (s & 0xff) + 1;
                let blocks = ((s >> 8) & 0xff) + blocked as u32;
                Some(if blocks >= BLOCKED_MAX {
                    PACE_OFFLOAD
                } else if seen >= WINDOW {
                    0
                } else {
                    (s & PACE_OFFLOAD) | (blocks * PACE_BLOCKED) | seen
                })
            })
            .unwrap_or_default();
        if was & PACE_OFFLOAD != self.state.load(Ordering::Relaxed) & PACE_OFFLOAD {
            tracing::debug!(
                inline = self.inline(),
                "requests switch between inline and the blocking pool"
            );
        }
    }
}

/// How many connections have requests in flight, server-wide. When at
/// least as many as there are CPUs, the connections' own threads keep every
/// CPU busy, and handing a large request to the blocking pool only adds a
/// thread switch each way (nbdcopy's 4 connections copy about a quarter
/// faster inline); with fewer, the pool lets one connection copy a
/// request's data on one CPU while it receives or sends the next on
/// another (1 MiB writes on one connection: twice as fast).
pub(crate) struct BusyConns {
    /// Signed: a connection's leave may be counted before its enter when
    /// its reader and writer run on different threads.
    n: AtomicIsize,
    cpus: isize,
}

impl BusyConns {
    pub(crate) fn new() -> BusyConns {
        BusyConns {
            n: AtomicIsize::new(0),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as isize),
        }
    }

    /// Whether large requests run inline too.
    pub(super) fn wide(&self) -> bool {
        self.n.load(Ordering::Relaxed) >= self.cpus
    }

    /// A connection went from no request in flight to one.
    pub(super) fn enter(&self) {
        self.n.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection answered its last request in flight.
    pub(super) fn leave(&self) {
        self.n.fetch_sub(1, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(super) fn count(&self) -> isize {
        self.n.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_offloads_a_blocking_stack_and_comes_back_when_it_does_not_block() {
        let pace = Pace::default();
        // The odd blocked request (a page-cache miss) keeps requests inline.
        for i in 0..WINDOW * 4 {
            pace.observe(i % 16 == 0);
            assert!(pace.inline());
        }
        for _ in 0..BLOCKED_MAX {
            pace.observe(true);
        }
        assert!(!pace.inline());
        for _ in 0..WINDOW {
            pace.observe(false);
        }
        assert!(pace.inline());
    }

    #[test]
    fn sleeping_counts_as_blocking_and_computing_does_not() {
        let pace = Pace::default();
        let sampled = (0..SAMPLE_EVERY)
            .map(|_| pace.start())
            .filter(Option::is_some)
            .count();
        assert_eq!(sampled, 1);
        let before = voluntary_switches();
        let mut x = 0u64;
        for i in 0..100_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        // A busy loop may be preempted (involuntary), never voluntary.
        assert_eq!(voluntary_switches(), before);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(voluntary_switches() > before);
    }
}
