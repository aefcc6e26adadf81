//! Functional tests of the LBS layer on in-memory storage: round trips,
//! absorption in the write buffer, partial blocks, zero/trim, persistence
//! across reopen, encryption, wrong keys, and attacks on the data file
//! (replayed, randomised and swapped blocks) that must all be detected.

use roamdisk_blockdev::testkit::Countdown;
use roamdisk_blockdev::{Alloc, BlockDev, ErrorKind, WriteFlags, ZeroFlags};
use roamdisk_lbs::create::{CreateOptions, Encryption};
use roamdisk_lbs::testkit::MemImage;
use roamdisk_lbs::{ChecksumKind, LbsOptions};

fn opts(size: u64, enc: bool, sum: ChecksumKind) -> CreateOptions {
    CreateOptions {
        size,
        block_size: 4096,
        cluster_size: 64 * 1024,
        overprovision_pct: 112,
        checksum: sum,
        encryption: if enc {
            Encryption::RawKey(roamdisk_crypto::new_key())
        } else {
            Encryption::None
        },
    }
}

/// A new 1 MiB image in memory, with no crash point.
fn mem_image(enc: bool, sum: ChecksumKind) -> MemImage {
    MemImage::new(&opts(1 << 20, enc, sum), Countdown::unarmed())
}

fn lopts() -> LbsOptions {
    LbsOptions {
        background_gc: false,
        buffer_size: 64 * 1024,
        ..LbsOptions::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i % 251) as u8))
        .collect()
}

#[test]
fn round_trip_every_checksum_with_and_without_encryption() {
    for sum in std::iter::once(ChecksumKind::None).chain(ChecksumKind::ALL) {
        for enc in [false, true] {
            let img = MemImage::new(&opts(4 << 20, enc, sum), Countdown::unarmed());
            let d = img.open(lopts()).unwrap();
            let a = pattern(1, 3 * 4096 + 100);
            d.write_at(&a, 5000, WriteFlags::default()).unwrap();
            let mut b = vec![0u8; a.len()];
            d.read_at(&mut b, 5000).unwrap();
            assert_eq!(a, b, "{sum:?} enc={enc} from buffer");
            d.flush().unwrap();
            d.read_at(&mut b, 5000).unwrap();
            assert_eq!(a, b, "{sum:?} enc={enc} from disk");
            drop(d);
            let d = img.open(lopts()).unwrap();
            d.read_at(&mut b, 5000).unwrap();
            assert_eq!(a, b, "{sum:?} enc={enc} after reopen");
            let mut z = vec![1u8; 4096];
            d.read_at(&mut z, 1 << 20).unwrap();
            assert!(z.iter().all(|&x| x == 0), "unwritten blocks read as zero");
        }
    }
}

#[test]
fn overwrites_in_the_buffer_are_absorbed() {
    let img = mem_image(false, ChecksumKind::Crc32c);
    let d = img.open(lopts()).unwrap();
    for i in 0..10u8 {
        d.write_at(&pattern(i, 4096), 0, WriteFlags::default())
            .unwrap();
    }
    d.flush().unwrap();
    let s = d.stats();
    assert_eq!(s.absorbed, 9);
    assert_eq!(s.physical_blocks, 1);
    let mut b = vec![0u8; 4096];
    d.read_at(&mut b, 0).unwrap();
    assert_eq!(b, pattern(9, 4096));
}

