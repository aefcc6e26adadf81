//! MFT records: fixups, attributes, runlists, attribute lists (parsing
//! only; reading them from a volume is `vol`'s).
//!
//! Record header: "FILE" @0, update sequence offset u16 @4, count u16 @6,
//! sequence number u16 @0x10, first attribute offset u16 @0x14, flags u16
//! @0x16 (1 = in use, 2 = directory), bytes in use u32 @0x18, base record
//! reference u64 @0x20. Attribute: type u32 @0, length u32 @4,
//! non-resident u8 @8, name length u8 @9 (UTF-16 units), name offset u16
//! @0xA, flags u16 @0xC. Resident: value length u32 @0x10, value offset
//! u16 @0x14. Non-resident: lowest VCN u64 @0x10, highest VCN u64 @0x18,
//! mapping pairs offset u16 @0x20, compression unit u8 @0x22, allocated
//! size u64 @0x28, data size u64 @0x30, initialized size u64 @0x38.

use roamdisk_blockdev::Result;

use crate::bytes::{corrupt, sub, Fields};

/// Fixup stride: the last two bytes of every 512-byte block of a record
/// are replaced by the update sequence number.
pub const FIXUP_STRIDE: usize = 512;
pub const AT_ATTRIBUTE_LIST: u32 = 0x20;
pub const AT_FILE_NAME: u32 = 0x30;
pub const AT_VOLUME_INFORMATION: u32 = 0x70;
pub const AT_DATA: u32 = 0x80;
pub const AT_INDEX_ROOT: u32 = 0x90;
pub const AT_INDEX_ALLOCATION: u32 = 0xA0;
pub const AT_BITMAP: u32 = 0xB0;
const AT_END: u32 = 0xFFFF_FFFF;
/// Most attributes looked at in one record (a record of 4 KiB holds far
/// fewer; this only bounds a hostile loop).
const MAX_ATTRS: usize = 512;
/// Most runs in one runlist piece.
const MAX_RUNS: usize = 1 << 20;

/// Undo the update-sequence fixups of a multi-sector structure (MFT
/// record, INDX block, `$LogFile` restart page) in place.
pub fn apply_fixups(b: &mut [u8], what: &str) -> Result<()> {
    let usa_ofs = b.le16(4).unwrap_or(0) as usize;
    let usa_count = b.le16(6).unwrap_or(0) as usize;
    let blocks = b.len() / FIXUP_STRIDE;
    if !b.len().is_multiple_of(FIXUP_STRIDE)
        || blocks == 0
        || usa_count != blocks + 1
        || usa_ofs < 8
        || usa_ofs + 2 * usa_count > FIXUP_STRIDE - 2
    {
        return Err(corrupt(
            "ntfs",
            format!("{what}: update sequence array ({usa_count} entries at {usa_ofs}) does not fit {} bytes", b.len()),
        ));
    }
    let usn = [b[usa_ofs], b[usa_ofs + 1]];
    for i in 1..usa_count {
        let end = i * FIXUP_STRIDE - 2;
        if b[end..end + 2] != usn {
            return Err(corrupt(
                "ntfs",
                format!(
                    "{what}: torn write (update sequence mismatch in sector {})",
                    i - 1
                ),
            ));
        }
        let fix = [b[usa_ofs + 2 * i], b[usa_ofs + 2 * i + 1]];
        b[end..end + 2].copy_from_slice(&fix);
    }
    Ok(())
}

/// A run of clusters: `lcn = None` for a sparse run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub vcn: u64,
    pub lcn: Option<u64>,
    pub len: u64,
}

/// An attribute as found in a record.
#[derive(Debug, Clone)]
pub struct Attr {
    pub kind: u32,
    pub name: String,
    pub resident: Option<Vec<u8>>,
    /// Non-resident: runs, data size, initialized size, lowest VCN.
    pub runs: Vec<Run>,
    pub data_size: u64,
    pub init_size: u64,
    pub lowest_vcn: u64,
    pub flags: u16,
}

/// A parsed record.
pub struct Record {
    pub number: u64,
    pub seq: u16,
    pub flags: u16,
    pub base: u64,
    pub attrs: Vec<Attr>,
}

