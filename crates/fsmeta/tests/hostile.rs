//! Hostile and truncated input: real volumes made by the real tools
//! (mke2fs, mkntfs, mkswap, sfdisk), then damaged at random in their
//! metadata or cut short. Every parser must return a result or a clear
//! error, never panic, and never report free space outside the volume.

use proptest::prelude::*;
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::{run_tool, Rng};
use roamdisk_blockdev::{BlockDev, ErrorKind, WriteFlags};

/// Images made once per test process: (name, bytes).
fn images() -> &'static Vec<(&'static str, Vec<u8>)> {
    static IMAGES: std::sync::OnceLock<Vec<(&'static str, Vec<u8>)>> = std::sync::OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fsmeta-hostile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mk = |name: &str, size: &str| {
            let f = dir.join(name).to_str().unwrap().to_string();
            run_tool("truncate", &["-s", size, &f], None);
            f
        };
        let e4 = mk("e4", "8M");
        run_tool("mke2fs", &["-q", "-F", "-t", "ext4", "-g", "1024", &e4], None);
        let e2 = mk("e2", "4M");
        run_tool("mke2fs", &["-q", "-F", "-t", "ext2", "-b", "1024", "-O", "meta_bg,^resize_inode", &e2], None);
        let big = mk("big", "8M");
        run_tool("mke2fs", &["-q", "-F", "-t", "ext4", "-O", "bigalloc", "-C", "16384", &big], None);
        let nt = mk("ntfs", "8M");
        run_tool("mkntfs", &["-q", "-F", "-Q", &nt], None);
        let sw = mk("swap", "1M");
        run_tool("mkswap", &[&sw], None);
        let gpt = mk("gpt", "4M");
        run_tool("sfdisk", &["-q", &gpt], Some(b"label: gpt\nsize=1MiB\nsize=1MiB\n"));
        let mbr = mk("mbr", "10M");
        run_tool(
            "sfdisk",
            &["-q", &mbr],
            Some(b"label: dos\nsize=1MiB\nsize=1MiB\nsize=1MiB\nsize=5MiB, type=5\nsize=1MiB\nsize=512KiB\n"),
        );
        let read = |f: &str| std::fs::read(f).unwrap();
        let v = vec![
            ("ext4", read(&e4)),
            ("ext2-metabg", read(&e2)),
            ("bigalloc", read(&big)),
            ("ntfs", read(&nt)),
            ("swap", read(&sw)),
            ("gpt", read(&gpt)),
            ("mbr", read(&mbr)),
        ];
        let _ = std::fs::remove_dir_all(&dir);
        v
    })
}

fn mem(bytes: &[u8]) -> MemDev {
    let m = MemDev::new(bytes.len() as u64);
    m.write_at(bytes, 0, WriteFlags::default()).unwrap();
    m
}

/// Everything the crate offers, on `dev`; panics only if a result is
/// inconsistent (free space outside the range).
fn exercise(dev: &MemDev) {
    let size = dev.size();
    if let Ok(parts) = roamdisk_fsmeta::partitions(dev) {
        for p in parts {
            assert!(p.start + p.len <= size, "partition outside the disk");
            if let Ok(f) = roamdisk_fsmeta::free_space(dev, p.start, p.len) {
                for e in &f.extents {
                    assert!(
                        e.start >= p.start && e.end() <= p.start + p.len,
                        "free extent outside the volume"
                    );
                }
                assert_eq!(f.free_bytes, f.extents.iter().map(|e| e.len).sum::<u64>());
            }
        }
    }
    let _ = roamdisk_fsmeta::probe(dev, 0, size);
}

