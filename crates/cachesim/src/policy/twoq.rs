//! 2Q, the full version with A1in, A1out and Am.
//!
//! Source: T. Johnson and D. Shasha, "2Q: A Low Overhead High Performance
//! Buffer Management Replacement Algorithm", VLDB 1994, section 2.2 (the
//! "Full Version"; TransCom's reference [14]). Three queues:
//!
//! - **A1in**, a FIFO of resident blocks seen once recently;
//! - **A1out**, a FIFO of *identifiers only* (ghosts) of blocks pushed out
//!   of A1in;
//! - **Am**, an LRU of resident blocks referenced again after leaving A1in.
//!
//! On a reference to X: in Am → move to Am's MRU end; in A1in → nothing
//! (a correlated re-reference); in A1out → reclaim a frame and put X at
//! Am's MRU end; otherwise → reclaim a frame and put X at A1in's tail.
//! *Reclaim*: if there is a free frame use it; else if |A1in| > Kin, page
//! out A1in's head and remember its id at A1out's tail (dropping A1out's
//! head beyond Kout ids); else page out Am's LRU block (forgotten).
//! The paper recommends Kin = 25% and Kout = 50% of the frames (our
//! defaults, `kin=0.25`, `kout=0.5`). O(1) per access.
//!
//! `am=rest` additionally caps Am at capacity − Kin frames, which is how
//! libCacheSim's `TwoQ` composes its sub-caches; with it our miss counts
//! equal libCacheSim's exactly (see docs/cachesim.md). The cap only
//! matters while the cache is filling.

use std::hash::Hash;

use super::base::{Outcome, Params, SpecError};
use super::tagged::{Rule, Tagged};
use crate::index::{HashIndex, KeyIndex};

const A1IN: u8 = 0;
const AM: u8 = 1;
const A1OUT: u8 = 2;

/// 2Q's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct TwoQConfig {
    /// A1in's threshold as a fraction of the capacity.
    pub kin: f64,
    /// A1out's length (ghost ids) as a fraction of the capacity.
    pub kout: f64,
    /// Cap Am at capacity − Kin (libCacheSim's composition).
    pub am_rest: bool,
}

impl Default for TwoQConfig {
    fn default() -> Self {
        TwoQConfig {
            kin: 0.25,
            kout: 0.5,
            am_rest: false,
        }
    }
}

impl TwoQConfig {
    pub(crate) fn from_params(p: &Params) -> Result<Self, SpecError> {
        let mut c = TwoQConfig::default();
        for (k, v) in p.iter() {
            match k.as_str() {
                "kin" => c.kin = p.fraction(k, v)?,
                "kout" => c.kout = p.ratio(k, v)?,
                "am" => {
                    c.am_rest = match v.as_str() {
                        "full" => false,
                        "rest" => true,
                        _ => return Err(p.bad(k, v, "full or rest")),
                    }
                }
                _ => return Err(p.unknown(k, "kin, kout, am")),
            }
        }
        Ok(c)
    }
}

/// 2Q: queues A1in, Am (resident) and A1out (ghosts).
pub type TwoQ<K, I = HashIndex<K>> = Tagged<K, I, TwoQRule, 3>;

/// 2Q's own state: its thresholds in frames.
pub struct TwoQRule {
    kin: usize,
    kout: usize,
    am_limit: usize,
}

