//! ext2/ext3/ext4: the superblock, the read-only safety check, and free
//! space from the group descriptors and block bitmaps.
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

use roamdisk_blockdev::Result;

use crate::bytes::{corrupt, sha256, text, uuid_text, Fields, Region};
use crate::probe::{FsKind, Health, Probe, Reason};

pub(crate) use groups::Desc;

/// Byte offset of the superblock in the volume.
pub const SUPER_OFFSET: usize = 1024;
/// `s_magic`.
pub const MAGIC: u16 = 0xEF53;

// Superblock field offsets.
const S_INODES_COUNT: usize = 0x00;
const S_BLOCKS_COUNT_LO: usize = 0x04;
const S_FREE_BLOCKS_LO: usize = 0x0C;
const S_FIRST_DATA_BLOCK: usize = 0x14;
const S_LOG_BLOCK_SIZE: usize = 0x18;
const S_LOG_CLUSTER_SIZE: usize = 0x1C;
const S_BLOCKS_PER_GROUP: usize = 0x20;
const S_CLUSTERS_PER_GROUP: usize = 0x24;
const S_INODES_PER_GROUP: usize = 0x28;
const S_MAGIC: usize = 0x38;
const S_STATE: usize = 0x3A;
const S_REV_LEVEL: usize = 0x4C;
const S_INODE_SIZE: usize = 0x58;
const S_FEATURE_COMPAT: usize = 0x5C;
const S_FEATURE_INCOMPAT: usize = 0x60;
const S_FEATURE_RO_COMPAT: usize = 0x64;
const S_UUID: usize = 0x68;
const S_VOLUME_NAME: usize = 0x78;
const S_RESERVED_GDT_BLOCKS: usize = 0xCE;
const S_JOURNAL_UUID: usize = 0xD0;
const S_JOURNAL_INUM: usize = 0xE0;
const S_DESC_SIZE: usize = 0xFE;
const S_FIRST_META_BG: usize = 0x104;
const S_BLOCKS_COUNT_HI: usize = 0x150;
const S_FREE_BLOCKS_HI: usize = 0x158;
const S_MMP_BLOCK: usize = 0x168;
const S_CHECKSUM_TYPE: usize = 0x175;
const S_ERROR_COUNT: usize = 0x194;
const S_BACKUP_BGS: usize = 0x24C;
const S_CHECKSUM_SEED: usize = 0x270;
const S_CHECKSUM: usize = 0x3FC;

// s_state bits.
const STATE_VALID: u16 = 0x0001;
const STATE_ERROR: u16 = 0x0002;
const STATE_ORPHAN: u16 = 0x0004;

// Feature bits.
pub(crate) const COMPAT_HAS_JOURNAL: u32 = 0x0004;
pub(crate) const COMPAT_SPARSE_SUPER2: u32 = 0x0200;
const INCOMPAT_FILETYPE: u32 = 0x0002;
pub(crate) const INCOMPAT_RECOVER: u32 = 0x0004;
const INCOMPAT_JOURNAL_DEV: u32 = 0x0008;
pub(crate) const INCOMPAT_META_BG: u32 = 0x0010;
pub(crate) const INCOMPAT_64BIT: u32 = 0x0080;
const INCOMPAT_MMP: u32 = 0x0100;
pub(crate) const INCOMPAT_FLEX_BG: u32 = 0x0200;
const INCOMPAT_CSUM_SEED: u32 = 0x2000;
/// Every incompat feature whose meaning for the allocation map is known
/// (compression, filetype, recover, journal_dev, meta_bg, extents, 64bit,
/// mmp, flex_bg, ea_inode, dirdata, csum_seed, largedir, inline_data,
/// encrypt, casefold).
const INCOMPAT_KNOWN: u32 = 0x0001
    | 0x0002
    | 0x0004
    | 0x0008
    | 0x0010
    | 0x0040
    | 0x0080
    | 0x0100
    | 0x0200
    | 0x0400
    | 0x1000
    | 0x2000
    | 0x4000
    | 0x8000
    | 0x10000
    | 0x20000;
pub(crate) const RO_COMPAT_SPARSE_SUPER: u32 = 0x0001;
const RO_COMPAT_LARGE_FILE: u32 = 0x0002;
const RO_COMPAT_BTREE_DIR: u32 = 0x0004;
pub(crate) const RO_COMPAT_GDT_CSUM: u32 = 0x0010;
const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x0080;
pub(crate) const RO_COMPAT_BIGALLOC: u32 = 0x0200;
pub(crate) const RO_COMPAT_METADATA_CSUM: u32 = 0x0400;
const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;
/// sparse_super .. orphan_present, all understood.
const RO_COMPAT_KNOWN: u32 = 0x1FFFF;

