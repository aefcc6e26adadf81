//! The image-wide operations of `roamdisk lbs` on an image's files:
//! verify every block, compact the metadata log, collect free clusters.

use roamdisk_blockdev::progress::{Progress, Unit};
use roamdisk_blockdev::Result;

use crate::create::{open_files, KeyOptions, Paths};
use crate::image::{Lbs, LbsOptions};

/// Open the image writable with no background collector (opening
/// replays, rolls back and compacts; the caller does the rest).
fn open_foreground(paths: &Paths, keys: &KeyOptions) -> Result<Lbs> {
    let opts = LbsOptions {
        background_gc: false,
        ..LbsOptions::default()
    };
    Ok(open_files(paths, keys, opts)?.0)
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Blocks whose checksum fails, by LBN.
    pub corrupt: Vec<u64>,
    pub block_size: u64,
    /// The checksum's name.
    pub checksum: &'static str,
}

/// Verify every mapped block's checksum (the image opened read-only),
/// reporting a phase "checking blocks" over the logical blocks.
pub fn check(paths: &Paths, keys: &KeyOptions, progress: &dyn Progress) -> Result<Checked> {
    let opts = LbsOptions {
        read_only: true,
        ..LbsOptions::default()
    };
    let (lbs, _) = open_files(paths, keys, opts)?;
    let h = lbs.header();
    progress.start("checking blocks", h.logical_blocks(), Unit::Items);
    let corrupt = lbs.check(|done, _| progress.set(done))?;
    progress.end();
    Ok(Checked {
        corrupt,
        block_size: h.geometry.block_size as u64,
        checksum: h.checksum.name(),
    })
}

/// Rewrite the metadata log from the current map (opening writable
/// replays, rolls back and compacts it); returns its length before and
/// after.
pub fn compact(paths: &Paths, keys: &KeyOptions) -> Result<(u64, u64)> {
    let len = || std::fs::metadata(&paths.meta).map(|m| m.len()).unwrap_or(0);
    let before = len();
    open_foreground(paths, keys)?.close()?;
    Ok((before, len()))
}

/// What [`collect`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Clusters reclaimed.
    pub clusters: u64,
    /// Blocks the collector moved.
    pub moved: u64,
    /// Clusters free afterwards.
    pub free_clusters: u64,
}

/// Collect free clusters now, as the background collector would.
pub fn collect(paths: &Paths, keys: &KeyOptions) -> Result<Collected> {
    let lbs = open_foreground(paths, keys)?;
    let clusters = lbs.gc_now()?;
    let s = lbs.stats();
    lbs.close()?;
    Ok(Collected {
        clusters,
        moved: s.gc_moved,
        free_clusters: s.free_clusters,
    })
}
