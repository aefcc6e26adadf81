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

use super::base::Outcome;
use super::tagged::{Rule, Tagged};
use crate::index::{HashIndex, KeyIndex};

const T1: u8 = 0;
const T2: u8 = 1;
const B1: u8 = 2;
const B2: u8 = 3;

/// ARC: lists T1, T2 (resident), B1, B2 (ghosts).
pub type Arc<K, I = HashIndex<K>> = Tagged<K, I, ArcRule, 4>;

/// ARC's own state: the adaptive target size `p` of T1.
pub struct ArcRule {
    p: f64,
}

impl<K: Copy + Hash + Eq + Send> Arc<K> {
    pub fn new(capacity: usize) -> Self {
        Self::with_index(capacity)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Arc<K, I> {
    pub fn with_index(capacity: usize) -> Self {
        Tagged::build(capacity, 2 * capacity + 2, ArcRule { p: 0.0 })
    }

    /// The adaptive target size of T1.
    pub fn target(&self) -> f64 {
        self.rule.p
    }

    /// (T1, T2, B1, B2), LRU first (tests).
    pub fn lists(&self) -> [Vec<K>; 4] {
        self.keys()
    }

    fn len_of(&self, t: u8) -> usize {
        self.lists[t as usize].len
    }

    /// Move an LRU block of T1 or T2 to its ghost list; returns its key.
    fn replace(&mut self, in_b2: bool) -> K {
        let t1 = self.len_of(T1) as f64;
        let p = self.rule.p;
        let from_t1 =
            (self.len_of(T1) >= 1 && (t1 > p || (in_b2 && t1 == p))) || self.len_of(T2) == 0;
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
}

impl Rule<4> for ArcRule {
    const NAME: &'static str = "ARC";
    const RESIDENT: u8 = 2;

    #[inline]
    fn access<K: Copy + Send, I: KeyIndex<K>>(a: &mut Arc<K, I>, key: K) -> Outcome<K> {
        let c = a.cap;
        match a.index.get(&key) {
            Some(i) => {
                let tag = a.arena.get(i).tag;
                match tag {
                    T1 => {
                        let [l1, l2, ..] = &mut a.lists;
                        a.arena.move_back(l1, l2, i, T2);
                        Outcome::Hit
                    }
                    T2 => {
                        a.arena.refresh(&mut a.lists[T2 as usize], i);
                        Outcome::Hit
                    }
                    _ => {
                        let (b1, b2) = (a.len_of(B1) as f64, a.len_of(B2) as f64);
                        let in_b2 = tag == B2;
                        let p = &mut a.rule.p;
                        if in_b2 {
                            *p = (*p - (b1 / b2).max(1.0)).max(0.0);
                        } else {
                            *p = (*p + (b2 / b1).max(1.0)).min(c as f64);
                        }
                        a.arena.unlink(&mut a.lists[tag as usize], i);
                        let evicted = (a.resident() >= c).then(|| a.replace(in_b2));
                        a.arena.push_back(&mut a.lists[T2 as usize], i, T2);
                        Outcome::Miss { evicted }
                    }
                }
            }
            None => {
                let mut evicted = None;
                if a.resident() >= c {
                    if a.len_of(T1) + a.len_of(B1) >= c {
                        if a.len_of(B1) > 0 {
                            a.drop_front(B1);
                            evicted = Some(a.replace(false));
                        } else {
                            // T1 holds the whole cache: drop its LRU block.
                            evicted = Some(a.drop_front(T1));
                        }
                    } else {
                        let total: usize = a.lists.iter().map(|l| l.len).sum();
                        if total >= 2 * c && a.len_of(B2) > 0 {
                            a.drop_front(B2);
                        }
                        evicted = Some(a.replace(false));
                    }
                }
                a.arena
                    .insert_back(&mut a.lists[T1 as usize], &mut a.index, key, T1, ());
                Outcome::Miss { evicted }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

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
