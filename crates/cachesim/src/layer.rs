//! `cache[block=B,shards=N,report=FILE]:[POLICY:]SIZE:NEXT` — a memory
//! cache of SIZE bytes in front of NEXT, in blocks of B bytes, whose
//! residency is decided by POLICY through the [`ShardedCache`] engine that
//! `roamdisk sim --shards N` runs too (manual: `docs/layers/cache.md`).
//!
//! One [`BlockCache`] may sit in front of several devices (the disk
//! server's golden images): each is a [`CacheDev`] attached with its own
//! device number, and the blocks of all of them compete for one capacity
//! under one policy, keyed by (device, block).
//!
//! Reads are read-through: a block not cached is read whole (aligned) from
//! NEXT and kept if the policy admitted it; a cached block is served from
//! memory; a block another read is fetching now is waited for (one read
//! of NEXT per block in a boot storm), not fetched twice. Writes and write-zeroes go through to NEXT and count as accesses
//! (as in the simulator); afterwards the cached copy is patched, or
//! dropped when it cannot be known to equal NEXT. Trims go to NEXT and
//! forget the blocks they touch. Flush and everything else pass through.
//!
//! # Concurrency
//!
//! No lock is held across I/O, and there is no global lock: each shard's
//! lock guards its policy and its [`Slots`]. Cached bytes are immutable
//! `Arc<[u8]>`s: a reader clones the Arc under the shard lock and copies
//! outside it; a write installs a new Arc, so a reader never sees a torn
//! block. What keeps the cache equal to NEXT when reads and writes of one
//! block race is this ordering, per block:
//!
//! - a read that must fetch a block takes a *ticket* (the slot's
//!   generation) before reading NEXT and installs what it read only if,
//!   afterwards, the slot still has that generation, holds no data and no
//!   write of the block is in flight;
//! - a write registers itself as in flight and bumps the generation
//!   *before* writing NEXT (so a fetch that started earlier cannot
//!   install: it may have read the old bytes), and, once NEXT has the
//!   data, deregisters, bumps the generation again (so a fetch that
//!   overlapped the write cannot install either) and installs the patched
//!   block only if it was the only write of that block in flight the whole
//!   time — with two overlapping writes NEXT's final bytes are whichever
//!   landed last, which the cache cannot know, so it drops its copy;
//! - a trim forgets the block after NEXT trimmed it: any fetch that
//!   overlapped the trim finds no slot and installs nothing.

use parking_lot::Condvar;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::layers::report::{write_report, ReportAt};
use roamdisk_blockdev::{
    BlockDev, Error, ErrorKind, LayerKind, Op, OpenCtx, OptionalArg, Result, WriteFlags, ZeroFlags,
};

use crate::index::{FastMap, HashIndex};
use crate::policy::{Outcome, PolicySpec};
use crate::sharded::{EngineCounts, ShardedCache};

/// Smallest and largest block size.
pub const MIN_BLOCK: u64 = 4 << 10;
pub const MAX_BLOCK: u64 = 1 << 20;
/// Shards when the spec gives none (fewer if the cache has fewer blocks).
pub const DEFAULT_SHARDS: usize = 16;

/// How a cache layer is configured.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    pub policy: PolicySpec,
    /// Bytes of cached data.
    pub size: u64,
    /// The unit of caching, a power of two in [`MIN_BLOCK`, `MAX_BLOCK`].
    pub block: u64,
    /// Shards of the engine.
    pub shards: usize,
    /// Write [`CacheStats`] as JSON here at every flush and at close.
    pub report: Option<PathBuf>,
}

/// What the layer did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub policy: String,
    pub block_size: u64,
    /// Capacity in blocks.
    pub capacity: usize,
    pub shards: usize,
    /// The counters over every device (flat in the JSON report).
    #[serde(flatten)]
    pub totals: DeviceStats,
}

/// A [`BlockCache`]'s counters: over every device ([`CacheStats::totals`]),
/// or one device's share: its accesses, the evictions and trims of its
/// blocks, and its blocks resident now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStats {
    /// Block accesses (reads and writes) the policy found resident.
    pub hits: u64,
    /// Block accesses it did not (and admitted).
    pub misses: u64,
    /// Blocks evicted to admit others (a device's: its blocks evicted to
    /// admit a block of any device).
    pub evictions: u64,
    /// Resident blocks forgotten by a trim.
    pub trimmed: u64,
    /// Bytes of reads served from memory.
    pub bytes_from_cache: u64,
    /// Bytes the read path fetched from NEXT (whole blocks).
    pub bytes_from_next: u64,
    /// Blocks resident now.
    pub resident: u64,
}

