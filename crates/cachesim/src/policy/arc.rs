//! ARC, the Adaptive Replacement Cache.
//!
//! Source: N. Megiddo and D. S. Modha, "ARC: A Self-Tuning, Low Overhead
//! Replacement Cache", FAST 2003, Figure 4. Four LRU lists: T1 (resident,
//! seen once recently), T2 (resident, seen at least twice), B1 and B2
//! (ghost ids evicted from T1 and T2); a target size `p` for T1 adapts on
//! ghost hits: a hit in B1 grows p by max(|B2|/|B1|, 1), a hit in B2
//! shrinks it by max(|B1|/|B2|, 1).
//!
//! - Case I, x ∈ T1 ∪ T2: move x to T2's MRU end.
//! - Case II/III, x ∈ B1 / B2: adapt p, REPLACE(x, p), move x to T2's MRU.
//! - Case IV, x nowhere: if |T1| + |B1| = c, then if |T1| < c drop B1's
//!   LRU ghost and REPLACE, else drop T1's LRU block outright; otherwise,
//!   if the directory holds ≥ c entries, drop B2's LRU ghost when it
//!   holds 2c, and REPLACE. Put x at T1's MRU end.
//! - REPLACE(x, p): if |T1| ≥ 1 and (|T1| > p or (x ∈ B2 and |T1| = p)),
//!   move T1's LRU block to B1, else T2's LRU block to B2.
//!
//! Like libCacheSim (and equivalently to the paper, whose cache stays full
//! once filled), evictions and ghost trimming happen only when the cache
//! is full, and REPLACE takes from T1 when T2 is empty. O(1) per access.

use std::hash::Hash;

use super::base::{Outcome, Policy};
use crate::index::{HashIndex, KeyIndex};
use crate::list::{Arena, List};

const T1: u8 = 0;
const T2: u8 = 1;
const B1: u8 = 2;
const B2: u8 = 3;

pub struct Arc<K, I = HashIndex<K>> {
    cap: usize,
    p: f64,
    arena: Arena<K, ()>,
    lists: [List; 4],
    index: I,
}

