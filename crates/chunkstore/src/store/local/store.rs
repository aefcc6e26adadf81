//! The local store itself: its state (the folders opened once, which
//! folders received names since the last `sync`, the pack table, the
//! layout version), `open`, `init`, the paths of its files, and the
//! rewrite of `store.toml` when the first pack is written.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::fs;
use std::io::ErrorKind as IoKind;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use roamdisk_blockdev::durable::{create_dir_all_durable, sync_dir, write_then_rename};
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::files::Naming;
use super::table::PackTable;
use crate::error::{err, io, not_found};
use crate::hash::ChunkId;
use crate::store::api::prelude::*;
use crate::store::config;
use crate::store::config::StoreConfig;

/// Fan-out folders under `objects/`: one per first byte of an id.
pub(super) const FANS: usize = 256;

/// A store in a directory.
pub struct LocalStore {
    pub(super) root: PathBuf,
    pub(super) config: StoreConfig,
    /// Folders other than the fan-out ones that received a name since the
    /// last `sync` (`objects/` when a fan-out folder was created).
    pub(super) dirty_dirs: Mutex<HashSet<PathBuf>>,
    /// Fan-out folders that received a name since the last `sync`.
    pub(super) dirty_fans: [AtomicBool; FANS],
    /// When a lookup last found a fan-out folder absent (ms since `opened`,
    /// plus one; 0: not known absent). New stores make their fan-out
    /// folders only for loose objects, so a commit's lookups would
    /// otherwise fail one `open` per chunk.
    pub(super) fan_absent: [AtomicU64; FANS],
    /// When the store was opened (the clock of `fan_absent`).
    pub(super) opened: std::time::Instant,
    /// Fan-out folders, opened once: objects are created, named, touched
    /// and looked up relative to them (no walk of the whole path each time).
    pub(super) fans: Mutex<Vec<Option<Arc<OwnedFd>>>>,
    /// How unnamed files get their names here.
    pub(super) naming: Naming,
    /// Sequence number of the next temporary file.
    pub(super) seq: AtomicU64,
    /// This process's id, in temporary file names.
    pub(super) pid: u32,
    /// Where each packed object is.
    pub(super) packs: PackTable,
    /// The `packs/` folder, opened once.
    pub(super) packs_fd: Mutex<Option<Arc<OwnedFd>>>,
    /// The layout version `store.toml` declares (1: no packs yet).
    pub(super) layout: AtomicU32,
    /// Held while `store.toml` is rewritten for a new layout version.
    pub(super) layout_lock: Mutex<()>,
}

