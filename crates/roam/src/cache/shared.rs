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
//! Crash safety: a chunk file is written under `tmp/`, made durable, and
//! renamed into `chunks/` before the journal names it; files are removed
//! only after the journal says so. Opening the cache reconciles the two
//! (files the journal does not name are removed, names without a file are
//! dropped), so after `kill -9` or a power cut the cache holds exactly
//! what it can serve, and never a partial chunk.

use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{durable, Op, Result};
use roamdisk_cachesim::{HashIndex, Policy, PolicySpec};
use serde::{Deserialize, Serialize};

use super::hoard_marks::{self, HoardMark, Protected};
use super::journal::{self, Kind, Record, HEADER_LEN};
use super::pins;
use crate::fetch::Admission;
use roamdisk_chunkstore::error::{bad_arg, corrupt, err, io};
use roamdisk_chunkstore::hash::ChunkId;

/// Chunks the writer stores per `syncfs`.
const WRITE_BATCH: usize = 256;
/// Chunks held in memory waiting for the writer (64 MiB of 64 KiB chunks).
const MAX_PENDING: usize = 1024;

pub const CONFIG_MAGIC: &str = "roamdisk-shared-cache";
/// The `cache.toml` version new caches get. Version 2 adds hoard marks
/// (`hoards/`): a cache of version 1 is upgraded when its first version is
/// hoarded, so that builds which would ignore the marks refuse it instead
/// of evicting hoarded chunks.
pub const CONFIG_VERSION: u32 = 2;
/// The oldest `cache.toml` version this build opens.
pub const CONFIG_MIN_VERSION: u32 = 1;

/// `cache.toml`: fixed when the cache is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CacheConfig {
    pub magic: String,
    pub version: u32,
    /// The byte cap.
    pub size: u64,
    /// The largest chunk the cache holds, in bytes; the cap holds
    /// `size / unit` chunks.
    pub unit: u32,
    /// The replacement policy (`roamdisk sim` syntax: `lru`, `fmpq`, ...).
    pub policy: String,
}

/// Settings for a cache created by [`SharedCache::open`].
#[derive(Debug, Clone)]
pub struct CacheOptions {
    pub size: u64,
    pub unit: u32,
    pub policy: String,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            size: 4 << 30,
            unit: 64 << 10,
            policy: "lru".into(),
        }
    }
}

/// Counters since the cache was opened by this process.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub hit_bytes: u64,
    pub inserted: u64,
    pub refused: u64,
    pub evicted: u64,
}

/// The cache's contents by its journal, at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Resident chunks and their sizes.
    pub resident: HashMap<ChunkId, u32>,
    pub bytes: u64,
    /// Records in the journal since it was last rewritten.
    pub journal_records: u64,
}

/// What [`SharedCache::evict`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Evicted {
    pub chunks: u64,
    pub bytes: u64,
    /// Resident chunks kept: a running session pins them.
    pub kept_pinned: u64,
    /// Resident chunks kept: a hoarded version holds them.
    pub kept_hoarded: u64,
    /// Hoard marks released (`all`).
    pub released: u64,
}

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

struct Inner {
    dir: PathBuf,
    config: CacheConfig,
    /// `cache.toml`'s version now (a hoard upgrades 1 to 2).
    format_version: std::sync::atomic::AtomicU32,
    /// What the hoard marks keep, as of the last look (under the lock).
    hoards: Mutex<Protected>,
    capacity: usize,
    spec: PolicySpec,
    lock: File,
    state: Mutex<State>,
    /// Open chunk files and their lengths.
    fds: RwLock<HashMap<ChunkId, (Arc<File>, u64)>>,
    fd_cap: usize,
    touches: Mutex<HashSet<ChunkId>>,
    /// Chunks handed to [`SharedCache::insert`] and not yet stored: reads
    /// are served from here meanwhile.
    pending: Mutex<HashMap<ChunkId, Arc<Vec<u8>>>>,
    drained: Condvar,
    /// Chunks handed to [`SharedCache::insert`] that the cache refused,
    /// kept for the session that reads them to store privately.
    refused: Mutex<HashMap<ChunkId, Arc<Vec<u8>>>>,
    refused_any: std::sync::atomic::AtomicBool,
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    inserted: AtomicU64,
    refused_n: AtomicU64,
    evicted: AtomicU64,
    tmp_seq: AtomicU64,
}

