//! Machine Bank's block-size latency model (seed
//! `machine-bank-content-addressed-vm.txt`, section 3.3, Figures 4-5).
//!
//! On-demand fetching moves whole blocks. Replaying a trace against an
//! empty cache, a block size B fetches AccessedBlocks(B) distinct blocks,
//! and the extra latency is
//!
//! ```text
//! TotalLatency(B) = AccessedBlocks(B) × (FixDelay + B / Bandwidth)
//! ```
//!
//! Small blocks pay FixDelay (seek + message round trip) many times on
//! sequential reads; large blocks drag in data nobody reads. Machine Bank
//! found the optimum at 64 KiB with FixDelay = 8 ms and Bandwidth = 6 MB/s.
//!
//! What counts as a fetch: every block a read touches, once per client
//! (each client host has its own shared cache) unless `shared_cache` says
//! the clients share one; writes fetch nothing (they go to the private
//! cache) unless `include_writes`. A read of data the same client wrote
//! earlier still counts (Machine Bank's private cache would serve it);
//! boot and application-launch traces rarely do that.

use std::collections::HashSet;
use std::path::Path;

use roamdisk_blockdev::progress::{Progress, Unit};

use crate::index::FastBuild;
use crate::run::{read_requests, RunError};
use crate::sim::Request;

/// The model's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSizeConfig {
    /// Block sizes in bytes.
    pub sizes: Vec<u64>,
    /// Seconds per fetch.
    pub fix_delay: f64,
    /// Bytes per second.
    pub bandwidth: f64,
    pub include_writes: bool,
    pub shared_cache: bool,
}

impl Default for BlockSizeConfig {
    fn default() -> Self {
        BlockSizeConfig {
            sizes: (12..=20).map(|s| 1u64 << s).collect(),
            fix_delay: 0.008,
            bandwidth: 6e6,
            include_writes: false,
            shared_cache: false,
        }
    }
}

/// One block size's result.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BlockSizePoint {
    pub block_size: u64,
    pub accessed_blocks: u64,
    /// AccessedBlocks × BlockSize.
    pub bytes_fetched: u64,
    /// Seconds spent in fixed delays.
    pub fixed_s: f64,
    /// Seconds spent transferring.
    pub transfer_s: f64,
    /// TotalLatency in seconds.
    pub total_s: f64,
    /// The inversely proportional reference of Figure 4:
    /// AccessedBlocks(smallest size) × smallest size / BlockSize.
    pub inverse: f64,
}

/// The whole curve.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BlockSizeReport {
    pub fix_delay_s: f64,
    pub bandwidth: f64,
    pub requests: u64,
    pub bytes_requested: u64,
    pub points: Vec<BlockSizePoint>,
    /// Index into `points` of the smallest TotalLatency.
    pub optimum: usize,
}

impl BlockSizeReport {
    pub fn optimum(&self) -> &BlockSizePoint {
        &self.points[self.optimum]
    }

    /// Whether the optimum lies strictly inside the range of sizes.
    pub fn interior_optimum(&self) -> bool {
        self.optimum > 0 && self.optimum + 1 < self.points.len()
    }
}

/// Streams requests and counts distinct blocks for every size at once.
pub struct BlockSizeModel {
    cfg: BlockSizeConfig,
    seen: Vec<HashSet<(u32, u32, u64), FastBuild>>,
    requests: u64,
    bytes: u64,
}

impl BlockSizeModel {
    /// Panics if `cfg.sizes` is empty or holds 0.
    pub fn new(mut cfg: BlockSizeConfig) -> BlockSizeModel {
        assert!(
            !cfg.sizes.is_empty() && cfg.sizes.iter().all(|&s| s > 0),
            "block sizes must be positive"
        );
        cfg.sizes.sort_unstable();
        cfg.sizes.dedup();
        BlockSizeModel {
            seen: cfg
                .sizes
                .iter()
                .map(|_| HashSet::with_hasher(FastBuild::default()))
                .collect(),
            cfg,
            requests: 0,
            bytes: 0,
        }
    }

    pub fn feed(&mut self, r: &Request) {
        if r.write && !self.cfg.include_writes {
            return;
        }
        self.requests += 1;
        self.bytes += r.len as u64;
        let client = if self.cfg.shared_cache { 0 } else { r.client };
        for (set, &bs) in self.seen.iter_mut().zip(&self.cfg.sizes) {
            for b in r.blocks(bs) {
                set.insert((client, r.device, b));
            }
        }
    }

