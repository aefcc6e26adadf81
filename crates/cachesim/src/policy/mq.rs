//! MQ, the Multi-Queue algorithm for second-level buffer caches — and the
//! engine FMPQ ([`super::fmpq`]) runs on.
//!
//! Source: Y. Zhou, J. F. Philbin and K. Li, "The Multi-Queue Replacement
//! Algorithm for Second Level Buffer Caches", USENIX ATC 2001, section 4.
//! `m` LRU queues Q0..Q(m−1) of resident blocks and a FIFO history Qout of
//! the ids and reference counts of recently evicted blocks:
//!
//! - a hit on b increments b's count f and moves b to the tail of
//!   Q(QueueNum(f)), QueueNum(f) = min(⌊log2 f⌋, m − 1);
//! - a miss evicts the head of the lowest non-empty queue, remembering
//!   its id and count at Qout's tail (dropping Qout's head when full); b
//!   gets the count remembered in Qout plus 1 (and leaves Qout), or 1;
//! - every block entering a queue gets expireTime = currentTime +
//!   lifeTime, time counting accesses; after each access, the head of
//!   each queue Qk (k ≥ 1) whose expireTime < currentTime moves to the
//!   tail of Q(k−1) with a fresh expireTime (its count is kept).
//!
//! The paper recommends m = 8 and Qout = 4 × the cache size, and sets
//! lifeTime to the peak temporal distance of the workload; our defaults are
//! `queues=8`, `qout=4x` and `lifetime=2x` (twice the capacity, in
//! accesses), all settable. O(m) per access with m a small constant.

use std::hash::Hash;

use super::base::{Amount, Outcome, Params, Policy, SpecError};
use crate::index::{HashIndex, KeyIndex};
use crate::list::{Arena, List};

/// Per-node payload: reference count and expiry (logical) time.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Meta {
    pub freq: u32,
    pub expire: u64,
}

/// MQ's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct MqConfig {
    /// Number of LRU queues (m).
    pub queues: usize,
    /// Qout's length in ids.
    pub qout: Amount,
    /// lifeTime in accesses.
    pub lifetime: Amount,
}

impl Default for MqConfig {
    fn default() -> Self {
        MqConfig {
            queues: 8,
            qout: Amount::Times(4.0),
            lifetime: Amount::Times(2.0),
        }
    }
}

impl MqConfig {
    pub(crate) fn from_params(p: &Params) -> Result<Self, SpecError> {
        let mut c = MqConfig::default();
        for (k, v) in p.iter() {
            match k.as_str() {
                "queues" | "m" => c.queues = queue_count(p, k, v)?,
                "qout" => c.qout = p.amount(k, v)?,
                "lifetime" => c.lifetime = p.amount(k, v)?,
                _ => return Err(p.unknown(k, "queues, qout, lifetime")),
            }
        }
        Ok(c)
    }
}

pub(crate) fn queue_count(p: &Params, k: &str, v: &str) -> Result<usize, SpecError> {
    let n = p.count(k, v)?;
    if n > MAX_QUEUES as u64 {
        return Err(p.bad(k, v, &format!("at most {MAX_QUEUES} queues")));
    }
    Ok(n as usize)
}

/// More queues than this would need counts beyond 2^32.
pub const MAX_QUEUES: usize = 32;

/// The multi-queue engine shared by MQ and FMPQ.
pub struct MultiQueue<K, I = HashIndex<K>> {
    label: &'static str,
    cap: usize,
    qout_cap: usize,
    lifetime: u64,
    now: u64,
    arena: Arena<K, Meta>,
    /// Queues 0..w are resident; index w is the history (ghost) FIFO.
    lists: Vec<List>,
    /// Expiry time of each resident queue's head (u64::MAX when empty),
    /// so the per-access demotion check reads no nodes.
    head_expire: Vec<u64>,
    resident: usize,
    index: I,
}

