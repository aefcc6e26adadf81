//! The policies made of a few tagged lists (LRU, 2Q, ARC, S3-FIFO).
//!
//! Such a policy keeps its capacity, one node arena, `N` lists (list `t`
//! holds the nodes tagged `t`) and a key index; the first lists hold
//! resident blocks, the others ghosts (ids of evicted blocks). [`Tagged`]
//! is that state, and does the [`Policy`] bookkeeping once for all of
//! them: name, capacity, resident count, membership and removal (ghosts
//! not counting), and the cache of zero blocks. A policy adds a [`Rule`]:
//! its own state and what an access does. FBR (one stack cut into moving
//! sections) and the multi-queue engine of MQ/FMPQ (a variable number of
//! queues with expiring heads) keep their own bookkeeping.

use super::base::{Outcome, Policy};
use crate::index::KeyIndex;
use crate::list::{Arena, List};

/// What a policy on [`Tagged`] lists adds: its name, how many of its
/// lists hold resident blocks, and what an access does. `Self` holds the
/// policy's own state (thresholds, targets...); `X` is the per-node
/// payload.
pub trait Rule<const N: usize, X = ()>: Sized + Send {
    const NAME: &'static str;
    /// Lists `0..RESIDENT` hold resident blocks, the others ghosts.
    const RESIDENT: u8;
    /// [`Policy::access`] in a cache of at least one block.
    fn access<K: Copy + Send, I: KeyIndex<K>>(
        p: &mut Tagged<K, I, Self, N, X>,
        key: K,
    ) -> Outcome<K>;
}

/// A policy of `N` tagged lists over keys `K` with index `I`, following
/// rule `R` (see the module documentation).
pub struct Tagged<K, I, R, const N: usize, X = ()> {
    pub(crate) cap: usize,
    pub(crate) arena: Arena<K, X>,
    pub(crate) lists: [List; N],
    pub(crate) index: I,
    pub(crate) rule: R,
}

impl<K: Copy, I: KeyIndex<K>, R: Rule<N, X>, const N: usize, X: Copy> Tagged<K, I, R, N, X> {
    /// A cache of `capacity` blocks with room for `budget` nodes,
    /// resident and ghost.
    pub(crate) fn build(capacity: usize, budget: usize, rule: R) -> Self {
        Tagged {
            cap: capacity,
            arena: Arena::with_budget(budget),
            lists: [List::default(); N],
            index: I::with_capacity(budget),
            rule,
        }
    }

    /// The number of resident blocks.
    #[inline]
    pub(crate) fn resident(&self) -> usize {
        self.lists[..R::RESIDENT as usize]
            .iter()
            .map(|l| l.len)
            .sum()
    }

    /// Drop the oldest node of list `t` (which must not be empty);
    /// returns its key.
    #[inline]
    pub(crate) fn drop_front(&mut self, t: u8) -> K {
        self.arena
            .pop_front(&mut self.lists[t as usize], &mut self.index)
    }

    /// The keys of every list, oldest first (tests).
    pub(crate) fn keys(&self) -> [Vec<K>; N] {
        std::array::from_fn(|t| self.arena.keys(&self.lists[t]))
    }
}

impl<K, I, R, const N: usize, X> Policy<K> for Tagged<K, I, R, N, X>
where
    K: Copy + Send,
    I: KeyIndex<K>,
    R: Rule<N, X>,
    X: Copy + Send,
{
    fn name(&self) -> String {
        R::NAME.into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.resident()
    }
    fn contains(&self, key: &K) -> bool {
        matches!(self.index.get(key), Some(i) if self.arena.get(i).tag < R::RESIDENT)
    }

    #[inline]
    fn access(&mut self, key: K) -> Outcome<K> {
        if self.cap == 0 {
            return Outcome::Miss { evicted: None };
        }
        R::access(self, key)
    }

    fn remove(&mut self, key: &K) -> bool {
        self.arena
            .remove_keyed(&mut self.lists, &mut self.index, key)
            .is_some_and(|t| t < R::RESIDENT)
    }
}
