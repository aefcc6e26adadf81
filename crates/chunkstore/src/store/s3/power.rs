//! The S3 store's catalogs, leases and gc when the client dies at any
//! request: commits to two catalogs and collections run against an S3 store
//! over [`PowerCut`], which fails the N-th request (taking effect or not:
//! the answer to an atomic request may be lost) and every later one, for
//! every N of the workload. A client started afterwards on the same bucket
//! must find every version a commit reported in its catalog, complete
//! (`store verify`: every object matches its name, every version has its
//! package and objects); a gc then (no lease or margin left to wait for)
//! must keep all of them; and a new commit must work.
//!
//! 20 workloads (about 3,500 cuts) in the test command;
//! `ROAMDISK_CRASH_LONG=1` runs 60 (over 10,000).

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::{BlockDev, NoProgress, WriteFlags};

use super::testing::PowerCut;
use super::S3Store;
use crate::commit::{commit_image, CommitOptions, Source};
use crate::gc::{gc, GcOptions};
use crate::hash::ChunkId;
use crate::repo::read_full;
use crate::verify::verify;

const LOC: &str = "s3://bucket/store";
const SIZE: u64 = 128 << 10;

/// Collections that wait for nothing: every unreferenced object goes.
fn eager() -> GcOptions {
    GcOptions {
        lease_timeout: Duration::ZERO,
        margin: Duration::ZERO,
        dry_run: false,
    }
}

/// The store over `os`, with no margin for listings that lag (in memory,
/// none do): a gc removes whatever nothing references.
fn open(os: Arc<dyn ObjectStore>) -> roamdisk_blockdev::Result<S3Store> {
    let mut s = S3Store::open_over(os, LOC)?;
    s.margin = Duration::ZERO;
    Ok(s)
}

/// Run workload `seed` on a store over `os` until it ends or a request
/// fails; the versions whose commits returned, by catalog.
fn run(os: Arc<dyn ObjectStore>, seed: u64) -> Vec<(String, ChunkId)> {
    let mut done = Vec::new();
    let Ok(s) = open(os) else {
        return done;
    };
    let mut rng = Rng::new(seed);
    let disk = MemDev::new(SIZE);
    disk.write_at(&rng.bytes(SIZE as usize), 0, WriteFlags::default())
        .unwrap();
    for _ in 0..6 {
        if rng.chance(1, 4) {
            if gc(&s, &eager(), &NoProgress).is_err() {
                return done;
            }
            continue;
        }
        for _ in 0..1 + rng.below(8) {
            let off = rng.below(SIZE / 4096) * 4096;
            disk.write_at(&rng.bytes(4096), off, WriteFlags::default())
                .unwrap();
        }
        let target = if rng.chance(1, 2) { "u/a" } else { "u/b" };
        let opts = CommitOptions {
            target: target.into(),
            chunk_size: 4096,
            ..Default::default()
        };
        match commit_image(&s, Source::Dev(&disk), &opts, &NoProgress) {
            Ok(sum) => done.push((target.to_string(), ChunkId::from_hex(&sum.version).unwrap())),
            Err(_) => return done,
        }
    }
    done
}

/// What a client started after the cut finds.
fn check(inner: Arc<InMemory>, done: &[(String, ChunkId)], ctx: &str) {
    let s = open(inner).unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
    let found = |when: &str| {
        for (target, v) in done {
            let (cat, _) = read_full(&s, target)
                .unwrap_or_else(|e| panic!("{ctx}: {when}: catalog {target}: {e}"));
            assert!(
                cat.entries.iter().any(|e| e.version == *v),
                "{ctx}: {when}: version {v} of {target}, reported committed, is not in its catalog"
            );
        }
        let r = verify(&s, &NoProgress).unwrap_or_else(|e| panic!("{ctx}: {when}: verify: {e}"));
        assert!(r.ok(), "{ctx}: {when}: verify: {r:?}");
    };
    found("after the cut");
    gc(&s, &eager(), &NoProgress).unwrap_or_else(|e| panic!("{ctx}: gc: {e}"));
    found("after a gc");
    let disk = MemDev::new(SIZE);
    disk.write_at(&[7u8; 4096], 0, WriteFlags::default())
        .unwrap();
    let opts = CommitOptions {
        target: "u/a".into(),
        chunk_size: 4096,
        ..Default::default()
    };
    commit_image(&s, Source::Dev(&disk), &opts, &NoProgress)
        .unwrap_or_else(|e| panic!("{ctx}: a new commit: {e}"));
    found("after a new commit");
}

/// Every cut of workload `seed` (the cut request taking effect at every
/// other one); the number of cuts.
fn check_workload(seed: u64) -> usize {
    let fresh = || {
        let inner = Arc::new(InMemory::new());
        S3Store::init_over(inner.clone(), LOC).unwrap();
        inner
    };
    let total = {
        let inner = fresh();
        let os = PowerCut::new(inner, usize::MAX, false);
        run(os.clone(), seed);
        os.calls.load(std::sync::atomic::Ordering::SeqCst)
    };
    for at in 1..=total {
        let lands = (at + seed as usize).is_multiple_of(2);
        let inner = fresh();
        let os = PowerCut::new(inner.clone(), at, lands);
        let done = run(os.clone(), seed);
        let ctx = format!("seed {seed}, request {at} of {total} cut (landed: {lands})");
        check(inner, &done, &ctx);
    }
    total
}

#[test]
fn no_committed_version_is_lost_when_the_client_dies_at_any_request() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    #[allow(
        clippy::disallowed_methods,
        reason = "a test's length from its environment"
    )]
    let long = std::env::var_os("ROAMDISK_CRASH_LONG").is_some();
    let seeds: u64 = if long { 60 } else { 20 };
    // Workloads side by side: the store's put batcher waits a few
    // milliseconds per batch, which one thread would spend idle.
    let (next, cuts) = (AtomicU64::new(1), AtomicUsize::new(0));
    std::thread::scope(|sc| {
        for _ in 0..8 {
            sc.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed > seeds {
                    return;
                }
                cuts.fetch_add(check_workload(seed), Ordering::SeqCst);
            });
        }
    });
    let cuts = cuts.into_inner();
    eprintln!("S3 power cuts: {seeds} workloads, {cuts} cuts");
    assert!(cuts as u64 >= seeds * 100, "only {cuts} cuts");
}
