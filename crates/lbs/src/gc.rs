//! Garbage-collection policy: watermarks, the seed's four-term victim
//! score (section 4.4) with a cost-benefit EMPTINESS, and the temperature
//! of write streams (which stream a written or moved block goes to). Pure
//! functions over the cluster table, so the policy is tested apart from
//! the I/O that moves blocks.

/// Life-cycle of a physical cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// No live block and safe to overwrite.
    Free,
    /// Being filled by the write position.
    Active,
    /// Holds live blocks.
    Used,
    /// No live block any more, but the durable map may still point into it:
    /// becomes `Free` at the next barrier.
    PendingFree,
}

/// Weights of the four scoring terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// EMPTINESS: free blocks / blocks per cluster.
    pub emptiness: f64,
    /// LEFT EMPTY: the left neighbour is free.
    pub left_empty: f64,
    /// OUTLIER CORRECTION: an unusually full cluster among empty ones.
    pub outlier: f64,
    /// WRITE POSITION: the cluster right after the active one.
    pub write_position: f64,
}

impl Default for Weights {
    /// Equal weights, as in the seed's experiments.
    fn default() -> Self {
        Weights {
            emptiness: 1.0,
            left_empty: 1.0,
            outlier: 1.0,
            write_position: 1.0,
        }
    }
}

/// GC settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcPolicy {
    /// Start collecting when free clusters drop below this.
    pub low: u64,
    /// Stop when free clusters reach this.
    pub high: u64,
    pub weights: Weights,
    /// When the free fraction of the physical space falls below this, the
    /// other terms are scaled down by 10x so EMPTINESS dominates (the seed's
    /// remark: below about 25% free). `None` disables it.
    pub emptiness_dominates_below: Option<f64>,
    /// Weigh free space with how long the cluster's data lives
    /// ([`cost_benefit`], in place of plain EMPTINESS): a cluster of
    /// long-lived (cold) data is collected at a higher utilisation than one
    /// of short-lived (hot) data, which is likely to die on its own soon.
    pub cost_benefit: bool,
}

impl GcPolicy {
    /// Defaults for `clusters` physical clusters: low 0.25% (3 to 1024
    /// clusters), high 0.5% (at least low + 2, at most 2048), emptiness
    /// dominating below 25% free. Free clusters the background collector
    /// keeps are spare space the data cannot use, so the watermarks are as
    /// low as lets writes find a free cluster while it works. On a full
    /// image (12% spare, 1,149 clusters, 90/10 hot/cold,
    /// `write_amplification --background-gc`) the former 3%/6% (34/68
    /// clusters) gave 189% write amplification, 5/11 clusters 104%, 3/5
    /// 100% (98% with the foreground collector alone); with the seed's
    /// Contacts and Email traces at Table 5 size (`bench/lbs-table5.sh
    /// --background-gc`, 4,590 clusters), 3%/6% gave 51% and 73%, 1%/2%
    /// 20%, 0.5%/1% 16%, the foreground collector alone 14%.
    pub fn for_clusters(clusters: u64) -> GcPolicy {
        let low = (clusters / 400).clamp(3, 1024);
        let high = (clusters / 200).clamp(low + 2, 2048);
        GcPolicy {
            low,
            high,
            weights: Weights::default(),
            emptiness_dominates_below: Some(0.25),
            cost_benefit: true,
        }
    }
}

/// The scoring terms of one cluster (for `lbs info` and tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    pub emptiness: f64,
    pub left_empty: f64,
    pub outlier: f64,
    pub write_position: f64,
}

pub(crate) fn emptiness_of(state: ClusterState, live: u32, bpc: u64) -> f64 {
    match state {
        ClusterState::Free | ClusterState::PendingFree => 1.0,
        _ => 1.0 - live as f64 / bpc as f64,
    }
}

