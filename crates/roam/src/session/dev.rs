//! `cas:SESSION` — the writable layer of a session (seed sections 3.1-3.4).
//!
//! Reads: CLEAN or DIRTY sectors come from the private cache, ZERO sectors
//! are zeroes, EMPTY sectors come from the base version (fetched from the
//! chunk store by hash and verified). Writes: a sector of zeroes becomes
//! ZERO with no data written (P1, switchable); any other sector is written
//! to the private cache and becomes DIRTY. A flush appends what the guest
//! wrote since the last one (states and bytes) to the session's
//! write-ahead log and syncs it once (`super::wal`); the private cache and
//! the map catch up at checkpoints.
//!
//! In the background, a session fetches its base version's recorded
//! working set ([`CasDev::start_prefetch`]) and, while the guest reads
//! EMPTY sectors in sequence, the chunks that come next
//! ([`CasDev::start_readahead`], `crate::readahead`).

use parking_lot::{Mutex, RwLock};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roamdisk_blockdev::overlay::OverlayMap;
use roamdisk_blockdev::Access;
use roamdisk_blockdev::{
    extents_covering, push_extent, Alloc, BlockDev, Caps, Extent, Registry, Result, WriteFlags,
    ZeroFlags,
};

use super::map::Header;
use super::offline::{keep_copy, load_base, BASE_COPY, STORE_COPY};
use super::wal::{self, WalFile};
use super::workset::Recorder;
use super::SessionConfig;
use crate::cache::pins::PinGuard;
use crate::fetch::GatherStats;
use crate::readahead::ReadAhead;
use crate::view::{start_read_ahead, AheadTarget, VersionView};
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::error::{bad_arg, context, corrupt};
use roamdisk_chunkstore::index::{SectorState, SECTOR};
use roamdisk_chunkstore::store::{DynStore, StoreConfig};

/// Sectors that share a lock stripe for read-modify-write.
const STRIPE_SECTORS: u64 = 128;

mod logged;
use logged::{Logged, Touched, MAX_PENDING, MAX_RECORD};

pub use super::open::{Files, Host, SessionOpen};

/// Where a sector reads from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Cache,
    Zero,
    Base,
}

fn src_of(state: u8) -> Src {
    match state {
        2 | 3 => Src::Cache,
        1 => Src::Zero,
        _ => Src::Base,
    }
}

/// Pin every chunk of the session's base version in the shared cache
/// (those its EMPTY sectors may still read).
fn pin_base(base: &VersionView) -> Result<Option<PinGuard>> {
    match base.shared_cache() {
        Some(sc) => sc.pin(&base.chunk_ids()).map(Some),
        None => Ok(None),
    }
}

/// A session's disk.
pub struct CasDev {
    dir: PathBuf,
    pub config: SessionConfig,
    store: DynStore,
    base: RwLock<Arc<VersionView>>,
    cache: Arc<dyn BlockDev>,
    size: u64,
    map: OverlayMap<Header>,
    read_only: bool,
    zero_detect: bool,
    user_key: Option<Key>,
    /// Keeps the base version's chunks in the shared cache while the
    /// session runs.
    pins: Mutex<Option<PinGuard>>,
    /// The chunks the guest read from the base (writable sessions).
    workset: Option<Recorder>,
    no_prefetch: bool,
    no_readahead: bool,
    /// The guest's sequential runs, read ahead of.
    ahead: ReadAhead,
    /// The write-ahead log (writable sessions).
    wal: Option<Mutex<WalFile>>,
    /// What the next flush logs.
    touched: Mutex<Touched>,
    /// A read-only open's view of the log's records not yet checkpointed
    /// (a writable open applies them): sector → its bytes.
    logged: Logged,
    /// Dropped as a killed process would end: no last flush (tests).
    abandoned: std::sync::atomic::AtomicBool,
    /// Where the map, the log and the open marker are.
    files: Arc<dyn roamdisk_blockdev::vfs::Vfs>,
    _lock: File,
}

/// How far the background fetch of a working set has come.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PrefetchStatus {
    /// The working set's chunks that had to come from somewhere (not
    /// already in the private cache) and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// What has arrived, by source.
    pub got: GatherStats,
    pub done: bool,
    /// Why it stopped early (the reads it did not make happen on demand).
    pub error: Option<String>,
}

