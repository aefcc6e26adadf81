//! The internal journal: find its first block through the journal inode
//! (extent tree or block map) and read the JBD2 superblock, whose
//! `s_start` is nonzero while transactions wait to be replayed. A crashed
//! or mounted volume can show `s_state` clean together with this, so it
//! is checked in addition to the `needs_recovery` flag.
//!
//! Inode: flags u32 @0x20 (EXTENTS = 0x80000), i_block [60] @0x28. Extent
//! header (12 bytes): magic u16 0xF30A, entries u16, max u16, depth u16;
//! leaf entries: first logical u32, length u16, start hi u16, start lo
//! u32; index entries: first logical u32, leaf lo u32, leaf hi u16. JBD2
//! superblock (big-endian): magic u32 0xC03B3998 @0, block type u32 @4
//! (3 or 4), s_start u32 @0x1C, s_errno i32 @0x20.

use roamdisk_blockdev::Result;

use super::groups::Desc;
use super::sb::{Super, COMPAT_HAS_JOURNAL, S_JOURNAL_INUM};
use crate::bytes::{corrupt, Fields, Region};
use crate::volume::{Health, Reason};

const EXTENTS_FL: u32 = 0x0008_0000;
const EXT_MAGIC: u16 = 0xF30A;
const JBD2_MAGIC: u32 = 0xC03B_3998;
const MAX_DEPTH: u32 = 5;

/// `Some(unsafe verdict)` when the journal holds transactions or an error.
pub(crate) fn check(r: &Region<'_>, sb: &Super, descs: &[Desc]) -> Result<Option<Health>> {
    if sb.compat & COMPAT_HAS_JOURNAL == 0 {
        return Ok(None);
    }
    let ino = sb.raw.le32(S_JOURNAL_INUM).unwrap_or(0) as u64;
    if ino == 0 {
        // External journal: only the needs_recovery flag can be checked.
        return Ok(None);
    }
    let total_inodes = sb.inodes_per_group * sb.groups;
    if ino > total_inodes {
        return Err(corrupt(
            "ext",
            format!("journal inode {ino} does not exist"),
        ));
    }
    let g = (ino - 1) / sb.inodes_per_group;
    let idx = (ino - 1) % sb.inodes_per_group;
    let off = descs[g as usize].inode_table * sb.block_size + idx * sb.inode_size;
    let inode = r.read_vec("ext", off, 128)?;
    let flags = inode.le32(0x20).unwrap_or(0);
    let iblock = &inode[0x28..0x28 + 60];
    let phys = if flags & EXTENTS_FL != 0 {
        first_block_by_extents(r, sb, iblock)?
    } else {
        iblock.le32(0).unwrap_or(0) as u64
    };
    if phys == 0 || phys >= sb.blocks_count {
        return Err(corrupt(
            "ext",
            format!("the journal's first block ({phys}) is not inside the file system"),
        ));
    }
    let j = r.read_vec("ext", phys * sb.block_size, 0x24)?;
    if j.be32(0) != Some(JBD2_MAGIC) || !matches!(j.be32(4), Some(3) | Some(4)) {
        return Err(corrupt(
            "ext",
            "the journal superblock has a bad magic or type",
        ));
    }
    let start = j.be32(0x1C).unwrap_or(0);
    let errno = j.be32(0x20).unwrap_or(0) as i32;
    if errno != 0 {
        return Ok(Some(Health::unsafe_(
            Reason::ErrorsRecorded,
            format!("the journal recorded error {errno}: run e2fsck on the host first"),
        )));
    }
    if start != 0 {
        return Ok(Some(Health::unsafe_(
            Reason::NeedsRecovery,
            format!("the journal holds transactions to replay (s_start = {start}) although the needs_recovery flag is clear"),
        )));
    }
    Ok(None)
}

/// Physical block of logical block 0 through an extent tree rooted in
/// `i_block`.
fn first_block_by_extents(r: &Region<'_>, sb: &Super, iblock: &[u8]) -> Result<u64> {
    let mut node = iblock.to_vec();
    for _ in 0..=MAX_DEPTH {
        if node.le16(0) != Some(EXT_MAGIC) {
            return Err(corrupt(
                "ext",
                "journal inode extent header has a bad magic",
            ));
        }
        let entries = node.le16(2).unwrap_or(0) as usize;
        let depth = node.le16(6).unwrap_or(0);
        if entries == 0 || 12 + entries * 12 > node.len() {
            return Err(corrupt(
                "ext",
                "journal inode extent node is empty or overflows",
            ));
        }
        let first = &node[12..24];
        if first.le32(0) != Some(0) {
            return Err(corrupt("ext", "journal inode does not map its first block"));
        }
        if depth == 0 {
            return Ok(
                first.le32(8).unwrap_or(0) as u64 | (first.le16(6).unwrap_or(0) as u64) << 32
            );
        }
        let leaf = first.le32(4).unwrap_or(0) as u64 | (first.le16(8).unwrap_or(0) as u64) << 32;
        if leaf == 0 || leaf >= sb.blocks_count {
            return Err(corrupt(
                "ext",
                "journal inode extent index points outside the file system",
            ));
        }
        node = r.read_vec("ext", leaf * sb.block_size, sb.block_size as usize)?;
    }
    Err(corrupt("ext", "journal inode extent tree is too deep"))
}
