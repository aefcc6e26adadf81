//! Where a chunk goes in the slot file (the slot layout,
//! `docs/formats/cas-shared-cache.md` "Version 3: slot files"). Only the
//! holder of the cache's lock allocates, and its choice is written in the
//! insert record, so every process knows where a chunk is without
//! allocating itself. Pure bookkeeping, no I/O.
//!
//! A chunk takes [`granules`]`(size)` granules (a power of two) aligned to
//! that count inside one slot (a buddy system per slot). The policy holds
//! at most `cap` chunks and every chunk lies in one slot, so while fewer
//! than `cap` chunks are resident at most that many slots are in use and
//! a wholly free slot below `cap` exists: the file never grows past the
//! byte cap. Granules freed by an evict that no sync record covers yet are
//! *pending*: not reused until [`Allocator::settle`] (after the sync), so
//! a power cut that loses the evict cannot leave a surviving insert record
//! naming bytes another chunk overwrote.
//!
//! Preference, for a hoard's or a read-ahead's chunks to land side by
//! side (one `pread` for a read across two of them): the granules right
//! after the previous allocation; then a free aligned run in a partly used
//! slot (the lowest); then the lowest free slot.

use std::collections::BTreeSet;

use super::journal2::{granules, Geometry, Place};

/// Why nothing was allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// Room is pending: sync, [`Allocator::settle`], and ask again.
    NeedSync,
    /// Every slot below the cap is in use (the policy must evict first).
    Full,
}

pub struct Allocator {
    geo: Geometry,
    /// Per slot, a bit per granule in use or pending.
    used: Vec<u64>,
    /// Granules freed by evicts no sync covers yet.
    pending: Vec<(Place, u32)>,
    /// Wholly free slots below `extent`.
    empty: BTreeSet<u32>,
    /// Partly used slots with a free aligned run of `1 << k` granules, by
    /// `k` (for runs shorter than a slot).
    runs: Vec<BTreeSet<u32>>,
    /// Slots below this have been used (the file holds at least them).
    extent: u32,
    /// Slots the cap allows.
    cap: u32,
    /// Where the previous allocation ended.
    cursor: Option<Place>,
}

impl Allocator {
    /// An empty slot file of at most `cap` slots.
    pub fn new(geo: Geometry, cap: u32) -> Allocator {
        let orders = geo.granules().trailing_zeros() as usize;
        Allocator {
            geo,
            used: Vec::new(),
            pending: Vec::new(),
            empty: BTreeSet::new(),
            runs: vec![BTreeSet::new(); orders],
            extent: 0,
            cap,
            cursor: None,
        }
    }

    /// Slots the file must hold (every slot below is or was in use).
    pub fn extent(&self) -> u32 {
        self.extent
    }

    /// Granules pending a sync.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// A place for a chunk of `size` bytes (1..=unit), now in use.
    pub fn alloc(&mut self, size: u32) -> Result<Place, NoRoom> {
        let n = granules(size);
        debug_assert!(n >= 1 && n <= self.geo.granules(), "{size}");
        let at = self
            .after_cursor(n)
            .or_else(|| self.in_partial(n))
            .or_else(|| self.empty_slot().map(|slot| Place { slot, gran: 0 }));
        match at {
            Some(at) => {
                self.mark(at, n, true);
                self.cursor = Some(Place {
                    slot: at.slot,
                    gran: at.gran + n as u16,
                });
                Ok(at)
            }
            None if self.pending.is_empty() => Err(NoRoom::Full),
            None => Err(NoRoom::NeedSync),
        }
    }

    /// Mark a chunk's place in use as a journal names it (replay). False
    /// if it overlaps a chunk already placed or lies past the cap: the
    /// record cannot be right.
    pub fn take(&mut self, at: Place, size: u32) -> bool {
        let n = granules(size);
        if at.slot >= self.cap || !self.geo.fits(size, at) || !self.is_free(at, n) {
            return false;
        }
        self.mark(at, n, true);
        true
    }

