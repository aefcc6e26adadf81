//! ext2/ext3/ext4: the opened volume, its read-only safety check, and free
//! space from the group descriptors and block bitmaps. The superblock is
//! `sb`'s, the descriptors and bitmaps `groups`', the journal `journal`'s;
//! this file sits above them.
//!
//! Layout notes (all little-endian): the superblock is 1024 bytes at byte
//! 1024 of the volume; group descriptors follow the superblock's block
//! (or, with `meta_bg`, sit at the start of each meta group); each group's
//! block bitmap has one bit per cluster (= block unless `bigalloc`). The
//! free set is what libext2fs (`e2freefrag`, `dumpe2fs`) computes:
//! clear bits of each bitmap, a `BLOCK_UNINIT` group (trusted only when
//! descriptor checksums are on, as libext2fs does) counting as all clear
//! except its superblock backup, descriptors and the group's own bitmaps
//! and inode table; padding bits past the last block ignored. On top of
//! that, every group's superblock backup, descriptor blocks, bitmaps and
//! inode table are always treated as in use, whatever a bitmap says.

pub mod csum;
mod groups;
mod journal;
mod sb;

use roamdisk_blockdev::Result;

use crate::bytes::{corrupt, sha256, text, uuid_text, Fields, Region};
use crate::volume::{FsKind, Health, Probe, Reason};

pub(crate) use groups::Desc;
pub use sb::has_magic;
use sb::{
    Super, COMPAT_HAS_JOURNAL, COMPAT_SPARSE_SUPER2, INCOMPAT_64BIT, INCOMPAT_FILETYPE,
    INCOMPAT_FLEX_BG, INCOMPAT_JOURNAL_DEV, INCOMPAT_KNOWN, INCOMPAT_META_BG, INCOMPAT_MMP,
    INCOMPAT_RECOVER, RO_COMPAT_BTREE_DIR, RO_COMPAT_GDT_CSUM, RO_COMPAT_HAS_SNAPSHOT,
    RO_COMPAT_KNOWN, RO_COMPAT_LARGE_FILE, RO_COMPAT_ORPHAN_PRESENT, RO_COMPAT_SPARSE_SUPER,
    STATE_ERROR, STATE_ORPHAN, STATE_VALID, SUPER_OFFSET, S_ERROR_COUNT, S_FEATURE_INCOMPAT,
    S_FEATURE_RO_COMPAT, S_FREE_BLOCKS_HI, S_FREE_BLOCKS_LO, S_JOURNAL_INUM, S_JOURNAL_UUID,
    S_MMP_BLOCK, S_STATE, S_UUID, S_VOLUME_NAME,
};

/// An opened ext2/3/4 volume: superblock and group descriptors.
pub(crate) struct Ext {
    pub sb: Super,
    pub descs: Vec<Desc>,
    kind: FsKind,
}

impl Ext {
    /// Parse the superblock in `head` and read the group descriptors.
    /// `Ok(Err(probe))` for ext volumes this crate must not interpret
    /// (external journal devices, unknown features).
    pub fn open(r: &Region<'_>, head: &[u8]) -> Result<std::result::Result<Ext, Probe>> {
        let raw = head
            .get(SUPER_OFFSET..SUPER_OFFSET + 1024)
            .ok_or_else(|| corrupt("ext", "the volume is too short to hold an ext superblock"))?;
        let identity = sha256(&[raw]);
        let incompat = raw.le32(S_FEATURE_INCOMPAT).unwrap_or(0);
        let ro = raw.le32(S_FEATURE_RO_COMPAT).unwrap_or(0);
        if incompat & INCOMPAT_JOURNAL_DEV != 0 {
            return Ok(Err(Probe::unsupported(
                "jbd",
                "an external ext3/ext4 journal device, not a file system".into(),
                identity,
            )));
        }
        if incompat & !INCOMPAT_KNOWN != 0 {
            return Ok(Err(Probe::unsupported(
                "ext4",
                format!(
                    "unknown incompatible features {:#x}: refusing to guess their on-disk meaning",
                    incompat & !INCOMPAT_KNOWN
                ),
                identity,
            )));
        }
        if ro & !RO_COMPAT_KNOWN != 0 || ro & RO_COMPAT_HAS_SNAPSHOT != 0 {
            return Ok(Err(Probe::unsupported(
                "ext4",
                format!(
                    "read-only-compatible features {:#x} not understood (or snapshots): refusing to guess",
                    ro & (!RO_COMPAT_KNOWN | RO_COMPAT_HAS_SNAPSHOT)
                ),
                identity,
            )));
        }
        let sb = Super::parse(raw, r.len)?;
        let kind = if incompat & !(INCOMPAT_FILETYPE | INCOMPAT_RECOVER | INCOMPAT_META_BG) != 0
            || ro & !(RO_COMPAT_SPARSE_SUPER | RO_COMPAT_LARGE_FILE | RO_COMPAT_BTREE_DIR) != 0
        {
            FsKind::Ext4
        } else if sb.compat & COMPAT_HAS_JOURNAL != 0 {
            FsKind::Ext3
        } else {
            FsKind::Ext2
        };
        let descs = groups::read_descriptors(r, &sb)?;
        Ok(Ok(Ext { sb, descs, kind }))
    }

