//! Roaming: a session reads through the host's shared cache and lookaside
//! media before the network (Machine Bank 3.1-3.3, ISR lookaside caching),
//! and `throttle` makes a slow link on loopback.
//!
//! The proofs take the network away: once the chunk server is killed, any
//! chunk the session would fetch fails the read, so a session that still
//! reads every byte right got them all from the cache or the medium.

mod cas_common;
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cas_common::{
    commit_version, convert_ok, hoard, json_num, open_session, read_all, Cas, ChunkServer,
};
use common::{
    path_str, poll_until, qemu_img_compare, qemu_img_convert, qemu_io, rd_fail, roamdisk, Server,
};

const SIZE: u64 = 8 << 20;
const CHUNKS: usize = (SIZE / 65536) as usize;

/// Every chunk file under the cache's `chunks/` folder (none before the
/// cache exists).
fn chunk_paths(cache: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(cache.join("chunks")) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn chunk_files(cache: &Path) -> usize {
    chunk_paths(cache).len()
}

/// Session `sess` reads the whole disk (`src`) through the shared cache
/// `cache` (`opts`), its server killed -9 once the cache holds every chunk.
fn fill_shared_cache_then_kill_9(dir: &Path, src: &Path, sess: &Path, cache: &Path, opts: &str) {
    let srv = Server::start(dir, &[&format!("cas[{opts}]:{}", sess.display())]);
    let out = dir.join("out.raw");
    assert!(convert_ok(&srv.uri(), &out));
    qemu_img_compare(path_str(src), path_str(&out));
    poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
        chunk_files(cache) >= CHUNKS
    });
    assert_eq!(
        chunk_files(cache),
        CHUNKS,
        "every chunk in the shared cache"
    );
    srv.kill9();
}

/// A store, the disk committed to it, its chunk server, and sessions.
type Setup = (Cas, PathBuf, ChunkServer, Vec<PathBuf>);

/// A store with an 8 MiB random disk committed as `u/vm`, its chunk
/// server, and sessions s1..sN checked out over HTTP.
fn setup(sessions: usize) -> Setup {
    setup_in(Cas::new(), sessions)
}

/// [`setup`] in the store CAS.
fn setup_in(cas: Cas, sessions: usize) -> Setup {
    let src = cas.random_file("disk.raw", SIZE, 11);
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let srv = ChunkServer::start(cas.s(), &[]);
    let sess = (1..=sessions)
        .map(|i| {
            let s = cas.dir().join(format!("s{i}"));
            open_session(&srv.url, "u/vm", &s, &[]);
            s
        })
        .collect();
    (cas, src, srv, sess)
}

#[test]
fn what_one_session_fetched_is_never_fetched_again_even_after_kill_9() {
    let (cas, src, chunk_server, s) = setup(3);
    let dir = cas.dir();
    let cache = dir.join("shared");
    let opts = format!("shared-cache={}", cache.display());
    // Session 1 reads the whole disk over HTTP; its server is killed -9
    // once the cache holds every chunk.
    fill_shared_cache_then_kill_9(dir, &src, &s[0], &cache, &opts);
    let out = dir.join("out.raw");
    // The network goes away.
    drop(chunk_server);
    // Session 2, on the same host, reads everything from the cache.
    assert!(
        read_all(dir, &s[1], &opts, &out),
        "served from the shared cache"
    );
    qemu_img_compare(path_str(&src), path_str(&out));
    // Without the cache the same read needs the store, and fails.
    assert!(!read_all(dir, &s[2], "shared-cache=off", &out));
}

