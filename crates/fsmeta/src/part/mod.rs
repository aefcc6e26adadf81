//! Partition tables: MBR (with extended/logical partitions) and GPT, or a
//! whole disk holding one file system without a table.

mod gpt;
mod mbr;
mod table;

use roamdisk_blockdev::{BlockDev, Result};

use crate::bytes::{sha256, Fields};

pub use gpt::guid_text;
pub use table::{Partition, PartitionTable, Scheme};

/// Read the partition table of `dev`. A disk without one (or one whose
/// sector 0 is a file system's boot sector) comes back as scheme `None`
/// with one partition covering the whole device.
pub fn read_table(dev: &dyn BlockDev) -> Result<PartitionTable> {
    let size = dev.size();
    let mut s0 = [0u8; 512];
    if size >= 512 {
        dev.read_at(&mut s0, 0)?;
    }
    let whole = |why: Option<String>| PartitionTable {
        scheme: Scheme::None,
        sector_size: 512,
        disk_id: None,
        partitions: vec![Partition {
            number: 0,
            start: 0,
            len: size,
            type_id: String::new(),
            type_name: "whole disk",
            name: None,
            guid: None,
            logical: false,
        }],
        warnings: why.into_iter().collect(),
        identity: sha256(&[&s0]),
    };
    if size < 1024 || s0.le16(510) != Some(0xAA55) {
        return Ok(whole(None));
    }
    if boot_sector_of_file_system(&s0) {
        return Ok(whole(None));
    }
    let entries = mbr::primary_entries(&s0);
    if entries.iter().any(|e| e.kind == 0xEE) {
        return gpt::read(dev, &s0);
    }
    if !mbr::looks_valid(&entries) {
        return Ok(whole(Some(
            "sector 0 has a boot signature but no valid MBR partition entries; treated as a whole-disk volume".into(),
        )));
    }
    mbr::read(dev, &s0, &entries)
}

/// The data partitions of `dev` (the whole device when it has no table).
pub fn partitions(dev: &dyn BlockDev) -> Result<Vec<Partition>> {
    Ok(read_table(dev)?.partitions)
}

/// Sector 0 is the boot sector of a file system (NTFS, FAT, exFAT,
/// BitLocker), not an MBR: those carry the same 0x55AA signature.
fn boot_sector_of_file_system(s0: &[u8; 512]) -> bool {
    let oem = &s0[3..11];
    oem == b"NTFS    "
        || oem == b"EXFAT   "
        || oem == b"-FVE-FS-"
        || &s0[0x36..0x3B] == b"FAT12"
        || &s0[0x36..0x3B] == b"FAT16"
        || &s0[0x52..0x57] == b"FAT32"
}
