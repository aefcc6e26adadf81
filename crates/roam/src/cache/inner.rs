//! The shared cache's working parts, under its public face
//! (`shared.rs`): this process's view of the directory — the journal
//! (`state.rs`), the chunk files (`files.rs`), chunks waiting for the
//! writer thread — and what changes the cache: storing and admitting
//! chunks (the policy picks victims; pinned and hoarded chunks are never
//! evicted), journaling references, and reconciling files with the
//! journal when the cache opens.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use roamdisk_blockdev::{durable, Op, Result};
use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::hash::ChunkId;

use super::config::CacheConfig;
use super::files::{read_dir_names, ChunkFiles};
use super::hoard_marks::{self, Protected};
use super::journal::Kind;
use super::pins;
use super::state::{Batch, Journal, State};
use crate::fetch::Admission;

/// Chunks the writer stores per `syncfs`.
const WRITE_BATCH: usize = 256;
/// Chunks held in memory waiting for the writer (64 MiB of 64 KiB chunks).
pub(super) const MAX_PENDING: usize = 1024;

pub(super) struct Inner {
    pub(super) dir: PathBuf,
    pub(super) config: CacheConfig,
    /// `cache.toml`'s version now (a hoard upgrades 1 to 2).
    pub(super) format_version: std::sync::atomic::AtomicU32,
    /// What the hoard marks keep, as of the last look (under the lock).
    pub(super) hoards: Mutex<Protected>,
    pub(super) capacity: usize,
    pub(super) journal: Journal,
    pub(super) files: ChunkFiles,
    pub(super) touches: Mutex<HashSet<ChunkId>>,
    /// Chunks handed to [`SharedCache::insert`] and not yet stored: reads
    /// are served from here meanwhile.
    pub(super) pending: Mutex<HashMap<ChunkId, Arc<Vec<u8>>>>,
    pub(super) drained: Condvar,
    /// Chunks handed to [`SharedCache::insert`] that the cache refused,
    /// kept for the session that reads them to store privately.
    pub(super) refused: Mutex<HashMap<ChunkId, Arc<Vec<u8>>>>,
    pub(super) refused_any: std::sync::atomic::AtomicBool,
    pub(super) hits: AtomicU64,
    pub(super) hit_bytes: AtomicU64,
    pub(super) inserted: AtomicU64,
    pub(super) refused_n: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(super) tmp_seq: AtomicU64,
}

/// What [`SharedCache::open_chunk`] found.
pub(super) enum Opened {
    File(Arc<File>),
    Pending(Arc<Vec<u8>>),
    Absent,
}

impl Inner {
    /// Run `f` holding this process's state and the directory's lock,
    /// with the state caught up with the journal.
    pub(super) fn locked<T>(&self, f: impl FnOnce(&Inner, &mut State) -> Result<T>) -> Result<T> {
        self.journal.locked(|st| f(self, st))
    }

    /// Append a batch of records to the journal.
    pub(super) fn commit(&self, st: &mut State, bytes: &[u8]) -> Result<()> {
        self.journal.commit(st, bytes)
    }

    pub(super) fn maybe_compact(&self, st: &mut State) -> Result<()> {
        self.journal.maybe_compact(st)
    }

