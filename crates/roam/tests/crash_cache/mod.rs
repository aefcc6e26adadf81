//! What the session crash tests share: `crashcache:PATH`, a private cache
//! that is a `CrashDev` registered under PATH (so a test decides what its
//! unsynced writes become), and a session over a base version.

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
