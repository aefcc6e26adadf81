//! Group descriptors (classic contiguous table or `meta_bg`), their
//! checksums, and the free-space scan over the block bitmaps.
//!
//! Descriptor (32 bytes, or `s_desc_size` with 64bit): block bitmap lo
//! u32 @0x00, inode bitmap lo u32 @0x04, inode table lo u32 @0x08, flags
//! u16 @0x12 (BLOCK_UNINIT = 2), block bitmap checksum lo u16 @0x18,
//! descriptor checksum u16 @0x1E; 64bit: block bitmap hi u32 @0x20, inode
//! bitmap hi u32 @0x24, inode table hi u32 @0x28, block bitmap checksum hi
//! u16 @0x38.

use roamdisk_blockdev::Result;

use super::csum::{crc16, crc32c_raw};
use super::sb::{Super, INCOMPAT_FLEX_BG};
use crate::bytes::{corrupt, Fields, Region};
use crate::extent::{clear_runs, normalize, Extent, Merger};

const BG_BLOCK_UNINIT: u16 = 0x0002;
const D_CHECKSUM: usize = 0x1E;
/// Descriptors at least this long carry the high half of the block bitmap
/// checksum (`EXT4_BG_BLOCK_BITMAP_CSUM_HI_END`).
const CSUM_HI_END: u64 = 0x3A;
/// Bitmap bytes read per batch of groups (bounds memory on huge volumes).
const WINDOW_BYTES: u64 = 16 << 20;
/// Largest descriptor table read (a 4 TiB volume of 1 KiB blocks, the
/// worst real case, needs 32 MiB).
const MAX_DESC_TABLE: u64 = 128 << 20;
/// Longest single read of adjacent bitmap blocks.
const MAX_READ: u64 = 4 << 20;

/// One group's descriptor, validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Desc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub flags: u16,
    /// Stored block bitmap checksum and how many of its bits are stored.
    pub bb_csum: u32,
    pub bb_csum_bits: u32,
}

/// `ext2fs_descriptor_block_loc2` for the primary copy: the block holding
/// descriptor block `i`.
fn desc_block_loc(sb: &Super, i: u64) -> u64 {
    let adjust = u64::from(i == 0 && sb.block_size == 1024 && sb.cluster_bits > 0);
    if !sb.meta_bg() || i < sb.first_meta_bg {
        return sb.first_data_block + i + 1 + adjust;
    }
    let bg = sb.desc_per_block() * i;
    sb.group_first_block(bg) + u64::from(sb.has_super(bg)) + adjust
}

/// Read, validate and checksum every group descriptor.
pub(crate) fn read_descriptors(r: &Region<'_>, sb: &Super) -> Result<Vec<Desc>> {
    let bs = sb.block_size;
    let nblocks = sb.desc_blocks();
    if nblocks * bs > MAX_DESC_TABLE {
        return Err(corrupt(
            "ext",
            format!(
                "{} groups need {} bytes of descriptors: implausibly many (blocks per group {})",
                sb.groups,
                nblocks * bs,
                sb.blocks_per_group
            ),
        ));
    }
    let mut raw = Vec::with_capacity((nblocks * bs) as usize);
    // Adjacent descriptor blocks are read together.
    let mut i = 0;
    while i < nblocks {
        let start = desc_block_loc(sb, i);
        let mut n = 1;
        while i + n < nblocks && desc_block_loc(sb, i + n) == start + n && n * bs < MAX_READ {
            n += 1;
        }
        if start + n > sb.blocks_count {
            return Err(corrupt(
                "ext",
                format!("group descriptor block {start} lies past the end of the file system"),
            ));
        }
        let at = raw.len();
        raw.resize(at + (n * bs) as usize, 0);
        r.read("ext", &mut raw[at..], start * bs)?;
        i += n;
    }
    let ds = sb.desc_size as usize;
    let itb = sb.inode_table_blocks();
    let flex = sb.incompat & INCOMPAT_FLEX_BG != 0;
    let mut out = Vec::with_capacity(sb.groups as usize);
    for g in 0..sb.groups {
        let d = &raw[g as usize * ds..(g as usize + 1) * ds];
        let hi = |o: usize| {
            if ds >= 64 {
                d.le32(o).unwrap_or(0) as u64
            } else {
                0
            }
        };
        let desc = Desc {
            block_bitmap: d.le32(0).unwrap_or(0) as u64 | hi(0x20) << 32,
            inode_bitmap: d.le32(4).unwrap_or(0) as u64 | hi(0x24) << 32,
            inode_table: d.le32(8).unwrap_or(0) as u64 | hi(0x28) << 32,
            flags: d.le16(0x12).unwrap_or(0),
            bb_csum: d.le16(0x18).unwrap_or(0) as u32
                | if sb.desc_size >= CSUM_HI_END {
                    (d.le16(0x38).unwrap_or(0) as u32) << 16
                } else {
                    0
                },
            bb_csum_bits: if sb.desc_size >= CSUM_HI_END { 32 } else { 16 },
        };
        if sb.has_csum() {
            let want = d.le16(D_CHECKSUM).unwrap_or(0);
            let got = desc_csum(sb, g as u32, d);
            if want != got {
                return Err(corrupt(
                    "ext",
                    format!("group {g} descriptor checksum mismatch (stored {want:#06x}, computed {got:#06x})"),
                ));
            }
        }
        // Where the group's metadata may live: its own group, or anywhere
        // with flex_bg (the kernel's ext4_check_descriptors rule).
        let (lo, hi_blk) = if flex {
            (sb.first_data_block, sb.blocks_count - 1)
        } else {
            (sb.group_first_block(g), sb.group_last_block(g))
        };
        let inside = |b: u64, n: u64| b >= lo && b.checked_add(n - 1).is_some_and(|e| e <= hi_blk);
        if !inside(desc.block_bitmap, 1) {
            return Err(corrupt(
                "ext",
                format!("block bitmap of group {g} at block {} is outside its allowed range {lo}..={hi_blk}", desc.block_bitmap),
            ));
        }
        if !inside(desc.inode_bitmap, 1) {
            return Err(corrupt(
                "ext",
                format!(
                    "inode bitmap of group {g} at block {} is outside its allowed range",
                    desc.inode_bitmap
                ),
            ));
        }
        if !inside(desc.inode_table, itb) {
            return Err(corrupt(
                "ext",
                format!(
                    "inode table of group {g} at block {} is outside its allowed range",
                    desc.inode_table
                ),
            ));
        }
        out.push(desc);
    }
    Ok(out)
}

