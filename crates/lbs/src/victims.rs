//! The collector's victim choice kept up to date as clusters change, so
//! choosing costs the same on a 64 GiB image as on a 1 GiB one.
//!
//! [`crate::gc::pick_victim`] scores every cluster at every choice: one
//! pass over 16k clusters per victim on a 16 GiB image, and the streams'
//! lifetimes ([`crate::gc::stream_lifetimes`]) another. Here the same
//! choice comes from an index updated at each change of a cluster (a
//! client's write or trim releasing a block, a cluster activated, retired
//! or freed): the candidates sit in buckets by (stream, live blocks), each
//! ordered by the part of the score that depends on the neighbours (LEFT
//! EMPTY and OUTLIER CORRECTION; highest first, then lowest index), and the
//! streams' lifetimes are kept as running sums. Within a stream EMPTINESS
//! (cost-benefit or plain) only grows as live blocks fall, so the best
//! candidate is the head of one of `STREAMS × blocks per cluster` buckets
//! (the cluster after the write position, whose WRITE POSITION term no
//! bucket holds, is scored apart). The result is the full scan's, up to
//! rounding: the unit tests and, in debug builds, every choice on images
//! of up to [`CHECKED_CLUSTERS`] clusters compare the two.

use std::collections::BTreeSet;

use crate::gc::{cost_benefit, decay, emptiness_of, ClusterState, GcPolicy, STREAMS};

/// Debug builds check every choice against the full scan on images of at
/// most this many clusters (the tests' images).
pub const CHECKED_CLUSTERS: usize = 8192;

/// Memory the index takes per cluster: its candidate and lifetime share,
/// its emptiness flag and about 24 bytes in a bucket (a B-tree entry of
/// 16 bytes in nodes two thirds full).
pub const BYTES_PER_CLUSTER: usize =
    std::mem::size_of::<Option<Candidate>>() + std::mem::size_of::<Option<Share>>() + 1 + 24;

/// Fixed-point scale of the decay sums (exact to add and take away, so
/// the running sums never drift from a fresh pass).
const DECAY_ONE: f64 = (1u64 << 32) as f64;

/// The cluster tables the index follows, borrowed from the image's state.
#[derive(Clone, Copy)]
pub struct ClusterView<'a> {
    pub states: &'a [ClusterState],
    pub live: &'a [u32],
    /// The stream that last wrote each cluster.
    pub stream: &'a [u8],
    /// When each cluster was activated, on the activation clock.
    pub activated: &'a [u64],
    /// Blocks written into each cluster since it was activated.
    pub written: &'a [u32],
}

/// A candidate's place: its bucket and its neighbours' bonus.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    stream: u8,
    live: u32,
    /// `left_empty · w_l + outlier · w_o` at the policy's base weights.
    bonus: f64,
}

/// A `Used` cluster's part of its stream's lifetime estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    stream: u8,
    activated: u64,
    decay: i64,
}

/// The victim index of one image.
pub struct VictimIndex {
    bpc: u64,
    weights: crate::gc::Weights,
    candidate: Vec<Option<Candidate>>,
    /// `STREAMS × bpc` buckets, by (stream, live): (descending bonus key,
    /// cluster).
    buckets: Vec<BTreeSet<(u64, u32)>>,
    share: Vec<Option<Share>>,
    used: [u64; STREAMS],
    activated_sum: [u128; STREAMS],
    decay_sum: [i64; STREAMS],
    /// Clusters `Free` or `PendingFree`.
    empty: Vec<bool>,
    empties: u64,
}

/// A key that sorts `b` from highest to lowest (any f64, NaN last).
fn descending(b: f64) -> u64 {
    let bits = b.to_bits();
    let ascending = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    !ascending
}

impl VictimIndex {
    /// The index of clusters as they are in `v`.
    pub fn new(v: &ClusterView<'_>, bpc: u64, policy: &GcPolicy) -> VictimIndex {
        let n = v.states.len();
        let mut x = VictimIndex {
            bpc,
            weights: policy.weights,
            candidate: vec![None; n],
            buckets: (0..STREAMS * bpc as usize)
                .map(|_| BTreeSet::new())
                .collect(),
            share: vec![None; n],
            used: [0; STREAMS],
            activated_sum: [0; STREAMS],
            decay_sum: [0; STREAMS],
            empty: vec![false; n],
            empties: 0,
        };
        for c in 0..n {
            x.own(c, v);
        }
        for c in 0..n {
            x.place(c, v);
        }
        x
    }