    pub(super) fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        self.files.path(id)
    }

    /// The open file of chunk `id` (kept open for later hits), its bytes
    /// still waiting for the writer, or absent (also when the file is not
    /// `len` bytes long: not the chunk the index describes, never served).
    /// A chunk the journal names whose file is missing or not the length
    /// the journal recorded (cut short by a crash or by hand) is dropped,
    /// so that the fetch that follows puts it back.
    pub(super) fn open_chunk(&self, id: &ChunkId, len: usize) -> Result<Opened> {
        if let Some(held) = self.files.held(id, len) {
            return Ok(held.map_or(Opened::Absent, Opened::File));
        }
        if let Some(d) = self.pending.lock().get(id) {
            return Ok(Opened::Pending(d.clone()));
        }
        match self.files.open(id, len)? {
            Some(f) => Ok(Opened::File(f)),
            None => {
                if self.journal.peek(|st| st.resident.contains_key(id)) {
                    self.drop_if_not_whole(id)?;
                }
                Ok(Opened::Absent)
            }
        }
    }

    /// Drop chunk `id` from the journal (and its file) if the journal names
    /// it and its file is missing or not the recorded length.
    fn drop_if_not_whole(&self, id: &ChunkId) -> Result<()> {
        self.locked(|me, st| {
            let Some(&(size, _)) = st.resident.get(id) else {
                return Ok(());
            };
            let path = me.chunk_path(id);
            let whole = match std::fs::metadata(&path) {
                Ok(m) => m.len() == size as u64,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(io(Op::Read, e, &path)),
            };
            if whole {
                return Ok(());
            }
            tracing::warn!(
                "shared cache: chunk {id} is named in the journal but its file is missing or cut short; dropped, it is fetched again"
            );
            me.drop_chunk(st, id)
        })
    }

    /// Drop chunk `id` (under the lock): an evict record, its file closed
    /// and removed.
    pub(super) fn drop_chunk(&self, st: &mut State, id: &ChunkId) -> Result<()> {
        let mut b = Batch::new(st);
        b.emit(Kind::Evict, *id);
        let bytes = b.take();
        self.commit(st, &bytes)?;
        self.files.forget(std::slice::from_ref(id));
        let _ = std::fs::remove_file(self.chunk_path(id));
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn hoards_dir(&self) -> PathBuf {
        self.dir.join("hoards")
    }

    /// Make `cache.toml` version 2 before the first hoard mark is written
    /// (the caller holds the lock).
    pub(super) fn upgrade_config(&self) -> Result<()> {
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
    pub(super) fn hoarded(&self) -> Result<parking_lot::MutexGuard<'_, Protected>> {
        let mut h = self.hoards.lock();
        h.refresh(&self.hoards_dir())?;
        Ok(h)
    }

    /// Journal the references seen since the last batch (resident chunks
    /// only: a reference to a chunk already gone changes nothing).
    pub(super) fn touches_into(&self, b: &mut Batch<'_>) {
        let ids: Vec<ChunkId> = self.touches.lock().drain().collect();
        for id in ids {
            if b.state.resident.contains_key(&id) {
                b.emit(Kind::Touch, id);
            }
        }
    }

    pub(super) fn flush_touches(&self) -> Result<()> {
        if self.touches.lock().is_empty() {
            return Ok(());
        }
        self.locked(|me, st| {
            let mut b = Batch::new(st);
            me.touches_into(&mut b);
            let bytes = b.take();
            me.commit(st, &bytes)?;
            me.maybe_compact(st)
        })
    }

    /// Store chunks: write each under `tmp/`, make them all durable with
    /// one `syncfs`, then admit them one by one.
    pub(super) fn store_many(&self, items: &[(ChunkId, Arc<Vec<u8>>)]) -> Vec<Result<Admission>> {
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
        let synced = durable::sync_file_system(&tmp_dir);
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
            let mut b = Batch::new(st);
            me.touches_into(&mut b);
            if b.state.resident.contains_key(&id) {
                let bytes = b.take();
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
                let bytes = b.take();
                me.commit(st, &bytes)?;
                return Ok(Admission::Refused);
            }
            let path = me.chunk_path(&id);
            let parent = path.parent().expect("fan-out folder");
            std::fs::create_dir_all(parent).map_err(|e| io(Op::Write, e, parent))?;
            durable::move_into_place(tmp, &path).map_err(|e| io(Op::Write, e, &path))?;
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
            let bytes = b.take();
            if let Err(e) = me.commit(st, &bytes) {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            me.files.remove(&victims);
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

    /// Make the files and the journal agree (under the lock): remove
    /// files the journal does not name, drop names without a file, and
    /// clear temporaries of processes that died mid-write. By names only
    /// (one directory listing, no `stat` of each file: a cache of 200k
    /// chunks opens in a fraction of a second); a file of the wrong length
    /// is found when it is first opened ([`Inner::open_chunk`]) and every
    /// byte by `cache verify`.
    pub(super) fn reconcile(&self, st: &mut State) -> Result<(u64, u64)> {
        let chunks = self.files.dir().to_path_buf();
        let mut seen = HashSet::new();
        let mut orphans = 0u64;
        for fan in read_dir_names(&chunks)? {
            let sub = chunks.join(&fan);
            for name in read_dir_names(&sub)? {
                match ChunkId::from_hex(&name) {
                    Some(id) if name.starts_with(&fan) && st.resident.contains_key(&id) => {
                        seen.insert(id);
                    }
                    _ => {
                        let _ = std::fs::remove_file(sub.join(&name));
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
        let mut b = Batch::new(st);
        for id in &missing {
            b.emit(Kind::Evict, *id);
        }
        let bytes = b.take();
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

    /// Count an admission; a refused chunk handed over in the background
    /// (`keep`) is kept for its session to take.
    pub(super) fn count(&self, id: ChunkId, a: Admission, keep: Option<&Arc<Vec<u8>>>) {
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
pub(super) fn writer(me: &Inner, rx: mpsc::Receiver<ChunkId>) {
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
        // Wakes `drain` (which waits for empty) and inserts waiting for
        // room.
        me.drained.notify_all();
    }
}
