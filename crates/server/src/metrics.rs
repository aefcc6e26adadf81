//! What a running server counts, and the two documents it serves from
//! them (`docs/server.md`, "Metrics"): `/metrics` in Prometheus' text
//! format and `/status.json` (the [`Status`] of [`crate::status`], which
//! `roamdisk server status` reads).
//!
//! Every (client, image) grant of the config has its [`Pair`] of counters,
//! made when the server starts (or a reload adds the grant), so that counting a request looks nothing
//! up: the client's export device is a [`Metered`](crate::metered::Metered)
//! layer holding its pair and bumping atomics (no lock on the request
//! path). The cache's counters live in the cache ([`BlockCache`]) and are
//! read when a document is asked for; so are the overlays' sizes.

use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use roamdisk_blockdev::layers::cow::CowDev;
use roamdisk_cachesim::layer::BlockCache;

use crate::access::{grants, Grant};
use crate::config::ServerConfig;
use crate::state::overlay_path;
use crate::status::{
    CacheStatus, ClientStatus, ImageCacheStatus, ImageStatus, OpStatus, Status, STATUS_FORMAT,
    STATUS_VERSION,
};

/// The operations counted, in the order of [`Pair::ops`].
pub const OPS: [&str; 6] = [
    "read",
    "write",
    "write_zeroes",
    "trim",
    "flush",
    "block_status",
];

/// An operation's index in [`OPS`].
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum OpKind {
    Read,
    Write,
    WriteZeroes,
    Trim,
    Flush,
    BlockStatus,
}

/// Upper bounds of the latency buckets, in microseconds (then +Inf).
pub const BUCKETS_US: [u64; 16] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000,
];

/// Refusal kinds of the resolver ([`crate::views`]).
pub const UNKNOWN_CLIENT: &str = "unknown_client";
pub const NOT_GRANTED: &str = "not_granted";
pub const VIEW_FAILED: &str = "view_failed";
/// The refusal kind of a write to a read-only grant ([`crate::metered`]).
pub const READ_ONLY_WRITE: &str = "read_only_write";

/// Refusal kinds shown even while zero.
pub const REFUSALS: [&str; 6] = [
    UNKNOWN_CLIENT,
    NOT_GRANTED,
    VIEW_FAILED,
    roamdisk_nbd::access::refusal_kind::TLS_REQUIRED,
    roamdisk_nbd::access::refusal_kind::TLS_FAILED,
    READ_ONLY_WRITE,
];

/// Counters of one operation of one pair.
#[derive(Default)]
pub struct OpStats {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    /// Requests per latency bucket (not cumulative); the last is +Inf.
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
}

