//! Policy speed harness: requests per second of every policy on one core.
//!
//! Usage (release mode; bench/cachesim-speed.sh runs it):
//!
//! ```text
//! cargo run --release -p roamdisk-cachesim --example policy_speed -- KEYS.txt CAPACITY [REPEAT]
//! ```
//!
//! KEYS.txt holds one decimal key per line (what `roamdisk sim
//! --export-keys` writes, also libCacheSim's txt trace format). Each
//! policy replays the whole stream REPEAT times (default 3) from a cold
//! cache with two key indexes — `u64` keys in a hash map (how a server's
//! memory cache would hold arbitrary block addresses) and the simulator's
//! dense `u32` ids in an array — and the best run is reported, along with
//! its miss ratio. The one-pass stack-distance curve is timed too.

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use std::io::BufRead;
use std::time::Instant;

use roamdisk_cachesim::index::{DenseIndex, HashIndex};
use roamdisk_cachesim::policy::{Policy, PolicyKind, PolicySpec};
use roamdisk_cachesim::stack::StackDistance;

fn time<F: FnMut() -> u64>(repeat: usize, mut f: F) -> (f64, u64) {
    let mut best = f64::MAX;
    let mut misses = 0;
    for _ in 0..repeat {
        let t = Instant::now();
        misses = f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, misses)
}

fn run<P: Policy<K> + ?Sized, K: Copy>(p: &mut P, keys: &[K]) -> u64 {
    let mut misses = 0;
    for &k in keys {
        if !p.access(k).is_hit() {
            misses += 1;
        }
    }
    misses
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: policy_speed KEYS.txt CAPACITY [REPEAT]");
        std::process::exit(2);
    }
    let f = std::fs::File::open(&args[1]).unwrap_or_else(|e| {
        eprintln!("cannot open {}: {e}", args[1]);
        std::process::exit(1)
    });
    let keys32: Vec<u32> = std::io::BufReader::new(f)
        .lines()
        .map(|l| {
            l.expect("readable")
                .trim()
                .parse()
                .expect("one decimal key per line")
        })
        .collect();
    // Spread the dense ids over 64-bit space as a server's block
    // addresses would be (device, block, owner packed): same stream,
    // different key values.
    let keys64: Vec<u64> = keys32
        .iter()
        .map(|&k| (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8)
        .collect();
    let cap: usize = args[2].parse().expect("CAPACITY is a number of blocks");
    let repeat: usize = args.get(3).map(|r| r.parse().expect("REPEAT")).unwrap_or(3);
    let n = keys32.len() as f64;
    println!(
        "{} requests, capacity {} blocks, best of {}",
        keys32.len(),
        cap,
        repeat
    );
    println!(
        "{:<10} {:>14} {:>14} {:>12}",
        "policy", "u64 hash Mreq/s", "dense Mreq/s", "miss ratio"
    );
    for kind in [
        PolicyKind::Lru,
        PolicyKind::Fmpq,
        PolicyKind::TwoQ,
        PolicyKind::Fbr,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::Mq,
    ] {
        let spec = PolicySpec::parse(kind.name()).expect("built-in name");
        let (t_hash, m_hash) = time(repeat, || {
            let mut p = spec.build::<u64, HashIndex<u64>>(cap);
            run(&mut *p, &keys64)
        });
        let (t_dense, m_dense) = time(repeat, || {
            let mut p = spec.build::<u32, DenseIndex>(cap);
            run(&mut *p, &keys32)
        });
        assert_eq!(
            m_hash,
            m_dense,
            "{}: the key index must not matter",
            kind.name()
        );
        println!(
            "{:<10} {:>14.1} {:>14.1} {:>12.4}",
            kind.name(),
            n / t_hash / 1e6,
            n / t_dense / 1e6,
            m_hash as f64 / n
        );
    }
    // The concrete LRU type (no dynamic dispatch), as a server would embed it.
    let (t, _) = time(repeat, || {
        let mut p = roamdisk_cachesim::policy::lru::Lru::<u64>::new(cap);
        run(&mut p, &keys64)
    });
    println!(
        "{:<10} {:>14.1}   (concrete type, no dyn dispatch)",
        "LRU",
        n / t / 1e6
    );
    let (t, _) = time(repeat, || {
        let mut s = StackDistance::new();
        let mut cold = 0;
        for &k in &keys32 {
            if s.access(k).is_none() {
                cold += 1;
            }
        }
        cold
    });
    println!(
        "{:<10} {:>14.1}   (stack distances: exact LRU at every size)",
        "stack",
        n / t / 1e6
    );
}
