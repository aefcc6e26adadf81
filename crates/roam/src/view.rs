//! A committed version as a read-only block device (what checkout
//! materialises or serves, and the base a session reads its EMPTY sectors
//! from), plus [`materialise`], which copies a version into any writable
//! device fetching chunks in parallel.
//!
//! Every chunk is verified against its name when fetched; a bad chunk is
//! an error naming it, never data.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rayon::prelude::*;
use roamdisk_blockdev::{push_extent, Alloc, BlockDev, Caps, Extent, Op, Result, WriteFlags};

use crate::cache::{Admission, SharedCache};
use crate::lookaside::Lookaside;
use roamdisk_blockdev::Progress;
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::error::{context, err};
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::index::{SectorState, SECTOR};
use roamdisk_chunkstore::repo::load_version;
use roamdisk_chunkstore::store::{fetch, DynStore};
use roamdisk_chunkstore::version::Version;

/// Chunks kept decoded in memory per view (sequential readers re-read a
/// chunk many times, 4 KiB at a time).
const CACHE_CHUNKS: usize = 64;

/// A version, readable as a disk.
pub struct VersionView {
    store: DynStore,
    pub id: ChunkId,
    pub version: Version,
    cache: Mutex<Vec<(usize, Arc<Vec<u8>>)>>,
    /// The host's shared cache: read before the store, filled from it.
    shared: Option<Arc<SharedCache>>,
    /// Lookaside media: tried before the store.
    lookaside: Option<Arc<Lookaside>>,
    /// Fetches under way, so concurrent readers of one chunk wait for one
    /// fetch instead of making their own.
    inflight: Mutex<HashMap<usize, Arc<Flight>>>,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    /// Chunk id → the disk chunks that hold it (built on first use).
    by_id: std::sync::OnceLock<HashMap<ChunkId, Vec<u32>>>,
    /// Local read-ahead ([`VersionView::read_ahead_local`]): the last
    /// chunk read from the shared cache, and the chunk the advice has
    /// reached (both `usize::MAX` before the first read).
    last_read: AtomicUsize,
    advised_to: AtomicUsize,
}

/// Chunks advised ahead of a sequential reader in the shared cache.
const LOCAL_READ_AHEAD: usize = 8;

/// One fetch under way: `None` until done, then the chunk (or `None` if
/// it failed: each waiter then fetches for itself and gets its own error).
#[derive(Default)]
struct Flight {
    done: Mutex<Option<Option<Arc<Vec<u8>>>>>,
    cv: Condvar,
}

/// Most chunks of one read fetched together (at most half the in-memory
/// cache, which keeps them until the read copies them).
const FETCH_TOGETHER: usize = 32;
const _: () = assert!(FETCH_TOGETHER * 2 <= CACHE_CHUNKS);

/// Objects gathered per batch (one request to the store for those no
/// cache or medium holds).
pub const GATHER_BATCH: usize = 64;

/// Where a gathered object came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    SharedCache,
    Lookaside,
    Store,
}

/// An object to gather: its id (not zero), decoded length and convergent
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub id: ChunkId,
    pub len: usize,
    pub key: Option<Key>,
}

/// One gathered object.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The decoded bytes (`None` for a shared-cache hit gathered without
    /// `need_data`).
    pub data: Option<Arc<Vec<u8>>>,
    pub source: Source,
    /// The shared cache refused to keep it (full of pinned chunks).
    pub refused: bool,
}

impl Gathered {
    fn new(data: Option<Arc<Vec<u8>>>, source: Source) -> Gathered {
        Gathered {
            data,
            source,
            refused: false,
        }
    }
}

/// Bytes gathered by source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GatherStats {
    pub chunks: u64,
    pub bytes: u64,
    pub shared_cache_bytes: u64,
    pub lookaside_bytes: u64,
    pub store_bytes: u64,
    /// Chunks the shared cache refused.
    pub refused: u64,
}

impl GatherStats {
    pub fn add(&mut self, g: &Gathered, len: usize) {
        let n = len as u64;
        self.chunks += 1;
        self.bytes += n;
        match g.source {
            Source::SharedCache => self.shared_cache_bytes += n,
            Source::Lookaside => self.lookaside_bytes += n,
            Source::Store => self.store_bytes += n,
        }
        self.refused += g.refused as u64;
    }
}

