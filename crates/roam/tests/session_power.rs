//! A power cut at every I/O of a `cas:` session: the private cache
//! (`CrashDev`), the session map, the write-ahead log and the open marker
//! (on the simulated file system, `testkit::simfs`) share one I/O
//! countdown, so the power fails at the N-th I/O of any of them, for every
//! N of a workload from the session's first open on: inside a write to
//! the cache, a log append or a log restart, the map's compaction or
//! rebase, the marker's write or removal. Unsynced writes are lost, kept
//! or torn by sector (the cache's in any order; the files' as a file
//! system would: sectors that held data keep old or new bytes, new
//! sectors may read as zeroes, renames and creates only after their
//! folder's sync).
//!
//! Each cut is rebooted twice (different survivors). The session must open
//! read-only and then writable (replaying the log), and every sector must
//! read as its content at the last acknowledged flush or one written
//! since; the writable open must read what the read-only one did. Every
//! fifth reboot then commits what was recovered (an update commit) and the
//! new version must read exactly as the recovered session did.
//!
//! The workloads: reads (which keep base chunks in the cache), aligned and
//! unaligned writes (read-modify-write), FUA
//! writes, zeroes, trims, flushes, clean closes and reopens; the log is
//! kept small (64 KiB) so that flushes also restart it and checkpoint.
//! 8 workloads (about 5,000 cuts) in the test command;
//! `ROAMDISK_CRASH_LONG=1` runs 16 (over 10,000), `ROAMDISK_SESSION_POWER_SEEDS=N`
//! any number.

#![allow(
    clippy::disallowed_methods,
    reason = "a test reads its seed count from the environment"
)]

mod crash_cache;

use std::path::PathBuf;
use std::sync::Arc;

use crash_cache::{registry, session_over, Model, CACHES};
use roamdisk_blockdev::testkit::simfs::SimFs;
use roamdisk_blockdev::testkit::{Countdown, CrashDev, Rng};
use roamdisk_blockdev::{BlockDev, Registry, WriteFlags, ZeroFlags};
use roamdisk_chunkstore::commit::CommitOptions;
use roamdisk_chunkstore::store::mem::MemStore;
use roamdisk_chunkstore::store::{DynStore, StoreConfig};
use roamdisk_chunkstore::NoProgress;
use roamdisk_roam::session::dev::{CasDev, Files, SessionOpen};
use roamdisk_roam::session::update::{commit_session, UpdateOptions};
use roamdisk_roam::session::wal;
use roamdisk_roam::view::AheadTarget;

const SIZE: u64 = 256 << 10;
const SECTORS: u64 = SIZE / 512;
const OPS: usize = 40;
/// The store's default chunk size.
const CHUNK: u64 = 64 << 10;

#[derive(Debug, Clone)]
enum Op {
    Write {
        off: u64,
        seed: u64,
        len: usize,
        fua: bool,
    },
    Zero {
        s: u64,
        n: u64,
        trim: bool,
    },
    Read {
        off: u64,
        len: usize,
    },
    /// What read-ahead does with a base chunk it fetched: its EMPTY
    /// sectors go into the cache as CLEAN (the guest's writes then change
    /// them in place).
    Keep {
        chunk: usize,
    },
    Flush,
    Reopen,
}

fn workload(seed: u64) -> Vec<Op> {
    let mut r = Rng::new(seed);
    (0..OPS)
        .map(|k| match r.below(17) {
            15 | 16 => Op::Keep {
                chunk: r.below(SIZE / CHUNK) as usize,
            },
            12..=14 => {
                // Reads keep the base's chunks in the cache (CLEAN sectors,
                // which later writes change in place).
                let len = 1 + r.below(40_000) as usize;
                Op::Read {
                    off: r.below(SIZE - len as u64),
                    len,
                }
            }
            0..=4 => {
                let n = 1 + r.below(24);
                let s = r.below(SECTORS - n + 1);
                Op::Write {
                    off: s * 512,
                    seed: seed << 16 | k as u64,
                    len: (n * 512) as usize,
                    fua: r.chance(1, 8),
                }
            }
            5 => {
                // Not sector-aligned (a read-modify-write).
                let len = 1 + r.below(1500) as usize;
                Op::Write {
                    off: r.below(SIZE - len as u64),
                    seed: seed << 16 | k as u64,
                    len,
                    fua: false,
                }
            }
            6 => {
                let n = 1 + r.below(64);
                Op::Zero {
                    s: r.below(SECTORS - n + 1),
                    n,
                    trim: r.chance(1, 2),
                }
            }
            7..=9 => Op::Flush,
            10 => Op::Reopen,
            _ => {
                // All zeroes (zero detection at write time).
                let n = 1 + r.below(16);
                Op::Write {
                    off: r.below(SECTORS - n + 1) * 512,
                    seed: 0,
                    len: (n * 512) as usize,
                    fua: false,
                }
            }
        })
        .collect()
}

fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    if seed == 0 {
        vec![0; len]
    } else {
        Rng::new(seed).bytes(len)
    }
}

fn read_all(d: &dyn BlockDev) -> Vec<u8> {
    let mut v = vec![0u8; SIZE as usize];
    d.read_at(&mut v, 0).unwrap();
    v
}

/// One workload's fixed parts: a store holding the base version, a session
/// folder made for it (its `session.toml` and lock stay on the real file
/// system; its map starts on the simulated one).
struct Setup {
    _t: tempfile::TempDir,
    store: DynStore,
    sdir: PathBuf,
    states: Vec<u8>,
    base: Vec<u8>,
    key: String,
    reg: Registry,
}

fn setup(seed: u64) -> Setup {
    let (t, loc) = roamdisk_blockdev::testkit::scratch("store");
    // In memory: the store is not what this test cuts the power of, and a
    // commit to it should cost no fsync.
    let st: DynStore = Arc::new(MemStore::new(StoreConfig::default()));
    let base = Rng::new(seed ^ 0xba5e).bytes(SIZE as usize);
    let (sdir, key) = session_over(&st, &loc, t.path(), &base);
    let states = std::fs::read(sdir.join("states")).unwrap();
    let reg = registry();
    Setup {
        _t: t,
        store: st,
        sdir,
        states,
        base,
        key,
        reg,
    }
}

impl Setup {
    fn open(&self, fs: &SimFs, read_only: bool) -> roamdisk_blockdev::Result<CasDev> {
        CasDev::open_on(
            &self.sdir,
            &SessionOpen {
                read_only,
                no_prefetch: true,
                no_readahead: true,
                files: Files(Arc::new(fs.clone())),
                wal_capacity: Some(wal::MIN_CAPACITY),
                ..Default::default()
            },
            &self.reg,
            self.store.clone(),
        )
    }

    fn install(&self, cache: Arc<CrashDev>) {
        CACHES.lock().insert(self.key.clone(), cache);
    }

    /// A fresh simulated file system holding the new session's map.
    fn fresh(&self, countdown: Arc<Countdown>) -> SimFs {
        let fs = SimFs::new(countdown);
        fs.put(&self.sdir.join("states"), &self.states);
        fs
    }

