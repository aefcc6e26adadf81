//! `hiberfil.sys` in the root directory: is a Windows hibernation image
//! waiting in it?
//!
//! The file is found by reading every entry of the root directory's
//! `$I30` index (the resident `$INDEX_ROOT` and each in-use `INDX` block
//! of `$INDEX_ALLOCATION`), comparing names case-insensitively, and
//! checking that the MFT record the entry names is in use, has the
//! entry's sequence number and a `$FILE_NAME` in the root.
//!
//! The first 4 bytes of the file decide (documented in docs/fsmeta.md):
//! - `hibr`, `HIBR`: a hibernation image (also written by Windows fast
//!   startup) -> unsafe;
//! - `RSTR`, `rstr`: Windows is resuming from the image -> unsafe;
//! - `wake`, `WAKE`: Windows already resumed from this image; it will
//!   not be used again -> safe;
//! - the whole first 4 KiB zero (or the file empty): no image -> safe;
//! - anything else, or a header shorter than 4 KiB holding non-zero
//!   bytes: unrecognised -> unsafe (never guessed).
//!
//! Index entry: file reference u64 @0 (record number: low 48 bits,
//! sequence: high 16), length u16 @8, key length u16 @0xA, flags u16 @0xC
//! (1 = has a sub-node, 2 = last), `$FILE_NAME` key @0x10: parent
//! reference u64 @0, name length u8 @0x40, name UTF-16 @0x42.

use roamdisk_blockdev::Result;

use super::mft::{
    apply_fixups, AT_BITMAP, AT_DATA, AT_FILE_NAME, AT_INDEX_ALLOCATION, AT_INDEX_ROOT,
};
use super::vol::{Ntfs, ROOT_RECORD};
use crate::bytes::{corrupt, sub, Fields, Region};
use crate::volume::{Health, Reason};

const NAME: &str = "hiberfil.sys";
const HEADER: usize = 4096;
/// Largest root index walked (a root directory of 64 MiB of index blocks
/// is far past anything real).
const MAX_INDEX: u64 = 64 << 20;
const MAX_ENTRIES: usize = 1 << 20;

pub(crate) struct HiberState {
    pub verdict: Option<Health>,
    pub note: Option<String>,
}

/// File references of root index entries named `hiberfil.sys`, in
/// the entries area `[start, end)` of `b`.
fn scan_entries(
    b: &[u8],
    start: usize,
    end: usize,
    out: &mut Vec<u64>,
    budget: &mut usize,
) -> Result<()> {
    let end = end.min(b.len());
    let mut off = start;
    while off + 0x10 <= end {
        *budget = budget
            .checked_sub(1)
            .ok_or_else(|| corrupt("ntfs", "root index has too many entries"))?;
        let len = b.le16(off + 8).unwrap_or(0) as usize;
        let key_len = b.le16(off + 0x0A).unwrap_or(0) as usize;
        let flags = b.le16(off + 0x0C).unwrap_or(0);
        if len < 0x10 || !len.is_multiple_of(8) || off + len > end {
            return Err(corrupt("ntfs", "root index entry has an invalid length"));
        }
        if flags & 2 != 0 {
            break;
        }
        if key_len >= 0x42 {
            let key = sub(b, off + 0x10, key_len)
                .ok_or_else(|| corrupt("ntfs", "root index key overflows its entry"))?;
            if name_of(key).is_some_and(|n| n.eq_ignore_ascii_case(NAME)) {
                out.push(b.le64(off).unwrap_or(0));
            }
        }
        off += len;
    }
    Ok(())
}

/// The name in a `$FILE_NAME` value.
fn name_of(key: &[u8]) -> Option<String> {
    let n = *key.get(0x40)? as usize;
    let units: Vec<u16> = sub(key, 0x42, 2 * n)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Some(String::from_utf16_lossy(&units))
}

