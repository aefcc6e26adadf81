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

/// Options whose collector, when asked, takes every cluster with a dead
/// block (high watermark = every cluster).
fn collect_all() -> LbsOptions {
    LbsOptions {
        gc: Some(roamdisk_lbs::gc::GcPolicy {
            low: 1,
            high: 1 << 20,
            ..roamdisk_lbs::gc::GcPolicy::for_clusters(18)
        }),
        ..lopts()
    }
}

#[test]
fn moves_copy_ciphertext_and_damage_is_still_caught_after_moves() {
    // Encrypted, so a block's bytes on disk say nothing about its place:
    // a move must copy them unchanged (the seal travels in the log).
    let img = mem_image(true, ChecksumKind::Crc32c);
    let blocks: Vec<Vec<u8>> = (0..16).map(|i| pattern(i as u8 + 1, 4096)).collect();
    {
        let d = img.open(collect_all()).unwrap();
        for (i, b) in blocks.iter().enumerate() {
            d.write_at(b, i as u64 * 4096, WriteFlags::default())
                .unwrap();
        }
        d.flush().unwrap();
    }
    // LBNs 0..16 filled the first cluster (PBN 0..16, after the 64 KiB
    // superblock area). Damage LBN 3's ciphertext; remember LBN 5's.
    let base = 64 * 1024;
    let raw = img.data_bytes();
    let five = raw[base + 5 * 4096..base + 6 * 4096].to_vec();
    img.data
        .write_at(
            &[0x42; 16],
            (base + 3 * 4096 + 100) as u64,
            WriteFlags::default(),
        )
        .unwrap();
    let check = |d: &roamdisk_lbs::Lbs| {
        let mut x = vec![0u8; 4096];
        for (i, b) in blocks.iter().enumerate() {
            let r = d.read_at(&mut x, i as u64 * 4096);
            if i == 3 {
                let e = r.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Corrupt);
                assert!(e.to_string().contains("LBN 3"), "{e}");
            } else if i > 2 {
                r.unwrap();
                assert_eq!(&x, b, "LBN {i}");
            }
        }
    };
    let d = img.open(collect_all()).unwrap();
    // Two dead blocks make the cluster a victim; its 14 live blocks move,
    // the damaged one with them.
    d.write_at(&pattern(99, 8192), 0, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    assert!(d.gc_now().unwrap() >= 1);
    let s = d.stats();
    assert!(s.gc_moved >= 14, "{s:?}");
    check(&d);
    // LBN 5's ciphertext now lies elsewhere too, byte for byte.
    let raw = img.data_bytes();
    let copies: Vec<usize> = (base..raw.len())
        .step_by(4096)
        .filter(|&o| raw[o..o + 4096] == five[..])
        .collect();
    assert!(
        copies.iter().any(|&o| o != base + 5 * 4096),
        "moved block not copied as it was: {copies:?}"
    );
    // Across a reopen (MOVED entries replayed, then compacted), then moved
    // again (a hole in the cluster they moved to, no longer active).
    drop(d);
    let d = img.open(collect_all()).unwrap();
    check(&d);
    d.write_at(&pattern(98, 4096), 2 * 4096, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    d.gc_now().unwrap();
    assert!(d.stats().gc_moved >= 12, "{:?}", d.stats());
    check(&d);
    drop(d);
    let d = img
        .open(LbsOptions {
            read_only: true,
            ..lopts()
        })
        .unwrap();
    check(&d);
}

#[test]
fn version_1_images_open_and_are_upgraded_by_a_writable_open() {
    use roamdisk_lbs::format::{MetaHeader, VERSION};
    use roamdisk_lbs::storage::LogStore;
    let img = mem_image(true, ChecksumKind::Blake3);
    let data = pattern(7, 256 * 1024);
    // A version-1 log: the same entries (MAP, ZERO, TRIM, BARRIER) under a
    // version-1 header, as an older roamdisk wrote it (taken before the
    // close, whose compaction adds the collector's version-3 hints).
    let mut log = {
        let d = img.open(lopts()).unwrap();
        d.write_at(&data, 4096, WriteFlags::default()).unwrap();
        d.flush().unwrap();
        img.log.live()
    };
    let h = MetaHeader::parse(&log).unwrap();
    assert_eq!(h.version, VERSION);
    let v1 = MetaHeader { version: 1, ..h }.encode();
    log[..v1.len()].copy_from_slice(&v1);
    img.log.clone().replace(&log).unwrap();
    let mut x = vec![0u8; data.len()];
    {
        let d = img
            .open(LbsOptions {
                read_only: true,
                ..lopts()
            })
            .unwrap();
        assert_eq!(d.header().version, 1);
        d.read_at(&mut x, 4096).unwrap();
        assert_eq!(x, data);
    }
    assert_eq!(MetaHeader::parse(&img.log.live()).unwrap().version, 1);
    let d = img.open(collect_all()).unwrap();
    assert_eq!(d.header().version, VERSION);
    assert_eq!(MetaHeader::parse(&img.log.live()).unwrap().version, VERSION);
    d.write_at(&pattern(8, 8192), 4096, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    d.gc_now().unwrap();
    assert!(d.stats().gc_moved > 0);
    d.read_at(&mut x[..8192], 4096).unwrap();
    assert_eq!(&x[..8192], &pattern(8, 8192)[..]);
    d.read_at(&mut x[8192..], 4096 + 8192).unwrap();
    assert_eq!(&x[8192..], &data[8192..]);
}

#[test]
fn background_collector_and_concurrent_clients_lose_nothing() {
    // The background collector moves blocks while clients write, read and
    // trim from four threads: every block must read back as its last
    // write, before and after a reopen.
    use std::sync::Arc;
    let img = MemImage::new(
        &opts(2 << 20, true, ChecksumKind::Crc32c),
        Countdown::unarmed(),
    );
    let o = LbsOptions {
        background_gc: true,
        buffer_size: 16 * 1024,
        ..LbsOptions::default()
    };
    // Victim reads (several blocks at once) take 0.5 ms, so clients'
    // writes land on victims' blocks while they are read.
    struct SlowSpans(Arc<dyn BlockDev>);
    impl BlockDev for SlowSpans {
        roamdisk_blockdev::layer!("slow-spans", 0);
        fn read_at(&self, buf: &mut [u8], off: u64) -> roamdisk_blockdev::Result<()> {
            if buf.len() > 4096 {
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            self.0.read_at(buf, off)
        }
    }
    let open = |o: LbsOptions| {
        roamdisk_lbs::Lbs::open(
            Arc::new(SlowSpans(img.data.clone())),
            Box::new(img.log.clone()),
            img.key,
            o,
        )
        .unwrap()
    };
    let d = Arc::new(open(o.clone()));
    let blocks = 512u64;
    d.write_at(
        &vec![1u8; (blocks * 4096) as usize],
        0,
        WriteFlags::default(),
    )
    .unwrap();
    let threads = 4u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                // Thread t owns the LBNs ≡ t (mod threads).
                let mut last = vec![1u8; blocks as usize];
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut buf = vec![0u8; 4096];
                for i in 0..6000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let lbn = (x % (blocks / threads)) * threads + t;
                    let v = (i % 250) as u8 + 2;
                    if x.is_multiple_of(41) {
                        d.trim(lbn * 4096, 4096, WriteFlags::default()).unwrap();
                        last[lbn as usize] = 0;
                    } else {
                        d.write_at(&vec![v; 4096], lbn * 4096, WriteFlags::default())
                            .unwrap();
                        last[lbn as usize] = v;
                    }
                    if i % 64 == 0 {
                        d.flush().unwrap();
                    }
                    if x.is_multiple_of(7) {
                        let l = (x >> 20) % (blocks / threads) * threads + t;
                        d.read_at(&mut buf, l * 4096).unwrap();
                        assert!(buf.iter().all(|&b| b == last[l as usize]), "LBN {l}");
                    }
                }
                last
            })
        })
        .collect();
    let mut want = vec![0u8; blocks as usize];
    for (t, h) in handles.into_iter().enumerate() {
        let last = h.join().unwrap();
        for l in (t as u64..blocks).step_by(threads as usize) {
            want[l as usize] = last[l as usize];
        }
    }
    let s = d.stats();
    assert!(s.gc_clusters > 20, "the collector must have run: {s:?}");
    let check = |d: &roamdisk_lbs::Lbs| {
        let mut buf = vec![0u8; 4096];
        for l in 0..blocks {
            d.read_at(&mut buf, l * 4096).unwrap();
            assert!(buf.iter().all(|&b| b == want[l as usize]), "LBN {l}");
        }
    };
    check(&d);
    drop(d);
    check(&open(o));
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

