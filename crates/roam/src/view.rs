//! A committed version as a read-only block device: what checkout
//! materialises (`checkout.rs`) or serves, and the base a session reads its
//! EMPTY sectors from.
//!
//! Chunks come through the view's fetch chain (`fetch.rs`: the shared
//! cache, lookaside media, the store), each verified against its name; a
//! bad chunk is an error naming it, never data. Decoded chunks stay in a
//! small memory cache, so a sequential reader that reads a chunk 4 KiB at
//! a time decodes it once.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use roamdisk_blockdev::{push_extent, Alloc, BlockDev, Caps, Extent, Op, Result, WriteFlags};

use crate::cache::SharedCache;
use crate::fetch::{Chain, ChunkSource, FetchStats, Gathered, StoreSource, Wanted};
use crate::lookaside::{Lookaside, MediaSource};
use crate::readahead::{ReadAhead, Window};
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::error::{context, err};
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::index::{SectorState, SECTOR};
use roamdisk_chunkstore::repo::load_version;
use roamdisk_chunkstore::store::{ChunkRead, DynStore};
use roamdisk_chunkstore::version::Version;

/// Chunks kept decoded in memory per view (sequential readers re-read a
/// chunk many times, 4 KiB at a time).
const CACHE_CHUNKS: usize = 64;

/// Most chunks of one read fetched together (at most half the in-memory
/// cache, which keeps them until the read copies them).
const FETCH_TOGETHER: usize = 32;
const _: () = assert!(FETCH_TOGETHER * 2 <= CACHE_CHUNKS);

/// Objects gathered per batch (one request to the store for those no
/// cache or medium holds).
pub const GATHER_BATCH: usize = 64;

/// A version, readable as a disk.
pub struct VersionView {
    store: DynStore,
    pub id: ChunkId,
    pub version: Version,
    /// Decoded chunks, by disk chunk, most recent first.
    cache: Mutex<Vec<(usize, Arc<Vec<u8>>)>>,
    /// The host's shared cache: the chain's first source.
    shared: Option<Arc<SharedCache>>,
    /// Lookaside media: tried before the store.
    lookaside: Option<Arc<Lookaside>>,
    /// Where chunks come from.
    chain: Chain,
    /// Chunk id -> the disk chunks that hold it (built on first use).
    by_id: std::sync::OnceLock<HashMap<ChunkId, Vec<u32>>>,
    /// A version served as a disk of its own reads ahead of its readers.
    ahead: Option<ReadAhead>,
}

/// What a read-ahead ([`ReadAhead`]) reads ahead of: a session, or a
/// version served as a disk of its own ([`VersionView::served`]).
pub trait AheadTarget: Send + Sync + 'static {
    /// The version the reads go to now (a session's base changes when it
    /// commits).
    fn version(self: Arc<Self>) -> Arc<VersionView>;
    /// The reader's read-ahead state.
    fn read_ahead(&self) -> &ReadAhead;
    /// Whether some sector of chunk `i` still reads from the version.
    fn reads_base(&self, _i: usize) -> bool {
        true
    }
    /// Keep chunk `i`, fetched ahead, where the reader will find it when no
    /// shared cache keeps it (a session copies it into its private cache;
    /// a served version keeps it in memory, which the fetch did already).
    fn keep(&self, _i: usize, _data: &[u8]) {}
}

/// Most chunks the read-ahead fetches together.
const AHEAD_BATCH: usize = crate::readahead::MAX;

/// Start `t`'s read-ahead: act on its windows, chunk by chunk — a chunk a
/// cache holds is advised (read into the page cache), the others are
/// fetched together — skipping those the reader read or no longer reads
/// from the version.
pub fn start_read_ahead(t: &Arc<dyn AheadTarget>) {
    let weak = Arc::downgrade(t);
    t.read_ahead().start(move |jobs| match weak.upgrade() {
        Some(t) => {
            act(t, jobs);
            true
        }
        None => false,
    });
}