#[test]
fn a_chunk_file_cut_short_or_removed_after_kill_9_is_fetched_again_never_served() {
    let (cas, src, chunk_server, s) = setup(3);
    let dir = cas.dir();
    let cache = dir.join("shared");
    let opts = format!("shared-cache={}", cache.display());
    fill_shared_cache_then_kill_9(dir, &src, &s[0], &cache, &opts);
    let out = dir.join("out.raw");
    // What a crash or a careless hand can leave: a file cut short, a file
    // gone, both still named by the journal (the cache opens by names).
    let files = chunk_paths(&cache);
    let (cut, gone) = (&files[3], &files[40]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(cut)
        .unwrap()
        .set_len(1000)
        .unwrap();
    std::fs::remove_file(gone).unwrap();
    // Session 2 reads every byte right: the two are fetched again...
    assert!(read_all(dir, &s[1], &opts, &out), "read with the store up");
    qemu_img_compare(path_str(&src), path_str(&out));
    // ... and put back whole.
    poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
        [cut, gone]
            .iter()
            .all(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == 65536))
    });
    // So with the network gone the cache alone serves the whole disk.
    drop(chunk_server);
    assert!(
        read_all(dir, &s[2], &opts, &out),
        "served from the shared cache"
    );
    qemu_img_compare(path_str(&src), path_str(&out));
}

#[test]
fn lookaside_media_serve_chunks_and_wrong_or_damaged_ones_cost_only_time() {
    // Local: a chunk-store folder serves as a lookaside medium below.
    let (cas, src, chunk_server, s) = setup_in(Cas::local(), 5);
    let dir = cas.dir();
    let url = chunk_server.url.clone();
    let out = dir.join("out.raw");
    let no_cache = "shared-cache=off";
    // A damaged copy (one byte of chunk 3) and an unrelated file.
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[3 * 65536 + 100] ^= 0x40;
    let damaged = dir.join("damaged.raw");
    std::fs::write(&damaged, &bytes).unwrap();
    let wrong = cas.random_file("wrong.raw", SIZE, 99);
    // With the store up, a wrong or a damaged medium still reads right.
    for medium in [&wrong, &damaged] {
        let opts = format!("{no_cache},store={url},lookaside={}", medium.display());
        assert!(read_all(dir, &s[0], &opts, &out), "{}", medium.display());
        qemu_img_compare(path_str(&src), path_str(&out));
    }
    drop(chunk_server);
    // With the store gone, the right medium serves every chunk...
    let opts = format!("{no_cache},lookaside={}", src.display());
    assert!(read_all(dir, &s[1], &opts, &out), "served from the medium");
    qemu_img_compare(path_str(&src), path_str(&out));
    // ...and the damaged one is refused where it is damaged (the chunk
    // is needed from the store, which is gone), never served.
    let opts = format!("{no_cache},lookaside={}", damaged.display());
    assert!(!read_all(dir, &s[2], &opts, &out));
    // A chunk-store folder works as a medium too (what a resume set is).
    let opts = format!("{no_cache},lookaside={}", cas.store.display());
    assert!(
        read_all(dir, &s[3], &opts, &out),
        "served from a store folder"
    );
    qemu_img_compare(path_str(&src), path_str(&out));
}

#[test]
fn throttle_holds_reads_to_its_rate_and_store_serve_limits_too() {
    let cas = Cas::new();
    let dir = cas.dir();
    let src = cas.random_file("disk.raw", 4 << 20, 5);
    // 8 Mbit/s = 1 MB/s: 2 MiB takes at least 2 s less one burst (64K).
    let srv = Server::start(
        dir,
        &[&format!(
            "throttle[rate=8Mbit,latency=1ms]:raw:{}",
            src.display()
        )],
    );
    let t0 = Instant::now();
    let got = qemu_io(&srv.uri(), &["read 0 2M".into()]);
    let took = t0.elapsed();
    assert!(got.contains("read 2097152/2097152"), "{got}");
    assert!(took >= Duration::from_millis(2000), "{took:?}");
    let out = dir.join("out.raw");
    qemu_img_convert(&srv.uri(), "raw", path_str(&out));
    qemu_img_compare(path_str(&src), path_str(&out));
    srv.stop();
    // A chunk server limited to 16 Mbit/s serves 4 MiB in at least 2 s.
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let slow = ChunkServer::start(cas.s(), &["--limit", "16Mbit", "--latency", "8ms"]);
    let t0 = Instant::now();
    let out = dir.join("checked-out.raw");
    let o = roamdisk(&[
        "checkout",
        "u/vm",
        "--store",
        &slow.url,
        "--output",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        t0.elapsed() >= Duration::from_millis(2000),
        "{:?}",
        t0.elapsed()
    );
    qemu_img_compare(path_str(&src), path_str(&out));
    // Bad settings say what is expected.
    let e = roamdisk(&["info", "throttle[rate=fast]:mem:1M"]);
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success() && msg.contains("1Mbit"), "{msg}");
}

