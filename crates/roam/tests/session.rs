//! A session end to end inside the crate: commit a disk, check it out into
//! a session, write through the `cas` layer (aligned, unaligned, zeroes),
//! survive a reopen, commit the useful updates with the filters, and read
//! every version back byte for byte against a model disk.

use std::sync::Arc;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::{BlockDev, Registry, WriteFlags, ZeroFlags};
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, Source};
use roamdisk_chunkstore::index::SectorState;
use roamdisk_chunkstore::store::{self, DynStore, StoreConfig};
use roamdisk_chunkstore::{ChunkId, NoProgress};
use roamdisk_roam::checkout::materialise;
use roamdisk_roam::guest::{GuestAnalyzer, GuestRegions, Regions};
use roamdisk_roam::session::dev::{CasDev, SessionOpen};
use roamdisk_roam::session::update::{commit_session, UpdateOptions};
use roamdisk_roam::session::{self, SessionConfig};
use roamdisk_roam::view::VersionView;

const SIZE: u64 = 4 << 20;

fn base_disk() -> MemDev {
    let m = MemDev::new(SIZE);
    let d: Vec<u8> = (0..SIZE as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    m.write_at(&d, 0, WriteFlags::default()).unwrap();
    // A zero region: chunks 40..48 stay holes.
    m.write_zeroes(40 * 65536, 8 * 65536, ZeroFlags::default())
        .unwrap();
    m
}

fn read_all(d: &dyn BlockDev) -> Vec<u8> {
    let mut v = vec![0u8; d.size() as usize];
    d.read_at(&mut v, 0).unwrap();
    v
}

struct Fixed(GuestRegions);
impl GuestAnalyzer for Fixed {
    fn analyze(&self, _: &dyn BlockDev) -> roamdisk_blockdev::Result<GuestRegions> {
        Ok(self.0.clone())
    }
}

fn open(dir: &std::path::Path) -> CasDev {
    CasDev::open(dir, &SessionOpen::default(), &Registry::with_builtin()).unwrap()
}

fn setup(
    encrypt: bool,
) -> (
    tempfile::TempDir,
    DynStore,
    ChunkId,
    Option<std::path::PathBuf>,
) {
    let (t, loc) = roamdisk_blockdev::testkit::scratch("store");
    let st = store::open(
        loc.to_str().unwrap(),
        &store::OpenOptions {
            create: Some(StoreConfig::default()),
            ..Default::default()
        },
    )
    .unwrap();
    let key_file = encrypt.then(|| {
        let p = t.path().join("user.key");
        roamdisk_chunkstore::version::create_key_file(&p).unwrap();
        p
    });
    let key = key_file
        .as_ref()
        .map(|p| roamdisk_chunkstore::version::read_key_file(p).unwrap());
    let s = commit_image(
        &*st,
        Source::Dev(&base_disk()),
        &CommitOptions {
            target: "golden/base".into(),
            description: "golden".into(),
            user_key: key,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    assert_eq!(s.upload.zero_chunks, 8);
    (t, st, ChunkId::from_hex(&s.version).unwrap(), key_file)
}

fn run(encrypt: bool) {
    let (t, st, v1, key_file) = setup(encrypt);
    let sdir = t.path().join("sess");
    let mut cfg = SessionConfig::new(t.path().join("store").to_str().unwrap(), "alice/desk");
    cfg.key_file = key_file.clone();
    session::create(&sdir, &cfg, v1, SIZE).unwrap();
    let model = base_disk();
    let both = |f: &dyn Fn(&dyn BlockDev)| {
        f(&model);
    };
    {
        let dev = open(&sdir);
        assert_eq!(read_all(&dev), read_all(&model));
        let w: &dyn Fn(&dyn BlockDev) = &|d: &dyn BlockDev| {
            d.write_at(&[0xAB; 4096], 8192, WriteFlags::default())
                .unwrap();
            d.write_at(&[0u8; 65536], 3 * 65536, WriteFlags::default())
                .unwrap();
            d.write_at(&[7u8; 100], 70_000, WriteFlags::default())
                .unwrap();
            d.write_zeroes(10 * 65536 + 100, 3000, ZeroFlags::default())
                .unwrap();
            d.write_at(&[9u8; 8192], 20 * 65536, WriteFlags::default())
                .unwrap();
            d.write_at(&[5u8; 512], 41 * 65536, WriteFlags::default())
                .unwrap();
        };
        w(&dev);
        both(w);
        dev.flush().unwrap();
        // Not flushed: may be lost, must not corrupt.
        dev.write_at(&[1u8; 512], 0, WriteFlags::default()).unwrap();
    }
    let dev = open(&sdir);
    let got = read_all(&dev);
    assert_eq!(
        &got[512..],
        &read_all(&model)[512..],
        "flushed writes survive a reopen"
    );
    dev.write_at(&got[..512], 0, WriteFlags::default()).unwrap();
    model
        .write_at(&got[..512], 0, WriteFlags::default())
        .unwrap();
    assert_eq!(dev.state(3 * 128), SectorState::Zero);
    assert_eq!(dev.state(16), SectorState::Dirty);

    // P2 drops the dirty sectors of chunk 20 (a "free" region).
    let regions = GuestRegions {
        free: Regions::new(vec![(20 * 65536, 65536)]),
        ..Default::default()
    };
    let opts = UpdateOptions {
        commit: CommitOptions {
            description: "work".into(),
            ..Default::default()
        },
        p1: true,
        p2: true,
        p3: true,
    };
    let s = commit_session(&dev, &opts, &Fixed(regions), &NoProgress).unwrap();
    let f = s.filters.unwrap();
    assert_eq!(f.dirty, 8 + 128 + 1 + 7 + 16 + 1 + 1, "{f:?}");
    assert_eq!(f.p1_zero, 128 + 5, "{f:?}");
    assert_eq!(f.p2_free, 16, "{f:?}");
    assert_eq!(f.committed, f.dirty - f.p1_zero - f.p2_free);
    assert_eq!(s.catalog, "alice/desk");
    assert_eq!(s.encrypted, encrypt);
    // The session still reads what the guest wrote (dropped sectors too).
    assert_eq!(read_all(&dev), read_all(&model));
    assert_eq!(dev.usage()[SectorState::Dirty as usize], 0);
    // The version has the base's bytes where P2 dropped the writes.
    let v2 = ChunkId::from_hex(&s.version).unwrap();
    let key = key_file.map(|p| roamdisk_chunkstore::version::read_key_file(&p).unwrap());
    let view = VersionView::open(st.clone(), v2, key.as_ref()).unwrap();
    let out = MemDev::new(SIZE);
    materialise(&view, &out, &NoProgress).unwrap();
    let mut want = read_all(&model);
    let orig = read_all(&base_disk());
    let r = 20 * 65536..20 * 65536 + 8192;
    want[r.clone()].copy_from_slice(&orig[r]);
    assert_eq!(read_all(&out), want);
    assert_eq!(read_all(&view), want);
    drop(dev);
    // The rebased session reopens on the new base.
    let dev = open(&sdir);
    assert_eq!(dev.base().id, v2);
    assert_eq!(read_all(&dev), read_all(&model));
    let _ = Arc::new(());
}

#[test]
fn session_round_trip_plain() {
    run(false);
}

#[test]
fn session_round_trip_encrypted() {
    run(true);
}

/// Regression: a FUA write deadlocked on itself. `write_at` held the stripe
/// locks of the chunk it wrote while its FUA flush kept the chunks the
/// shared cache had refused in the private cache, which takes the same
/// locks: a guest that read a chunk the full cache then refused, and wrote
/// into that chunk with FUA, hung that NBD request and every later one
/// (seen as a hang of `cas_session_cache`'s full-cache test once reads
/// fetched several chunks at a time). The flush now runs after the locks
/// are released.
#[test]
fn a_fua_write_into_a_chunk_the_shared_cache_refused_does_not_hang() {
    let (_t, sc, dev) = session_over_small_shared_cache(2);
    let dev = Arc::new(dev);
    let mut buf = vec![0u8; 4096];
    // Fill the cache with pinned chunks 0 and 1.
    for c in 0..2u64 {
        dev.read_at(&mut buf, c * 65536).unwrap();
    }
    dev.base().shared_cache().unwrap().sync().unwrap();
    assert_eq!(sc.usage().unwrap().0, 2);
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dev.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        // Chunk 5 is refused in the background, then written with FUA.
        let r = d
            .read_at(&mut buf, 5 * 65536)
            .and_then(|_| d.write_at(&[0x5a; 4096], 5 * 65536 + 8192, WriteFlags { fua: true }));
        let _ = tx.send(r);
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("the FUA write hung")
        .unwrap();
    let mut got = vec![0u8; 65536];
    dev.read_at(&mut got, 5 * 65536).unwrap();
    let model = read_all(&base_disk());
    assert_eq!(got[..8192], model[5 * 65536..][..8192]);
    assert!(got[8192..12288].iter().all(|&x| x == 0x5a));
    assert_eq!(got[12288..], model[5 * 65536 + 12288..][..65536 - 12288]);
}

/// A session of the base (plain) over a new shared cache of `chunks`
/// 64 KiB chunks (LRU): the temporary folder (keep it alive), the cache,
/// the session.
fn session_over_small_shared_cache(
    chunks: u64,
) -> (tempfile::TempDir, roamdisk_roam::cache::SharedCache, CasDev) {
    use roamdisk_roam::cache::{CacheOptions, SharedCache, SharedChoice};
    let (t, _st, v1, _) = setup(false);
    let scdir = t.path().join("shared");
    let sc = SharedCache::open(
        &scdir,
        &CacheOptions {
            size: chunks * 65536,
            unit: 65536,
            policy: "lru".into(),
        },
    )
    .unwrap();
    let sdir = t.path().join("sess");
    let cfg = SessionConfig::new(t.path().join("store").to_str().unwrap(), "alice/desk");
    session::create(&sdir, &cfg, v1, SIZE).unwrap();
    let opts = SessionOpen {
        shared_cache: SharedChoice::Dir(scdir),
        ..Default::default()
    };
    let dev = CasDev::open(&sdir, &opts, &Registry::with_builtin()).unwrap();
    (t, sc, dev)
}

/// Seed section 3.3: when the shared cache is full of chunks that running
/// sessions still need (pinned), a chunk it cannot keep goes into the
/// reading session's private cache (its sectors become CLEAN) and is never
/// fetched again; the pinned chunks all stay.
#[test]
fn a_full_pinned_shared_cache_sends_chunks_to_the_private_cache() {
    let (_t, sc, dev) = session_over_small_shared_cache(4);
    let model = read_all(&base_disk());
    // The session pins every chunk of its base: the first four read fill
    // the cache, the rest are refused.
    let mut buf = vec![0u8; 4096];
    for round in 0..2 {
        for c in 0..8u64 {
            dev.read_at(&mut buf, c * 65536 + 4096).unwrap();
            assert_eq!(
                buf,
                model[(c * 65536 + 4096) as usize..][..4096],
                "{round} {c}"
            );
        }
        sc.sync().unwrap();
        let handle = dev.base();
        let shared = handle.shared_cache().unwrap();
        shared.sync().unwrap();
    }
    assert_eq!(sc.usage().unwrap().0, 4, "the cap holds");
    // Chunks 4..8 were refused, then kept in the private cache: CLEAN.
    for c in 4..8u64 {
        assert_eq!(dev.state(c * 128 + 1), SectorState::Clean, "chunk {c}");
    }
    for c in 0..4u64 {
        assert_eq!(dev.state(c * 128 + 1), SectorState::Empty, "chunk {c}");
    }
    let fetched = dev.base().fetch_stats().chunks;
    assert_eq!(read_all(&dev), model);
    assert!(fetched >= 8, "{fetched}");
    // Reading the first eight chunks again fetches nothing.
    let before = dev.base().fetch_stats().chunks;
    for c in 0..8u64 {
        dev.read_at(&mut buf, c * 65536).unwrap();
    }
    assert_eq!(dev.base().fetch_stats().chunks, before);
    dev.flush().unwrap();
}

/// `block_status` of a version and of a fresh session over it answers
/// sector by sector what the data is: holes for no-chunk records, zero for
/// ZERO sectors inside a chunk, data elsewhere — also when it takes whole
/// chunks at once.
#[test]
fn block_status_matches_the_sectors() {
    let t = tempfile::tempdir().unwrap();
    let st = store::open(
        t.path().join("store").to_str().unwrap(),
        &store::OpenOptions {
            create: Some(StoreConfig::default()),
            ..Default::default()
        },
    )
    .unwrap();
    let disk = base_disk();
    // Zero sectors inside data chunks: a few single sectors and a run
    // across a chunk boundary.
    for s in [3u64, 130, 131, 255, 1000] {
        disk.write_at(&[0u8; 512], s * 512, WriteFlags::default())
            .unwrap();
    }
    disk.write_at(&vec![0u8; 4096], 10 * 65536 - 2048, WriteFlags::default())
        .unwrap();
    let s = commit_image(
        &*st,
        Source::Dev(&disk),
        &CommitOptions {
            target: "u/bs".into(),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let id = ChunkId::from_hex(&s.version).unwrap();
    let view = VersionView::open(st.clone(), id, None).unwrap();
    let data = read_all(&disk);
    let want = |off: u64| -> roamdisk_blockdev::Alloc {
        let chunk = (off / 65536) as usize;
        if (40..48).contains(&chunk) {
            roamdisk_blockdev::Alloc::Hole
        } else if data[off as usize..off as usize + 512]
            .iter()
            .all(|&b| b == 0)
        {
            roamdisk_blockdev::Alloc::Zero
        } else {
            roamdisk_blockdev::Alloc::Data
        }
    };
    let check = |dev: &dyn BlockDev, what: &str| {
        // From several starting points, including unaligned ones.
        for start in [0u64, 512, 65536 - 1024, 39 * 65536 + 512] {
            let ext = roamdisk_blockdev::extents_covering(dev, start, SIZE - start).unwrap();
            let mut pos = start;
            for e in ext {
                let mut s = pos;
                while s < pos + e.len {
                    let sec = s / 512 * 512;
                    assert_eq!(e.state, want(sec), "{what}: byte {s}");
                    s = (sec + 512).min(pos + e.len);
                }
                pos += e.len;
            }
            assert_eq!(pos, SIZE, "{what}: the extents cover the disk");
        }
    };
    check(&view, "version");
    let sdir = t.path().join("sess");
    let cfg = SessionConfig::new(t.path().join("store").to_str().unwrap(), "u/bs");
    session::create(&sdir, &cfg, id, SIZE).unwrap();
    let dev = open(&sdir);
    check(&dev, "session");
}
