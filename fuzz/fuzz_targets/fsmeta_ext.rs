//! ext2/3/4: `roamdisk_fsmeta::probe`, `free_space` and
//! `for_each_free_extent` over an in-memory volume built from the input
//! (the segment form of `roamdisk_fuzz::disk`): superblock, group
//! descriptors (classic and `meta_bg`), block bitmaps, `BLOCK_UNINIT`,
//! bigalloc, MMP, the journal inode and JBD2 superblock. Byte 0 is the
//! mode: bit 0 rewrites the `metadata_csum`/`uninit_bg` checksums of the
//! superblock, descriptors and block bitmaps (`fixup::ext`) so mutations
//! reach the logic behind them; bit 1 places the volume at 1 MiB.
//!
//! Checks (`disk::check_volume`): probe and scan agree; free extents are
//! sorted, merged, non-empty, inside the volume and add up to the free
//! total; streaming gives the same extents; unsupported volumes have no
//! free space and are never clean; the metadata the format documents as
//! never free (ext primary superblock, NTFS backup boot sector, swap
//! header page) is not in an extent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::disk::run_volume;
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    run_volume(data, fixup::ext);
});
