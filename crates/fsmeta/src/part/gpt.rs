//! GPT (UEFI spec, chapter 5): a protective MBR, a header at LBA 1 with a
//! CRC32 over itself and over the partition entry array, and a backup
//! header at the last LBA.
//!
//! Header: "EFI PART" [8] @0, revision u32 @8, header size u32 @12,
//! header CRC32 u32 @16, my LBA u64 @24, alternate LBA u64 @32, first
//! usable u64 @40, last usable u64 @48, disk GUID [16] @56, entries LBA
//! u64 @72, entry count u32 @80, entry size u32 @84, entries CRC32 u32
//! @88. Entry: type GUID [16] @0, unique GUID [16] @16, first LBA u64 @32,
//! last LBA u64 @40 (inclusive), attributes u64 @48, name UTF-16LE [72] @56.

use roamdisk_blockdev::{BlockDev, Result};

use super::table::{check_layout, Partition, PartitionTable, Scheme};
use crate::bytes::{corrupt, sha256, sub, Fields};

/// Largest entry array read (the usual one is 128 x 128 bytes = 16 KiB).
const MAX_ARRAY: u64 = 4 << 20;

/// Text form of a GUID stored in the mixed-endian GPT order.
pub fn guid_text(g: &[u8; 16]) -> String {
    format!(
        "{:08X}-{:04X}-{:04X}-{:02X}{:02X}-{}",
        u32::from_le_bytes(g[0..4].try_into().expect("4")),
        u16::from_le_bytes(g[4..6].try_into().expect("2")),
        u16::from_le_bytes(g[6..8].try_into().expect("2")),
        g[8],
        g[9],
        g[10..16]
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    )
}

struct Header {
    raw: Vec<u8>,
    alternate: u64,
    first_usable: u64,
    last_usable: u64,
    disk_guid: [u8; 16],
    entries_lba: u64,
    count: u32,
    entry_size: u32,
    entries_crc: u32,
}

