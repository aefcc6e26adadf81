//! LRU: evict the least recently used block.
//!
//! Source: the classical stack algorithm of Mattson, Gecsei, Slutz and
//! Traiger, "Evaluation techniques for storage hierarchies", IBM Systems
//! Journal 9(2), 1970 — the definition TransCom's simulator uses (seed
//! section 5.1, reference [11]) and the one [`crate::stack`] computes for
//! every size at once. One list, most recent at the back; a hit moves the
//! block to the back, a miss evicts the front. O(1) per access.

use std::hash::Hash;

use super::base::{Outcome, Policy};
use crate::index::{HashIndex, KeyIndex};
use crate::list::{Arena, List};

pub struct Lru<K, I = HashIndex<K>> {
    cap: usize,
    arena: Arena<K, ()>,
    list: List,
    index: I,
}

impl<K: Copy + Hash + Eq + Send> Lru<K> {
    /// An LRU cache of `capacity` blocks with a hashed index.
    pub fn new(capacity: usize) -> Self {
        Self::with_index(capacity)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Lru<K, I> {
    /// An LRU cache of `capacity` blocks with index type `I`.
    pub fn with_index(capacity: usize) -> Self {
        Lru {
            cap: capacity,
            arena: Arena::with_budget(capacity),
            list: List::default(),
            index: I::with_capacity(capacity),
        }
    }

    /// Resident keys from least to most recently used.
    pub fn keys_lru_first(&self) -> Vec<K> {
        self.arena.keys(&self.list)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Policy<K> for Lru<K, I> {
    fn name(&self) -> String {
        "LRU".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.list.len
    }
    fn contains(&self, key: &K) -> bool {
        self.index.get(key).is_some()
    }

    #[inline]
    fn access(&mut self, key: K) -> Outcome<K> {
        if let Some(i) = self.index.get(&key) {
            self.arena.refresh(&mut self.list, i);
            return Outcome::Hit;
        }
        if self.cap == 0 {
            return Outcome::Miss { evicted: None };
        }
        let mut evicted = None;
        let i = if self.list.len >= self.cap {
            // Reuse the victim's node in place.
            let v = self.list.front;
            let old = self.arena.get(v).key;
            self.index.remove(&old);
            self.arena.unlink(&mut self.list, v);
            self.arena.get_mut(v).key = key;
            evicted = Some(old);
            v
        } else {
            self.arena.alloc(key, 0, ())
        };
        self.arena.push_back(&mut self.list, i, 0);
        self.index.insert(key, i);
        Outcome::Miss { evicted }
    }

    fn remove(&mut self, key: &K) -> bool {
        self.arena
            .remove_keyed(std::slice::from_mut(&mut self.list), &mut self.index, key)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