impl<K: Copy + Hash + Eq + Send> MultiQueue<K> {
    /// MQ with a hashed index.
    pub fn mq(capacity: usize, cfg: &MqConfig) -> Self {
        Self::mq_with_index(capacity, cfg)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> MultiQueue<K, I> {
    pub fn mq_with_index(capacity: usize, cfg: &MqConfig) -> Self {
        Self::build(
            "MQ",
            capacity,
            cfg.queues,
            cfg.qout.resolve(capacity) as usize,
            cfg.lifetime.resolve(capacity),
        )
    }

    pub(crate) fn build(
        label: &'static str,
        capacity: usize,
        queues: usize,
        qout: usize,
        lifetime: u64,
    ) -> Self {
        assert!(
            (1..=MAX_QUEUES).contains(&queues),
            "1..={MAX_QUEUES} queues"
        );
        let budget = capacity + qout + 2;
        MultiQueue {
            label,
            cap: capacity,
            qout_cap: qout,
            lifetime,
            now: 0,
            arena: Arena::with_budget(budget),
            lists: vec![List::default(); queues + 1],
            head_expire: vec![u64::MAX; queues],
            resident: 0,
            index: I::with_capacity(budget),
        }
    }

    fn w(&self) -> usize {
        self.lists.len() - 1
    }

    /// The queue a count maps to: ⌊log2 f⌋, at most w − 1.
    #[inline]
    pub fn queue_for(&self, freq: u32) -> usize {
        ((31 - freq.max(1).leading_zeros()) as usize).min(self.w() - 1)
    }

    /// The queue holding a resident key.
    pub fn queue_of(&self, key: &K) -> Option<usize> {
        self.index
            .get(key)
            .map(|i| self.arena.get(i).tag as usize)
            .filter(|&t| t < self.w())
    }

    /// A key's reference count, resident or remembered in the history.
    pub fn frequency(&self, key: &K) -> Option<u32> {
        self.index.get(key).map(|i| self.arena.get(i).x.freq)
    }

    /// Whether the history remembers `key`.
    pub fn in_history(&self, key: &K) -> bool {
        matches!(self.index.get(key), Some(i) if self.arena.get(i).tag as usize == self.w())
    }

    /// Resident keys of queue `q`, head first (tests).
    pub fn queue_keys(&self, q: usize) -> Vec<K> {
        self.arena.keys(&self.lists[q])
    }

    /// The logical time (accesses so far).
    pub fn now(&self) -> u64 {
        self.now
    }

    fn resident(&self) -> usize {
        self.resident
    }

    /// Take node `i` off resident queue `q`, keeping `head_expire`.
    #[inline]
    fn q_unlink(&mut self, q: usize, i: u32) {
        let was_head = self.lists[q].front == i;
        self.arena.unlink(&mut self.lists[q], i);
        self.resident -= 1;
        if was_head {
            let f = self.lists[q].front;
            self.head_expire[q] = if f == crate::index::NIL {
                u64::MAX
            } else {
                self.arena.get(f).x.expire
            };
        }
    }

    /// Append node `i` to resident queue `q` with a fresh expiry time.
    #[inline]
    fn enqueue(&mut self, i: u32, q: usize) {
        let expire = self.now + self.lifetime;
        self.arena.get_mut(i).x.expire = expire;
        if self.lists[q].len == 0 {
            self.head_expire[q] = expire;
        }
        self.arena.push_back(&mut self.lists[q], i, q as u8);
        self.resident += 1;
    }

    /// Evict the head of the lowest non-empty queue into the history.
    fn evict(&mut self) -> K {
        let w = self.w();
        let q = (0..w)
            .find(|&q| self.lists[q].len > 0)
            .expect("a full cache has a non-empty queue");
        let v = self.lists[q].front;
        let key = self.arena.get(v).key;
        self.q_unlink(q, v);
        self.arena.retire(
            v,
            &mut self.lists[w],
            w as u8,
            self.qout_cap,
            &mut self.index,
        );
        key
    }

    /// Demote expired queue heads one level.
    #[inline]
    fn adjust(&mut self) {
        for k in 1..self.w() {
            if self.head_expire[k] < self.now {
                let h = self.lists[k].front;
                self.q_unlink(k, h);
                self.enqueue(h, k - 1);
            }
        }
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> Policy<K> for MultiQueue<K, I> {
    fn name(&self) -> String {
        self.label.into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.resident()
    }
    fn contains(&self, key: &K) -> bool {
        self.queue_of(key).is_some()
    }

    fn access(&mut self, key: K) -> Outcome<K> {
        self.now += 1;
        if self.cap == 0 {
            return Outcome::Miss { evicted: None };
        }
        let w = self.w();
        let out = match self.index.get(&key) {
            Some(i) if (self.arena.get(i).tag as usize) < w => {
                let tag = self.arena.get(i).tag as usize;
                self.q_unlink(tag, i);
                let f = self.arena.get(i).x.freq.saturating_add(1);
                self.arena.get_mut(i).x.freq = f;
                let q = self.queue_for(f);
                self.enqueue(i, q);
                Outcome::Hit
            }
            found => {
                // A miss; `found` is a history entry if any.
                if let Some(i) = found {
                    self.arena.unlink(&mut self.lists[w], i);
                }
                let evicted = (self.resident() >= self.cap).then(|| self.evict());
                let i = match found {
                    Some(i) => {
                        let n = self.arena.get_mut(i);
                        n.x.freq = n.x.freq.saturating_add(1);
                        i
                    }
                    None => {
                        let i = self.arena.alloc(key, 0, Meta { freq: 1, expire: 0 });
                        self.index.insert(key, i);
                        i
                    }
                };
                let q = self.queue_for(self.arena.get(i).x.freq);
                self.enqueue(i, q);
                Outcome::Miss { evicted }
            }
        };
        self.adjust();
        out
    }

    fn remove(&mut self, key: &K) -> bool {
        match self.index.get(key) {
            Some(i) => {
                let tag = self.arena.get(i).tag as usize;
                if tag < self.w() {
                    self.q_unlink(tag, i);
                } else {
                    self.arena.unlink(&mut self.lists[tag], i);
                }
                self.arena.forget(&mut self.index, i);
                tag < self.w()
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_numbers_are_log2_capped() {
        let m = MultiQueue::<u32>::mq(4, &MqConfig::default());
        let q: Vec<usize> = [1u32, 2, 3, 4, 7, 8, 15, 16, 127, 128, 1 << 20]
            .iter()
            .map(|&f| m.queue_for(f))
            .collect();
        assert_eq!(q, [0, 1, 1, 2, 2, 3, 3, 4, 6, 7, 7]);
    }

    /// The MQ paper's section 4 example: "the 8th access to a block that
    /// is already in the second level buffer cache will promote this
    /// block from Q2 to Q3".
    #[test]
    fn eighth_access_promotes_q2_to_q3() {
        let cfg = MqConfig {
            lifetime: Amount::Blocks(1000),
            ..MqConfig::default()
        };
        let mut m = MultiQueue::mq(4, &cfg);
        for n in 1..=7 {
            m.access(9u32);
            assert_eq!(m.frequency(&9), Some(n));
        }
        assert_eq!(m.queue_of(&9), Some(2));
        m.access(9);
        assert_eq!(m.queue_of(&9), Some(3));
    }
}