impl<K: Copy + Hash + Eq + Send> Arc<K> {
    pub fn new(capacity: usize) -> Self {
        Self::with_index(capacity)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Arc<K, I> {
    pub fn with_index(capacity: usize) -> Self {
        let budget = 2 * capacity + 2;
        Arc {
            cap: capacity,
            p: 0.0,
            arena: Arena::with_budget(budget),
            lists: [List::default(); 4],
            index: I::with_capacity(budget),
        }
    }

    /// The adaptive target size of T1.
    pub fn target(&self) -> f64 {
        self.p
    }

    /// (T1, T2, B1, B2), LRU first (tests).
    pub fn lists(&self) -> [Vec<K>; 4] {
        [0, 1, 2, 3].map(|i| self.arena.keys(&self.lists[i]))
    }

    fn len_of(&self, t: u8) -> usize {
        self.lists[t as usize].len
    }

    fn resident(&self) -> usize {
        self.len_of(T1) + self.len_of(T2)
    }

    /// Move an LRU block of T1 or T2 to its ghost list; returns its key.
    fn replace(&mut self, in_b2: bool) -> K {
        let t1 = self.len_of(T1) as f64;
        let from_t1 = (self.len_of(T1) >= 1 && (t1 > self.p || (in_b2 && t1 == self.p)))
            || self.len_of(T2) == 0;
        let (from, to) = if from_t1 { (T1, B1) } else { (T2, B2) };
        let [l1, l2, l3, l4] = &mut self.lists;
        let (src, dst) = match (from, to) {
            (T1, B1) => (l1, l3),
            _ => (l2, l4),
        };
        let v = src.front;
        self.arena.move_back(src, dst, v, to);
        self.arena.get(v).key
    }

    /// Drop the LRU entry of `list`; returns its key.
    fn drop_lru(&mut self, list: u8) -> K {
        self.arena
            .pop_front(&mut self.lists[list as usize], &mut self.index)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Policy<K> for Arc<K, I> {
    fn name(&self) -> String {
        "ARC".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.resident()
    }
    fn contains(&self, key: &K) -> bool {
        matches!(self.index.get(key), Some(i) if self.arena.get(i).tag <= T2)
    }

    fn access(&mut self, key: K) -> Outcome<K> {
        if self.cap == 0 {
            return Outcome::Miss { evicted: None };
        }
        let c = self.cap;
        match self.index.get(&key) {
            Some(i) => {
                let tag = self.arena.get(i).tag;
                match tag {
                    T1 => {
                        let [l1, l2, ..] = &mut self.lists;
                        self.arena.move_back(l1, l2, i, T2);
                        Outcome::Hit
                    }
                    T2 => {
                        self.arena.refresh(&mut self.lists[T2 as usize], i);
                        Outcome::Hit
                    }
                    _ => {
                        let (b1, b2) = (self.len_of(B1) as f64, self.len_of(B2) as f64);
                        let in_b2 = tag == B2;
                        if in_b2 {
                            self.p = (self.p - (b1 / b2).max(1.0)).max(0.0);
                        } else {
                            self.p = (self.p + (b2 / b1).max(1.0)).min(c as f64);
                        }
                        self.arena.unlink(&mut self.lists[tag as usize], i);
                        let evicted = (self.resident() >= c).then(|| self.replace(in_b2));
                        self.arena.push_back(&mut self.lists[T2 as usize], i, T2);
                        Outcome::Miss { evicted }
                    }
                }
            }
            None => {
                let mut evicted = None;
                if self.resident() >= c {
                    if self.len_of(T1) + self.len_of(B1) >= c {
                        if self.len_of(B1) > 0 {
                            self.drop_lru(B1);
                            evicted = Some(self.replace(false));
                        } else {
                            // T1 holds the whole cache: drop its LRU block.
                            evicted = Some(self.drop_lru(T1));
                        }
                    } else {
                        let total: usize = self.lists.iter().map(|l| l.len).sum();
                        if total >= 2 * c && self.len_of(B2) > 0 {
                            self.drop_lru(B2);
                        }
                        evicted = Some(self.replace(false));
                    }
                }
                self.arena
                    .insert_back(&mut self.lists[T1 as usize], &mut self.index, key, T1, ());
                Outcome::Miss { evicted }
            }
        }
    }

    fn remove(&mut self, key: &K) -> bool {
        self.arena
            .remove_keyed(&mut self.lists, &mut self.index, key)
            .is_some_and(|t| t <= T2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked by hand from the paper's Figure 4 with c = 2.
    #[test]
    fn figure4_by_hand() {
        let mut a = Arc::new(2);
        let miss = |e: Option<u32>| Outcome::Miss { evicted: e };
        assert_eq!(a.access(1u32), miss(None));
        assert_eq!(a.access(2), miss(None));
        // Case I: 1 moves from T1 to T2.
        assert!(a.access(1).is_hit());
        assert_eq!(a.lists(), [vec![2], vec![1], vec![], vec![]]);
        // Case IV(B): |T1|+|B1| = 1 < c; directory has 2 = c entries, not
        // 2c; REPLACE with p = 0 < |T1| = 1 moves 2 to B1.
        assert_eq!(a.access(3), miss(Some(2)));
        assert_eq!(a.lists(), [vec![3], vec![1], vec![2], vec![]]);
        // Case IV(A): |T1|+|B1| = 2 = c and |T1| < c: drop B1's LRU (2),
        // REPLACE moves 3 to B1.
        assert_eq!(a.access(4), miss(Some(3)));
        assert_eq!(a.lists(), [vec![4], vec![1], vec![3], vec![]]);
        // Case II: 3 in B1; p grows by max(|B2|/|B1|, 1) = 1; REPLACE with
        // |T1| = 1 = p and x not in B2 takes T2's LRU (1) into B2.
        assert_eq!(a.access(3), miss(Some(1)));
        assert_eq!(a.target(), 1.0);
        assert_eq!(a.lists(), [vec![4], vec![3], vec![], vec![1]]);
        // Case III: 1 in B2; p shrinks to 0; REPLACE: |T1| = 1 > p, so 4
        // goes to B1.
        assert_eq!(a.access(1), miss(Some(4)));
        assert_eq!(a.target(), 0.0);
        assert_eq!(a.lists(), [vec![], vec![3, 1], vec![4], vec![]]);
        assert!(a.access(3).is_hit());
        assert_eq!(a.lists(), [vec![], vec![1, 3], vec![4], vec![]]);
    }
}