/// The four terms for cluster `c`.
pub fn terms(
    c: usize,
    states: &[ClusterState],
    live: &[u32],
    bpc: u64,
    active: Option<usize>,
) -> Terms {
    let e = emptiness_of(states[c], live[c], bpc);
    let left_empty = if c > 0
        && matches!(
            states[c - 1],
            ClusterState::Free | ClusterState::PendingFree
        ) {
        1.0
    } else {
        0.0
    };
    let lo = c.saturating_sub(2);
    let hi = (c + 2).min(states.len() - 1);
    // Mean emptiness of up to two neighbours on each side (no allocation:
    // this runs for every candidate at every victim choice).
    let (mut sum, mut n) = (0.0, 0u32);
    for k in (lo..=hi).filter(|&k| k != c) {
        sum += emptiness_of(states[k], live[k], bpc);
        n += 1;
    }
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    // An unusually full cluster among mostly empty ones is scored as if it
    // were almost as empty as its surroundings.
    let outlier = if mean >= 0.5 && mean - e > 0.25 {
        mean - e
    } else {
        0.0
    };
    let write_position = match active {
        Some(a) if (a + 1) % states.len() == c => 1.0,
        _ => 0.0,
    };
    Terms {
        emptiness: e,
        left_empty,
        outlier,
        write_position,
    }
}

/// How much a cluster's expected data lifetime counts in
/// [`cost_benefit`]: `lifetime ^ LIFETIME_EXPONENT`. With greedy cleaning
/// inside each temperature, the spare space that minimises moves is shared
/// in proportion to `1/√lifetime` of each temperature, and the victim's
/// `(1 − u)/u` then goes as `1/√lifetime` too: 0.5 is the exponent that
/// makes equal scores mean equal marginal cost. Measured write
/// amplification (`examples/write_amplification.rs`, full image, 12%
/// spare, 90/10 hot/cold | zipf 1.1): 0.4 106% | 81%, 0.45 101% | 79%,
/// 0.5 98% | 80%, 0.55 98% | 83%, 0.6 101% | 87%, 0.7 113% | 102%.
pub const LIFETIME_EXPONENT: f64 = 0.5;

/// The cost-benefit ratio of a cluster with `live` of `bpc` blocks live
/// whose blocks are expected to live `lifetime` (any unit): space freed
/// over blocks moved, times the damped lifetime (LFS's cost-benefit with
/// the cost counted in moves, `u`, rather than in I/O, `1 + u`, and the
/// age replaced by the measured lifetime of the cluster's stream).
pub fn cost_benefit(live: u32, bpc: u64, lifetime: f64) -> f64 {
    let u = (live as f64 / bpc as f64).max(0.5 / bpc as f64);
    (1.0 - u) / u * lifetime.max(0.0).powf(LIFETIME_EXPONENT)
}

/// The expected lifetime of the blocks of a cluster activated `age`
/// activations ago into which `written` blocks were written, `live` of
/// them still live: blocks dying at a constant rate leave `written ·
/// e^(−age/lifetime)` live. Infinite while none died.
pub fn lifetime(age: u64, written: u32, live: u32) -> f64 {
    let d = decay(written, live);
    if d <= 0.0 {
        f64::INFINITY
    } else {
        (age as f64 + 1.0) / d
    }
}

/// How many lifetimes a cluster's blocks have lived: `ln(written / live)`
/// (a cluster with no live block counts as half a block live, one with
/// nothing written as half a block written: 0).
pub(crate) fn decay(written: u32, live: u32) -> f64 {
    ((written.max(live) as f64).max(0.5) / (live as f64).max(0.5)).ln()
}

/// The lifetime of each stream's data, pooled over its `Used` clusters
/// (sum of ages over sum of decays: one estimate per temperature, so
/// clusters of one temperature are compared by free space alone, i.e.
/// greedily). `stream[c]`: the stream that wrote cluster `c`; `ages[c]`:
/// activations since it was activated; `written[c]`: blocks written into it
/// since.
pub fn stream_lifetimes(
    states: &[ClusterState],
    stream: &[u8],
    ages: &[u64],
    written: &[u32],
    live: &[u32],
) -> [f64; STREAMS] {
    let mut num = [0f64; STREAMS];
    let mut den = [0f64; STREAMS];
    for c in 0..states.len() {
        if states[c] != ClusterState::Used {
            continue;
        }
        let s = stream[c] as usize;
        num[s] += ages[c] as f64 + 1.0;
        den[s] += decay(written[c], live[c]);
    }
    let mut out = [0f64; STREAMS];
    for s in 0..STREAMS {
        // A stream none of whose blocks died yet counts as very cold
        // (1000 times the sum of its clusters' ages).
        out[s] = num[s] / den[s].max(1e-3);
    }
    out
}

