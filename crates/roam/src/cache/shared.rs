//! The shared cache: one directory per host, used by every session of
//! every user on it (Machine Bank's second-level cache, seed section 3.1).
//! Chunks are kept decoded and verified, one file each, named by chunk
//! id; a hit is a `pread` of the bytes asked for from an open file: no
//! hash, no copy of the whole chunk. Layout and journal:
//! `docs/formats/cas-shared-cache.md`.
//!
//! Several processes share the directory. The resident set and the
//! replacement policy (any policy of `roamdisk-cachesim`, the same code
//! the simulator runs) are a replicated state machine: every change is a
//! record appended to `journal` under an exclusive `flock` on `lock`, and
//! every process applies the journal's records to its own policy in
//! journal order, so all of them hold the same state and agree on the
//! victims. A chunk named in a live pin set ([`super::pins`]) is never
//! evicted: when the policy picks one, it is referenced again and the
//! policy picks another; when every resident chunk is pinned and the cache
//! is full, a new chunk is refused (its session keeps it in its private
//! cache instead).
//!
//! This file is the cache's face; its parts are the settings
//! (`config.rs`), the journal's state machine (`state.rs`), the chunk
//! files (`files.rs`) and the admission, writer and reconciliation
//! (`inner.rs`).
//!
//! Crash safety: a chunk file is written under `tmp/`, made durable, and
//! renamed into `chunks/` before the journal names it; files are removed
//! only after the journal says so. Opening the cache reconciles the two by
//! names (files the journal does not name are removed, names without a
//! file are dropped); a file cut short is dropped when it is first opened.
//! So after `kill -9` or a power cut the cache serves exactly what it
//! holds whole, never a partial chunk.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{durable, Op, Result};
use roamdisk_cachesim::PolicySpec;

pub use super::config::{
    CacheConfig, CacheOptions, CacheStats, Evicted, Snapshot, CONFIG_MAGIC, CONFIG_MIN_VERSION,
    CONFIG_VERSION,
};
use super::files::ChunkFiles;
use super::hoard_marks::{self, HoardMark, Protected};
use super::inner::{writer, Inner, Opened, MAX_PENDING};
use super::journal::Kind;
use super::pins;
use super::state::{Batch, Journal};
use crate::fetch::Admission;
use roamdisk_chunkstore::error::{bad_arg, corrupt, err, io};
use roamdisk_chunkstore::hash::ChunkId;

/// A host's shared chunk cache.
pub struct SharedCache {
    inner: Arc<Inner>,
    worker: Mutex<Option<(mpsc::Sender<ChunkId>, JoinHandle<()>)>>,
    /// Opens chunk files and starts their reading ahead of a sequential
    /// reader ([`SharedCache::will_need`]), off the reader's path.
    advisor: Mutex<Option<Advisor>>,
}

/// The read-ahead thread and the queue to it: (chunk, length).
type Advisor = (mpsc::SyncSender<(ChunkId, usize)>, JoinHandle<()>);

/// Read-ahead requests waiting for the advisor thread; more are dropped.
const ADVICE_QUEUE: usize = 64;