impl DeviceStats {
    fn add(&mut self, o: &DeviceStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.evictions += o.evictions;
        self.trimmed += o.trimmed;
        self.bytes_from_cache += o.bytes_from_cache;
        self.bytes_from_next += o.bytes_from_next;
        self.resident += o.resident;
    }
}

/// Bits of a key that hold the block number; the device number sits
/// above them. A key is thus [`shard_hint`](crate::sharded::shard_hint)`(device, block)` for every
/// device below 2^20 and block below 2^44 (64 PiB in 4 KiB blocks), which
/// is what the simulator hashes to pick a shard: a cache shared by several
/// devices picks the shards `roamdisk sim` picks for a trace of several.
const BLOCK_BITS: u32 = 44;
/// Devices one cache can hold.
pub const MAX_DEVICES: u32 = 1 << (64 - BLOCK_BITS);

#[inline]
fn device_of(key: u64) -> usize {
    (key >> BLOCK_BITS) as usize
}

/// A cached block's state.
struct Slot {
    /// The block's bytes, equal to NEXT's; `None` while not yet fetched
    /// (or dropped by a write that could not patch it).
    data: Option<Arc<[u8]>>,
    /// Changes whenever a write or a new admission makes earlier fetches
    /// of this block unfit to install.
    gen: u64,
    /// The ticket of the read fetching this block now, if one is: later
    /// readers wait for it instead of reading NEXT too.
    filling: Option<u64>,
}

/// Writes of a block in flight.
struct InFlight {
    writers: u32,
    /// Another write of the block overlapped one of them.
    contended: bool,
}

/// The layer's part of a shard: the data of its resident blocks, by key.
#[derive(Default)]
pub struct Slots {
    slots: FastMap<u64, Slot>,
    writing: FastMap<u64, InFlight>,
    next_gen: u64,
    /// Counters per device, indexed by device number.
    devices: Vec<DeviceStats>,
}

impl Slots {
    fn gen(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    #[inline]
    fn dev(&mut self, key: u64) -> &mut DeviceStats {
        let d = device_of(key);
        if d >= self.devices.len() {
            self.devices.resize(d + 1, DeviceStats::default());
        }
        &mut self.devices[d]
    }

    /// Count an access's outcome and bring the slots in line with it;
    /// returns the evicted block's bytes, for the caller to reuse as a
    /// buffer.
    fn admit(&mut self, key: u64, o: Outcome<u64>) -> Option<Arc<[u8]>> {
        let Outcome::Miss { evicted } = o else {
            self.dev(key).hits += 1;
            return None;
        };
        let me = self.dev(key);
        me.misses += 1;
        me.resident += 1;
        let old = evicted.and_then(|e| {
            let victim = self.dev(e);
            victim.evictions += 1;
            victim.resident -= 1;
            self.slots.remove(&e)?.data
        });
        let gen = self.gen();
        self.slots.insert(
            key,
            Slot {
                data: None,
                gen,
                filling: None,
            },
        );
        old
    }
}

/// A block a read must fetch: (block, ticket, the evicted block's buffer
/// to reuse).
type Fetch = (u64, u64, Option<Arc<[u8]>>);

/// A new zeroed buffer, allocated once.
fn zeroed(n: usize) -> Arc<[u8]> {
    std::iter::repeat_n(0u8, n).collect()
}

/// Where a write's bytes come from.
#[derive(Clone, Copy)]
enum Src<'a> {
    Data(&'a [u8]),
    Zero,
}

/// The cache itself: the engine, its blocks' data and counters. One
/// cache may sit in front of several devices ([`BlockCache::attach`]),
/// each a [`CacheDev`] with its own device number: their blocks compete
/// for one capacity under one policy, keyed by (device, block), as
/// `roamdisk sim --sharing shared` models a trace of several devices.
pub struct BlockCache {
    engine: ShardedCache<u64, Slots>,
    /// One per shard: readers waiting for another reader's fetch of a
    /// block of that shard (see [`Slot::filling`]).
    filled: Vec<Condvar>,
    opts: CacheOptions,
}

impl BlockCache {
    /// An empty cache; checks the block size and that the cache holds at
    /// least one block per shard.
    pub fn new(opts: CacheOptions) -> Result<Arc<BlockCache>> {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "cache", m);
        if !opts.block.is_power_of_two() || !(MIN_BLOCK..=MAX_BLOCK).contains(&opts.block) {
            return Err(bad(format!(
                "block size {} must be a power of two from 4K to 1M",
                opts.block
            )));
        }
        let capacity = usize::try_from(opts.size / opts.block).unwrap_or(usize::MAX);
        if capacity == 0 {
            return Err(bad(format!(
                "a cache of {} bytes holds no block of {} bytes: give a larger SIZE",
                opts.size, opts.block
            )));
        }
        let engine: ShardedCache<u64, Slots> =
            ShardedCache::new::<HashIndex<u64>>(&opts.policy, capacity, opts.shards)
                .map_err(|e| bad(e.0))?;
        for i in 0..engine.shards() {
            let mut g = engine.lock(i);
            let n = g.capacity();
            g.data.slots.reserve(n);
        }
        let filled = (0..engine.shards()).map(|_| Condvar::new()).collect();
        Ok(Arc::new(BlockCache {
            engine,
            filled,
            opts,
        }))
    }

