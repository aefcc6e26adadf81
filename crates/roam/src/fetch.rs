//! The one way chunks reach a version view: a [`Chain`] of sources tried
//! in order — this host's shared cache, lookaside media, the store —
//! composed when the view is opened. Each source verifies what it returns
//! against its name (a wrong or damaged copy is a miss or an error, never
//! data); what a later source brought is handed to the caches before it.
//! One single flight makes concurrent readers of one chunk wait for one
//! fetch ([`Chain::get`], [`Chain::get_together`]).
//!
//! Sources: [`StoreSource`] (a chunk store: batched requests, parallel
//! verification), `Lookaside` (media looked up by id), `SharedCache` (a
//! cache: it answers partial reads from its files, says cheaply what it
//! holds, keeps what comes from below, and takes page-cache advice).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use roamdisk_blockdev::flight::SingleFlight;
use roamdisk_blockdev::Result;
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::error::{context, corrupt};
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::store::ChunkRead;

/// An object to fetch: its id (not zero), decoded length and convergent
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub id: ChunkId,
    pub len: usize,
    pub key: Option<Key>,
}

/// Where a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    SharedCache,
    Lookaside,
    Store,
}

/// What became of a chunk handed to a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It is in the cache (now, or it already was).
    Admitted,
    /// It is not: too large for the cache's unit, or every resident chunk
    /// is pinned and the cache is full.
    Refused,
}

/// One gathered chunk.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The decoded bytes (`None` for a cache hit gathered without
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
        self.count(Some(g.source), len);
        self.refused += g.refused as u64;
    }

    /// A chunk of `len` bytes from `source` (`None`: brought by another
    /// reader's fetch, counted in `bytes` only).
    pub fn count(&mut self, source: Option<Source>, len: usize) {
        let n = len as u64;
        self.chunks += 1;
        self.bytes += n;
        match source {
            Some(Source::SharedCache) => self.shared_cache_bytes += n,
            Some(Source::Lookaside) => self.lookaside_bytes += n,
            Some(Source::Store) => self.store_bytes += n,
            None => {}
        }
    }
}

/// Chunks fetched from the store (cache and media hits not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    pub chunks: u64,
    pub bytes: u64,
}

/// A place chunks come from.
pub trait ChunkSource: Send + Sync {
    /// Which source this is.
    fn kind(&self) -> Source;
    /// Whether it keeps what later sources bring (a cache): asked first,
    /// cheaply, and handed what comes from below.
    fn is_cache(&self) -> bool {
        false
    }
    /// Copy bytes `within..within + dst.len()` of a chunk it holds into
    /// `dst` without reading the rest: `Ok(false)` if it does not hold it
    /// (or cannot read parts).
    fn read_part(&self, _w: &Wanted, _dst: &mut [u8], _within: usize) -> Result<bool> {
        Ok(false)
    }
    /// Which of `ids` it holds, without reading them (a cache; others say
    /// none).
    fn holds(&self, ids: &[ChunkId]) -> Result<Vec<bool>> {
        Ok(vec![false; ids.len()])
    }
    /// Whole chunks, decoded and verified, in the order asked: `Ok(None)`
    /// for one it does not hold, an error for one it cannot give.
    fn fetch(&self, wanted: &[Wanted]) -> Vec<Result<Option<Vec<u8>>>>;
    /// Keep chunks another source brought, durably, now: what became of
    /// each (a cache; others keep nothing).
    fn keep(&self, items: &[(ChunkId, Arc<Vec<u8>>)]) -> Vec<Result<Admission>> {
        items.iter().map(|_| Ok(Admission::Refused)).collect()
    }
    /// Keep a chunk another source brought, in the background.
    fn keep_later(&self, _id: ChunkId, _data: Arc<Vec<u8>>) {}
    /// Hint: the chunk is about to be read (a cache reads it into memory).
    fn advise(&self, _w: &Wanted) {}
}

/// A chunk store as a source: one batched request for many chunks,
/// verified (and decrypted) in parallel.
pub struct StoreSource {
    store: Arc<dyn ChunkRead>,
}

impl StoreSource {
    pub fn new(store: Arc<dyn ChunkRead>) -> StoreSource {
        StoreSource { store }
    }
}

/// An error unless `data` is `want` bytes long.
pub fn check_len(data: &[u8], want: usize, id: &ChunkId) -> Result<()> {
    if data.len() != want {
        return Err(corrupt(format!(
            "chunk {id} holds {} bytes but the index expects {want}",
            data.len()
        )));
    }
    Ok(())
}

