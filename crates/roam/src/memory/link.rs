//! How many chunks a page fault fetches: the faulted one alone, or the
//! others of its aligned group with it, chosen by what a request to the
//! store costs on this link ([`LinkFit`]).

use std::collections::VecDeque;

/// Most chunks one fault fetches.
const MAX_GROUP: usize = 16;
/// Requests to the store a link's fit is made of, and the faults that
/// probe it first (alternately one chunk and [`PROBE_GROUP`]).
const FIT_SAMPLES: usize = 64;
const PROBES: usize = 16;
const PROBE_GROUP: usize = 4;

/// What a request to the store costs, fitted to the demand fetches seen
/// (least squares over the last [`FIT_SAMPLES`]): `latency` per request
/// plus `per_byte` per (decoded) byte. A fault on a link of long latency
/// and high rate (100 Mbit/s, 8 ms: some 700 faults one after another in
/// a resumed guest's first seconds) is cheaper fetching the chunks around
/// the faulted one with it — a resumed guest touches memory in clusters —
/// and on a slow link of short latency dearer: [`LinkFit::group`] fetches
/// about as many as cross the link in two latencies. The first [`PROBES`] faults
/// alternate one chunk and [`PROBE_GROUP`], so the fit has two sizes to
/// go by; the group then moves by at most a factor of two per fault.
pub struct LinkFit {
    samples: VecDeque<(f64, f64)>,
    probes: usize,
    last: usize,
}

impl Default for LinkFit {
    fn default() -> Self {
        LinkFit {
            samples: VecDeque::new(),
            probes: 0,
            last: 1,
        }
    }
}

impl LinkFit {
    /// A request of `bytes` took `secs`.
    pub fn add(&mut self, bytes: usize, secs: f64) {
        if self.samples.len() == FIT_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((bytes as f64, secs));
    }

    /// (latency, seconds per byte), when the samples tell.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let n = self.samples.len() as f64;
        if self.samples.len() < PROBES {
            return None;
        }
        let (sx, sy) = self
            .samples
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let (sxx, sxy) = self.samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
            (a + (x - mx) * (x - mx), b + (x - mx) * (y - my))
        });
        if sxx <= 0.0 {
            return None;
        }
        // No link of ours is faster than 1 GB/s (decoded).
        let per_byte = (sxy / sxx).max(1e-9);
        Some(((my - per_byte * mx).max(0.0), per_byte))
    }

    /// Chunks of `chunk` bytes to fetch for the next fault.
    pub fn group(&mut self, chunk: usize) -> usize {
        if self.probes < PROBES {
            self.probes += 1;
            return if self.probes.is_multiple_of(2) {
                PROBE_GROUP
            } else {
                1
            };
        }
        let Some((latency, per_byte)) = self.fit() else {
            return self.last;
        };
        // Twice what crosses in one latency, to the nearest power of two:
        // measured best at 10 Mbit/s and 100 Mbit/s with 8 ms, and 1 on a
        // link of no latency (BENCHMARKS, "Lazy resume: chunks per fault").
        let want = (2.0 * latency / (per_byte * chunk as f64)).clamp(1.0, MAX_GROUP as f64);
        let want = 1usize << (want.log2().round() as u32);
        self.last = want.clamp((self.last / 2).max(1), self.last * 2);
        tracing::trace!(latency, rate = 1.0 / per_byte, k = self.last, "fault group");
        self.last
    }
}
