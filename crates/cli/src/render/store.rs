//! `store info`'s report.

use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::usage::StoreUsage;

/// What a store holds, as text.
pub fn usage(u: &StoreUsage) {
    outln!("store:        {} ({}, {})", u.store, u.hash, u.compression);
    if let Some(q) = u.quota {
        outln!("quota:        {}", format_size(q));
    }
    outln!(
        "objects:      {} ({})",
        u.objects,
        format_size(u.stored_bytes)
    );
    outln!(
        "versions:     {}; their data {} is stored in {} (dedup ratio {:.2})",
        u.versions,
        format_size(u.logical_bytes),
        format_size(u.referenced_bytes),
        u.dedup_ratio
    );
    outln!(
        "unreferenced: {} (freed by `roamdisk gc`)",
        format_size(u.unreferenced_bytes)
    );
    outln!(
        "{:<16} {:>7} {:>9} {:>12} {:>12} {:>12}",
        "USER",
        "IMAGES",
        "VERSIONS",
        "LOGICAL",
        "REFERENCED",
        "UNSHARED"
    );
    for p in &u.users {
        outln!(
            "{:<16} {:>7} {:>9} {:>12} {:>12} {:>12}",
            p.user,
            p.images,
            p.versions,
            format_size(p.logical_bytes),
            format_size(p.referenced_bytes),
            format_size(p.unshared_bytes),
        );
    }
    for v in &u.unreadable_versions {
        outln!("unreadable version: {v}");
    }
}