impl ChunkSource for StoreSource {
    fn kind(&self) -> Source {
        Source::Store
    }
    fn fetch(&self, wanted: &[Wanted]) -> Vec<Result<Option<Vec<u8>>>> {
        let codec = self.store.config().codec();
        let open = |w: &Wanted, raw: Result<Vec<u8>>| -> Result<Option<Vec<u8>>> {
            let data = codec
                .open(&w.id, w.key.as_ref(), &raw?)
                .map_err(|e| context(e, format!("in store {}", self.store.describe())))?;
            check_len(&data, w.len, &w.id)?;
            Ok(Some(data))
        };
        if let [w] = wanted {
            return vec![open(w, self.store.get(&w.id))];
        }
        let ids: Vec<ChunkId> = wanted.iter().map(|w| w.id).collect();
        let raw = self.store.get_many(&ids);
        wanted
            .par_iter()
            .zip(raw)
            .map(|(w, r)| open(w, r))
            .collect()
    }
}

/// A chunk [`Chain::get_together_from`] brought: its position in the
/// request, its data, and where it came from (`None`: another reader's
/// fetch brought it).
pub type Brought = (usize, Arc<Vec<u8>>, Option<Source>);

/// Sources tried in order, with one single flight per chunk.
pub struct Chain {
    sources: Vec<Arc<dyn ChunkSource>>,
    /// Names what the chunks belong to in errors (`version 3f2a1b9c0d1e`).
    label: String,
    flights: SingleFlight<ChunkId, Arc<Vec<u8>>>,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    /// Fetches someone waits on now (a guest's read, a page its VM
    /// faulted on), and when the last one ended (nanoseconds since
    /// `born`): background work ([`Chain::background_turn`]) goes in the
    /// gaps, never in front of them on a slow link.
    waited_on: AtomicUsize,
    last_waited: AtomicU64,
    born: Instant,
}