    /// Cluster `c` changed (its state, live or written count, stream or
    /// activation): update it and the neighbours whose score it enters.
    pub fn refresh(&mut self, c: usize, v: &ClusterView<'_>) {
        self.own(c, v);
        let hi = (c + 2).min(v.states.len() - 1);
        for k in c.saturating_sub(2)..=hi {
            self.place(k, v);
        }
    }

    /// Update what depends on `c` alone: its emptiness and lifetime share.
    fn own(&mut self, c: usize, v: &ClusterView<'_>) {
        let empty = matches!(v.states[c], ClusterState::Free | ClusterState::PendingFree);
        if empty != self.empty[c] {
            self.empty[c] = empty;
            if empty {
                self.empties += 1;
            } else {
                self.empties -= 1;
            }
        }
        let share = (v.states[c] == ClusterState::Used).then(|| Share {
            stream: v.stream[c],
            activated: v.activated[c],
            decay: (decay(v.written[c], v.live[c]) * DECAY_ONE).round() as i64,
        });
        if share == self.share[c] {
            return;
        }
        if let Some(o) = self.share[c] {
            let s = o.stream as usize;
            self.used[s] -= 1;
            self.activated_sum[s] -= o.activated as u128;
            self.decay_sum[s] -= o.decay;
        }
        if let Some(o) = share {
            let s = o.stream as usize;
            self.used[s] += 1;
            self.activated_sum[s] += o.activated as u128;
            self.decay_sum[s] += o.decay;
        }
        self.share[c] = share;
    }

    /// Put `c` in the bucket it belongs in now (or none).
    fn place(&mut self, c: usize, v: &ClusterView<'_>) {
        let now = (v.states[c] == ClusterState::Used && (v.live[c] as u64) < self.bpc).then(|| {
            let t = crate::gc::terms(c, v.states, v.live, self.bpc, None);
            Candidate {
                stream: v.stream[c],
                live: v.live[c],
                bonus: self.weights.left_empty * t.left_empty + self.weights.outlier * t.outlier,
            }
        });
        let was = self.candidate[c];
        if now == was {
            return;
        }
        if let Some(o) = was {
            let b = self.bucket(o.stream, o.live);
            self.buckets[b].remove(&(descending(o.bonus), c as u32));
        }
        if let Some(o) = now {
            let b = self.bucket(o.stream, o.live);
            self.buckets[b].insert((descending(o.bonus), c as u32));
        }
        self.candidate[c] = now;
    }

    fn bucket(&self, stream: u8, live: u32) -> usize {
        stream as usize * self.bpc as usize + live as usize
    }

    /// Each stream's data lifetime as [`crate::gc::stream_lifetimes`]
    /// gives it, at activation `clock`.
    pub fn lifetimes(&self, clock: u64) -> [f64; STREAMS] {
        std::array::from_fn(|s| {
            let ages = self.used[s] as u128 * (clock as u128 + 1) - self.activated_sum[s];
            let den = self.decay_sum[s] as f64 / DECAY_ONE;
            ages as f64 / den.max(1e-3)
        })
    }