/// Why one GPT header, with its entry array, cannot be used (the table
/// falls back to the other header, and names both reasons when neither
/// can).
#[derive(Debug, thiserror::Error)]
enum Unusable {
    /// The header or its array is malformed.
    #[error("{0}")]
    Bad(String),
    /// The entry array could not be read.
    #[error(transparent)]
    Read(#[from] roamdisk_blockdev::Error),
}

fn parse_header(
    b: &[u8],
    lba: u64,
    sector: u64,
    sectors: u64,
) -> std::result::Result<Header, Unusable> {
    if b.get(0..8) != Some(b"EFI PART") {
        return Err(Unusable::Bad("no \"EFI PART\" signature".into()));
    }
    let hsize = b.le32(12).unwrap_or(0) as usize;
    if hsize < 92 || hsize as u64 > sector {
        return Err(Unusable::Bad(format!(
            "header size {hsize} is not between 92 and the sector size"
        )));
    }
    let mut h = b[..hsize].to_vec();
    let want = b.le32(16).unwrap_or(0);
    h[16..20].fill(0);
    if crc32fast::hash(&h) != want {
        return Err(Unusable::Bad("header CRC32 mismatch".into()));
    }
    let my = b.le64(24).unwrap_or(0);
    if my != lba {
        return Err(Unusable::Bad(format!(
            "header says it is at LBA {my}, found at LBA {lba}"
        )));
    }
    let f = |o| b.le64(o).unwrap_or(0);
    let (first_usable, last_usable) = (f(40), f(48));
    if first_usable > last_usable || last_usable >= sectors {
        return Err(Unusable::Bad(format!(
            "usable range {first_usable}..={last_usable} is not inside the {sectors}-sector disk"
        )));
    }
    let count = b.le32(80).unwrap_or(0);
    let entry_size = b.le32(84).unwrap_or(0);
    if entry_size < 128 || !entry_size.is_multiple_of(8) || entry_size > 4096 {
        return Err(Unusable::Bad(format!(
            "partition entry size {entry_size} is invalid"
        )));
    }
    if count as u64 * entry_size as u64 > MAX_ARRAY {
        return Err(Unusable::Bad(format!(
            "{count} partition entries of {entry_size} bytes is implausibly many"
        )));
    }
    Ok(Header {
        raw: b[..hsize].to_vec(),
        alternate: f(32),
        first_usable,
        last_usable,
        disk_guid: b[56..72].try_into().expect("16"),
        entries_lba: f(72),
        count,
        entry_size,
        entries_crc: b.le32(88).unwrap_or(0),
    })
}

fn read_entries(
    dev: &dyn BlockDev,
    h: &Header,
    sector: u64,
) -> std::result::Result<Vec<u8>, Unusable> {
    let len = h.count as u64 * h.entry_size as u64;
    let off = h
        .entries_lba
        .checked_mul(sector)
        .filter(|o| o.checked_add(len).is_some_and(|e| e <= dev.size()))
        .ok_or_else(|| {
            Unusable::Bad(format!(
                "the entry array at LBA {} lies past the end of the disk",
                h.entries_lba
            ))
        })?;
    let mut v = vec![0u8; len as usize];
    dev.read_at(&mut v, off)?;
    if crc32fast::hash(&v) != h.entries_crc {
        return Err(Unusable::Bad("partition entry array CRC32 mismatch".into()));
    }
    Ok(v)
}

pub(super) fn read(dev: &dyn BlockDev, s0: &[u8; 512]) -> Result<PartitionTable> {
    let size = dev.size();
    // The sector size is whichever puts the header at LBA 1.
    let mut last_err = String::new();
    for sector in [512u64, 4096] {
        if size < 3 * sector {
            continue;
        }
        let sectors = size / sector;
        let mut b = vec![0u8; sector as usize];
        dev.read_at(&mut b, sector)?;
        let mut warnings = Vec::new();
        let primary = parse_header(&b, 1, sector, sectors);
        let (h, arr) = match primary.and_then(|h| read_entries(dev, &h, sector).map(|a| (h, a))) {
            Ok(x) => x,
            Err(e) => {
                if b.get(0..8) != Some(b"EFI PART") && sector == 512 {
                    // Maybe a 4 KiB-sector disk; the backup is tried there too.
                    last_err = e.to_string();
                    continue;
                }
                // Primary unusable: the backup header sits at the last LBA.
                let alt = sectors - 1;
                let mut bb = vec![0u8; sector as usize];
                dev.read_at(&mut bb, alt * sector)?;
                match parse_header(&bb, alt, sector, sectors)
                    .and_then(|h| read_entries(dev, &h, sector).map(|a| (h, a)))
                {
                    Ok(x) => {
                        warnings.push(format!(
                            "primary GPT header unusable ({e}); used the backup at LBA {alt}"
                        ));
                        b = bb;
                        x
                    }
                    Err(e2) => {
                        return Err(corrupt(
                            "gpt",
                            format!("protective MBR found but both GPT headers are unusable: primary: {e}; backup: {e2}"),
                        ))
                    }
                }
            }
        };
        if h.alternate >= sectors {
            warnings.push(format!(
                "the header names a backup at LBA {} past the end of the disk (image truncated or grown?)",
                h.alternate
            ));
        }
        let mut parts = Vec::new();
        for i in 0..h.count as usize {
            let e = sub(&arr, i * h.entry_size as usize, h.entry_size as usize)
                .expect("inside the array");
            let ty: [u8; 16] = e[0..16].try_into().expect("16");
            if ty == [0u8; 16] {
                continue;
            }
            let first = e.le64(32).unwrap_or(0);
            let last = e.le64(40).unwrap_or(0);
            if last < first || first < h.first_usable || last > h.last_usable {
                return Err(corrupt(
                    "gpt",
                    format!(
                        "partition {} spans LBA {first}..={last}, outside the usable range {}..={}",
                        i + 1,
                        h.first_usable,
                        h.last_usable
                    ),
                ));
            }
            let units: Vec<u16> = e[56..128]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .take_while(|&c| c != 0)
                .collect();
            let name = String::from_utf16_lossy(&units);
            let uniq: [u8; 16] = e[16..32].try_into().expect("16");
            let type_id = guid_text(&ty);
            parts.push(Partition {
                number: i as u32 + 1,
                start: first * sector,
                len: (last - first + 1) * sector,
                type_name: type_name(&type_id),
                type_id,
                name: (!name.is_empty()).then_some(name),
                guid: Some(guid_text(&uniq)),
                logical: false,
            });
        }
        check_layout("gpt", &parts, size)?;
        return Ok(PartitionTable {
            scheme: Scheme::Gpt,
            sector_size: sector as u32,
            disk_id: Some(guid_text(&h.disk_guid)),
            partitions: parts,
            warnings,
            identity: sha256(&[s0, &b, &h.raw, &arr]),
        });
    }
    Err(corrupt(
        "gpt",
        format!("protective MBR found but no usable GPT header: {last_err}"),
    ))
}

/// Names of common GPT partition types.
pub fn type_name(guid: &str) -> &'static str {
    match guid {
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4" => "Linux filesystem",
        "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F" => "Linux swap",
        "E6D6D379-F507-44C2-A23C-238F2A3DF928" => "Linux LVM",
        "A19D880F-05FC-4D3B-A006-743F0F84911E" => "Linux RAID",
        "CA7D7CCB-63ED-4C53-861C-1742536059CC" => "Linux LUKS",
        "933AC7E1-2EB4-4F13-B844-0E14E2AEF915" => "Linux home",
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" => "Linux root (x86-64)",
        "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7" => "Microsoft basic data",
        "E3C9E316-0B5C-4DB8-817D-F92DF00215AE" => "Microsoft reserved",
        "DE94BBA4-06D1-4D40-A16A-BFD50179D6AC" => "Windows recovery",
        "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" => "EFI System",
        "21686148-6449-6E6F-744E-656564454649" => "BIOS boot",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_mixed_endian() {
        // Linux filesystem data, as stored on disk.
        let g = [
            0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47,
            0x7D, 0xE4,
        ];
        assert_eq!(guid_text(&g), "0FC63DAF-8483-4772-8E79-3D69D8477DE4");
    }
}