    /// Identity, features and the safety verdict.
    pub fn probe(&self, r: &Region<'_>) -> Result<Probe> {
        let sb = &self.sb;
        let raw = &sb.raw;
        let state = raw.le16(S_STATE).unwrap_or(0);
        let errors = raw.le32(S_ERROR_COUNT).unwrap_or(0);
        let mut notes = vec![
            format!("block size {}", sb.block_size),
            format!("{} groups", sb.groups),
        ];
        if sb.cluster_bits > 0 {
            notes.push(format!(
                "bigalloc cluster {}",
                sb.block_size << sb.cluster_bits
            ));
        }
        for (bit, name) in [
            (sb.incompat & INCOMPAT_64BIT != 0, "64bit"),
            (sb.incompat & INCOMPAT_FLEX_BG != 0, "flex_bg"),
            (sb.meta_bg(), "meta_bg"),
            (sb.ro_compat & RO_COMPAT_SPARSE_SUPER != 0, "sparse_super"),
            (sb.compat & COMPAT_SPARSE_SUPER2 != 0, "sparse_super2"),
            (sb.metadata_csum(), "metadata_csum"),
            (sb.ro_compat & RO_COMPAT_GDT_CSUM != 0, "uninit_bg"),
            (sb.compat & COMPAT_HAS_JOURNAL != 0, "has_journal"),
        ] {
            if bit {
                notes.push(name.to_string());
            }
        }
        let free_sb = raw.le32(S_FREE_BLOCKS_LO).unwrap_or(0) as u64
            | if sb.incompat & INCOMPAT_64BIT != 0 {
                (raw.le32(S_FREE_BLOCKS_HI).unwrap_or(0) as u64) << 32
            } else {
                0
            };
        notes.push(format!("superblock free count {free_sb}"));
        let health = if state & STATE_ERROR != 0 || errors != 0 {
            Health::unsafe_(
                Reason::ErrorsRecorded,
                format!("the file system has recorded errors (state {state:#x}, error count {errors}): run e2fsck on the host first"),
            )
        } else if state & STATE_VALID == 0 || state & STATE_ORPHAN != 0 {
            Health::unsafe_(
                Reason::NotClean,
                format!("not cleanly unmounted (s_state {state:#x}): the host crashed or is still running; boot it and shut down cleanly, or run e2fsck"),
            )
        } else if sb.ro_compat & RO_COMPAT_ORPHAN_PRESENT != 0 {
            Health::unsafe_(
                Reason::NotClean,
                "the orphan file holds entries (orphan_present): not cleanly unmounted",
            )
        } else if sb.incompat & INCOMPAT_RECOVER != 0 {
            Health::unsafe_(
                Reason::NeedsRecovery,
                "the journal needs recovery (needs_recovery flag): the file system is mounted or crashed",
            )
        } else if let Some(h) = self.mmp_state(r)? {
            h
        } else {
            journal::check(r, sb, &self.descs)?.unwrap_or(Health::Clean)
        };
        let uuid: [u8; 16] = raw[S_UUID..S_UUID + 16].try_into().expect("16");
        let journal_uuid: [u8; 16] = raw[S_JOURNAL_UUID..S_JOURNAL_UUID + 16]
            .try_into()
            .expect("16");
        if sb.compat & COMPAT_HAS_JOURNAL != 0
            && raw.le32(S_JOURNAL_INUM) == Some(0)
            && journal_uuid != [0; 16]
        {
            notes.push(format!(
                "external journal {} (only the needs_recovery flag is checked)",
                uuid_text(&journal_uuid)
            ));
        }
        Ok(Probe {
            kind: self.kind,
            type_name: match self.kind {
                FsKind::Ext2 => "ext2",
                FsKind::Ext3 => "ext3",
                _ => "ext4",
            }
            .to_string(),
            uuid: Some(uuid_text(&uuid)),
            label: text(&raw[S_VOLUME_NAME..S_VOLUME_NAME + 16]),
            unit: sb.block_size << sb.cluster_bits,
            fs_bytes: sb.blocks_count * sb.block_size,
            health,
            notes,
            identity: sha256(&[raw]),
        })
    }

    /// Multi-mount protection: the MMP block says whether a node has the
    /// volume open.
    fn mmp_state(&self, r: &Region<'_>) -> Result<Option<Health>> {
        if self.sb.incompat & INCOMPAT_MMP == 0 {
            return Ok(None);
        }
        let blk = self.sb.raw.le64(S_MMP_BLOCK).unwrap_or(0);
        if blk == 0 || blk >= self.sb.blocks_count {
            return Err(corrupt(
                "ext",
                format!("MMP block {blk} is outside the file system"),
            ));
        }
        let b = r.read_vec("ext", blk * self.sb.block_size, 16)?;
        if b.le32(0) != Some(0x004D_4D50) {
            return Err(corrupt("ext", "the MMP block has a bad magic"));
        }
        Ok(match b.le32(4).unwrap_or(0) {
            0xFF4D_4D50 => None,
            0xE24D_4D50 => Some(Health::unsafe_(
                Reason::MmpInUse,
                "multi-mount protection says e2fsck is running on this file system",
            )),
            seq => Some(Health::unsafe_(
                Reason::MmpInUse,
                format!(
                    "multi-mount protection says the file system is in use (sequence {seq:#x})"
                ),
            )),
        })
    }

    /// Stream the free extents.
    pub fn free(&self, r: &Region<'_>, m: &mut crate::extent::Merger<'_>) -> Result<()> {
        groups::scan_free(r, &self.sb, &self.descs, m)
    }
}
