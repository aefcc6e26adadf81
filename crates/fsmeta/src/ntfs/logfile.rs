//! `$LogFile` restart pages: whether the volume was left mounted.
//!
//! Restart page: "RSTR" (or "CHKD") @0, update sequence offset/count @4/6,
//! system page size u32 @0x10, log page size u32 @0x14, restart area
//! offset u16 @0x18. Restart area: current LSN u64 @0, client-in-use list
//! u16 @0x0C (0xFFFF = none), flags u16 @0x0E (0x0002 = volume clean).
//! There are two restart pages (at 0 and at the system page size); the one
//! with the higher current LSN counts. A `$LogFile` that is all 0xFF
//! (freshly made by mkntfs, or reset by ntfs-3g / ntfsfix) is clean.
//! Windows fast startup (hybrid shutdown) leaves the client list in use
//! and the clean flag off, as does a crash.

use roamdisk_blockdev::Result;

use super::mft::{apply_fixups, AT_DATA};
use super::vol::Ntfs;
use crate::bytes::{corrupt, Fields, Region};

const NO_CLIENT: u16 = 0xFFFF;
const RESTART_VOLUME_IS_CLEAN: u16 = 0x0002;

pub(crate) struct LogState {
    pub clean: bool,
    pub note: String,
    /// The bytes of both restart pages, for the volume's identity hash.
    pub pages: Vec<u8>,
}

/// One restart page's (current LSN, clean), or `None` when the page is
/// not a valid restart page.
fn restart_page(mut p: Vec<u8>) -> Option<(u64, bool)> {
    if p.get(0..4) != Some(b"RSTR") && p.get(0..4) != Some(b"CHKD") {
        return None;
    }
    apply_fixups(&mut p, "$LogFile restart page").ok()?;
    let ra = p.le16(0x18)? as usize;
    let lsn = p.le64(ra)?;
    let in_use = p.le16(ra + 0x0C)?;
    let flags = p.le16(ra + 0x0E)?;
    Some((
        lsn,
        in_use == NO_CLIENT || flags & RESTART_VOLUME_IS_CLEAN != 0,
    ))
}

pub(crate) fn check(n: &Ntfs, r: &Region<'_>, record: u64) -> Result<LogState> {
    let rec = n.record(r, record)?;
    let a = n
        .attribute(r, &rec, AT_DATA, "")?
        .ok_or_else(|| corrupt("ntfs", "$LogFile has no data attribute"))?;
    let mut first = vec![0u8; 4096.min(a.data_size as usize)];
    n.read_stream(r, &a, 0, &mut first, "$LogFile")?;
    if first.len() < 512 {
        return Err(corrupt("ntfs", "$LogFile is shorter than a restart page"));
    }
    if first.iter().all(|&b| b == 0xFF) {
        return Ok(LogState {
            clean: true,
            note: "$LogFile empty (reset)".into(),
            pages: first,
        });
    }
    if first.get(0..4) != Some(b"RSTR") && first.get(0..4) != Some(b"CHKD") {
        return Err(corrupt(
            "ntfs",
            "$LogFile starts with neither a restart page nor the empty pattern",
        ));
    }
    let page = first.le32(0x10).unwrap_or(0) as u64;
    if !(512..=65536).contains(&page) || !page.is_power_of_two() || 2 * page > a.data_size {
        return Err(corrupt(
            "ntfs",
            format!("$LogFile system page size {page} is invalid"),
        ));
    }
    let mut pages = vec![0u8; 2 * page as usize];
    n.read_stream(r, &a, 0, &mut pages, "$LogFile")?;
    let p0 = restart_page(pages[..page as usize].to_vec());
    let p1 = restart_page(pages[page as usize..].to_vec());
    let best = match (p0, p1) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    };
    let Some((lsn, clean)) = best else {
        return Err(corrupt("ntfs", "$LogFile has no valid restart page"));
    };
    Ok(LogState {
        clean,
        note: format!(
            "$LogFile restart area {} (LSN {lsn})",
            if clean { "clean" } else { "in use" }
        ),
        pages,
    })
}