impl<K: Copy + Hash + Eq + Send> TwoQ<K> {
    pub fn new(capacity: usize, cfg: &TwoQConfig) -> Self {
        Self::with_index(capacity, cfg)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> TwoQ<K, I> {
    pub fn with_index(capacity: usize, cfg: &TwoQConfig) -> Self {
        // Truncation as in libCacheSim (int64 = double * int64).
        let kin = (capacity as f64 * cfg.kin) as usize;
        let kout = (capacity as f64 * cfg.kout) as usize;
        let am_limit = if cfg.am_rest {
            capacity - kin
        } else {
            capacity
        };
        let rule = TwoQRule {
            kin,
            kout,
            am_limit,
        };
        Tagged::build(capacity, capacity + kout + 2, rule)
    }

    /// (A1in, A1out, Am) keys, oldest first (tests).
    pub fn queues(&self) -> (Vec<K>, Vec<K>, Vec<K>) {
        let [a1in, am, a1out] = self.keys();
        (a1in, a1out, am)
    }

    /// Free one frame if the cache is full; returns the paged-out key.
    fn reclaim(&mut self) -> Option<K> {
        if self.resident() < self.cap {
            return None;
        }
        let [a1in, am, a1out] = &mut self.lists;
        if a1in.len > self.rule.kin || am.len == 0 {
            let y = a1in.front;
            let key = self.arena.get(y).key;
            self.arena.unlink(a1in, y);
            self.arena
                .retire(y, a1out, A1OUT, self.rule.kout, &mut self.index);
            Some(key)
        } else {
            Some(self.drop_front(AM))
        }
    }
}

impl Rule<3> for TwoQRule {
    const NAME: &'static str = "2Q";
    const RESIDENT: u8 = 2;

    #[inline]
    fn access<K: Copy + Send, I: KeyIndex<K>>(q: &mut TwoQ<K, I>, key: K) -> Outcome<K> {
        match q.index.get(&key) {
            Some(i) => match q.arena.get(i).tag {
                AM => {
                    q.arena.refresh(&mut q.lists[AM as usize], i);
                    Outcome::Hit
                }
                A1IN => Outcome::Hit,
                _ => {
                    // A ghost in A1out: the block goes to Am.
                    q.arena.unlink(&mut q.lists[A1OUT as usize], i);
                    let mut evicted = q.reclaim();
                    if q.lists[AM as usize].len >= q.rule.am_limit {
                        // Only with am=rest: Am is full although the
                        // cache is not; Am drops its LRU block.
                        debug_assert!(evicted.is_none());
                        evicted = Some(q.drop_front(AM));
                    }
                    q.arena.push_back(&mut q.lists[AM as usize], i, AM);
                    Outcome::Miss { evicted }
                }
            },
            None => {
                let evicted = q.reclaim();
                q.arena
                    .insert_back(&mut q.lists[A1IN as usize], &mut q.index, key, A1IN, ());
                Outcome::Miss { evicted }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    /// Hand-worked from the paper's full-version pseudo-code with 4
    /// frames, Kin = 1, Kout = 2.
    #[test]
    fn full_version_by_hand() {
        let cfg = TwoQConfig::default();
        let mut q = TwoQ::new(4, &cfg); // kin = 1, kout = 2
                                        // 1 2 3 4 fill A1in (free frames).
        for k in 1u32..=4 {
            assert_eq!(q.access(k), Outcome::Miss { evicted: None });
        }
        // A correlated re-reference in A1in changes nothing.
        assert!(q.access(2).is_hit());
        assert_eq!(q.queues(), (vec![1, 2, 3, 4], vec![], vec![]));
        // 5: |A1in| = 4 > Kin, so A1in's head (1) goes to A1out.
        assert_eq!(q.access(5), Outcome::Miss { evicted: Some(1) });
        // 6: again, 2 goes to A1out.
        assert_eq!(q.access(6), Outcome::Miss { evicted: Some(2) });
        assert_eq!(q.queues(), (vec![3, 4, 5, 6], vec![1, 2], vec![]));
        // 1 is remembered in A1out: a miss, but it enters Am (leaving
        // A1out); to make room 3 is paged out of A1in into A1out.
        assert_eq!(q.access(1), Outcome::Miss { evicted: Some(3) });
        assert_eq!(q.queues(), (vec![4, 5, 6], vec![2, 3], vec![1]));
        // 7: A1in still holds 3 > Kin blocks: 4 goes out, A1out drops 2.
        assert_eq!(q.access(7), Outcome::Miss { evicted: Some(4) });
        assert_eq!(q.queues(), (vec![5, 6, 7], vec![3, 4], vec![1]));
        // Hits in Am move to its MRU end.
        assert!(q.access(1).is_hit());
        // 3 comes back from A1out into Am; 5 leaves A1in.
        assert_eq!(q.access(3), Outcome::Miss { evicted: Some(5) });
        // 4 comes back too; 6 leaves A1in, leaving A1in at Kin = 1.
        assert_eq!(q.access(4), Outcome::Miss { evicted: Some(6) });
        assert_eq!(q.queues(), (vec![7], vec![5, 6], vec![1, 3, 4]));
        // Now |A1in| = Kin: a new block pages out Am's LRU (1), forgotten.
        assert_eq!(q.access(8), Outcome::Miss { evicted: Some(1) });
        assert_eq!(q.queues(), (vec![7, 8], vec![5, 6], vec![3, 4]));
        assert!(!q.contains(&1) && !q.contains(&5) && q.contains(&8));
    }
}