/// The replicated state: what the journal says, applied in order.
struct State {
    journal: Option<File>,
    ino: u64,
    pos: u64,
    records: u64,
    policy: Box<dyn Policy<ChunkId>>,
    /// Resident chunks: size and the sequence number of their last
    /// reference (compaction writes them back oldest first).
    resident: HashMap<ChunkId, (u32, u64)>,
    bytes: u64,
    seq: u64,
}

impl State {
    fn new(spec: &PolicySpec, capacity: usize) -> State {
        State {
            journal: None,
            ino: 0,
            pos: HEADER_LEN as u64,
            records: 0,
            policy: spec.build::<ChunkId, HashIndex<ChunkId>>(capacity),
            resident: HashMap::new(),
            bytes: 0,
            seq: 0,
        }
    }

    /// Apply one record; returns the key the policy evicted, if any.
    fn apply(&mut self, r: &Record) -> Option<ChunkId> {
        self.seq += 1;
        self.records += 1;
        let evicted = |o: roamdisk_cachesim::Outcome<ChunkId>| match o {
            roamdisk_cachesim::Outcome::Miss { evicted } => evicted,
            roamdisk_cachesim::Outcome::Hit => None,
        };
        match r.kind {
            Kind::Insert(size) => {
                if let Some((old, _)) = self.resident.insert(r.id, (size, self.seq)) {
                    self.bytes -= old as u64;
                }
                self.bytes += size as u64;
                evicted(self.policy.access(r.id))
            }
            Kind::Touch => match self.resident.get_mut(&r.id) {
                Some(e) => {
                    e.1 = self.seq;
                    evicted(self.policy.access(r.id))
                }
                None => None,
            },
            Kind::Evict => {
                if let Some((size, _)) = self.resident.remove(&r.id) {
                    self.bytes -= size as u64;
                }
                self.policy.remove(&r.id);
                None
            }
        }
    }
}

/// Journal records written by one holder of the lock.
struct Batch<'a> {
    state: &'a mut State,
    bytes: Vec<u8>,
}

impl Batch<'_> {
    fn emit(&mut self, kind: Kind, id: ChunkId) -> Option<ChunkId> {
        let r = Record { kind, id };
        self.bytes.extend_from_slice(&r.encode());
        self.state.apply(&r)
    }
}

fn chunk_rel(id: &ChunkId) -> PathBuf {
    let hex = id.to_hex();
    PathBuf::from(&hex[..2]).join(&hex)
}