/// True when `head` (the volume's first bytes) carries the ext magic.
pub fn has_magic(head: &[u8]) -> bool {
    head.le16(SUPER_OFFSET + S_MAGIC) == Some(MAGIC)
}

/// A validated superblock.
pub(crate) struct Super {
    pub raw: Vec<u8>,
    pub block_size: u64,
    /// log2(blocks per cluster).
    pub cluster_bits: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u64,
    pub clusters_per_group: u64,
    pub inodes_per_group: u64,
    pub inode_size: u64,
    pub groups: u64,
    pub desc_size: u64,
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
    pub reserved_gdt: u64,
    pub first_meta_bg: u64,
    pub backup_bgs: [u64; 2],
    pub csum_seed: u32,
}

impl Super {
    pub fn has_csum(&self) -> bool {
        self.ro_compat & (RO_COMPAT_GDT_CSUM | RO_COMPAT_METADATA_CSUM) != 0
    }
    pub fn metadata_csum(&self) -> bool {
        self.ro_compat & RO_COMPAT_METADATA_CSUM != 0
    }
    pub fn meta_bg(&self) -> bool {
        self.incompat & INCOMPAT_META_BG != 0
    }
    pub fn desc_per_block(&self) -> u64 {
        self.block_size / self.desc_size
    }
    pub fn desc_blocks(&self) -> u64 {
        self.groups.div_ceil(self.desc_per_block())
    }
    pub fn inode_table_blocks(&self) -> u64 {
        (self.inodes_per_group * self.inode_size).div_ceil(self.block_size)
    }
    pub fn group_first_block(&self, g: u64) -> u64 {
        self.first_data_block + g * self.blocks_per_group
    }
    pub fn group_last_block(&self, g: u64) -> u64 {
        if g + 1 == self.groups {
            self.blocks_count - 1
        } else {
            self.group_first_block(g) + self.blocks_per_group - 1
        }
    }

    /// `ext2fs_bg_has_super`: whether group `g` holds a superblock copy.
    pub fn has_super(&self, g: u64) -> bool {
        if g == 0 {
            return true;
        }
        if self.compat & COMPAT_SPARSE_SUPER2 != 0 {
            return g == self.backup_bgs[0] || g == self.backup_bgs[1];
        }
        if g <= 1 || self.ro_compat & RO_COMPAT_SPARSE_SUPER == 0 {
            return true;
        }
        if g & 1 == 0 {
            return false;
        }
        let power_of = |b: u64| {
            let mut n = b;
            while n < g {
                n = n.saturating_mul(b);
            }
            n == g
        };
        power_of(3) || power_of(5) || power_of(7)
    }