#[test]
fn hoard_fetches_a_whole_version_and_says_when_the_network_may_go() {
    let (cas, src, chunk_server, s) = setup(1);
    let dir = cas.dir();
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    let url = chunk_server.url.clone();
    let check = hoard(&url, "u/vm", sc, &["--check"]);
    assert!(check.contains(&format!("0 of {CHUNKS} chunks")), "{check}");
    let out = hoard(&url, "u/vm", sc, &[]);
    assert!(
        out.contains(&format!("{CHUNKS} of {CHUNKS} chunks")),
        "{out}"
    );
    assert!(out.contains("fully hoarded: the network may go"), "{out}");
    let again = hoard(&url, "u/vm", sc, &["--json"]);
    assert!(
        again.contains(&format!("\"cached_before\": {CHUNKS}")),
        "{again}"
    );
    assert!(again.contains("\"fetched\": 0"), "{again}");
    drop(chunk_server);
    let out_img = dir.join("out.raw");
    let opts = format!("shared-cache={}", cache.display());
    assert!(
        read_all(dir, &s[0], &opts, &out_img),
        "read offline after hoard"
    );
    qemu_img_compare(path_str(&src), path_str(&out_img));
    // A cache too small for the version refuses it before fetching
    // anything, saying what it needs against the cap.
    let small = dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    std::fs::write(
        small.join("cache.toml"),
        "magic = \"roamdisk-shared-cache\"\nversion = 1\nsize = 1048576\nunit = 65536\npolicy = \"lru\"\n",
    )
    .unwrap();
    let st = cas.s().to_string();
    let err = rd_fail(&[
        "hoard",
        "u/vm",
        "--store",
        &st,
        "--shared-cache",
        path_str(&small),
    ]);
    assert!(
        err.contains(&format!("needs {CHUNKS} chunks (8 MiB)"))
            && err.contains("at most 16 chunks (a cap of 1 MiB, 64 KiB per chunk)")
            && err.contains("Nothing was fetched"),
        "{err}"
    );
    assert_eq!(chunk_files(&small), 0);
}

/// The qcow2 image `qcow2` made by `qemu-img convert -O qcow2` from `raw`.
fn to_qcow2(raw: &Path, qcow2: &Path) {
    qemu_img_convert(path_str(raw), "qcow2", path_str(qcow2));
}

/// The command lines of running `qemu-nbd` processes that name a file
/// under `dir`.
fn qemu_nbd_serving(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd
            .split(' ')
            .next()
            .is_some_and(|a| a.ends_with("qemu-nbd"))
            && cmd.contains(path_str(dir))
        {
            out.push(cmd);
        }
    }
    out
}