    /// The victim [`crate::gc::pick_victim`] would choose: `active` is the
    /// hot stream's active cluster (the write position), `clock` the
    /// activation clock.
    pub fn pick(&self, active: Option<usize>, clock: u64, policy: &GcPolicy) -> Option<usize> {
        let n = self.empty.len();
        let bpc = self.bpc as usize;
        let w = policy.weights;
        let damp = match policy.emptiness_dominates_below {
            Some(th) if (self.empties as f64) < th * n as f64 => 0.1,
            _ => 1.0,
        };
        let lifetimes = self.lifetimes(clock);
        let head = |s: usize, l: usize| self.buckets[s * bpc + l].first();
        let emptiest = |s: usize| (0..bpc).find(|&l| head(s, l).is_some());
        // Cost-benefit is scaled to 0..1 by the best candidate's.
        let top = if policy.cost_benefit {
            (0..STREAMS)
                .filter_map(|s| emptiest(s).map(|l| cost_benefit(l as u32, self.bpc, lifetimes[s])))
                .filter(|x| x.is_finite())
                .fold(0.0f64, f64::max)
        } else {
            0.0
        };
        let e = |s: usize, l: u32| {
            if top > 0.0 {
                (cost_benefit(l, self.bpc, lifetimes[s]) / top).min(1.0)
            } else {
                emptiness_of(ClusterState::Used, l, self.bpc)
            }
        };
        let most = damp * (w.left_empty.max(0.0) + w.outlier.max(0.0));
        let mut best: Option<(f64, usize)> = None;
        // Ties go to the lowest index, as in the full scan.
        let consider = |best: &mut Option<(f64, usize)>, score: f64, c: usize| {
            if best.is_none_or(|(b, bc)| score > b || (score == b && c < bc)) {
                *best = Some((score, c));
            }
        };
        for s in 0..STREAMS {
            for l in 0..bpc {
                let Some(&(_, c)) = head(s, l) else { continue };
                let c = c as usize;
                let ec = e(s, l as u32);
                if best.is_some_and(|(b, _)| w.emptiness * ec + most < b) {
                    // EMPTINESS only falls from here on in this stream.
                    break;
                }
                let bonus = self.candidate[c].map_or(0.0, |k| k.bonus);
                consider(&mut best, w.emptiness * ec + damp * bonus, c);
            }
        }
        // The cluster after the write position gains WRITE POSITION.
        if let Some(a) = active {
            let c = (a + 1) % n;
            if let Some(k) = self.candidate[c] {
                let ec = e(k.stream as usize, k.live);
                consider(
                    &mut best,
                    w.emptiness * ec + damp * (k.bonus + w.write_position),
                    c,
                );
            }
        }
        best.map(|(_, c)| c)
    }
}

/// A cluster's score as [`crate::gc::pick_victim`] computes it (for the
/// checks against the full scan).
pub fn full_scan_score(
    c: usize,
    v: &ClusterView<'_>,
    lifetimes: &[f64],
    bpc: u64,
    active: Option<usize>,
    policy: &GcPolicy,
) -> f64 {
    let free = v
        .states
        .iter()
        .filter(|s| matches!(s, ClusterState::Free | ClusterState::PendingFree))
        .count();
    let mut w = policy.weights;
    if let Some(th) = policy.emptiness_dominates_below {
        if (free as f64) < th * v.states.len() as f64 {
            w.left_empty *= 0.1;
            w.outlier *= 0.1;
            w.write_position *= 0.1;
        }
    }
    let candidate = |c: usize| v.states[c] == ClusterState::Used && (v.live[c] as u64) < bpc;
    let top = if policy.cost_benefit {
        (0..v.states.len())
            .filter(|&k| candidate(k))
            .map(|k| cost_benefit(v.live[k], bpc, lifetimes[k]))
            .filter(|x| x.is_finite())
            .fold(0.0f64, f64::max)
    } else {
        0.0
    };
    let t = crate::gc::terms(c, v.states, v.live, bpc, active);
    let e = if top > 0.0 {
        (cost_benefit(v.live[c], bpc, lifetimes[c]) / top).min(1.0)
    } else {
        t.emptiness
    };
    w.emptiness * e
        + w.left_empty * t.left_empty
        + w.outlier * t.outlier
        + w.write_position * t.write_position
}