/// The best victim: the `Used` cluster with the highest score that has at
/// least one free block (moving a full cluster frees nothing). Ties go to
/// the lowest index. `lifetimes[c]`: how long cluster `c`'s blocks are
/// expected to live (used with `policy.cost_benefit`).
pub fn pick_victim(
    states: &[ClusterState],
    live: &[u32],
    lifetimes: &[f64],
    bpc: u64,
    active: Option<usize>,
    policy: &GcPolicy,
) -> Option<usize> {
    let free = states
        .iter()
        .filter(|s| matches!(s, ClusterState::Free | ClusterState::PendingFree))
        .count();
    let mut w = policy.weights;
    if let Some(th) = policy.emptiness_dominates_below {
        if (free as f64) < th * states.len() as f64 {
            w.left_empty *= 0.1;
            w.outlier *= 0.1;
            w.write_position *= 0.1;
        }
    }
    let candidate = |c: usize| states[c] == ClusterState::Used && (live[c] as u64) < bpc;
    // Cost-benefit of each candidate (NaN for the others), scaled to 0..1
    // over the candidates like EMPTINESS.
    let cb: Vec<f64> = if policy.cost_benefit {
        (0..states.len())
            .map(|c| {
                if candidate(c) {
                    cost_benefit(live[c], bpc, lifetimes[c])
                } else {
                    f64::NAN
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let top = cb
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |a, &b| a.max(b));
    // The other three terms are at most 1 each: a candidate whose
    // EMPTINESS alone cannot reach the best score needs no neighbours
    // looked at (this runs over every cluster at every victim choice).
    let others = w.left_empty.max(0.0) + w.outlier.max(0.0) + w.write_position.max(0.0);
    let mut best: Option<(f64, usize)> = None;
    for c in 0..states.len() {
        if !candidate(c) {
            continue;
        }
        let e = if top > 0.0 {
            (cb[c] / top).min(1.0)
        } else {
            emptiness_of(states[c], live[c], bpc)
        };
        if let Some((b, _)) = best {
            if w.emptiness * e + others < b {
                continue;
            }
        }
        let mut t = terms(c, states, live, bpc, active);
        t.emptiness = e;
        let s = w.emptiness * t.emptiness
            + w.left_empty * t.left_empty
            + w.outlier * t.outlier
            + w.write_position * t.write_position;
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Write streams: each has its own active cluster and buffer, so data of
/// one temperature fills clusters of its own (hot clusters then empty
/// almost entirely before they are collected, cold ones stay full). Clients'
/// writes and the collector's moves never share a stream.
pub const STREAMS: usize = 4;
/// Clients' writes of blocks not known to be hot.
pub const WARM: usize = 0;
/// Clients' writes of hot blocks.
pub const HOT: usize = 1;
/// Moves of cold blocks.
pub const MOVED_COLD: usize = 2;
/// Moves of hot blocks that outlived their cluster (hot data dies at
/// random: the survivors of a hot cluster are as hot as the rest).
pub const MOVED_HOT: usize = 3;

/// Whether stream `s` holds the collector's moves.
pub fn is_moved(s: usize) -> bool {
    s == MOVED_COLD || s == MOVED_HOT
}

/// Per-LBN write stamps: when each block was last written by a client, on
/// the cluster-activation clock, in units of 1/256 of a pass over the
/// physical space (a pass: as many activations as there are clusters), 15
/// bits, wrapping (after 128 passes an old block may look recent: it is
/// then misfiled once); bit 15 is set when that write came soon after the
/// previous one. 0 = unknown (after open). Kept in memory only.
pub const STAMP_FLAG: u16 = 0x8000;
/// Stamp units per pass (for images of at least 256 clusters).
pub const STAMP_UNITS_PER_PASS: u64 = 256;

/// A rewrite within this many passes of the previous write is "soon".
/// Measured (90/10 hot/cold, as for [`LIFETIME_EXPONENT`]): 1 pass 98.6%,
/// 1.25 98.4%, 1.5 98.9%, 2 100.6%, 3 102.5%.
pub const HOT_PASSES: f64 = 1.25;
/// A moved block last written within this many passes stays hot.
/// Measured: 1.5 passes 98.5%, 2 98.4%, 2.5 99.1%, 3 99.3%.
pub const MOVED_HOT_PASSES: f64 = 2.0;
/// A block whose old copy sits in a cluster whose data lives less than
/// this many passes ([`lifetime`]) is hot even on its first rewrite.
/// Measured: off 104.1%, 1.5 passes 99.0%, 2.5 98.4%, 3.5 98.4%, 5
/// 98.8% (zipf 1.1: 79.6%, 80.0%, 80.4%, 81.3%, 83.0%).
pub const HOT_CLUSTER_PASSES: f64 = 2.5;

/// The stamp clock: activation `clock` in units of `unit` activations,
/// 15 bits, never 0.
pub fn stamp_now(clock: u64, unit: u64) -> u16 {
    (((clock / unit.max(1)) & 0x7fff) as u16).max(1)
}

/// Stamp units since `stamp` was taken (`None`: unknown).
pub fn stamp_age(now: u16, stamp: u16) -> Option<u64> {
    let t = stamp & !STAMP_FLAG;
    (t != 0).then(|| (now.wrapping_sub(t) & 0x7fff) as u64)
}

/// The stream of a client's write of a block last stamped `stamp`, at
/// stamp time `now` with `pass` stamp units per pass; `old_lifetime`: the
/// [`lifetime`] of the cluster holding its previous copy, in passes.
/// Returns the stream and the block's new stamp.
///
/// A block is hot when its last two writes each came within
/// [`HOT_PASSES`] of the one before (one short interval is weak evidence:
/// right after the disk was filled every block has one), or when its old
/// copy is in a cluster whose data dies within [`HOT_CLUSTER_PASSES`].
pub fn client_stream(stamp: u16, now: u16, pass: u64, old_lifetime: Option<f64>) -> (usize, u16) {
    let soon = stamp_age(now, stamp).is_some_and(|a| (a as f64) < HOT_PASSES * pass as f64);
    let hot =
        (soon && stamp & STAMP_FLAG != 0) || old_lifetime.is_some_and(|l| l < HOT_CLUSTER_PASSES);
    let new = now | if soon { STAMP_FLAG } else { 0 };
    (if hot { HOT } else { WARM }, new)
}

/// The stream of a block the collector moves out of a cluster written by
/// stream `victim`: hot data that outlived its cluster stays hot while its
/// last write is within [`MOVED_HOT_PASSES`]; everything else is cold.
pub fn moved_stream(stamp: u16, now: u16, pass: u64, victim: usize) -> usize {
    let recent = stamp_age(now, stamp).is_some_and(|a| (a as f64) < MOVED_HOT_PASSES * pass as f64);
    if recent && (victim == HOT || victim == MOVED_HOT) {
        MOVED_HOT
    } else {
        MOVED_COLD
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClusterState::*;

    #[test]
    fn emptiest_cluster_wins_with_equal_context() {
        let states = [Used, Used, Used, Used];
        let live = [10, 2, 10, 10];
        let p = plain_policy();
        assert_eq!(
            pick_victim(&states, &live, &[0.0; 8], 16, None, &p),
            Some(1)
        );
    }

    #[test]
    fn left_empty_and_write_position_break_ties() {
        let p = plain_policy();
        let states = [Used, Free, Used, Used, Used];
        let live = [8, 0, 8, 8, 8];
        // Cluster 2 has a free left neighbour.
        assert_eq!(
            pick_victim(&states, &live, &[0.0; 8], 16, None, &p),
            Some(2)
        );
        // Cluster 3 is next to the write position.
        let states = [Used, Used, Active, Used, Used];
        let live = [8, 8, 3, 8, 8];
        assert_eq!(
            pick_victim(&states, &live, &[0.0; 8], 16, Some(2), &p),
            Some(3)
        );
    }

    #[test]
    fn outlier_among_empty_neighbours_is_rewarded() {
        let t = terms(
            2,
            &[Free, Free, Used, Free, Free],
            &[0, 0, 14, 0, 0],
            16,
            None,
        );
        assert!(t.outlier > 0.8, "{t:?}");
        let t = terms(
            2,
            &[Used, Used, Used, Used, Used],
            &[14, 14, 14, 14, 14],
            16,
            None,
        );
        assert_eq!(t.outlier, 0.0);
    }

    /// Watermarks 1 and 2, default weights, no domination, no
    /// cost-benefit.
    fn plain_policy() -> GcPolicy {
        GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: false,
        }
    }

    #[test]
    fn emptiness_dominates_when_space_is_short() {
        // Without domination the write-position boost picks the fuller cluster 1.
        let states = [Active, Used, Used, Used, Used, Used, Used, Used];
        let live = [1, 15, 9, 16, 16, 16, 16, 16];
        let mut p = plain_policy();
        assert_eq!(
            pick_victim(&states, &live, &[0.0; 8], 16, Some(0), &p),
            Some(1)
        );
        p.emptiness_dominates_below = Some(0.25);
        assert_eq!(
            pick_victim(&states, &live, &[0.0; 8], 16, Some(0), &p),
            Some(2)
        );
    }

    #[test]
    fn cost_benefit_prefers_long_lived_data_to_a_little_more_free_space() {
        let states = [Used, Used, Used];
        // Cluster 0: half empty but its data dies fast; cluster 1: a
        // quarter empty and its data lives long; cluster 2: full.
        let live = [8, 12, 16];
        let lifetimes = [1.0, 100.0, 500.0];
        let mut p = plain_policy();
        assert_eq!(
            pick_victim(&states, &live, &lifetimes, 16, None, &p),
            Some(0)
        );
        p.cost_benefit = true;
        assert_eq!(
            pick_victim(&states, &live, &lifetimes, 16, None, &p),
            Some(1)
        );
        assert!(cost_benefit(8, 16, 1.0) < cost_benefit(12, 16, 100.0));
        assert_eq!(cost_benefit(16, 16, 1000.0), 0.0);
        // Same lifetime: greedy.
        assert!(cost_benefit(4, 16, 9.0) > cost_benefit(5, 16, 9.0));
    }

    #[test]
    fn lifetimes_are_measured_per_stream() {
        // Half the blocks of a cluster died within 10 activations: its
        // blocks live 10 / ln 2.
        assert!((lifetime(9, 16, 8) - 10.0 / 2f64.ln()).abs() < 1e-9);
        assert_eq!(lifetime(9, 16, 16), f64::INFINITY);
        let states = [Used, Used, Used, Free];
        let stream = [HOT as u8, HOT as u8, MOVED_COLD as u8, WARM as u8];
        let t = stream_lifetimes(
            &states,
            &stream,
            &[9, 19, 99, 0],
            &[16, 16, 16, 16],
            &[8, 4, 15, 0],
        );
        // Pooled: (10 + 20) / (ln 2 + ln 4).
        assert!((t[HOT] - 30.0 / 8f64.ln()).abs() < 1e-9);
        assert!(t[MOVED_COLD] > 100.0 * t[HOT]);
    }

    #[test]
    fn blocks_rewritten_soon_twice_are_hot() {
        let pass = 256;
        // Unknown history: warm, stamped.
        let (s, st) = client_stream(0, 1000, pass, None);
        assert_eq!((s, st), (WARM, 1000));
        // One rewrite soon after: still warm, flagged.
        let (s, st) = client_stream(st, 1100, pass, None);
        assert_eq!((s, st), (WARM, 1100 | STAMP_FLAG));
        // The second one: hot.
        let (s, st) = client_stream(st, 1200, pass, None);
        assert_eq!((s, st), (HOT, 1200 | STAMP_FLAG));
        // A long pause: warm again, flag cleared.
        let (s, st) = client_stream(st, 1200 + 2 * pass as u16, pass, None);
        assert_eq!((s, st & STAMP_FLAG), (WARM, 0));
        // An old copy in a cluster whose data dies fast: hot at once.
        assert_eq!(client_stream(0, 1000, pass, Some(0.5)).0, HOT);
        assert_eq!(client_stream(0, 1000, pass, Some(10.0)).0, WARM);
        // The stamp clock wraps in 15 bits and never reads 0.
        assert_eq!(stamp_now(0, 4), 1);
        assert_eq!(stamp_age(3, 0x7ffe | STAMP_FLAG), Some(5));
        assert_eq!(stamp_age(3, 0), None);
    }

    #[test]
    fn only_recently_written_survivors_of_hot_clusters_stay_hot() {
        let pass = 256;
        assert_eq!(moved_stream(1000, 1100, pass, HOT), MOVED_HOT);
        assert_eq!(moved_stream(1000, 1100, pass, MOVED_HOT), MOVED_HOT);
        assert_eq!(moved_stream(1000, 1100, pass, WARM), MOVED_COLD);
        assert_eq!(
            moved_stream(1000, 1000 + 3 * pass as u16, pass, HOT),
            MOVED_COLD
        );
        assert_eq!(moved_stream(0, 1100, pass, HOT), MOVED_COLD);
        assert!(is_moved(MOVED_HOT) && is_moved(MOVED_COLD) && !is_moved(HOT) && !is_moved(WARM));
    }

    #[test]
    fn full_clusters_are_never_victims() {
        let p = GcPolicy::for_clusters(4);
        assert_eq!(
            pick_victim(&[Used, Used], &[16, 16], &[0.0; 8], 16, None, &p),
            None
        );
    }
}