#[test]
fn write_stamps_and_cluster_ages_survive_a_reopen() {
    use roamdisk_lbs::gc::HOT;
    // Block 3 rewritten twice soon after its first write is hot: its next
    // write goes to the hot stream, in this session and after a reopen
    // (the close's compaction keeps the stamps in STAMPS entries; before
    // version 3 they were lost and the block counted as warm again).
    let img = mem_image(false, ChecksumKind::Crc32c);
    let block = |seed| pattern(seed, 4096);
    {
        let d = img.open(lopts()).unwrap();
        for seed in 0..3 {
            d.write_at(&block(seed), 3 * 4096, WriteFlags::default())
                .unwrap();
            d.flush().unwrap();
        }
        assert_eq!(d.stats().stream_blocks[HOT], 1, "{:?}", d.stats());
    }
    let d = img.open(lopts()).unwrap();
    d.write_at(&block(9), 3 * 4096, WriteFlags::default())
        .unwrap();
    d.flush().unwrap();
    assert_eq!(d.stats().stream_blocks[HOT], 1, "{:?}", d.stats());
    let mut x = vec![0u8; 4096];
    d.read_at(&mut x, 3 * 4096).unwrap();
    assert_eq!(x, block(9));
    drop(d);
    // The hints are in the log the close left.
    let log = img.log.live();
    let h = roamdisk_lbs::format::MetaHeader::parse(&log).unwrap();
    let r = roamdisk_lbs::replay::replay(&log, &h).unwrap();
    assert_ne!(r.hints.stamps[3], 0);
    assert!(r.hints.clusters.iter().any(|c| c.epoch != 0));
}

#[test]
fn a_log_whose_compacted_map_passes_the_limit_is_not_compacted_at_every_barrier() {
    // A limit below the compacted map's own size: compaction waits until
    // the log doubles (before, every barrier compacted, which on a 16 GiB
    // image of random writes took over half the server's CPU).
    let img = MemImage::new(
        &opts(4 << 20, false, ChecksumKind::Crc32c),
        Countdown::unarmed(),
    );
    let d = img
        .open(LbsOptions {
            compact_limit: 1,
            ..lopts()
        })
        .unwrap();
    let mut rng = roamdisk_blockdev::testkit::Rng::new(5);
    for i in 0..400u64 {
        let lbn = rng.below(1024);
        d.write_at(&pattern(i as u8, 4096), lbn * 4096, WriteFlags::default())
            .unwrap();
        d.flush().unwrap();
    }
    let s = d.stats();
    assert!(s.barriers >= 400, "{s:?}");
    assert!(
        s.compactions <= 12,
        "{} compactions for {} barriers",
        s.compactions,
        s.barriers
    );
}