/// A fetch someone waits on, while it lasts ([`Chain::foreground`]).
pub struct Foreground<'c>(&'c Chain);

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        let c = self.0;
        c.last_waited
            .store(c.born.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.waited_on.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long background work lets the link rest after the last waited-on
/// fetch (a resumed guest faulting page after page computes a few
/// milliseconds between its faults), and the longest it holds back (so
/// that it goes on, slowly, under a guest that never stops faulting).
const QUIET: Duration = Duration::from_millis(20);
const MAX_HOLD: Duration = Duration::from_secs(1);

impl Chain {
    /// `sources` in the order to try them (caches first); `label` names
    /// what the chunks belong to in errors.
    pub fn new(sources: Vec<Arc<dyn ChunkSource>>, label: String) -> Chain {
        Chain {
            sources,
            label,
            flights: SingleFlight::new(),
            fetched: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            waited_on: AtomicUsize::new(0),
            last_waited: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// Mark a fetch someone waits on (a guest read, a faulted page) for as
    /// long as the guard lives.
    pub fn foreground(&self) -> Foreground<'_> {
        self.waited_on.fetch_add(1, Ordering::AcqRel);
        Foreground(self)
    }

    /// Waited-on fetches in flight now.
    pub fn waited_on(&self) -> usize {
        self.waited_on.load(Ordering::Acquire)
    }

    /// Wait until no waited-on fetch is in flight and none ended within
    /// [`QUIET`] (at most [`MAX_HOLD`]): what background work (a working
    /// set's prefetch, read-ahead, a memory image's push) calls before
    /// each request, so that a request someone waits on never queues
    /// behind it on a slow link.
    pub fn background_turn(&self) {
        let t0 = Instant::now();
        loop {
            let quiet_since = Duration::from_nanos(self.last_waited.load(Ordering::Relaxed));
            let idle = self.born.elapsed().saturating_sub(quiet_since);
            if (self.waited_on() == 0 && idle >= QUIET) || t0.elapsed() >= MAX_HOLD {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Chunks fetched from the store so far.
    pub fn stats(&self) -> FetchStats {
        FetchStats {
            chunks: self.fetched.load(Ordering::Relaxed),
            bytes: self.fetched_bytes.load(Ordering::Relaxed),
        }
    }

    fn caches(&self) -> impl Iterator<Item = &Arc<dyn ChunkSource>> {
        self.sources.iter().filter(|s| s.is_cache())
    }

    fn below(&self) -> impl Iterator<Item = &Arc<dyn ChunkSource>> {
        self.sources.iter().filter(|s| !s.is_cache())
    }

    /// Read part of a chunk from a cache that holds it, without fetching
    /// anything: `Ok(true)` if one did.
    pub fn read_part(&self, w: &Wanted, dst: &mut [u8], within: usize) -> Result<bool> {
        for c in self.caches() {
            if c.read_part(w, dst, within)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A whole chunk from a cache that holds it (nothing is fetched).
    fn whole_from_caches(&self, w: &Wanted) -> Result<Option<Arc<Vec<u8>>>> {
        let mut b = vec![0u8; w.len];
        Ok(self.read_part(w, &mut b, 0)?.then(|| Arc::new(b)))
    }

    /// Which of `ids` some cache holds (nothing is fetched).
    pub fn cached(&self, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let mut held = vec![false; ids.len()];
        for c in self.caches() {
            for (h, c) in held.iter_mut().zip(c.holds(ids)?) {
                *h |= c;
            }
        }
        Ok(held)
    }

    /// Ask the caches to bring a chunk they hold into memory.
    pub fn advise(&self, w: &Wanted) {
        self.caches().for_each(|c| c.advise(w));
    }

    /// Hand chunks from below to the caches in the background.
    fn keep_later(&self, id: ChunkId, data: &Arc<Vec<u8>>) {
        self.caches().for_each(|c| c.keep_later(id, data.clone()));
    }

    fn count(&self, source: Source, len: usize) {
        if source == Source::Store {
            self.fetched.fetch_add(1, Ordering::Relaxed);
            self.fetched_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
    }

    /// Chunks no cache is asked for: each from the first source below the
    /// caches that has it, every source asked once for all it still
    /// lacks. Results, with data, in the order asked; the first chunk no
    /// source can give fails the lot.
    fn fetch_below(&self, wanted: &[Wanted]) -> Result<Vec<Gathered>> {
        let mut out: Vec<Option<Gathered>> = vec![None; wanted.len()];
        let mut todo: Vec<usize> = (0..wanted.len()).collect();
        for s in self.below() {
            if todo.is_empty() {
                break;
            }
            let asked: Vec<Wanted> = todo.iter().map(|&k| wanted[k]).collect();
            let mut missed = Vec::new();
            for (&k, r) in todo.iter().zip(s.fetch(&asked)) {
                let w = &wanted[k];
                match r.map_err(|e| context(e, format!("chunk {} of {}", w.id, self.label)))? {
                    Some(d) => {
                        self.count(s.kind(), d.len());
                        out[k] = Some(Gathered::new(Some(Arc::new(d)), s.kind()));
                    }
                    None => missed.push(k),
                }
            }
            todo = missed;
        }
        if let Some(&k) = todo.first() {
            return Err(roamdisk_chunkstore::error::not_found(format!(
                "chunk {} of {} is in none of its sources",
                wanted[k].id, self.label
            )));
        }
        Ok(out.into_iter().map(|g| g.expect("fetched")).collect())
    }

    /// One chunk from below the caches, fetched once however many readers
    /// ask at the same time, and handed to the caches in the background.
    pub fn get(&self, w: &Wanted) -> Result<Arc<Vec<u8>>> {
        self.get_from(w).map(|(d, _)| d)
    }

    /// [`Chain::get`], with where the chunk came from when this call
    /// fetched it (`None`: another reader's fetch brought it).
    pub fn get_from(&self, w: &Wanted) -> Result<(Arc<Vec<u8>>, Option<Source>)> {
        let from = std::cell::Cell::new(None);
        let d = self.flights.run(w.id, || -> Result<Arc<Vec<u8>>> {
            // A flight for this chunk may have landed (and handed it to
            // the caches) since the caller looked in them.
            if let Some(d) = self.whole_from_caches(w)? {
                from.set(Some(Source::SharedCache));
                return Ok(d);
            }
            let mut g = self.fetch_below(std::slice::from_ref(w))?;
            let g = g.pop().expect("one result");
            from.set(Some(g.source));
            let data = g.data.expect("fetched with data");
            self.keep_later(w.id, &data);
            Ok(data)
        })?;
        Ok((d, from.get()))
    }

    /// Fetch `wanted` (distinct ids) together — one batched request below
    /// the caches — except those a cache holds and those already being
    /// fetched; readers of the ones it fetches wait for it rather than
    /// fetch them again. What arrives is handed to the caches in the
    /// background. Returns (position in `wanted`, data) of those it
    /// fetched and, with `wait_others`, of those others were fetching,
    /// once they arrive.
    pub fn get_together(
        &self,
        wanted: &[Wanted],
        wait_others: bool,
    ) -> Result<Vec<(usize, Arc<Vec<u8>>)>> {
        Ok(self
            .get_together_from(wanted, wait_others)?
            .into_iter()
            .map(|(k, d, _)| (k, d))
            .collect())
    }

    /// [`Chain::get_together`], with where each chunk came from when this
    /// call fetched it (`None`: another reader's fetch brought it).
    pub fn get_together_from(&self, wanted: &[Wanted], wait_others: bool) -> Result<Vec<Brought>> {
        let ids: Vec<ChunkId> = wanted.iter().map(|w| w.id).collect();
        let held = self.cached(&ids)?;
        let todo = (0..wanted.len()).filter(|&k| !held[k]);
        let (mut leads, others) = self.flights.join_many(todo.map(|k| wanted[k].id));
        let pos = |id: &ChunkId| ids.iter().position(|x| x == id).expect("asked");
        let mut out = Vec::with_capacity(leads.len() + others.len());
        // Flights for some of these may have landed (and handed them to
        // the caches) since `cached` looked: those come from the caches.
        if !leads.is_empty() {
            let lead_ids: Vec<ChunkId> = leads.iter().map(|l| *l.key()).collect();
            let now_held = self.cached(&lead_ids)?;
            let mut still = Vec::with_capacity(leads.len());
            for (lead, held) in leads.into_iter().zip(now_held) {
                let w = &wanted[pos(lead.key())];
                match held
                    .then(|| self.whole_from_caches(w))
                    .transpose()?
                    .flatten()
                {
                    Some(data) => {
                        out.push((pos(lead.key()), data.clone(), Some(Source::SharedCache)));
                        lead.land(Some(data));
                    }
                    None => still.push(lead),
                }
            }
            leads = still;
        }
        if !leads.is_empty() {
            let mine: Vec<Wanted> = leads.iter().map(|l| wanted[pos(l.key())]).collect();
            // On an error the leads are dropped: landed as failed.
            let got = self.fetch_below(&mine)?;
            // Landed one by one from the last: if this stops early, what
            // is left lands as failed.
            for g in got.into_iter().rev() {
                let lead = leads.pop().expect("one lead per chunk");
                let data = g.data.expect("fetched");
                self.keep_later(*lead.key(), &data);
                out.push((pos(lead.key()), data.clone(), Some(g.source)));
                lead.land(Some(data));
            }
        }
        if wait_others {
            for (id, w) in others {
                if let Some(data) = w.wait() {
                    out.push((pos(&id), data, None));
                }
            }
        }
        Ok(out)
    }

    /// Gather chunks (none zero, distinct or not): each from a cache if
    /// one holds it, else from below — all of those in one batch per
    /// source, verified in parallel — and hand what was not cached to the
    /// caches, durable together. With `need_data`, cached chunks are read
    /// too. Results are in the order asked.
    pub fn gather(&self, wanted: &[Wanted], need_data: bool) -> Result<Vec<Gathered>> {
        let ids: Vec<ChunkId> = wanted.iter().map(|w| w.id).collect();
        let cached = self.cached(&ids)?;
        let mut out: Vec<Option<Gathered>> = Vec::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for (k, w) in wanted.iter().enumerate() {
            if cached[k] {
                let mut data = None;
                if need_data {
                    let mut b = vec![0u8; w.len];
                    if self.read_part(w, &mut b, 0)? {
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
        for (&k, g) in missing.iter().zip(self.fetch_below(&asked)?) {
            out[k] = Some(g);
        }
        let mut out: Vec<Gathered> = out.into_iter().map(|g| g.expect("gathered")).collect();
        if self.caches().next().is_some() && !missing.is_empty() {
            let mut seen = HashSet::new();
            let items: Vec<(ChunkId, Arc<Vec<u8>>)> = missing
                .iter()
                .filter(|&&k| seen.insert(wanted[k].id))
                .map(|&k| (wanted[k].id, out[k].data.clone().expect("fetched")))
                .collect();
            for c in self.caches() {
                for ((id, _), a) in items.iter().zip(c.keep(&items)) {
                    if a? == Admission::Refused {
                        for &k in missing.iter().filter(|&&k| wanted[k].id == *id) {
                            out[k].refused = true;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}
