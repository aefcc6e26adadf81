//! The HTTP chunk server and its client: a commit, a checkout, a gc and
//! the fault answers (corrupt upload refused, missing object, full store)
//! all go through `roamdisk store serve`'s router on a loopback port.

use std::sync::Arc;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::{BlockDev, ErrorKind, WriteFlags};
use roamdisk_cas::commit::{commit_image, CommitOptions, Source};
use roamdisk_cas::gc::{gc, GcOptions};
use roamdisk_cas::store::{self, DynStore, StoreConfig};
use roamdisk_cas::view::{materialise, VersionView};
use roamdisk_cas::{ChunkId, NoProgress};

fn start(
    dir: &std::path::Path,
    quota: Option<u64>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let cfg = StoreConfig {
        quota,
        ..Default::default()
    };
    let local: DynStore = store::open(
        dir.to_str().unwrap(),
        &store::OpenOptions {
            create: Some(cfg),
            ..Default::default()
        },
    )
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (atx, arx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(roamdisk_cas::server::serve(
            local,
            &roamdisk_cas::server::ServerOptions::new("127.0.0.1:0".parse().unwrap()),
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