/// Byte ranges worth damaging in each image (where metadata lives).
fn hot(name: &str, len: usize) -> Vec<(usize, usize)> {
    match name {
        "ntfs" => vec![(0, 512), (len / 2 - 65536, len / 2 + 65536), (0, 1 << 20)],
        "swap" => vec![(1024, 2048), (4086, 4096)],
        "gpt" | "mbr" => vec![(0, 34 * 512), (len - 34 * 512, len)],
        _ => vec![(0, 16384), (0, len.min(1 << 20))],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn damaged_metadata_never_panics(
        img in 0usize..7,
        flips in proptest::collection::vec((any::<u32>(), any::<u8>(), 0usize..3), 1..24),
    ) {
        let (name, bytes) = &images()[img];
        let mut b = bytes.clone();
        let ranges = hot(name, b.len());
        for (pos, val, r) in flips {
            let (s, e) = ranges[r % ranges.len()];
            let at = s + pos as usize % (e - s);
            b[at] = val;
        }
        exercise(&mem(&b));
    }

    #[test]
    fn truncated_volumes_give_errors_not_panics(img in 0usize..7, keep in 0.0f64..1.0) {
        let (_, bytes) = &images()[img];
        let n = ((bytes.len() as f64 * keep) as usize).max(1);
        exercise(&mem(&bytes[..n]));
    }

    #[test]
    fn random_bytes_behind_real_magics_never_panic(seed in any::<u64>(), kind in 0usize..5) {
        // 70 KB of pseudo-random bytes (a proptest byte vector this long
        // is slow).
        let mut b = Rng::new(seed).bytes(70000);
        match kind {
            0 => { b[1080] = 0x53; b[1081] = 0xEF; }
            1 => { b[3..11].copy_from_slice(b"NTFS    "); b[510] = 0x55; b[511] = 0xAA; }
            2 => { b[4086..4096].copy_from_slice(b"SWAPSPACE2"); }
            3 => { b[510] = 0x55; b[511] = 0xAA; b[450] = 0xEE; b[512..520].copy_from_slice(b"EFI PART"); }
            _ => { b[510] = 0x55; b[511] = 0xAA; b[446] = 0; b[450] = 0x05; }
        }
        exercise(&mem(&b));
    }
}

#[test]
fn truncated_ext_is_a_clear_corrupt_error() {
    let (_, bytes) = &images()[0];
    assert_corrupt(&bytes[..bytes.len() / 2], "truncated");
}

/// Reading the free space of `volume` fails as corrupt, saying `says`.
fn assert_corrupt(volume: &[u8], says: &str) {
    let e = roamdisk_fsmeta::free_space(&mem(volume), 0, volume.len() as u64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains(says), "{e}");
}

#[test]
fn a_torn_mft_record_is_reported() {
    let (_, bytes) = &images()[3];
    let mut b = bytes.clone();
    // The $MFT's first record: the first "FILE" after the boot sector.
    let at = (1..b.len() / 512)
        .map(|s| s * 512)
        .find(|&o| &b[o..o + 4] == b"FILE")
        .unwrap();
    b[at + 1022] ^= 0xFF; // last bytes of the record's 2nd sector
    assert_corrupt(&b, "torn");
}

#[test]
fn a_corrupt_group_descriptor_checksum_is_reported() {
    let (_, bytes) = &images()[0];
    let mut b = bytes.clone();
    // 1 KiB blocks: descriptors start at block 2; flip a bitmap pointer.
    b[2048 + 64] ^= 1;
    assert_corrupt(&b, "checksum");
}

#[test]
fn real_images_parse() {
    for (name, bytes) in images() {
        let d = mem(bytes);
        let parts = roamdisk_fsmeta::partitions(&d).unwrap();
        match *name {
            "gpt" => assert_eq!(parts.len(), 2),
            "mbr" => assert_eq!(
                parts.iter().map(|p| p.number).collect::<Vec<_>>(),
                vec![1, 2, 3, 5, 6]
            ),
            _ => {
                assert_eq!(parts.len(), 1);
                let f = roamdisk_fsmeta::free_space(&d, 0, d.size()).unwrap();
                assert!(f.probe.health.is_clean(), "{name}: {:?}", f.probe.health);
                assert!(f.free_bytes > 0, "{name}");
            }
        }
    }
}
