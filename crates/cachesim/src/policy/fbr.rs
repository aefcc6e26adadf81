//! FBR, Frequency-Based Replacement.
//!
//! Source: J. T. Robinson and M. V. Devarakonda, "Data Cache Management
//! Using Frequency-Based Replacement", ACM SIGMETRICS 1990 (TransCom's
//! reference [15]). Blocks sit on one LRU stack divided into three
//! sections: the **new** section (the most recently used blocks, a
//! fraction F_new of the cache), the **old** section (the least recently
//! used, F_old) and the **middle** section between them. Each block has a
//! reference count:
//!
//! - a miss loads the block at the top of the stack with count 1;
//! - a hit moves the block to the top; its count is incremented only if
//!   it was *not* in the new section — re-references within the new
//!   section are "locality" and factored out of the count;
//! - the victim is the block of the old section with the smallest count,
//!   the least recently used one among equals (the middle section gives
//!   blocks that left the new section time to earn counts before they can
//!   be replaced);
//! - counts are aged: when the average count of the resident blocks
//!   exceeds A_max, every count c becomes ⌈c/2⌉; counts saturate at C_max.
//!
//! The paper treats F_new, F_old, A_max and C_max as tuning parameters;
//! our defaults are `fnew=0.25`, `fold=0.5`, `amax=100`, `cmax=1024`.
//! Section boundaries move by one node per access (two boundary pointers)
//! and the old section is indexed by count (one chain per count, in LRU
//! order, plus a bitmap of non-empty chains), as in the paper's
//! implementation section, so an access is O(1) apart from the C_max/64
//! word bitmap scan and the amortised aging pass.

use std::hash::Hash;

use super::base::{Outcome, Params, Policy, SpecError};
use crate::index::{HashIndex, KeyIndex, NIL};
use crate::list::{Arena, List};

const NEW: u8 = 0;
const MIDDLE: u8 = 1;
const OLD: u8 = 2;

/// FBR's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FbrConfig {
    pub fnew: f64,
    pub fold: f64,
    pub amax: f64,
    pub cmax: u32,
}

impl Default for FbrConfig {
    fn default() -> Self {
        FbrConfig {
            fnew: 0.25,
            fold: 0.5,
            amax: 100.0,
            cmax: 1024,
        }
    }
}

impl FbrConfig {
    pub(crate) fn from_params(p: &Params) -> Result<Self, SpecError> {
        let mut c = FbrConfig::default();
        for (k, v) in p.iter() {
            match k.as_str() {
                "fnew" => c.fnew = p.fraction(k, v)?,
                "fold" => c.fold = p.fraction(k, v)?,
                "amax" => {
                    c.amax = p.ratio(k, v)?;
                    if c.amax < 1.0 {
                        return Err(p.bad(k, v, "an average count of at least 1"));
                    }
                }
                "cmax" => {
                    let n = p.count(k, v)?;
                    if n > 1 << 20 {
                        return Err(p.bad(k, v, "at most 1048576"));
                    }
                    c.cmax = n as u32;
                }
                _ => return Err(p.unknown(k, "fnew, fold, amax, cmax")),
            }
        }
        if c.fnew + c.fold > 1.0 {
            return Err(SpecError(format!(
                "FBR: fnew + fold = {} exceeds 1 (the sections must fit in the cache)",
                c.fnew + c.fold
            )));
        }
        Ok(c)
    }
}

/// Per-node payload: count and the links of its count chain.
#[derive(Clone, Copy, Debug)]
struct Meta {
    count: u32,
    cprev: u32,
    cnext: u32,
}

pub struct Fbr<K, I = HashIndex<K>> {
    cap: usize,
    n_new: usize,
    n_mid: usize,
    amax: f64,
    cmax: u32,
    arena: Arena<K, Meta>,
    /// The LRU stack: front = least recently used.
    stack: List,
    /// Lowest node of the new section / of the middle section.
    new_low: u32,
    mid_low: u32,
    new_len: usize,
    mid_len: usize,
    old_len: usize,
    /// Old-section chains by count (index 1..=cmax), LRU first.
    chains: Vec<List>,
    nonempty: Vec<u64>,
    total: u64,
    index: I,
}

