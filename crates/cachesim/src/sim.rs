//! The trace-driven cache simulator (TransCom seed sections 5.1-5.2 and
//! 6.1).
//!
//! Requests are cut into fixed-size block accesses. Each access is mapped
//! to a cache key by the [`Sharing`] model — TransCom's: a block is
//! ⟨block_id, client_id⟩; clients share the base image's blocks until a
//! client first writes one, which creates its private copy (a new block,
//! so a miss), used by that client from then on. The key stream then goes
//! through one or more *levels* in a single pass:
//!
//! - optionally a client cache per client (two-level runs): the server
//!   sees only what the client cache misses, plus writes when the client
//!   cache is write-through;
//! - the server stream: every configured policy × size instance, each
//!   access classified by its *temporal distance* (accesses since the
//!   previous access to the same key at this level, cold = ∞) as short
//!   (< `split`, 32k by default) or long, the split of the seed's Table 2;
//! - the exact LRU curve for every size from stack distances
//!   ([`crate::stack`]), split the same way.

use std::collections::HashMap;

use crate::index::{DenseIndex, FastBuild, FastMap, HashIndex, NIL};
use crate::policy::{Policy, PolicyKind, PolicySpec};
use crate::sharded::{shard_hint, ShardedCache};
use crate::stack::{DistanceHistogram, StackDistance};

/// How clients' views of a block map to cache keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Sharing {
    /// TransCom: shared base blocks, a private copy per client from its
    /// first write on.
    Cow,
    /// One disk shared by all: the client is ignored.
    Shared,
    /// Every client has its own disk: ⟨block, client⟩ always.
    Private,
}

impl Sharing {
    pub fn parse(s: &str) -> Option<Sharing> {
        match s {
            "cow" => Some(Sharing::Cow),
            "shared" => Some(Sharing::Shared),
            "private" => Some(Sharing::Private),
            _ => None,
        }
    }
}

/// A request, already reduced to what the cache cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub client: u32,
    pub device: u32,
    pub offset: u64,
    pub len: u32,
    pub write: bool,
}

impl Request {
    /// The cache-relevant part of a trace record; `None` for requests that
    /// touch no data (flush) or only discard it (trim).
    pub fn from_record(r: &roamdisk_trace::format::Record) -> Option<Request> {
        use roamdisk_trace::format::TraceOp;
        let write = match r.op {
            TraceOp::Read => false,
            TraceOp::Write | TraceOp::WriteZeroes => true,
            TraceOp::Trim | TraceOp::Flush => return None,
        };
        (r.len > 0).then_some(Request {
            client: r.client,
            device: r.device,
            offset: r.offset,
            len: r.len,
            write,
        })
    }

    /// The block numbers it covers at block size `bs`.
    #[inline]
    pub fn blocks(&self, bs: u64) -> std::ops::RangeInclusive<u64> {
        let first = self.offset / bs;
        let last = (self.offset + self.len.max(1) as u64 - 1) / bs;
        first..=last
    }
}

/// The requests of a trace file (binary or CSV roamdisk trace), reduced
/// by [`Request::from_record`]; `Ok(None)` for records the cache ignores.
pub fn trace_requests(
    path: &std::path::Path,
) -> Result<impl Iterator<Item = Result<Option<Request>, TraceError>>, TraceError> {
    let reader = roamdisk_trace::format::Reader::open(path)?;
    Ok(reader.map(|r| r.map(|rec| Request::from_record(&rec))))
}

pub use roamdisk_trace::format::TraceError;

/// One block access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub client: u32,
    pub device: u32,
    pub block: u64,
    pub write: bool,
}

/// Maps accesses to dense `u32` keys under a [`Sharing`] model.
pub struct Interner {
    sharing: Sharing,
    /// ⟨device, block⟩ → (shared key or NIL, number of private copies).
    blocks: FastMap<(u32, u64), (u32, u32)>,
    /// ⟨device, block, client⟩ → private key.
    private: FastMap<(u32, u64, u32), u32>,
    next: u32,
    private_copies: u64,
}