/// Chunks a view fetched from its store (cache hits not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    pub chunks: u64,
    pub bytes: u64,
}

impl VersionView {
    pub fn open(store: DynStore, id: ChunkId, user_key: Option<&Key>) -> Result<VersionView> {
        let version = load_version(&*store, &id, user_key)?;
        Ok(Self::from_parts(store, id, version))
    }

    /// Open version `id`, its package taken from a chunk-store folder
    /// among `media` if one holds it (a resume set does), else from the
    /// store; also returns the package as stored (a session keeps a copy).
    pub fn open_with_package(
        store: DynStore,
        id: ChunkId,
        user_key: Option<&Key>,
        media: &[std::path::PathBuf],
    ) -> Result<(VersionView, Vec<u8>)> {
        let codec = store.config().codec();
        let raw = match crate::lookaside::find_object(media, &codec, &id) {
            Some(raw) => raw,
            None => store
                .get(&id)
                .map_err(|e| context(e, format!("version {id}")))?,
        };
        let bytes = codec
            .open(&id, None, &raw)
            .map_err(|e| context(e, format!("version {id}")))?;
        let version =
            Version::decode(&bytes, user_key).map_err(|e| context(e, format!("version {id}")))?;
        Ok((Self::from_parts(store, id, version), raw))
    }

    pub fn from_parts(store: DynStore, id: ChunkId, version: Version) -> VersionView {
        VersionView {
            store,
            id,
            version,
            cache: Mutex::new(Vec::new()),
            shared: None,
            lookaside: None,
            inflight: Mutex::new(HashMap::new()),
            fetched: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            by_id: std::sync::OnceLock::new(),
            last_read: AtomicUsize::new(usize::MAX),
            advised_to: AtomicUsize::new(usize::MAX),
        }
    }