impl<K: Copy + Hash + Eq + Send> Fbr<K> {
    pub fn new(capacity: usize, cfg: &FbrConfig) -> Self {
        Self::with_index(capacity, cfg)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Fbr<K, I> {
    pub fn with_index(capacity: usize, cfg: &FbrConfig) -> Self {
        let n_new = ((capacity as f64 * cfg.fnew) as usize).max(1).min(capacity);
        let n_old = ((capacity as f64 * cfg.fold) as usize).max(1);
        let n_mid = capacity.saturating_sub(n_new + n_old);
        let cmax = cfg.cmax.max(1);
        Fbr {
            cap: capacity,
            n_new,
            n_mid,
            amax: cfg.amax,
            cmax,
            arena: Arena::with_budget(capacity + 1),
            stack: List::default(),
            new_low: NIL,
            mid_low: NIL,
            new_len: 0,
            mid_len: 0,
            old_len: 0,
            chains: vec![List::default(); cmax as usize + 1],
            nonempty: vec![0; (cmax as usize + 1).div_ceil(64)],
            total: 0,
            index: I::with_capacity(capacity + 1),
        }
    }

    /// Keys with (count, section) from the top of the stack down (tests):
    /// section 0 = new, 1 = middle, 2 = old.
    pub fn stack_top_down(&self) -> Vec<(K, u32, u8)> {
        let mut out = Vec::new();
        let mut i = self.stack.back;
        while i != NIL {
            let n = self.arena.get(i);
            out.push((n.key, n.x.count, n.tag));
            i = n.prev;
        }
        out
    }

    // --- old-section count chains -------------------------------------

    fn chain_push(&mut self, i: u32) {
        let c = self.arena.get(i).x.count as usize;
        let l = &mut self.chains[c];
        let back = l.back;
        {
            let m = &mut self.arena.get_mut(i).x;
            m.cprev = back;
            m.cnext = NIL;
        }
        if back != NIL {
            self.arena.get_mut(back).x.cnext = i;
        } else {
            l.front = i;
            self.nonempty[c / 64] |= 1 << (c % 64);
        }
        l.back = i;
        l.len += 1;
    }

    fn chain_unlink(&mut self, i: u32) {
        let Meta {
            count,
            cprev,
            cnext,
        } = self.arena.get(i).x;
        let c = count as usize;
        if cprev != NIL {
            self.arena.get_mut(cprev).x.cnext = cnext;
        } else {
            self.chains[c].front = cnext;
        }
        if cnext != NIL {
            self.arena.get_mut(cnext).x.cprev = cprev;
        } else {
            self.chains[c].back = cprev;
        }
        self.chains[c].len -= 1;
        if self.chains[c].len == 0 {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
    }

    /// The old-section block with the smallest count, LRU among equals.
    fn victim(&self) -> u32 {
        for (w, &bits) in self.nonempty.iter().enumerate() {
            if bits != 0 {
                let c = w * 64 + bits.trailing_zeros() as usize;
                return self.chains[c].front;
            }
        }
        // No old section (tiny caches): plain LRU.
        self.stack.front
    }

    // --- sections -------------------------------------------------------

    /// Take node `i` out of the stack and its section.
    fn take(&mut self, i: u32) {
        let sec = self.arena.get(i).tag;
        let above = self.arena.get(i).next;
        match sec {
            NEW => {
                self.new_len -= 1;
                if self.new_low == i {
                    self.new_low = if self.new_len > 0 { above } else { NIL };
                }
            }
            MIDDLE => {
                self.mid_len -= 1;
                if self.mid_low == i {
                    self.mid_low = if self.mid_len > 0 { above } else { NIL };
                }
            }
            _ => {
                self.old_len -= 1;
                self.chain_unlink(i);
            }
        }
        self.arena.unlink(&mut self.stack, i);
    }

    /// Take node `i` out of the stack, its section, the total count and
    /// the index, and free it; returns its key.
    fn drop_node(&mut self, i: u32) -> K {
        self.take(i);
        self.total -= self.arena.get(i).x.count as u64;
        self.arena.forget(&mut self.index, i)
    }

    /// Put node `i` on top of the stack in the new section and push the
    /// overflow down the sections.
    fn put_on_top(&mut self, i: u32) {
        self.arena.push_back(&mut self.stack, i, NEW);
        self.new_len += 1;
        if self.new_low == NIL {
            self.new_low = i;
        }
        if self.new_len > self.n_new {
            let d = self.new_low;
            self.new_low = self.arena.get(d).next;
            self.new_len -= 1;
            self.arena.get_mut(d).tag = MIDDLE;
            self.mid_len += 1;
            if self.mid_low == NIL {
                self.mid_low = d;
            }
        }
        if self.mid_len > self.n_mid {
            let d = self.mid_low;
            self.mid_len -= 1;
            self.mid_low = if self.mid_len > 0 {
                self.arena.get(d).next
            } else {
                NIL
            };
            self.arena.get_mut(d).tag = OLD;
            self.old_len += 1;
            self.chain_push(d);
        }
    }

    /// Halve every count (rounding up) and rebuild the old chains.
    fn age(&mut self) {
        for c in self.chains.iter_mut() {
            *c = List::default();
        }
        self.nonempty.iter_mut().for_each(|w| *w = 0);
        self.total = 0;
        let mut i = self.stack.front;
        while i != NIL {
            let (next, tag) = {
                let n = self.arena.get_mut(i);
                n.x.count = n.x.count.div_ceil(2);
                (n.next, n.tag)
            };
            self.total += self.arena.get(i).x.count as u64;
            if tag == OLD {
                self.chain_push(i);
            }
            i = next;
        }
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Policy<K> for Fbr<K, I> {
    fn name(&self) -> String {
        "FBR".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.stack.len
    }
    fn contains(&self, key: &K) -> bool {
        self.index.get(key).is_some()
    }

    fn access(&mut self, key: K) -> Outcome<K> {
        if self.cap == 0 {
            return Outcome::Miss { evicted: None };
        }
        if let Some(i) = self.index.get(&key) {
            let was_new = self.arena.get(i).tag == NEW;
            self.take(i);
            if !was_new && self.arena.get(i).x.count < self.cmax {
                self.arena.get_mut(i).x.count += 1;
                self.total += 1;
            }
            self.put_on_top(i);
            if self.total as f64 > self.amax * self.stack.len as f64 {
                self.age();
            }
            return Outcome::Hit;
        }
        let mut evicted = None;
        if self.stack.len >= self.cap {
            evicted = Some(self.drop_node(self.victim()));
        }
        let i = self.arena.alloc(
            key,
            NEW,
            Meta {
                count: 1,
                cprev: NIL,
                cnext: NIL,
            },
        );
        self.index.insert(key, i);
        self.total += 1;
        self.put_on_top(i);
        Outcome::Miss { evicted }
    }

    fn remove(&mut self, key: &K) -> bool {
        match self.index.get(key) {
            Some(i) => {
                // Removing from the middle of a section leaves the
                // sections one short until the next accesses refill them
                // from above, which is what a trimmed block should do.
                self.drop_node(i);
                // Restore the invariant that sections fill top-down.
                self.rebalance_after_remove();
                true
            }
            None => false,
        }
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Fbr<K, I> {
    /// After a removal, pull nodes up so the new and middle sections are
    /// full before the old one has any.
    fn rebalance_after_remove(&mut self) {
        // Middle short while old non-empty: promote the top old node.
        while self.mid_len < self.n_mid && self.old_len > 0 {
            let top_old = if self.mid_low != NIL {
                self.arena.get(self.mid_low).prev
            } else if self.new_low != NIL {
                self.arena.get(self.new_low).prev
            } else {
                self.stack.back
            };
            self.chain_unlink(top_old);
            self.old_len -= 1;
            self.arena.get_mut(top_old).tag = MIDDLE;
            self.mid_len += 1;
            self.mid_low = top_old;
        }
        while self.new_len < self.n_new && self.mid_len > 0 {
            let top_mid = if self.new_low != NIL {
                self.arena.get(self.new_low).prev
            } else {
                self.stack.back
            };
            self.mid_len -= 1;
            if self.mid_low == top_mid {
                self.mid_low = NIL;
            }
            self.arena.get_mut(top_mid).tag = NEW;
            self.new_len += 1;
            self.new_low = top_mid;
            // Refill the middle from the old section.
            if self.old_len > 0 && self.mid_len < self.n_mid {
                let top_old = if self.mid_low != NIL {
                    self.arena.get(self.mid_low).prev
                } else {
                    self.arena.get(self.new_low).prev
                };
                self.chain_unlink(top_old);
                self.old_len -= 1;
                self.arena.get_mut(top_old).tag = MIDDLE;
                self.mid_len += 1;
                self.mid_low = top_old;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fbr(cap: usize, fnew: f64, fold: f64) -> Fbr<u32> {
        Fbr::new(
            cap,
            &FbrConfig {
                fnew,
                fold,
                amax: 100.0,
                cmax: 1024,
            },
        )
    }

    /// Hand-worked with 4 frames: new = 1, old = 2, middle = 1.
    #[test]
    fn counts_factor_out_locality_and_old_section_picks_min_count() {
        let mut f = fbr(4, 0.25, 0.5);
        for k in 1..=4 {
            f.access(k);
        }
        // Stack top-down 4 3 2 1: 4 new, 3 middle, 2 and 1 old.
        assert_eq!(
            f.stack_top_down(),
            vec![(4, 1, NEW), (3, 1, MIDDLE), (2, 1, OLD), (1, 1, OLD)]
        );
        // Re-referencing 4 while it is in the new section: no count.
        assert!(f.access(4).is_hit());
        assert_eq!(f.stack_top_down()[0], (4, 1, NEW));
        // 1 from the old section: count 2, back on top; the sections
        // shift down by one.
        assert!(f.access(1).is_hit());
        assert_eq!(
            f.stack_top_down(),
            vec![(1, 2, NEW), (4, 1, MIDDLE), (3, 1, OLD), (2, 1, OLD)]
        );
        // 5 misses: the old section holds 3 and 2, both count 1; the LRU
        // one (2) goes.
        assert_eq!(f.access(5), Outcome::Miss { evicted: Some(2) });
        assert_eq!(
            f.stack_top_down(),
            vec![(5, 1, NEW), (1, 2, MIDDLE), (4, 1, OLD), (3, 1, OLD)]
        );
        // 6: old = {4 (count 1), 3 (count 1)}: 3 is the LRU → evicted; 1
        // (count 2) drops into the old section.
        assert_eq!(f.access(6), Outcome::Miss { evicted: Some(3) });
        assert_eq!(
            f.stack_top_down(),
            vec![(6, 1, NEW), (5, 1, MIDDLE), (1, 2, OLD), (4, 1, OLD)]
        );
        // 7: old = {1 (count 2), 4 (count 1)}: 4 has the smaller count.
        assert_eq!(f.access(7), Outcome::Miss { evicted: Some(4) });
        // 8: old = {5 (1), 1 (2)}: 5 has the smaller count and goes, even
        // though 1 is less recently used.
        assert_eq!(f.access(8), Outcome::Miss { evicted: Some(5) });
        assert!(f.contains(&1));
        assert_eq!(
            f.stack_top_down(),
            vec![(8, 1, NEW), (7, 1, MIDDLE), (6, 1, OLD), (1, 2, OLD)]
        );
    }

    #[test]
    fn aging_halves_counts_when_the_average_exceeds_amax() {
        let mut f = Fbr::new(
            2,
            &FbrConfig {
                fnew: 0.5,
                fold: 0.5,
                amax: 2.0,
                cmax: 1024,
            },
        );
        f.access(1u32);
        f.access(2);
        // Alternate: each hit comes from the old section and counts.
        f.access(1); // count(1) = 2, total 3
        f.access(2); // count(2) = 2, total 4 = 2 × 2, not above
        assert_eq!(f.stack_top_down(), vec![(2, 2, NEW), (1, 2, OLD)]);
        f.access(1); // count(1) = 3, total 5 > 4 → age: ⌈3/2⌉ = 2, ⌈2/2⌉ = 1
        assert_eq!(f.stack_top_down(), vec![(1, 2, NEW), (2, 1, OLD)]);
    }

    #[test]
    fn remove_keeps_sections_filled_top_down() {
        let mut f = fbr(8, 0.25, 0.5); // new 2, middle 2, old 4
        for k in 1..=8 {
            f.access(k);
        }
        assert!(f.remove(&8)); // from the new section
        assert!(f.remove(&5)); // from the middle section
        let secs: Vec<u8> = f.stack_top_down().iter().map(|e| e.2).collect();
        assert_eq!(secs, vec![NEW, NEW, MIDDLE, MIDDLE, OLD, OLD]);
        for k in 9..=20 {
            f.access(k);
        }
        let secs: Vec<u8> = f.stack_top_down().iter().map(|e| e.2).collect();
        assert_eq!(secs, vec![NEW, NEW, MIDDLE, MIDDLE, OLD, OLD, OLD, OLD]);
    }
}