/// Working-set chunks fetched per batch (one request to the store).
const PREFETCH_BATCH: usize = 16;

impl CasDev {
    /// Open the session in `dir`. `registry` opens the private cache.
    pub fn open(dir: &Path, opts: &SessionOpen, registry: &Registry) -> Result<CasDev> {
        Self::open_with(dir, opts, registry, None)
    }

    /// Open the session in `dir` over `store`, already open, instead of
    /// the store its `session.toml` names (a test's in-memory store).
    pub fn open_on(
        dir: &Path,
        opts: &SessionOpen,
        registry: &Registry,
        store: DynStore,
    ) -> Result<CasDev> {
        Self::open_with(dir, opts, registry, Some(store))
    }

    fn open_with(
        dir: &Path,
        opts: &SessionOpen,
        registry: &Registry,
        store: Option<DynStore>,
    ) -> Result<CasDev> {
        let config = SessionConfig::load(dir)?;
        let lock_path = dir.join("lock");
        let lock = roamdisk_chunkstore::error::open_lock_file(&lock_path)?;
        roamdisk_blockdev::layers::raw::lock_file(&lock, opts.read_only, "cas", dir)?;
        let store = match store {
            Some(s) => s,
            None => open_store(dir, &config, opts)?,
        };
        let user_key = user_key(&config, opts)?;
        let states_path = dir.join("states");
        let fs = opts.files.0.clone();
        let (map, _) =
            OverlayMap::<Header>::open_in(fs.clone(), &states_path, "cas", opts.read_only)?;
        let header = map.header();
        let version = load_base(dir, &store, &header.base, user_key.as_ref(), opts.read_only)
            .map_err(|e| context(e, format!("the base of session {}", dir.display())))?;
        let base = VersionView::from_parts(store.clone(), header.base, version)
            .with_shared_cache(opts.shared_cache.open()?);
        let media: Vec<PathBuf> = config
            .lookaside
            .iter()
            .chain(&opts.lookaside)
            .cloned()
            .collect();
        let media = crate::lookaside::open_media(
            store.config().hash,
            base.version.index.chunk_size,
            &media,
            opts.host.lookaside_index().as_deref(),
        )?;
        let base = base.with_lookaside(media);
        let pins = pin_base(&base)?;
        let size = header.disk_size;
        if base.version.index.disk_size != size {
            return Err(corrupt(format!(
                "session map says {size} bytes but base version {} has {}",
                base.id.short(),
                base.version.index.disk_size
            )));
        }
        let cache: Arc<dyn BlockDev> = registry.build(
            &config.cache_spec(dir),
            Access::read_only_if(opts.read_only),
        )?;
        if cache.size() < size {
            return Err(bad_arg(format!(
                "the private cache {} is {} bytes, smaller than the {size}-byte disk",
                config.cache,
                cache.size()
            )));
        }
        let base_records = base.version.index.records();
        let workset = (!opts.read_only).then(|| Recorder::load(dir, base_records));
        let wal_path = dir.join(WAL);
        let replayed = WalFile::read(&*fs, &wal_path, size / SECTOR, !opts.read_only)?;
        let mut dev = CasDev {
            workset,
            no_prefetch: opts.no_prefetch,
            no_readahead: opts.no_readahead,
            ahead: ReadAhead::new(base_records),
            dir: dir.to_path_buf(),
            zero_detect: opts.zero_detect.unwrap_or(config.zero_detect),
            config,
            store,
            base: RwLock::new(Arc::new(base)),
            cache,
            size,
            map,
            read_only: opts.read_only,
            user_key,
            pins: Mutex::new(pins),
            wal: None,
            touched: Mutex::new(Touched::default()),
            logged: Default::default(),
            abandoned: Default::default(),
            files: fs.clone(),
            _lock: lock,
        };
        if let Some((r, _)) = &replayed {
            dev.apply_log(r)?;
        }
        if !opts.read_only {
            let marker = dir.join(OPEN_MARKER);
            if fs.exists(&marker) {
                // The last writable open did not close cleanly. A guest
                // write to a CLEAN sector goes to the private cache in
                // place and is logged (as DIRTY) at the next flush: after
                // a crash before it, the map says CLEAN (equal to the
                // base) over bytes that may differ, and a commit would
                // skip them. DIRTY claims nothing more than "the private
                // cache holds this sector", true of every CLEAN one, so
                // all of them become DIRTY: a commit hashes those chunks
                // again (and finds the base's where nothing changed).
                let n = dev.sectors();
                let t = dev.map.states();
                let clean = SectorState::Clean as u8;
                let mut runs = Vec::new();
                let mut s = 0;
                while s < n {
                    let e = t.run_end(s, n, |x| x == clean);
                    if t.get(s) == clean {
                        runs.push((s, e, SectorState::Dirty as u8));
                    }
                    s = e;
                }
                if !runs.is_empty() {
                    tracing::warn!(
                        "session {} was not closed cleanly: {} runs of cached sectors will be checked again at the next commit",
                        dir.display(),
                        runs.len()
                    );
                }
                dev.map.replace(&runs, |_| {}, || dev.cache.flush())?;
            } else {
                // Every writable open starts from a compact map with no torn tail.
                dev.map.compact(|_| {}, || dev.cache.flush())?;
            }
            // The log's records are in the cache and the map now (synced
            // by the compaction above): a new generation starts.
            dev.wal = Some(Mutex::new(match replayed {
                Some((r, f)) => WalFile::after_replay(&wal_path, &r, f)?,
                None => WalFile::create(
                    &*fs,
                    &wal_path,
                    opts.wal_capacity.unwrap_or(wal::FIRST_CAPACITY),
                )?,
            }));
            // Durable before any guest write can land in the cache.
            fs.write_atomically(&marker, b"").map_err(|e| {
                roamdisk_chunkstore::error::io(roamdisk_blockdev::Op::Open, e, &marker)
            })?;
        }
        Ok(dev)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn store(&self) -> &DynStore {
        &self.store
    }
    pub fn user_key(&self) -> Option<&Key> {
        self.user_key.as_ref()
    }
    pub fn base(&self) -> Arc<VersionView> {
        self.base.read().clone()
    }
    pub fn cache_dev(&self) -> &Arc<dyn BlockDev> {
        &self.cache
    }
    pub fn sectors(&self) -> u64 {
        self.size / SECTOR
    }

    /// The state of sector `s`.
    pub fn state(&self, s: u64) -> SectorState {
        SectorState::from_bits(self.raw_state(s))
    }

    fn raw_state(&self, s: u64) -> u8 {
        self.map.get(s)
    }

    /// Set sectors `[s0, s1)` to `v`, logged at the next flush. Call it
    /// only once the data the state claims is in the private cache, under
    /// the sectors' stripe locks.
    fn mark(&self, s0: u64, s1: u64, v: u8) {
        self.map.set(s0, s1, v);
        if self.wal.is_some() {
            self.touched.lock().add(s0, s1);
        }
    }

    /// Apply the records of the write-ahead log found at open: a writable
    /// open writes their bytes into the private cache and their states
    /// into the map (checkpointed by the compaction that follows); a
    /// read-only one keeps the bytes in memory, over the cache.
    fn apply_log(&mut self, r: &wal::Replay) -> Result<()> {
        if self.read_only {
            self.logged = Logged::of(r, self.map.states());
            return Ok(());
        }
        let (cache, map) = (&self.cache, &self.map);
        let write = |b: &[u8], off| cache.write_at(b, off, WriteFlags::default());
        logged::apply(r, write, |a, b, v| map.set(a, b, v))
    }

    /// The flush of a writable session: one record in the log, synced. It
    /// checkpoints instead when the record would hold more than
    /// `MAX_RECORD` bytes, or does not fit (then the log grows).
    fn flush_logged(&self, w: &mut WalFile) -> Result<()> {
        let t = std::mem::take(&mut *self.touched.lock());
        let done = (|| {
            if !t.overflow && t.ranges.is_empty() {
                return Ok(());
            }
            if t.overflow || self.map.pending_len() > MAX_PENDING {
                return self.checkpoint(w, false);
            }
            let rec = logged::record_of(
                &t,
                MAX_RECORD,
                self.map.states(),
                |a, b| self.lock_stripes(a, b),
                |buf, off| self.cache.read_at(buf, off),
            )?;
            match rec {
                None => self.checkpoint(w, false),
                Some(rec) => match w.append(rec)? {
                    true => Ok(()),
                    false => self.checkpoint(w, true),
                },
            }
        })();
        if done.is_err() {
            self.touched.lock().restore(t);
        }
        done
    }

    /// Bring the private cache and the map up to date with the log (the
    /// cache synced, the map's records appended and synced), then start
    /// the log's next generation (unless this one holds no record and
    /// need not grow).
    fn checkpoint(&self, w: &mut WalFile, grow: bool) -> Result<()> {
        self.map.commit(|| self.cache.flush())?;
        if w.is_empty() && !grow {
            return Ok(());
        }
        w.restart(grow)
    }

    /// Counts of sectors in each state (EMPTY, ZERO, CLEAN, DIRTY).
    pub fn usage(&self) -> [u64; 4] {
        self.map.states().usage()
    }

    /// After a commit: switch to the new base version and apply the state
    /// changes `(sector, new state)`, atomically on disk.
    pub fn rebase(&self, view: VersionView, changes: &[(u64, u64, SectorState)]) -> Result<()> {
        let changes: Vec<(u64, u64, u8)> =
            changes.iter().map(|&(a, b, st)| (a, b, st as u8)).collect();
        let id = view.id;
        if let Ok(raw) = self.store.get(&id) {
            keep_copy(&self.dir.join(BASE_COPY), &raw);
        }
        let view = view
            .with_shared_cache(self.base().shared_cache().cloned())
            .with_lookaside(self.base().lookaside().cloned());
        let pins = pin_base(&view)?;
        // The log's records are in the map before it is rewritten for the
        // new base, and no flush logs in between.
        let mut w = self.wal.as_ref().map(|w| w.lock());
        if let Some(w) = w.as_deref_mut() {
            self.checkpoint(w, false)?;
        }
        self.map
            .replace(&changes, |h| h.base = id, || self.cache.flush())?;
        drop(w);
        *self.base.write() = Arc::new(view);
        *self.pins.lock() = pins;
        Ok(())
    }

    /// Write whole sectors at a sector-aligned offset.
    fn write_aligned(&self, data: &[u8], off: u64) -> Result<()> {
        let s0 = off / SECTOR;
        let n = data.len() / SECTOR as usize;
        let zero_at = |i: usize| {
            self.zero_detect
                && roamdisk_chunkstore::hash::is_zero(
                    &data[i * SECTOR as usize..(i + 1) * SECTOR as usize],
                )
        };
        let mut i = 0;
        while i < n {
            let z = zero_at(i);
            let mut j = i + 1;
            while j < n && zero_at(j) == z {
                j += 1;
            }
            let (a, b) = (s0 + i as u64, s0 + j as u64);
            if z {
                self.mark(a, b, SectorState::Zero as u8);
                self.release_cache(a, b);
            } else {
                self.cache.write_at(
                    &data[i * SECTOR as usize..j * SECTOR as usize],
                    a * SECTOR,
                    WriteFlags::default(),
                )?;
                self.mark(a, b, SectorState::Dirty as u8);
            }
            i = j;
        }
        Ok(())
    }

    /// Lock the stripes of sectors `[s0, s1)`, in order.
    fn lock_stripes(&self, s0: u64, s1: u64) -> Vec<parking_lot::MutexGuard<'_, ()>> {
        let stripes = roamdisk_blockdev::overlay::LOCK_STRIPES as u64;
        let (k0, k1) = (s0 / STRIPE_SECTORS, s1.max(s0 + 1).div_ceil(STRIPE_SECTORS));
        let n = (k1 - k0).min(stripes);
        let first = k0 % stripes;
        // Ascending order: the stripes from 0 that wrapped around, then
        // the rest up to the last stripe.
        let wrapped = (first + n).saturating_sub(stripes);
        (0..wrapped)
            .chain(first..(first + n).min(stripes))
            .map(|k| self.map.stripe(k))
            .collect()
    }