/// `ext2fs_group_desc_csum`.
fn desc_csum(sb: &Super, g: u32, d: &[u8]) -> u16 {
    if sb.metadata_csum() {
        let mut copy = d.to_vec();
        copy[D_CHECKSUM..D_CHECKSUM + 2].fill(0);
        let c = crc32c_raw(sb.csum_seed, &g.to_le_bytes());
        return (crc32c_raw(c, &copy) & 0xFFFF) as u16;
    }
    let uuid = &sb.raw[0x68..0x78];
    let mut c = crc16(!0, uuid);
    c = crc16(c, &g.to_le_bytes());
    c = crc16(c, &d[..D_CHECKSUM]);
    if d.len() > D_CHECKSUM + 2 {
        c = crc16(c, &d[D_CHECKSUM + 2..]);
    }
    c
}

/// Blocks that are file-system metadata whatever the bitmaps say: for
/// every group its superblock copy and descriptor blocks
/// (`ext2fs_reserve_super_and_bgd`), block and inode bitmaps and inode
/// table. Sorted, merged, in blocks.
fn metadata_blocks(sb: &Super, descs: &[Desc]) -> Vec<Extent> {
    let mut v = Vec::with_capacity(descs.len() * 3 + 8);
    let old_desc_blocks = if sb.meta_bg() {
        sb.first_meta_bg
    } else {
        sb.desc_blocks() + sb.reserved_gdt
    };
    let mbs = sb.desc_per_block();
    let itb = sb.inode_table_blocks();
    for (g, d) in descs.iter().enumerate() {
        let g = g as u64;
        let mut group_block = sb.group_first_block(g);
        if group_block == 0 && sb.block_size == 1024 {
            group_block = 1;
        }
        let has_super = sb.has_super(g);
        if has_super || g == 0 {
            v.push(Extent {
                start: if has_super { group_block } else { 0 },
                len: 1,
            });
        }
        if g == 0 && sb.block_size == 1024 && sb.cluster_bits > 0 {
            v.push(Extent { start: 0, len: 1 });
        }
        if !sb.meta_bg() || g / mbs < sb.first_meta_bg {
            if has_super && old_desc_blocks > 0 {
                let start = group_block + 1;
                let n = old_desc_blocks.min(sb.blocks_count.saturating_sub(start));
                v.push(Extent { start, len: n });
            }
        } else {
            let r = g % mbs;
            if r == 0 || r == 1 || r == mbs - 1 {
                v.push(Extent {
                    start: group_block + u64::from(has_super),
                    len: 1,
                });
            }
        }
        v.push(Extent {
            start: d.block_bitmap,
            len: 1,
        });
        v.push(Extent {
            start: d.inode_bitmap,
            len: 1,
        });
        v.push(Extent {
            start: d.inode_table,
            len: itb,
        });
    }
    normalize(v)
}