    /// `next` behind this cache as device number `device` (distinct per
    /// device; below [`MAX_DEVICES`]). The device must not change under
    /// the cache but through the returned layer.
    pub fn attach(self: &Arc<Self>, device: u32, next: Arc<dyn BlockDev>) -> Result<CacheDev> {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "cache", m);
        if device >= MAX_DEVICES {
            return Err(bad(format!(
                "device {device}: one cache holds at most {MAX_DEVICES} devices"
            )));
        }
        let size = next.size();
        if size.div_ceil(self.opts.block) > 1 << BLOCK_BITS {
            return Err(bad(format!(
                "a device of {size} bytes has more than 2^{BLOCK_BITS} blocks of {} bytes",
                self.opts.block
            )));
        }
        Ok(CacheDev {
            size,
            next,
            cache: self.clone(),
            device: u64::from(device) << BLOCK_BITS,
        })
    }

    pub fn options(&self) -> &CacheOptions {
        &self.opts
    }

    /// Counters so far, over every device.
    pub fn stats(&self) -> CacheStats {
        let EngineCounts {
            hits,
            misses,
            evictions,
            removed,
        } = self.engine.counts();
        let mut t = DeviceStats {
            hits,
            misses,
            evictions,
            trimmed: removed,
            ..DeviceStats::default()
        };
        for i in 0..self.engine.shards() {
            let g = self.engine.lock(i);
            for d in &g.data.devices {
                t.bytes_from_cache += d.bytes_from_cache;
                t.bytes_from_next += d.bytes_from_next;
            }
            t.resident += g.len() as u64;
        }
        CacheStats {
            policy: self.opts.policy.label(),
            block_size: self.opts.block,
            capacity: self.engine.capacity(),
            shards: self.engine.shards(),
            totals: t,
        }
    }

    /// The counters of device `device` so far.
    pub fn device_stats(&self, device: u32) -> DeviceStats {
        let mut s = DeviceStats::default();
        for i in 0..self.engine.shards() {
            let g = self.engine.lock(i);
            if let Some(d) = g.data.devices.get(device as usize) {
                s.add(d);
            }
        }
        s
    }

    fn write_report(&self, at: ReportAt) {
        if let Some(path) = &self.opts.report {
            write_report("cache", path, &self.stats(), at);
        }
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        let s = self.stats();
        let t = &s.totals;
        tracing::info!(
            policy = %s.policy,
            hits = t.hits,
            misses = t.misses,
            evictions = t.evictions,
            from_cache_mib = t.bytes_from_cache as f64 / 1048576.0,
            "cache: counters at close"
        );
        self.write_report(ReportAt::Close);
    }
}

/// The cache layer: one device in front of a [`BlockCache`].
pub struct CacheDev {
    next: Arc<dyn BlockDev>,
    cache: Arc<BlockCache>,
    /// The device number, shifted into a key's top bits.
    device: u64,
    size: u64,
}

impl CacheDev {
    /// `next` behind a cache of its own.
    pub fn new(next: Arc<dyn BlockDev>, opts: CacheOptions) -> Result<CacheDev> {
        BlockCache::new(opts)?.attach(0, next)
    }

    /// Counters so far, of the whole cache (every device attached to it).
    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The cache this layer is a front of.
    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    /// The byte range of block `b` (the disk's last block may be short).
    #[inline]
    fn span(&self, b: u64) -> (u64, u64) {
        let start = b * self.cache.opts.block;
        (start, (start + self.cache.opts.block).min(self.size))
    }

    /// Block `b`'s key in the engine (its [`shard_hint`](crate::sharded::shard_hint)).
    #[inline]
    fn key(&self, b: u64) -> u64 {
        self.device | b
    }

    #[inline]
    fn shard(&self, key: u64) -> usize {
        self.cache.engine.shard_of(key)
    }

    /// Lock the shard of block `b`; returns its key too.
    #[inline]
    fn lock(
        &self,
        b: u64,
    ) -> (
        u64,
        parking_lot::MutexGuard<'_, crate::sharded::Shard<u64, Slots>>,
    ) {
        let k = self.key(b);
        (k, self.cache.engine.lock(self.shard(k)))
    }