impl Record {
    pub fn in_use(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// Parse a record (fixups already applied).
pub fn parse_record(b: &[u8], number: u64, nr_clusters: u64) -> Result<Record> {
    let bad = |m: String| corrupt("ntfs", format!("MFT record {number}: {m}"));
    if b.get(0..4) != Some(b"FILE") {
        return Err(bad("no FILE signature".into()));
    }
    let in_use_bytes = (b.le32(0x18).unwrap_or(0) as usize).min(b.len());
    let mut off = b.le16(0x14).unwrap_or(0) as usize;
    let mut attrs = Vec::new();
    loop {
        if attrs.len() > MAX_ATTRS {
            return Err(bad("too many attributes".into()));
        }
        let kind = b
            .le32(off)
            .ok_or_else(|| bad("attribute list runs off the record".into()))?;
        if kind == AT_END {
            break;
        }
        let len = b.le32(off + 4).unwrap_or(0) as usize;
        if len < 0x18 || !len.is_multiple_of(8) || off + len > in_use_bytes {
            return Err(bad(format!("attribute at {off} has invalid length {len}")));
        }
        let a = &b[off..off + len];
        let name_len = a[9] as usize;
        let name_off = a.le16(0xA).unwrap_or(0) as usize;
        let name = if name_len == 0 {
            String::new()
        } else {
            let units: Vec<u16> = sub(a, name_off, name_len * 2)
                .ok_or_else(|| bad(format!("attribute {kind:#x} name lies outside it")))?
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16_lossy(&units)
        };
        let flags = a.le16(0xC).unwrap_or(0);
        let mut at = Attr {
            kind,
            name,
            resident: None,
            runs: Vec::new(),
            data_size: 0,
            init_size: 0,
            lowest_vcn: 0,
            flags,
        };
        if a[8] == 0 {
            let vlen = a.le32(0x10).unwrap_or(0) as usize;
            let voff = a.le16(0x14).unwrap_or(0) as usize;
            let v = sub(a, voff, vlen).ok_or_else(|| {
                bad(format!(
                    "resident attribute {kind:#x} value lies outside it"
                ))
            })?;
            at.data_size = vlen as u64;
            at.init_size = vlen as u64;
            at.resident = Some(v.to_vec());
        } else {
            if len < 0x40 {
                return Err(bad(format!(
                    "non-resident attribute {kind:#x} header is too short"
                )));
            }
            let lowest = a.le64(0x10).unwrap_or(0);
            let highest = a.le64(0x18).unwrap_or(0);
            let mp = a.le16(0x20).unwrap_or(0) as usize;
            if mp >= len {
                return Err(bad(format!(
                    "attribute {kind:#x} mapping pairs lie outside it"
                )));
            }
            at.lowest_vcn = lowest;
            at.data_size = a.le64(0x30).unwrap_or(0);
            at.init_size = a.le64(0x38).unwrap_or(0);
            at.runs = decode_runs(&a[mp..], lowest, nr_clusters)
                .map_err(|m| bad(format!("attribute {kind:#x}: {m}")))?;
            let end_vcn = at.runs.last().map_or(lowest, |r| r.vcn + r.len);
            if !at.runs.is_empty() && end_vcn != highest.wrapping_add(1) {
                return Err(bad(format!(
                    "attribute {kind:#x} runlist covers VCNs {lowest}..{end_vcn}, header says ..={highest}"
                )));
            }
        }
        attrs.push(at);
        off += len;
    }
    Ok(Record {
        number,
        seq: b.le16(0x10).unwrap_or(0),
        flags: b.le16(0x16).unwrap_or(0),
        base: b.le64(0x20).unwrap_or(0) & 0x0000_FFFF_FFFF_FFFF,
        attrs,
    })
}

/// What is wrong with a runlist (its caller names the attribute).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRuns(String);

impl From<&str> for BadRuns {
    fn from(m: &str) -> BadRuns {
        BadRuns(m.to_string())
    }
}

/// Decode mapping pairs: per run a header byte (low nibble: bytes of the
/// length, high nibble: bytes of the signed LCN delta, 0 = sparse), the
/// length, the delta; a zero byte ends the list.
pub fn decode_runs(
    b: &[u8],
    first_vcn: u64,
    nr_clusters: u64,
) -> std::result::Result<Vec<Run>, BadRuns> {
    let mut runs = Vec::new();
    let mut i = 0;
    let mut vcn = first_vcn;
    let mut lcn: i64 = 0;
    loop {
        let h = *b.get(i).ok_or("mapping pairs run off the attribute")?;
        if h == 0 {
            break;
        }
        if runs.len() >= MAX_RUNS {
            return Err("too many runs".into());
        }
        let ln = (h & 0x0F) as usize;
        let on = (h >> 4) as usize;
        if ln == 0 || ln > 8 || on > 8 {
            return Err(BadRuns(format!("run header {h:#04x} is invalid")));
        }
        let lb = sub(b, i + 1, ln).ok_or("run length runs off the attribute")?;
        let mut len = 0u64;
        for (k, &x) in lb.iter().enumerate() {
            len |= (x as u64) << (8 * k);
        }
        if ln == 8 && len >> 63 != 0 || len == 0 {
            return Err("run length is zero or negative".into());
        }
        let run_lcn = if on == 0 {
            None
        } else {
            let ob = sub(b, i + 1 + ln, on).ok_or("run offset runs off the attribute")?;
            let mut d: i64 = 0;
            for (k, &x) in ob.iter().enumerate() {
                d |= (x as i64) << (8 * k);
            }
            if on < 8 && ob[on - 1] & 0x80 != 0 {
                d |= -1i64 << (8 * on);
            }
            lcn = lcn.checked_add(d).ok_or("LCN overflows")?;
            if lcn < 0
                || (lcn as u64)
                    .checked_add(len)
                    .is_none_or(|e| e > nr_clusters)
            {
                return Err(BadRuns(format!(
                    "run of {len} clusters at LCN {lcn} lies outside the volume"
                )));
            }
            Some(lcn as u64)
        };
        runs.push(Run {
            vcn,
            lcn: run_lcn,
            len,
        });
        vcn = vcn.checked_add(len).ok_or("VCN overflows")?;
        i += 1 + ln + on;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_decode_with_negative_delta_and_sparse() {
        // 0x21: 1-byte length, 2-byte offset; 0x01: sparse; 0x11 negative.
        let b = [0x21, 0x10, 0x00, 0x01, 0x01, 0x05, 0x11, 0x08, 0xF0, 0x00];
        let r = decode_runs(&b, 0, 1 << 20).unwrap();
        assert_eq!(
            r,
            vec![
                Run {
                    vcn: 0,
                    lcn: Some(256),
                    len: 16
                },
                Run {
                    vcn: 16,
                    lcn: None,
                    len: 5
                },
                Run {
                    vcn: 21,
                    lcn: Some(240),
                    len: 8
                },
            ]
        );
    }

    #[test]
    fn runs_outside_volume_are_refused() {
        let b = [0x21, 0x10, 0x00, 0x01, 0x00];
        assert!(decode_runs(&b, 0, 100).is_err());
        assert!(decode_runs(&[0x21, 0x10], 0, 1 << 20).is_err());
    }
}