fn act(t: Arc<dyn AheadTarget>, jobs: Vec<Window>) {
    let base = t.clone().version();
    let idx = &base.version.index;
    let ra = t.read_ahead();
    let todo: Vec<usize> = jobs
        .into_iter()
        .filter(|j| j.base == base.id)
        .flat_map(|j| j.chunks)
        .filter(|&i| !idx.ids[i].is_zero() && !ra.was_read(i) && t.reads_base(i))
        .collect();
    let shared = base.shared.is_some();
    // Not held back for waited-on fetches (`Chain::background_turn`):
    // a read-ahead fetches what its own reader is about to wait on.
    for part in todo.chunks(AHEAD_BATCH) {
        let ids: Vec<ChunkId> = part.iter().map(|&i| idx.ids[i]).collect();
        let held = match base.chain.cached(&ids) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("read-ahead stopped short: {e}");
                return;
            }
        };
        let mut fetch = Vec::with_capacity(part.len());
        for (&i, h) in part.iter().zip(held) {
            if h {
                base.chain.advise(&base.disk_chunk(i));
            } else {
                fetch.push(i);
            }
        }
        if fetch.is_empty() {
            continue;
        }
        // Without a shared cache, the chunks stay in memory until the
        // reader keeps them.
        match base.fetch_together(&fetch, Together::Ahead { keep: !shared }) {
            Ok(got) => {
                tracing::trace!(
                    "read-ahead: {} of chunks {}..={} fetched",
                    got.len(),
                    fetch[0],
                    fetch[fetch.len() - 1]
                );
                if !shared {
                    for (i, data) in got {
                        t.keep(i, &data);
                    }
                }
            }
            // The reader's own reads fetch what this could not and report
            // why.
            Err(e) => tracing::debug!("read-ahead stopped short: {e}"),
        }
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
        let mut v = VersionView {
            chain: Chain::new(Vec::new(), String::new()),
            store,
            id,
            version,
            cache: Mutex::new(Vec::new()),
            shared: None,
            lookaside: None,
            by_id: std::sync::OnceLock::new(),
            ahead: None,
        };
        v.compose();
        v
    }

    /// The fetch chain from the sources set: the shared cache, lookaside
    /// media, then the store.
    fn compose(&mut self) {
        let mut sources: Vec<Arc<dyn ChunkSource>> = Vec::new();
        if let Some(sc) = &self.shared {
            sources.push(sc.clone());
        }
        if let Some(la) = &self.lookaside {
            sources.push(Arc::new(MediaSource {
                media: la.clone(),
                codec: self.store.config().codec(),
            }));
        }
        let store: Arc<dyn ChunkRead> = self.store.clone();
        sources.push(Arc::new(StoreSource::new(store)));
        self.chain = Chain::new(sources, format!("version {}", self.id.short()));
    }

    /// The view as a disk of its own (served, or a `cas-version` layer):
    /// it reads ahead of sequential readers. A session's base is not
    /// served this way: the session reads ahead of its guest.
    pub fn served(mut self) -> Arc<VersionView> {
        self.ahead = Some(ReadAhead::new(self.version.index.records()));
        let view = Arc::new(self);
        let t: Arc<dyn AheadTarget> = view.clone();
        start_read_ahead(&t);
        view
    }

    /// Read through (and fill) the host's shared cache.
    pub fn with_shared_cache(mut self, cache: Option<Arc<SharedCache>>) -> VersionView {
        self.shared = cache;
        self.compose();
        self
    }

    /// Try these media before the store.
    pub fn with_lookaside(mut self, media: Option<Arc<Lookaside>>) -> VersionView {
        self.lookaside = media;
        self.compose();
        self
    }

    pub fn lookaside(&self) -> Option<&Arc<Lookaside>> {
        self.lookaside.as_ref()
    }

    pub fn shared_cache(&self) -> Option<&Arc<SharedCache>> {
        self.shared.as_ref()
    }

    /// The chain the view's chunks come through.
    pub fn chain(&self) -> &Chain {
        &self.chain
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

    /// Chunks fetched from the store so far (cache and media hits not
    /// counted).
    pub fn fetch_stats(&self) -> FetchStats {
        self.chain.stats()
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The memory image's chunks: a stream's in order (zero ids
    /// included); a page image's stored chunks, its working set first.
    pub fn memory_chunks(&self) -> Vec<Wanted> {
        if let Some(p) = &self.version.pages {
            return p
                .chunks_in_push_order()
                .iter()
                .map(|c| self.page_chunk(c.block as usize, c.chunk as usize))
                .collect();
        }
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

    /// Chunk `c` of RAM block `b` of the page image as an object to fetch
    /// (its id is zero for an all-zero chunk).
    pub fn page_chunk(&self, b: usize, c: usize) -> Wanted {
        let idx = &self.version.pages.as_ref().expect("a page image").blocks[b].index;
        Wanted {
            id: idx.ids[c],
            len: idx.chunk_len(c),
            key: idx.key(c).copied(),
        }
    }

    /// Whether the version keeps a memory image (a stream or pages).
    pub fn has_memory(&self) -> bool {
        self.version.memory.size > 0 || self.version.pages.is_some()
    }

    /// Disk chunk `i` as an object to fetch.
    pub fn disk_chunk(&self, i: usize) -> Wanted {
        let idx = &self.version.index;
        Wanted {
            id: idx.ids[i],
            len: idx.chunk_len(i),
            key: idx.key(i).copied(),
        }
    }

    /// Gather objects (none zero) through the chain ([`Chain::gather`]).
    pub fn gather(&self, wanted: &[Wanted], need_data: bool) -> Result<Vec<Gathered>> {
        self.chain.gather(wanted, need_data)
    }

    /// Fetch disk chunks `chunks` together ([`Chain::get_together`]),
    /// skipping those held in memory and repeats of one object. Returns
    /// the chunks it fetched, with their data; for a [`Together::Read`],
    /// also those others were fetching, once they arrive. A guest read
    /// spanning chunks fetches them this way, and a session's read-ahead
    /// does.
    pub fn fetch_together(
        &self,
        chunks: &[usize],
        who: Together,
    ) -> Result<Vec<(usize, Arc<Vec<u8>>)>> {
        let mut ids = std::collections::HashSet::new();
        let todo: Vec<usize> = {
            let c = self.cache.lock();
            chunks
                .iter()
                .copied()
                .filter(|&i| {
                    let id = self.version.index.ids[i];
                    !id.is_zero() && !c.iter().any(|(k, _)| *k == i) && ids.insert(id)
                })
                .collect()
        };
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<Wanted> = todo.iter().map(|&i| self.disk_chunk(i)).collect();
        let (keep, wait) = match who {
            Together::Read => (true, true),
            Together::Ahead { keep } => (keep, false),
        };
        let _waited = wait.then(|| self.chain.foreground());
        let got = self.chain.get_together(&wanted, wait)?;
        Ok(got
            .into_iter()
            .map(|(k, data)| {
                if keep {
                    self.remember(todo[k], data.clone());
                }
                (todo[k], data)
            })
            .collect())
    }

    /// Keep chunk `i` in the in-memory cache.
    fn remember(&self, i: usize, data: Arc<Vec<u8>>) {
        let mut c = self.cache.lock();
        if !c.iter().any(|(k, _)| *k == i) {
            c.insert(0, (i, data));
            c.truncate(CACHE_CHUNKS);
        }
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
        let _waited = self.chain.foreground();
        let data = self.chain.get(&self.disk_chunk(i)).map_err(|e| {
            let cs = idx.chunk_size as u64;
            context(
                e,
                format!(
                    "chunk {} of version {} (bytes {}..{})",
                    i,
                    self.id.short(),
                    i as u64 * cs,
                    i as u64 * cs + idx.chunk_len(i) as u64
                ),
            )
        })?;
        self.remember(i, data.clone());
        Ok(data)
    }

    /// Whether sectors `[s0, s1)` of chunk `i` all read as zero.
    fn zero_sectors(&self, i: usize, s0: usize, s1: usize) -> bool {
        let idx = &self.version.index;
        idx.ids[i].is_zero() || (s0..s1).all(|s| idx.state(i, s) == SectorState::Zero)
    }
}

impl AheadTarget for VersionView {
    fn version(self: Arc<Self>) -> Arc<VersionView> {
        self
    }
    fn read_ahead(&self) -> &ReadAhead {
        self.ahead.as_ref().expect("a served view reads ahead")
    }
}

impl BlockDev for VersionView {
    roamdisk_blockdev::layer!("cas-version");
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
        if let Some(ra) = &self.ahead {
            ra.on_read(self.id, idx.chunk_size, idx.records(), off, end);
        }
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
            } else if !self
                .chain
                .read_part(&self.disk_chunk(i), dst, within as usize)?
            {
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
