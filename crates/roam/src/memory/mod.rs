//! A running VM's memory as a page-addressed image: stored at suspend
//! from QEMU's migration stream ([`build`]), rebuilt as a whole stream
//! for an eager resume ([`eager`]), or served lazily to a QEMU in
//! postcopy ([`postcopy`], driven over QMP by [`handoff`]), with the pages
//! the guest touched first recorded for next time ([`workset`]). Pages
//! travel the version's own fetch chain (shared cache, lookaside media,
//! store), like the disk's chunks.

pub mod build;
pub mod eager;
pub mod handoff;
pub mod link;
pub mod postcopy;
pub mod workset;

use roamdisk_chunkstore::memimage::{MemoryPages, FLAG_FOOTERS};
use roamdisk_migration::stream::{RamBlock, RamSection};

/// The RAM section a page image was taken from, as the wire writers take
/// it.
pub fn ram_section(p: &MemoryPages) -> RamSection {
    RamSection {
        section_id: p.section_id,
        instance_id: p.instance_id,
        version_id: p.version_id,
        blocks: p
            .blocks
            .iter()
            .map(|b| RamBlock {
                name: b.name.clone(),
                length: b.length,
            })
            .collect(),
        footers: p.flags & FLAG_FOOTERS != 0,
    }
}

#[cfg(test)]
mod tests;
