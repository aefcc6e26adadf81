//! What the model test is built from: what it records, its counts, the
//! disks it commits, and where and how it opens sessions.

use std::sync::Arc;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::{BlockDev, WriteFlags, ZeroFlags};
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::ChunkId;
use roamdisk_roam::cache::SharedChoice;
use roamdisk_roam::session::dev::{CasDev, SessionOpen};

/// The unit of the generated disks' content (and of dedup between them).
const BLOCK: usize = 4096;
/// Most chunks of a disk: one gather batch of a checkout
/// (`roamdisk_roam::view::GATHER_BATCH`), so it runs on one thread.
const MAX_CHUNKS: u64 = 64;

/// What the model knows of a version that was reported committed.
pub struct Recorded {
    pub image: String,
    pub id: ChunkId,
    pub bytes: Arc<Vec<u8>>,
    pub key: Option<Key>,
    /// Its package and every object it references.
    pub needs: Vec<ChunkId>,
}

/// A session and what it must read.
pub struct Session {
    pub dir: tempfile::TempDir,
    /// `None` while closed (after a failed reopen: opened again, faults
    /// off, before the next use).
    pub dev: Option<CasDev>,
    pub bytes: Vec<u8>,
    pub target: String,
    pub key: Option<Key>,
}

/// Counts over a run, reported at the end.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub seeds: u64,
    pub steps: u64,
    pub faults_injected: u64,
    pub crashes: u64,
    pub objects_lost: u64,
    pub power_cuts: u64,
    pub gcs_meanwhile: u64,
    pub commits: [u64; 2],
    pub checkouts: [u64; 2],
    pub gcs: [u64; 2],
    pub sessions_started: [u64; 2],
    pub session_commits: [u64; 2],
    pub reads: [u64; 2],
    pub versions_recorded: u64,
    pub versions_checked: u64,
    /// Commits that failed because a gc took them for dead (their lease
    /// was gone).
    pub lease_lost: u64,
    /// Incomplete versions a failed commit left in a catalog, telling the
    /// user to remove them (removed).
    pub removed_as_told: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        let pair = |a: &mut [u64; 2], b: &[u64; 2]| {
            a[0] += b[0];
            a[1] += b[1];
        };
        self.seeds += o.seeds;
        self.steps += o.steps;
        self.faults_injected += o.faults_injected;
        self.crashes += o.crashes;
        self.objects_lost += o.objects_lost;
        self.power_cuts += o.power_cuts;
        self.gcs_meanwhile += o.gcs_meanwhile;
        pair(&mut self.commits, &o.commits);
        pair(&mut self.checkouts, &o.checkouts);
        pair(&mut self.gcs, &o.gcs);
        pair(&mut self.sessions_started, &o.sessions_started);
        pair(&mut self.session_commits, &o.session_commits);
        pair(&mut self.reads, &o.reads);
        self.versions_recorded += o.versions_recorded;
        self.versions_checked += o.versions_checked;
        self.lease_lost += o.lease_lost;
        self.removed_as_told += o.removed_as_told;
    }
}

/// Count an outcome: `[succeeded, failed]`.
pub fn count<T, E>(c: &mut [u64; 2], r: &Result<T, E>) {
    c[r.is_err() as usize] += 1;
}

/// The disks commits are made of: random blocks, zero blocks, and blocks
/// of a small pool drawn again and again (dedup inside and across disks).
pub struct Disks {
    pool: Vec<Vec<u8>>,
}

impl Disks {
    pub fn new(rng: &mut Rng) -> Disks {
        Disks {
            pool: (0..8).map(|_| rng.bytes(BLOCK)).collect(),
        }
    }

    /// A random disk of whole sectors: blocks of new random data, blocks
    /// from the pool (repeated: dedup), zero blocks (whole pages become
    /// holes of the device), blocks with a zero sector inside (ZERO
    /// sectors); or `prev` with a few blocks changed.
    pub fn disk(&self, rng: &mut Rng, prev: Option<&[u8]>) -> Vec<u8> {
        let (mut d, change): (Vec<u8>, Vec<usize>) = match prev {
            Some(p) => {
                let n = p.len().div_ceil(BLOCK) as u64;
                let k = 1 + rng.below(4);
                let change = (0..k).map(|_| rng.below(n) as usize).collect();
                (p.to_vec(), change)
            }
            None => {
                let n = 16 + rng.below(MAX_CHUNKS - 16 + 1) as usize;
                let cut = rng.below(8) as usize * 512;
                (vec![0u8; n * BLOCK - cut], (0..n).collect())
            }
        };
        for b in change {
            let a = b * BLOCK;
            let e = (a + BLOCK).min(d.len());
            let content: Vec<u8> = match rng.below(10) {
                0..=2 => vec![0u8; BLOCK],
                3..=5 => self.block(rng),
                6 => {
                    let mut v = rng.bytes(BLOCK);
                    let s = rng.below(8) as usize * 512;
                    v[s..s + 512].fill(0);
                    v
                }
                _ => rng.bytes(BLOCK),
            };
            d[a..e].copy_from_slice(&content[..e - a]);
        }
        d
    }

    /// A block of the pool.
    pub fn block(&self, rng: &mut Rng) -> Vec<u8> {
        self.pool[rng.below(self.pool.len() as u64) as usize].clone()
    }

    /// `bytes` on a memory device; whole zero pages are left unallocated
    /// (holes, which a commit does not read).
    pub fn device(rng: &mut Rng, bytes: &[u8]) -> MemDev {
        let dev = MemDev::new(bytes.len() as u64);
        dev.write_at(bytes, 0, WriteFlags::default()).unwrap();
        const PAGE: usize = 65536;
        for p in (0..bytes.len() / PAGE).map(|p| p * PAGE) {
            if bytes[p..p + PAGE].iter().all(|&b| b == 0) && rng.chance(2, 3) {
                dev.write_zeroes(p as u64, PAGE as u64, ZeroFlags::default())
                    .unwrap();
            }
        }
        dev
    }
}

/// A folder for a session: in memory where the host has `/dev/shm`
/// (sessions sync their files; on a disk that is most of the run's time).
pub fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// How the model opens sessions: no shared cache (the host's would make
/// the test depend on what other runs left there, and its background
/// writer on timing), nothing in the background.
pub fn session_open() -> SessionOpen {
    SessionOpen {
        shared_cache: SharedChoice::Off,
        no_prefetch: true,
        no_readahead: true,
        ..Default::default()
    }
}
