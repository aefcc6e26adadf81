//! The HTTP chunk server and its client: a commit, a checkout, a gc and
//! the fault answers (corrupt upload refused, missing object, full store)
//! all go through `roamdisk store serve`'s router on a loopback port; so
//! do batch gets (many objects in one request, asked again past an
//! answer's byte limit, object by object from a server without them) and
//! the emulated link in front of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::throttle::LinkSpec;
use roamdisk_blockdev::{BlockDev, ErrorKind, WriteFlags};
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, Source};
use roamdisk_chunkstore::gc::{gc, GcOptions};
use roamdisk_chunkstore::store::api::PutOutcome;
use roamdisk_chunkstore::store::{self, DynStore, StoreConfig};
use roamdisk_chunkstore::{ChunkId, NoProgress};
use roamdisk_roam::checkout::materialise;
use roamdisk_roam::view::VersionView;

type Running = (
    String,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
);

fn start(dir: &std::path::Path, quota: Option<u64>) -> Running {
    serve(local_store(dir, quota), true)
}

/// A local store in `dir` (created with `quota`).
fn local_store(dir: &std::path::Path, quota: Option<u64>) -> DynStore {
    let cfg = StoreConfig {
        quota,
        ..Default::default()
    };
    store::open(
        dir.to_str().unwrap(),
        &store::OpenOptions {
            create: Some(cfg),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Serve `local` on a loopback port, answering batch gets or not (as a
/// server from before them).
fn serve(local: DynStore, batch_get: bool) -> Running {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (atx, arx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let opts = roamdisk_chunkserver::ServerOptions {
            batch: batch_get,
            ..roamdisk_chunkserver::ServerOptions::new("127.0.0.1:0".parse().unwrap())
        };
        rt.block_on(roamdisk_chunkserver::serve(
            local,
            &opts,
            move |a| atx.send(a).unwrap(),
            async {
                let _ = rx.await;
            },
        ))
        .unwrap();
    });
    let addr = arx.recv().unwrap();
    (format!("http://{addr}"), tx, h)
}

fn disk() -> MemDev {
    let m = MemDev::new(2 << 20);
    let d = Rng::new(1).bytes(2 << 20);
    m.write_at(&d, 0, WriteFlags::default()).unwrap();
    m
}

#[test]
fn commit_checkout_gc_over_http() {
    let t = tempfile::tempdir().unwrap();
    let (url, stop, h) = start(&t.path().join("s"), None);
    let st = store::open(&url, &store::OpenOptions::default()).unwrap();
    let opts = CommitOptions {
        target: "bob/vm".into(),
        ..Default::default()
    };
    let s1 = commit_image(&*st, Source::Dev(&disk()), &opts, &NoProgress).unwrap();
    assert_eq!(s1.upload.new_objects, 32);
    let s2 = commit_image(&*st, Source::Dev(&disk()), &opts, &NoProgress).unwrap();
    assert_eq!(s2.upload.new_objects, 0, "everything deduplicated");
    assert_eq!(s2.upload.reused_objects, 32);
    let id = ChunkId::from_hex(&s2.version).unwrap();
    let view = VersionView::open(st.clone(), id, None).unwrap();
    let out = MemDev::new(2 << 20);
    materialise(&view, &out, &NoProgress).unwrap();
    let (mut a, mut b) = (vec![0u8; 2 << 20], vec![0u8; 2 << 20]);
    out.read_at(&mut a, 0).unwrap();
    disk().read_at(&mut b, 0).unwrap();
    assert!(a == b);
    let r = gc(&*st, &GcOptions::default(), &NoProgress).unwrap();
    assert_eq!(r.removed_objects, 0);
    assert_eq!(r.versions, 2);
    // A corrupt upload is refused by the server, naming the object.
    let sealed = st.config().codec().seal(b"hello", false);
    let mut bad = sealed.object.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    let e = st.put_many(&[(sealed.id, &bad)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains(&sealed.id.to_hex()), "{e}");
    let e = st.get(&sealed.id).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let _ = stop.send(());
    h.join().unwrap();
}

#[test]
fn full_store_answers_no_space() {
    let t = tempfile::tempdir().unwrap();
    let (url, stop, h) = start(&t.path().join("s"), Some(256 << 10));
    let st = store::open(&url, &store::OpenOptions::default()).unwrap();
    let opts = CommitOptions {
        target: "bob/vm".into(),
        ..Default::default()
    };
    let e = commit_image(&*st, Source::Dev(&disk()), &opts, &NoProgress).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(
        st.ref_get("bob/vm").unwrap().is_none(),
        "no version half-visible"
    );
    let _ = stop.send(());
    h.join().unwrap();
    let _ = Arc::new(());
}

/// `n` objects of `len` random bytes (seed `seed`) stored in `st`.
fn put_random(st: &DynStore, n: usize, len: usize, seed: u64) -> Vec<ChunkId> {
    let codec = st.config().codec();
    let mut rng = Rng::new(seed);
    let sealed: Vec<_> = (0..n).map(|_| codec.seal(&rng.bytes(len), false)).collect();
    let items: Vec<(ChunkId, &[u8])> = sealed.iter().map(|s| (s.id, &s.object[..])).collect();
    st.put_many(&items).unwrap();
    sealed.iter().map(|s| s.id).collect()
}

/// `get_many` over HTTP answers every object as the store holds it (each
/// verifies against its name), a missing one as not found, duplicates
/// twice: from a server with batch gets and from one without them (the
/// client falls back to one GET per object).
#[test]
fn batch_gets_and_the_fallback_for_servers_without_them() {
    for batch_get in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let local = local_store(&t.path().join("s"), None);
        let ids = put_random(&local, 70, 5000, 3);
        let (url, stop, h) = serve(local.clone(), batch_get);
        let st = store::open(&url, &store::OpenOptions::default()).unwrap();
        let absent = ChunkId([9; 32]);
        let mut ask = ids.clone();
        ask.insert(33, absent);
        ask.push(ids[5]);
        let got = st.get_many(&ask);
        assert_eq!(got.len(), ask.len());
        let codec = st.config().codec();
        for (id, r) in ask.iter().zip(&got) {
            if *id == absent {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
                assert!(e.to_string().contains(&absent.to_hex()), "{e}");
                continue;
            }
            let b = r.as_ref().unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(*b, local.get(id).unwrap(), "batch_get={batch_get}");
            codec.open(id, None, b).unwrap();
        }
        // A list of one, and an empty one.
        assert_eq!(
            *st.get_many(&ids[..1])[0].as_ref().unwrap(),
            local.get(&ids[0]).unwrap()
        );
        assert!(st.get_many(&[]).is_empty());
        let _ = stop.send(());
        h.join().unwrap();
    }
}

/// Objects past an answer's byte limit (32 MiB) are "not sent" and asked
/// for again: nine 4 MiB objects come back whole. The store reads no more
/// than the limit for one answer.
#[test]
fn a_batch_past_its_byte_limit_is_asked_for_again() {
    let t = tempfile::tempdir().unwrap();
    let local = local_store(&t.path().join("s"), None);
    let ids = put_random(&local, 9, 4 << 20, 4);
    let within = local.get_many_within(&ids, 10 << 20);
    let sent: Vec<bool> = within.iter().map(|r| r.is_some()).collect();
    assert_eq!(
        sent,
        [true, true, false, false, false, false, false, false, false]
    );
    let (url, stop, h) = serve(local.clone(), true);
    let st = store::open(&url, &store::OpenOptions::default()).unwrap();
    for (id, r) in ids.iter().zip(st.get_many(&ids)) {
        assert_eq!(r.unwrap(), local.get(id).unwrap());
    }
    let _ = stop.send(());
    h.join().unwrap();
}

/// `store serve --latency/--limit` (the throttle in front of the store)
/// charges a batch get one latency and every byte: 48 objects behind a
/// 300 ms link come in about one latency by batch gets (three batches in
/// flight), in six from a server without them (48 GETs, 8 at a time); and
/// 2 MiB behind a 1 MB/s link take 2 s either way.
#[test]
fn the_emulated_link_charges_a_batch_one_latency_and_every_byte() {
    let timed = |spec: LinkSpec, batch_get: bool, n: usize, len: usize| {
        let t = tempfile::tempdir().unwrap();
        let local = local_store(&t.path().join("s"), None);
        let ids = put_random(&local, n, len, 5);
        let slow: DynStore = Arc::new(roamdisk_chunkstore::store::throttle::ThrottleStore::new(
            local, spec,
        ));
        let (url, stop, h) = serve(slow, batch_get);
        let st = store::open(&url, &store::OpenOptions::default()).unwrap();
        let t0 = Instant::now();
        assert!(st.get_many(&ids).iter().all(|r| r.is_ok()));
        let took = t0.elapsed();
        let _ = stop.send(());
        h.join().unwrap();
        took
    };
    let latency = LinkSpec {
        rate: 0,
        latency: Duration::from_millis(300),
        burst: 64 << 10,
    };
    let batched = timed(latency, true, 48, 4096);
    let single = timed(latency, false, 48, 4096);
    assert!(batched >= Duration::from_millis(300), "{batched:?}");
    assert!(batched < Duration::from_millis(1200), "{batched:?}");
    assert!(single >= Duration::from_millis(1500), "{single:?}");
    let rate = LinkSpec {
        rate: 1_000_000,
        latency: Duration::ZERO,
        burst: 64 << 10,
    };
    let batched = timed(rate, true, 32, 65536);
    assert!(batched >= Duration::from_millis(1900), "{batched:?}");
}

/// A store that counts the `put_many` calls reaching it and the objects
/// they carry, each call taking at least `delay`.
struct Counting {
    inner: DynStore,
    calls: std::sync::atomic::AtomicUsize,
    objects: std::sync::atomic::AtomicUsize,
    delay: Duration,
}

impl Counting {
    fn new(inner: DynStore, delay: Duration) -> Counting {
        Counting {
            inner,
            calls: Default::default(),
            objects: Default::default(),
            delay,
        }
    }
}

impl store::api::StoreLayer for Counting {
    fn next(&self) -> Option<&dyn store::api::Store> {
        Some(&*self.inner)
    }
}
impl store::api::ChunkRead for Counting {}
impl store::api::ChunkWrite for Counting {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> roamdisk_blockdev::Result<Vec<PutOutcome>> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.objects
            .fetch_add(items.len(), std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(self.delay);
        self.inner.put_many(items)
    }
}
impl store::api::ChunkPrune for Counting {}
impl store::api::RefStore for Counting {}
impl store::api::LeaseStore for Counting {}

/// `put_many` over HTTP stores every object under its name and says which
/// were new: in a few batch puts from a server that takes them (each one
/// `put_many` of the store behind it, which an object store writes as one
/// pack), one PUT per object from a server without them; an object that
/// does not match its name is refused (422, `corrupt`) and nothing of its
/// batch is stored.
#[test]
fn batch_puts_and_the_fallback_for_servers_without_them() {
    for batch in [true, false] {
        let t = tempfile::tempdir().unwrap();
        let local = local_store(&t.path().join("s"), None);
        let counting = Arc::new(Counting::new(local.clone(), Duration::ZERO));
        let (url, stop, h) = serve(counting.clone(), batch);
        let st = store::open(&url, &store::OpenOptions::default()).unwrap();
        let codec = st.config().codec();
        let mut rng = Rng::new(7);
        let sealed: Vec<_> = (0..300)
            .map(|_| codec.seal(&rng.bytes(5000), false))
            .collect();
        local
            .put_many(&[(sealed[3].id, &sealed[3].object[..])])
            .unwrap();
        let items: Vec<(ChunkId, &[u8])> = sealed.iter().map(|s| (s.id, &s.object[..])).collect();
        let out = st.put_many(&items).unwrap();
        for (k, (o, s)) in out.iter().zip(&sealed).enumerate() {
            let want = if k == 3 {
                PutOutcome::Existed
            } else {
                PutOutcome::Stored
            };
            assert_eq!(*o, want, "object {k}, batch={batch}");
            assert_eq!(local.get(&s.id).unwrap(), s.object);
        }
        let calls = counting.calls.load(std::sync::atomic::Ordering::Relaxed);
        if batch {
            // 256 objects (the most a request takes), then 44: each one pack.
            assert_eq!(calls, 2, "{calls} put_many calls");
        } else {
            assert_eq!(calls, 300);
        }
        // A tampered object in a batch: refused, its batch-mates not stored.
        let a = codec.seal(&rng.bytes(100), false);
        let mut b = codec.seal(&rng.bytes(100), false);
        let last = b.object.len() - 1;
        b.object[last] ^= 1;
        let e = st
            .put_many(&[(a.id, &a.object[..]), (b.id, &b.object[..])])
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        if batch {
            assert!(local.get(&a.id).is_err());
        }
        let _ = stop.send(());
        h.join().unwrap();
    }
}

/// A commit through a chunk server puts a batch while it reads, hashes and
/// asks about the next ones: with a store that takes 600 ms per put, four
/// 16 MiB batches take well under four puts' time; a chunk that recurs in
/// every batch is put once, though the store cannot yet say it has it when
/// the later batches ask (its first put is still in flight).
#[test]
fn a_commit_keeps_batches_in_flight_and_puts_a_recurring_chunk_once() {
    let t = tempfile::tempdir().unwrap();
    let local = local_store(&t.path().join("s"), None);
    let counting = Arc::new(Counting::new(local.clone(), Duration::from_millis(600)));
    let (url, stop, h) = serve(counting.clone(), true);
    let st = store::open(&url, &store::OpenOptions::default()).unwrap();
    let mut rng = Rng::new(11);
    let size = 64usize << 20;
    let dev = MemDev::new(size as u64);
    let recurring = rng.bytes(256 << 10);
    for batch in 0..4 {
        let at = batch * (16 << 20);
        dev.write_at(&recurring, at as u64, WriteFlags::default())
            .unwrap();
        dev.write_at(
            &rng.bytes(4 << 20),
            (at + (1 << 20)) as u64,
            WriteFlags::default(),
        )
        .unwrap();
    }
    let opts = CommitOptions {
        target: "bob/vm".into(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let s = commit_image(&*st, Source::Dev(&dev), &opts, &NoProgress).unwrap();
    let took = t0.elapsed();
    let chunk = s.chunk_size as usize;
    let distinct = (256 << 10) / chunk + 4 * ((4 << 20) / chunk);
    let objects = counting.objects.load(std::sync::atomic::Ordering::Relaxed);
    // Every distinct chunk once, and the version package.
    assert_eq!(objects, distinct + 1, "objects put");
    assert_eq!(s.upload.new_objects as usize, distinct);
    // Four batch puts and the package's, 600 ms each: 3 s in a row.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let view = VersionView::open(st.clone(), ChunkId::from_hex(&s.version).unwrap(), None).unwrap();
    let out = MemDev::new(size as u64);
    materialise(&view, &out, &NoProgress).unwrap();
    let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
    out.read_at(&mut a, 0).unwrap();
    dev.read_at(&mut b, 0).unwrap();
    assert!(a == b, "checkout differs from the disk");
    let _ = stop.send(());
    h.join().unwrap();
}
