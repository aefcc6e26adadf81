//! S3-FIFO: three static FIFO queues.
//!
//! Source: J. Yang, Y. Zhang, Z. Qiu, Y. Yue and K. V. Rashmi, "FIFO
//! queues are all you need for cache eviction", SOSP 2023, Algorithm 1,
//! as implemented by its authors in libCacheSim (`S3FIFO.c`), whose
//! behaviour we follow exactly so the miss ratios can be cross-checked:
//!
//! - a small FIFO **S** of ⌊0.1·c⌋ blocks, a main FIFO **M** of the rest,
//!   and a ghost FIFO **G** of ⌊0.9·c⌋ ids evicted from S;
//! - each resident block has a 2-bit frequency, +1 per hit, capped at 3;
//! - a miss whose id is in G inserts into M, any other miss into S, both
//!   with frequency 0, after one eviction if the cache is full;
//! - eviction takes from M when M holds more than its share or S is empty,
//!   otherwise from S;
//! - evicting from S: its oldest block moves to M (frequency reset to 0)
//!   if its frequency is ≥ 2 (`move-to-main-threshold`), and the scan
//!   continues; the first block with frequency < 2 leaves the cache and
//!   its id enters G;
//! - evicting from M: its oldest block is reinserted at M's tail with
//!   frequency − 1 while its frequency is ≥ 1; the first with frequency 0
//!   leaves the cache.
//!
//! Algorithm 1 in the paper evicts from M *during* the S scan when M is
//! full; libCacheSim lets M run over and evicts from it on the next
//! eviction. The number of evictions per miss is one either way. O(1)
//! amortised per access (each reinsertion consumes a hit).

use std::hash::Hash;

use super::base::{Outcome, Params, SpecError};
use super::tagged::{Rule, Tagged};
use crate::index::{HashIndex, KeyIndex};

const S: u8 = 0;
const M: u8 = 1;
const G: u8 = 2;

/// S3-FIFO's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct S3FifoConfig {
    /// S's share of the capacity.
    pub small: f64,
    /// G's length as a fraction of the capacity.
    pub ghost: f64,
    /// Hits needed in S to move to M.
    pub threshold: u8,
}

impl Default for S3FifoConfig {
    fn default() -> Self {
        S3FifoConfig {
            small: 0.10,
            ghost: 0.90,
            threshold: 2,
        }
    }
}

impl S3FifoConfig {
    pub(crate) fn from_params(p: &Params) -> Result<Self, SpecError> {
        let mut c = S3FifoConfig::default();
        for (k, v) in p.iter() {
            match k.as_str() {
                "small" => c.small = p.fraction(k, v)?,
                "ghost" => c.ghost = p.ratio(k, v)?,
                "threshold" => {
                    c.threshold = match v.parse::<u8>() {
                        Ok(t @ 1..=3) => t,
                        _ => return Err(p.bad(k, v, "1, 2 or 3")),
                    }
                }
                _ => return Err(p.unknown(k, "small, ghost, threshold")),
            }
        }
        Ok(c)
    }
}

/// S3-FIFO: queues S, M (resident) and G (ghosts); the node payload is
/// the frequency.
pub type S3Fifo<K, I = HashIndex<K>> = Tagged<K, I, S3FifoRule, 3, u8>;

/// S3-FIFO's own state: M's share, G's length and the promotion
/// threshold.
pub struct S3FifoRule {
    m_cap: usize,
    g_cap: usize,
    threshold: u8,
}