    /// Run `ops` from the session's first open until they end or the power
    /// fails; the model of what was acknowledged.
    fn run(&self, fs: &SimFs, ops: &[Op]) -> Model {
        let mut m = Model::new(&self.base);
        let Ok(mut dev) = self.open(fs, false) else {
            return m;
        };
        for op in ops {
            let done = match *op {
                Op::Write {
                    off,
                    seed,
                    len,
                    fua,
                } => {
                    let data = bytes_of(seed, len);
                    m.write(off, &data);
                    let r = dev.write_at(&data, off, WriteFlags { fua });
                    if fua && r.is_ok() {
                        // FUA makes this write durable (the session flushes
                        // all to do it; the model asks only for this one).
                        m.durable(off / 512, (off + len as u64).div_ceil(512));
                    }
                    r
                }
                Op::Zero { s, n, trim } => {
                    m.write(s * 512, &vec![0u8; (n * 512) as usize]);
                    if trim {
                        dev.trim(s * 512, n * 512, WriteFlags::default())
                    } else {
                        dev.write_zeroes(s * 512, n * 512, ZeroFlags::default())
                    }
                }
                Op::Read { off, len } => {
                    let mut b = vec![0u8; len];
                    let r = dev.read_at(&mut b, off);
                    if r.is_ok() {
                        assert_eq!(b, m.now[off as usize..off as usize + len], "a read");
                    }
                    r
                }
                Op::Keep { chunk } => {
                    let c = chunk as u64 * CHUNK;
                    dev.keep(chunk, &self.base[c as usize..(c + CHUNK) as usize]);
                    Ok(())
                }
                Op::Flush => {
                    let r = dev.flush();
                    if r.is_ok() {
                        m.flushed();
                    }
                    r
                }
                Op::Reopen => {
                    // A clean close flushes: durable once the reopen works.
                    drop(dev);
                    match self.open(fs, false) {
                        Ok(d) => {
                            dev = d;
                            m.flushed();
                            Ok(())
                        }
                        Err(_) => return m,
                    }
                }
            };
            if done.is_err() {
                dev.abandon();
                return m;
            }
        }
        if !fs.crashed() {
            assert_eq!(read_all(&dev), m.now, "the live session");
        }
        // The process ends without a last flush.
        dev.abandon();
        m
    }
}

/// Every cut of workload `seed`; the number of cuts.
fn check_workload(seed: u64) -> u64 {
    let s = setup(seed);
    let ops = workload(seed);
    let total = {
        let cd = Countdown::unarmed();
        s.install(Arc::new(CrashDev::new(SIZE as usize, cd.clone())));
        s.run(&s.fresh(cd.clone()), &ops);
        cd.spent()
    };
    for n in 1..=total + 1 {
        let cd = Countdown::crash_at(n);
        let cache = Arc::new(CrashDev::new(SIZE as usize, cd.clone()));
        s.install(cache.clone());
        let fs = s.fresh(cd);
        let m = s.run(&fs, &ops);
        for reboot in 0..2u64 {
            let ctx = format!("seed {seed}, power cut at I/O {n} of {total}, reboot {reboot}");
            let mut rng = Rng::new(seed * 1_000_003 + n * 7 + reboot);
            let up = Countdown::unarmed();
            s.install(Arc::new(CrashDev::from_image(
                cache.crash_image(&mut rng),
                up.clone(),
            )));
            let after = fs.after_crash(&mut rng, up);
            let ro = s
                .open(&after, true)
                .unwrap_or_else(|e| panic!("{ctx}: read-only open: {e}"));
            let got = read_all(&ro);
            m.check(&got, &format!("{ctx}, read-only"));
            drop(ro);
            let rw = s
                .open(&after, false)
                .unwrap_or_else(|e| panic!("{ctx}: writable open: {e}"));
            assert_eq!(
                read_all(&rw),
                got,
                "{ctx}: the writable open reads differently"
            );
            if (n + reboot).is_multiple_of(5) {
                // What was recovered goes into a new version, whole.
                let opts = UpdateOptions {
                    commit: CommitOptions::default(),
                    p1: true,
                    p2: false,
                    p3: false,
                };
                commit_session(
                    &rw,
                    &opts,
                    &roamdisk_roam::guest::FsmetaAnalyzer,
                    &NoProgress,
                )
                .unwrap_or_else(|e| panic!("{ctx}: commit: {e}"));
                assert_eq!(read_all(&*rw.base()), got, "{ctx}: the committed version");
                assert_eq!(read_all(&rw), got, "{ctx}: the rebased session");
            }
            drop(rw);
        }
    }
    CACHES.lock().remove(&s.key);
    total + 1
}

#[test]
fn a_power_cut_at_any_io_loses_no_flushed_write() {
    let long = std::env::var_os("ROAMDISK_CRASH_LONG").is_some();
    let seeds: u64 = std::env::var("ROAMDISK_SESSION_POWER_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if long { 16 } else { 8 });
    let points: u64 = (1..=seeds).map(check_workload).sum();
    eprintln!("session power cuts: {seeds} workloads, {points} cuts, 2 reboots each");
    assert!(points >= seeds * 100, "only {points} cuts");
}