impl Interner {
    pub fn new(sharing: Sharing) -> Interner {
        Interner {
            sharing,
            blocks: HashMap::with_hasher(FastBuild::default()),
            private: HashMap::with_hasher(FastBuild::default()),
            next: 0,
            private_copies: 0,
        }
    }

    fn fresh(&mut self) -> u32 {
        let k = self.next;
        assert!(k < NIL, "more than 2^32 - 1 distinct blocks");
        self.next += 1;
        k
    }

    /// The key of an access.
    #[inline]
    pub fn key(&mut self, a: &Access) -> u32 {
        match self.sharing {
            Sharing::Shared => {
                let next = self.next;
                let e = self.blocks.entry((a.device, a.block)).or_insert((next, 0));
                if e.0 == next {
                    self.next += 1;
                }
                e.0
            }
            Sharing::Private => {
                let next = self.next;
                let k = *self
                    .private
                    .entry((a.device, a.block, a.client))
                    .or_insert(next);
                if k == next {
                    self.next += 1;
                }
                k
            }
            Sharing::Cow => {
                let (shared, copies) = self
                    .blocks
                    .get(&(a.device, a.block))
                    .copied()
                    .unwrap_or((NIL, 0));
                if copies > 0 {
                    if let Some(&k) = self.private.get(&(a.device, a.block, a.client)) {
                        return k;
                    }
                }
                if a.write {
                    // The client's first write: its private copy.
                    let k = self.fresh();
                    self.private.insert((a.device, a.block, a.client), k);
                    self.blocks
                        .insert((a.device, a.block), (shared, copies + 1));
                    self.private_copies += 1;
                    k
                } else if shared != NIL {
                    shared
                } else {
                    let k = self.fresh();
                    self.blocks.insert((a.device, a.block), (k, copies));
                    k
                }
            }
        }
    }

    /// Distinct keys so far.
    pub fn keys(&self) -> u64 {
        self.next as u64
    }

    /// Private copies created so far.
    pub fn private_copies(&self) -> u64 {
        self.private_copies
    }
}

/// A client-side cache, one instance per client.
#[derive(Clone, Debug)]
pub struct ClientCache {
    pub policy: PolicySpec,
    /// Blocks per client.
    pub capacity: usize,
    /// Writes go on to the server even when they hit in the client cache
    /// (the server holds the authoritative private copy).
    pub write_through: bool,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub block_size: u64,
    pub sharing: Sharing,
    /// Temporal-distance threshold of the short/long split.
    pub split: u64,
    /// Server policy instances: (policy, capacity in blocks).
    pub server: Vec<(PolicySpec, usize)>,
    /// Shards of each server instance ([`ShardedCache`]): 1 is the plain
    /// policy; the `cache` layer's shard count reproduces its hits exactly.
    /// At most the smallest capacity.
    pub shards: usize,
    /// Compute the exact LRU curve from stack distances.
    pub lru_stack: bool,
    /// One level per entry: `None` is a single-level run (the server sees
    /// every access), `Some` puts a client cache in front.
    pub levels: Vec<Option<ClientCache>>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            block_size: 4096,
            sharing: Sharing::Cow,
            split: 32 * 1024,
            server: Vec::new(),
            shards: 1,
            lru_stack: true,
            levels: vec![None],
        }
    }
}

/// Hits and misses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HitMiss {
    pub hits: u64,
    pub misses: u64,
}

impl HitMiss {
    #[inline]
    fn add(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }
    pub fn total(&self) -> u64 {
        self.hits + self.misses
    }
    pub fn hit_ratio(&self) -> f64 {
        self.hits as f64 / self.total().max(1) as f64
    }
    pub fn plus(&self, o: &HitMiss) -> HitMiss {
        HitMiss {
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
        }
    }
}

/// One policy instance's result, split by temporal distance.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PolicyResult {
    pub policy: String,
    pub kind: PolicyKind,
    /// Blocks.
    pub capacity: usize,
    /// Shards the capacity was cut into.
    pub shards: usize,
    /// Accesses with temporal distance < split.
    pub short: HitMiss,
    /// Accesses with temporal distance ≥ split, and first accesses.
    pub long: HitMiss,
}

impl PolicyResult {
    pub fn all(&self) -> HitMiss {
        self.short.plus(&self.long)
    }
}