    /// The disk chunks that hold object `id` (none if the version does
    /// not use it).
    pub fn chunks_with(&self, id: &ChunkId) -> &[u32] {
        let map = self.by_id.get_or_init(|| {
            let mut m: HashMap<ChunkId, Vec<u32>> = HashMap::new();
            for (i, id) in self.version.index.ids.iter().enumerate() {
                if !id.is_zero() {
                    m.entry(*id).or_default().push(i as u32);
                }
            }
            m
        });
        map.get(id).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Read through (and fill) the host's shared cache.
    pub fn with_shared_cache(mut self, cache: Option<Arc<SharedCache>>) -> VersionView {
        self.shared = cache;
        self
    }

    /// Try these media before the store.
    pub fn with_lookaside(mut self, media: Option<Arc<Lookaside>>) -> VersionView {
        self.lookaside = media;
        self
    }

    pub fn lookaside(&self) -> Option<&Arc<Lookaside>> {
        self.lookaside.as_ref()
    }

    pub fn shared_cache(&self) -> Option<&Arc<SharedCache>> {
        self.shared.as_ref()
    }

    /// The distinct chunks of the version (what a session pins).
    pub fn chunk_ids(&self) -> Vec<ChunkId> {
        let mut ids: Vec<ChunkId> = self
            .version
            .index
            .ids
            .iter()
            .filter(|id| !id.is_zero())
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub fn fetch_stats(&self) -> FetchStats {
        FetchStats {
            chunks: self.fetched.load(Ordering::Relaxed),
            bytes: self.fetched_bytes.load(Ordering::Relaxed),
        }
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// Write the version's memory image to `w`: its chunks gathered in
    /// batches from the shared cache, lookaside media or the store (each
    /// verified as it arrives).
    pub fn write_memory(&self, w: &mut dyn std::io::Write) -> Result<GatherStats> {
        let mut stats = GatherStats::default();
        for batch in self.memory_chunks().chunks(GATHER_BATCH) {
            let wanted: Vec<Wanted> = batch.iter().filter(|c| !c.id.is_zero()).copied().collect();
            let mut got = self.gather(&wanted, true)?.into_iter();
            for c in batch {
                let data = if c.id.is_zero() {
                    Arc::new(vec![0u8; c.len])
                } else {
                    let g = got.next().expect("one result per chunk");
                    stats.add(&g, c.len);
                    g.data.expect("gathered with data")
                };
                w.write_all(&data)
                    .map_err(|e| roamdisk_blockdev::Error::io(Op::Write, "cas", e))?;
            }
        }
        Ok(stats)
    }

    /// The memory image's chunks, in order (zero ids included).
    pub fn memory_chunks(&self) -> Vec<Wanted> {
        let mem = &self.version.memory;
        let cs = self.version.index.chunk_size as u64;
        (0..mem.ids.len())
            .map(|i| Wanted {
                id: mem.ids[i],
                len: (mem.size - i as u64 * cs).min(cs) as usize,
                key: mem.keys.get(i).copied(),
            })
            .collect()
    }

    /// Disk chunk `i` as an object to gather.
    pub fn disk_chunk(&self, i: usize) -> Wanted {
        let idx = &self.version.index;
        Wanted {
            id: idx.ids[i],
            len: idx.chunk_len(i),
            key: idx.key(i).copied(),
        }
    }

    /// Gather objects (none zero): each from the shared cache if it holds
    /// it, else from a lookaside medium, else from the store — the rest in
    /// one batched request, verified in parallel — and put what was not
    /// cached into the shared cache, durable together. With `need_data`,
    /// cached objects are read too. Results are in the order asked.
    pub fn gather(&self, wanted: &[Wanted], need_data: bool) -> Result<Vec<Gathered>> {
        let ids: Vec<ChunkId> = wanted.iter().map(|w| w.id).collect();
        let cached = match &self.shared {
            Some(sc) => sc.contains_many(&ids)?,
            None => vec![false; ids.len()],
        };
        let mut out: Vec<Option<Gathered>> = Vec::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for (k, w) in wanted.iter().enumerate() {
            if let (true, Some(sc)) = (cached[k], &self.shared) {
                let mut data = None;
                if need_data {
                    let mut b = vec![0u8; w.len];
                    if sc.read(&w.id, w.len, &mut b, 0)? {
                        data = Some(Arc::new(b));
                    }
                }
                if !need_data || data.is_some() {
                    out.push(Some(Gathered::new(data, Source::SharedCache)));
                    continue;
                }
            }
            missing.push(k);
            out.push(None);
        }
        let asked: Vec<Wanted> = missing.iter().map(|&k| wanted[k]).collect();
        for (&k, g) in missing.iter().zip(self.fetch_missing(&asked)?) {
            out[k] = Some(g);
        }
        let mut out: Vec<Gathered> = out.into_iter().map(|g| g.expect("gathered")).collect();
        if let Some(sc) = &self.shared {
            let items: Vec<(ChunkId, Arc<Vec<u8>>)> = missing
                .iter()
                .map(|&k| (wanted[k].id, out[k].data.clone().expect("fetched")))
                .collect();
            for (&k, a) in missing.iter().zip(sc.insert_many_now(&items)) {
                out[k].refused = a? == Admission::Refused;
            }
        }
        Ok(out)
    }

    /// Objects no cache holds: each from a lookaside medium, else from the
    /// store — all of those in one `get_many` (batched requests to a chunk
    /// server), verified in parallel. Results, with data, in the order
    /// asked; the first object that cannot be had fails the lot.
    fn fetch_missing(&self, wanted: &[Wanted]) -> Result<Vec<Gathered>> {
        let mut out: Vec<Option<Gathered>> = Vec::with_capacity(wanted.len());
        let mut from_store = Vec::new();
        for (k, w) in wanted.iter().enumerate() {
            if let Some(d) = self.find_lookaside(w) {
                out.push(Some(Gathered::new(Some(Arc::new(d)), Source::Lookaside)));
                continue;
            }
            from_store.push(k);
            out.push(None);
        }
        if !from_store.is_empty() {
            let ids: Vec<ChunkId> = from_store.iter().map(|&k| wanted[k].id).collect();
            let raw = self.store.get_many(&ids);
            let codec = self.store.config().codec();
            let decoded: Vec<Result<Vec<u8>>> = from_store
                .par_iter()
                .zip(raw)
                .map(|(&k, r)| {
                    let w = &wanted[k];
                    let ctx =
                        |e| context(e, format!("chunk {} of version {}", w.id, self.id.short()));
                    let data = codec
                        .open(&w.id, w.key.as_ref(), &r.map_err(ctx)?)
                        .map_err(ctx)?;
                    check_len(&data, w.len, &w.id)?;
                    Ok(data)
                })
                .collect();
            for (&k, d) in from_store.iter().zip(decoded) {
                let d = d?;
                self.fetched.fetch_add(1, Ordering::Relaxed);
                self.fetched_bytes
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
                out[k] = Some(Gathered::new(Some(Arc::new(d)), Source::Store));
            }
        }
        Ok(out.into_iter().map(|g| g.expect("fetched")).collect())
    }

    /// Fetch disk chunks `chunks` together — one batched request to the
    /// store for those no lookaside medium holds — skipping those a cache
    /// holds (the in-memory one, the shared cache) and those already being
    /// fetched; readers of the chunks it fetches wait for it rather than
    /// fetch them again. What arrives is handed to the shared cache (in
    /// the background, as a single fetch is). Returns the chunks it
    /// fetched, with their data; for a [`Together::Read`], also those
    /// others were fetching, once they arrive. A guest read spanning
    /// chunks fetches them this way, and a session's read-ahead does.
    pub fn fetch_together(
        &self,
        chunks: &[usize],
        who: Together,
    ) -> Result<Vec<(usize, Arc<Vec<u8>>)>> {
        let idx = &self.version.index;
        let mut ids = std::collections::HashSet::new();
        let mut todo: Vec<usize> = {
            let c = self.cache.lock();
            chunks
                .iter()
                .copied()
                .filter(|&i| {
                    let id = idx.ids[i];
                    !id.is_zero() && !c.iter().any(|(k, _)| *k == i) && ids.insert(id)
                })
                .collect()
        };
        if let (Some(sc), false) = (&self.shared, todo.is_empty()) {
            let ids: Vec<ChunkId> = todo.iter().map(|&i| idx.ids[i]).collect();
            let held = sc.contains_many(&ids)?;
            todo = todo
                .into_iter()
                .zip(held)
                .filter(|(_, h)| !h)
                .map(|(i, _)| i)
                .collect();
        }
        // Fetches of these chunks others have under way.
        let mut others = Vec::new();
        let mut landing = Landing {
            view: self,
            flights: {
                let mut m = self.inflight.lock();
                let mut mine = Vec::with_capacity(todo.len());
                for i in todo {
                    match m.entry(i) {
                        std::collections::hash_map::Entry::Vacant(e) => {
                            let f = Arc::new(Flight::default());
                            e.insert(f.clone());
                            mine.push((i, f));
                        }
                        std::collections::hash_map::Entry::Occupied(e) => {
                            others.push((i, e.get().clone()))
                        }
                    }
                }
                mine
            },
        };
        let keep = match who {
            Together::Read => true,
            Together::Ahead { keep } => keep,
        };
        let mut out = Vec::with_capacity(landing.flights.len() + others.len());
        if !landing.flights.is_empty() {
            let wanted: Vec<Wanted> = landing
                .flights
                .iter()
                .map(|(i, _)| self.disk_chunk(*i))
                .collect();
            let got = self.fetch_missing(&wanted)?;
            // Land them one by one, from the last: whatever is left if this
            // stops early is landed by `landing`.
            for g in got.into_iter().rev() {
                let (i, flight) = landing.flights.pop().expect("one flight per chunk");
                let data = g.data.expect("fetched");
                if let Some(sc) = &self.shared {
                    sc.insert(idx.ids[i], data.clone());
                }
                if keep {
                    self.remember(i, data.clone());
                }
                self.land(i, &flight, Some(data.clone()));
                out.push((i, data));
            }
        }
        if let Together::Read = who {
            // The read needs these too: wait for them here rather than
            // find them gone from the in-memory cache and fetch them again.
            for (i, f) in others {
                let mut d = f.done.lock();
                while d.is_none() {
                    f.cv.wait(&mut d);
                }
                if let Some(Some(data)) = d.as_ref() {
                    out.push((i, data.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Keep chunk `i` in the in-memory cache.
    fn remember(&self, i: usize, data: Arc<Vec<u8>>) {
        let mut c = self.cache.lock();
        if !c.iter().any(|(k, _)| *k == i) {
            c.insert(0, (i, data));
            c.truncate(CACHE_CHUNKS);
        }
    }

    /// A fetch of chunk `i` is over: hand its readers the chunk (`None`:
    /// it failed, each fetches for itself and gets its own error).
    fn land(&self, i: usize, flight: &Flight, data: Option<Arc<Vec<u8>>>) {
        *flight.done.lock() = Some(data);
        flight.cv.notify_all();
        self.inflight.lock().remove(&i);
    }

    /// The decoded content of chunk `i` (all zeroes for no chunk).
    pub fn chunk(&self, i: usize) -> Result<Arc<Vec<u8>>> {
        let idx = &self.version.index;
        if idx.ids[i].is_zero() {
            return Ok(Arc::new(vec![0u8; idx.chunk_len(i)]));
        }
        {
            let mut c = self.cache.lock();
            if let Some(p) = c.iter().position(|(k, _)| *k == i) {
                let e = c.remove(p);
                let data = e.1.clone();
                c.insert(0, e);
                return Ok(data);
            }
        }
        let data = self.fetch_once(i)?;
        self.remember(i, data.clone());
        Ok(data)
    }

    /// Fetch chunk `i` from the store, once however many readers ask at
    /// the same time, and hand it to the shared cache.
    fn fetch_once(&self, i: usize) -> Result<Arc<Vec<u8>>> {
        let (flight, leader) = {
            let mut m = self.inflight.lock();
            match m.get(&i) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight::default());
                    m.insert(i, f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            let mut d = flight.done.lock();
            while d.is_none() {
                flight.cv.wait(&mut d);
            }
            if let Some(Some(data)) = d.as_ref() {
                return Ok(data.clone());
            }
            drop(d);
            return self.fetch_chunk(i).map(Arc::new);
        }
        let got = match self.read_lookaside(i) {
            Some(d) => Ok(Arc::new(d)),
            None => self.fetch_chunk(i).map(Arc::new).inspect(|d| {
                self.fetched.fetch_add(1, Ordering::Relaxed);
                self.fetched_bytes
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
            }),
        };
        self.land(i, &flight, got.as_ref().ok().cloned());
        let data = got?;
        if let Some(sc) = &self.shared {
            sc.insert(self.version.index.ids[i], data.clone());
        }
        Ok(data)
    }

    fn fetch_chunk(&self, i: usize) -> Result<Vec<u8>> {
        let idx = &self.version.index;
        let data = fetch(&*self.store, &idx.ids[i], idx.key(i)).map_err(|e| {
            context(
                e,
                format!(
                    "chunk {} of version {} (bytes {}..{})",
                    i,
                    self.id.short(),
                    i as u64 * idx.chunk_size as u64,
                    i as u64 * idx.chunk_size as u64 + idx.chunk_len(i) as u64
                ),
            )
        })?;
        check_len(&data, idx.chunk_len(i), &idx.ids[i])?;
        Ok(data)
    }

    /// Chunk `i` from a lookaside medium, verified, if one has it.
    fn read_lookaside(&self, i: usize) -> Option<Vec<u8>> {
        self.find_lookaside(&self.disk_chunk(i))
    }

    fn find_lookaside(&self, w: &Wanted) -> Option<Vec<u8>> {
        let la = self.lookaside.as_ref()?;
        la.find(&self.store.config().codec(), &w.id, w.key.as_ref(), w.len)
    }

    /// Read from the shared cache, if it holds chunk `i`: a `pread` of
    /// the bytes asked for, no hashing (the chunk was verified on the way
    /// in).
    fn read_shared(&self, i: usize, dst: &mut [u8], within: usize) -> Result<bool> {
        match &self.shared {
            Some(sc) => {
                let idx = &self.version.index;
                let hit = sc.read(&idx.ids[i], idx.chunk_len(i), dst, within)?;
                if hit {
                    self.read_ahead_local(sc, i);
                }
                Ok(hit)
            }
            None => Ok(false),
        }
    }

    /// A reader moving sequentially through chunks held by the shared
    /// cache gets the next [`LOCAL_READ_AHEAD`] chunk files read into the
    /// page cache in the background (`posix_fadvise(WILLNEED)`). One file
    /// per chunk defeats the kernel's own read-ahead, which a raw image
    /// file gets across chunk boundaries; without this a cold boot read
    /// waits for the disk at every chunk.
    fn read_ahead_local(&self, sc: &SharedCache, i: usize) {
        let last = self.last_read.swap(i, Ordering::Relaxed);
        if last == i || last.wrapping_add(1) != i {
            return;
        }
        let idx = &self.version.index;
        let end = (i + 1 + LOCAL_READ_AHEAD).min(idx.records());
        let from = match self.advised_to.load(Ordering::Relaxed) {
            a if a != usize::MAX && a > i && a <= end => a,
            _ => i + 1,
        };
        if from >= end {
            return;
        }
        self.advised_to.store(end, Ordering::Relaxed);
        for j in from..end {
            if !idx.ids[j].is_zero() {
                sc.will_need(&idx.ids[j], idx.chunk_len(j));
            }
        }
    }

    /// Whether sectors `[s0, s1)` of chunk `i` all read as zero.
    fn zero_sectors(&self, i: usize, s0: usize, s1: usize) -> bool {
        let idx = &self.version.index;
        idx.ids[i].is_zero() || (s0..s1).all(|s| idx.state(i, s) == SectorState::Zero)
    }
}

/// Who fetches chunks together ([`VersionView::fetch_together`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Together {
    /// A read spanning them: it keeps them in the in-memory cache, and
    /// waits for (and gets) those others are fetching.
    Read,
    /// The read-ahead: it waits for nobody; `keep` them in the in-memory
    /// cache until they are in the private cache (no shared cache).
    Ahead { keep: bool },
}

/// Fetches a [`VersionView::fetch_together`] registered and has not landed
/// yet: landed as failed when it returns early (an error, a panic), so no
/// reader waits for them forever.
struct Landing<'a> {
    view: &'a VersionView,
    flights: Vec<(usize, Arc<Flight>)>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        for (i, f) in self.flights.drain(..) {
            self.view.land(i, &f, None);
        }
    }
}

fn check_len(data: &[u8], want: usize, id: &ChunkId) -> Result<()> {
    if data.len() != want {
        return Err(roamdisk_chunkstore::error::corrupt(format!(
            "chunk {id} holds {} bytes but the index expects {want}",
            data.len()
        )));
    }
    Ok(())
}

impl BlockDev for VersionView {
    fn layer(&self) -> &'static str {
        "cas-version"
    }
    fn describe(&self) -> String {
        format!(
            "cas version {} in {}",
            self.id.short(),
            self.store.describe()
        )
    }
    fn size(&self) -> u64 {
        self.version.index.disk_size
    }
    fn caps(&self) -> Caps {
        Caps {
            min_block: 1,
            preferred_block: self.version.index.chunk_size,
            ..Caps::FULL.read_only()
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let idx = &self.version.index;
        let cs = idx.chunk_size as u64;
        let end = off + buf.len() as u64;
        let last = (end.max(off + 1) - 1) / cs;
        // Chunks below this were fetched together (or tried) already; what
        // that fetch brought is copied from here (the in-memory cache may
        // have let it go by then, with many reads in flight).
        let mut together = 0;
        let mut brought: Vec<(usize, Arc<Vec<u8>>)> = Vec::new();
        let mut pos = off;
        while pos < end {
            let i = (pos / cs) as usize;
            let within = pos % cs;
            let n = (cs - within).min(end - pos);
            let dst = &mut buf[(pos - off) as usize..(pos - off + n) as usize];
            let s0 = (within / SECTOR) as usize;
            let s1 = (within + n).div_ceil(SECTOR) as usize;
            if self.zero_sectors(i, s0, s1) {
                dst.fill(0);
            } else if !self.read_shared(i, dst, within as usize)? {
                if (i as u64) < last && i >= together {
                    // The read goes on into the next chunks: fetch the
                    // missing ones together, one request. Best effort: a
                    // chunk it could not fetch is fetched alone below and
                    // reports its own error.
                    let to = (i + FETCH_TOGETHER).min(last as usize + 1);
                    let group: Vec<usize> = (i..to)
                        .filter(|&j| {
                            !self.zero_sectors(j, 0, idx.chunk_len(j).div_ceil(SECTOR as usize))
                        })
                        .collect();
                    match self.fetch_together(&group, Together::Read) {
                        Ok(got) => brought = got,
                        Err(e) => {
                            tracing::debug!("fetching chunks {i}..{to} together failed: {e}")
                        }
                    }
                    together = to;
                }
                let c = match brought.iter().find(|(j, _)| *j == i) {
                    Some((_, d)) => d.clone(),
                    None => self.chunk(i)?,
                };
                dst.copy_from_slice(&c[within as usize..(within + n) as usize]);
            }
            pos += n;
        }
        Ok(())
    }
    fn write_at(&self, _: &[u8], off: u64, _: WriteFlags) -> Result<()> {
        Err(err(
            roamdisk_blockdev::ErrorKind::ReadOnly,
            Op::Write,
            "a committed version is read-only: check it out into a session to change it",
        )
        .at(off))
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let idx = &self.version.index;
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        let cs = idx.chunk_size as u64;
        while pos < end {
            let i = (pos / cs) as usize;
            let chunk_end = ((i as u64 + 1) * cs).min(end);
            // A whole chunk at once when it is no chunk, or has no ZERO
            // sector (a state byte with no `01` pair): the NBD server
            // learns 64 MiB at a time.
            let whole = if idx.ids[i].is_zero() {
                Some(Alloc::Hole)
            } else if idx
                .record_states(i)
                .iter()
                .all(|&b| b & 0x55 & !(b >> 1) == 0)
            {
                Some(Alloc::Data)
            } else {
                None
            };
            if let Some(state) = whole {
                push_extent(
                    &mut out,
                    Extent {
                        len: chunk_end - pos,
                        state,
                    },
                );
                pos = chunk_end;
            }
            while pos < chunk_end {
                let s = ((pos % cs) / SECTOR) as usize;
                let next = ((pos / SECTOR + 1) * SECTOR).min(chunk_end);
                let state = if idx.state(i, s) == SectorState::Zero {
                    Alloc::Zero
                } else {
                    Alloc::Data
                };
                push_extent(
                    &mut out,
                    Extent {
                        len: next - pos,
                        state,
                    },
                );
                pos = next;
            }
            if out.len() > 1024 {
                break;
            }
        }
        Ok(out)
    }
}

/// Batches of chunks fetched and written at once by [`materialise`]: a
/// remote store's round trips overlap.
const MATERIALISE_THREADS: usize = 4;

/// Copy every non-zero sector of a version into `dst` (which must read
/// as zeroes beforehand: a new sparse file or image). Chunks are gathered
/// ([`VersionView::gather`]) in batches, verified in parallel, several
/// batches at once (each written where it belongs, in any order). Returns
/// the bytes written.
pub fn materialise(view: &VersionView, dst: &dyn BlockDev, progress: &dyn Progress) -> Result<u64> {
    let idx = &view.version.index;
    progress.phase("checking out", idx.disk_size);
    let batch = GATHER_BATCH;
    let batches = idx.records().div_ceil(batch);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let one = |first: usize| -> Result<u64> {
        let mut written = 0u64;
        let recs: Vec<usize> = (first..(first + batch).min(idx.records())).collect();
        let wanted: Vec<usize> = recs
            .iter()
            .copied()
            .filter(|&i| !idx.ids[i].is_zero())
            .collect();
        let objects: Vec<Wanted> = wanted.iter().map(|&i| view.disk_chunk(i)).collect();
        let decoded = view.gather(&objects, true).map_err(|e| {
            context(
                e,
                format!(
                    "checking out version {} from store {}",
                    view.id.short(),
                    view.store.describe()
                ),
            )
        })?;
        for (&i, got) in wanted.iter().zip(decoded) {
            let data = got.data.expect("gathered with data");
            let base = i as u64 * idx.chunk_size as u64;
            // Write runs of non-ZERO sectors; ZERO ones stay holes.
            let sectors = data.len().div_ceil(SECTOR as usize);
            let mut s = 0;
            while s < sectors {
                if idx.state(i, s) == SectorState::Zero {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < sectors && idx.state(i, e) != SectorState::Zero {
                    e += 1;
                }
                let a = s * SECTOR as usize;
                let b = (e * SECTOR as usize).min(data.len());
                dst.write_at(&data[a..b], base + a as u64, WriteFlags::default())?;
                written += (b - a) as u64;
                s = e;
            }
        }
        let done: u64 = recs.iter().map(|&i| idx.chunk_len(i) as u64).sum();
        progress.advance(done);
        Ok(written)
    };
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..MATERIALISE_THREADS.min(batches.max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut written = 0u64;
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= batches || failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(written);
                        }
                        match one(k * batch) {
                            Ok(n) => written += n,
                            Err(e) => {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a checkout worker panicked"))
            .collect()
    });
    let mut written = 0u64;
    for r in results {
        written += r?;
    }
    dst.flush()?;
    Ok(written)
}
