//! Linux swap and hibernation signatures: `roamdisk_fsmeta::probe`,
//! `free_space` and `for_each_free_extent` over an in-memory volume built
//! from the input (the segment form of `roamdisk_fuzz::disk`): the header
//! page at every page size, byte-swapped headers, bad pages, the
//! S1SUSPEND/S2SUSPEND/ULSUSPEND/LINHIB0001 and TuxOnIce signatures, and
//! the signature table of unsupported kinds. Byte 0 is the mode (bit 0
//! unused; bit 1 places the volume at 1 MiB).
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

fuzz_target!(|data: &[u8]| {
    run_volume(data, |_| {});
});
