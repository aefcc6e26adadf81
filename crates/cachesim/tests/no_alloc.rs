//! Once built, no policy allocates while serving accesses — the property a
//! server's memory cache needs in its request path. A counting global
//! allocator watches a long run of hits, misses, evictions, ghost hits
//! and removals with the hashed index a server would use.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use roamdisk_cachesim::index::HashIndex;
use roamdisk_cachesim::policy::PolicyKind;
use roamdisk_cachesim::PolicySpec;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn accesses_do_not_allocate() {
    // Keys: a hot set re-referenced often, a warm set, and a stream of
    // one-time keys, so every policy hits, misses, evicts, remembers and
    // recalls ghosts, promotes and demotes.
    let keys: Vec<u64> = {
        let mut x = 0x1234_5678u64;
        (0..400_000u64)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match (x >> 60) % 4 {
                    0 | 1 => (x >> 20) % 300,
                    2 => 1000 + (x >> 20) % 5000,
                    _ => 1_000_000 + i,
                }
            })
            .collect()
    };
    for kind in PolicyKind::ALL {
        let spec = PolicySpec::parse(kind.name()).unwrap();
        let built = ALLOCS.load(Ordering::Relaxed);
        let mut p = spec.build::<u64, HashIndex<u64>>(1000);
        assert!(
            ALLOCS.load(Ordering::Relaxed) > built,
            "the counter sees the construction's allocations"
        );
        // Warm up: reach the steady state (full cache, full ghost lists).
        for &k in &keys[..100_000] {
            p.access(k);
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut hits = 0u64;
        for (i, &k) in keys[100_000..].iter().enumerate() {
            if p.access(k).is_hit() {
                hits += 1;
            }
            if i % 97 == 0 {
                p.remove(&((k + 1) % 300));
            }
        }
        let after = ALLOCS.load(Ordering::Relaxed);
        assert_eq!(
            after,
            before,
            "{} allocated {} times",
            kind.name(),
            after - before
        );
        assert!(
            hits > 10_000,
            "{}: the run exercised hits ({hits})",
            kind.name()
        );
    }
}
