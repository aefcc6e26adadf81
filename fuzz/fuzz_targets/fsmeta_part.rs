//! Partition tables: `roamdisk_fsmeta::read_table` (MBR with the extended
//! chain of logical partitions, GPT primary and backup, 512 and 4096-byte
//! sectors, no table) over an in-memory disk built from the input (the
//! segment form of `roamdisk_fuzz::disk`). Byte 0 is the mode: bit 0
//! rewrites the GPT header and entry-array CRCs (`fixup::gpt`) so
//! mutations reach the entries.
//!
//! Checks (`disk::check_table`): partitions non-empty, inside the disk,
//! not overlapping, uniquely numbered (MBR primaries 1-4, logical from 5;
//! GPT entry + 1, sector-aligned; none = one whole-disk entry); a second
//! read gives the same table and identity; then the first four volumes
//! are probed and scanned with the volume checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::disk::{check_table, Image};
use roamdisk_fuzz::fixup::{self, FIXUP};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut img = Image::from_segments(rest);
    if mode & FIXUP != 0 {
        fixup::gpt(&mut img);
    }
    check_table(&img.device(0), 4);
});