    fn parse(sb: &[u8], region_len: u64) -> std::result::Result<Super, String> {
        let f32 = |o| sb.le32(o).unwrap_or(0);
        let log_block = f32(S_LOG_BLOCK_SIZE);
        if log_block > 6 {
            return Err(format!("block size 1024 << {log_block} is over 64 KiB"));
        }
        let block_size = 1024u64 << log_block;
        let compat = f32(S_FEATURE_COMPAT);
        let incompat = f32(S_FEATURE_INCOMPAT);
        let ro_compat = f32(S_FEATURE_RO_COMPAT);
        let log_cluster = f32(S_LOG_CLUSTER_SIZE);
        let bigalloc = ro_compat & RO_COMPAT_BIGALLOC != 0;
        let cluster_bits = if bigalloc {
            if log_cluster < log_block || log_cluster - log_block > 16 {
                return Err(format!(
                    "bigalloc cluster size 1024 << {log_cluster} does not fit block size {block_size}"
                ));
            }
            log_cluster - log_block
        } else {
            if log_cluster != log_block {
                return Err(format!(
                    "cluster size 1024 << {log_cluster} differs from the block size without bigalloc"
                ));
            }
            0
        };
        let is64 = incompat & INCOMPAT_64BIT != 0;
        let blocks_count = f32(S_BLOCKS_COUNT_LO) as u64
            | if is64 {
                (f32(S_BLOCKS_COUNT_HI) as u64) << 32
            } else {
                0
            };
        let first_data_block = f32(S_FIRST_DATA_BLOCK) as u64;
        let want_first = u64::from(block_size == 1024 && !bigalloc);
        if first_data_block != want_first {
            return Err(format!(
                "first data block is {first_data_block}, expected {want_first} for {block_size}-byte blocks"
            ));
        }
        if blocks_count <= first_data_block {
            return Err(format!("block count {blocks_count} is too small"));
        }
        let bytes = blocks_count
            .checked_mul(block_size)
            .ok_or("block count overflows")?;
        if bytes > region_len {
            return Err(format!(
                "the file system is {bytes} bytes but its partition only {region_len}: truncated image or wrong partition table"
            ));
        }
        let clusters_per_group = f32(S_CLUSTERS_PER_GROUP) as u64;
        let blocks_per_group = f32(S_BLOCKS_PER_GROUP) as u64;
        if clusters_per_group == 0
            || !clusters_per_group.is_multiple_of(8)
            || clusters_per_group > 8 * block_size
        {
            return Err(format!(
                "{clusters_per_group} clusters per group does not fit one bitmap block"
            ));
        }
        if blocks_per_group != clusters_per_group << cluster_bits {
            return Err(format!(
                "{blocks_per_group} blocks per group is inconsistent with {clusters_per_group} clusters per group"
            ));
        }
        let groups = (blocks_count - first_data_block).div_ceil(blocks_per_group);
        if groups > u32::MAX as u64 {
            return Err(format!("{groups} block groups is too many"));
        }
        let inodes_per_group = f32(S_INODES_PER_GROUP) as u64;
        if inodes_per_group == 0 || inodes_per_group > 8 * block_size {
            return Err(format!("{inodes_per_group} inodes per group is invalid"));
        }
        if f32(S_INODES_COUNT) as u64 != inodes_per_group * groups {
            return Err(format!(
                "inode count {} is not {inodes_per_group} per group x {groups} groups",
                f32(S_INODES_COUNT)
            ));
        }
        let inode_size = if f32(S_REV_LEVEL) == 0 {
            128
        } else {
            sb.le16(S_INODE_SIZE).unwrap_or(0) as u64
        };
        if inode_size < 128 || !inode_size.is_power_of_two() || inode_size > block_size {
            return Err(format!("inode size {inode_size} is invalid"));
        }
        let desc_size = if is64 {
            let d = sb.le16(S_DESC_SIZE).unwrap_or(0) as u64;
            if d < 64 || !d.is_power_of_two() || d > 1024 {
                return Err(format!("64bit descriptor size {d} is invalid"));
            }
            d
        } else {
            32
        };
        let metadata_csum = ro_compat & RO_COMPAT_METADATA_CSUM != 0;
        if metadata_csum {
            if sb.u8_at(S_CHECKSUM_TYPE) != Some(1) {
                return Err("unknown superblock checksum type".into());
            }
            let want = sb.le32(S_CHECKSUM).unwrap_or(0);
            let got = csum::crc32c_raw(!0, &sb[..S_CHECKSUM]);
            if want != got {
                return Err(format!(
                    "superblock checksum mismatch (stored {want:#010x}, computed {got:#010x})"
                ));
            }
        }
        let uuid: [u8; 16] = sb[S_UUID..S_UUID + 16].try_into().expect("16");
        let csum_seed = if incompat & INCOMPAT_CSUM_SEED != 0 {
            f32(S_CHECKSUM_SEED)
        } else {
            csum::crc32c_raw(!0, &uuid)
        };
        Ok(Super {
            raw: sb.to_vec(),
            block_size,
            cluster_bits,
            blocks_count,
            first_data_block,
            blocks_per_group,
            clusters_per_group,
            inodes_per_group,
            inode_size,
            groups,
            desc_size,
            compat,
            incompat,
            ro_compat,
            reserved_gdt: sb.le16(S_RESERVED_GDT_BLOCKS).unwrap_or(0) as u64,
            first_meta_bg: f32(S_FIRST_META_BG) as u64,
            backup_bgs: [f32(S_BACKUP_BGS) as u64, f32(S_BACKUP_BGS + 4) as u64],
            csum_seed,
        })
    }
}

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
        let sb = Super::parse(raw, r.len).map_err(|m| corrupt("ext", m))?;
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
            journal::check(r, self)?.unwrap_or(Health::Clean)
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
        groups::scan_free(r, self, m)
    }
}