    /// Blocks covering `[off, off + len)` (`len` > 0).
    #[inline]
    fn blocks(&self, off: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        let block = self.cache.opts.block;
        off / block..=(off + len - 1) / block
    }

    /// Keep `data`, fetched from NEXT with `ticket`, as block `b`'s bytes
    /// if nothing made that fetch stale (see the module's comment).
    fn install(&self, b: u64, ticket: u64, data: Option<Arc<[u8]>>) {
        let (k, mut g) = self.lock(b);
        let d = &mut g.data;
        let writing = d.writing.contains_key(&k);
        let Some(slot) = d.slots.get_mut(&k) else {
            return;
        };
        if slot.filling == Some(ticket) {
            slot.filling = None;
            self.cache.filled[self.shard(k)].notify_all();
        }
        if !writing && slot.gen == ticket && slot.data.is_none() {
            slot.data = data;
        }
    }

    /// Block `b`'s bytes once the read fetching it (ticket `filler`) is
    /// done: its copy (`served` bytes of it counted as from the cache), or
    /// `None` when it could not keep one (a write overlapped it, it failed,
    /// the block was evicted meanwhile) and the caller must read NEXT
    /// itself.
    fn wait_fill(&self, b: u64, filler: u64, served: u64) -> Option<Arc<[u8]>> {
        let (k, mut g) = self.lock(b);
        let cv = &self.cache.filled[self.shard(k)];
        loop {
            let slot = g.data.slots.get(&k)?;
            if slot.filling != Some(filler) {
                let data = slot.data.clone()?;
                g.data.dev(k).bytes_from_cache += served;
                return Some(data);
            }
            // A fetch always ends by clearing its mark (install); the
            // timeout only bounds a wait on a filler that panicked.
            let t = cv.wait_for(&mut g, Duration::from_secs(1));
            if t.timed_out() && g.data.slots.get(&k).and_then(|s| s.filling) == Some(filler) {
                return None;
            }
        }
    }

    /// Pass 2 of a read: fetch the blocks it took tickets for, runs of
    /// consecutive blocks with one read each, and install them.
    fn fetch(&self, buf: &mut [u8], off: u64, fetch: &mut [Fetch]) -> Result<()> {
        let len = buf.len() as u64;
        // Pass 2: fetch runs of consecutive blocks with one read each.
        let mut i = 0;
        while i < fetch.len() {
            let mut j = i + 1;
            while j < fetch.len() && fetch[j].0 == fetch[j - 1].0 + 1 {
                j += 1;
            }
            if j == i + 1 {
                // One block (the usual miss): read it straight into the
                // buffer it will be cached in — the evicted block's when
                // no reader still holds that one — and copy it out once.
                let (b, ticket) = (fetch[i].0, fetch[i].1);
                let recycled = fetch[i].2.take();
                let (start, end) = self.span(b);
                let n = (end - start) as usize;
                let mut data = recycled
                    .filter(|r| r.len() == n)
                    .and_then(|mut r| Arc::get_mut(&mut r).is_some().then_some(r))
                    .unwrap_or_else(|| zeroed(n));
                let blk = Arc::get_mut(&mut data).expect("a buffer of our own");
                self.next.read_at(blk, start)?;
                let (lo, hi) = (off.max(start), (off + len).min(end));
                buf[(lo - off) as usize..(hi - off) as usize]
                    .copy_from_slice(&blk[(lo - start) as usize..(hi - start) as usize]);
                self.install(b, ticket, Some(data));
                i = j;
                continue;
            }
            let first = self.span(fetch[i].0).0;
            let last = self.span(fetch[j - 1].0).1;
            let mut tmp = vec![0u8; (last - first) as usize];
            self.next.read_at(&mut tmp, first)?;
            let (lo, hi) = (off.max(first), (off + len).min(last));
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&tmp[(lo - first) as usize..(hi - first) as usize]);
            for &(b, ticket, _) in &fetch[i..j] {
                let (start, end) = self.span(b);
                self.install(
                    b,
                    ticket,
                    Some(Arc::from(
                        &tmp[(start - first) as usize..(end - first) as usize],
                    )),
                );
            }
            i = j;
        }
        Ok(())
    }

    fn write_through(
        &self,
        off: u64,
        len: u64,
        src: Src<'_>,
        io: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return io();
        }
        // Register every block's write and bump its generation.
        let mut gens = Vec::with_capacity(self.blocks(off, len).count());
        for b in self.blocks(off, len) {
            let (k, mut g) = self.lock(b);
            let o = g.access(k);
            let d = &mut g.data;
            d.admit(k, o);
            let gen = d.gen();
            if let Some(s) = d.slots.get_mut(&k) {
                s.gen = gen;
            }
            d.writing
                .entry(k)
                .and_modify(|w| {
                    w.writers += 1;
                    w.contended = true;
                })
                .or_insert(InFlight {
                    writers: 1,
                    contended: false,
                });
            gens.push(gen);
        }
        let r = io();
        for (b, my_gen) in self.blocks(off, len).zip(gens) {
            let (start, end) = self.span(b);
            let (k, mut g) = self.lock(b);
            let d = &mut g.data;
            let sole = match d.writing.get_mut(&k) {
                Some(w) => {
                    w.writers -= 1;
                    let sole = !w.contended;
                    if w.writers == 0 {
                        d.writing.remove(&k);
                    }
                    sole
                }
                None => false,
            };
            let gen = d.gen();
            let Some(slot) = d.slots.get_mut(&k) else {
                continue;
            };
            let fresh = r.is_ok() && sole && slot.gen == my_gen;
            slot.gen = gen;
            let old = slot.data.take();
            if !fresh {
                continue;
            }
            // The part of the block this write covered.
            let (lo, hi) = (off.max(start), (off + len).min(end));
            let fill = |blk: &mut [u8]| {
                let dst = &mut blk[(lo - start) as usize..(hi - start) as usize];
                match src {
                    Src::Data(buf) => {
                        dst.copy_from_slice(&buf[(lo - off) as usize..(hi - off) as usize])
                    }
                    Src::Zero => dst.fill(0),
                }
            };
            slot.data = if lo == start && hi == end {
                Some(match src {
                    Src::Data(buf) => Arc::from(&buf[(lo - off) as usize..(hi - off) as usize]),
                    Src::Zero => zeroed((end - start) as usize),
                })
            } else {
                old.map(|o| {
                    let mut blk = o.to_vec();
                    fill(&mut blk);
                    blk.into()
                })
            };
        }
        r
    }
}

