//! Time travel: a 5-version history built by a session (writes of
//! patterns, zeroes and unaligned bytes through the `cas` layer over NBD,
//! committed after each step) checks out byte-identical to a reference
//! image kept alongside — every version, by id, by tag and by date —
//! verified with `qemu-img compare`.

mod cas_common;
mod common;

use cas_common::{
    checkout, checkout_fail, checkout_same, commit, commit_session, commit_version, json_num,
    json_str, open_session, qemu_io_session, rd, s3_base, Cas, ChunkServer,
};
use common::{path_str, qemu_io, run, run_stdout, Server};

/// `qemu-img compare -f raw -F FORMAT REFERENCE IMAGE`.
fn compare_with(reference: &std::path::Path, format: &str, image: &str) {
    let r = path_str(reference);
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", format, r, image],
    );
}

#[test]
fn five_versions_check_out_byte_identical() {
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());
    let reference = cas.random_file("ref.img", 24 << 20, 11);
    // Some all-zero chunks in the golden image.
    qemu_io(path_str(&reference), &["write -z 8M 2M".into()]);
    let out = commit(s, path_str(&reference), "carol/vm", &["-m", "v1", "--json"]);
    let mut ids = vec![json_str(&out, "version")];
    let mut refs = vec![dir.join("ref1.img")];
    std::fs::copy(&reference, &refs[0]).unwrap();
    let sess = dir.join("sess");
    open_session(s, "carol/vm", &sess, &[]);
    let log_json = || rd(&["log", "carol/vm", "--store", s, "--json"]);
    let mut created = vec![json_num(&log_json(), "created_ns")];
    for k in 2..=5u32 {
        let cmds: Vec<String> = vec![
            format!("write -P {k} {}M 300k", k * 2),
            format!("write -z {}M 128k", k + 10),
            format!("write -P {} {} 1000", k + 100, k * 1_000_003),
            format!("write -P 0 {}M 64k", 20 + k / 2),
        ];
        qemu_io_session(dir, &sess, &cmds);
        qemu_io(path_str(&reference), &cmds);
        let out = commit_session(&sess, &["-m", &format!("v{k}"), "--json"]);
        ids.push(json_str(&out, "version"));
        let r = dir.join(format!("ref{k}.img"));
        std::fs::copy(&reference, &r).unwrap();
        refs.push(r);
        created.push(json_num(&log_json(), "created_ns"));
        // Dates are resolved to the second: keep commits apart.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let log = rd(&["log", "carol/vm", "--store", s]);
    assert_eq!(log.lines().count(), 6, "{log}");
    let third = format!("carol/vm@{}", &ids[2][..10]);
    rd(&["tag", &third, "--store", s, "three"]);
    for (k, id) in ids.iter().enumerate() {
        let out = dir.join(format!("out{k}.raw"));
        checkout(s, &format!("carol/vm@{}", &id[..8]), &out, &[]);
        compare_with(&refs[k], "raw", path_str(&out));
    }
    // By tag, as qcow2.
    let q = dir.join("three.qcow2");
    checkout(s, "carol/vm@three", &q, &["--format", "qcow2"]);
    compare_with(&refs[2], "qcow2", path_str(&q));
    // By date: the second after version 4 was committed.
    let secs = created[3] / 1_000_000_000 + 1;
    let date = run_stdout(
        "date",
        &["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"],
    );
    let out = dir.join("bydate.raw");
    checkout(s, &format!("carol/vm@{}", date.trim()), &out, &[]);
    compare_with(&refs[3], "raw", path_str(&out));
    // Read-only serving of an old version.
    let srv = Server::start(
        dir,
        &[
            &format!("cas-version[store={s}]:carol/vm@{}", &ids[1][..8]),
            "--read-only",
        ],
    );
    compare_with(&refs[1], "raw", &srv.uri());
}