impl OpStats {
    /// One request of `bytes` that took `nanos`.
    #[inline]
    pub fn record(&self, bytes: u64, nanos: u64, ok: bool) {
        self.requests.fetch_add(1, Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Relaxed);
        } else {
            self.errors.fetch_add(1, Relaxed);
        }
        self.nanos.fetch_add(nanos, Relaxed);
        let us = nanos / 1000;
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> OpSnapshot {
        OpSnapshot {
            requests: self.requests.load(Relaxed),
            errors: self.errors.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            nanos: self.nanos.load(Relaxed),
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// One operation's counters at one moment.
struct OpSnapshot {
    requests: u64,
    errors: u64,
    bytes: u64,
    nanos: u64,
    buckets: Vec<u64>,
}

impl OpSnapshot {
    /// The latency below which a fraction `q` of the requests fell, in
    /// microseconds, interpolated within its bucket (`None`: no request).
    fn quantile_us(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && (seen + n) as f64 >= rank {
                let lo = if i == 0 { 0 } else { BUCKETS_US[i - 1] } as f64;
                let Some(&hi) = BUCKETS_US.get(i) else {
                    // Over the last bound: all we know is that.
                    return Some(lo);
                };
                let into = ((rank - seen as f64) / n as f64).clamp(0.0, 1.0);
                return Some(lo + (hi as f64 - lo) * into);
            }
            seen += n;
        }
        None
    }
}

/// The counters of one client's use of one image.
pub struct Pair {
    pub client: String,
    pub image: String,
    pub grant: Grant,
    /// Indexed by [`OpKind`].
    pub ops: [OpStats; OPS.len()],
    /// Connections in transmission now.
    pub open: AtomicU64,
    /// Connections that reached transmission so far.
    pub connections: AtomicU64,
    /// The view's overlay file (views only).
    overlay: Option<PathBuf>,
    /// The view's cow layer, once opened: it knows the mapped clusters.
    /// Weak: the metrics (held by the endpoint's thread, which is not
    /// waited for at exit) must not keep a view, and the golden stack
    /// under it, alive past the server's stop: their layers finish their
    /// work when dropped.
    cow: OnceLock<Weak<CowDev>>,
}

impl Pair {
    #[inline]
    pub fn op(&self, k: OpKind) -> &OpStats {
        &self.ops[k as usize]
    }

    /// Set the view's cow layer (once, when the view opens).
    pub fn set_cow(&self, cow: Arc<CowDev>) {
        let _ = self.cow.set(Arc::downgrade(&cow));
    }

    /// (allocated bytes of the overlay file, bytes the cow map has as data).
    fn overlay_sizes(&self) -> (Option<u64>, Option<u64>) {
        let allocated = self
            .overlay
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.blocks() * 512);
        let mapped = self
            .cow
            .get()
            .and_then(Weak::upgrade)
            .map(|c| c.usage().1 * c.cluster_size());
        (allocated, mapped)
    }
}

/// A connection in transmission; counted open while it lives.
pub struct Connection(Arc<Pair>);

impl Connection {
    pub fn new(p: Arc<Pair>) -> Connection {
        p.open.fetch_add(1, Relaxed);
        p.connections.fetch_add(1, Relaxed);
        Connection(p)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// One image as the metrics see it.
struct ImageInfo {
    name: String,
    size: u64,
    /// Its device number in the cache, if cached.
    device: Option<u32>,
}

/// Everything counted.
pub struct Metrics {
    started: Instant,
    /// One per grant; a reload adds the new grants' (a revoked grant's
    /// pair stays, its counters frozen, until the server restarts).
    pairs: RwLock<Vec<Arc<Pair>>>,
    state: PathBuf,
    images: Vec<ImageInfo>,
    cache: Option<Arc<BlockCache>>,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
}

impl Metrics {
    /// A pair for every grant of `cfg`.
    pub fn new(cfg: &ServerConfig, state: &std::path::Path) -> Metrics {
        let m = Metrics {
            started: Instant::now(),
            pairs: RwLock::new(Vec::new()),
            state: state.to_path_buf(),
            images: Vec::new(),
            cache: None,
            refusals: Mutex::new(REFUSALS.iter().map(|&k| (k, 0)).collect()),
        };
        m.add_grants(cfg);
        m
    }

    /// A pair for every grant of `cfg` that has none yet (at start, and
    /// when a reload adds clients or grants). Returns how many were added.
    pub fn add_grants(&self, cfg: &ServerConfig) -> usize {
        let mut pairs = self.pairs.write();
        let before = pairs.len();
        for c in &cfg.client {
            for (image, grant) in grants(c) {
                let known = pairs
                    .iter()
                    .any(|p| p.client == c.name && p.image == image && p.grant == grant);
                if known {
                    continue;
                }
                let overlay =
                    (grant == Grant::View).then(|| overlay_path(&self.state, &c.name, image));
                pairs.push(Arc::new(Pair {
                    client: c.name.clone(),
                    image: image.to_string(),
                    grant,
                    ops: Default::default(),
                    open: AtomicU64::new(0),
                    connections: AtomicU64::new(0),
                    overlay,
                    cow: OnceLock::new(),
                }));
            }
        }
        pairs.len() - before
    }

    /// Record the golden images: (name, size, device number in `cache`).
    pub fn set_images(
        &mut self,
        images: Vec<(String, u64, Option<u32>)>,
        cache: Option<Arc<BlockCache>>,
    ) {
        self.images = images
            .into_iter()
            .map(|(name, size, device)| ImageInfo { name, size, device })
            .collect();
        self.cache = cache;
    }

    /// The counters of `client`'s use of `image`.
    pub fn pair(&self, client: &str, image: &str) -> Option<Arc<Pair>> {
        // The newest: a grant changed by a reload (read-only to view)
        // counts into its new pair.
        self.pairs
            .read()
            .iter()
            .rev()
            .find(|p| p.client == client && p.image == image)
            .cloned()
    }

    pub fn refused(&self, kind: &'static str) {
        *self.refusals.lock().entry(kind).or_default() += 1;
    }

    /// The status document.
    pub fn status(&self) -> Status {
        let cache = self.cache.as_ref().map(|c| {
            let s = c.stats();
            let o = c.options();
            CacheStatus {
                policy: s.policy.clone(),
                size: o.size,
                block: s.block_size,
                shards: s.shards,
                capacity_bytes: s.capacity as u64 * s.block_size,
                hits: s.totals.hits,
                misses: s.totals.misses,
                evictions: s.totals.evictions,
                bytes_held: s.totals.resident * s.block_size,
                hit_ratio: ratio(s.totals.hits, s.totals.misses),
            }
        });
        let images = self
            .images
            .iter()
            .map(|im| ImageStatus {
                name: im.name.clone(),
                size: im.size,
                cached: im.device.is_some(),
                cache: im.device.zip(self.cache.as_ref()).map(|(d, c)| {
                    let s = c.device_stats(d);
                    let block = c.options().block;
                    ImageCacheStatus {
                        hits: s.hits,
                        misses: s.misses,
                        evictions: s.evictions,
                        bytes_held: s.resident * block,
                        bytes_from_cache: s.bytes_from_cache,
                        bytes_from_image: s.bytes_from_next,
                        hit_ratio: ratio(s.hits, s.misses),
                    }
                }),
            })
            .collect();
        let clients = self
            .pairs
            .read()
            .iter()
            .map(|p| {
                let (overlay_allocated_bytes, overlay_mapped_bytes) = p.overlay_sizes();
                let ops = OPS
                    .iter()
                    .zip(&p.ops)
                    .map(|(name, o)| {
                        let s = o.snapshot();
                        let st = OpStatus {
                            requests: s.requests,
                            errors: s.errors,
                            bytes: s.bytes,
                            latency_mean_us: (s.requests > 0)
                                .then(|| s.nanos as f64 / s.requests as f64 / 1000.0),
                            latency_p50_us: s.quantile_us(0.5),
                            latency_p99_us: s.quantile_us(0.99),
                        };
                        (name.to_string(), st)
                    })
                    .collect();
                ClientStatus {
                    client: p.client.clone(),
                    image: p.image.clone(),
                    grant: match p.grant {
                        Grant::View => "view",
                        Grant::ReadOnly => "read-only",
                    }
                    .into(),
                    connections_open: p.open.load(Relaxed),
                    connections: p.connections.load(Relaxed),
                    ops,
                    overlay_allocated_bytes,
                    overlay_mapped_bytes,
                }
            })
            .collect();
        let refusals = self
            .refusals
            .lock()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        Status {
            format: STATUS_FORMAT.into(),
            version: STATUS_VERSION,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            cache,
            images,
            clients,
            refusals,
        }
    }

    /// `/metrics`: Prometheus' text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let st = self.status();
        let mut m = Prom::default();
        m.family(
            "roamdisk_server_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
        );
        m.sample("roamdisk_server_uptime_seconds", &[], st.uptime_seconds);
        if let Some(c) = &st.cache {
            m.family(
                "roamdisk_server_cache_capacity_bytes",
                "gauge",
                "Bytes the server cache holds at most.",
            );
            m.sample(
                "roamdisk_server_cache_capacity_bytes",
                &[("policy", &c.policy)],
                c.capacity_bytes as f64,
            );
            m.family(
                "roamdisk_server_cache_block_bytes",
                "gauge",
                "The server cache's unit of caching.",
            );
            m.sample("roamdisk_server_cache_block_bytes", &[], c.block as f64);
            type Get = fn(&ImageCacheStatus) -> u64;
            let per_image: [(&str, &str, &str, Get); 5] = [
                (
                    "roamdisk_server_cache_hits_total",
                    "counter",
                    "Block accesses the server cache found resident.",
                    |s| s.hits,
                ),
                (
                    "roamdisk_server_cache_misses_total",
                    "counter",
                    "Block accesses the server cache did not find resident (read from the image).",
                    |s| s.misses,
                ),
                (
                    "roamdisk_server_cache_evictions_total",
                    "counter",
                    "Blocks of the image evicted from the server cache.",
                    |s| s.evictions,
                ),
                (
                    "roamdisk_server_cache_bytes",
                    "gauge",
                    "Bytes of the image's blocks held by the server cache now.",
                    |s| s.bytes_held,
                ),
                (
                    "roamdisk_server_cache_read_bytes_total",
                    "counter",
                    "Bytes of reads served from the server cache's memory.",
                    |s| s.bytes_from_cache,
                ),
            ];
            for (name, kind, help, get) in per_image {
                m.family(name, kind, help);
                for im in &st.images {
                    if let Some(s) = &im.cache {
                        m.sample(name, &[("image", &im.name)], get(s) as f64);
                    }
                }
            }
        }
        type PerOp = fn(&OpStatus) -> u64;
        let per_op: [(&str, &str, PerOp); 2] = [
            (
                "roamdisk_server_requests_total",
                "Requests a client made of an image, per operation (errors included).",
                |s| s.requests,
            ),
            (
                "roamdisk_server_request_errors_total",
                "Requests that failed, per operation.",
                |s| s.errors,
            ),
        ];
        for (name, help, get) in per_op {
            m.family(name, "counter", help);
            for c in &st.clients {
                for (op, s) in &c.ops {
                    m.sample(
                        name,
                        &[("client", &c.client), ("image", &c.image), ("op", op)],
                        get(s) as f64,
                    );
                }
            }
        }
        for (name, op, help) in [
            ("roamdisk_server_read_bytes_total", "read", "Bytes a client read."),
            ("roamdisk_server_written_bytes_total", "write", "Bytes a client wrote (write requests; zeroes and trims are counted in requests_total)."),
        ] {
            m.family(name, "counter", help);
            for c in &st.clients {
                m.sample(
                    name,
                    &[("client", &c.client), ("image", &c.image)],
                    c.ops[op].bytes as f64,
                );
            }
        }
        let h = "roamdisk_server_request_duration_seconds";
        m.family(
            h,
            "histogram",
            "Time the server took for a request, from the client's export device down (network excluded).",
        );
        for p in self.pairs.read().iter() {
            for (op, o) in OPS.iter().zip(&p.ops) {
                let s = o.snapshot();
                let labels = [
                    ("client", p.client.as_str()),
                    ("image", &p.image),
                    ("op", op),
                ];
                let mut cum = 0;
                for (i, n) in s.buckets.iter().enumerate() {
                    cum += n;
                    let le = match BUCKETS_US.get(i) {
                        Some(&us) => format!("{}", us as f64 / 1e6),
                        None => "+Inf".into(),
                    };
                    let mut l = labels.to_vec();
                    l.push(("le", &le));
                    m.sample(&format!("{h}_bucket"), &l, cum as f64);
                }
                m.sample(&format!("{h}_sum"), &labels, s.nanos as f64 / 1e9);
                m.sample(&format!("{h}_count"), &labels, cum as f64);
            }
        }
        // Per client and image; a client without a value has no sample.
        type PerClient = fn(&ClientStatus) -> Option<u64>;
        let per_client: [(&str, &str, &str, PerClient); 4] = [
            (
                "roamdisk_server_connections",
                "gauge",
                "Connections of a client to an image open now.",
                |c| Some(c.connections_open),
            ),
            (
                "roamdisk_server_connections_total",
                "counter",
                "Connections of a client to an image since the server started.",
                |c| Some(c.connections),
            ),
            (
                "roamdisk_server_overlay_allocated_bytes",
                "gauge",
                "Bytes allocated on disk to a client's overlay of an image (its view).",
                |c| c.overlay_allocated_bytes,
            ),
            (
                "roamdisk_server_overlay_mapped_bytes",
                "gauge",
                "Bytes of a client's view held in its overlay (the cow map's data clusters; known once the view is open).",
                |c| c.overlay_mapped_bytes,
            ),
        ];
        for (name, kind, help, get) in per_client {
            m.family(name, kind, help);
            for c in &st.clients {
                if let Some(v) = get(c) {
                    m.sample(
                        name,
                        &[("client", &c.client), ("image", &c.image)],
                        v as f64,
                    );
                }
            }
        }
        m.family(
            "roamdisk_server_refusals_total",
            "counter",
            "Refused connections (and writes to read-only exports), per reason.",
        );
        for (k, v) in &st.refusals {
            m.sample(
                "roamdisk_server_refusals_total",
                &[("reason", k)],
                *v as f64,
            );
        }
        m.0
    }
}

fn ratio(hits: u64, misses: u64) -> Option<f64> {
    let n = hits + misses;
    (n > 0).then(|| hits as f64 / n as f64)
}

/// A text exposition being written.
#[derive(Default)]
struct Prom(String);

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let esc = val
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{esc}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets() {
        let o = OpStats::default();
        for _ in 0..98 {
            o.record(4096, 30_000, true); // 30 us: bucket (25, 50]
        }
        o.record(4096, 2_000_000, true); // 2 ms: (1000, 2500]
        o.record(0, 3_000_000_000, false); // 3 s: +Inf
        let s = o.snapshot();
        assert_eq!((s.requests, s.errors, s.bytes), (100, 1, 99 * 4096));
        let p50 = s.quantile_us(0.5).unwrap();
        assert!((25.0..=50.0).contains(&p50), "{p50}");
        let p99 = s.quantile_us(0.99).unwrap();
        assert!((1000.0..=2500.0).contains(&p99), "{p99}");
        assert_eq!(s.quantile_us(1.0), Some(1_000_000.0));
        assert_eq!(OpStats::default().snapshot().quantile_us(0.5), None);
    }
}