impl BlockDev for CacheDev {
    fn layer(&self) -> &'static str {
        "cache"
    }
    fn next(&self) -> Option<&dyn BlockDev> {
        Some(&*self.next)
    }
    fn describe(&self) -> String {
        let c = &self.cache;
        format!(
            "cache ({}, {} blocks of {} B, {} shards)",
            c.opts.policy.label(),
            c.engine.capacity(),
            c.opts.block,
            c.engine.shards()
        )
    }
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        // Pass 1, block by block in order (the order the simulator sees):
        // serve what is cached, take a ticket for the rest.
        let mut fetch: Vec<Fetch> = Vec::new();
        // Blocks another read is fetching now: (block, its ticket).
        let mut wait: Vec<(u64, u64)> = Vec::new();
        for b in self.blocks(off, len) {
            let (start, end) = self.span(b);
            let (lo, hi) = (off.max(start), (off + len).min(end));
            let (k, mut g) = self.lock(b);
            let o = g.access(k);
            let d = &mut g.data;
            let recycled = d.admit(k, o);
            let slot = d.slots.get_mut(&k).expect("an accessed block has a slot");
            if let Some(data) = &slot.data {
                let data = data.clone();
                d.dev(k).bytes_from_cache += hi - lo;
                drop(g);
                buf[(lo - off) as usize..(hi - off) as usize]
                    .copy_from_slice(&data[(lo - start) as usize..(hi - start) as usize]);
                continue;
            }
            // Not here yet: wait for the read fetching it, or fetch it
            // (and mark it, unless a write of it is in flight: this fetch
            // could not install then, so nobody should wait for it).
            let writing = d.writing.contains_key(&k);
            match slot.filling {
                Some(filler) if !writing => wait.push((b, filler)),
                _ => {
                    if !writing {
                        slot.filling = Some(slot.gen);
                    }
                    fetch.push((b, slot.gen, recycled));
                    d.dev(k).bytes_from_next += end - start;
                }
            }
        }
        let fetched = self.fetch(buf, off, &mut fetch);
        if fetched.is_err() {
            // Whatever was not installed: let its waiters go.
            for &(b, ticket, _) in &fetch {
                self.install(b, ticket, None);
            }
        }
        fetched?;
        // Pass 3: the blocks other reads were fetching, once they are in
        // (a boot storm's clients read the same blocks at the same time:
        // one read of NEXT serves them all).
        for (b, filler) in wait {
            let (start, end) = self.span(b);
            let (lo, hi) = (off.max(start), (off + len).min(end));
            let dst = &mut buf[(lo - off) as usize..(hi - off) as usize];
            match self.wait_fill(b, filler, hi - lo) {
                Some(data) => {
                    dst.copy_from_slice(&data[(lo - start) as usize..(hi - start) as usize]);
                }
                None => {
                    self.next.read_at(dst, lo)?;
                    let (k, mut g) = self.lock(b);
                    g.data.dev(k).bytes_from_next += hi - lo;
                }
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.write_through(off, buf.len() as u64, Src::Data(buf), || {
            self.next.write_at(buf, off, flags)
        })
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.write_through(off, len, Src::Zero, || {
            self.next.write_zeroes(off, len, flags)
        })
    }

    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.next.trim(off, len, flags)?;
        if len > 0 {
            for b in self.blocks(off, len) {
                let (k, mut g) = self.lock(b);
                if g.remove(&k) {
                    let d = g.data.dev(k);
                    d.trimmed += 1;
                    d.resident -= 1;
                }
                g.data.slots.remove(&k);
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let r = self.next.flush();
        self.cache.write_report(ReportAt::Flush);
        r
    }

    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
}

/// Open a cache layer from its spec parameters.
pub fn open(
    params: &std::collections::BTreeMap<String, String>,
    next: Arc<dyn BlockDev>,
) -> Result<Arc<CacheDev>> {
    let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "cache", m);
    let size_of = |name: &str, v: &str| {
        roamdisk_blockdev::units::parse_size(v).map_err(|m| bad(format!("{name}: {m}")))
    };
    let policy = params.get("policy").map(String::as_str).unwrap_or("lru");
    let policy = PolicySpec::parse(policy).map_err(|e| bad(e.0))?;
    let size = size_of(
        "size",
        params.get("size").map(String::as_str).unwrap_or_default(),
    )?;
    let block = match params.get("block") {
        Some(v) => size_of("block", v)?,
        None => MIN_BLOCK,
    };
    let shards = match params.get("shards") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(format!("shards must be a positive integer, not '{v}'")))?,
        None => DEFAULT_SHARDS.min((size / block.max(1)).max(1) as usize),
    };
    let report = params.get("report").map(PathBuf::from);
    Ok(Arc::new(CacheDev::new(
        next,
        CacheOptions {
            policy,
            size,
            block,
            shards,
            report,
        },
    )?))
}

