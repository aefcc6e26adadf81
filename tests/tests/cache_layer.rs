//! The `cache:POLICY:SIZE:NEXT` layer seen from real clients (issue 13,
//! the server's memory cache): over NBD, random unaligned reads, writes,
//! zeroes and trims read exactly what the same operations give on a plain
//! file, for block sizes from 4 KiB to 1 MiB and several policies, on a
//! disk whose last block is short; racing writers and readers on four
//! connections leave no stale block; and a trace
//! replayed through the layer counts exactly the hits and misses `roamdisk
//! sim --shards` counts for the same policy, size, block size and shards
//! (the same engine).

mod common;

use common::*;

const CHECK: &str = include_str!("cache_layer_check.py");

/// Serve `cache[OPTS]:POLICY:SIZE:raw:IMG` and run the libnbd check
/// script against it and a plain copy of the image.
fn check_stack(policy: &str, block: u64, blocks: u64, opts: &str, seed: u64) {
    let dir = tempdir();
    let size = 8 * (1 << 20) + 12345;
    let img = dir.path().join("disk.raw");
    let model = dir.path().join("model.raw");
    random_file(&img, size, seed);
    std::fs::copy(&img, &model).unwrap();
    let report = dir.path().join("cache.json");
    let spec = format!(
        "cache[block={block},report={}{opts}]:{policy}:{}:{}",
        report.display(),
        block * blocks,
        spec_raw(&img)
    );
    let srv = Server::start(dir.path(), &[&spec]);
    let out = run_python_nbd(
        CHECK,
        &[
            &srv.uri(),
            path_str(&img),
            path_str(&model),
            &block.to_string(),
            &seed.to_string(),
        ],
    );
    assert!(out.contains("phase 2 ok"), "{out}");
    assert!(srv.stop().success());
    // The reads above were served from the cache, not only passed through.
    let json = std::fs::read_to_string(&report).unwrap();
    assert!(num_after(&json, 0, "hits").0 > 500, "{json}");
    assert!(num_after(&json, 0, "bytes_from_cache").0 > 0, "{json}");
    assert!(num_after(&json, 0, "evictions").0 > 0, "{json}");
}

#[test]
fn reads_equal_a_plain_file_lru_4k() {
    check_stack("lru", 4096, 64, "", 1);
}

#[test]
fn reads_equal_a_plain_file_fmpq_16k_4_shards() {
    check_stack("fmpq", 16384, 32, ",shards=4", 2);
}

#[test]
fn reads_equal_a_plain_file_2q_64k_one_shard() {
    check_stack("2q[kin=0.3]", 65536, 12, ",shards=1", 3);
}

#[test]
fn reads_equal_a_plain_file_s3fifo_1m() {
    check_stack("s3fifo", 1 << 20, 4, ",shards=2", 4);
}

/// A one-client trace with reuse and writes, replayed through the layer
/// over a raw image, and simulated: equal counts for every policy, with
/// one shard and with several.
#[test]
fn hits_equal_the_simulators_for_the_same_trace() {
    let (dir, trace) = synth_in_tempdir(
        "desktop",
        "desk.rdtrace",
        "--clients 1 --requests 20000 --seed 3",
    );
    let img = dir.path().join("disk.raw");
    blank_file(&img, 70 << 30);
    let report = dir.path().join("cache.json");
    let trace = path_str(&trace);
    for policy in ["fmpq", "lru", "2q", "arc", "s3fifo"] {
        for (size, block, shards) in [("4M", "4K", "1"), ("4M", "4K", "16"), ("8M", "16K", "4")] {
            let spec = format!(
                "cache[block={block},shards={shards},report={}]:{policy}:{size}:{}",
                report.display(),
                spec_raw(&img)
            );
            rd(&["replay", trace, &spec, "-q"]);
            let json = std::fs::read_to_string(&report).unwrap();
            let layer = (
                num_after(&json, 0, "hits").0,
                num_after(&json, 0, "misses").0,
            );
            let sim = sim_counts(trace, policy, size, block, shards);
            assert_eq!(
                layer, sim,
                "{policy} {size} {block} x{shards}: layer (hits, misses) vs sim"
            );
            assert!(
                layer.0 > 1000,
                "{policy}: the trace should have reuse: {json}"
            );
        }
    }
}

#[test]
fn bad_specs_say_what_to_do() {
    let dir = tempdir();
    let img = dir.path().join("d.raw");
    blank_file(&img, 1 << 20);
    let e = rd_fail(&["info", &format!("cache:lfu:1M:{}", spec_raw(&img))]);
    assert!(e.contains("unknown policy 'lfu'"), "{e}");
    let e = rd_fail(&[
        "info",
        &format!("cache[block=3K]:lru:1M:{}", spec_raw(&img)),
    ]);
    assert!(e.contains("power of two"), "{e}");
    let e = rd_fail(&[
        "info",
        &format!("cache[shards=64]:lru:64K:{}", spec_raw(&img)),
    ]);
    assert!(e.contains("shards"), "{e}");
}