impl SharedCache {
    /// Open the shared cache in `dir`, creating it with `create` if the
    /// folder holds none. Reconciles files and journal (see the module
    /// documentation) and starts the writer thread.
    pub fn open(dir: &Path, create: &CacheOptions) -> Result<SharedCache> {
        if !dir.exists() {
            // Decoded chunks of every image on the host: for its owner only.
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io(Op::Open, e, dir))?;
        }
        for sub in ["chunks", "tmp", "pins", "hoards"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        let cfg_path = dir.join("cache.toml");
        let config = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => {
                let c: CacheConfig = toml::from_str(&text)
                    .map_err(|e| corrupt(format!("cache.toml: {}", e.message())).path(&cfg_path))?;
                if c.magic != CONFIG_MAGIC
                    || !(CONFIG_MIN_VERSION..=CONFIG_VERSION).contains(&c.version)
                {
                    return Err(corrupt(format!(
                        "not a roamdisk shared cache of version {CONFIG_MIN_VERSION} to {CONFIG_VERSION} (magic '{}', version {}): a newer roamdisk made it, or it is not a cache",
                        c.magic, c.version
                    ))
                    .path(&cfg_path));
                }
                c
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let c = CacheConfig {
                    magic: CONFIG_MAGIC.into(),
                    version: CONFIG_VERSION,
                    size: create.size,
                    unit: create.unit,
                    policy: create.policy.clone(),
                };
                let text = toml::to_string(&c).expect("config serialises");
                let tmp = dir.join(format!("cache.toml.{}.tmp", std::process::id()));
                let made = std::fs::write(&tmp, text.as_bytes())
                    .and_then(|()| durable::rename_noreplace(&tmp, &cfg_path))
                    .and_then(|r| durable::sync_dir(dir).map(|()| r));
                let _ = std::fs::remove_file(&tmp);
                match made.map_err(|e| io(Op::Write, e, &cfg_path))? {
                    durable::Renamed::Moved => c,
                    // Another process created it first: use theirs.
                    _ => return SharedCache::open(dir, create),
                }
            }
            Err(e) => return Err(io(Op::Open, e, &cfg_path)),
        };
        if config.unit == 0 || config.size < config.unit as u64 {
            return Err(bad_arg(format!(
                "the shared cache's size ({}) must hold at least one chunk of {}",
                format_size(config.size),
                format_size(config.unit as u64)
            ))
            .path(&cfg_path));
        }
        let spec = PolicySpec::parse(&config.policy)
            .map_err(|e| bad_arg(format!("the shared cache's policy: {e}")).path(&cfg_path))?;
        let capacity = (config.size / config.unit as u64).min(u32::MAX as u64 / 4) as usize;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            journal: Journal::new(dir, spec, capacity)?,
            files: ChunkFiles::new(dir),
            format_version: std::sync::atomic::AtomicU32::new(config.version),
            hoards: Mutex::new(Protected::default()),
            config,
            capacity,
            touches: Mutex::new(HashSet::new()),
            pending: Mutex::new(HashMap::new()),
            drained: Condvar::new(),
            refused: Mutex::new(HashMap::new()),
            refused_any: std::sync::atomic::AtomicBool::new(false),
            hits: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            refused_n: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            tmp_seq: AtomicU64::new(0),
        });
        let (orphans, missing) = inner.locked(|me, st| me.reconcile(st))?;
        if orphans + missing > 0 {
            tracing::info!(
                "shared cache {}: removed {orphans} files the journal did not name, dropped {missing} names without a file",
                dir.display()
            );
        }
        let (tx, rx) = mpsc::channel::<ChunkId>();
        let me = inner.clone();
        let handle = std::thread::Builder::new()
            .name("shared-cache".into())
            .spawn(move || writer(&me, rx))
            .map_err(|e| io(Op::Open, e, dir))?;
        let (atx, arx) = mpsc::sync_channel::<(ChunkId, usize)>(ADVICE_QUEUE);
        let me = inner.clone();
        let advisor = std::thread::Builder::new()
            .name("cache-readahead".into())
            .spawn(move || {
                for (id, len) in arx {
                    if let Ok(Opened::File(f)) = me.open_chunk(&id, len) {
                        let _ = rustix::fs::fadvise(&*f, 0, None, rustix::fs::Advice::WillNeed);
                    }
                }
            })
            .map_err(|e| io(Op::Open, e, dir))?;
        Ok(SharedCache {
            inner,
            worker: Mutex::new(Some((tx, handle))),
            advisor: Mutex::new(Some((atx, advisor))),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// Start reading chunk `id` into the page cache in the background, if
    /// this cache holds it: the advisor thread opens its file (kept open
    /// for the read to come) and advises the kernel. A hint: errors are
    /// ignored, nothing counts as a hit, and requests past a full queue
    /// are dropped.
    pub fn will_need(&self, id: &ChunkId, len: usize) {
        if let Some((tx, _)) = &*self.advisor.lock() {
            let _ = tx.try_send((*id, len));
        }
    }

    /// Read `buf.len()` bytes at `off` of chunk `id` (whose decoded length
    /// is `len`) if the cache holds it. `Ok(false)`: not cached.
    pub fn read(&self, id: &ChunkId, len: usize, buf: &mut [u8], off: usize) -> Result<bool> {
        let me = &*self.inner;
        let f = match me.open_chunk(id, len)? {
            Opened::File(f) => f,
            Opened::Absent => return Ok(false),
            Opened::Pending(d) => {
                buf.copy_from_slice(&d[off..off + buf.len()]);
                return Ok(true);
            }
        };
        match f.read_exact_at(buf, off as u64) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                // Cut short since we opened it: `cache verify` truncates a
                // damaged chunk before removing it, so that processes
                // holding it open stop serving it too.
                me.files.forget(std::slice::from_ref(id));
                return Ok(false);
            }
            Err(e) => return Err(io(Op::Read, e, &me.chunk_path(id))),
        }
        me.hits.fetch_add(1, Ordering::Relaxed);
        me.hit_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        me.touches.lock().insert(*id);
        Ok(true)
    }

    /// Hand over a verified, decoded chunk. It is stored in the
    /// background; reads are served from memory until then. When chunks
    /// arrive faster than the disk takes them ([`MAX_PENDING`] waiting),
    /// the caller waits for the writer: memory stays bounded and no
    /// fetched chunk is left out (it would be fetched again next time).
    pub fn insert(&self, id: ChunkId, data: Arc<Vec<u8>>) {
        let me = &*self.inner;
        {
            let mut p = me.pending.lock();
            if p.contains_key(&id) {
                return;
            }
            while p.len() >= MAX_PENDING {
                let waited = me.drained.wait_for(&mut p, Duration::from_secs(1));
                if waited.timed_out() && !MutexGuard::unlocked(&mut p, || self.writer_running()) {
                    return;
                }
            }
            p.insert(id, data);
        }
        let sent = self
            .worker
            .lock()
            .as_ref()
            .map(|(tx, _)| tx.send(id).is_ok())
            .unwrap_or(false);
        if !sent {
            me.pending.lock().remove(&id);
        }
    }

    /// Whether the background writer is there to drain `pending`.
    fn writer_running(&self) -> bool {
        self.worker
            .lock()
            .as_ref()
            .is_some_and(|(_, h)| !h.is_finished())
    }

    /// Store one chunk now (the writer thread's work, done inline).
    pub fn insert_now(&self, id: ChunkId, data: &[u8]) -> Result<Admission> {
        let item = [(id, Arc::new(data.to_vec()))];
        self.insert_many_now(&item).pop().expect("one result")
    }

    /// Store verified, decoded chunks now, made durable together.
    pub fn insert_many_now(&self, items: &[(ChunkId, Arc<Vec<u8>>)]) -> Vec<Result<Admission>> {
        let out = self.inner.store_many(items);
        for ((id, _), a) in items.iter().zip(&out) {
            if let Ok(a) = a {
                self.inner.count(*id, *a, None);
            }
        }
        out
    }

    /// The chunks handed to [`SharedCache::insert`] and refused since, of
    /// those `wanted` picks (a session takes those of its own version, to
    /// keep them in its private cache); they are forgotten here.
    pub fn take_refused(&self, wanted: &dyn Fn(&ChunkId) -> bool) -> Vec<(ChunkId, Arc<Vec<u8>>)> {
        let mut r = self.inner.refused.lock();
        let ids: Vec<ChunkId> = r.keys().filter(|id| wanted(id)).copied().collect();
        let out = ids
            .into_iter()
            .filter_map(|id| r.remove(&id).map(|d| (id, d)))
            .collect();
        self.inner
            .refused_any
            .store(!r.is_empty(), Ordering::Relaxed);
        out
    }

    /// Whether any chunk is marked refused (a cheap check before
    /// [`SharedCache::take_refused`]).
    pub fn has_refused(&self) -> bool {
        self.inner.refused_any.load(Ordering::Relaxed)
    }

    /// Wait until every chunk handed to [`SharedCache::insert`] is stored
    /// (or refused), and journal the references seen so far.
    pub fn sync(&self) -> Result<()> {
        self.drain();
        self.inner.flush_touches()
    }

    /// [`SharedCache::sync`], then make what the cache holds survive a
    /// power cut: every chunk file under its name and every journal record
    /// (one `syncfs` of the cache's file system). A hoard calls it before
    /// it says the network may go.
    pub fn persist(&self) -> Result<()> {
        self.sync()?;
        let dir = self.dir();
        durable::sync_file_system(dir).map_err(|e| io(Op::Flush, e, dir))
    }

    /// Wait until every chunk handed to [`SharedCache::insert`] is stored
    /// or refused.
    pub fn drain(&self) {
        let me = &*self.inner;
        let mut p = me.pending.lock();
        while !p.is_empty() {
            me.drained.wait(&mut p);
        }
    }

    /// Whether chunks handed to [`SharedCache::insert`] and not yet stored
    /// might be refused: they do not all fit beside what this process
    /// knows to be resident.
    pub fn may_refuse_pending(&self) -> bool {
        let me = &*self.inner;
        let pending: u64 = {
            let p = me.pending.lock();
            p.values().map(|d| d.len() as u64).sum()
        };
        if pending == 0 {
            return false;
        }
        // What every process has stored, as of now (other sessions fill
        // the cache too); on error, assume the worst.
        let resident = me.locked(|_, st| Ok(st.bytes)).unwrap_or(u64::MAX / 2);
        resident + pending > me.config.size
    }

    /// Keep `ids` from eviction while the guard lives.
    pub fn pin(&self, ids: &[ChunkId]) -> Result<pins::PinGuard> {
        pins::pin(&self.inner.dir.join("pins"), ids)
    }

    /// Whether the cache holds `id` (by the journal, as of now).
    pub fn contains(&self, id: &ChunkId) -> Result<bool> {
        Ok(self.contains_many(std::slice::from_ref(id))?[0])
    }

    /// Which of `ids` this host has: resident, or handed to
    /// [`SharedCache::insert`] and not yet written (reads are served from
    /// memory meanwhile). What a fetch asks before going to the store.
    pub fn has_many(&self, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let mut out = self.contains_many(ids)?;
        let p = self.inner.pending.lock();
        if !p.is_empty() {
            for (o, id) in out.iter_mut().zip(ids) {
                *o |= p.contains_key(id);
            }
        }
        Ok(out)
    }

    /// Which of `ids` the cache holds (by the journal, as of now).
    pub fn contains_many(&self, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.inner
            .locked(|_, st| Ok(ids.iter().map(|id| st.resident.contains_key(id)).collect()))
    }

    /// Resident chunks and their bytes (by the journal, as of now).
    pub fn usage(&self) -> Result<(u64, u64)> {
        self.inner
            .locked(|_, st| Ok((st.resident.len() as u64, st.bytes)))
    }

    /// Every resident chunk (by the journal, as of now), in no order.
    pub fn resident(&self) -> Result<Vec<ChunkId>> {
        self.inner
            .locked(|_, st| Ok(st.resident.keys().copied().collect()))
    }

    /// Journal records applied since the journal was last rewritten.
    pub fn journal_records(&self) -> Result<u64> {
        self.inner.locked(|_, st| Ok(st.records))
    }

    /// What the journal says is in the cache, as of now.
    pub fn snapshot(&self) -> Result<Snapshot> {
        self.inner.locked(|_, st| {
            Ok(Snapshot {
                resident: st.resident.iter().map(|(id, &(n, _))| (*id, n)).collect(),
                bytes: st.bytes,
                journal_records: st.records,
            })
        })
    }

    /// How many chunks the cap holds (`size / unit`).
    pub fn capacity(&self) -> u64 {
        self.inner.capacity as u64
    }

    /// `cache.toml`'s version (2 once a version was hoarded here).
    pub fn format_version(&self) -> u32 {
        self.inner.format_version.load(Ordering::Relaxed)
    }

    /// The file chunk `id` is kept in while it is resident.
    pub fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        self.inner.chunk_path(id)
    }

    /// The running sessions' pin sets (those of processes that are gone
    /// are removed on the way).
    pub fn pin_sets(&self) -> Result<Vec<pins::PinSet>> {
        pins::list(&self.inner.dir.join("pins"))
    }

    /// Every hoard mark, damaged ones included.
    pub fn hoard_marks(&self) -> Result<Vec<hoard_marks::Listed>> {
        hoard_marks::list(&self.inner.hoards_dir())
    }

    /// Mark a version hoarded: from now on no process evicts its chunks
    /// (those in the cache, and those that come later) until
    /// [`SharedCache::release_hoard`]. Refused, with nothing changed, if the
    /// chunks of every hoarded version together would not fit under the
    /// cap. Replaces an earlier mark of the same version.
    pub fn mark_hoard(&self, m: &HoardMark) -> Result<()> {
        self.inner.locked(|me, _| {
            let dir = me.hoards_dir();
            let mut others: HashSet<ChunkId> = HashSet::new();
            let mut versions = 0usize;
            for l in hoard_marks::list(&dir)? {
                match l.mark {
                    Ok(o) if o.version == m.version => {}
                    Ok(o) => {
                        versions += 1;
                        others.extend(o.ids);
                    }
                    Err(e) => {
                        return Err(corrupt(format!(
                            "{e}: run `roamdisk hoard --release` for that version, or remove the file"
                        ))
                        .path(&l.path))
                    }
                }
            }
            let ours = m.ids.len() as u64;
            let more = others.len() as u64 - m.ids.iter().filter(|i| others.contains(i)).count() as u64;
            let cap = me.capacity as u64;
            if ours + more > cap {
                let besides = if versions > 0 {
                    format!(
                        "; {versions} other hoarded version{} keep{} {more} more",
                        if versions == 1 { "" } else { "s" },
                        if versions == 1 { "s" } else { "" }
                    )
                } else {
                    String::new()
                };
                return Err(err(
                    roamdisk_blockdev::ErrorKind::NoSpace,
                    Op::Write,
                    format!(
                        "{}@{} needs {ours} chunks ({}) kept in the shared cache, which holds at most {cap} chunks (a cap of {}, {} per chunk){besides}. Nothing was fetched: release a hoarded version (roamdisk hoard --release USER/IMAGE), or hoard into a larger cache (--shared-cache DIR)",
                        m.name,
                        m.version.short(),
                        format_size(m.bytes),
                        format_size(me.config.size),
                        format_size(me.config.unit as u64),
                    ),
                )
                .path(&me.dir));
            }
            me.upgrade_config()?;
            hoard_marks::write(&dir, m)
        })
    }

    /// End the hoard of `version`: its chunks are evicted like any other
    /// from now on. Whether it was hoarded.
    pub fn release_hoard(&self, version: &ChunkId) -> Result<bool> {
        self.inner
            .locked(|me, _| hoard_marks::remove(&me.hoards_dir(), version))
    }

    /// Drop chunk `id`, found damaged, if it is still resident and its
    /// file is as it was checked: inode `ino`, or missing (`None`). The
    /// file is cut to nothing before it is removed, so that processes that
    /// hold it open stop serving it and fetch the chunk again.
    pub fn drop_damaged(&self, id: &ChunkId, ino: Option<u64>) -> Result<bool> {
        self.inner.locked(|me, st| {
            if !st.resident.contains_key(id) {
                return Ok(false);
            }
            let path = me.chunk_path(id);
            let now = match std::fs::metadata(&path) {
                Ok(m) => Some(m.ino()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(Op::Read, e, &path)),
            };
            if now != ino {
                // Replaced (or put back) since it was checked.
                return Ok(false);
            }
            if let Ok(f) = OpenOptions::new().write(true).open(&path) {
                let _ = f.set_len(0);
            }
            me.drop_chunk(st, id)?;
            Ok(true)
        })
    }

    /// Evict every chunk no running session pins and no hoard mark keeps.
    /// With `all`, first release every hoard and evict everything: refused
    /// while a session runs on the cache.
    pub fn evict(&self, all: bool) -> Result<Evicted> {
        self.inner.locked(|me, st| {
            let sets = pins::list(&me.dir.join("pins"))?;
            let mut out = Evicted::default();
            if all {
                if !sets.is_empty() {
                    let pids: Vec<String> = sets
                        .iter()
                        .map(|s| s.pid.map_or("?".into(), |p| p.to_string()))
                        .collect();
                    return Err(bad_arg(format!(
                        "{} session{} running on this cache (process {}): stop {} first, or evict without --all (which keeps what they pin and what is hoarded)",
                        sets.len(),
                        if sets.len() == 1 { " is" } else { "s are" },
                        pids.join(", "),
                        if sets.len() == 1 { "it" } else { "them" }
                    ))
                    .path(&me.dir));
                }
                let dir = me.hoards_dir();
                for l in hoard_marks::list(&dir)? {
                    std::fs::remove_file(&l.path).map_err(|e| io(Op::Write, e, &l.path))?;
                    out.released += 1;
                }
                durable::sync_dir(&dir).map_err(|e| io(Op::Write, e, &dir))?;
            }
            let pinned: HashSet<ChunkId> = sets.into_iter().flat_map(|s| s.ids).collect();
            let hoarded = if all { None } else { Some(me.hoarded()?) };
            let mut victims = Vec::new();
            for (id, &(size, _)) in &st.resident {
                if pinned.contains(id) {
                    out.kept_pinned += 1;
                } else if hoarded.as_ref().is_some_and(|h| h.ids.contains(id)) {
                    out.kept_hoarded += 1;
                } else {
                    victims.push(*id);
                    out.chunks += 1;
                    out.bytes += size as u64;
                }
            }
            drop(hoarded);
            let mut b = Batch::new(st);
            for v in &victims {
                b.emit(Kind::Evict, *v);
            }
            let bytes = b.take();
            me.commit(st, &bytes)?;
            me.files.remove(&victims);
            me.evicted
                .fetch_add(victims.len() as u64, Ordering::Relaxed);
            me.maybe_compact(st)?;
            Ok(out)
        })
    }

    pub fn stats(&self) -> CacheStats {
        let me = &*self.inner;
        CacheStats {
            hits: me.hits.load(Ordering::Relaxed),
            hit_bytes: me.hit_bytes.load(Ordering::Relaxed),
            inserted: me.inserted.load(Ordering::Relaxed),
            refused: me.refused_n.load(Ordering::Relaxed),
            evicted: me.evicted.load(Ordering::Relaxed),
        }
    }
}

