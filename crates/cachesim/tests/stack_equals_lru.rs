//! The one-pass stack-distance algorithm gives exactly the hits of a
//! simulated LRU cache, at every cache size, on random and generated
//! traces — overall and in both temporal-distance classes.

use proptest::prelude::*;
use roamdisk_cachesim::policy::lru::Lru;
use roamdisk_cachesim::policy::Policy;
use roamdisk_cachesim::sim::{Access, SimConfig, Simulator};
use roamdisk_cachesim::stack::{DistanceHistogram, StackDistance};
use roamdisk_cachesim::PolicySpec;

fn check_all_sizes(trace: &[u32]) {
    let mut sd = StackDistance::new();
    let mut h = DistanceHistogram::default();
    for &k in trace {
        h.record(sd.access(k));
    }
    let distinct = sd.distinct();
    for size in 1..=distinct + 1 {
        let mut lru = Lru::new(size);
        let hits = trace.iter().filter(|&&k| lru.access(k).is_hit()).count() as u64;
        assert_eq!(h.hits_at(size), hits, "size {size}, trace {trace:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_traces(keys in 1u32..80, trace in prop::collection::vec(0u32..1000, 0..600)) {
        let t: Vec<u32> = trace.iter().map(|k| k % keys).collect();
        check_all_sizes(&t);
    }

    /// Loops, scans and hot sets: the shapes where LRU misbehaves.
    #[test]
    fn generated_traces(
        segments in prop::collection::vec((0u8..3, 1u32..60, 1usize..120), 1..12),
    ) {
        let mut t = Vec::new();
        let mut x = 1u64;
        for (shape, n, len) in segments {
            for i in 0..len {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                t.push(match shape {
                    0 => i as u32 % n,                    // loop over n blocks
                    1 => 1000 + i as u32,                 // one-time scan
                    _ => ((x >> 40) % n as u64) as u32,   // random over a hot set
                });
            }
        }
        check_all_sizes(&t);
    }

    /// Through the simulator: the LRU curve split by temporal distance
    /// equals LRU instances of every size, class by class.
    #[test]
    fn simulator_curve_matches_instances(
        trace in prop::collection::vec((0u32..3, 0u64..40, any::<bool>()), 1..400),
        split in 1u64..50,
    ) {
        let keys = trace.len() + 2;
        let lru = PolicySpec::parse("lru").unwrap();
        let cfg = SimConfig {
            split,
            server: (1..=keys).map(|c| (lru.clone(), c)).collect(),
            ..SimConfig::default()
        };
        let mut s = Simulator::new(cfg);
        for &(client, block, write) in &trace {
            s.access(&Access { client, device: 0, block, write });
        }
        let r = s.finish();
        let level = &r.levels[0];
        let curve = level.lru.as_ref().unwrap();
        for res in &level.results {
            prop_assert_eq!(curve.at(res.capacity), (res.short, res.long), "size {}", res.capacity);
        }
    }
}

/// A longer run that forces many compactions of the time axis.
#[test]
fn long_trace_with_compactions() {
    let mut t = Vec::new();
    let mut x = 99u64;
    for i in 0..60_000u32 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // A drifting working set of ~500 keys.
        t.push((i / 50) + ((x >> 33) % 500) as u32);
    }
    let mut sd = StackDistance::new();
    let mut h = DistanceHistogram::default();
    for &k in &t {
        h.record(sd.access(k));
    }
    for size in [1usize, 7, 64, 200, 499, 500, 501, 1000, 5000] {
        let mut lru = Lru::new(size);
        let hits = t.iter().filter(|&&k| lru.access(k).is_hit()).count() as u64;
        assert_eq!(h.hits_at(size), hits, "size {size}");
    }
}