impl LocalStore {
    /// Open the store at `root`; with `create`, make a new one there if
    /// the directory has no store yet.
    pub fn open(root: &Path, create: Option<&StoreConfig>) -> Result<LocalStore> {
        let cfg_path = root.join("store.toml");
        let text = match fs::read_to_string(&cfg_path) {
            Ok(t) => t,
            Err(e) if e.kind() == IoKind::NotFound => match create {
                Some(c) => {
                    Self::init(root, c)?;
                    fs::read_to_string(&cfg_path).map_err(|e| io(Op::Open, e, &cfg_path))?
                }
                None => {
                    return Err(not_found(format!(
                        "no chunk store at {}: create one with `roamdisk store init {}`",
                        root.display(),
                        root.display()
                    )))
                }
            },
            Err(e) => return Err(io(Op::Open, e, &cfg_path)),
        };
        let (config, layout) =
            StoreConfig::parse_versioned(&text).map_err(|e| e.path(&cfg_path))?;
        for d in ["objects", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        Ok(LocalStore {
            root: root.to_path_buf(),
            config,
            dirty_dirs: Mutex::new(HashSet::new()),
            dirty_fans: std::array::from_fn(|_| AtomicBool::new(false)),
            fan_absent: std::array::from_fn(|_| AtomicU64::new(0)),
            opened: std::time::Instant::now(),
            fans: Mutex::new(vec![None; FANS]),
            naming: Naming::new(),
            seq: AtomicU64::new(0),
            pid: std::process::id(),
            packs: PackTable::default(),
            packs_fd: Mutex::new(None),
            layout: AtomicU32::new(layout),
            layout_lock: Mutex::new(()),
        })
    }

    /// Before the first pack of a store written by an older build gets a
    /// name: rewrite `store.toml` (same settings) with the layout version
    /// that has packs, durably, so older builds refuse the store rather
    /// than miss its packed objects.
    pub(super) fn upgrade_layout(&self) -> Result<()> {
        if self.layout.load(Ordering::Acquire) >= config::VERSION {
            return Ok(());
        }
        let _held = self.layout_lock.lock();
        if self.layout.load(Ordering::Acquire) >= config::VERSION {
            return Ok(());
        }
        let cfg_path = self.root.join("store.toml");
        let tmp = self.tmp_path("store.toml");
        write_then_rename(&cfg_path, &tmp, self.config.to_toml().as_bytes())
            .and_then(|()| sync_dir(&self.root))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io(Op::Write, e, &cfg_path).msg("cannot record the pack layout in store.toml")
            })?;
        self.layout.store(config::VERSION, Ordering::Release);
        Ok(())
    }

    /// Remember that `dir` received a name (fsynced by the next `sync`).
    pub(super) fn mark_dirty(&self, dir: PathBuf) {
        self.dirty_dirs.lock().insert(dir);
    }

    /// Create a new, empty store. Fails if `root` already holds one.
    pub fn init(root: &Path, config: &StoreConfig) -> Result<()> {
        let cfg_path = root.join("store.toml");
        if cfg_path.exists() {
            return Err(err(
                ErrorKind::InvalidArgument,
                Op::Open,
                format!("{} already holds a chunk store", root.display()),
            ));
        }
        // The store's own name durable too: its parent synced.
        create_dir_all_durable(root).map_err(|e| io(Op::Open, e, root))?;
        // Fan-out folders are made when an object first needs one.
        for d in ["objects", "packs", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        let tmp = root.join("tmp").join("store.toml");
        let _ = fs::remove_file(&tmp);
        write_then_rename(&cfg_path, &tmp, config.to_toml().as_bytes())
            .map_err(|e| io(Op::Write, e, &cfg_path))?;
        sync_dir(root).map_err(|e| io(Op::Write, e, root))?;
        Ok(())
    }

    /// The store's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where an object lives.
    pub fn object_path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join("objects").join(&hex[..2]).join(hex)
    }

    /// Where gc moves an object aside before it deletes it.
    pub(super) fn trash_path(&self, id: &ChunkId) -> PathBuf {
        self.root.join("trash").join(id.to_hex())
    }

    /// A new name in `tmp/` for a file being written (`what` says what).
    pub(super) fn tmp_path(&self, what: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{what}.{}.{n}", self.pid))
    }

    /// Total bytes of every stored object (used by the quota decorator).
    pub fn usage(&self) -> Result<u64> {
        let mut total = 0;
        self.list_objects(&mut |e| total += e.size)?;
        Ok(total)
    }
}

impl StoreLayer for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

/// What the tests of the local store's files share: a new store, packs in
/// it, and times set by hand.
#[cfg(test)]
pub mod testing {
    use std::fs::{self, File};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, SystemTime};

    use super::LocalStore;
    use crate::hash::ChunkId;
    use crate::store::api::prelude::*;
    use crate::store::api::PutOutcome;
    use crate::store::config::StoreConfig;

    /// A new store with the default settings in a temporary folder.
    pub fn store() -> (tempfile::TempDir, LocalStore) {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStore::open(&d.path().join("s"), Some(&StoreConfig::default())).unwrap();
        (d, s)
    }

    /// `n` small objects stored together (one pack per writing thread).
    pub fn packed(s: &LocalStore, n: u32) -> Vec<(ChunkId, Vec<u8>)> {
        let codec = s.config().codec();
        let objs: Vec<(ChunkId, Vec<u8>)> = (0..n)
            .map(|i| {
                let sealed = codec.seal(&i.to_le_bytes().repeat(100), false);
                (sealed.id, sealed.object)
            })
            .collect();
        let items: Vec<(ChunkId, &[u8])> = objs.iter().map(|(id, b)| (*id, &b[..])).collect();
        assert!(s
            .put_many(&items)
            .unwrap()
            .iter()
            .all(|o| *o == PutOutcome::Stored));
        s.sync().unwrap();
        objs
    }

    /// The store's pack files, sorted.
    pub fn pack_files(s: &LocalStore) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(s.packs_path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    }

    /// Set the modification time of `p`.
    pub fn set_mtime(p: &Path, t: SystemTime) {
        File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    pub fn hour() -> Duration {
        Duration::from_secs(3600)
    }
}
