//! What the session crash tests share: `crashcache:PATH`, a private cache
//! that is a `CrashDev` registered under PATH (so a test decides what its
//! unsynced writes become), a session over a base version, and the model
//! of what a power cut may leave.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::spec::{LayerKind, OpenCtx};
use roamdisk_blockdev::testkit::CrashDev;
use roamdisk_blockdev::{BlockDev, Registry, WriteFlags};
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, Source};
use roamdisk_chunkstore::store::DynStore;
use roamdisk_chunkstore::{ChunkId, NoProgress};
use roamdisk_roam::session::{self, SessionConfig};

/// The private caches of the test's sessions, by path.
pub static CACHES: LazyLock<Mutex<HashMap<String, Arc<CrashDev>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `crashcache:PATH`: the `CrashDev` registered under PATH.
static CRASH_CACHE: LayerKind = LayerKind {
    name: "crashcache",
    summary: "test: a private cache that can lose its unsynced writes",
    args: &["path"],
    open: |ctx: &OpenCtx<'_>, _next| {
        let p = ctx.get("crashcache", "path")?;
        let dev = CACHES.lock().get(p).cloned().expect("registered cache");
        Ok(dev as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};

/// The built-in layers and `crashcache:`.
pub fn registry() -> Registry {
    let mut r = Registry::with_builtin();
    r.add(&CRASH_CACHE);
    r
}

/// Commit `base` to `store` (at `loc`) as golden/base and make a session
/// of it in DIR/sess that commits to alice/desk, its private cache
/// `crashcache:`: the session folder and the cache's key in [`CACHES`].
pub fn session_over(store: &DynStore, loc: &Path, dir: &Path, base: &[u8]) -> (PathBuf, String) {
    let size = base.len() as u64;
    let disk = MemDev::new(size);
    disk.write_at(base, 0, WriteFlags::default()).unwrap();
    let s = commit_image(
        &**store,
        Source::Dev(&disk),
        &CommitOptions {
            target: "golden/base".into(),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let v1 = ChunkId::from_hex(&s.version).unwrap();
    let sdir = dir.join("sess");
    let mut cfg = SessionConfig::new(loc.to_str().unwrap(), "alice/desk");
    cfg.cache = "crashcache:cache".into();
    session::create(&sdir, &cfg, v1, size).unwrap();
    let key = sdir.join("cache").display().to_string();
    (sdir, key)
}

/// What each 512-byte sector of a disk may read as after a power cut: its
/// value at the last acknowledged flush or one written since (CRC-32C sums).
pub struct Model {
    /// The disk now (what a read returns before a crash).
    pub now: Vec<u8>,
    allowed: Vec<Vec<u32>>,
}

fn sum(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

impl Model {
    pub fn new(base: &[u8]) -> Model {
        Model {
            now: base.to_vec(),
            allowed: base.chunks(512).map(|c| vec![sum(c)]).collect(),
        }
    }

    /// `data` written at `off`.
    pub fn write(&mut self, off: u64, data: &[u8]) {
        self.now[off as usize..off as usize + data.len()].copy_from_slice(data);
        for s in off / 512..(off + data.len() as u64).div_ceil(512) {
            let v = sum(&self.now[s as usize * 512..(s as usize + 1) * 512]);
            self.allowed[s as usize].push(v);
        }
    }

    /// Sectors `[a, b)` durable as they read now (a FUA write).
    pub fn durable(&mut self, a: u64, b: u64) {
        for s in a as usize..b as usize {
            self.allowed[s] = vec![sum(&self.now[s * 512..(s + 1) * 512])];
        }
    }

    /// A flush was acknowledged: every sector durable as it reads now.
    pub fn flushed(&mut self) {
        self.durable(0, self.allowed.len() as u64);
    }

    /// Check a whole disk read after a crash.
    pub fn check(&self, got: &[u8], what: &str) {
        for (s, allowed) in self.allowed.iter().enumerate() {
            let v = sum(&got[s * 512..(s + 1) * 512]);
            assert!(
                allowed.contains(&v),
                "{what}: sector {s} reads a value that was neither flushed last nor written since"
            );
        }
    }

    /// The disk as read after a recovery, its new durable state.
    pub fn reset_to(&mut self, got: &[u8]) {
        self.now = got.to_vec();
        self.flushed();
    }
}