#[test]
fn zero_and_trim_release_blocks_and_report_status() {
    let img = mem_image(false, ChecksumKind::Crc32c);
    let d = img.open(lopts()).unwrap();
    d.write_at(&pattern(3, 64 * 1024), 0, WriteFlags::default())
        .unwrap();
    d.write_zeroes(
        4096,
        8192,
        ZeroFlags {
            may_trim: false,
            ..Default::default()
        },
    )
    .unwrap();
    d.trim(16384, 4096, WriteFlags::default()).unwrap();
    d.write_zeroes(100, 50, ZeroFlags::default()).unwrap();
    d.flush().unwrap();
    let st = d.block_status(0, 1 << 20).unwrap();
    assert_eq!(st[0].state, Alloc::Data);
    assert_eq!((st[1].len, st[1].state), (8192, Alloc::Zero));
    assert_eq!(st[2].state, Alloc::Data);
    assert_eq!((st[3].len, st[3].state), (4096, Alloc::Hole));
    let mut b = vec![9u8; 64 * 1024];
    d.read_at(&mut b, 0).unwrap();
    let mut want = pattern(3, 64 * 1024);
    want[100..150].fill(0);
    want[4096..12288].fill(0);
    want[16384..20480].fill(0);
    assert_eq!(b, want);
    assert_eq!(d.stats().mapped_blocks, 16 - 3);
    drop(d);
    let d = img.open(lopts()).unwrap();
    let mut c = vec![9u8; 64 * 1024];
    d.read_at(&mut c, 0).unwrap();
    assert_eq!(c, want);
}

#[test]
fn wrong_or_missing_key_is_refused() {
    let img = mem_image(true, ChecksumKind::Blake3);
    drop(img.open(lopts()).unwrap());
    let mut other = MemImage {
        key: Some(roamdisk_crypto::new_key()),
        ..mem_image(false, ChecksumKind::Crc32c)
    };
    other.data = img.data.clone();
    other.log = img.log.clone();
    other.header = img.header.clone();
    let e = other.open(lopts()).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("wrong key"), "{e}");
    other.key = None;
    let e = other.open(lopts()).err().unwrap();
    assert!(e.to_string().contains("encrypted"), "{e}");
}