/// The client caches of a two-level run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClientReport {
    pub policy: String,
    /// Blocks per client.
    pub capacity: usize,
    pub write_through: bool,
    pub clients: usize,
    pub reads: HitMiss,
    pub writes: HitMiss,
}

/// The server-level LRU curve from stack distances.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LruCurve {
    pub short: DistanceHistogram,
    pub long: DistanceHistogram,
}

impl LruCurve {
    /// LRU hits and misses at `size` blocks, split (short, long).
    pub fn at(&self, size: usize) -> (HitMiss, HitMiss) {
        let f = |h: &DistanceHistogram| {
            let hits = h.hits_at(size);
            HitMiss {
                hits,
                misses: h.total() - hits,
            }
        };
        (f(&self.short), f(&self.long))
    }

    /// Hit ratio over all accesses at `size` blocks.
    pub fn hit_ratio(&self, size: usize) -> f64 {
        let (s, l) = self.at(size);
        s.plus(&l).hit_ratio()
    }

    /// The smallest size beyond which LRU only has cold misses.
    pub fn max_distance(&self) -> usize {
        self.short.max_distance().max(self.long.max_distance())
    }
}

/// One level's results.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LevelReport {
    pub client: Option<ClientReport>,
    /// Accesses reaching the server.
    pub server_accesses: u64,
    /// Of which with temporal distance < split.
    pub short: u64,
    /// First accesses at this level (counted in the long column).
    pub cold: u64,
    /// Distinct keys the server saw.
    pub distinct: u64,
    pub lru: Option<LruCurve>,
    pub results: Vec<PolicyResult>,
}

/// Everything a run found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimReport {
    pub block_size: u64,
    pub sharing: Sharing,
    pub split: u64,
    pub requests: u64,
    pub accesses: u64,
    pub reads: u64,
    pub writes: u64,
    pub distinct_keys: u64,
    pub private_copies: u64,
    pub clients: usize,
    pub levels: Vec<LevelReport>,
}

struct Instance {
    engine: ShardedCache<u32>,
    short: HitMiss,
    long: HitMiss,
}

/// A client cache configuration and its per-client instances.
type ClientCaches = (ClientCache, Vec<Option<Box<dyn Policy<u32>>>>);

struct Level {
    client: Option<ClientCaches>,
    client_reads: HitMiss,
    client_writes: HitMiss,
    time: u64,
    /// Time of each key's previous server access + 1 (0 = never).
    last: Vec<u64>,
    short: u64,
    cold: u64,
    stack: Option<(StackDistance, DistanceHistogram, DistanceHistogram)>,
    instances: Vec<Instance>,
}

/// The simulator: feed it requests (or block accesses), then
/// [`finish`](Simulator::finish).
pub struct Simulator {
    cfg: SimConfig,
    interner: Interner,
    levels: Vec<Level>,
    requests: u64,
    accesses: u64,
    reads: u64,
    writes: u64,
    clients: FastMap<u32, ()>,
    sink: Option<Box<dyn FnMut(u32)>>,
}

impl Simulator {
    pub fn new(cfg: SimConfig) -> Simulator {
        assert!(cfg.block_size > 0, "block size must be positive");
        let levels = cfg
            .levels
            .iter()
            .map(|client| Level {
                client: client.clone().map(|c| (c, Vec::new())),
                client_reads: HitMiss::default(),
                client_writes: HitMiss::default(),
                time: 0,
                last: Vec::new(),
                short: 0,
                cold: 0,
                stack: cfg.lru_stack.then(|| {
                    (
                        StackDistance::new(),
                        DistanceHistogram::default(),
                        DistanceHistogram::default(),
                    )
                }),
                instances: cfg
                    .server
                    .iter()
                    .map(|(spec, cap)| Instance {
                        engine: if cfg.shards <= 1 {
                            ShardedCache::new::<DenseIndex>(spec, *cap, 1)
                        } else {
                            // Each shard sees a sparse subset of the dense
                            // keys: a hash index keeps its memory bounded.
                            ShardedCache::new::<HashIndex<u32>>(spec, *cap, cfg.shards)
                        }
                        .expect("the shard count is checked against every capacity"),
                        short: HitMiss::default(),
                        long: HitMiss::default(),
                    })
                    .collect(),
            })
            .collect();
        Simulator {
            interner: Interner::new(cfg.sharing),
            cfg,
            levels,
            requests: 0,
            accesses: 0,
            reads: 0,
            writes: 0,
            clients: HashMap::with_hasher(FastBuild::default()),
            sink: None,
        }
    }

