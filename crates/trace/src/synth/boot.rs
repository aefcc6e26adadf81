//! A boot storm: many clients booting one shared image, as in TransCom's
//! 50-client boot experiment (seed section 6.2). The seed publishes no
//! statistics of its boot trace, so the shape is ours and documented
//! (`docs/formats/trace.md`); the tests hold the generator to it:
//!
//! - 90% of requests are reads; 15% of the reads go to a shared 8 MiB hot
//!   set (registry hives, boot drivers) at random; the other reads come in
//!   sequential runs, so that 75% of all reads are sequential;
//! - every client follows the same boot script (so the clients share
//!   almost their whole working set), with neighbouring steps swapped at
//!   random, its own hot-set positions, its own speed (0.8-1.25×) and a
//!   start staggered over a few seconds;
//! - writes (10%) come in short bursts at the same offsets for every client
//!   (each client writes its own copy-on-write view), half of the bursts
//!   followed by a flush.

use std::sync::Arc;

use rand::RngExt;

use super::stream::split;
use crate::format::{Record, TraceOp};

/// Clients when none is given.
pub const DEFAULT_CLIENTS: u32 = 50;
/// Requests per client when none is given.
pub const DEFAULT_REQUESTS: u64 = 4000;

/// The shape of a boot trace.
#[derive(Debug, Clone)]
pub struct BootParams {
    pub clients: u32,
    /// Requests (reads and writes) per client.
    pub requests: u64,
    pub image_bytes: u64,
    pub hot_bytes: u64,
    /// Reads per request.
    pub read_share: f64,
    /// Hot-set reads per read.
    pub hot_share: f64,
    /// Sequential reads per read.
    pub sequential_share: f64,
    /// Duration of one client's boot at speed 1.
    pub duration_s: f64,
    /// Client starts spread uniformly over this many seconds.
    pub stagger_s: f64,
    /// Probability that a write burst ends with a flush.
    pub flush_share: f64,
}

impl Default for BootParams {
    fn default() -> Self {
        BootParams {
            clients: DEFAULT_CLIENTS,
            requests: DEFAULT_REQUESTS,
            image_bytes: 8 << 30,
            hot_bytes: 8 << 20,
            read_share: 0.9,
            hot_share: 0.15,
            sequential_share: 0.75,
            duration_s: 40.0,
            stagger_s: 5.0,
            flush_share: 0.5,
        }
    }
}

/// Read sizes of boot runs and their probabilities.
const READ_SIZES: &[(u32, f64)] = &[
    (4096, 0.2),
    (8192, 0.1),
    (16384, 0.15),
    (32768, 0.2),
    (65536, 0.35),
];
const WRITE_SIZES: &[(u32, f64)] = &[(4096, 0.6), (8192, 0.2), (16384, 0.1), (65536, 0.1)];

fn pick(table: &[(u32, f64)], rng: &mut impl rand::Rng) -> u32 {
    let mut x = rng.random::<f64>();
    for &(s, p) in table {
        if x < p {
            return s;
        }
        x -= p;
    }
    table[table.len() - 1].0
}

/// One step of the boot script.
#[derive(Debug, Clone)]
enum Step {
    /// Sequential reads from `start`.
    Run { start: u64, sizes: Vec<u32> },
    /// Reads at random places of the hot set (chosen per client).
    Hot { count: u32 },
    /// Sequential writes from `start`, then maybe a flush.
    Writes {
        start: u64,
        sizes: Vec<u32>,
        flush: bool,
    },
}

impl Step {
    fn requests(&self) -> u64 {
        match self {
            Step::Run { sizes, .. } | Step::Writes { sizes, .. } => sizes.len() as u64,
            Step::Hot { count } => *count as u64,
        }
    }
}

fn script(p: &BootParams, rng: &mut impl rand::Rng) -> Vec<Step> {
    let n = p.requests;
    let reads = (p.read_share * n as f64).round() as u64;
    let writes = n - reads;
    let hot = (p.hot_share * reads as f64).round() as u64;
    let seq_reads = reads - hot;
    // Each run start is a skip; the rest of a run is sequential.
    let want_seq = (p.sequential_share * reads as f64).round() as u64;
    let runs = seq_reads.saturating_sub(want_seq).max(1);
    let sys_start = p.hot_bytes;
    let sys_end = p.image_bytes * 3 / 4;
    let mut steps = Vec::new();
    for len in split(seq_reads, runs, rng) {
        let sizes: Vec<u32> = (0..len).map(|_| pick(READ_SIZES, rng)).collect();
        let bytes: u64 = sizes.iter().map(|&s| s as u64).sum();
        let span = (sys_end - sys_start - bytes) / 65536;
        let start = sys_start + rng.random_range(0..span) * 65536;
        steps.push(Step::Run { start, sizes });
    }
    for count in split(hot, hot.div_ceil(3), rng) {
        steps.push(Step::Hot {
            count: count as u32,
        });
    }
    for len in split(writes, writes.div_ceil(4), rng) {
        let sizes: Vec<u32> = (0..len).map(|_| pick(WRITE_SIZES, rng)).collect();
        let span = (p.image_bytes - sys_end - (4 << 20)) / 4096;
        let start = sys_end + rng.random_range(0..span) * 4096;
        steps.push(Step::Writes {
            start,
            sizes,
            flush: rng.random_bool(p.flush_share),
        });
    }
    rand::seq::SliceRandom::shuffle(steps.as_mut_slice(), rng);
    steps
}

