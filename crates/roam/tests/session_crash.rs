//! Power cuts in a `cas:` session: seeded random writes (aligned and not),
//! zeroes, trims, flushes and FUA writes, and between any two of them a
//! power cut — the process gone with no last flush, the private cache
//! reduced to what it had synced plus a random part of the writes since
//! (each lost, landed or torn by sector: `CrashDev::crash_image`); half the
//! time the cache's power fails at one of its next I/Os instead, inside a
//! write, a flush's checkpoint or the next open's recovery (which then
//! runs again); and
//! sometimes a torn record at the end of the write-ahead log (a flush cut
//! short, never acknowledged); now and then a flush holds more than a log
//! record takes and checkpoints instead. The session is then opened again, first
//! read-only (the log's records laid over the cache in memory), then
//! writable (replayed and checkpointed), and every sector must read as the
//! value of the last acknowledged flush or a value written after it:
//! nothing a flush acknowledged is lost, nothing reads that was never
//! written there. Longer runs: `ROAMDISK_SESSION_CRASH_SEEDS=COUNT`.

#![allow(
    clippy::disallowed_methods,
    reason = "a test reads its seed count from the environment"
)]

mod crash_cache;

use std::sync::Arc;

use crash_cache::{registry, session_over, Model, CACHES};
use roamdisk_blockdev::testkit::{Countdown, CrashDev, Rng};
use roamdisk_blockdev::{BlockDev, WriteFlags, ZeroFlags};
use roamdisk_chunkstore::store::{self, StoreConfig};
use roamdisk_roam::session::dev::{CasDev, SessionOpen};
use roamdisk_roam::session::wal;

const SIZE: u64 = 4 << 20;
const SECTORS: u64 = SIZE / 512;

fn base_bytes() -> Vec<u8> {
    (0..SIZE as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect()
}

fn read_all(d: &CasDev) -> Vec<u8> {
    let mut v = vec![0u8; SIZE as usize];
    d.read_at(&mut v, 0).unwrap();
    v
}

/// A torn record at the log's end: the start of a record that was being
/// written when the power went (right magic, generation and sequence
/// number, the rest cut off or garbage).
fn tear_log_end(dir: &std::path::Path, rng: &mut Rng) {
    use std::os::unix::fs::FileExt;
    let p = dir.join("wal");
    let bytes = std::fs::read(&p).unwrap();
    let r = wal::replay(&bytes, SECTORS).unwrap();
    let rec = wal::Record {
        seq: r.records.len() as u64 + 1,
        runs: vec![roamdisk_blockdev::overlay::Run {
            start: rng.below(SECTORS),
            count: 1,
            state: 3,
        }],
        extents: vec![],
        data: vec![],
    };
    let (mut b, _) = wal::encode_record(&r.head, r.chain, &rec);
    let cut = 8 + rng.below(b.len() as u64 - 8) as usize;
    b[cut] ^= 0x5a;
    if r.end + b.len() as u64 <= r.head.capacity {
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&b[..cut + 1], r.end).unwrap();
    }
}

fn cache_crashed(c: &CrashDev) -> bool {
    let mut b = [0u8; 512];
    c.read_at(&mut b, 0).is_err()
}

