//! What the guest's own metadata says about its disk, for the useful-update
//! filters P2 (clusters the guest file system marks free) and P3 (guest
//! swap). The readers of partition tables, file-system bitmaps and swap
//! headers live in `roamdisk-fsmeta`; this module turns what they find
//! into byte regions and looks sectors up in them.

use roamdisk_blockdev::{BlockDev, Result};

/// Byte regions of a guest disk, sorted and merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Regions {
    /// (offset, length) pairs, sorted, non-overlapping.
    extents: Vec<(u64, u64)>,
}

impl Regions {
    /// Build from unsorted, possibly overlapping extents.
    pub fn new(mut v: Vec<(u64, u64)>) -> Regions {
        v.retain(|e| e.1 > 0);
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (o, l) in v {
            match out.last_mut() {
                Some((po, pl)) if o <= *po + *pl => *pl = (*pl).max(o + l - *po),
                _ => out.push((o, l)),
            }
        }
        Regions { extents: out }
    }

    /// Whether the whole range `[off, off+len)` lies inside the regions.
    pub fn covers(&self, off: u64, len: u64) -> bool {
        let i = self.extents.partition_point(|e| e.0 + e.1 <= off);
        self.extents
            .get(i)
            .is_some_and(|&(o, l)| o <= off && off + len <= o + l)
    }

    pub fn total(&self) -> u64 {
        self.extents.iter().map(|e| e.1).sum()
    }

    pub fn extents(&self) -> &[(u64, u64)] {
        &self.extents
    }
}

/// Regions of a guest disk that hold no useful data.
#[derive(Debug, Clone, Default)]
pub struct GuestRegions {
    /// Free clusters of the guest's file systems (P2).
    pub free: Regions,
    /// Guest swap (P3), header pages excluded.
    pub swap: Regions,
    /// What was found or skipped, for the user.
    pub notes: Vec<String>,
}

/// Finds free space and swap inside a guest disk.
pub trait GuestAnalyzer: Sync {
    fn analyze(&self, dev: &dyn BlockDev) -> Result<GuestRegions>;
}

/// An analyzer that finds nothing (P2 and P3 then drop nothing).
pub struct NoAnalyzer;

impl GuestAnalyzer for NoAnalyzer {
    fn analyze(&self, _dev: &dyn BlockDev) -> Result<GuestRegions> {
        Ok(GuestRegions {
            notes: vec!["P2/P3: no guest file-system reader in this build".into()],
            ..Default::default()
        })
    }
}

/// The analyzer over `roamdisk-fsmeta`: partitions (MBR/GPT, or the
/// whole disk), ext2/3/4 block bitmaps and NTFS `$Bitmap` for P2, Linux
/// swap areas for P3. A file system whose metadata cannot be trusted (not
/// cleanly unmounted, errors recorded, journal to replay, hibernated) is
/// left alone, and said so.
pub struct FsmetaAnalyzer;

/// Swap partition types (MBR 0x82, the GPT Linux swap GUID).
fn is_swap_type(p: &roamdisk_fsmeta::Partition) -> bool {
    p.type_name == "Linux swap"
}

impl GuestAnalyzer for FsmetaAnalyzer {
    fn analyze(&self, dev: &dyn BlockDev) -> Result<GuestRegions> {
        use roamdisk_fsmeta::FsKind;
        let mut free = Vec::new();
        let mut swap = Vec::new();
        let mut notes = Vec::new();
        let parts = roamdisk_fsmeta::partitions(dev)?;
        for p in &parts {
            let what = if p.number == 0 {
                "the disk".to_string()
            } else {
                format!("partition {}", p.number)
            };
            let fs = match roamdisk_fsmeta::free_space(dev, p.start, p.len) {
                Ok(f) => f,
                Err(e) => {
                    notes.push(format!("{what}: metadata unreadable ({e}); P2/P3 skip it"));
                    continue;
                }
            };
            let pr = &fs.probe;
            match pr.kind {
                FsKind::Swap if pr.health.is_clean() => {
                    notes.push(format!(
                        "{what}: Linux swap, {} of pages ignored (P3)",
                        roamdisk_blockdev::units::format_size(fs.free_bytes)
                    ));
                    swap.extend(fs.extents.iter().map(|e| (e.start, e.len)));
                }
                FsKind::Swap => notes.push(format!(
                    "{what}: swap holds a hibernation image; kept (P3 skips it)"
                )),
                FsKind::Unsupported if is_swap_type(p) && pr.type_name == "empty" => {
                    // A swap partition the guest wiped, header and all:
                    // everything but the first page is swap space.
                    let page = 4096.min(p.len);
                    notes.push(format!(
                        "{what}: swap partition without a swap header; its pages are ignored (P3)"
                    ));
                    swap.push((p.start + page, p.len - page));
                }
                FsKind::Unsupported => notes.push(format!(
                    "{what}: {} is not read (P2 keeps its writes)",
                    pr.type_name
                )),
                _ if !pr.health.is_clean() => {
                    let why = match &pr.health {
                        roamdisk_fsmeta::Health::Unsafe { reason, detail } => {
                            format!("{}: {detail}", reason.as_str())
                        }
                        roamdisk_fsmeta::Health::Clean => String::new(),
                    };
                    notes.push(format!(
                        "{what}: {} in use or not clean ({why}), as in a running or suspended guest; P2 keeps every write there (after a clean shutdown it drops writes to free clusters)",
                        pr.type_name
                    ));
                }
                _ => {
                    notes.push(format!(
                        "{what}: {}, {} free (P2)",
                        pr.type_name,
                        roamdisk_blockdev::units::format_size(fs.free_bytes)
                    ));
                    free.extend(fs.extents.iter().map(|e| (e.start, e.len)));
                }
            }
        }
        Ok(GuestRegions {
            free: Regions::new(free),
            swap: Regions::new(swap),
            notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_merge_and_cover() {
        let r = Regions::new(vec![(100, 50), (0, 10), (140, 20), (10, 5)]);
        assert_eq!(r.extents(), &[(0, 15), (100, 60)]);
        assert!(r.covers(0, 15));
        assert!(!r.covers(0, 16));
        assert!(r.covers(120, 40));
        assert!(!r.covers(90, 20));
        assert!(!r.covers(200, 1));
        assert_eq!(r.total(), 75);
    }
}