/// One client's boot.
struct Client {
    script: Arc<Vec<Step>>,
    order: Vec<usize>,
    step: usize,
    within: usize,
    client: u32,
    rng: rand::rngs::Xoshiro256PlusPlus,
    start_ns: f64,
    ns_per_request: f64,
    issued: u64,
    hot_bytes: u64,
    pending_flush: bool,
    last_read_end: Option<u64>,
}

impl Iterator for Client {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        let time_ns = (self.start_ns + self.issued as f64 * self.ns_per_request) as u64;
        let mk = |op, offset, len| super::stream::request(time_ns, self.client, op, offset, len);
        if self.pending_flush {
            self.pending_flush = false;
            return Some(mk(TraceOp::Flush, 0, 0));
        }
        let script = Arc::clone(&self.script);
        let step = loop {
            let s = &script[*self.order.get(self.step)?];
            if self.within < s.requests() as usize {
                break s;
            }
            self.step += 1;
            self.within = 0;
        };
        let i = self.within;
        self.within += 1;
        self.issued += 1;
        let last = self.within == step.requests() as usize;
        Some(match step {
            Step::Run { start, sizes } => {
                let off = start + sizes[..i].iter().map(|&s| s as u64).sum::<u64>();
                self.last_read_end = Some(off + sizes[i] as u64);
                mk(TraceOp::Read, off, sizes[i])
            }
            Step::Hot { .. } => {
                let len = 4096 * self.rng.random_range(1..=4u32);
                let mut off;
                loop {
                    off = self
                        .rng
                        .random_range(0..(self.hot_bytes - len as u64) / 4096)
                        * 4096;
                    if Some(off) != self.last_read_end {
                        break;
                    }
                }
                self.last_read_end = Some(off + len as u64);
                mk(TraceOp::Read, off, len)
            }
            Step::Writes {
                start,
                sizes,
                flush,
            } => {
                let off = start + sizes[..i].iter().map(|&s| s as u64).sum::<u64>();
                self.pending_flush = last && *flush;
                mk(TraceOp::Write, off, sizes[i])
            }
        })
    }
}

/// The boot storm of all clients, merged in time order.
pub struct Generator {
    merged: super::stream::Merge,
}

impl Generator {
    pub fn new(p: &BootParams, seed: u64) -> Self {
        let mut rng = super::stream::rng(seed);
        let script = Arc::new(script(p, &mut rng));
        let clients = (0..p.clients)
            .map(|c| {
                let mut crng = super::stream::rng(super::stream::mix_seed(seed, c as u64 + 1));
                let mut order: Vec<usize> = (0..script.len()).collect();
                let mut i = 0;
                while i + 1 < order.len() {
                    if crng.random_bool(0.1) {
                        order.swap(i, i + 1);
                        i += 2;
                    } else {
                        i += 1;
                    }
                }
                let speed = crng.random_range(0.8..1.25);
                let start_ns = crng.random_range(0.0..=p.stagger_s) * 1e9;
                Box::new(Client {
                    script: Arc::clone(&script),
                    order,
                    step: 0,
                    within: 0,
                    client: c,
                    ns_per_request: p.duration_s * 1e9 * speed / p.requests as f64,
                    rng: crng,
                    start_ns,
                    issued: 0,
                    hot_bytes: p.hot_bytes,
                    pending_flush: false,
                    last_read_end: None,
                }) as super::stream::RecordStream
            })
            .collect();
        Generator {
            merged: super::stream::Merge::new(clients),
        }
    }
}

impl Iterator for Generator {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        self.merged.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StatsOptions;
    use crate::testkit::{stats_of, within};
    use std::collections::HashSet;

    #[test]
    fn boot_storm_has_its_documented_shape() {
        let p = BootParams::default();
        let recs: Vec<Record> = Generator::new(&p, 5).collect();
        let s = stats_of(recs.iter().copied(), StatsOptions::default());
        assert_eq!(s.clients.len(), p.clients as usize);
        let mut bad = Vec::new();
        for (c, g) in &s.clients {
            assert_eq!(g.rw_count(), p.requests, "client {c}");
            let read_share = g.read.count as f64 / g.rw_count() as f64;
            let seq = g.read.sequential as f64 / g.read.count as f64;
            if !within(read_share, p.read_share) || !within(seq, p.sequential_share) {
                bad.push(format!(
                    "client {c}: reads {read_share:.3}, sequential {seq:.3}"
                ));
            }
        }
        let reads: Vec<&Record> = recs.iter().filter(|r| r.op == TraceOp::Read).collect();
        let hot =
            reads.iter().filter(|r| r.end() <= p.hot_bytes).count() as f64 / reads.len() as f64;
        if !within(hot, p.hot_share) {
            bad.push(format!("hot share {hot:.3}"));
        }
        // Clients share their working set: the union is little more than
        // one client's.
        let blocks = |c: u32| -> HashSet<u64> {
            recs.iter()
                .filter(|r| r.client == c && r.op == TraceOp::Read)
                .flat_map(|r| r.offset / 4096..r.end().div_ceil(4096))
                .collect()
        };
        let one = blocks(0).len() as f64;
        let union = s.partitions[&0].read.working_set_blocks as f64;
        if union > 1.1 * one {
            bad.push(format!("union working set {union} vs one client {one}"));
        }
        assert!(s.total.flushes > 0);
        assert!(recs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
