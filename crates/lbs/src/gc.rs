//! Garbage-collection policy: watermarks and the seed's four-term victim
//! score (section 4.4). Pure functions over the cluster table, so the
//! policy is tested apart from the I/O that moves blocks.

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
    /// Weigh age with free space (LFS's cost-benefit, `(1 − u) · √age /
    /// (1 + u)`, in place of plain EMPTINESS): a cluster of old data is
    /// collected at a higher utilisation than one of young data, which
    /// is likely to die on its own soon.
    pub cost_benefit: bool,
}

impl GcPolicy {
    /// Defaults for `clusters` physical clusters: low 0.5% (3 to 1024
    /// clusters), high 1% (at least low + 2, at most 2048), emptiness
    /// dominating below 25% free.
    ///
    /// Clusters the background collector keeps free are spare space the
    /// data cannot use, so the watermarks are as low as lets writes find a
    /// free cluster while it works. Measured with the seed's Contacts and
    /// Email traces at Table 5 size on a full image with 12% spare
    /// (`bench/lbs-table5.sh --background-gc`), the former 3%/6% gave 51%
    /// and 73% write amplification; 1%/2% 20%; 0.5%/1% 16%; the
    /// collector in the foreground only, 14%.
    pub fn for_clusters(clusters: u64) -> GcPolicy {
        let low = (clusters / 200).clamp(3, 1024);
        let high = (clusters / 100).clamp(low + 2, 2048);
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

fn emptiness_of(state: ClusterState, live: u32, bpc: u64) -> f64 {
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

/// How much age counts in [`cost_benefit`]: `age ^ AGE_EXPONENT`. LFS
/// uses the age itself (1.0); measured on a full image with 12% spare
/// (`examples/write_amplification.rs`, 65,536 blocks, 3 writes per
/// block), 1.0 gives hot/cold 174% and uniform 385% (worse than greedy's
/// 359%), 0.5 gives 179% and 355%, 0.25 gives 211% and 344%.
pub const AGE_EXPONENT: f64 = 0.5;

/// The cost-benefit ratio of a cluster `age` activations old with `live`
/// of `bpc` blocks live: space freed times age (damped by
/// [`AGE_EXPONENT`]), over the cost of reading the cluster and writing
/// its live blocks (LFS).
pub fn cost_benefit(live: u32, bpc: u64, age: u64) -> f64 {
    let u = live as f64 / bpc as f64;
    (1.0 - u) * (age as f64).powf(AGE_EXPONENT) / (1.0 + u)
}

/// The best victim: the `Used` cluster with the highest score that has at
/// least one free block (moving a full cluster frees nothing). Ties go to
/// the lowest index. `ages[c]`: how many cluster activations ago cluster
/// `c`'s data was written (used with `policy.cost_benefit`).
pub fn pick_victim(
    states: &[ClusterState],
    live: &[u32],
    ages: &[u64],
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
    // Cost-benefit, scaled to 0..1 over the candidates like EMPTINESS.
    let top = if policy.cost_benefit {
        (0..states.len())
            .filter(|&c| candidate(c))
            .map(|c| cost_benefit(live[c], bpc, ages[c]))
            .fold(0.0f64, f64::max)
    } else {
        0.0
    };
    let mut best: Option<(f64, usize)> = None;
    for c in 0..states.len() {
        if !candidate(c) {
            continue;
        }
        let mut t = terms(c, states, live, bpc, active);
        if top > 0.0 {
            t.emptiness = cost_benefit(live[c], bpc, ages[c]) / top;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ClusterState::*;

    #[test]
    fn emptiest_cluster_wins_with_equal_context() {
        let states = [Used, Used, Used, Used];
        let live = [10, 2, 10, 10];
        let p = GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: false,
        };
        assert_eq!(pick_victim(&states, &live, &[0; 8], 16, None, &p), Some(1));
    }

    #[test]
    fn left_empty_and_write_position_break_ties() {
        let p = GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: false,
        };
        let states = [Used, Free, Used, Used, Used];
        let live = [8, 0, 8, 8, 8];
        // Cluster 2 has a free left neighbour.
        assert_eq!(pick_victim(&states, &live, &[0; 8], 16, None, &p), Some(2));
        // Cluster 3 is next to the write position.
        let states = [Used, Used, Active, Used, Used];
        let live = [8, 8, 3, 8, 8];
        assert_eq!(
            pick_victim(&states, &live, &[0; 8], 16, Some(2), &p),
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

    #[test]
    fn emptiness_dominates_when_space_is_short() {
        // Without domination the write-position boost picks the fuller cluster 1.
        let states = [Active, Used, Used, Used, Used, Used, Used, Used];
        let live = [1, 15, 9, 16, 16, 16, 16, 16];
        let mut p = GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: false,
        };
        assert_eq!(
            pick_victim(&states, &live, &[0; 8], 16, Some(0), &p),
            Some(1)
        );
        p.emptiness_dominates_below = Some(0.25);
        assert_eq!(
            pick_victim(&states, &live, &[0; 8], 16, Some(0), &p),
            Some(2)
        );
    }

    #[test]
    fn cost_benefit_prefers_old_data_to_a_little_more_free_space() {
        let states = [Used, Used, Used];
        // Cluster 0: half empty but its data was just written; cluster 1:
        // a quarter empty and old; cluster 2: full.
        let live = [8, 12, 16];
        let ages = [1, 100, 500];
        let mut p = GcPolicy {
            low: 1,
            high: 2,
            weights: Weights::default(),
            emptiness_dominates_below: None,
            cost_benefit: false,
        };
        assert_eq!(pick_victim(&states, &live, &ages, 16, None, &p), Some(0));
        p.cost_benefit = true;
        assert_eq!(pick_victim(&states, &live, &ages, 16, None, &p), Some(1));
        assert!(cost_benefit(8, 16, 1) < cost_benefit(12, 16, 100));
        assert_eq!(cost_benefit(16, 16, 1000), 0.0);
    }

    #[test]
    fn full_clusters_are_never_victims() {
        let p = GcPolicy::for_clusters(4);
        assert_eq!(
            pick_victim(&[Used, Used], &[16, 16], &[0; 8], 16, None, &p),
            None
        );
    }
}
