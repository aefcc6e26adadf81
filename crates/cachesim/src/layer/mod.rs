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

use crate::index::HashIndex;
use crate::policy::PolicySpec;
use crate::sharded::{EngineCounts, ShardedCache};

mod slots;

pub use slots::{DeviceStats, Slots, MAX_DEVICES};
use slots::{ReadStep, BLOCK_BITS};

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
    /// block of that shard (see `Slot::filling` in `slots.rs`).
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
                s += *d;
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
        if g.data.install(k, ticket, data) {
            self.cache.filled[self.shard(k)].notify_all();
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
            gens.push(d.begin_write(k));
        }
        let r = io();
        for (b, my_gen) in self.blocks(off, len).zip(gens) {
            let (start, end) = self.span(b);
            let (k, mut g) = self.lock(b);
            let Some((slot, old)) = g.data.end_write(k, my_gen, r.is_ok()) else {
                continue;
            };
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
    roamdisk_blockdev::layer!("cache", next);
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
            match d.read_step(k) {
                ReadStep::Cached(data) => {
                    d.dev(k).bytes_from_cache += hi - lo;
                    drop(g);
                    buf[(lo - off) as usize..(hi - off) as usize]
                        .copy_from_slice(&data[(lo - start) as usize..(hi - start) as usize]);
                }
                ReadStep::Wait(filler) => wait.push((b, filler)),
                ReadStep::Fetch(ticket) => {
                    fetch.push((b, ticket, recycled));
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
    // `cache:256M:NEXT` is an LRU cache (the client side's usual choice):
    // the text in POLICY's place is SIZE when it reads as a size, and a
    // policy otherwise (so `cache:lfu:1M:...` says "unknown policy").
    optional_first: Some(OptionalArg {
        default: "lru",
        is_one: |s| roamdisk_blockdev::units::parse_size(s).is_err(),
    }),
    open: |ctx: &OpenCtx<'_>, next| {
        let next = ctx.inner("cache", next)?;
        Ok(open(ctx.params, next)? as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};

/// The layer kinds of this crate.
pub static LAYERS: &[&LayerKind] = &[&CACHE];

#[cfg(test)]
mod tests;