fn run_seed(seed: u64, crashes: usize) -> usize {
    let mut rng = Rng::new(seed);
    let (t, loc) = roamdisk_blockdev::testkit::scratch("store");
    let st = store::open(
        loc.to_str().unwrap(),
        &store::OpenOptions {
            create: Some(StoreConfig::default()),
            ..Default::default()
        },
    )
    .unwrap();
    let base = base_bytes();
    let (sdir, key) = session_over(&st, &loc, t.path(), &base);
    // Half the time the private cache's power fails at one of its next
    // 1-60 I/Os: inside a write, a flush's checkpoint, or the recovery of
    // the next open.
    let install = |img: Vec<u8>, rng: &mut Rng| {
        let power = if rng.chance(1, 2) {
            Countdown::crash_at(1 + rng.below(60))
        } else {
            Countdown::unarmed()
        };
        let dev = Arc::new(CrashDev::from_image(img, power));
        CACHES.lock().insert(key.clone(), dev.clone());
        dev
    };
    let mut cache = install(vec![0u8; SIZE as usize], &mut rng);
    let reg = registry();
    let open = |read_only: bool| {
        CasDev::open(
            &sdir,
            &SessionOpen {
                read_only,
                no_prefetch: true,
                no_readahead: true,
                ..Default::default()
            },
            &reg,
        )
    };
    let mut model = Model::new(&base);
    let mut dev = open(false).unwrap();
    let mut points = 0;
    for _ in 0..crashes {
        // Each step's result: an error is the power failing (nothing it
        // did is acknowledged), and the steps stop there.
        let mut cut = false;
        for _ in 0..1 + rng.below(24) {
            let done = match rng.below(10) {
                0..=3 => {
                    // Whole sectors, some all zeroes (ZERO by P1); now and
                    // then more than a log record takes (that flush
                    // checkpoints instead).
                    let n = if rng.chance(1, 20) {
                        2100 + rng.below(3000)
                    } else {
                        1 + rng.below(16)
                    };
                    let s = rng.below(SECTORS - n + 1);
                    let data = if rng.chance(1, 6) {
                        vec![0u8; (n * 512) as usize]
                    } else {
                        rng.bytes((n * 512) as usize)
                    };
                    let fua = rng.chance(1, 8);
                    model.write(s * 512, &data);
                    let r = dev.write_at(&data, s * 512, WriteFlags { fua });
                    if fua && r.is_ok() {
                        model.flushed();
                    }
                    r
                }
                4 => {
                    // Not sector-aligned (a read-modify-write).
                    let off = rng.below(SIZE - 3000);
                    let n = 1 + rng.below(2000) as usize;
                    let data = rng.bytes(n);
                    model.write(off, &data);
                    dev.write_at(&data, off, WriteFlags::default())
                }
                5 => {
                    let s = rng.below(SECTORS - 64);
                    let n = 1 + rng.below(64);
                    model.write(s * 512, &vec![0u8; (n * 512) as usize]);
                    if rng.chance(1, 2) {
                        dev.trim(s * 512, n * 512, WriteFlags::default())
                    } else {
                        dev.write_zeroes(s * 512, n * 512, ZeroFlags::default())
                    }
                }
                _ => {
                    let r = dev.flush();
                    if r.is_ok() {
                        model.flushed();
                    }
                    r
                }
            };
            if done.is_err() {
                cut = true;
                break;
            }
        }
        if !cut {
            assert_eq!(
                read_all(&dev),
                model.now,
                "seed {seed}: reads before the crash"
            );
        }
        // The power goes (or went).
        dev.abandon();
        loop {
            cache = install(cache.crash_image(&mut rng), &mut rng);
            if rng.chance(1, 3) {
                tear_log_end(&sdir, &mut rng);
            }
            points += 1;
            let ro = open(true).unwrap();
            let got = read_all(&ro);
            model.check(
                &got,
                &format!("seed {seed}, read-only open after crash {points}"),
            );
            drop(ro);
            match open(false) {
                Ok(d) => {
                    let again = read_all(&d);
                    assert_eq!(
                        again, got,
                        "seed {seed}: the writable open reads what the read-only one did"
                    );
                    model.reset_to(&again);
                    dev = d;
                    break;
                }
                // The power failed during the recovery: again.
                Err(_) => assert!(
                    cache_crashed(&cache),
                    "seed {seed}: open failed: no power cut"
                ),
            }
        }
    }
    drop(dev);
    CACHES.lock().remove(&key);
    points
}

#[test]
fn no_acknowledged_flush_is_lost_to_a_power_cut() {
    let seeds: u64 = std::env::var("ROAMDISK_SESSION_CRASH_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut points = 0;
    for seed in 1..=seeds {
        points += run_seed(seed, 25);
    }
    eprintln!("{points} power cuts, none lost a flushed write");
    assert!(points >= seeds as usize * 25);
}
