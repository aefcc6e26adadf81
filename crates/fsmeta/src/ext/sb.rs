//! The ext superblock: its field offsets and feature flags, and
//! [`Super`], the validated superblock with the geometry derived from it.
//! Below the group descriptors, the journal check and the volume
//! (`ext/mod.rs`), which all read it.

use roamdisk_blockdev::Result;

use super::csum;
use crate::bytes::{corrupt, Fields};

/// Byte offset of the superblock in the volume.
pub const SUPER_OFFSET: usize = 1024;
/// `s_magic`.
pub const MAGIC: u16 = 0xEF53;

// Superblock field offsets.
pub(crate) const S_INODES_COUNT: usize = 0x00;
pub(crate) const S_BLOCKS_COUNT_LO: usize = 0x04;
pub(crate) const S_FREE_BLOCKS_LO: usize = 0x0C;
pub(crate) const S_FIRST_DATA_BLOCK: usize = 0x14;
pub(crate) const S_LOG_BLOCK_SIZE: usize = 0x18;
pub(crate) const S_LOG_CLUSTER_SIZE: usize = 0x1C;
pub(crate) const S_BLOCKS_PER_GROUP: usize = 0x20;
pub(crate) const S_CLUSTERS_PER_GROUP: usize = 0x24;
pub(crate) const S_INODES_PER_GROUP: usize = 0x28;
pub(crate) const S_MAGIC: usize = 0x38;
pub(crate) const S_STATE: usize = 0x3A;
pub(crate) const S_REV_LEVEL: usize = 0x4C;
pub(crate) const S_INODE_SIZE: usize = 0x58;
pub(crate) const S_FEATURE_COMPAT: usize = 0x5C;
pub(crate) const S_FEATURE_INCOMPAT: usize = 0x60;
pub(crate) const S_FEATURE_RO_COMPAT: usize = 0x64;
pub(crate) const S_UUID: usize = 0x68;
pub(crate) const S_VOLUME_NAME: usize = 0x78;
pub(crate) const S_RESERVED_GDT_BLOCKS: usize = 0xCE;
pub(crate) const S_JOURNAL_UUID: usize = 0xD0;
pub(crate) const S_JOURNAL_INUM: usize = 0xE0;
pub(crate) const S_DESC_SIZE: usize = 0xFE;
pub(crate) const S_FIRST_META_BG: usize = 0x104;
pub(crate) const S_BLOCKS_COUNT_HI: usize = 0x150;
pub(crate) const S_FREE_BLOCKS_HI: usize = 0x158;
pub(crate) const S_MMP_BLOCK: usize = 0x168;
pub(crate) const S_CHECKSUM_TYPE: usize = 0x175;
pub(crate) const S_ERROR_COUNT: usize = 0x194;
pub(crate) const S_BACKUP_BGS: usize = 0x24C;
pub(crate) const S_CHECKSUM_SEED: usize = 0x270;
pub(crate) const S_CHECKSUM: usize = 0x3FC;

// s_state bits.
pub(crate) const STATE_VALID: u16 = 0x0001;
pub(crate) const STATE_ERROR: u16 = 0x0002;
pub(crate) const STATE_ORPHAN: u16 = 0x0004;