    /// Chunks of the base that the shared cache refused to keep (it is
    /// full of chunks other sessions still need): copy their EMPTY
    /// sectors into this session's private cache and mark them CLEAN, so
    /// they are never fetched again (seed section 3.3). Called after guest
    /// reads and before flushes, never under stripe locks.
    fn keep_refused(&self, base: &VersionView) -> Result<()> {
        let Some(sc) = base.shared_cache() else {
            return Ok(());
        };
        if self.read_only || !sc.has_refused() {
            return Ok(());
        }
        for (id, data) in sc.take_refused(&|id| !base.chunks_with(id).is_empty()) {
            for &i in base.chunks_with(&id) {
                self.fill_clean(i as usize, &data)?;
            }
        }
        Ok(())
    }

    /// Copy the EMPTY sectors of base chunk `i` (its bytes: `data`) into
    /// the private cache and mark them CLEAN.
    fn fill_clean(&self, i: usize, data: &[u8]) -> Result<()> {
        let cs = self.base().version.index.chunk_size as u64;
        let first = i as u64 * cs / SECTOR;
        let n = data.len() as u64 / SECTOR;
        let _guards = self.lock_stripes(first, first + n);
        let mut s = first;
        while s < first + n {
            if self.raw_state(s) != SectorState::Empty as u8 {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e < first + n && self.raw_state(e) == SectorState::Empty as u8 {
                e += 1;
            }
            let (x, y) = (
                ((s - first) * SECTOR) as usize,
                ((e - first) * SECTOR) as usize,
            );
            self.cache
                .write_at(&data[x..y], s * SECTOR, WriteFlags::default())?;
            self.mark(s, e, SectorState::Clean as u8);
            s = e;
        }
        Ok(())
    }

    /// Whether some sector of base chunk `i` still reads from the base.
    fn reads_base(&self, i: usize) -> bool {
        let cs = self.base().version.index.chunk_sectors() as u64;
        let s0 = i as u64 * cs;
        (s0..(s0 + cs).min(self.sectors())).any(|s| self.raw_state(s) == SectorState::Empty as u8)
    }

    /// Record the base chunks of bytes `[a, b)` as read by the guest.
    fn record_reads(&self, base: &VersionView, a: u64, b: u64) {
        let Some(ws) = &self.workset else { return };
        let idx = &base.version.index;
        let cs = idx.chunk_size as u64;
        for i in (a / cs)..b.div_ceil(cs) {
            if !idx.ids[i as usize].is_zero() {
                ws.touch(i as usize);
            }
        }
    }

    /// The chunks the guest read from the base in this session (across
    /// its commits), first touch first.
    pub fn working_set(&self) -> Vec<u32> {
        self.workset
            .as_ref()
            .map(Recorder::order)
            .unwrap_or_default()
    }

    /// Fetch the base version's recorded working set in the background, in
    /// its order, in batches: from the shared cache, lookaside media, then
    /// the store, into the shared cache (or, when that is off or refuses,
    /// into the private cache as CLEAN). Chunks the session no longer
    /// reads from the base are skipped. It stops when the session closes
    /// or is rebased. Returns the status it updates.
    pub fn start_prefetch(self: &Arc<Self>) -> Arc<Mutex<PrefetchStatus>> {
        let base = self.base();
        let idx = &base.version.index;
        let list: Vec<usize> = base
            .version
            .working_set
            .iter()
            .map(|&c| c as usize)
            .filter(|&i| !idx.ids[i].is_zero() && self.reads_base(i))
            .collect();
        let status = Arc::new(Mutex::new(PrefetchStatus {
            chunks: list.len() as u64,
            bytes: list.iter().map(|&i| idx.chunk_len(i) as u64).sum(),
            done: list.is_empty() || self.no_prefetch,
            ..Default::default()
        }));
        if list.is_empty() || self.no_prefetch {
            return status;
        }
        let weak = Arc::downgrade(self);
        let st = status.clone();
        let spawned = std::thread::Builder::new()
            .name("cas-prefetch".into())
            .spawn(move || {
                let lock = || st.lock();
                let mut filled = false;
                for batch in list.chunks(PREFETCH_BATCH) {
                    let Some(dev) = weak.upgrade() else { break };
                    if dev.base().id != base.id {
                        break;
                    }
                    let todo: Vec<usize> = batch
                        .iter()
                        .copied()
                        .filter(|&i| dev.reads_base(i))
                        .collect();
                    let wanted: Vec<_> = todo.iter().map(|&i| base.disk_chunk(i)).collect();
                    base.chain().background_turn();
                    let got = base.gather(&wanted, false).and_then(|got| {
                        for (&i, g) in todo.iter().zip(&got) {
                            lock().got.add(g, base.version.index.chunk_len(i));
                            let private = g.refused || base.shared_cache().is_none();
                            if let (true, false, Some(d)) = (private, dev.read_only, &g.data) {
                                dev.fill_clean(i, d)?;
                                filled = true;
                            }
                        }
                        Ok(())
                    });
                    if let Err(e) = got {
                        tracing::warn!("prefetch of the working set stopped: {e}");
                        lock().error = Some(e.to_string());
                        break;
                    }
                }
                // What went into the private cache is kept, as a guest
                // flush would keep it.
                if let (true, Some(dev)) = (filled, weak.upgrade()) {
                    if let Err(e) = dev.flush() {
                        tracing::warn!("cannot keep the prefetched working set: {e}");
                    }
                }
                lock().done = true;
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the working-set prefetch: {e}");
            status.lock().done = true;
        }
        status
    }

    /// Read ahead of the guest's sequential reads of the base, in the
    /// background (`crate::readahead` decides what): chunks the shared
    /// cache holds are read into the page cache; the others are fetched
    /// together (a batched request to a chunk server), and a guest read of
    /// a chunk under way waits for that fetch rather than making its own.
    /// What arrives goes to the shared cache or, when that is off, into
    /// the private cache as CLEAN, as the working-set prefetch does. Does
    /// nothing with `readahead=off`, or for a read-only session with no
    /// shared cache (nowhere to keep the chunks).
    pub fn start_readahead(self: &Arc<Self>) {
        let shared = self.base().shared_cache().is_some();
        if self.no_readahead || (self.read_only && !shared) {
            return;
        }
        let me: Arc<dyn AheadTarget> = self.clone();
        start_read_ahead(&me);
    }

    /// Best effort: let the cache release space of sectors that no longer
    /// hold data (whole 4 KiB blocks only).
    fn release_cache(&self, s0: u64, s1: u64) {
        let a = (s0 * SECTOR).div_ceil(4096) * 4096;
        let b = (s1 * SECTOR) / 4096 * 4096;
        if b > a && self.cache.caps().can_trim {
            let _ = self.cache.trim(a, b - a, WriteFlags::default());
        }
    }

    /// Walk the bytes `[off, end)` in runs of sectors with one source:
    /// `f(source, a, b)` for each byte range `[a, b)`, until it returns
    /// `false`.
    fn runs(
        &self,
        off: u64,
        end: u64,
        mut f: impl FnMut(Src, u64, u64) -> Result<bool>,
    ) -> Result<()> {
        let (mut s, s1) = (off / SECTOR, end.div_ceil(SECTOR));
        while s < s1 {
            let src = src_of(self.raw_state(s));
            let e = self.map.states().run_end(s, s1, src_of);
            if !f(src, (s * SECTOR).max(off), (e * SECTOR).min(end))? {
                break;
            }
            s = e;
        }
        Ok(())
    }

    /// Zero whole sectors `[s0, s1)` by state.
    fn zero_sectors(&self, s0: u64, s1: u64) {
        if s1 > s0 {
            let _guards = self.lock_stripes(s0, s1);
            self.mark(s0, s1, SectorState::Zero as u8);
            self.release_cache(s0, s1);
        }
    }
}

impl CasDev {
    /// Read, with no stripe lock taken (a write's read-modify-write holds
    /// them).
    fn read_inner(&self, base: &VersionView, buf: &mut [u8], off: u64) -> Result<()> {
        self.runs(off, off + buf.len() as u64, |src, a, b| {
            let dst = &mut buf[(a - off) as usize..(b - off) as usize];
            match src {
                Src::Cache => {
                    self.cache.read_at(dst, a)?;
                    if !self.logged.is_empty() {
                        self.logged.lay_over(dst, a);
                    }
                }
                Src::Zero => dst.fill(0),
                Src::Base => {
                    base.read_at(dst, a)?;
                    self.record_reads(base, a, b);
                }
            }
            Ok(true)
        })
    }

    /// Keep the recorded working set (a hint: failures are logged only).
    fn save_working_set(&self, now: bool) {
        if let Some(ws) = &self.workset {
            let saved = if now {
                ws.save(&self.dir)
            } else {
                ws.save_due(&self.dir)
            };
            if let Err(e) = saved {
                tracing::warn!("cannot keep the working set: {e}");
            }
        }
    }
}

impl AheadTarget for CasDev {
    fn version(self: Arc<Self>) -> Arc<VersionView> {
        CasDev::base(&self)
    }
    fn read_ahead(&self) -> &ReadAhead {
        &self.ahead
    }
    fn reads_base(&self, i: usize) -> bool {
        CasDev::reads_base(self, i)
    }
    fn keep(&self, i: usize, data: &[u8]) {
        if self.read_only {
            return;
        }
        if let Err(e) = self.fill_clean(i, data) {
            tracing::warn!("read-ahead: cannot keep chunk {i}: {e}");
        }
    }
}

impl CasDev {
    /// Close as a process killed now would: no last flush, no checkpoint,
    /// the open marker left (what crash tests start from).
    pub fn abandon(self) {
        self.abandoned
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for CasDev {
    fn drop(&mut self) {
        if *self.abandoned.get_mut() {
            return;
        }
        self.save_working_set(true);
        // A clean close: everything written is logged, so the next open
        // need not distrust CLEAN sectors. If this flush fails the marker
        // stays (and losing its removal in a crash only costs a re-check).
        // The log checkpointed too, so the next open has nothing to replay.
        let checkpointed = || match &self.wal {
            Some(w) => self.checkpoint(&mut w.lock(), false),
            None => Ok(()),
        };
        if !self.read_only && self.flush().and_then(|()| checkpointed()).is_ok() {
            let _ = self.files.remove(&self.dir.join(OPEN_MARKER));
        }
    }
}

/// Open the store of the session in `dir` (`config`), as `opts` says.
/// The session keeps a copy of its store's settings, so it opens (and
/// reads what is cached) when the store cannot be reached; a writable
/// open refreshes that copy.
fn open_store(dir: &Path, config: &SessionConfig, opts: &SessionOpen) -> Result<DynStore> {
    let known = std::fs::read_to_string(dir.join(STORE_COPY))
        .ok()
        .and_then(|t| StoreConfig::parse(&t).ok());
    let location = opts.store.as_deref().unwrap_or(&config.store);
    let store = roamdisk_chunkstore::store::open(
        location,
        &roamdisk_chunkstore::store::OpenOptions {
            known_config: known.clone(),
            credentials: config
                .credentials(&opts.credentials)
                .or(&opts.fallback_credentials),
            s3: opts.host.s3.clone(),
            ..Default::default()
        },
    )
    .map_err(|e| store_gone(e, dir, location))?;
    if !opts.read_only && known.as_ref() != Some(store.config()) {
        keep_copy(&dir.join(STORE_COPY), store.config().to_toml().as_bytes());
    }
    Ok(store)
}

/// The error of a session whose store folder is not there: the session
/// names it, so creating a store there is the wrong advice (it would hold
/// none of the session's chunks); the folder went away or moved.
fn store_gone(e: roamdisk_blockdev::Error, dir: &Path, location: &str) -> roamdisk_blockdev::Error {
    if e.kind() != roamdisk_blockdev::ErrorKind::NotFound
        || roamdisk_chunkstore::store::is_remote(location)
    {
        return e;
    }
    roamdisk_chunkstore::error::not_found(format!(
        "the store of session {} is not at {location} (no store.toml there): plug in the disk or mount the share that holds it, or name where it is now with --store DIR",
        dir.display()
    ))
}

/// The user's key of the session (`opts` first, then `session.toml`).
fn user_key(config: &SessionConfig, opts: &SessionOpen) -> Result<Option<Key>> {
    match opts.key_file.as_ref().or(config.key_file.as_ref()) {
        Some(k) => Ok(Some(roamdisk_chunkstore::version::read_key_file(k)?)),
        None => Ok(None),
    }
}

/// The store and base version of the session in `dir`, read without
/// taking its lock (another process may be serving it): what a live
/// suspend needs to store the VM's memory before the session is free.
pub fn peek(
    dir: &Path,
    opts: &SessionOpen,
) -> Result<(DynStore, roamdisk_chunkstore::version::Version)> {
    let config = SessionConfig::load(dir)?;
    let opts = SessionOpen {
        read_only: true,
        ..opts.clone()
    };
    let store = open_store(dir, &config, &opts)?;
    let (map, _) = OverlayMap::<Header>::open(&dir.join("states"), "cas", true)?;
    let base = map.header().base;
    let key = user_key(&config, &opts)?;
    let version = load_base(dir, &store, &base, key.as_ref(), true)
        .map_err(|e| context(e, format!("the base of session {}", dir.display())))?;
    Ok((store, version))
}

/// Present while a writable open of the session has not closed cleanly.
const OPEN_MARKER: &str = "open";

/// The session's write-ahead log.
const WAL: &str = "wal";

impl BlockDev for CasDev {
    roamdisk_blockdev::layer!("cas");
    fn describe(&self) -> String {
        format!(
            "cas:{} (base {} of {}, store {})",
            self.dir.display(),
            self.base().id.short(),
            self.config.target,
            self.store.describe()
        )
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        let c = Caps {
            min_block: 1,
            preferred_block: 4096,
            ..Caps::FULL
        };
        if self.read_only {
            c.read_only()
        } else {
            c
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let base = self.base();
        let idx = &base.version.index;
        self.ahead.on_read(
            base.id,
            idx.chunk_size,
            idx.records(),
            off,
            off + buf.len() as u64,
        );
        self.read_inner(&base, buf, off)?;
        self.keep_refused(&base)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let end = off + buf.len() as u64;
        // Under the locks of the chunks written (taken in order): a
        // read-modify-write of partial sectors, and a fill of the private
        // cache from the base, must not interleave with a write.
        let a = off / SECTOR * SECTOR;
        let b = end.div_ceil(SECTOR) * SECTOR;
        {
            let _guards = self.lock_stripes(a / SECTOR, b / SECTOR);
            if off.is_multiple_of(SECTOR) && end.is_multiple_of(SECTOR) {
                self.write_aligned(buf, off)?;
            } else {
                let mut tmp = vec![0u8; (b - a) as usize];
                let base = self.base();
                self.read_inner(&base, &mut tmp[..SECTOR as usize], a)?;
                let last = (b - a - SECTOR) as usize;
                self.read_inner(&base, &mut tmp[last..], b - SECTOR)?;
                tmp[(off - a) as usize..(end - a) as usize].copy_from_slice(buf);
                self.write_aligned(&tmp, a)?;
            }
        }
        // Not under the stripe locks: a flush may fill the private cache
        // with chunks the shared cache refused, under those same locks.
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let base = self.base();
        if let Some(sc) = base.shared_cache() {
            // A cache full of pinned chunks refuses what it is handed in
            // the background: wait for its verdicts, so what it refused
            // is kept privately with this flush.
            if sc.may_refuse_pending() {
                sc.drain();
            }
            self.keep_refused(&base)?;
        }
        match &self.wal {
            Some(w) => self.flush_logged(&mut w.lock())?,
            // The private cache's data is durable before any record claims it.
            None => self.map.commit(|| self.cache.flush())?,
        }
        self.save_working_set(false);
        Ok(())
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        // Only whole sectors; trimmed sectors read as zero (and commit as
        // ZERO, needing no data).
        self.zero_sectors(off.div_ceil(SECTOR), (off + len) / SECTOR);
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let end = off + len;
        let (a, b) = (off.div_ceil(SECTOR), end / SECTOR);
        if a >= b {
            let z = vec![0u8; len as usize];
            self.write_at(&z, off, WriteFlags::default())?;
        } else {
            if off < a * SECTOR {
                let z = vec![0u8; (a * SECTOR - off) as usize];
                self.write_at(&z, off, WriteFlags::default())?;
            }
            self.zero_sectors(a, b);
            if end > b * SECTOR {
                let z = vec![0u8; (end - b * SECTOR) as usize];
                self.write_at(&z, b * SECTOR, WriteFlags::default())?;
            }
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let base = self.base();
        let mut out = Vec::new();
        self.runs(off, off + len, |src, a, b| {
            match src {
                Src::Cache => push_extent(
                    &mut out,
                    Extent {
                        len: b - a,
                        state: Alloc::Data,
                    },
                ),
                Src::Zero => push_extent(
                    &mut out,
                    Extent {
                        len: b - a,
                        state: Alloc::Hole,
                    },
                ),
                Src::Base => {
                    for x in extents_covering(base.as_ref(), a, b - a)? {
                        push_extent(&mut out, x);
                    }
                }
            }
            Ok(out.len() <= 1024)
        })?;
        Ok(out)
    }
}
