//! FMPQ, Frequency-based Multi-Priority Queues: TransCom's server cache
//! policy.
//!
//! Source: Y. Gao, Y. Zhang and Y. Zhou, "Performance Analysis and
//! Improvement of Storage Virtualization in an OS-Online System" (the
//! TransCom seed), section 5.3. As specified there:
//!
//! - w LRU queues Q0..Q(w−1); blocks in higher queues live longer;
//! - QCount(g) = log2 g puts a block with access frequency g on queue
//!   Q(QCount(g)) — "the block P is accessed eighth times, and then P will
//!   be upgraded from the Q2 queue to the Q3 queue", so QCount is
//!   ⌊log2 g⌋; frequencies beyond 2^(w−1) stay on Q(w−1);
//! - a hit removes the block from its queue and appends it to
//!   Q(QCount(g)) with its new frequency;
//! - a miss evicts the head of Q0, or of the lowest non-empty queue, and
//!   appends the victim's id and frequency to the history FIFO Q_off
//!   (dropping its oldest record when full); the missed block gets "the
//!   record value of the access frequency in Q_off plus 1" if Q_off
//!   remembers it, else 1;
//! - "when a block enters a LRU queue, OverTime is set to be NowTime +
//!   DurationTime", time being the access count; "when an access happens,
//!   FMPQ compares OverTime of the head block of the queue with NowTime.
//!   If OverTime is less than NowTime, the block will be moved to the end
//!   of the next level queue and the value of its OverTime will be reset"
//!   — up to w − 1 heads checked per access, O(1) for a small w.
//!
//! This is, sentence for sentence, the MQ algorithm of Zhou, Philbin and
//! Li ([`super::mq`]); the seed does not cite MQ, but its section 5.3
//! follows MQ's section 4 (even the 8th-access example). So one engine,
//! [`MultiQueue`], runs both; what the seed adds is the parameterisation —
//! w, |Q_off| and DurationTime as fixed, user-set parameters (MQ adapts
//! lifeTime to the workload's peak temporal distance). The seed gives no
//! values; our defaults `w=8`, `qoff=4x` (4 × capacity) and
//! `duration=4x` (4 × capacity, in accesses) were chosen on the
//! TransCom-like trace (docs/BENCHMARKS.md, issue 7 section).

use std::hash::Hash;

use super::base::{Amount, Params, SpecError};
use super::mq::{queue_count, MultiQueue};
use crate::index::KeyIndex;

/// FMPQ's parameters: w, |Q_off| and DurationTime.
#[derive(Clone, Debug, PartialEq)]
pub struct FmpqConfig {
    /// Number of LRU queues.
    pub w: usize,
    /// Q_off's length in ids.
    pub qoff: Amount,
    /// DurationTime in accesses.
    pub duration: Amount,
}

impl Default for FmpqConfig {
    fn default() -> Self {
        FmpqConfig {
            w: 8,
            qoff: Amount::Times(4.0),
            duration: Amount::Times(4.0),
        }
    }
}

impl FmpqConfig {
    pub(crate) fn from_params(p: &Params) -> Result<Self, SpecError> {
        let mut c = FmpqConfig::default();
        for (k, v) in p.iter() {
            match k.as_str() {
                "w" => c.w = queue_count(p, k, v)?,
                "qoff" => c.qoff = p.amount(k, v)?,
                "duration" => c.duration = p.amount(k, v)?,
                _ => return Err(p.unknown(k, "w, qoff, duration")),
            }
        }
        Ok(c)
    }
}

/// FMPQ is the multi-queue engine with the seed's parameters.
pub type Fmpq<K, I = crate::index::HashIndex<K>> = MultiQueue<K, I>;

impl<K: Copy + Hash + Eq + Send> MultiQueue<K> {
    /// FMPQ with a hashed index.
    pub fn fmpq(capacity: usize, cfg: &FmpqConfig) -> Self {
        Self::fmpq_with_index(capacity, cfg)
    }
}