/// Check the index's choice against the full scan (debug builds, small
/// images): the same cluster, or one scoring the same up to rounding.
pub fn check_against_full_scan(
    x: &VictimIndex,
    v: &ClusterView<'_>,
    clock: u64,
    active: Option<usize>,
    policy: &GcPolicy,
) {
    let ages: Vec<u64> = v
        .activated
        .iter()
        .map(|a| clock.saturating_sub(*a))
        .collect();
    let per_stream = crate::gc::stream_lifetimes(v.states, v.stream, &ages, v.written, v.live);
    let fast = x.lifetimes(clock);
    for s in 0..STREAMS {
        let tol = 1e-6 * per_stream[s].abs().max(1.0);
        assert!(
            (fast[s] - per_stream[s]).abs() <= tol,
            "stream {s} lifetime: index {} full scan {}",
            fast[s],
            per_stream[s]
        );
    }
    let lifetimes: Vec<f64> = v.stream.iter().map(|&s| per_stream[s as usize]).collect();
    let full = crate::gc::pick_victim(v.states, v.live, &lifetimes, x.bpc, active, policy);
    let ours = x.pick(active, clock, policy);
    match (full, ours) {
        (None, None) => {}
        (Some(f), Some(o)) if f == o => {}
        (Some(f), Some(o)) => {
            let sf = full_scan_score(f, v, &lifetimes, x.bpc, active, policy);
            let so = full_scan_score(o, v, &lifetimes, x.bpc, active, policy);
            assert!(
                (sf - so).abs() <= 1e-9 * sf.abs().max(1.0),
                "victim: index {o} (score {so}), full scan {f} (score {sf})"
            );
        }
        (f, o) => panic!("victim: index {o:?}, full scan {f:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc::{Weights, HOT, MOVED_COLD, WARM};
    use ClusterState::*;

    struct Tables {
        states: Vec<ClusterState>,
        live: Vec<u32>,
        stream: Vec<u8>,
        activated: Vec<u64>,
        written: Vec<u32>,
    }

    impl Tables {
        fn view(&self) -> ClusterView<'_> {
            ClusterView {
                states: &self.states,
                live: &self.live,
                stream: &self.stream,
                activated: &self.activated,
                written: &self.written,
            }
        }
    }

    /// A tiny deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random changes of random clusters, the index refreshed after each;
    /// at every step it chooses as the full scan does.
    fn random_walk(seed: u64, policy: GcPolicy, n: usize, bpc: u64) {
        let mut r = Rng(seed | 1);
        let mut t = Tables {
            states: vec![Free; n],
            live: vec![0; n],
            stream: vec![WARM as u8; n],
            activated: vec![0; n],
            written: vec![0; n],
        };
        let mut clock = 0u64;
        let mut x = VictimIndex::new(&t.view(), bpc, &policy);
        for step in 0..4000 {
            let c = r.below(n as u64) as usize;
            match r.below(6) {
                // Activate a free cluster, fill it, retire it.
                0 | 1 => {
                    if t.states[c] == Free {
                        t.states[c] = Used;
                        t.stream[c] = r.below(STREAMS as u64) as u8;
                        t.activated[c] = clock;
                        clock += 1;
                        let w = 1 + r.below(bpc) as u32;
                        t.written[c] = w;
                        t.live[c] = w - r.below(w as u64) as u32;
                    }
                }
                // A block released.
                2 | 3 => {
                    if t.live[c] > 0 {
                        t.live[c] -= 1;
                        if t.live[c] == 0 && t.states[c] == Used {
                            t.states[c] = PendingFree;
                        }
                    }
                }
                // Pending clusters freed.
                4 => {
                    for k in 0..n {
                        if t.states[k] == PendingFree {
                            t.states[k] = Free;
                            x.refresh(k, &t.view());
                        }
                    }
                }
                // A cluster active for a while.
                _ => {
                    if t.states[c] == Free {
                        t.states[c] = Active;
                        t.live[c] = r.below(bpc) as u32;
                    } else if t.states[c] == Active {
                        t.states[c] = Used;
                    }
                }
            }
            x.refresh(c, &t.view());
            let active = (step % 3 == 0).then(|| r.below(n as u64) as usize);
            check_against_full_scan(&x, &t.view(), clock, active, &policy);
        }
    }

    #[test]
    fn chooses_as_the_full_scan_does() {
        for seed in 1..6 {
            random_walk(seed, GcPolicy::for_clusters(64), 64, 16);
            let mut p = GcPolicy::for_clusters(40);
            p.cost_benefit = false;
            p.emptiness_dominates_below = None;
            random_walk(seed * 77, p, 40, 8);
        }
    }

    #[test]
    fn lifetimes_are_the_full_scan_ones() {
        let t = Tables {
            states: vec![Used, Used, Used, Free],
            live: vec![8, 4, 15, 0],
            stream: vec![HOT as u8, HOT as u8, MOVED_COLD as u8, WARM as u8],
            activated: vec![91, 81, 1, 0],
            written: vec![16, 16, 16, 16],
        };
        let p = GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: true,
        };
        let x = VictimIndex::new(&t.view(), 16, &p);
        let l = x.lifetimes(100);
        // (10 + 20) / (ln 2 + ln 4), as in gc's own test.
        assert!((l[HOT] - 30.0 / 8f64.ln()).abs() < 1e-6, "{l:?}");
        check_against_full_scan(&x, &t.view(), 100, None, &p);
    }

    #[test]
    fn no_candidate_no_victim() {
        let t = Tables {
            states: vec![Used, Free, Active],
            live: vec![16, 0, 3],
            stream: vec![0; 3],
            activated: vec![0; 3],
            written: vec![16, 0, 3],
        };
        let x = VictimIndex::new(&t.view(), 16, &GcPolicy::for_clusters(3));
        assert_eq!(x.pick(Some(2), 5, &GcPolicy::for_clusters(3)), None);
    }
}
