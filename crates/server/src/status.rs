//! The status document (`/status.json`, docs/server.md "Status"): what a
//! running server serves and `roamdisk server status` reads, and the rows
//! of the status table made from it.

use std::collections::BTreeMap;

use roamdisk_blockdev::units::format_size;
use serde::{Deserialize, Serialize};

/// The value of the status document's `format` key.
pub const STATUS_FORMAT: &str = "roamdisk-server-status";
/// Its version.
pub const STATUS_VERSION: u32 = 1;

/// `/status.json` (docs/server.md, "Status").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub format: String,
    pub version: u32,
    pub uptime_seconds: f64,
    /// `null` without a server cache.
    pub cache: Option<CacheStatus>,
    pub images: Vec<ImageStatus>,
    /// One entry per grant (client, image), in the config's order.
    pub clients: Vec<ClientStatus>,
    /// Refusals per reason.
    pub refusals: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheStatus {
    pub policy: String,
    /// The configured size in bytes.
    pub size: u64,
    pub block: u64,
    pub shards: usize,
    /// Whole blocks of the size.
    pub capacity_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Resident blocks times the block size.
    pub bytes_held: u64,
    /// hits / (hits + misses); `null` before the first access.
    pub hit_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageStatus {
    pub name: String,
    pub size: u64,
    /// Behind the server cache.
    pub cached: bool,
    /// Its share of the cache's counters (when cached).
    pub cache: Option<ImageCacheStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageCacheStatus {
    pub hits: u64,
    pub misses: u64,
    /// Its blocks evicted (to admit a block of any image).
    pub evictions: u64,
    pub bytes_held: u64,
    pub bytes_from_cache: u64,
    /// Bytes the cache read from the image (whole blocks).
    pub bytes_from_image: u64,
    pub hit_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientStatus {
    pub client: String,
    pub image: String,
    /// `view` or `read-only`.
    pub grant: String,
    pub connections_open: u64,
    /// Connections since the server started.
    pub connections: u64,
    /// Per operation: read, write, write_zeroes, trim, flush, block_status.
    pub ops: BTreeMap<String, OpStatus>,
    /// Views only, once the overlay exists.
    pub overlay_allocated_bytes: Option<u64>,
    /// Views only, once the view was opened since the server started.
    pub overlay_mapped_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpStatus {
    pub requests: u64,
    pub errors: u64,
    /// Bytes of the requests that succeeded (read and written bytes for
    /// read and write; the length for write_zeroes and trim).
    pub bytes: u64,
    pub latency_mean_us: Option<f64>,
    /// From the histogram: interpolated within a bucket.
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
}

/// One line of `roamdisk server status`'s table: how a client uses one of
/// its grants.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantRow {
    pub client: String,
    pub image: String,
    /// `view` or `read-only`.
    pub grant: String,
    pub connections_open: u64,
    /// READ requests.
    pub reads: u64,
    /// WRITE, WRITE_ZEROES and TRIM requests.
    pub writes: u64,
    /// Bytes read and written.
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Read latency percentiles at the server.
    pub read_p50_us: Option<f64>,
    pub read_p99_us: Option<f64>,
    /// Views only, once the overlay exists.
    pub overlay_allocated_bytes: Option<u64>,
}

impl Status {
    /// The table's rows, one per grant, in the config's order.
    pub fn rows(&self) -> Vec<GrantRow> {
        self.clients
            .iter()
            .map(|c| {
                let op = |k: &str| c.ops.get(k);
                let read = op("read");
                GrantRow {
                    client: c.client.clone(),
                    image: c.image.clone(),
                    grant: c.grant.clone(),
                    connections_open: c.connections_open,
                    reads: read.map_or(0, |o| o.requests),
                    writes: ["write", "write_zeroes", "trim"]
                        .iter()
                        .filter_map(|k| op(k))
                        .map(|o| o.requests)
                        .sum(),
                    read_bytes: read.map_or(0, |o| o.bytes),
                    written_bytes: op("write").map_or(0, |o| o.bytes),
                    read_p50_us: read.and_then(|o| o.latency_p50_us),
                    read_p99_us: read.and_then(|o| o.latency_p99_us),
                    overlay_allocated_bytes: c.overlay_allocated_bytes,
                }
            })
            .collect()
    }

    /// `roamdisk server status`'s table: a header, then a row per grant
    /// (sizes as `units` writes them, latencies in whole microseconds, `-`
    /// for none).
    pub fn table(&self) -> Vec<Vec<String>> {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        let mut rows = vec![[
            "client", "image", "grant", "conns", "reads", "writes", "read", "written", "p50 us",
            "p99 us", "overlay",
        ]
        .map(String::from)
        .to_vec()];
        rows.extend(self.rows().into_iter().map(|r| {
            vec![
                r.client,
                r.image,
                r.grant,
                r.connections_open.to_string(),
                r.reads.to_string(),
                r.writes.to_string(),
                format_size(r.read_bytes),
                format_size(r.written_bytes),
                us(r.read_p50_us),
                us(r.read_p99_us),
                r.overlay_allocated_bytes.map_or("-".into(), format_size),
            ]
        }));
        rows
    }

    /// The refusal reasons that happened, with their counts.
    pub fn refusals_seen(&self) -> Vec<(&str, u64)> {
        self.refusals
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (k.as_str(), n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_sums_writes_and_shows_what_is_missing_as_a_dash() {
        let op = |requests, bytes, p50| OpStatus {
            requests,
            errors: 0,
            bytes,
            latency_mean_us: None,
            latency_p50_us: p50,
            latency_p99_us: None,
        };
        let st = Status {
            format: STATUS_FORMAT.into(),
            version: STATUS_VERSION,
            uptime_seconds: 1.0,
            cache: None,
            images: Vec::new(),
            clients: vec![ClientStatus {
                client: "alice".into(),
                image: "win10".into(),
                grant: "view".into(),
                connections_open: 1,
                connections: 2,
                ops: [
                    ("read", op(3, 3 << 20, Some(41.6))),
                    ("write", op(4, 1 << 20, None)),
                    ("trim", op(5, 0, None)),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
                overlay_allocated_bytes: None,
                overlay_mapped_bytes: None,
            }],
            refusals: [("not_granted", 2), ("tls_failed", 0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        };
        let r = &st.rows()[0];
        assert_eq!((r.reads, r.writes), (3, 9));
        assert_eq!((r.read_bytes, r.written_bytes), (3 << 20, 1 << 20));
        let t = st.table();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0][0], "client");
        assert_eq!(t[1][3..], ["1", "3", "9", "3 MiB", "1 MiB", "42", "-", "-"]);
        assert_eq!(st.refusals_seen(), vec![("not_granted", 2)]);
    }
}
