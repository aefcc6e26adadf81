//! A discrete-event simulator of a closed queueing [`Network`] — the
//! oracle that checks [`crate::mva`].
//!
//! Each of N customers thinks for an exponentially distributed time with
//! the network's mean, then walks the route: at every stage it picks a
//! station by the stage's probabilities and joins that station's FCFS
//! queue, where service takes an exponentially distributed time with the
//! station's mean. When the route ends the request is complete and the
//! customer thinks again. These are exactly MVA's product-form
//! assumptions, so the two must agree up to sampling error. Events are
//! kept in a binary heap; randomness comes from a seeded SplitMix64, so
//! runs are reproducible.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::mva::Network;

/// A small, fast, seeded generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    #[inline]
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with mean `mean`.
    #[inline]
    pub fn exp(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
}

/// How long to run.
#[derive(Clone, Copy, Debug)]
pub struct RunLength {
    /// Completions discarded before measuring.
    pub warmup: u64,
    /// Completions measured.
    pub measured: u64,
}

/// What the simulation measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimResult {
    pub clients: usize,
    pub throughput: f64,
    /// Mean time from the end of thinking to the completion of the route.
    pub response: f64,
    pub utilization: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A customer finishes thinking.
    Think(u32),
    /// A station finishes serving the head of its queue.
    Served(u32),
}

struct State<'a> {
    net: &'a Network,
    rng: SplitMix64,
    now: f64,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    queues: Vec<VecDeque<u32>>,
    busy_since: Vec<f64>,
    busy_total: Vec<f64>,
    stage: Vec<usize>,
    started: Vec<f64>,
}

impl State<'_> {
    fn schedule(&mut self, at: f64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at.to_bits(), self.seq, e)));
    }

    /// Move customer `c` to its next stage (or finish its request);
    /// returns true when the request completed.
    fn advance(&mut self, c: u32) -> bool {
        while self.stage[c as usize] < self.net.route.len() {
            let st = &self.net.route[self.stage[c as usize]];
            self.stage[c as usize] += 1;
            let u = self.rng.unit();
            let mut acc = 0.0;
            let mut pick = None;
            for &(k, p) in &st.choices {
                acc += p;
                if u <= acc {
                    pick = Some(k);
                    break;
                }
            }
            if let Some(k) = pick {
                self.queues[k].push_back(c);
                if self.queues[k].len() == 1 {
                    self.start_service(k);
                }
                return false;
            }
        }
        true
    }

    fn start_service(&mut self, k: usize) {
        self.busy_since[k] = self.now;
        let s = self.rng.exp(self.net.stations[k].service);
        self.schedule(self.now + s, Event::Served(k as u32));
    }
}

/// Measurements over a stretch of simulated time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub completions: u64,
    pub elapsed: f64,
    pub response_sum: f64,
    pub busy: Vec<f64>,
}

impl Batch {
    pub fn throughput(&self) -> f64 {
        self.completions as f64 / self.elapsed
    }
    pub fn response(&self) -> f64 {
        self.response_sum / self.completions as f64
    }
}

/// A running simulation that can be advanced batch by batch (for
/// batch-means confidence intervals).
pub struct Simulation<'a> {
    s: State<'a>,
}

