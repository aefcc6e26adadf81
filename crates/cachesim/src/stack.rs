//! One-pass LRU stack distances (TransCom seed section 5.1; Mattson et
//! al. 1970): the exact LRU hit ratio for every cache size at once.
//!
//! The stack distance of a reference is the position of its block in the
//! LRU stack (1 = most recently used) — equivalently one plus the number
//! of distinct blocks referenced since the block's previous reference. An
//! LRU cache of `c` blocks hits exactly the references with distance ≤ c,
//! so a histogram of distances gives the hit ratio of every size.
//!
//! Instead of walking a stack (O(depth) per reference) we mark, in a
//! Fenwick tree indexed by time, the time of each block's most recent
//! reference. The distance of a reference to a block last seen at time t
//! is one plus the number of marks after t: a prefix sum, O(log n). The
//! mark moves from t to now. When the time axis fills up, the live marks
//! are renumbered 0..live in order (keeping their relative order, which is
//! all distances depend on), so memory stays O(distinct blocks).

use crate::index::NIL;

/// A Fenwick (binary indexed) tree of counts.
struct Fenwick {
    t: Vec<u32>,
}

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick { t: vec![0; n + 1] }
    }

    /// A tree with ones at positions 0..k.
    fn ones(n: usize, k: usize) -> Fenwick {
        let mut t = vec![0u32; n + 1];
        for v in t.iter_mut().skip(1).take(k) {
            *v = 1;
        }
        // Linear-time build: push each node's sum to its parent.
        for i in 1..=n {
            let j = i + (i & i.wrapping_neg());
            if j <= n {
                t[j] += t[i];
            }
        }
        Fenwick { t }
    }

    #[inline]
    fn add(&mut self, pos: usize, delta: i32) {
        let mut i = pos + 1;
        while i < self.t.len() {
            self.t[i] = self.t[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of positions 0..=pos.
    #[inline]
    fn prefix(&self, pos: usize) -> u64 {
        let mut i = pos + 1;
        let mut s = 0u64;
        while i > 0 {
            s += self.t[i] as u64;
            i &= i - 1;
        }
        s
    }
}

/// Streaming LRU stack distances over dense `u32` keys.
pub struct StackDistance {
    /// Time slot of each key's last reference (NIL = never seen).
    last: Vec<u32>,
    /// Key owning each time slot.
    owner: Vec<u32>,
    tree: Fenwick,
    now: usize,
    live: usize,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    pub fn new() -> StackDistance {
        let cap = 1024;
        StackDistance {
            last: Vec::new(),
            owner: vec![NIL; cap],
            tree: Fenwick::new(cap),
            now: 0,
            live: 0,
        }
    }

    /// Distinct keys seen so far.
    pub fn distinct(&self) -> usize {
        self.live
    }

    /// Reference `key`: its stack distance (1-based), or `None` for a
    /// first reference (infinite distance, a cold miss at every size).
    #[inline]
    pub fn access(&mut self, key: u32) -> Option<u64> {
        let k = key as usize;
        if k >= self.last.len() {
            let n = (k + 1).max(self.last.len() * 2).max(1024);
            self.last.resize(n, NIL);
        }
        let prev = self.last[k];
        let dist = if prev != NIL {
            let p = prev as usize;
            // Marks strictly after p, plus the block itself.
            let after = self.live as u64 - self.tree.prefix(p);
            self.tree.add(p, -1);
            self.last[k] = NIL;
            Some(after + 1)
        } else {
            self.live += 1;
            None
        };
        if self.now == self.owner.len() {
            self.compact();
        }
        let t = self.now;
        self.now += 1;
        self.last[k] = t as u32;
        self.owner[t] = key;
        self.tree.add(t, 1);
        dist
    }

    /// Renumber the live marks 0..live; grow so at least half the time
    /// axis is free afterwards.
    fn compact(&mut self) {
        let mut keys = Vec::with_capacity(self.live);
        for t in 0..self.now {
            let key = self.owner[t];
            if key != NIL && self.last[key as usize] == t as u32 {
                keys.push(key);
            }
        }
        // The key being referenced right now is unmarked (its `last` is
        // NIL); the caller marks it at the new time.
        let cap = (2 * self.live).max(self.owner.len()).max(1024);
        assert!(cap < NIL as usize, "more than 2^31 distinct blocks");
        self.owner = vec![NIL; cap];
        for (t, &key) in keys.iter().enumerate() {
            self.owner[t] = key;
            self.last[key as usize] = t as u32;
        }
        self.tree = Fenwick::ones(cap, keys.len());
        self.now = keys.len();
    }
}

/// A histogram of stack distances and what it says about LRU.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DistanceHistogram {
    /// `counts[d]` = references at distance d (index 0 unused).
    pub counts: Vec<u64>,
    /// First references.
    pub cold: u64,
}

impl DistanceHistogram {
    #[inline]
    pub fn record(&mut self, d: Option<u64>) {
        match d {
            Some(d) => {
                let d = d as usize;
                if d >= self.counts.len() {
                    self.counts.resize((d + 1).max(self.counts.len() * 2), 0);
                }
                self.counts[d] += 1;
            }
            None => self.cold += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.cold + self.counts.iter().sum::<u64>()
    }

    /// LRU hits of a cache of `size` blocks.
    pub fn hits_at(&self, size: usize) -> u64 {
        self.counts.iter().take(size.saturating_add(1)).sum()
    }

    /// LRU hits at each of `sizes` (any order), in one sweep.
    pub fn hits_at_sizes(&self, sizes: &[usize]) -> Vec<u64> {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by_key(|&i| sizes[i]);
        let mut out = vec![0; sizes.len()];
        let mut acc = 0u64;
        let mut d = 0usize;
        for i in order {
            while d < self.counts.len() && d <= sizes[i] {
                acc += self.counts[d];
                d += 1;
            }
            out[i] = acc;
        }
        out
    }

    /// Largest finite distance seen (the cache size beyond which LRU has
    /// only cold misses).
    pub fn max_distance(&self) -> usize {
        self.counts.iter().rposition(|&c| c > 0).unwrap_or(0)
    }

    pub fn merge(&mut self, other: &DistanceHistogram) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.cold += other.cold;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Lcg;

    #[test]
    fn distances_by_hand() {
        let mut s = StackDistance::new();
        let d: Vec<Option<u64>> = [1u32, 2, 3, 1, 1, 3, 2, 4, 1]
            .iter()
            .map(|&k| s.access(k))
            .collect();
        assert_eq!(
            d,
            [
                None,
                None,
                None,
                Some(3),
                Some(1),
                Some(2),
                Some(3),
                None,
                Some(4)
            ]
        );
        assert_eq!(s.distinct(), 4);
    }

    #[test]
    fn compaction_keeps_distances() {
        // Far more references than the initial time axis.
        let mut s = StackDistance::new();
        let mut naive: Vec<u32> = Vec::new();
        let mut rng = Lcg(12345);
        for _ in 0..20_000 {
            let k = ((rng.next() >> 33) % 300) as u32;
            let want = naive
                .iter()
                .rev()
                .position(|&y| y == k)
                .map(|p| p as u64 + 1);
            if let Some(p) = naive.iter().position(|&y| y == k) {
                naive.remove(p);
            }
            naive.push(k);
            assert_eq!(s.access(k), want);
        }
    }

    #[test]
    fn histogram_queries() {
        let mut h = DistanceHistogram::default();
        for d in [None, Some(1), Some(3), Some(3), Some(10), None] {
            h.record(d);
        }
        assert_eq!(h.total(), 6);
        assert_eq!(h.hits_at(0), 0);
        assert_eq!(h.hits_at(2), 1);
        assert_eq!(h.hits_at(3), 3);
        assert_eq!(h.hits_at(1000), 4);
        assert_eq!(h.hits_at_sizes(&[1000, 3, 0, 2]), vec![4, 3, 0, 1]);
        assert_eq!(h.max_distance(), 10);
    }
}