    pub fn finish(self) -> BlockSizeReport {
        let smallest = self.cfg.sizes[0];
        let base = self.seen[0].len() as f64 * smallest as f64;
        let points: Vec<BlockSizePoint> = self
            .cfg
            .sizes
            .iter()
            .zip(&self.seen)
            .map(|(&bs, set)| {
                let n = set.len() as u64;
                let fixed_s = n as f64 * self.cfg.fix_delay;
                let transfer_s = n as f64 * bs as f64 / self.cfg.bandwidth;
                BlockSizePoint {
                    block_size: bs,
                    accessed_blocks: n,
                    bytes_fetched: n * bs,
                    fixed_s,
                    transfer_s,
                    total_s: fixed_s + transfer_s,
                    inverse: base / bs as f64,
                }
            })
            .collect();
        let optimum = points
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_s.total_cmp(&b.1.total_s))
            .map(|(i, _)| i)
            .unwrap_or(0);
        BlockSizeReport {
            fix_delay_s: self.cfg.fix_delay,
            bandwidth: self.cfg.bandwidth,
            requests: self.requests,
            bytes_requested: self.bytes,
            points,
            optimum,
        }
    }
}

/// Replay the trace at `path` through a model of `cfg` (a first pass
/// counts its records), reporting a phase "replaying" over them.
pub fn run_file(
    cfg: BlockSizeConfig,
    path: &Path,
    progress: &dyn Progress,
) -> Result<BlockSizeReport, RunError> {
    let mut model = BlockSizeModel::new(cfg);
    let total = read_requests(path)?.count() as u64;
    progress.start("replaying", total, Unit::Items);
    for (n, r) in read_requests(path)?.enumerate() {
        if let Some(req) = r? {
            model.feed(&req);
        }
        if n % 65536 == 0 {
            progress.set(n as u64);
        }
    }
    progress.end();
    Ok(model.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, len: u32) -> Request {
        Request {
            client: 0,
            device: 0,
            offset,
            len,
            write: false,
        }
    }

    #[test]
    fn sequential_reads_favour_big_blocks_random_reads_small_ones() {
        let cfg = BlockSizeConfig::default();
        // 1 MiB read sequentially in 4 KiB requests.
        let mut m = BlockSizeModel::new(cfg.clone());
        for i in 0..256 {
            m.feed(&read(i * 4096, 4096));
        }
        let r = m.finish();
        let n: Vec<u64> = r.points.iter().map(|p| p.accessed_blocks).collect();
        assert_eq!(n, [256, 128, 64, 32, 16, 8, 4, 2, 1]);
        assert_eq!(r.optimum().block_size, 1 << 20, "sequential: biggest wins");
        // 4 KiB reads 4 MiB apart: every size fetches the same count.
        let mut m = BlockSizeModel::new(cfg);
        for i in 0..100 {
            m.feed(&read(i * (4 << 20), 4096));
        }
        let r = m.finish();
        assert!(r.points.iter().all(|p| p.accessed_blocks == 100));
        assert_eq!(r.optimum().block_size, 4096, "random: smallest wins");
        // TotalLatency = AccessedBlocks × (FixDelay + B / Bandwidth).
        let p = &r.points[4]; // 64 KiB
        let want = 100.0 * (0.008 + 65536.0 / 6e6);
        assert!((p.total_s - want).abs() < 1e-9, "{} vs {want}", p.total_s);
    }

    #[test]
    fn writes_and_clients() {
        let mut cfg = BlockSizeConfig::default();
        let mut m = BlockSizeModel::new(cfg.clone());
        m.feed(&Request {
            write: true,
            ..read(0, 4096)
        });
        m.feed(&read(0, 4096));
        m.feed(&Request {
            client: 1,
            ..read(0, 4096)
        });
        assert_eq!(m.finish().points[0].accessed_blocks, 2, "per client");
        cfg.shared_cache = true;
        cfg.include_writes = true;
        let mut m = BlockSizeModel::new(cfg);
        m.feed(&Request {
            write: true,
            ..read(8192, 4096)
        });
        m.feed(&Request {
            client: 1,
            ..read(0, 4096)
        });
        assert_eq!(m.finish().points[0].accessed_blocks, 2);
    }
}
