//! Signatures of volumes this crate does not read, so that a skipped
//! partition is reported with its type ("vfat", "xfs", "LUKS"...) rather
//! than guessed at. Only positive magic matches name a type.

use crate::bytes::Fields;

/// (byte offset, magic, type name), checked in order.
const MAGICS: &[(usize, &[u8], &str)] = &[
    (0, b"LUKS\xba\xbe", "crypto_LUKS"),
    (0, b"SKUL\xba\xbe", "crypto_LUKS"),
    (3, b"-FVE-FS-", "BitLocker"),
    (3, b"EXFAT   ", "exfat"),
    (3, b"ReFS\0\0\0\0", "ReFS"),
    (0, b"XFSB", "xfs"),
    (0x10040, b"_BHRfS_M", "btrfs"),
    (0x218, b"LVM2 001", "LVM2_member"),
    (0x018, b"LVM2 001", "LVM2_member"),
    (0x8001, b"CD001", "iso9660"),
    (0x8000, b"JFS1", "jfs"),
    (0x10034, b"ReIsEr", "reiserfs"),
    (0, b"hsqs", "squashfs"),
    (0x400, b"\x10\x20\xf5\xf2", "f2fs"),
    (0x400, b"H+", "hfsplus"),
    (0x400, b"HX", "hfsplus"),
    (0x20, b"NXSB", "apfs"),
    (0, b"\x45\x3d\xcd\x28", "cramfs"),
    (0x36, b"FAT12", "vfat"),
    (0x36, b"FAT16", "vfat"),
    (0x52, b"FAT32", "vfat"),
];

/// Name the volume whose first bytes are `head`, with a sentence saying
/// why it is not used.
pub fn identify(head: &[u8]) -> (&'static str, String) {
    for (off, magic, name) in MAGICS {
        if head.get(*off..off + magic.len()) == Some(magic) {
            return (
                name,
                format!("{name} is not a file system roamdisk reads free space from"),
            );
        }
    }
    // Linux MD RAID superblocks: 0.90/1.0 live at the end (not read here),
    // 1.1 at 0 and 1.2 at 4 KiB.
    for off in [0usize, 4096] {
        if head.le32(off) == Some(0xa92b_4efc) {
            return (
                "linux_raid_member",
                "a Linux RAID member: borrow from the assembled array instead".into(),
            );
        }
    }
    // Minix: magic at 1024 + 16.
    if let Some(m) = head.le16(0x410) {
        if matches!(m, 0x137F | 0x138F | 0x2468 | 0x2478 | 0x4D5A) {
            return (
                "minix",
                "minix is not a file system roamdisk reads free space from".into(),
            );
        }
    }
    if head.iter().take(64 * 1024).all(|&b| b == 0) {
        return (
            "empty",
            "no signature (the first 64 KiB are zero): not formatted, or content roamdisk cannot identify".into(),
        );
    }
    (
        "unknown",
        "no known signature: roamdisk does not guess what it holds".into(),
    )
}
