//! How `roamdisk lbs` shows what it did and found.

use roamdisk_blockdev::units::format_size;
use roamdisk_lbs::create::Paths;
use roamdisk_lbs::format::MetaHeader;
use roamdisk_lbs::inspect::ImageInfo;
use roamdisk_lbs::maintain::{Checked, Collected};

/// The figures as JSON, or one per line.
pub fn show_info(i: &ImageInfo, json: bool) -> anyhow::Result<()> {
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(i)?)?
        );
        return Ok(());
    }
    let bs = i.block_size;
    outln!("data:           {}", i.data.display());
    outln!("metadata:       {}", i.meta.display());
    outln!(
        "logical size:   {} ({} blocks of {})",
        format_size(i.logical_size),
        i.logical_blocks,
        format_size(bs)
    );
    outln!(
        "physical:       {} clusters of {} = {} ({}% of logical)",
        i.clusters,
        format_size(i.cluster_size as u64),
        format_size(i.physical_blocks * bs),
        i.overprovision_pct
    );
    outln!("format:         version {}", i.format_version);
    outln!("checksum:       {}", i.checksum);
    outln!("encryption:     {}", i.encryption);
    outln!(
        "data I/O:       {}",
        if i.o_direct {
            "O_DIRECT (page cache bypassed)"
        } else {
            "buffered: this file system refuses O_DIRECT"
        }
    );
    outln!(
        "mapped:         {} blocks ({}), {} zero blocks",
        i.mapped_blocks,
        format_size(i.mapped_blocks * bs),
        i.zero_blocks
    );
    outln!(
        "moved:          {} blocks copied by the garbage collector (still sealed where first written)",
        i.moved_blocks
    );
    outln!(
        "clusters:       {} holding live data, {} free",
        i.used_clusters,
        i.clusters - i.used_clusters
    );
    outln!(
        "metadata log:   {} ({} barriers; {} bytes after the last barrier would be rolled back)",
        format_size(i.log_bytes as u64),
        i.barriers,
        i.log_discarded_bytes
    );
    outln!(
        "map memory:     {:.1} MB per GiB of logical space (the seed: 12 MB)",
        i.map_memory_mb_per_gib
    );
    Ok(())
}

/// What a check found: all well, or each corrupt block (an error).
pub fn show_check(c: &Checked) -> anyhow::Result<()> {
    if c.corrupt.is_empty() {
        outln!("ok: every mapped block verifies ({} checksums)", c.checksum);
        return Ok(());
    }
    for l in &c.corrupt {
        outln!(
            "corrupt block: LBN {l} (bytes {}..{})",
            l * c.block_size,
            (l + 1) * c.block_size
        );
    }
    anyhow::bail!("{} corrupt blocks", c.corrupt.len())
}

/// A new image, in a line.
pub fn created(paths: &Paths, h: &MetaHeader) -> String {
    format!(
        "created {} ({} logical, {} physical in {} clusters) and {}",
        paths.data.display(),
        format_size(h.logical_size),
        format_size(h.geometry.physical_blocks() * h.geometry.block_size as u64),
        h.geometry.clusters,
        paths.meta.display()
    )
}

/// What a collection did, in a line.
pub fn collected(c: &Collected) -> String {
    format!(
        "reclaimed {} clusters ({} blocks moved); {} clusters free",
        c.clusters, c.moved, c.free_clusters
    )
}