    /// Call `f` with every key the first level's server sees, in order
    /// (to export the stream for another simulator).
    pub fn set_server_key_sink(&mut self, f: Box<dyn FnMut(u32)>) {
        self.sink = Some(f);
    }

    /// Feed one request.
    pub fn feed(&mut self, r: &Request) {
        self.requests += 1;
        self.clients.entry(r.client).or_insert(());
        for block in r.blocks(self.cfg.block_size) {
            self.access(&Access {
                client: r.client,
                device: r.device,
                block,
                write: r.write,
            });
        }
    }

    /// Feed one block access.
    pub fn access(&mut self, a: &Access) {
        self.accesses += 1;
        if a.write {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
        let key = self.interner.key(a);
        for (li, level) in self.levels.iter_mut().enumerate() {
            if let Some((cc, caches)) = &mut level.client {
                let c = a.client as usize;
                if c >= caches.len() {
                    caches.resize_with(c + 1, || None);
                }
                let cache = caches[c]
                    .get_or_insert_with(|| cc.policy.build::<u32, HashIndex<u32>>(cc.capacity));
                let hit = cache.access(key).is_hit();
                if a.write {
                    level.client_writes.add(hit);
                } else {
                    level.client_reads.add(hit);
                }
                if hit && !(a.write && cc.write_through) {
                    continue;
                }
            }
            if li == 0 {
                if let Some(sink) = &mut self.sink {
                    sink(key);
                }
            }
            server_access(level, key, shard_hint(a.device, a.block), self.cfg.split);
        }
    }

    /// Keys interned so far (distinct blocks under the sharing model).
    pub fn distinct_keys(&self) -> u64 {
        self.interner.keys()
    }

    pub fn finish(self) -> SimReport {
        let clients = self.clients.len();
        let levels = self
            .levels
            .into_iter()
            .map(|l| {
                let distinct = l.last.iter().filter(|&&t| t != 0).count() as u64;
                LevelReport {
                    client: l.client.map(|(cc, caches)| ClientReport {
                        policy: cc.policy.label(),
                        capacity: cc.capacity,
                        write_through: cc.write_through,
                        clients: caches.iter().filter(|c| c.is_some()).count(),
                        reads: l.client_reads,
                        writes: l.client_writes,
                    }),
                    server_accesses: l.time,
                    short: l.short,
                    cold: l.cold,
                    distinct,
                    lru: l.stack.map(|(_, short, long)| LruCurve { short, long }),
                    results: l
                        .instances
                        .into_iter()
                        .zip(&self.cfg.server)
                        .map(|(i, (spec, cap))| PolicyResult {
                            policy: spec.label(),
                            kind: spec.kind,
                            capacity: *cap,
                            shards: i.engine.shards(),
                            short: i.short,
                            long: i.long,
                        })
                        .collect(),
                }
            })
            .collect();
        SimReport {
            block_size: self.cfg.block_size,
            sharing: self.cfg.sharing,
            split: self.cfg.split,
            requests: self.requests,
            accesses: self.accesses,
            reads: self.reads,
            writes: self.writes,
            distinct_keys: self.interner.keys(),
            private_copies: self.interner.private_copies(),
            clients,
            levels,
        }
    }
}

#[inline]
fn server_access(level: &mut Level, key: u32, hint: u64, split: u64) {
    let k = key as usize;
    if k >= level.last.len() {
        let n = (k + 1).max(level.last.len() * 2).max(1024);
        level.last.resize(n, 0);
    }
    level.time += 1;
    let prev = level.last[k];
    level.last[k] = level.time;
    let short = prev != 0 && level.time - prev < split;
    if short {
        level.short += 1;
    } else if prev == 0 {
        level.cold += 1;
    }
    if let Some((sd, hs, hl)) = &mut level.stack {
        let d = sd.access(key);
        if short {
            hs.record(d);
        } else {
            hl.record(d);
        }
    }
    for inst in &mut level.instances {
        let hit = inst.engine.access_mut(hint, key).is_hit();
        if short {
            inst.short.add(hit);
        } else {
            inst.long.add(hit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(client: u32, block: u64, write: bool) -> Access {
        Access {
            client,
            device: 0,
            block,
            write,
        }
    }

    /// The seed's sharing model: clients share a block until one writes
    /// it; that client's first write creates its private copy (a new
    /// block), which it alone uses afterwards.
    #[test]
    fn cow_sharing_model() {
        let mut i = Interner::new(Sharing::Cow);
        let shared = i.key(&acc(1, 10, false));
        assert_eq!(i.key(&acc(2, 10, false)), shared, "clients share a block");
        let p1 = i.key(&acc(1, 10, true));
        assert_ne!(p1, shared, "the first write creates a private copy");
        assert_eq!(i.key(&acc(1, 10, false)), p1, "its owner reads it");
        assert_eq!(i.key(&acc(1, 10, true)), p1, "and writes it again");
        assert_eq!(i.key(&acc(2, 10, false)), shared, "others still share");
        let p2 = i.key(&acc(2, 10, true));
        assert!(p2 != p1 && p2 != shared);
        // A write to a block nobody read creates only the private copy.
        let p3 = i.key(&acc(3, 11, true));
        assert_eq!(i.key(&acc(3, 11, false)), p3);
        let s11 = i.key(&acc(4, 11, false));
        assert!(s11 != p3);
        assert_eq!((i.keys(), i.private_copies()), (5, 3));
        // Devices are separate address spaces.
        let other = i.key(&Access {
            device: 1,
            ..acc(1, 10, false)
        });
        assert!(![shared, p1, p2, p3, s11].contains(&other));
    }

    #[test]
    fn requests_cover_their_blocks() {
        let r = Request {
            client: 0,
            device: 0,
            offset: 4095,
            len: 4098,
            write: false,
        };
        assert_eq!(r.blocks(4096), 0..=2);
        let r = Request {
            offset: 8192,
            len: 4096,
            ..r
        };
        assert_eq!(r.blocks(4096), 2..=2);
        assert_eq!(r.blocks(512), 16..=23);
    }

    #[test]
    fn temporal_split_and_two_levels() {
        let lru = PolicySpec::parse("lru").unwrap();
        let mut cfg = SimConfig {
            split: 3,
            server: vec![(lru.clone(), 2)],
            levels: vec![
                None,
                Some(ClientCache {
                    policy: lru,
                    capacity: 1,
                    write_through: false,
                }),
            ],
            ..SimConfig::default()
        };
        cfg.block_size = 1;
        let mut s = Simulator::new(cfg);
        // Keys: a b a c c a (one client).
        for b in [0u64, 1, 0, 2, 2, 0] {
            s.access(&acc(0, b, false));
        }
        let r = s.finish();
        let single = &r.levels[0];
        // Distances: a:∞ b:∞ a:2 c:∞ c:1 a:3 → short = 2 (a, c).
        assert_eq!(
            (single.server_accesses, single.short, single.cold),
            (6, 2, 3)
        );
        let lru2 = &single.results[0];
        // LRU(2): a b [a hit] c(evicts b) [c hit] a (hit: a was used at t3).
        assert_eq!(lru2.short, HitMiss { hits: 2, misses: 0 });
        assert_eq!(lru2.long, HitMiss { hits: 1, misses: 3 });
        let curve = single.lru.as_ref().unwrap();
        assert_eq!(curve.at(2), (lru2.short, lru2.long));
        // Two levels: a 1-block client LRU absorbs only the c c repeat.
        let two = &r.levels[1];
        assert_eq!(
            two.client.as_ref().unwrap().reads,
            HitMiss { hits: 1, misses: 5 }
        );
        assert_eq!(two.server_accesses, 5);
        // Server stream a b a c a: distances ∞ ∞ 2 ∞ 2 → both short.
        assert_eq!((two.short, two.cold), (2, 3));
    }
}
