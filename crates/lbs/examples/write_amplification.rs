//! Write amplification of LBS garbage collection (seed section 5.3,
//! Table 5): run a write workload against an in-memory image and report
//! blocks written to the data file per block requested.
//!
//! Usage: write_amplification [--blocks N] [--block-size 1024|4096]
//!        [--overprovision 112] [--writes W] [--pattern uniform|hotcold|zipf|working-set|sequential]
//!        [--ws-pct 10] [--hot-pct 10] [--hot-writes-pct 90] [--theta 1.1] [--prefill] [--greedy]
//!        [--background-gc [--gc-low N] [--gc-high N]] [--reopen-every N] [--seed S]
//!
//! `zipf`: block ranks drawn with probability ∝ rank^-theta (fio's
//! `random_distribution=zipf:THETA`), ranks scattered over the disk by a
//! fixed random permutation. `--background-gc`: the collector's thread
//! runs (between the watermarks, in clusters) besides the foreground
//! collection; results then vary from run to run with thread timing.
//! `--reopen-every N`: close the image and open it again every N writes
//! (a user's sessions; what the collector learnt is kept in the log).
//! Prints one JSON line.

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use std::sync::Arc;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::{Countdown, Rng};
use roamdisk_blockdev::{BlockDev, WriteFlags};
use roamdisk_lbs::create::{plan, CreateOptions, Encryption};
use roamdisk_lbs::testkit::CrashLog;
use roamdisk_lbs::{ChecksumKind, Lbs, LbsOptions};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let blocks: u64 = arg(&args, "--blocks", 65536);
    let bs: u32 = arg(&args, "--block-size", 4096);
    let op: u32 = arg(&args, "--overprovision", 112);
    let writes: u64 = arg(&args, "--writes", blocks * 3);
    let pattern: String = arg(&args, "--pattern", "uniform".to_string());
    let seed: u64 = arg(&args, "--seed", 1);
    let prefill = args.iter().any(|a| a == "--prefill");
    let o = CreateOptions {
        size: blocks * bs as u64,
        block_size: bs,
        cluster_size: 256 * 1024,
        overprovision_pct: op,
        checksum: ChecksumKind::Crc32c,
        encryption: Encryption::None,
    };
    let (header, ds, _) = plan(&o).expect("valid options");
    let data = MemDev::new(header.geometry.data_file_len());
    data.write_at(&ds.encode(), 0, WriteFlags::default())
        .unwrap();
    let log = CrashLog::new(header.encode(), Countdown::unarmed());
    let mut policy = roamdisk_lbs::gc::GcPolicy::for_clusters(header.geometry.clusters);
    policy.cost_benefit = !args.iter().any(|a| a == "--greedy");
    policy.low = arg(&args, "--gc-low", policy.low);
    policy.high = arg(&args, "--gc-high", policy.high);
    let opts = LbsOptions {
        background_gc: args.iter().any(|a| a == "--background-gc"),
        gc: Some(policy),
        ..LbsOptions::default()
    };
    let data = Arc::new(data) as Arc<dyn BlockDev>;
    let open = || Lbs::open(data.clone(), Box::new(log.clone()), None, opts.clone()).unwrap();
    let mut lbs = open();
    let reopen: u64 = arg(&args, "--reopen-every", 0);
    // Counters of the sessions closed so far (each open starts at zero).
    let mut closed = [0u64; 4];
    let block = vec![0x5au8; bs as usize];
    if prefill {
        let chunk = vec![0x33u8; 256 * 1024];
        let mut off = 0;
        while off < o.size {
            let n = (chunk.len() as u64).min(o.size - off) as usize;
            lbs.write_at(&chunk[..n], off, WriteFlags::default())
                .unwrap();
            off += n as u64;
        }
        lbs.flush().unwrap();
    }
    let before = lbs.stats();
    let tally = |s: &roamdisk_lbs::StatsSnapshot| {
        [
            s.client_blocks,
            s.physical_blocks,
            s.gc_moved,
            s.gc_clusters,
        ]
    };
    let mut r = Rng::new(seed);
    // hotcold: `--hot-writes-pct` of the writes go to `--hot-pct` of the
    // blocks (default 90% to 10%).
    let hot_pct: u64 = arg(&args, "--hot-pct", 10);
    let hot_writes: u64 = arg(&args, "--hot-writes-pct", 90);
    let hot = (blocks * hot_pct / 100).max(1);
    let ws_pct: u64 = arg(&args, "--ws-pct", 10);
    let ws = (blocks * ws_pct / 100).max(1);
    let ws_start = r.below(blocks - ws + 1);
    let theta: f64 = arg(&args, "--theta", 1.1);
    let (zipf_cdf, zipf_perm) = if pattern == "zipf" {
        let mut cdf = Vec::with_capacity(blocks as usize);
        let mut sum = 0.0;
        for k in 1..=blocks {
            sum += (k as f64).powf(-theta);
            cdf.push(sum);
        }
        let mut perm: Vec<u64> = (0..blocks).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, r.below(i as u64 + 1) as usize);
        }
        (cdf, perm)
    } else {
        (Vec::new(), Vec::new())
    };
    for i in 0..writes {
        let lbn = match pattern.as_str() {
            "sequential" => i % blocks,
            // All writes inside a working set of `--ws-pct` of the disk (a
            // database rewriting its own region, as in the seed's traces).
            "working-set" => ws_start + r.below(ws),
            "zipf" => {
                let total = zipf_cdf[zipf_cdf.len() - 1];
                let x = r.below(1 << 53) as f64 / (1u64 << 53) as f64 * total;
                zipf_perm[zipf_cdf.partition_point(|&c| c < x).min(zipf_cdf.len() - 1)]
            }
            "hotcold" => {
                if r.chance(hot_writes, 100) {
                    r.below(hot)
                } else {
                    hot + r.below(blocks - hot)
                }
            }
            _ => r.below(blocks),
        };
        lbs.write_at(&block, lbn * bs as u64, WriteFlags::default())
            .unwrap();
        if i % 64 == 63 {
            lbs.flush().unwrap();
        }
        if reopen > 0 && i % reopen == reopen - 1 {
            lbs.flush().unwrap();
            let t = tally(&lbs.stats());
            drop(lbs);
            lbs = open();
            for (c, x) in closed.iter_mut().zip(t) {
                *c += x;
            }
        }
    }
    lbs.flush().unwrap();
    let (after, before) = (tally(&lbs.stats()), tally(&before));
    let total = |k: usize| after[k] + closed[k] - before[k];
    let requested = total(0);
    let written = total(1);
    let moved = total(2);
    println!(
        "{{\"pattern\":\"{pattern}\",\"hot_pct\":{hot_pct},\"hot_writes_pct\":{hot_writes},\"theta\":{theta},\"prefill\":{prefill},\"blocks\":{blocks},\"block_size\":{bs},\"overprovision_pct\":{op},\"requested\":{requested},\"written\":{written},\"gc_moved\":{moved},\"gc_clusters\":{},\"write_amplification_pct\":{:.2}}}",
        total(3),
        (written as f64 / requested as f64 - 1.0) * 100.0
    );
}
