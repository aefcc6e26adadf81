//! MBR: four primary entries in sector 0, and a chain of extended boot
//! records (EBRs) inside one extended partition for the logical ones.
//!
//! Entry (16 bytes at 446 + 16 i): status u8 (0x00 or 0x80), CHS start
//! [3], type u8, CHS end [3], start LBA u32, sector count u32. An EBR's
//! first entry is a logical partition (start relative to the EBR), its
//! second the next EBR (start relative to the extended partition).

use std::collections::HashSet;

use roamdisk_blockdev::{BlockDev, Result};

use super::table::{check_layout, Partition, PartitionTable, Scheme};
use crate::bytes::{corrupt, Fields};

const SECTOR: u64 = 512;
const ENTRIES_AT: usize = 446;
/// Longest EBR chain followed (Linux stops far earlier in practice).
const MAX_LOGICAL: usize = 256;

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub status: u8,
    pub kind: u8,
    pub start: u32,
    pub count: u32,
}

pub(super) fn primary_entries(s: &[u8; 512]) -> [Entry; 4] {
    std::array::from_fn(|i| entry(s, i))
}

fn entry(s: &[u8; 512], i: usize) -> Entry {
    let o = ENTRIES_AT + 16 * i;
    Entry {
        status: s[o],
        kind: s[o + 4],
        start: s.le32(o + 8).unwrap_or(0),
        count: s.le32(o + 12).unwrap_or(0),
    }
}

fn is_extended(kind: u8) -> bool {
    matches!(kind, 0x05 | 0x0F | 0x85)
}

/// Plausible MBR: every status byte 0x00/0x80, every used entry has a
/// nonzero start and length, and at least one entry is used.
pub(super) fn looks_valid(e: &[Entry; 4]) -> bool {
    e.iter().all(|e| e.status == 0 || e.status == 0x80)
        && e.iter()
            .filter(|e| e.kind != 0)
            .all(|e| e.start > 0 && e.count > 0)
        && e.iter().any(|e| e.kind != 0)
}

pub(super) fn read(dev: &dyn BlockDev, s0: &[u8; 512], e: &[Entry; 4]) -> Result<PartitionTable> {
    let mut parts = Vec::new();
    let mut hashed: Vec<Vec<u8>> = vec![s0.to_vec()];
    let mut extended = None;
    for (i, x) in e.iter().enumerate() {
        if x.kind == 0 {
            continue;
        }
        if is_extended(x.kind) {
            if extended.is_some() {
                return Err(corrupt("mbr", "two extended partitions in the MBR"));
            }
            extended = Some(*x);
            continue;
        }
        parts.push(part(i as u32 + 1, x.start as u64, x));
    }
    if let Some(ext) = extended {
        let ext_start = ext.start as u64;
        let ext_end = ext_start + ext.count as u64;
        if ext_end * SECTOR > dev.size() {
            return Err(corrupt(
                "mbr",
                "the extended partition ends past the end of the disk: truncated image or corrupt table",
            ));
        }
        let mut ebr = ext_start;
        let mut seen = HashSet::new();
        let mut number = 5;
        loop {
            if !seen.insert(ebr) {
                return Err(corrupt(
                    "mbr",
                    format!("the EBR chain loops back to sector {ebr}"),
                ));
            }
            if seen.len() > MAX_LOGICAL {
                return Err(corrupt(
                    "mbr",
                    format!("more than {MAX_LOGICAL} logical partitions"),
                ));
            }
            if ebr < ext_start || ebr >= ext_end {
                return Err(corrupt(
                    "mbr",
                    format!("an EBR at sector {ebr} lies outside the extended partition"),
                ));
            }
            let mut s = [0u8; 512];
            dev.read_at(&mut s, ebr * SECTOR)?;
            if s.le16(510) != Some(0xAA55) {
                return Err(corrupt(
                    "mbr",
                    format!("the EBR at sector {ebr} has no 0x55AA signature"),
                ));
            }
            hashed.push(s.to_vec());
            let logical = entry(&s, 0);
            let next = entry(&s, 1);
            if logical.kind != 0 && logical.count > 0 {
                let start = ebr + logical.start as u64;
                if start + logical.count as u64 > ext_end {
                    return Err(corrupt(
                        "mbr",
                        format!("logical partition {number} ends past the end of the extended partition"),
                    ));
                }
                let mut p = part(number, start, &logical);
                p.logical = true;
                parts.push(p);
                number += 1;
            }
            if next.kind == 0 || next.count == 0 {
                break;
            }
            if !is_extended(next.kind) {
                return Err(corrupt(
                    "mbr",
                    format!(
                        "the EBR at sector {ebr} links to a non-extended entry (type {:#04x})",
                        next.kind
                    ),
                ));
            }
            ebr = ext_start + next.start as u64;
        }
    }
    check_layout("mbr", &parts, dev.size())?;
    let refs: Vec<&[u8]> = hashed.iter().map(|v| v.as_slice()).collect();
    Ok(PartitionTable {
        scheme: Scheme::Mbr,
        sector_size: SECTOR as u32,
        disk_id: Some(format!("{:08x}", s0.le32(440).unwrap_or(0))),
        partitions: parts,
        warnings: Vec::new(),
        identity: crate::bytes::sha256(&refs),
    })
}

fn part(number: u32, start_lba: u64, e: &Entry) -> Partition {
    Partition {
        number,
        start: start_lba * SECTOR,
        len: e.count as u64 * SECTOR,
        type_id: format!("{:#04x}", e.kind),
        type_name: type_name(e.kind),
        name: None,
        guid: None,
        logical: false,
    }
}

/// Names of common MBR partition types.
pub fn type_name(kind: u8) -> &'static str {
    match kind {
        0x01 | 0x04 | 0x06 | 0x0B | 0x0C | 0x0E => "FAT",
        0x07 => "NTFS/exFAT/HPFS",
        0x27 => "Windows recovery",
        0x82 => "Linux swap",
        0x83 => "Linux",
        0x8E => "Linux LVM",
        0xA5 => "FreeBSD",
        0xEF => "EFI System",
        0xFD => "Linux RAID",
        _ => "unknown",
    }
}
