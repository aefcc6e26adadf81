//! LRU: evict the least recently used block.
//!
//! Source: the classical stack algorithm of Mattson, Gecsei, Slutz and
//! Traiger, "Evaluation techniques for storage hierarchies", IBM Systems
//! Journal 9(2), 1970 — the definition TransCom's simulator uses (seed
//! section 5.1, reference [11]) and the one [`crate::stack`] computes for
//! every size at once. One list, most recent at the back; a hit moves the
//! block to the back, a miss evicts the front. O(1) per access.

use std::hash::Hash;

use super::base::Outcome;
use super::tagged::{Rule, Tagged};
use crate::index::{HashIndex, KeyIndex};

/// LRU: one list of resident blocks.
pub type Lru<K, I = HashIndex<K>> = Tagged<K, I, LruRule, 1>;

/// LRU's rule; it has no state of its own.
pub struct LruRule;

impl<K: Copy + Hash + Eq + Send> Lru<K> {
    /// An LRU cache of `capacity` blocks with a hashed index.
    pub fn new(capacity: usize) -> Self {
        Self::with_index(capacity)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Lru<K, I> {
    /// An LRU cache of `capacity` blocks with index type `I`.
    pub fn with_index(capacity: usize) -> Self {
        Tagged::build(capacity, capacity, LruRule)
    }

    /// Resident keys from least to most recently used.
    pub fn keys_lru_first(&self) -> Vec<K> {
        self.arena.keys(&self.lists[0])
    }
}

impl Rule<1> for LruRule {
    const NAME: &'static str = "LRU";
    const RESIDENT: u8 = 1;

    #[inline]
    fn access<K: Copy + Send, I: KeyIndex<K>>(p: &mut Lru<K, I>, key: K) -> Outcome<K> {
        let list = &mut p.lists[0];
        if let Some(i) = p.index.get(&key) {
            p.arena.refresh(list, i);
            return Outcome::Hit;
        }
        let mut evicted = None;
        let i = if list.len >= p.cap {
            // Reuse the victim's node in place.
            let v = list.front;
            let old = p.arena.get(v).key;
            p.index.remove(&old);
            p.arena.unlink(list, v);
            p.arena.get_mut(v).key = key;
            evicted = Some(old);
            v
        } else {
            p.arena.alloc(key, 0, ())
        };
        p.arena.push_back(list, i, 0);
        p.index.insert(key, i);
        Outcome::Miss { evicted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    #[test]
    fn textbook_trace() {
        // 3 frames, reference string 7 0 1 2 0 3 0 4 2 3 0 3 2 (the
        // classic operating-systems textbook example): LRU faults on 9 of
        // the 13 references, hitting only the 5th, 7th, 12th and 13th.
        let mut c = Lru::new(3);
        let trace = [7u32, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2];
        let hits: Vec<bool> = trace.iter().map(|&k| c.access(k).is_hit()).collect();
        let expect = [
            false, false, false, false, true, false, true, false, false, false, false, true, true,
        ];
        assert_eq!(hits, expect);
        assert_eq!(c.keys_lru_first(), vec![0, 3, 2]);
    }

    #[test]
    fn reports_the_victim() {
        let mut c = Lru::new(2);
        c.access(1u64);
        c.access(2);
        c.access(1);
        assert_eq!(c.access(3), Outcome::Miss { evicted: Some(2) });
        assert!(c.remove(&1));
        assert_eq!(c.access(4), Outcome::Miss { evicted: None });
        assert_eq!(c.len(), 2);
    }
}