impl<K: Copy + Hash + Eq + Send> S3Fifo<K> {
    pub fn new(capacity: usize, cfg: &S3FifoConfig) -> Self {
        Self::with_index(capacity, cfg)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> S3Fifo<K, I> {
    pub fn with_index(capacity: usize, cfg: &S3FifoConfig) -> Self {
        let s_cap = (capacity as f64 * cfg.small) as usize;
        let g_cap = (capacity as f64 * cfg.ghost) as usize;
        let rule = S3FifoRule {
            m_cap: capacity - s_cap,
            g_cap,
            threshold: cfg.threshold,
        };
        Tagged::build(capacity, capacity + g_cap + 2, rule)
    }

    /// (S, M, G), oldest first (tests).
    pub fn queues(&self) -> [Vec<K>; 3] {
        self.keys()
    }

    /// A resident block's frequency (tests).
    pub fn frequency(&self, key: &K) -> Option<u8> {
        self.index
            .get(key)
            .filter(|&i| self.arena.get(i).tag != G)
            .map(|i| self.arena.get(i).x)
    }

    fn evict(&mut self) -> K {
        if self.lists[M as usize].len > self.rule.m_cap || self.lists[S as usize].len == 0 {
            self.evict_main()
        } else {
            self.evict_small()
        }
    }

    fn evict_small(&mut self) -> K {
        loop {
            let [s, m, g] = &mut self.lists;
            let t = s.front;
            let n = self.arena.get_mut(t);
            if n.x >= self.rule.threshold {
                n.x = 0;
                self.arena.move_back(s, m, t, M);
                if s.len == 0 {
                    // Everything in S was promoted: evict from M instead.
                    return self.evict_main();
                }
                continue;
            }
            let key = n.key;
            n.x = 0;
            self.arena.unlink(s, t);
            self.arena.retire(t, g, G, self.rule.g_cap, &mut self.index);
            return key;
        }
    }

    fn evict_main(&mut self) -> K {
        let m = &mut self.lists[M as usize];
        loop {
            let t = m.front;
            let n = self.arena.get_mut(t);
            if n.x >= 1 {
                n.x = n.x.min(3) - 1;
                self.arena.refresh(m, t);
                continue;
            }
            return self.arena.pop_front(m, &mut self.index);
        }
    }
}

impl Rule<3, u8> for S3FifoRule {
    const NAME: &'static str = "S3-FIFO";
    const RESIDENT: u8 = 2;

    #[inline]
    fn access<K: Copy + Send, I: KeyIndex<K>>(c: &mut S3Fifo<K, I>, key: K) -> Outcome<K> {
        let ghost = match c.index.get(&key) {
            Some(i) => {
                let n = c.arena.get_mut(i);
                if n.tag != G {
                    n.x = (n.x + 1).min(3);
                    return Outcome::Hit;
                }
                c.arena.unlink(&mut c.lists[G as usize], i);
                Some(i)
            }
            None => None,
        };
        let evicted = (c.resident() >= c.cap).then(|| c.evict());
        let (i, tag) = match ghost {
            Some(i) => {
                c.arena.get_mut(i).x = 0;
                (i, M)
            }
            None => {
                let i = c.arena.alloc(key, S, 0);
                c.index.insert(key, i);
                (i, S)
            }
        };
        c.arena.push_back(&mut c.lists[tag as usize], i, tag);
        Outcome::Miss { evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    /// Worked by hand from the algorithm with c = 10: S holds 1 block,
    /// M 9, G 9 ids.
    #[test]
    fn quick_demotion_and_lazy_promotion_by_hand() {
        let mut c = S3Fifo::new(10, &S3FifoConfig::default());
        let miss = |e: Option<u32>| Outcome::Miss { evicted: e };
        for k in 1u32..=10 {
            assert_eq!(c.access(k), miss(None));
        }
        // All ten went to S (S may exceed its share while there is room).
        assert_eq!(c.queues()[0].len(), 10);
        // 1 and 2 are hit twice, 3 once.
        for k in [1, 1, 2, 2, 3] {
            assert!(c.access(k).is_hit());
        }
        assert_eq!(c.frequency(&1), Some(2));
        // 11: S is over its share; its head 1 (freq 2) moves to M, then 2
        // (freq 2) too, then 3 (freq 1 < 2) is evicted into G.
        assert_eq!(c.access(11), miss(Some(3)));
        assert_eq!(
            c.queues(),
            [vec![4, 5, 6, 7, 8, 9, 10, 11], vec![1, 2], vec![3]]
        );
        assert_eq!(c.frequency(&1), Some(0), "promotion resets the count");
        // 3 is in G: it comes back straight into M; 4 (never hit) is the
        // one-hit wonder evicted from S.
        assert_eq!(c.access(3), miss(Some(4)));
        assert_eq!(
            c.queues(),
            [vec![5, 6, 7, 8, 9, 10, 11], vec![1, 2, 3], vec![4]]
        );
        assert!(c.access(2).is_hit());
        // Drain S down to its share: 12..=17 each evict the head of S.
        for (k, v) in (12u32..=17).zip(5u32..=10) {
            assert_eq!(c.access(k), miss(Some(v)));
        }
        assert_eq!(c.queues()[0], vec![11, 12, 13, 14, 15, 16, 17]);
        // G is capped at 9 ids.
        for k in 18u32..=30 {
            c.access(k);
        }
        assert_eq!(c.queues()[2].len(), 9);
        // M: blocks hit while in M get another pass.
        let mut m = S3Fifo::new(10, &S3FifoConfig::default());
        for k in 1u32..=10 {
            m.access(k);
        }
        for k in 1u32..=9 {
            m.access(k);
            m.access(k);
        }
        // 1..=9 (freq 2) all move to M, which is then exactly at its
        // share; 10 (freq 0) is evicted into G.
        assert_eq!(m.access(11), miss(Some(10)));
        assert_eq!(m.queues(), [vec![11], (1..=9).collect(), vec![10]]);
        assert!(m.access(2).is_hit()); // freq 1, in M
        assert_eq!(m.access(12), miss(Some(11)), "S is at its share");
        // 10 is in G: it goes to M, whose length (10) now exceeds its
        // share, after 12 left S for G.
        assert_eq!(m.access(10), miss(Some(12)));
        assert_eq!(m.queues()[1], (1..=10).collect::<Vec<_>>());
        // So the next eviction is M's: 1 has freq 0 and goes.
        assert_eq!(m.access(13), miss(Some(1)));
        // Once more over its share (11 returns from G)...
        assert_eq!(m.access(11), miss(Some(13)));
        // ...M's head 2 (freq 1) is reinserted with freq 0 and 3 goes.
        assert_eq!(m.access(14), miss(Some(3)));
        assert_eq!(m.queues()[1], vec![4, 5, 6, 7, 8, 9, 10, 11, 2]);
        assert_eq!(m.frequency(&2), Some(0));
    }
}