    /// The chunk at `at` left. With `settled` (its evict record is
    /// durable) the granules are free at once, else once [`Self::settle`]
    /// runs.
    pub fn free(&mut self, at: Place, size: u32, settled: bool) {
        let n = granules(size);
        if settled {
            self.mark(at, n, false);
        } else {
            self.pending.push((at, n));
        }
    }

    /// Every evict so far is durable: its granules may be reused.
    pub fn settle(&mut self) {
        for (at, n) in std::mem::take(&mut self.pending) {
            self.mark(at, n, false);
        }
    }

    fn full(&self) -> u64 {
        run_mask(self.geo.granules(), 0)
    }

    fn mask(&self, slot: u32) -> u64 {
        self.used.get(slot as usize).copied().unwrap_or(0)
    }

    fn is_free(&self, at: Place, n: u32) -> bool {
        self.mask(at.slot) & run_mask(n, at.gran as u32) == 0
    }

    /// Set or clear the granules of `n` at `at`, and file the slot again.
    fn mark(&mut self, at: Place, n: u32, used: bool) {
        let s = at.slot as usize;
        if s >= self.used.len() {
            self.used.resize(s + 1, 0);
        }
        while self.extent <= at.slot {
            // Slots skipped over are free (a journal may name a high slot
            // first at replay).
            self.empty.insert(self.extent);
            self.extent += 1;
        }
        let bits = run_mask(n, at.gran as u32);
        debug_assert_eq!(self.used[s] & bits, if used { 0 } else { bits });
        if used {
            self.used[s] |= bits;
        } else {
            self.used[s] &= !bits;
        }
        self.file(at.slot);
    }

    /// Put `slot` in the sets its mask says.
    fn file(&mut self, slot: u32) {
        let m = self.mask(slot);
        let g = self.geo.granules();
        let full = self.full();
        if m == 0 {
            self.empty.insert(slot);
        } else {
            self.empty.remove(&slot);
        }
        for (k, set) in self.runs.iter_mut().enumerate() {
            let n = 1u32 << k;
            let has = m != 0
                && m != full
                && (0..g)
                    .step_by(n as usize)
                    .any(|at| m & run_mask(n, at) == 0);
            if has {
                set.insert(slot);
            } else {
                set.remove(&slot);
            }
        }
    }

    /// The granules right after the previous allocation, if free.
    fn after_cursor(&self, n: u32) -> Option<Place> {
        let c = self.cursor?;
        let g = self.geo.granules();
        let at = if (c.gran as u32) < g {
            c
        } else {
            Place {
                slot: c.slot + 1,
                gran: 0,
            }
        };
        let ok = at.slot < self.cap
            && (at.gran as u32).is_multiple_of(n)
            && at.gran as u32 + n <= g
            && self.is_free(at, n);
        ok.then_some(at)
    }

    /// The first free aligned run of `n` in the lowest partly used slot
    /// that has one.
    fn in_partial(&self, n: u32) -> Option<Place> {
        let k = n.trailing_zeros() as usize;
        let slot = *self.runs.get(k)?.first()?;
        let m = self.mask(slot);
        let gran = (0..self.geo.granules())
            .step_by(n as usize)
            .find(|&at| m & run_mask(n, at) == 0)?;
        Some(Place {
            slot,
            gran: gran as u16,
        })
    }

    /// The lowest wholly free slot below the cap.
    fn empty_slot(&self) -> Option<u32> {
        match self.empty.first() {
            Some(&s) if s < self.cap => Some(s),
            _ => (self.extent < self.cap).then_some(self.extent),
        }
    }
}