/// `cache[block=B,shards=N,report=FILE]:[POLICY:]SIZE:NEXT`.
pub static CACHE: LayerKind = LayerKind {
    name: "cache",
    summary: "a memory cache of SIZE bytes over NEXT, residency by POLICY (lru by default; fmpq, 2q, fbr, mq, arc, s3fifo, with [params]); writes go through",
    args: &["policy", "size"],
    options: &[
        ("block", "the unit of caching, a power of two from 4K to 1M (default 4K)"),
        ("shards", "independently locked parts of the cache, by block address (default 16, at most one per block)"),
        ("report", "write the counters as JSON to this file at each flush and at close"),
    ],
    wraps: true,
    inner_read_only: false,
    // `cache:256M:NEXT` is an LRU cache (the client side's usual choice):
    // the text in POLICY's place is SIZE when it reads as a size, and a
    // policy otherwise (so `cache:lfu:1M:...` says "unknown policy").
    optional_first: Some(OptionalArg {
        default: "lru",
        is_one: |s| roamdisk_blockdev::units::parse_size(s).is_err(),
    }),
    open: |ctx: &OpenCtx<'_>, next| {
        let next = next.ok_or_else(|| {
            Error::new(ErrorKind::InvalidArgument, Op::Open, "cache", "needs an inner stack (cache:lru:256M:raw:disk.img)")
        })?;
        Ok(open(ctx.params, next)? as Arc<dyn BlockDev>)
    },
};