#[test]
fn data_file_holds_no_plaintext_when_encrypted() {
    let img = mem_image(true, ChecksumKind::Crc32c);
    let d = img.open(lopts()).unwrap();
    let secret = b"TOP-SECRET-PAYLOAD-0123456789".repeat(150);
    d.write_at(&secret[..4096], 0, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    let raw = img.data_bytes();
    assert!(
        !raw.windows(18).any(|w| w == b"TOP-SECRET-PAYLOAD"),
        "plaintext found in the data file"
    );
}

/// Find the data-file byte offset of the block that currently holds LBN 0
/// by writing a marker, for the attack tests (unencrypted images only).
fn offset_of(raw: &[u8], marker: &[u8]) -> usize {
    raw.windows(marker.len())
        .position(|w| w == marker)
        .expect("marker in data file")
}

#[test]
fn randomised_block_is_detected() {
    for sum in ChecksumKind::ALL {
        let img = mem_image(false, sum);
        let d = img.open(lopts()).unwrap();
        let mut blk = pattern(5, 4096);
        blk[..8].copy_from_slice(b"MARKER01");
        d.write_at(&blk, 8192, WriteFlags::default()).unwrap();
        d.flush().unwrap();
        let raw = img.data_bytes();
        let at = offset_of(&raw, b"MARKER01");
        img.data
            .write_at(&[0x42; 16], (at + 1000) as u64, WriteFlags::default())
            .unwrap();
        let mut b = vec![0u8; 4096];
        let e = d.read_at(&mut b, 8192).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{sum:?}");
        assert!(e.to_string().contains("LBN 2"), "{e}");
        assert!(d.stats().integrity_errors >= 1);
    }
}

#[test]
fn swapped_blocks_are_detected() {
    let img = mem_image(false, ChecksumKind::Fletcher32);
    let d = img.open(lopts()).unwrap();
    let mut a = pattern(1, 4096);
    a[..8].copy_from_slice(b"BLOCK--A");
    let mut b = pattern(2, 4096);
    b[..8].copy_from_slice(b"BLOCK--B");
    d.write_at(&a, 0, WriteFlags::default()).unwrap();
    d.write_at(&b, 40960, WriteFlags::default()).unwrap();
    d.flush().unwrap();
    let raw = img.data_bytes();
    let (pa, pb) = (offset_of(&raw, b"BLOCK--A"), offset_of(&raw, b"BLOCK--B"));
    img.data
        .write_at(&raw[pb..pb + 4096], pa as u64, WriteFlags::default())
        .unwrap();
    img.data
        .write_at(&raw[pa..pa + 4096], pb as u64, WriteFlags::default())
        .unwrap();
    let mut x = vec![0u8; 4096];
    assert_eq!(d.read_at(&mut x, 0).unwrap_err().kind(), ErrorKind::Corrupt);
    assert_eq!(
        d.read_at(&mut x, 40960).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
}

#[test]
fn replayed_older_encrypted_block_is_detected() {
    // Encrypted: the attacker cannot find blocks by content, so capture the
    // whole data file, let the guest overwrite a block, then put every old
    // byte back (a replay of an older image of the same place).
    let img = mem_image(true, ChecksumKind::Crc32c);
    let d = img.open(lopts()).unwrap();
    d.write_at(&pattern(1, 64 * 1024), 0, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    let old = img.data_bytes();
    // Rewrite the same blocks until GC reuses clusters that held the old
    // versions, so the new block sits where an older ciphertext was.
    for round in 0..40u8 {
        d.write_at(&pattern(round + 2, 64 * 1024), 0, WriteFlags::default())
            .unwrap();
        d.flush().unwrap();
        d.gc_now().unwrap();
    }
    let now = img.data_bytes();
    assert_ne!(old, now);
    // Replay: restore every byte that differs.
    img.data.write_at(&old, 0, WriteFlags::default()).unwrap();
    let mut x = vec![0u8; 64 * 1024];
    let e = d.read_at(&mut x, 0).unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Corrupt,
        "a replayed block must not verify"
    );
}

#[test]
fn a_full_image_with_little_spare_keeps_taking_overwrites_in_every_stream() {
    // 4 MiB in 64 KiB clusters with the least spare there is (101%: the
    // 2 clusters `create` adds plus under one), hot and cold overwrites
    // of the full disk: the four write streams and the collector's
    // reserve must never run out of clusters.
    let mut o = opts(4 << 20, false, ChecksumKind::Crc32c);
    o.overprovision_pct = 101;
    let img = MemImage::new(&o, Countdown::unarmed());
    let dev = img.open(lopts()).unwrap();
    let blocks = (4u64 << 20) / 4096;
    for lbn in 0..blocks {
        dev.write_at(&pattern(lbn as u8, 4096), lbn * 4096, WriteFlags::default())
            .unwrap();
    }
    let mut r = roamdisk_blockdev::testkit::Rng::new(7);
    let mut last = vec![0u8; blocks as usize];
    for (lbn, v) in last.iter_mut().enumerate() {
        *v = lbn as u8;
    }
    for i in 0..20 * blocks {
        let lbn = if r.chance(9, 10) {
            r.below(blocks / 10)
        } else {
            r.below(blocks)
        };
        let v = (i % 251) as u8;
        dev.write_at(&pattern(v, 4096), lbn * 4096, WriteFlags::default())
            .unwrap_or_else(|e| panic!("write {i} of block {lbn}: {e}"));
        last[lbn as usize] = v;
        if i % 16 == 15 {
            dev.flush().unwrap();
        }
    }
    let s = dev.stats();
    assert!(s.gc_clusters > 0, "{s:?}");
    assert!(s.stream_blocks.iter().all(|&n| n > 0), "{s:?}");
    drop(dev);
    let dev = img.open(lopts()).unwrap();
    let mut b = vec![0u8; 4096];
    for lbn in 0..blocks {
        dev.read_at(&mut b, lbn * 4096).unwrap();
        assert_eq!(b, pattern(last[lbn as usize], 4096), "block {lbn}");
    }
}