#[test]
fn a_qcow2_image_serves_as_lookaside_through_qemu_nbd_and_a_wrong_or_damaged_one_costs_only_time() {
    let (cas, src, chunk_server, s) = setup(3);
    let dir = cas.dir();
    let url = chunk_server.url.clone();
    let good = dir.join("good.qcow2");
    to_qcow2(&src, &good);
    assert_eq!(&std::fs::read(&good).unwrap()[..4], b"QFI\xfb");
    let wrong = dir.join("wrong.qcow2");
    to_qcow2(&cas.random_file("wrong.raw", SIZE, 77), &wrong);
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[5 * 65536 + 9] ^= 0x80;
    let partial_raw = dir.join("partial.raw");
    std::fs::write(&partial_raw, &bytes).unwrap();
    let partial = dir.join("partial.qcow2");
    to_qcow2(&partial_raw, &partial);
    // Damaged: its active L1 table's offset (bytes 40..48, big-endian) is
    // not cluster-aligned, and qemu-nbd refuses the image.
    let damaged = dir.join("damaged.qcow2");
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[40..48].copy_from_slice(&12345u64.to_be_bytes());
    std::fs::write(&damaged, &bytes).unwrap();

    let hoard = |medium: &Path, cache: &str| {
        roamdisk(&[
            "hoard",
            "u/vm",
            "--store",
            &url,
            "--shared-cache",
            path_str(&dir.join(cache)),
            "--lookaside",
            path_str(medium),
            "--json",
        ])
    };
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    // The right image gives every chunk.
    let h = text(&hoard(&good, "c1"));
    assert_eq!(json_num(&h, "from_lookaside"), CHUNKS as u64, "{h}");
    assert!(h.contains("\"complete\": true"), "{h}");
    // Another image's: nothing matches by hash, all from the store.
    let h = text(&hoard(&wrong, "c2"));
    assert_eq!(json_num(&h, "from_lookaside"), 0, "{h}");
    assert_eq!(json_num(&h, "fetched"), CHUNKS as u64, "{h}");
    // One chunk changed: that one from the store.
    let h = text(&hoard(&partial, "c3"));
    assert_eq!(json_num(&h, "from_lookaside"), CHUNKS as u64 - 1, "{h}");
    // A damaged image: a warning naming what qemu-nbd said, no panic, and
    // the hoard is whole from the store.
    let o = hoard(&damaged, "c4");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("qemu-nbd cannot read this qcow2 image") && err.contains("L1"),
        "{err}"
    );
    assert_eq!(json_num(&text(&o), "from_lookaside"), 0);

    // The index is kept by the qcow2 file's identity: hashed once, again
    // only when the file changes.
    let copy = dir.join("copy.qcow2");
    std::fs::copy(&good, &copy).unwrap();
    let indexes = |medium: &Path| {
        let o = roamdisk(&[
            "-v",
            "hoard",
            "u/vm",
            "--check",
            "--store",
            &url,
            "--shared-cache",
            path_str(&dir.join("c1")),
            "--lookaside",
            path_str(medium),
        ]);
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stderr).contains(": indexing ")
    };
    assert!(indexes(&copy), "first use");
    assert!(!indexes(&copy), "second use: the index is cached");
    std::fs::File::options()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    assert!(indexes(&copy), "changed: indexed again");

    // The network goes: the qcow2 image serves every byte.
    drop(chunk_server);
    let out = dir.join("out.raw");
    let opts = format!("shared-cache=off,lookaside={}", good.display());
    assert!(read_all(dir, &s[0], &opts, &out), "served from the qcow2");
    qemu_img_compare(path_str(&src), path_str(&out));
    // A damaged medium first: a warning, and the good one serves.
    let srv = Server::start(
        dir,
        &[&format!(
            "cas[shared-cache=off,lookaside={}+{}]:{}",
            damaged.display(),
            good.display(),
            s[1].display()
        )],
    );
    assert!(convert_ok(&srv.uri(), &out));
    let log = srv.log_text();
    srv.stop();
    assert!(
        log.contains("qemu-nbd cannot read this qcow2 image") && !log.contains("panicked"),
        "{log}"
    );
    qemu_img_compare(path_str(&src), path_str(&out));
    // Another image's qcow2 alone cannot stand in for the store: the reads
    // fail, cleanly.
    let opts = format!("shared-cache=off,lookaside={}", wrong.display());
    let srv = Server::start(dir, &[&format!("cas[{opts}]:{}", s[2].display())]);
    assert!(!convert_ok(&srv.uri(), &out));
    let log = srv.log_text();
    srv.stop();
    assert!(!log.contains("panicked"), "{log}");
    // No qemu-nbd outlives the session or hoard that started it.
    poll_until(Duration::from_secs(5), Duration::from_millis(50), || {
        qemu_nbd_serving(dir).is_empty()
    });
    assert_eq!(qemu_nbd_serving(dir), Vec::<String>::new());
    // Without qemu-nbd: an error that names it.
    let o = std::process::Command::new(common::bin())
        .env("PATH", "/nonexistent")
        .args([
            "hoard",
            "u/vm",
            "--check",
            "--store",
            cas.s(),
            "--shared-cache",
            path_str(&dir.join("c1")),
            "--lookaside",
            path_str(&good),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("qemu-nbd is not installed"),
        "{err}"
    );
}
