//! NTFS: `roamdisk_fsmeta::probe`, `free_space` and
//! `for_each_free_extent` over an in-memory volume built from the input
//! (the segment form of `roamdisk_fuzz::disk`): boot sector, MFT records
//! and their fixups, runlists, `$ATTRIBUTE_LIST`, `$Bitmap`, `$Volume`,
//! `$LogFile` restart pages and the `hiberfil.sys` lookup in the root
//! index. Byte 0 is the mode: bit 0 makes every update sequence
//! consistent (`fixup::ntfs`) so mutations inside records are not all
//! torn writes; bit 1 places the volume at 1 MiB.
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
    run_volume(data, fixup::ntfs);
});
