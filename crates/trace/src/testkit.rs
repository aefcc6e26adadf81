//! What this crate's tests share: the statistics of a list of records and
//! the tolerance the generators are held to.

use crate::format::Record;
use crate::stats::{analyze, Stats, StatsOptions};

/// Within 5% of `target`: how close a generated trace must come to the
/// figures it reproduces.
pub fn within(ours: f64, target: f64) -> bool {
    (ours - target).abs() <= 0.05 * target
}

/// The statistics of `recs`.
pub fn stats_of(recs: impl IntoIterator<Item = Record>, opts: StatsOptions) -> Stats {
    analyze(recs.into_iter().map(Ok::<_, ()>), opts).unwrap()
}
