//! Partition tables: MBR (with extended/logical partitions) and GPT, or a
//! whole disk holding one file system without a table.

mod gpt;
mod mbr;

use roamdisk_blockdev::{BlockDev, Result};
use serde::Serialize;

use crate::bytes::{sha256, Fields};

pub use gpt::guid_text;

/// How a disk is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Mbr,
    Gpt,
    /// No partition table: the whole disk is one volume.
    None,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Mbr => "mbr",
            Scheme::Gpt => "gpt",
            Scheme::None => "none",
        }
    }
}

/// One partition (or the whole disk when there is no table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// Linux numbering: GPT entry index + 1; MBR primaries 1-4, logical
    /// partitions from 5 in chain order; 0 for a whole disk.
    pub number: u32,
    /// Byte offset on the device.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// The partition type as the table stores it: `0x83` (MBR) or a GUID
    /// (GPT); empty for a whole disk.
    pub type_id: String,
    /// A readable name of the type ("Linux filesystem", "Linux swap", ...)
    /// or "unknown".
    pub type_name: &'static str,
    /// GPT partition name.
    pub name: Option<String>,
    /// GPT unique partition GUID.
    pub guid: Option<String>,
    /// MBR: a logical partition inside the extended one.
    pub logical: bool,
}

/// A parsed partition table.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionTable {
    pub scheme: Scheme,
    /// Logical sector size the table is expressed in.
    pub sector_size: u32,
    /// GPT disk GUID or MBR disk signature.
    pub disk_id: Option<String>,
    /// Data partitions in table order (MBR extended containers excluded).
    pub partitions: Vec<Partition>,
    /// Problems that did not stop the parse (e.g. "primary GPT header
    /// corrupt, used the backup").
    pub warnings: Vec<String>,
    /// SHA-256 of every sector the table was read from, in read order.
    #[serde(skip)]
    pub identity: [u8; 32],
}

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

/// Check that partitions lie inside the device and do not overlap.
fn check_layout(
    what: &str,
    parts: &[Partition],
    size: u64,
) -> std::result::Result<(), roamdisk_blockdev::Error> {
    for p in parts {
        if p.len == 0 || p.start.checked_add(p.len).is_none_or(|e| e > size) {
            return Err(crate::bytes::corrupt(
                what,
                format!(
                    "partition {} ({} bytes at {}) ends past the end of the {size}-byte disk: truncated image or corrupt table",
                    p.number, p.len, p.start
                ),
            ));
        }
    }
    let mut v: Vec<&Partition> = parts.iter().collect();
    v.sort_by_key(|p| p.start);
    for w in v.windows(2) {
        if w[0].start + w[0].len > w[1].start {
            return Err(crate::bytes::corrupt(
                what,
                format!(
                    "partitions {} and {} overlap: refusing to guess which one owns the shared sectors",
                    w[0].number, w[1].number
                ),
            ));
        }
    }
    Ok(())
}
