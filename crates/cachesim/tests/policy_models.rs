//! Every policy keeps the [`Policy`] contract on random operation
//! sequences, and the two policies with the most intricate O(1) data
//! structures (the multi-queue engine of FMPQ/MQ, and FBR with its moving
//! section boundaries and count chains) make exactly the decisions of a
//! naive, obviously-correct model written straight from their papers.

use std::collections::VecDeque;

use proptest::prelude::*;
use roamdisk_cachesim::index::{DenseIndex, HashIndex};
use roamdisk_cachesim::policy::fbr::{Fbr, FbrConfig};
use roamdisk_cachesim::policy::fmpq::FmpqConfig;
use roamdisk_cachesim::policy::mq::MultiQueue;
use roamdisk_cachesim::policy::{Amount, Outcome, Policy, PolicyKind};
use roamdisk_cachesim::PolicySpec;

#[derive(Clone, Debug)]
enum Op {
    Access(u32),
    Remove(u32),
}

fn ops(keys: u32) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            9 => (0..keys).prop_map(Op::Access),
            1 => (0..keys).prop_map(Op::Remove),
        ],
        0..500,
    )
}

fn check_contract(p: &mut dyn Policy<u32>, ops: &[Op]) {
    let cap = p.capacity();
    for op in ops {
        match *op {
            Op::Access(k) => {
                let before = p.contains(&k);
                let len = p.len();
                let out = p.access(k);
                assert_eq!(out.is_hit(), before, "{}: hit iff resident", p.name());
                assert!(p.contains(&k), "{}: resident after access", p.name());
                match out {
                    Outcome::Hit => assert_eq!(p.len(), len),
                    Outcome::Miss { evicted: Some(v) } => {
                        assert_ne!(v, k);
                        assert!(!p.contains(&v), "{}: victim gone", p.name());
                        assert_eq!(p.len(), len, "{}", p.name());
                    }
                    Outcome::Miss { evicted: None } => {
                        assert!(len < cap, "{}: no victim only with room", p.name());
                        assert_eq!(p.len(), len + 1, "{}", p.name());
                    }
                }
                assert!(p.len() <= cap);
            }
            Op::Remove(k) => {
                let before = p.contains(&k);
                let len = p.len();
                assert_eq!(p.remove(&k), before);
                assert!(!p.contains(&k));
                assert_eq!(p.len(), len - before as usize);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_policy_keeps_the_contract(cap in 1usize..40, keys in 1u32..100, ops in ops(100)) {
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|o| match o {
                Op::Access(k) => Op::Access(k % keys),
                Op::Remove(k) => Op::Remove(k % keys),
            })
            .collect();
        for kind in PolicyKind::ALL {
            let spec = PolicySpec::parse(kind.name()).unwrap();
            check_contract(&mut *spec.build::<u32, HashIndex<u32>>(cap), &ops);
            check_contract(&mut *spec.build::<u32, DenseIndex>(cap), &ops);
        }
    }

    #[test]
    fn multiqueue_matches_naive_model(
        cap in 1usize..24,
        w in 1usize..6,
        qoff in 0u64..40,
        duration in 0u64..60,
        trace in prop::collection::vec(0u32..60, 0..600),
    ) {
        let cfg = FmpqConfig { w, qoff: Amount::Blocks(qoff), duration: Amount::Blocks(duration) };
        let mut fast = MultiQueue::<u32>::fmpq(cap, &cfg);
        let mut naive = NaiveMq::new(cap, w, qoff as usize, duration);
        for (t, &k) in trace.iter().enumerate() {
            prop_assert_eq!(fast.access(k), naive.access(k), "access #{} of {}", t, k);
        }
    }

    #[test]
    fn fbr_matches_naive_model(
        cap in 1usize..24,
        fnew in 0.0f64..0.6,
        fold in 0.0f64..0.4,
        amax in 1.0f64..6.0,
        cmax in 1u32..8,
        trace in prop::collection::vec(0u32..50, 0..600),
    ) {
        let cfg = FbrConfig { fnew, fold, amax, cmax };
        let mut fast = Fbr::<u32>::new(cap, &cfg);
        let mut naive = NaiveFbr::new(cap, &cfg);
        for (t, &k) in trace.iter().enumerate() {
            prop_assert_eq!(fast.access(k), naive.access(k), "access #{} of {}", t, k);
        }
    }
}

/// MQ / FMPQ transcribed literally: queues as deques, the history as a
/// deque, every step a linear search.
struct NaiveMq {
    cap: usize,
    qoff: usize,
    duration: u64,
    now: u64,
    /// (key, frequency, expire)
    queues: Vec<VecDeque<(u32, u32, u64)>>,
    history: VecDeque<(u32, u32)>,
}

impl NaiveMq {
    fn new(cap: usize, w: usize, qoff: usize, duration: u64) -> Self {
        NaiveMq {
            cap,
            qoff,
            duration,
            now: 0,
            queues: vec![VecDeque::new(); w],
            history: VecDeque::new(),
        }
    }

    fn qcount(&self, g: u32) -> usize {
        ((g as f64).log2().floor() as usize).min(self.queues.len() - 1)
    }

    fn access(&mut self, k: u32) -> Outcome<u32> {
        self.now += 1;
        let found = self
            .queues
            .iter()
            .enumerate()
            .find_map(|(q, d)| d.iter().position(|e| e.0 == k).map(|p| (q, p)));
        let out = if let Some((q, p)) = found {
            let (_, g, _) = self.queues[q].remove(p).unwrap();
            let d = self.qcount(g + 1);
            self.queues[d].push_back((k, g + 1, self.now + self.duration));
            Outcome::Hit
        } else {
            let resident: usize = self.queues.iter().map(|q| q.len()).sum();
            // The record is looked up before the victim joins Q_off.
            let g = match self.history.iter().position(|e| e.0 == k) {
                Some(p) => self.history.remove(p).unwrap().1 + 1,
                None => 1,
            };
            let mut evicted = None;
            if resident >= self.cap {
                let q = self.queues.iter().position(|q| !q.is_empty()).unwrap();
                let (v, vg, _) = self.queues[q].pop_front().unwrap();
                if self.qoff > 0 {
                    self.history.push_back((v, vg));
                    if self.history.len() > self.qoff {
                        self.history.pop_front();
                    }
                }
                evicted = Some(v);
            }
            let d = self.qcount(g);
            self.queues[d].push_back((k, g, self.now + self.duration));
            Outcome::Miss { evicted }
        };
        for q in 1..self.queues.len() {
            if let Some(&(h, g, over)) = self.queues[q].front() {
                if over < self.now {
                    self.queues[q].pop_front();
                    self.queues[q - 1].push_back((h, g, self.now + self.duration));
                }
            }
        }
        out
    }
}

/// FBR transcribed literally: the stack as a vector (index 0 = most
/// recently used), sections by position.
struct NaiveFbr {
    cap: usize,
    n_new: usize,
    n_mid: usize,
    amax: f64,
    cmax: u32,
    stack: Vec<(u32, u32)>,
}

impl NaiveFbr {
    fn new(cap: usize, c: &FbrConfig) -> Self {
        let n_new = ((cap as f64 * c.fnew) as usize).max(1).min(cap);
        let n_old = ((cap as f64 * c.fold) as usize).max(1);
        NaiveFbr {
            cap,
            n_new,
            n_mid: cap.saturating_sub(n_new + n_old),
            amax: c.amax,
            cmax: c.cmax.max(1),
            stack: Vec::new(),
        }
    }

    fn access(&mut self, k: u32) -> Outcome<u32> {
        if let Some(p) = self.stack.iter().position(|e| e.0 == k) {
            let (_, mut c) = self.stack.remove(p);
            if p >= self.n_new && c < self.cmax {
                c += 1;
            }
            self.stack.insert(0, (k, c));
            let total: u64 = self.stack.iter().map(|e| e.1 as u64).sum();
            if total as f64 > self.amax * self.stack.len() as f64 {
                for e in &mut self.stack {
                    e.1 = e.1.div_ceil(2);
                }
            }
            return Outcome::Hit;
        }
        let mut evicted = None;
        if self.stack.len() >= self.cap {
            let old_start = self.n_new + self.n_mid;
            let victim = if old_start < self.stack.len() {
                // Smallest count; among equals the deepest (LRU) one.
                (old_start..self.stack.len())
                    .min_by_key(|&p| (self.stack[p].1, std::cmp::Reverse(p)))
                    .unwrap()
            } else {
                self.stack.len() - 1
            };
            evicted = Some(self.stack.remove(victim).0);
        }
        self.stack.insert(0, (k, 1));
        Outcome::Miss { evicted }
    }
}
