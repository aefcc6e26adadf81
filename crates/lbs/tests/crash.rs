//! Crash consistency of LBS: a random workload of writes, zeroes, trims,
//! FUA writes and flushes runs against an image on crash-simulating storage
//! (data device and metadata log share one I/O countdown). For every crash
//! point N the power fails at the N-th I/O: unflushed data writes are lost,
//! reordered or torn at sector granularity, the unsynced log tail is cut or
//! torn. The image is reopened and every block is checked against a model:
//!
//! * a block holds either its content at the last completed flush or one of
//!   the contents written to it after that flush (including by the request
//!   that was cut), never anything else, and never fails its checksum;
//! * the reopened image accepts new writes and survives another reopen.
//!
//! The small geometry (1 KiB blocks, 16-block clusters, 4-block buffer, a
//! tiny log-compaction limit) makes garbage collection and log compaction
//! run many times, so crashes land inside both, and every write stream
//! (clients' warm and hot writes, the collector's cold and hot moves) is
//! used. *Tight* workloads (seeds from [`TIGHT`] on) fill the disk first,
//! then only write, on an image with the least spare space there is (101%
//! overprovisioning: 3 spare clusters for 4 write streams), so writes also
//! run out of clusters and retire the streams' active clusters.
//!
//! `ROAMDISK_CRASH_LONG=1` checks every crash point of 40 workloads and 4
//! tight ones (over 20,000 points); the default checks a subset.

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]

use roamdisk_blockdev::testkit::{Countdown, Rng};
use roamdisk_blockdev::{BlockDev, WriteFlags, ZeroFlags};
use roamdisk_lbs::create::{CreateOptions, Encryption};
use roamdisk_lbs::gc::{GcPolicy, Weights};
use roamdisk_lbs::testkit::MemImage;
use roamdisk_lbs::{ChecksumKind, LbsOptions};

const BS: usize = 1024;
const BLOCKS: u64 = 96;
const OPS: usize = 220;
/// Seeds from here on are tight workloads.
const TIGHT: u64 = 1000;

#[derive(Debug, Clone, Copy)]
enum Op {
    Write { lbn: u64, n: u64, fua: bool },
    Zero { lbn: u64, n: u64 },
    Trim { lbn: u64, n: u64 },
    Flush,
}

fn workload(seed: u64) -> Vec<Op> {
    let mut r = Rng::new(seed);
    let tight = seed >= TIGHT;
    let fill = (0..BLOCKS / 4).filter(|_| tight).map(|i| Op::Write {
        lbn: i * 4,
        n: 4,
        fua: false,
    });
    fill.chain((0..OPS).map(|_| {
        let lbn = r.below(BLOCKS);
        let n = 1 + r.below(4.min(BLOCKS - lbn));
        match r.below(20) {
            0..=12 => Op::Write { lbn, n, fua: false },
            13 => Op::Write { lbn, n, fua: true },
            14..=16 if tight => Op::Write { lbn, n, fua: false },
            14 | 15 => Op::Zero { lbn, n },
            16 => Op::Trim { lbn, n },
            _ => Op::Flush,
        }
    }))
    .collect()
}

fn create_opts(seed: u64) -> CreateOptions {
    CreateOptions {
        size: BLOCKS * BS as u64,
        block_size: BS as u32,
        cluster_size: 16 * BS as u32,
        overprovision_pct: if seed >= TIGHT { 101 } else { 130 },
        checksum: ChecksumKind::ALL[(seed % 4) as usize],
        encryption: if seed % 2 == 1 {
            Encryption::RawKey(
                [7u8; 32]
                    .iter()
                    .chain([9u8; 32].iter())
                    .copied()
                    .collect::<Vec<_>>()
                    .try_into()
                    .unwrap(),
            )
        } else {
            Encryption::None
        },
    }
}

fn lbs_opts() -> LbsOptions {
    LbsOptions {
        read_only: false,
        buffer_size: 4 * BS,
        background_gc: false,
        gc: Some(GcPolicy {
            low: 3,
            high: 4,
            weights: Weights::default(),
            emptiness_dominates_below: Some(0.25),
            cost_benefit: true,
        }),
        compact_limit: 6 * 1024,
    }
}