/// A history longer than a catalog's ref keeps. With segments of 4
/// entries (`ROAMDISK_CATALOG_SEGMENT`; 512 by default), 30 commits seal
/// the oldest versions into segment objects: `log` still lists all 30,
/// any of them checks out by id prefix and by tag (a tag moved by a later
/// commit names the newest holder), `rm` and `tag` of a sealed version
/// rewrite the segments, two commits at once both stay, a gc keeps every
/// listed version, and the ref itself stays small (a local store).
#[test]
fn a_long_history_is_sealed_into_segments_and_read_whole() {
    // SAFETY: set before this test starts any thread; the roamdisk
    // processes it runs inherit it.
    unsafe { std::env::set_var("ROAMDISK_CATALOG_SEGMENT", "4") };
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());
    let img = cas.random_file("d.img", 256 << 10, 5);
    let copy = |k: u32| dir.join(format!("v{k}.img"));
    let mut ids = Vec::new();
    for k in 0..30u32 {
        // Each version differs from the others: its number up front.
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &k.to_le_bytes(), 0).unwrap();
        drop(f);
        std::fs::copy(&img, copy(k)).unwrap();
        let desc = format!("v{k}");
        let mut extra = vec!["-m", desc.as_str()];
        match k {
            3 => extra.extend(["--tag", "three"]),
            5 | 25 => extra.extend(["--tag", "moving"]),
            _ => {}
        }
        ids.push(commit_version(s, path_str(&img), "u/vm", &extra));
    }
    let listed = |n: usize| {
        let log = rd(&["log", "u/vm", "--store", s]);
        assert_eq!(log.lines().count(), n + 1, "{log}");
        log
    };
    let log = listed(30);
    assert!(log.contains(" v0") || log.contains("v0\n"), "{log}");
    if s3_base().is_none() {
        // 30 entries are ~3.7 KB; the ref keeps 4-7 of them and the
        // segments' descriptors.
        let r = std::fs::metadata(cas.dir().join("store/refs/u/vm"))
            .unwrap()
            .len();
        assert!(r < 1800, "the catalog's ref is {r} bytes");
    }
    let out = dir.join("out.raw");
    checkout_same(s, "u/vm@three", &copy(3), &out);
    checkout_same(s, "u/vm@moving", &copy(25), &out);
    checkout_same(s, &format!("u/vm@{}", &ids[1][..12]), &copy(1), &out);
    checkout_same(s, "u/vm", &copy(29), &out);
    // Remove and tag versions in the oldest segment.
    rd(&["rm", &format!("u/vm@{}", &ids[2][..12]), "--store", s]);
    listed(29);
    rd(&[
        "tag",
        &format!("u/vm@{}", &ids[0][..12]),
        "first",
        "--store",
        s,
    ]);
    checkout_same(s, "u/vm@first", &copy(0), &out);
    checkout_same(s, "u/vm@three", &copy(3), &out);
    checkout_same(s, "u/vm@moving", &copy(25), &out);
    let gone = checkout_fail(s, &format!("u/vm@{}", &ids[2][..12]), &out, &[]);
    assert!(gone.contains("no version"), "{gone}");
    // Two commits at once, at a seal: both stay.
    let a = cas.variant(&copy(29), "a.img", (4096, 1), 8192);
    let b = cas.variant(&copy(29), "b.img", (4096, 2), 8192);
    let both: Vec<String> = std::thread::scope(|t| {
        let ha = t.spawn(|| commit_version(s, path_str(&a), "u/vm", &[]));
        let hb = t.spawn(|| commit_version(s, path_str(&b), "u/vm", &[]));
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    listed(31);
    rd(&["gc", "--store", s]);
    rd(&["store", "verify", "--store", s]);
    for (rev, want) in [
        (ids[0].clone(), copy(0)),
        (ids[1].clone(), copy(1)),
        (ids[4].clone(), copy(4)),
        (ids[28].clone(), copy(28)),
        (both[0].clone(), a.clone()),
        (both[1].clone(), b.clone()),
    ] {
        checkout_same(s, &format!("u/vm@{}", &rev[..12]), &want, &out);
    }
    listed(31);
    // Through a chunk server: its client seals as a local store's does; an
    // S3 store behind it keeps the catalog whole (it unseals what it gets).
    let srv = ChunkServer::start(s, &[]);
    for k in 0..6u32 {
        let v = cas.variant(&copy(29), &format!("h{k}.img"), (4096, 10 + k as u64), 0);
        let id = commit_version(&srv.url, path_str(&v), "u/vm", &[]);
        checkout_same(&srv.url, &format!("u/vm@{}", &id[..12]), &v, &out);
    }
    let log = rd(&["log", "u/vm", "--store", &srv.url]);
    assert_eq!(log.lines().count(), 38, "{log}");
    checkout_same(&srv.url, &format!("u/vm@{}", &ids[1][..12]), &copy(1), &out);
    drop(srv);
    listed(37);
    rd(&["store", "verify", "--store", s]);
}