/// Stream the free space of `e`, in bytes of the device, in order.
pub(crate) fn scan_free(
    r: &Region<'_>,
    sb: &Super,
    descs: &[Desc],
    m: &mut Merger<'_>,
) -> Result<()> {
    let bs = sb.block_size;
    let cb = sb.cluster_bits;
    // Metadata in bitmap units (clusters counted from the first data
    // block): every cluster containing a metadata block.
    let fdb = sb.first_data_block;
    let meta: Vec<(u64, u64)> = metadata_blocks(sb, descs)
        .into_iter()
        .map(|x| {
            (
                x.start.saturating_sub(fdb) >> cb,
                (x.end().saturating_sub(fdb) + (1 << cb) - 1) >> cb,
            )
        })
        .collect();
    let mut mi = 0usize;
    let cpg = sb.clusters_per_group;
    let bitmap_bytes = cpg / 8;
    // Total clusters: the first data block is 0 whenever clusters are
    // bigger than blocks.
    let total_clusters = (sb.blocks_count - sb.first_data_block).div_ceil(1 << cb);
    let fs_end = sb.blocks_count * bs;
    let window = (WINDOW_BYTES / bitmap_bytes.max(1)).max(1);
    let mut buf = Vec::new();
    let mut g0 = 0u64;
    while g0 < sb.groups {
        let g1 = (g0 + window).min(sb.groups);
        let n = (g1 - g0) as usize;
        buf.clear();
        buf.resize(n * bitmap_bytes as usize, 0u8);
        // Groups whose bitmap is read (BLOCK_UNINIT ones stay zero when
        // descriptor checksums vouch for the flag), sorted by location so
        // adjacent bitmap blocks come in one read.
        let mut want: Vec<(u64, usize)> = (g0..g1)
            .filter(|&g| !(sb.has_csum() && descs[g as usize].flags & BG_BLOCK_UNINIT != 0))
            .map(|g| (descs[g as usize].block_bitmap, (g - g0) as usize))
            .collect();
        want.sort_unstable();
        let mut i = 0;
        let mut tmp = Vec::new();
        while i < want.len() {
            let mut j = i + 1;
            while j < want.len()
                && want[j].0 == want[j - 1].0 + 1
                && (want[j].0 - want[i].0 + 1) * bs <= MAX_READ
            {
                j += 1;
            }
            let blocks = want[j - 1].0 - want[i].0 + 1;
            tmp.resize((blocks * bs) as usize, 0);
            r.read("ext", &mut tmp, want[i].0 * bs)?;
            for &(blk, slot) in &want[i..j] {
                let from = ((blk - want[i].0) * bs) as usize;
                let bits = &tmp[from..from + bitmap_bytes as usize];
                if sb.metadata_csum() {
                    let g = g0 + slot as u64;
                    let d = &descs[g as usize];
                    let mut got = crc32c_raw(sb.csum_seed, bits);
                    if d.bb_csum_bits == 16 {
                        got &= 0xFFFF;
                    }
                    if got != d.bb_csum {
                        return Err(corrupt(
                            "ext",
                            format!("block bitmap of group {g} fails its checksum (stored {:#x}, computed {got:#x})", d.bb_csum),
                        ));
                    }
                }
                let s = slot * bitmap_bytes as usize;
                buf[s..s + bitmap_bytes as usize].copy_from_slice(bits);
            }
            i = j;
        }
        for g in g0..g1 {
            let base = g * cpg;
            let nbits = cpg.min(total_clusters.saturating_sub(base));
            let s = ((g - g0) * bitmap_bytes) as usize;
            let bits = &buf[s..s + bitmap_bytes as usize];
            clear_runs(bits, nbits, |a, len| {
                let (mut c0, c1) = (base + a, base + a + len);
                // Cut out metadata clusters.
                while mi < meta.len() && meta[mi].1 <= c0 {
                    mi += 1;
                }
                let mut k = mi;
                while c0 < c1 {
                    let (ms, me) = meta.get(k).copied().unwrap_or((u64::MAX, u64::MAX));
                    if ms >= c1 {
                        emit(m, r.start, sb, c0, c1, fs_end);
                        break;
                    }
                    if ms > c0 {
                        emit(m, r.start, sb, c0, ms, fs_end);
                    }
                    c0 = c0.max(me);
                    k += 1;
                }
            });
        }
        g0 = g1;
    }
    Ok(())
}

/// Push clusters `[c0, c1)` as bytes, clipped to the end of the file system.
fn emit(m: &mut Merger<'_>, region_start: u64, sb: &Super, c0: u64, c1: u64, fs_end: u64) {
    let unit = sb.block_size << sb.cluster_bits;
    let first = sb.first_data_block * sb.block_size;
    let a = first + c0 * unit;
    let b = (first + c1 * unit).min(fs_end);
    if b > a {
        m.push(region_start + a, b - a);
    }
}