impl<K: Copy + Send, I: KeyIndex<K>> MultiQueue<K, I> {
    pub fn fmpq_with_index(capacity: usize, cfg: &FmpqConfig) -> Self {
        Self::build(
            "FMPQ",
            capacity,
            cfg.w,
            cfg.qoff.resolve(capacity) as usize,
            cfg.duration.resolve(capacity),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Outcome, Policy};

    fn fmpq(cap: usize, w: usize, qoff: u64, duration: u64) -> Fmpq<u32> {
        MultiQueue::fmpq(
            cap,
            &FmpqConfig {
                w,
                qoff: Amount::Blocks(qoff),
                duration: Amount::Blocks(duration),
            },
        )
    }

    /// Seed: "the block P is accessed eighth times, and then P will be
    /// upgraded from the Q2 queue to the Q3 queue".
    #[test]
    fn eighth_access_moves_q2_to_q3() {
        let mut f = fmpq(8, 4, 8, 1000);
        let mut queues = Vec::new();
        for _ in 0..8 {
            f.access(7);
            queues.push(f.queue_of(&7).unwrap());
        }
        // g = 1..8 → QCount = 0 1 1 2 2 2 2 3.
        assert_eq!(queues, [0, 1, 1, 2, 2, 2, 2, 3]);
        assert_eq!(f.frequency(&7), Some(8));
    }

    /// Seed: an evicted block's id and frequency go to Q_off; "if the
    /// request block P is in the Q_off records ... its frequency g is set
    /// to be the record value of the access frequency in Q_off plus 1".
    #[test]
    fn q_off_restores_frequency_plus_one() {
        // One frame, so every miss evicts.
        let mut g = fmpq(1, 4, 4, 1000);
        for _ in 0..3 {
            g.access(1); // g = 3, on Q1
        }
        assert_eq!(g.queue_of(&1), Some(1));
        // Q0 is empty, so the victim is the head of Q1.
        assert_eq!(g.access(2), Outcome::Miss { evicted: Some(1) });
        assert!(g.in_history(&1));
        assert_eq!(g.frequency(&1), Some(3), "Q_off remembers g = 3");
        assert_eq!(g.access(1), Outcome::Miss { evicted: Some(2) });
        assert_eq!(g.frequency(&1), Some(4), "restored as 3 + 1");
        assert_eq!(g.queue_of(&1), Some(2), "QCount(4) = 2");
        assert!(!g.in_history(&1), "the record leaves Q_off");
        assert_eq!(g.frequency(&2), Some(1), "2 is remembered with g = 1");
        // A block not in Q_off starts at g = 1 on Q0.
        assert_eq!(g.access(3), Outcome::Miss { evicted: Some(1) });
        assert_eq!((g.frequency(&3), g.queue_of(&3)), (Some(1), Some(0)));
        // Q_off = [2, 1]; three more evictions fill it past 4 ids and its
        // oldest record (2) is dropped.
        for k in 4..=6 {
            g.access(k);
        }
        assert!(!g.in_history(&2) && g.in_history(&1) && g.in_history(&5));
        assert!(g.contains(&6));
    }

    /// Seed: OverTime = NowTime + DurationTime on entering a queue; an
    /// expired queue head is demoted one level and its OverTime reset.
    #[test]
    fn expired_heads_are_demoted_one_level() {
        let mut f = fmpq(4, 4, 4, 3);
        f.access(1);
        f.access(1); // t = 2: g = 2 → Q1, OverTime = 2 + 3 = 5
        assert_eq!(f.queue_of(&1), Some(1));
        f.access(2); // t = 3
        f.access(3); // t = 4
        f.access(4); // t = 5: OverTime 5 is not < 5
        assert_eq!(f.queue_of(&1), Some(1));
        f.access(2); // t = 6: 5 < 6 → demoted to Q0, OverTime = 9
        assert_eq!(f.queue_of(&1), Some(0));
        assert_eq!(f.frequency(&1), Some(2), "demotion keeps the frequency");
        // 2 was hit at t = 6 (g = 2 → Q1, OverTime 9); at t = 10 it is
        // demoted too.
        for k in [3, 4, 3] {
            f.access(k); // t = 7, 8, 9
        }
        // 3 hit at t = 7 and t = 9 (g = 3, Q1, OverTime 12); 4 at t = 8
        // (g = 2, Q1, OverTime 11). Q1 = [2, 4, 3].
        assert_eq!(f.queue_keys(1), vec![2, 4, 3]);
        f.access(1); // t = 10: 1 → Q1 (g = 3); head 2 (9 < 10) → Q0
        assert_eq!(f.queue_keys(0), vec![2]);
        assert_eq!(f.queue_keys(1), vec![4, 3, 1]);
    }
}
