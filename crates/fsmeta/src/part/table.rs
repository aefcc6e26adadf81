//! What a partition table parser returns ([`PartitionTable`],
//! [`Partition`], [`Scheme`]) and the layout check every parser runs:
//! below the MBR and GPT parsers and the dispatcher in `part/mod.rs`.

use serde::Serialize;

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

/// Check that partitions lie inside the device and do not overlap.
pub(super) fn check_layout(
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