impl Inner {
    fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        self.dir.join("chunks").join(chunk_rel(id))
    }
    /// The open file of chunk `id` (kept open for later hits), its bytes
    /// still waiting for the writer, or absent (also when the file is not
    /// `len` bytes long: not the chunk the index describes, never served).
    fn open_chunk(&self, id: &ChunkId, len: usize) -> Result<Opened> {
        let me = self;
        let f = me.fds.read().get(id).cloned();
        match f {
            Some((_, flen)) if flen != len as u64 => Ok(Opened::Absent),
            Some((f, _)) => Ok(Opened::File(f)),
            None => {
                if let Some(d) = me.pending.lock().get(id) {
                    return Ok(Opened::Pending(d.clone()));
                }
                let p = me.chunk_path(id);
                let f = match File::open(&p) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(Opened::Absent)
                    }
                    Err(e) => return Err(io(Op::Open, e, &p)),
                };
                let m = f.metadata().map_err(|e| io(Op::Read, e, &p))?;
                if m.len() != len as u64 {
                    return Ok(Opened::Absent);
                }
                let f = Arc::new(f);
                let mut fds = me.fds.write();
                if fds.len() >= me.fd_cap {
                    fds.clear();
                }
                fds.insert(*id, (f.clone(), m.len()));
                Ok(Opened::File(f))
            }
        }
    }

    fn journal_path(&self) -> PathBuf {
        self.dir.join("journal")
    }
    fn hoards_dir(&self) -> PathBuf {
        self.dir.join("hoards")
    }

    /// Make `cache.toml` version 2 before the first hoard mark is written
    /// (the caller holds the lock).
    fn upgrade_config(&self) -> Result<()> {
        if self.format_version.load(Ordering::Relaxed) >= 2 {
            return Ok(());
        }
        let path = self.dir.join("cache.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| io(Op::Read, e, &path))?;
        let mut c: CacheConfig = toml::from_str(&text)
            .map_err(|e| corrupt(format!("cache.toml: {}", e.message())).path(&path))?;
        if c.version < 2 {
            c.version = 2;
            let text = toml::to_string(&c).expect("config serialises");
            durable::write_atomically(&path, text.as_bytes())
                .map_err(|e| io(Op::Write, e, &path))?;
        }
        self.format_version.store(c.version, Ordering::Relaxed);
        Ok(())
    }

    /// The hoard marks' chunks, up to date (the caller holds the lock).
    fn hoarded(&self) -> Result<parking_lot::MutexGuard<'_, Protected>> {
        let mut h = self.hoards.lock();
        h.refresh(&self.hoards_dir())?;
        Ok(h)
    }

    /// Run `f` holding this process's state and the directory's lock,
    /// with the state caught up with the journal.
    fn locked<T>(&self, f: impl FnOnce(&Inner, &mut State) -> Result<T>) -> Result<T> {
        let mut st = self.state.lock();
        rustix::fs::flock(&self.lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(Op::Write, e.into(), &self.dir.join("lock")))?;
        let out = self.catch_up(&mut st).and_then(|()| f(self, &mut st));
        let _ = rustix::fs::flock(&self.lock, rustix::fs::FlockOperation::Unlock);
        out
    }

    /// Apply the records other processes appended since we last looked
    /// (all of them if the journal was replaced by a compaction), and cut
    /// a torn tail left by a writer that died mid-append.
    fn catch_up(&self, st: &mut State) -> Result<()> {
        let path = self.journal_path();
        let ino = match std::fs::metadata(&path) {
            Ok(m) => m.ino(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                durable::write_atomically(&path, &journal::encode_header())
                    .map_err(|e| io(Op::Write, e, &path))?;
                std::fs::metadata(&path)
                    .map_err(|e| io(Op::Open, e, &path))?
                    .ino()
            }
            Err(e) => return Err(io(Op::Open, e, &path)),
        };
        if st.journal.is_none() || st.ino != ino {
            *st = State::new(&self.spec, self.capacity);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io(Op::Open, e, &path))?;
            let mut h = [0u8; HEADER_LEN];
            let n = read_full_at(&f, &mut h, 0).map_err(|e| io(Op::Read, e, &path))?;
            journal::check_header(&h[..n]).map_err(|e| {
                corrupt(format!(
                    "{e}: remove the shared cache folder to start it afresh"
                ))
                .path(&path)
            })?;
            st.journal = Some(f);
            st.ino = ino;
        }
        let f = st.journal.as_ref().expect("opened above");
        let len = f.metadata().map_err(|e| io(Op::Read, e, &path))?.len();
        if len > st.pos {
            let mut body = vec![0u8; (len - st.pos) as usize];
            let n = read_full_at(f, &mut body, st.pos).map_err(|e| io(Op::Read, e, &path))?;
            let (recs, used) = journal::decode_records(&body[..n]);
            if used < n {
                f.set_len(st.pos + used as u64)
                    .map_err(|e| io(Op::Write, e, &path))?;
            }
            st.pos += used as u64;
            for r in &recs {
                st.apply(r);
            }
        }
        Ok(())
    }

    /// Append a batch; on failure the state no longer matches the journal
    /// and is reloaded from it next time.
    fn commit(&self, st: &mut State, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let path = self.journal_path();
        let f = st.journal.as_ref().expect("caught up");
        match f.write_all_at(bytes, st.pos) {
            Ok(()) => {
                st.pos += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                st.journal = None;
                Err(io(Op::Write, e, &path))
            }
        }
    }

    /// Journal the references seen since the last batch (resident chunks
    /// only: a reference to a chunk already gone changes nothing).
    fn touches_into(&self, b: &mut Batch<'_>) {
        let ids: Vec<ChunkId> = self.touches.lock().drain().collect();
        for id in ids {
            if b.state.resident.contains_key(&id) {
                b.emit(Kind::Touch, id);
            }
        }
    }

    fn flush_touches(&self) -> Result<()> {
        if self.touches.lock().is_empty() {
            return Ok(());
        }
        self.locked(|me, st| {
            let mut b = Batch {
                state: st,
                bytes: Vec::new(),
            };
            me.touches_into(&mut b);
            let bytes = std::mem::take(&mut b.bytes);
            me.commit(st, &bytes)?;
            me.maybe_compact(st)
        })
    }

    /// Store chunks: write each under `tmp/`, make them all durable with
    /// one `syncfs`, then admit them one by one.
    fn store_many(&self, items: &[(ChunkId, Arc<Vec<u8>>)]) -> Vec<Result<Admission>> {
        let tmp_dir = self.dir.join("tmp");
        let mut staged = Vec::with_capacity(items.len());
        for (id, data) in items {
            if data.len() > self.config.unit as usize {
                staged.push(Ok(None));
                continue;
            }
            let tmp = tmp_dir.join(format!(
                "{}.{}.{}",
                id.to_hex(),
                std::process::id(),
                self.tmp_seq.fetch_add(1, Ordering::Relaxed)
            ));
            let wrote = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .and_then(|f| f.write_all_at(data, 0));
            staged.push(match wrote {
                Ok(()) => Ok(Some(tmp)),
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    Err(io(Op::Write, e, &tmp))
                }
            });
        }
        let synced =
            File::open(&tmp_dir).and_then(|d| rustix::fs::syncfs(&d).map_err(std::io::Error::from));
        items
            .iter()
            .zip(staged)
            .map(|((id, data), st)| {
                let tmp = match st? {
                    Some(t) => t,
                    None => return Ok(Admission::Refused),
                };
                let out = match &synced {
                    Ok(()) => self.admit(*id, data.len() as u32, &tmp),
                    Err(e) => Err(io(
                        Op::Flush,
                        std::io::Error::new(e.kind(), e.to_string()),
                        &tmp_dir,
                    )),
                };
                let _ = std::fs::remove_file(&tmp);
                out
            })
            .collect()
    }

    fn admit(&self, id: ChunkId, size: u32, tmp: &Path) -> Result<Admission> {
        self.locked(|me, st| {
            let mut b = Batch {
                state: st,
                bytes: Vec::new(),
            };
            me.touches_into(&mut b);
            if b.state.resident.contains_key(&id) {
                let bytes = std::mem::take(&mut b.bytes);
                me.commit(st, &bytes)?;
                return Ok(Admission::Admitted);
            }
            let full = b.state.resident.len() >= me.capacity;
            // Kept from eviction: chunks of running sessions (pin sets)
            // and of hoarded versions (hoard marks).
            let (pinned, hoarded) = if full {
                (pins::live(&me.dir.join("pins"))?, Some(me.hoarded()?))
            } else {
                (HashSet::new(), None)
            };
            let kept = |k: &ChunkId| {
                pinned.contains(k) || hoarded.as_ref().is_some_and(|h| h.ids.contains(k))
            };
            if full && b.state.resident.keys().all(kept) {
                let bytes = std::mem::take(&mut b.bytes);
                me.commit(st, &bytes)?;
                return Ok(Admission::Refused);
            }
            let path = me.chunk_path(&id);
            let parent = path.parent().expect("fan-out folder");
            std::fs::create_dir_all(parent).map_err(|e| io(Op::Write, e, parent))?;
            std::fs::rename(tmp, &path).map_err(|e| io(Op::Write, e, &path))?;
            let mut victims = Vec::new();
            let mut ev = b.emit(Kind::Insert(size), id);
            let mut turns = 2 * me.capacity + 2;
            while let Some(v) = ev {
                if turns == 0 {
                    // Nothing unpinned came up: take the new chunk out again.
                    b.emit(Kind::Evict, id);
                    b.emit(Kind::Touch, v);
                    break;
                }
                turns -= 1;
                ev = if kept(&v) {
                    b.emit(Kind::Touch, v)
                } else {
                    b.emit(Kind::Evict, v);
                    victims.push(v);
                    None
                };
            }
            let admitted = b.state.resident.contains_key(&id);
            if !admitted {
                victims.push(id);
            }
            let bytes = std::mem::take(&mut b.bytes);
            if let Err(e) = me.commit(st, &bytes) {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            {
                let mut fds = me.fds.write();
                for v in &victims {
                    fds.remove(v);
                }
            }
            for v in &victims {
                let _ = std::fs::remove_file(me.chunk_path(v));
            }
            me.evicted.fetch_add(
                victims.len() as u64 - u64::from(!admitted),
                Ordering::Relaxed,
            );
            me.maybe_compact(st)?;
            Ok(if admitted {
                Admission::Admitted
            } else {
                Admission::Refused
            })
        })
    }

    /// Rewrite the journal once it is mostly history: one insert record
    /// per resident chunk, oldest reference first (the policy restarts
    /// from that order in every process).
    fn maybe_compact(&self, st: &mut State) -> Result<()> {
        let live = st.resident.len() as u64;
        if st.records < 4096.max(8 * live) {
            return Ok(());
        }
        self.rewrite(st)
    }

    fn rewrite(&self, st: &mut State) -> Result<()> {
        let mut order: Vec<(u64, ChunkId, u32)> = st
            .resident
            .iter()
            .map(|(id, &(size, seq))| (seq, *id, size))
            .collect();
        order.sort_unstable();
        let mut bytes = journal::encode_header().to_vec();
        for (_, id, size) in order {
            bytes.extend_from_slice(
                &Record {
                    kind: Kind::Insert(size),
                    id,
                }
                .encode(),
            );
        }
        let path = self.journal_path();
        durable::write_atomically(&path, &bytes).map_err(|e| io(Op::Write, e, &path))?;
        // Reload from the new file, as every other process will.
        st.journal = None;
        self.catch_up(st)
    }

    /// Make the files and the journal agree (under the lock): remove
    /// files the journal does not name, drop names without a whole file,
    /// and clear temporaries of processes that died mid-write.
    fn reconcile(&self, st: &mut State) -> Result<(u64, u64)> {
        let chunks = self.dir.join("chunks");
        let mut seen = HashSet::new();
        let mut orphans = 0u64;
        for fan in read_dir_names(&chunks)? {
            let sub = chunks.join(&fan);
            for name in read_dir_names(&sub)? {
                let p = sub.join(&name);
                match ChunkId::from_hex(&name) {
                    Some(id) if name.starts_with(&fan) && st.resident.contains_key(&id) => {
                        let want = st.resident[&id].0 as u64;
                        match std::fs::metadata(&p) {
                            Ok(m) if m.len() == want => {
                                seen.insert(id);
                            }
                            _ => {
                                let _ = std::fs::remove_file(&p);
                                orphans += 1;
                            }
                        }
                    }
                    _ => {
                        let _ = std::fs::remove_file(&p);
                        orphans += 1;
                    }
                }
            }
        }
        let missing: Vec<ChunkId> = st
            .resident
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        let mut b = Batch {
            state: st,
            bytes: Vec::new(),
        };
        for id in &missing {
            b.emit(Kind::Evict, *id);
        }
        let bytes = std::mem::take(&mut b.bytes);
        self.commit(st, &bytes)?;
        hoard_marks::remove_temporaries(&self.hoards_dir())?;
        let tmp = self.dir.join("tmp");
        for name in read_dir_names(&tmp)? {
            // Only temporaries of processes that are gone: ours and live
            // ones carry a live pid.
            let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<i32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = std::fs::remove_file(tmp.join(&name));
            }
        }
        Ok((orphans, missing.len() as u64))
    }
}

fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(|e| io(Op::Read, e, dir))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(Op::Read, e, dir)),
    }
}

/// What [`SharedCache::open_chunk`] found.
enum Opened {
    File(Arc<File>),
    Pending(Arc<Vec<u8>>),
    Absent,
}

/// File descriptors to keep open for hits: half the soft limit, at most
/// 65,536 (the soft limit is raised to the hard one first).
fn fd_budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 256;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max.min(1 << 20),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
    }
    let budget = ((lim.rlim_cur / 2) as usize).clamp(64, 65536);
    grow_fd_table(budget + 256, lim.rlim_cur);
    budget
}

/// Make the process's file-descriptor table large enough for `want`
/// descriptors now, once. The kernel grows the table by doubling when an
/// open needs a higher number, and in a process with several threads each
/// growth waits for an RCU grace period: 5-15 ms measured here at 256,
/// 512, 1024 and 2048 descriptors, every one of them a guest read stalled
/// behind the open of a chunk file. Done at open, it costs that once.
fn grow_fd_table(want: usize, limit: u64) {
    let hi = (want as u64).min(limit.saturating_sub(1)) as libc::c_int;
    if hi <= 3 {
        return;
    }
    // SAFETY: dup2 onto a descriptor number this process does not use
    // (checked with fcntl first), closed again at once; no Rust object
    // owns that number.
    unsafe {
        if libc::fcntl(hi, libc::F_GETFD) != -1 {
            return; // already in use: the table is that large already
        }
        if libc::dup2(libc::STDERR_FILENO, hi) == hi {
            libc::close(hi);
        }
    }
}

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
        let lock_path = dir.join("lock");
        let lock = roamdisk_chunkstore::error::open_lock_file(&lock_path)?;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            state: Mutex::new(State::new(&spec, capacity)),
            format_version: std::sync::atomic::AtomicU32::new(config.version),
            hoards: Mutex::new(Protected::default()),
            config,
            capacity,
            spec,
            lock,
            fds: RwLock::new(HashMap::new()),
            fd_cap: fd_budget(),
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
                "shared cache {}: removed {orphans} files the journal did not name, dropped {missing} names without a whole file",
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
                me.fds.write().remove(id);
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
    /// background; reads are served from memory until then.
    pub fn insert(&self, id: ChunkId, data: Arc<Vec<u8>>) {
        let me = &*self.inner;
        {
            let mut p = me.pending.lock();
            // Past this, chunks arrive faster than the disk takes them:
            // leave them out rather than hold them all in memory.
            if p.contains_key(&id) || p.len() >= MAX_PENDING {
                return;
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
            let mut b = Batch {
                state: st,
                bytes: Vec::new(),
            };
            b.emit(Kind::Evict, *id);
            let bytes = std::mem::take(&mut b.bytes);
            me.commit(st, &bytes)?;
            me.fds.write().remove(id);
            let _ = std::fs::remove_file(&path);
            me.evicted.fetch_add(1, Ordering::Relaxed);
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
            let mut b = Batch {
                state: st,
                bytes: Vec::new(),
            };
            for v in &victims {
                b.emit(Kind::Evict, *v);
            }
            let bytes = std::mem::take(&mut b.bytes);
            me.commit(st, &bytes)?;
            {
                let mut fds = me.fds.write();
                for v in &victims {
                    fds.remove(v);
                }
            }
            for v in &victims {
                let _ = std::fs::remove_file(me.chunk_path(v));
            }
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

impl Inner {
    /// Count an admission; a refused chunk handed over in the background
    /// (`keep`) is kept for its session to take.
    fn count(&self, id: ChunkId, a: Admission, keep: Option<&Arc<Vec<u8>>>) {
        match a {
            Admission::Admitted => self.inserted.fetch_add(1, Ordering::Relaxed),
            Admission::Refused => {
                if let Some(data) = keep {
                    let mut r = self.refused.lock();
                    // Beyond this nobody is taking them: the session
                    // fetches such a chunk again when it reads it.
                    if r.len() < MAX_PENDING {
                        r.insert(id, data.clone());
                        self.refused_any.store(true, Ordering::Relaxed);
                    }
                }
                self.refused_n.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// The writer thread: stores handed-over chunks, and journals references
/// at least once a second.
fn writer(me: &Inner, rx: mpsc::Receiver<ChunkId>) {
    loop {
        let first = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(id) => id,
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = me.flush_touches() {
                    tracing::warn!("shared cache: {e}");
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = me.flush_touches();
                return;
            }
        };
        let mut ids = vec![first];
        while ids.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
        }
        let items: Vec<(ChunkId, Arc<Vec<u8>>)> = {
            let p = me.pending.lock();
            ids.iter()
                .filter_map(|id| p.get(id).map(|d| (*id, d.clone())))
                .collect()
        };
        for ((id, data), out) in items.iter().zip(me.store_many(&items)) {
            match out {
                Ok(a) => me.count(*id, a, Some(data)),
                Err(e) => tracing::warn!("shared cache: chunk {} not stored: {e}", id.short()),
            }
        }
        let mut p = me.pending.lock();
        for id in &ids {
            p.remove(id);
        }
        if p.is_empty() {
            me.drained.notify_all();
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

/// Where the host's shared cache lives unless told otherwise:
/// `$ROAMDISK_SHARED_CACHE` (`off` turns it off), else
/// `$XDG_CACHE_HOME/roamdisk/shared`, else `~/.cache/roamdisk/shared`.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var("ROAMDISK_SHARED_CACHE") {
        Ok(s) if s == "off" => return None,
        Ok(s) if !s.is_empty() => return Some(PathBuf::from(s)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("roamdisk/shared"))
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

/// Which shared cache a disk uses: the host's default, none, or a folder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SharedChoice {
    #[default]
    Default,
    Off,
    Dir(PathBuf),
}

impl SharedChoice {
    /// A layer option's value: `off`, or a folder.
    pub fn parse(v: Option<&str>) -> SharedChoice {
        match v {
            None => SharedChoice::Default,
            Some("off") => SharedChoice::Off,
            Some(d) => SharedChoice::Dir(PathBuf::from(d)),
        }
    }

    pub fn open(&self) -> Result<Option<Arc<SharedCache>>> {
        let dir = match self {
            SharedChoice::Off => return Ok(None),
            SharedChoice::Dir(d) => d.clone(),
            SharedChoice::Default => match default_dir() {
                Some(d) => d,
                None => return Ok(None),
            },
        };
        host(&dir).map(Some)
    }
}