impl Drop for SharedCache {
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.advisor.lock().take() {
            drop(tx);
            let _ = handle.join();
        }
        if let Some((tx, handle)) = self.worker.lock().take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// The shared cache in `dir`, opened once per process: every session of
/// this process uses the same instance (one writer, one set of open
/// files).
pub fn host(dir: &Path) -> Result<Arc<SharedCache>> {
    static OPEN: Mutex<Vec<(PathBuf, std::sync::Weak<SharedCache>)>> = Mutex::new(Vec::new());
    let mut open = OPEN.lock();
    open.retain(|(_, w)| w.strong_count() > 0);
    if let Some(c) = open
        .iter()
        .find(|(p, _)| p == dir)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(c);
    }
    let c = Arc::new(SharedCache::open(dir, &CacheOptions::default())?);
    open.push((dir.to_path_buf(), Arc::downgrade(&c)));
    Ok(c)
}

/// Which shared cache a disk uses: none, or the one in a folder (the
/// `roamdisk` command resolves the host's default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SharedChoice {
    #[default]
    Off,
    Dir(PathBuf),
}

impl SharedChoice {
    /// A layer option's value: `off` (or nothing), or a folder.
    pub fn parse(v: Option<&str>) -> SharedChoice {
        match v {
            None | Some("off") => SharedChoice::Off,
            Some(d) => SharedChoice::Dir(PathBuf::from(d)),
        }
    }

    pub fn open(&self) -> Result<Option<Arc<SharedCache>>> {
        match self {
            SharedChoice::Off => Ok(None),
            SharedChoice::Dir(d) => host(d).map(Some),
        }
    }
}
