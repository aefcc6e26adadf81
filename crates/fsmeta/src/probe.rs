//! What a byte range holds: file-system detection by signature, the
//! read-only safety verdict, and the free-space scan dispatched to the
//! parser of each supported kind.

use roamdisk_blockdev::{BlockDev, Result};
use serde::Serialize;

use crate::bytes::Region;
use crate::extent::{Extent, Merger};
use crate::volume::Probe;
use crate::{ext, ntfs, signatures, swap};

/// Free space of a volume: its probe, the free extents in increasing
/// order (absolute byte ranges of the device, touching ones merged) and
/// their total.
#[derive(Debug, Clone, Serialize)]
pub struct FreeSpace {
    pub probe: Probe,
    pub free_bytes: u64,
    pub extents: Vec<Extent>,
}

/// Identify the file system in `[start, start + len)` of `dev` and run
/// its read-only safety check.
pub fn probe(dev: &dyn BlockDev, start: u64, len: u64) -> Result<Probe> {
    let r = Region::new(dev, start, len)?;
    detect(&r)?.probe(&r)
}

/// Identify and check the volume, then call `f` with each free extent in
/// increasing order (touching extents merged); returns the probe and the
/// free total. Unsupported volumes yield no extents.
///
/// Extents of an unsafe volume (health not clean) come from its on-disk
/// allocation map, which may be stale: use them only when the health is
/// clean.
pub fn for_each_free_extent(
    dev: &dyn BlockDev,
    start: u64,
    len: u64,
    f: &mut dyn FnMut(Extent),
) -> Result<(Probe, u64)> {
    let r = Region::new(dev, start, len)?;
    let d = detect(&r)?;
    let probe = d.probe(&r)?;
    let mut m = Merger::new(f);
    if probe.supported() {
        d.free(&r, &mut m)?;
    }
    let total = m.finish();
    Ok((probe, total))
}

/// [`for_each_free_extent`] collected into a list.
pub fn free_space(dev: &dyn BlockDev, start: u64, len: u64) -> Result<FreeSpace> {
    let mut extents = Vec::new();
    let (probe, free_bytes) = for_each_free_extent(dev, start, len, &mut |e| extents.push(e))?;
    Ok(FreeSpace {
        probe,
        free_bytes,
        extents,
    })
}

/// A recognised volume, before its full check.
pub(crate) enum Detected {
    Ext(Box<ext::Ext>),
    Ntfs(Box<ntfs::Ntfs>),
    Swap(swap::Swap),
    Other(Probe),
}

impl Detected {
    fn probe(&self, r: &Region<'_>) -> Result<Probe> {
        match self {
            Detected::Ext(e) => e.probe(r),
            Detected::Ntfs(n) => n.probe(r),
            Detected::Swap(s) => Ok(s.probe()),
            Detected::Other(p) => Ok(p.clone()),
        }
    }

    fn free(&self, r: &Region<'_>, m: &mut Merger<'_>) -> Result<()> {
        match self {
            Detected::Ext(e) => e.free(r, m),
            Detected::Ntfs(n) => n.free(r, m),
            Detected::Swap(s) => {
                s.free(r.start, m);
                Ok(())
            }
            Detected::Other(_) => Ok(()),
        }
    }
}

/// Look at the signatures of every kind. More than one supported match is
/// refused (a stale signature of one file system left under another would
/// otherwise be a guess).
pub(crate) fn detect(r: &Region<'_>) -> Result<Detected> {
    // The first 68 KiB hold every signature looked at here.
    let head_len = r.len.min(68 * 1024) as usize;
    let head = r.read_vec("probe", 0, head_len)?;
    let identity = crate::bytes::sha256(&[&head[..head.len().min(4096)]]);
    let is_ext = ext::has_magic(&head);
    let is_ntfs = ntfs::has_magic(&head);
    let is_swap = swap::signature(&head).is_some();
    let found: Vec<&str> = [(is_ext, "ext"), (is_ntfs, "ntfs"), (is_swap, "swap")]
        .iter()
        .filter(|(b, _)| *b)
        .map(|(_, n)| *n)
        .collect();
    if found.len() > 1 {
        return Ok(Detected::Other(Probe::unsupported(
            "ambiguous",
            format!(
                "signatures of {} found together: refusing to guess which one is live",
                found.join(" and ")
            ),
            identity,
        )));
    }
    if is_ext {
        return match ext::Ext::open(r, &head)? {
            Ok(e) => Ok(Detected::Ext(Box::new(e))),
            Err(p) => Ok(Detected::Other(p)),
        };
    }
    if is_ntfs {
        return Ok(Detected::Ntfs(Box::new(ntfs::Ntfs::open(r, &head)?)));
    }
    if is_swap {
        return match swap::Swap::open(r, &head)? {
            Ok(s) => Ok(Detected::Swap(s)),
            Err(p) => Ok(Detected::Other(p)),
        };
    }
    let (name, detail) = signatures::identify(&head);
    Ok(Detected::Other(Probe::unsupported(name, detail, identity)))
}