pub(crate) fn check(n: &Ntfs, r: &Region<'_>) -> Result<HiberState> {
    let root = n.record(r, ROOT_RECORD)?;
    let ir = n
        .attribute(r, &root, AT_INDEX_ROOT, "$I30")?
        .and_then(|a| a.resident)
        .ok_or_else(|| corrupt("ntfs", "the root directory has no $INDEX_ROOT"))?;
    let mut refs = Vec::new();
    let mut budget = MAX_ENTRIES;
    let eo = ir.le32(0x10).unwrap_or(0) as usize;
    let il = ir.le32(0x14).unwrap_or(0) as usize;
    scan_entries(&ir, 0x10 + eo, 0x10 + il, &mut refs, &mut budget)?;
    if let Some(alloc) = n.attribute(r, &root, AT_INDEX_ALLOCATION, "$I30")? {
        let bs = n.index_block_size;
        if alloc.data_size > MAX_INDEX {
            return Err(corrupt("ntfs", "the root index is implausibly large"));
        }
        let bitmap = match n.attribute(r, &root, AT_BITMAP, "$I30")? {
            Some(b) => {
                let mut v = vec![0u8; b.data_size.min(1 << 20) as usize];
                n.read_stream(r, &b, 0, &mut v, "root $BITMAP")?;
                Some(v)
            }
            None => None,
        };
        let blocks = alloc.data_size / bs;
        let mut blk = vec![0u8; bs as usize];
        for i in 0..blocks {
            let used = bitmap.as_ref().is_none_or(|b| {
                b.get((i / 8) as usize)
                    .is_some_and(|x| x >> (i % 8) & 1 == 1)
            });
            if !used {
                continue;
            }
            n.read_stream(r, &alloc, i * bs, &mut blk, "root index")?;
            if blk.get(0..4) != Some(b"INDX") {
                return Err(corrupt(
                    "ntfs",
                    format!("root index block {i} has no INDX signature"),
                ));
            }
            apply_fixups(&mut blk, "root index block")?;
            let eo = blk.le32(0x18).unwrap_or(0) as usize;
            let il = blk.le32(0x1C).unwrap_or(0) as usize;
            scan_entries(&blk, 0x18 + eo, 0x18 + il, &mut refs, &mut budget)?;
        }
    }
    for mref in refs {
        let num = mref & 0x0000_FFFF_FFFF_FFFF;
        let seq = (mref >> 48) as u16;
        let rec = match n.record(r, num) {
            Ok(rec) => rec,
            Err(_) => continue,
        };
        if !rec.in_use() || rec.base != 0 || (seq != 0 && rec.seq != seq) {
            continue;
        }
        let in_root = rec.attrs.iter().any(|a| {
            a.kind == AT_FILE_NAME
                && a.resident.as_ref().is_some_and(|v| {
                    v.le64(0).map(|p| p & 0x0000_FFFF_FFFF_FFFF) == Some(ROOT_RECORD)
                        && name_of(v).is_some_and(|s| s.eq_ignore_ascii_case(NAME))
                })
        });
        if !in_root {
            continue;
        }
        let Some(data) = n.attribute(r, &rec, AT_DATA, "")? else {
            return Ok(HiberState {
                verdict: None,
                note: Some("hiberfil.sys has no data".into()),
            });
        };
        return verdict_of(n, r, &data);
    }
    Ok(HiberState {
        verdict: None,
        note: None,
    })
}

fn verdict_of(n: &Ntfs, r: &Region<'_>, data: &super::mft::Attr) -> Result<HiberState> {
    if data.data_size == 0 {
        return Ok(HiberState {
            verdict: None,
            note: Some("hiberfil.sys is empty".into()),
        });
    }
    let mut h = vec![0u8; (data.data_size as usize).min(HEADER)];
    n.read_stream(r, data, 0, &mut h, "hiberfil.sys")?;
    Ok(judge(&h))
}

/// The decision table of the module documentation, on the first bytes
/// (up to 4 KiB) of `hiberfil.sys`.
pub(crate) fn judge(h: &[u8]) -> HiberState {
    let sig = h.get(0..4).unwrap_or(&[]);
    let shown = String::from_utf8_lossy(sig).escape_default().to_string();
    let unsafe_ = |d: String| HiberState {
        verdict: Some(Health::unsafe_(Reason::Hibernated, d)),
        note: Some(format!("hiberfil.sys header '{shown}'")),
    };
    match sig {
        b"hibr" | b"HIBR" => unsafe_(format!(
            "Windows is hibernated (hiberfil.sys header '{shown}', also left by fast startup): resume and shut down Windows fully first"
        )),
        b"RSTR" | b"rstr" => unsafe_(format!(
            "Windows is resuming from hibernation (hiberfil.sys header '{shown}'): let it finish and shut down fully first"
        )),
        b"wake" | b"WAKE" => HiberState {
            verdict: None,
            note: Some(format!("hiberfil.sys header '{shown}': Windows already resumed from it, the image is stale")),
        },
        _ if h.len() >= HEADER && h.iter().all(|&b| b == 0) => HiberState {
            verdict: None,
            note: Some("hiberfil.sys header zeroed: no hibernation image".into()),
        },
        _ => unsafe_(format!(
            "hiberfil.sys has an unrecognised header '{shown}' ({} bytes read): refusing to guess whether Windows is hibernated",
            h.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_decision_table() {
        let mut h = vec![0u8; HEADER];
        assert!(judge(&h).verdict.is_none(), "zeroed");
        for s in [b"hibr", b"HIBR", b"RSTR", b"rstr"] {
            h[..4].copy_from_slice(s);
            assert!(judge(&h).verdict.is_some(), "{s:?}");
        }
        for s in [b"wake", b"WAKE"] {
            h[..4].copy_from_slice(s);
            assert!(judge(&h).verdict.is_none(), "{s:?}");
        }
        h[..4].copy_from_slice(b"XYZW");
        assert!(judge(&h).verdict.is_some(), "unknown");
        assert!(
            judge(&[0u8; 100]).verdict.is_some(),
            "short and zero is not a known state"
        );
    }
}
