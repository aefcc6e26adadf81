//! What an image is, read from its files without opening it for I/O:
//! geometry, algorithms, how much is mapped, moved and free, the metadata
//! log's length and barriers, and the map's memory (`roamdisk lbs info`).

use std::path::PathBuf;

use roamdisk_blockdev::layers::raw::RawDev;
use serde::Serialize;

use crate::create::{read_header, Paths};
use crate::format::{Cipher, KeySource};
use crate::replay::{replay, Inconsistent, IN_PLACE, ZERO};

/// An image's figures (the JSON form of `roamdisk lbs info`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageInfo {
    pub data: PathBuf,
    pub meta: PathBuf,
    /// Bytes the image holds.
    pub logical_size: u64,
    /// `logical_size` in blocks.
    #[serde(skip)]
    pub logical_blocks: u64,
    pub block_size: u64,
    pub cluster_size: u32,
    pub clusters: u64,
    /// Physical blocks (every cluster's).
    #[serde(skip)]
    pub physical_blocks: u64,
    /// Physical space as a percentage of the logical size.
    pub overprovision_pct: u64,
    pub checksum: &'static str,
    /// `none`, or the cipher and where its key comes from.
    pub encryption: String,
    /// Whether the data file takes O_DIRECT.
    pub o_direct: bool,
    pub mapped_blocks: u64,
    pub zero_blocks: u64,
    /// Clusters holding live data.
    pub used_clusters: u64,
    /// Bytes of the metadata log.
    pub log_bytes: usize,
    /// Bytes after the last barrier (a reopen rolls them back).
    pub log_discarded_bytes: usize,
    pub barriers: u64,
    pub generation: u64,
    /// Memory of the map per GiB of logical space, MB.
    pub map_memory_mb_per_gib: f64,
    pub format_version: u32,
    /// Blocks the garbage collector copied (still sealed where first
    /// written).
    pub moved_blocks: usize,
}

/// Why an image's figures could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// The header does not read.
    #[error(transparent)]
    Header(#[from] roamdisk_blockdev::Error),
    /// The metadata log does not read.
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The metadata log describes an impossible state.
    #[error(transparent)]
    Log(#[from] Inconsistent),
}

/// The figures of the image at `paths`: its header, a replay of its
/// metadata log, and whether its data file takes O_DIRECT.
pub fn info(paths: &Paths) -> Result<ImageInfo, InfoError> {
    let h = read_header(paths)?;
    let bytes = std::fs::read(&paths.meta).map_err(|source| InfoError::Read {
        path: paths.meta.clone(),
        source,
    })?;
    let r = replay(&bytes, &h)?;
    let live = r.map.live_counts(h.geometry.blocks_per_cluster());
    let encryption = match h.cipher {
        Cipher::None => "none".to_string(),
        _ => format!(
            "xts-aes-256 ({})",
            if h.key_source == KeySource::Passphrase {
                "passphrase, Argon2id"
            } else {
                "key file"
            }
        ),
    };
    Ok(ImageInfo {
        data: paths.data.clone(),
        meta: paths.meta.clone(),
        logical_size: h.logical_size,
        logical_blocks: h.logical_blocks(),
        block_size: h.geometry.block_size as u64,
        cluster_size: h.geometry.cluster_size,
        clusters: h.geometry.clusters,
        physical_blocks: h.geometry.physical_blocks(),
        overprovision_pct: (h.geometry.physical_blocks() * 100) / h.logical_blocks(),
        checksum: h.checksum.name(),
        encryption,
        o_direct: RawDev::open_direct(&paths.data, true)
            .map(|d| d.is_direct())
            .unwrap_or(false),
        mapped_blocks: live.iter().map(|&l| l as u64).sum(),
        zero_blocks: r.map.l2p.iter().filter(|&&p| p == ZERO).count() as u64,
        used_clusters: live.iter().filter(|&&l| l > 0).count() as u64,
        log_bytes: bytes.len(),
        log_discarded_bytes: r.discarded,
        barriers: r.barriers,
        generation: h.generation,
        map_memory_mb_per_gib: crate::image::map_bytes_per_gib(&h) / 1e6,
        format_version: h.version,
        moved_blocks: r.map.seal_pbn.iter().filter(|&&p| p != IN_PLACE).count(),
    })
}