/// The bits of `n` granules from granule `at`.
fn run_mask(n: u32, at: u32) -> u64 {
    let ones = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    ones << at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const G: Geometry = Geometry { unit: 65536 };

    #[test]
    fn chunks_in_a_row_land_side_by_side() {
        let mut a = Allocator::new(G, 8);
        let slots: Vec<u32> = (0..8).map(|_| a.alloc(65536).unwrap().slot).collect();
        assert_eq!(slots, (0..8).collect::<Vec<_>>());
        assert_eq!(a.alloc(4096), Err(NoRoom::Full));
        assert_eq!(a.extent(), 8);
        // 16 KiB chunks pack four to a slot, in order.
        let mut a = Allocator::new(G, 8);
        let places: Vec<(u32, u16)> = (0..6)
            .map(|_| a.alloc(16384).map(|p| (p.slot, p.gran)).unwrap())
            .collect();
        assert_eq!(places, [(0, 0), (0, 4), (0, 8), (0, 12), (1, 0), (1, 4)]);
        // A 3 KiB tail takes one granule; then the run goes on aligned.
        assert_eq!(a.alloc(3072).map(|p| (p.slot, p.gran)), Ok((1, 8)));
        assert_eq!(a.alloc(16384).map(|p| (p.slot, p.gran)), Ok((1, 12)));
    }

    #[test]
    fn freed_granules_wait_for_the_sync_then_are_reused() {
        let mut a = Allocator::new(G, 2);
        let x = a.alloc(65536).unwrap();
        a.alloc(65536).unwrap();
        a.free(x, 65536, false);
        assert_eq!(a.alloc(65536), Err(NoRoom::NeedSync));
        a.settle();
        assert_eq!(a.alloc(65536), Ok(x));
        assert_eq!(a.extent(), 2);
    }

    #[test]
    fn replay_takes_what_the_journal_names_and_refuses_overlaps() {
        let mut a = Allocator::new(G, 4);
        assert!(a.take(Place { slot: 2, gran: 4 }, 16384));
        assert!(!a.take(Place { slot: 2, gran: 4 }, 4096), "overlap");
        assert!(!a.take(Place { slot: 2, gran: 2 }, 16384), "unaligned");
        assert!(!a.take(Place { slot: 4, gran: 0 }, 4096), "past the cap");
        assert_eq!(a.extent(), 3);
        // Slots 0 and 1, skipped over, are free; the partly used slot 2
        // takes small chunks first.
        assert_eq!(a.alloc(4096), Ok(Place { slot: 2, gran: 0 }));
        assert_eq!(a.alloc(65536).map(|p| p.slot), Ok(0));
    }

    proptest! {
        /// Any mix of sizes, frees and syncs: no two chunks share a
        /// granule, nothing lies past the cap, and a chunk always finds
        /// room while fewer than `cap` are resident and nothing is pending.
        #[test]
        fn places_never_overlap_and_the_cap_always_has_room(
            cap in 1u32..12,
            ops in proptest::collection::vec((0u8..4, 1u32..=65536, any::<u16>()), 1..300),
        ) {
            let mut a = Allocator::new(G, cap);
            let mut live: Vec<(Place, u32)> = Vec::new();
            let mut pending = 0usize;
            for (op, size, pick) in ops {
                match op {
                    0 | 1 => {
                        let r = a.alloc(size);
                        match r {
                            Ok(at) => {
                                prop_assert!(at.slot < cap);
                                prop_assert!(G.fits(size, at));
                                live.push((at, size));
                            }
                            Err(NoRoom::Full) => prop_assert!(live.len() + pending >= cap as usize),
                            Err(NoRoom::NeedSync) => prop_assert!(pending > 0),
                        }
                        if live.len() < cap as usize && pending == 0 {
                            prop_assert!(r.is_ok(), "room below the cap: {r:?}");
                        }
                    }
                    2 if !live.is_empty() => {
                        let (at, size) = live.swap_remove(pick as usize % live.len());
                        let settled = pick % 3 == 0;
                        a.free(at, size, settled);
                        pending += !settled as usize;
                    }
                    _ => {
                        a.settle();
                        pending = 0;
                    }
                }
                let mut owner: HashMap<(u32, u32), usize> = HashMap::new();
                for (i, (at, size)) in live.iter().enumerate() {
                    for g in 0..granules(*size) {
                        let prev = owner.insert((at.slot, at.gran as u32 + g), i);
                        prop_assert!(prev.is_none(), "granule {g} of {at:?} shared");
                    }
                }
                prop_assert!(a.extent() <= cap);
            }
        }
    }
}