impl<'a> Simulation<'a> {
    /// `clients` customers, all starting to think at time 0.
    pub fn new(net: &'a Network, clients: usize, seed: u64) -> Simulation<'a> {
        let n_st = net.stations.len();
        let mut s = State {
            net,
            rng: SplitMix64(seed),
            now: 0.0,
            heap: BinaryHeap::new(),
            seq: 0,
            queues: vec![VecDeque::new(); n_st],
            busy_since: vec![0.0; n_st],
            busy_total: vec![0.0; n_st],
            stage: vec![0; clients],
            started: vec![0.0; clients],
        };
        for c in 0..clients as u32 {
            let t = s.rng.exp(net.think);
            s.schedule(t, Event::Think(c));
        }
        Simulation { s }
    }

    /// Run until `completions` more requests complete.
    pub fn run(&mut self, completions: u64) -> Batch {
        let s = &mut self.s;
        let t0 = s.now;
        let busy0 = current_busy(s);
        let mut done = 0u64;
        let mut resp_sum = 0.0;
        while done < completions {
            let Reverse((bits, _, e)) = s.heap.pop().expect("customers are always somewhere");
            s.now = f64::from_bits(bits);
            let finished = match e {
                Event::Think(c) => {
                    s.stage[c as usize] = 0;
                    s.started[c as usize] = s.now;
                    s.advance(c).then_some(c)
                }
                Event::Served(k) => {
                    let k = k as usize;
                    let c = s.queues[k]
                        .pop_front()
                        .expect("a served station has a customer");
                    s.busy_total[k] += s.now - s.busy_since[k];
                    if !s.queues[k].is_empty() {
                        s.start_service(k);
                    }
                    s.advance(c).then_some(c)
                }
            };
            if let Some(c) = finished {
                done += 1;
                resp_sum += s.now - s.started[c as usize];
                let t = s.now + s.rng.exp(s.net.think);
                s.schedule(t, Event::Think(c));
            }
        }
        let busy1 = current_busy(s);
        Batch {
            completions,
            elapsed: s.now - t0,
            response_sum: resp_sum,
            busy: busy1.iter().zip(&busy0).map(|(b1, b0)| b1 - b0).collect(),
        }
    }
}

/// Simulate `net` with `clients` customers.
pub fn simulate(net: &Network, clients: usize, len: RunLength, seed: u64) -> SimResult {
    let mut sim = Simulation::new(net, clients, seed);
    if len.warmup > 0 {
        sim.run(len.warmup);
    }
    let b = sim.run(len.measured.max(1));
    SimResult {
        clients,
        throughput: b.throughput(),
        response: b.response(),
        utilization: b.busy.iter().map(|x| x / b.elapsed).collect(),
    }
}

/// A simulation estimate with its precision.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Estimate {
    pub clients: usize,
    pub throughput: f64,
    pub response: f64,
    pub utilization: Vec<f64>,
    pub completions: u64,
    /// Relative half-widths of the 99% batch-means confidence intervals.
    pub throughput_half_width: f64,
    pub response_half_width: f64,
}

/// Simulate in batches of 10 000 completions (after 2 000 of warm-up)
/// until the 99% batch-means confidence intervals of throughput and
/// response time are within ±`half_width` (relative), with at least ten
/// batches and at most `max_completions`.
pub fn estimate(
    net: &Network,
    clients: usize,
    half_width: f64,
    max_completions: u64,
    seed: u64,
) -> Estimate {
    const BATCH: u64 = 10_000;
    const MIN_BATCHES: usize = 10;
    let mut sim = Simulation::new(net, clients, seed);
    sim.run(2_000);
    let mut batches: Vec<Batch> = Vec::new();
    loop {
        batches.push(sim.run(BATCH));
        if batches.len() < MIN_BATCHES {
            continue;
        }
        let mut total = Batch {
            busy: vec![0.0; net.stations.len()],
            ..Batch::default()
        };
        for b in &batches {
            total.completions += b.completions;
            total.elapsed += b.elapsed;
            total.response_sum += b.response_sum;
            for (a, x) in total.busy.iter_mut().zip(&b.busy) {
                *a += x;
            }
        }
        let (x, r) = (total.throughput(), total.response());
        let rel_half_width = |vals: &mut dyn Iterator<Item = f64>, mean: f64| {
            let v: Vec<f64> = vals.collect();
            let k = v.len() as f64;
            let var = v.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / (k - 1.0);
            2.6 * (var / k).sqrt() / mean
        };
        let hx = rel_half_width(&mut batches.iter().map(|b| b.throughput()), x);
        let hr = rel_half_width(&mut batches.iter().map(|b| b.response()), r);
        if (hx < half_width && hr < half_width) || total.completions >= max_completions {
            return Estimate {
                clients,
                throughput: x,
                response: r,
                utilization: total.busy.iter().map(|b| b / total.elapsed).collect(),
                completions: total.completions,
                throughput_half_width: hx,
                response_half_width: hr,
            };
        }
    }
}

/// Busy time so far including services in progress.
fn current_busy(s: &State) -> Vec<f64> {
    (0..s.queues.len())
        .map(|k| {
            s.busy_total[k]
                + if s.queues[k].is_empty() {
                    0.0
                } else {
                    s.now - s.busy_since[k]
                }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_sampler_has_the_right_mean() {
        let mut r = SplitMix64(7);
        let n = 200_000;
        let m: f64 = (0..n).map(|_| r.exp(2.0)).sum::<f64>() / n as f64;
        assert!((m - 2.0).abs() < 0.02, "{m}");
    }
}