/// The content of version `v` of block `lbn`: identity header + filler.
fn block(lbn: u64, v: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    b[..8].copy_from_slice(&lbn.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    let mut x = lbn.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ v;
    for c in b[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    b
}

/// Per block: the values it may hold after a crash (None = zeroes).
struct Model {
    cur: Vec<Option<u64>>,
    allowed: Vec<Vec<Option<u64>>>,
}

impl Model {
    fn new() -> Model {
        Model {
            cur: vec![None; BLOCKS as usize],
            allowed: vec![vec![None]; BLOCKS as usize],
        }
    }
    fn set(&mut self, lbn: u64, v: Option<u64>) {
        self.allowed[lbn as usize].push(v);
    }
    fn ack(&mut self, lbn: u64, v: Option<u64>) {
        self.cur[lbn as usize] = v;
    }
    fn flushed(&mut self) {
        for (a, c) in self.allowed.iter_mut().zip(&self.cur) {
            *a = vec![*c];
        }
    }
}

/// Run the workload until the countdown fires. Returns the image, the model
/// and the I/Os spent.
fn run(
    seed: u64,
    countdown: std::sync::Arc<Countdown>,
) -> (MemImage, Model, u64, Option<roamdisk_lbs::StatsSnapshot>) {
    let img = MemImage::new(&create_opts(seed), countdown.clone());
    let mut m = Model::new();
    let Ok(dev) = img.open(lbs_opts()) else {
        return (img, m, countdown.spent(), None);
    };
    let mut version = 0u64;
    for op in workload(seed) {
        let ok = match op {
            Op::Write { lbn, n, fua } => {
                let mut buf = Vec::new();
                let first = version + 1;
                for i in 0..n {
                    version += 1;
                    buf.extend_from_slice(&block(lbn + i, version));
                    m.set(lbn + i, Some(version));
                }
                let ok = dev
                    .write_at(&buf, lbn * BS as u64, WriteFlags { fua })
                    .is_ok();
                if ok {
                    for i in 0..n {
                        m.ack(lbn + i, Some(first + i));
                    }
                    if fua {
                        // FUA makes this write durable; with LBS it is a full barrier.
                        m.flushed();
                    }
                }
                ok
            }
            Op::Zero { lbn, n } | Op::Trim { lbn, n } => {
                for i in 0..n {
                    m.set(lbn + i, None);
                }
                let r = match op {
                    Op::Zero { .. } => {
                        dev.write_zeroes(lbn * BS as u64, n * BS as u64, ZeroFlags::default())
                    }
                    _ => dev.trim(lbn * BS as u64, n * BS as u64, WriteFlags::default()),
                };
                if r.is_ok() {
                    for i in 0..n {
                        m.ack(lbn + i, None);
                    }
                }
                r.is_ok()
            }
            Op::Flush => {
                let ok = dev.flush().is_ok();
                if ok {
                    m.flushed();
                }
                ok
            }
        };
        if !ok {
            break;
        }
    }
    let spent = countdown.spent();
    let stats = dev.stats();
    drop(dev);
    (img, m, spent, Some(stats))
}

fn verify(seed: u64, n: u64, img: &MemImage, m: &Model) {
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003) ^ n);
    let after = img.after_crash(&mut rng, Countdown::unarmed());
    let dev = after
        .open(lbs_opts())
        .unwrap_or_else(|e| panic!("seed {seed} crash at {n}: reopen failed: {e}"));
    let mut b = vec![0u8; BS];
    for lbn in 0..BLOCKS {
        dev.read_at(&mut b, lbn * BS as u64)
            .unwrap_or_else(|e| panic!("seed {seed} crash at {n}: block {lbn} unreadable: {e}"));
        let got = if b.iter().all(|&x| x == 0) {
            None
        } else {
            let l = u64::from_le_bytes(b[..8].try_into().unwrap());
            let v = u64::from_le_bytes(b[8..16].try_into().unwrap());
            assert!(
                l == lbn && b == block(lbn, v),
                "seed {seed} crash at {n}: block {lbn} holds garbage"
            );
            Some(v)
        };
        assert!(
            m.allowed[lbn as usize].contains(&got),
            "seed {seed} crash at {n}: block {lbn} holds {got:?}, allowed {:?}",
            m.allowed[lbn as usize]
        );
    }
    // The recovered image keeps working.
    dev.write_at(&block(0, u64::MAX), 0, WriteFlags { fua: true })
        .unwrap();
    drop(dev);
    let dev = after.open(lbs_opts()).unwrap();
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, block(0, u64::MAX));
}

#[test]
fn every_crash_point_recovers_to_a_consistent_image() {
    let long = std::env::var("ROAMDISK_CRASH_LONG").is_ok_and(|v| v == "1");
    // (seed, step between crash points)
    let runs: Vec<(u64, u64)> = if long {
        (0..40).chain(TIGHT..TIGHT + 4).map(|s| (s, 1)).collect()
    } else {
        (0..4).map(|s| (s, 5)).chain([(TIGHT, 29)]).collect()
    };
    let seeds = runs.len() as u64;
    let mut points = 0u64;
    let mut gc_runs = 0u64;
    let mut compactions = 0u64;
    let mut streams = [0u64; roamdisk_lbs::gc::STREAMS];
    let mut retires = 0u64;
    for (seed, step) in runs {
        let (img, m, total, stats) = run(seed, Countdown::unarmed());
        let s = stats.expect("a clean run opens");
        gc_runs += s.gc_clusters;
        compactions += s.compactions;
        for (t, n) in streams.iter_mut().zip(s.stream_blocks) {
            *t += n;
        }
        retires += s.retires;
        // A clean run must read back its final state exactly.
        {
            let dev = img.open(lbs_opts()).unwrap();
            let mut b = vec![0u8; BS];
            for lbn in 0..BLOCKS {
                dev.read_at(&mut b, lbn * BS as u64).unwrap();
                let want = m.cur[lbn as usize]
                    .map(|v| block(lbn, v))
                    .unwrap_or_else(|| vec![0u8; BS]);
                assert_eq!(b, want, "seed {seed}: clean run, block {lbn}");
            }
        }
        let mut n = 1 + seed % step;
        while n <= total {
            let (img, m, _, _) = run(seed, Countdown::crash_at(n));
            verify(seed, n, &img, &m);
            points += 1;
            n += step;
        }
    }
    eprintln!("crash points checked: {points} over {seeds} workloads (GC runs in clean workloads {gc_runs}, compactions {compactions}, blocks per stream {streams:?}, retires {retires})");
    if long {
        assert!(
            points >= 20_000,
            "long mode must check at least 20,000 crash points, checked {points}"
        );
    }
    assert!(
        streams.iter().all(|&n| n > 0) && retires > 0,
        "the workload must use every write stream ({streams:?}) and run out of clusters ({retires})"
    );
    assert!(
        gc_runs > 0 && compactions > seeds,
        "the workload must exercise GC ({gc_runs}) and compaction ({compactions})"
    );
}