// Feature bits.
pub(crate) const COMPAT_HAS_JOURNAL: u32 = 0x0004;
pub(crate) const COMPAT_SPARSE_SUPER2: u32 = 0x0200;
pub(crate) const INCOMPAT_FILETYPE: u32 = 0x0002;
pub(crate) const INCOMPAT_RECOVER: u32 = 0x0004;
pub(crate) const INCOMPAT_JOURNAL_DEV: u32 = 0x0008;
pub(crate) const INCOMPAT_META_BG: u32 = 0x0010;
pub(crate) const INCOMPAT_64BIT: u32 = 0x0080;
pub(crate) const INCOMPAT_MMP: u32 = 0x0100;
pub(crate) const INCOMPAT_FLEX_BG: u32 = 0x0200;
pub(crate) const INCOMPAT_CSUM_SEED: u32 = 0x2000;
/// Every incompat feature whose meaning for the allocation map is known
/// (compression, filetype, recover, journal_dev, meta_bg, extents, 64bit,
/// mmp, flex_bg, ea_inode, dirdata, csum_seed, largedir, inline_data,
/// encrypt, casefold).
pub(crate) const INCOMPAT_KNOWN: u32 = 0x0001
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
pub(crate) const RO_COMPAT_LARGE_FILE: u32 = 0x0002;
pub(crate) const RO_COMPAT_BTREE_DIR: u32 = 0x0004;
pub(crate) const RO_COMPAT_GDT_CSUM: u32 = 0x0010;
pub(crate) const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x0080;
pub(crate) const RO_COMPAT_BIGALLOC: u32 = 0x0200;
pub(crate) const RO_COMPAT_METADATA_CSUM: u32 = 0x0400;
pub(crate) const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;
/// sparse_super .. orphan_present, all understood.
pub(crate) const RO_COMPAT_KNOWN: u32 = 0x1FFFF;

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

    /// Validate and parse the superblock `sb` of a volume of `region_len`
    /// bytes; what does not fit is a `Corrupt` error that says why.
    pub(crate) fn parse(sb: &[u8], region_len: u64) -> Result<Super> {
        let bad = |m: String| corrupt("ext", m);
        let f32 = |o| sb.le32(o).unwrap_or(0);
        let log_block = f32(S_LOG_BLOCK_SIZE);
        if log_block > 6 {
            return Err(bad(format!(
                "block size 1024 << {log_block} is over 64 KiB"
            )));
        }
        let block_size = 1024u64 << log_block;
        let compat = f32(S_FEATURE_COMPAT);
        let incompat = f32(S_FEATURE_INCOMPAT);
        let ro_compat = f32(S_FEATURE_RO_COMPAT);
        let log_cluster = f32(S_LOG_CLUSTER_SIZE);
        let bigalloc = ro_compat & RO_COMPAT_BIGALLOC != 0;
        let cluster_bits = if bigalloc {
            if log_cluster < log_block || log_cluster - log_block > 16 {
                return Err(bad(format!(
                    "bigalloc cluster size 1024 << {log_cluster} does not fit block size {block_size}"
                )));
            }
            log_cluster - log_block
        } else {
            if log_cluster != log_block {
                return Err(bad(format!(
                    "cluster size 1024 << {log_cluster} differs from the block size without bigalloc"
                )));
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
            return Err(bad(format!(
                "first data block is {first_data_block}, expected {want_first} for {block_size}-byte blocks"
            )));
        }
        if blocks_count <= first_data_block {
            return Err(bad(format!("block count {blocks_count} is too small")));
        }
        let bytes = blocks_count
            .checked_mul(block_size)
            .ok_or_else(|| bad("block count overflows".into()))?;
        if bytes > region_len {
            return Err(bad(format!(
                "the file system is {bytes} bytes but its partition only {region_len}: truncated image or wrong partition table"
            )));
        }
        let clusters_per_group = f32(S_CLUSTERS_PER_GROUP) as u64;
        let blocks_per_group = f32(S_BLOCKS_PER_GROUP) as u64;
        if clusters_per_group == 0
            || !clusters_per_group.is_multiple_of(8)
            || clusters_per_group > 8 * block_size
        {
            return Err(bad(format!(
                "{clusters_per_group} clusters per group does not fit one bitmap block"
            )));
        }
        if blocks_per_group != clusters_per_group << cluster_bits {
            return Err(bad(format!(
                "{blocks_per_group} blocks per group is inconsistent with {clusters_per_group} clusters per group"
            )));
        }
        let groups = (blocks_count - first_data_block).div_ceil(blocks_per_group);
        if groups > u32::MAX as u64 {
            return Err(bad(format!("{groups} block groups is too many")));
        }
        let inodes_per_group = f32(S_INODES_PER_GROUP) as u64;
        if inodes_per_group == 0 || inodes_per_group > 8 * block_size {
            return Err(bad(format!(
                "{inodes_per_group} inodes per group is invalid"
            )));
        }
        if f32(S_INODES_COUNT) as u64 != inodes_per_group * groups {
            return Err(bad(format!(
                "inode count {} is not {inodes_per_group} per group x {groups} groups",
                f32(S_INODES_COUNT)
            )));
        }
        let inode_size = if f32(S_REV_LEVEL) == 0 {
            128
        } else {
            sb.le16(S_INODE_SIZE).unwrap_or(0) as u64
        };
        if inode_size < 128 || !inode_size.is_power_of_two() || inode_size > block_size {
            return Err(bad(format!("inode size {inode_size} is invalid")));
        }
        let desc_size = if is64 {
            let d = sb.le16(S_DESC_SIZE).unwrap_or(0) as u64;
            if d < 64 || !d.is_power_of_two() || d > 1024 {
                return Err(bad(format!("64bit descriptor size {d} is invalid")));
            }
            d
        } else {
            32
        };
        let metadata_csum = ro_compat & RO_COMPAT_METADATA_CSUM != 0;
        if metadata_csum {
            if sb.u8_at(S_CHECKSUM_TYPE) != Some(1) {
                return Err(bad("unknown superblock checksum type".into()));
            }
            let want = sb.le32(S_CHECKSUM).unwrap_or(0);
            let got = csum::crc32c_raw(!0, &sb[..S_CHECKSUM]);
            if want != got {
                return Err(bad(format!(
                    "superblock checksum mismatch (stored {want:#010x}, computed {got:#010x})"
                )));
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