/// The layer kinds of this crate.
pub static LAYERS: &[&LayerKind] = &[&CACHE];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharded::shard_hint;
    use roamdisk_blockdev::layers::mem::MemDev;

    fn dev(policy: &str, size: u64, block: u64, shards: usize) -> (Arc<MemDev>, CacheDev) {
        let mem = Arc::new(MemDev::new(8 << 20 | 1000));
        let c = CacheDev::new(
            mem.clone(),
            CacheOptions {
                policy: PolicySpec::parse(policy).unwrap(),
                size,
                block,
                shards,
                report: None,
            },
        )
        .unwrap();
        (mem, c)
    }

    /// Random reads, writes, zeroes and trims against a model, for every
    /// policy and two block sizes, over a disk whose last block is short.
    #[test]
    fn reads_equal_a_model_under_random_operations() {
        for policy in ["lru", "fmpq", "2q", "arc", "s3fifo", "fbr", "mq"] {
            for block in [4096u64, 16384] {
                let (_mem, c) = dev(policy, 24 * block, block, 4);
                let size = c.size();
                let mut model = vec![0u8; size as usize];
                let mut x = 99u64;
                let mut rnd = |n: u64| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 33) % n
                };
                for step in 0..3000u64 {
                    let off = rnd(size);
                    let len = (1 + rnd(3 * block)).min(size - off);
                    match rnd(10) {
                        0..=5 => {
                            let mut buf = vec![0u8; len as usize];
                            c.read_at(&mut buf, off).unwrap();
                            assert!(
                                buf == model[off as usize..(off + len) as usize],
                                "{policy} {block}: read {off}+{len} at step {step}"
                            );
                        }
                        6 | 7 => {
                            let buf: Vec<u8> = (0..len).map(|i| (i + step) as u8 | 1).collect();
                            c.write_at(&buf, off, WriteFlags::default()).unwrap();
                            model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                        }
                        8 => {
                            c.write_zeroes(off, len, ZeroFlags::default()).unwrap();
                            model[off as usize..(off + len) as usize].fill(0);
                        }
                        _ => {
                            // MemDev trims to zeroes.
                            c.trim(off, len, WriteFlags::default()).unwrap();
                            let mut buf = vec![0u8; len as usize];
                            c.next.read_at(&mut buf, off).unwrap();
                            model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                        }
                    }
                }
                let s = c.stats();
                assert!(
                    s.totals.hits > 0 && s.totals.bytes_from_cache > 0,
                    "{policy}: {s:?}"
                );
                assert!(s.totals.resident <= s.capacity as u64);
            }
        }
    }

    /// Writers and readers of the same few blocks in threads: at the end
    /// the cache's every byte equals NEXT's, and readers never see a block
    /// mixing two writes (each write fills whole blocks with one value).
    #[test]
    fn racing_writes_and_reads_leave_no_stale_or_torn_block() {
        for (policy, block) in [("lru", 4096u64), ("s3fifo", 1 << 20), ("fmpq", 64 << 10)] {
            let pages = block / 4096;
            let (mem, c) = dev(policy, 4 * block, block, 2);
            let c = Arc::new(c);
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let c = c.clone();
                    s.spawn(move || {
                        let mut x = t + 1;
                        let mut buf = vec![0u8; block as usize];
                        for i in 0..600u64 {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let b = (x >> 33) % 6;
                            if t % 2 == 0 {
                                // Whole pages of one value.
                                let p0 = (x >> 20) % pages;
                                let np = 1 + (x >> 40) % (pages - p0);
                                let v = (t * 60 + i % 60) as u8 + 1;
                                let data = vec![v; (np * 4096) as usize];
                                c.write_at(&data, b * block + p0 * 4096, WriteFlags::default())
                                    .unwrap();
                            } else {
                                c.read_at(&mut buf, b * block).unwrap();
                                for (p, page) in buf.chunks(4096).enumerate() {
                                    assert!(
                                        page.iter().all(|&x| x == page[0]),
                                        "{policy} {block}: torn page {p} of block {b}"
                                    );
                                }
                            }
                        }
                    });
                }
            });
            for b in 0..6u64 {
                let (mut a, mut m) = (vec![0u8; block as usize], vec![0u8; block as usize]);
                c.read_at(&mut a, b * block).unwrap();
                mem.read_at(&mut m, b * block).unwrap();
                assert!(
                    a == m,
                    "{policy} {block}: block {b}: the cache disagrees with NEXT"
                );
            }
        }
    }

    /// Two devices in front of one cache: the accesses of both are counted
    /// by the engine as `roamdisk sim` counts a two-device trace (keys and
    /// shards by `shard_hint(device, block)`), each device's counters sum
    /// to the cache's, and each device reads its own bytes.
    #[test]
    fn devices_share_one_cache_as_the_simulator_models_it() {
        let spec = PolicySpec::parse("fmpq").unwrap();
        let cache = BlockCache::new(CacheOptions {
            policy: spec.clone(),
            size: 40 * 4096,
            block: 4096,
            shards: 4,
            report: None,
        })
        .unwrap();
        let mems: Vec<Arc<MemDev>> = (0..2).map(|_| Arc::new(MemDev::new(1 << 20))).collect();
        for (i, m) in mems.iter().enumerate() {
            m.write_at(&vec![i as u8 + 1; 1 << 20], 0, WriteFlags::default())
                .unwrap();
        }
        let devs: Vec<CacheDev> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| cache.attach(i as u32, m.clone()).unwrap())
            .collect();
        let mut eng = ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 40, 4).unwrap();
        let mut x = 11u64;
        let mut buf = [0u8; 4096];
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (d, b) = ((x >> 60) as u32 & 1, (x >> 33) % 60);
            devs[d as usize].read_at(&mut buf, b * 4096).unwrap();
            assert!(buf.iter().all(|&v| v == d as u8 + 1));
            eng.access_mut(shard_hint(d, b), shard_hint(d, b));
        }
        let (s, e) = (cache.stats().totals, eng.counts());
        assert_eq!(
            (s.hits, s.misses, s.evictions),
            (e.hits, e.misses, e.evictions)
        );
        let (a, b) = (cache.device_stats(0), cache.device_stats(1));
        assert!(a.hits > 0 && b.hits > 0, "{a:?} {b:?}");
        assert_eq!(a.hits + b.hits, s.hits);
        assert_eq!(a.misses + b.misses, s.misses);
        assert_eq!(a.evictions + b.evictions, s.evictions);
        assert_eq!(a.resident + b.resident, s.resident);
        assert_eq!(s.resident, 40);
    }

    /// The layer's hits are the simulator's for the same accesses.
    #[test]
    fn hits_equal_the_engine_run_alone() {
        for policy in ["lru", "fmpq", "2q"] {
            let (_mem, c) = dev(policy, 40 * 4096, 4096, 4);
            let spec = PolicySpec::parse(policy).unwrap();
            let mut eng = ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 40, 4).unwrap();
            let mut x = 5u64;
            let mut buf = [0u8; 4096];
            for _ in 0..5000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let b = (x >> 33) % 100;
                c.read_at(&mut buf, b * 4096).unwrap();
                eng.access_mut(shard_hint(0, b), b);
            }
            let (s, e) = (c.stats().totals, eng.counts());
            assert_eq!(
                (s.hits, s.misses, s.evictions),
                (e.hits, e.misses, e.evictions)
            );
        }
    }

    /// NEXT, slow, counting the reads it serves.
    struct SlowCounting {
        mem: MemDev,
        reads: std::sync::atomic::AtomicU64,
    }

    impl BlockDev for SlowCounting {
        fn layer(&self) -> &'static str {
            "slow"
        }
        fn next(&self) -> Option<&dyn BlockDev> {
            Some(&self.mem)
        }
        fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            self.mem.read_at(buf, off)
        }
    }

    /// Sixteen readers of the same blocks at the same moment (a boot
    /// storm): NEXT reads each block once, every reader gets its bytes,
    /// and the hit counts are the engine's (one miss per block).
    #[test]
    fn readers_of_a_block_being_fetched_wait_for_that_fetch() {
        let slow = Arc::new(SlowCounting {
            mem: MemDev::new(1 << 20),
            reads: Default::default(),
        });
        let mut want = vec![0u8; 1 << 20];
        for (i, b) in want.iter_mut().enumerate() {
            *b = (i / 4096 * 7 + i % 251) as u8;
        }
        slow.mem.write_at(&want, 0, WriteFlags::default()).unwrap();
        let c = Arc::new(
            CacheDev::new(
                slow.clone(),
                CacheOptions {
                    policy: PolicySpec::parse("fmpq").unwrap(),
                    size: 1 << 20,
                    block: 4096,
                    shards: 4,
                    report: None,
                },
            )
            .unwrap(),
        );
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let (c, barrier, want) = (c.clone(), barrier.clone(), want.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    // Blocks 3..11, half of the readers unaligned.
                    let off = 3 * 4096 + if t % 2 == 0 { 0 } else { 100 };
                    let mut buf = vec![0u8; 8 * 4096 - 200];
                    c.read_at(&mut buf, off).unwrap();
                    assert!(buf[..] == want[off as usize..off as usize + buf.len()]);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let reads = slow.reads.load(std::sync::atomic::Ordering::Relaxed);
        assert!(reads <= 8, "NEXT served {reads} reads for 8 blocks");
        let s = c.stats().totals;
        assert_eq!(s.misses, 8);
        assert_eq!(s.hits, 15 * 8);
        assert_eq!(s.bytes_from_next, 8 * 4096);
    }

    #[test]
    fn the_policy_may_be_left_out_and_is_lru_then() {
        let mut reg = roamdisk_blockdev::Registry::with_builtin();
        reg.add(&CACHE);
        let short = reg.parse("cache:64K:mem:1M").unwrap();
        assert_eq!(short, reg.parse("cache:lru:64K:mem:1M").unwrap());
        let named = reg.parse("cache[block=8K]:fmpq:64K:mem:1M").unwrap();
        assert_eq!(named.params["policy"], "fmpq");
        assert_eq!(named.params["size"], "64K");
        // A policy that is not one is still read as POLICY (and refused
        // when the layer opens: "unknown policy").
        let bad = reg.parse("cache:nosuch:64K:mem:1M").unwrap();
        assert_eq!(bad.params["policy"], "nosuch");
        // TOML: without a policy key.
        let t: toml::Table = toml::from_str(
            "kind = \"cache\"\nsize = \"64K\"\n[next]\nkind = \"mem\"\nsize = \"1M\"\n",
        )
        .unwrap();
        assert_eq!(reg.from_toml(&t).unwrap(), short);
    }
}
