//! Hoarding and the host's shared cache (`roamdisk hoard`, `roamdisk
//! cache`): a hoarded version stays in the cache while other images stream
//! through it, until it is released; a hoard killed -9 leaves a cache that
//! is whole; `cache status` says what is on disk, `cache verify` finds a
//! chunk damaged on purpose and the next read fetches it again.
//!
//! The proofs take the network away where it matters: once the chunk
//! server is gone, a session that still reads every byte right read them
//! from the cache.

mod cas_common;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cas_common::{
    convert_ok, hoard, json_num, json_str, open_session, random_version, read_all, Cas, ChunkServer,
};
use common::{bin, path_str, poll_until, qemu_img_compare, rd, rd_fail, Server};

const CHUNK: u64 = 65536;

/// A shared cache in `dir/NAME` that holds `chunks` chunks of 64 KiB (its
/// `cache.toml` written as `roamdisk` writes it).
fn small_cache(dir: &Path, name: &str, chunks: u64) -> PathBuf {
    let c = dir.join(name);
    std::fs::create_dir_all(&c).unwrap();
    std::fs::write(
        c.join("cache.toml"),
        format!(
            "magic = \"roamdisk-shared-cache\"\nversion = 2\nsize = {}\nunit = 65536\npolicy = \"lru\"\n",
            chunks * CHUNK
        ),
    )
    .unwrap();
    c
}

/// The chunk files in a shared cache's folder.
fn chunk_files(cache: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(cache.join("chunks")) {
        for fan in rd {
            for f in std::fs::read_dir(fan.unwrap().path()).unwrap() {
                v.push(f.unwrap().path());
            }
        }
    }
    v.sort();
    v
}

fn status_json(cache: &Path) -> String {
    rd(&[
        "cache",
        "status",
        "--json",
        "--shared-cache",
        path_str(cache),
    ])
}

/// `cache status --json` agrees with the folder: its chunks and bytes are
/// the chunk files and their sizes. Returns the chunk count.
fn status_matches_disk(cache: &Path) -> u64 {
    let s = status_json(cache);
    let files = chunk_files(cache);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(json_num(&s, "chunks"), files.len() as u64, "{s}");
    assert_eq!(json_num(&s, "bytes"), bytes, "{s}");
    files.len() as u64
}

/// A new store holding `u/vm`, an 8 MiB (128-chunk) random disk (SEED):
/// the store and the disk.
fn store_with_vm(seed: u64) -> (Cas, PathBuf) {
    let cas = Cas::new();
    let (src, _) = random_version(&cas, ("disk.raw", 8 << 20, seed), "u/vm", &[]);
    (cas, src)
}

/// `roamdisk hoard IMAGE --check --json`: the level, nothing fetched.
fn hoard_check(store: &str, image: &str, cache: &Path) -> String {
    hoard(store, image, path_str(cache), &["--check", "--json"])
}

/// Two images of random chunks (SEED, SEED + 1) committed to CAS: `u/h`,
/// 16 chunks, to hoard, and `u/o`, 32, to stream through: their files.
fn hoarded_and_other(cas: &Cas, seed: u64) -> (PathBuf, PathBuf) {
    let (h, _) = random_version(cas, ("hoarded.raw", 16 * CHUNK, seed), "u/h", &[]);
    let (o, _) = random_version(cas, ("other.raw", 32 * CHUNK, seed + 1), "u/o", &[]);
    (h, o)
}

#[test]
fn a_hoarded_version_stays_while_other_images_stream_through_until_released() {
    let cas = Cas::new();
    let dir = cas.dir();
    // The hoarded version: 16 chunks; the other image: 32; the cache: 24.
    let (h, o) = hoarded_and_other(&cas, 1);
    let chunk_server = ChunkServer::start(cas.s(), &[]);
    let url = chunk_server.url.clone();
    let sess = |name: &str, image: &str| {
        let s = dir.join(name);
        open_session(&url, image, &s, &[]);
        s
    };
    let (s_h, s_o1, s_o2) = (sess("s-h", "u/h"), sess("s-o1", "u/o"), sess("s-o2", "u/o"));
    let cache = small_cache(dir, "shared", 24);
    let sc = path_str(&cache);
    let out = hoard(&url, "u/h", sc, &[]);
    assert!(out.contains("16 of 16 chunks"), "{out}");
    assert!(out.contains("hoarded: the cache keeps it"), "{out}");

    // Another image read through a session on the same host: 32 chunks
    // through a cache of 24, 16 of them hoarded. Without the hoard mark
    // LRU would evict the hoarded chunks first (they are the oldest).
    let opts = format!("shared-cache={sc}");
    let got = dir.join("got.raw");
    assert!(read_all(dir, &s_o1, &opts, &got));
    qemu_img_compare(path_str(&o), path_str(&got));
    let check = hoard_check(&url, "u/h", &cache);
    assert_eq!(json_num(&check, "cached_after"), 16, "{check}");
    assert!(check.contains("\"hoarded\": true"), "{check}");
    assert!(check.contains("\"complete\": true"), "{check}");
    let n = status_matches_disk(&cache);
    assert!((17..=24).contains(&n), "the other image used the rest: {n}");
    let st = status_json(&cache);
    assert_eq!(json_num(&st, "hoarded_chunks"), 16, "{st}");
    assert_eq!(json_num(&st, "present_chunks"), 16, "{st}");

    // The network goes: the hoarded version reads whole from the cache.
    drop(chunk_server);
    assert!(read_all(dir, &s_h, &opts, &got), "read offline");
    qemu_img_compare(path_str(&h), path_str(&got));

    // Released (offline: the mark names the version), the other image's
    // next session evicts the hoarded chunks like any others.
    let rel = rd(&["hoard", "--release", "u/h", "--shared-cache", sc]);
    assert!(rel.contains("released u/h@"), "{rel}");
    let none = rd_fail(&["hoard", "--release", "u/h", "--shared-cache", sc]);
    assert!(none.contains("is not hoarded"), "{none}");
    let chunk_server = ChunkServer::start(cas.s(), &[]);
    let opts2 = format!("{opts},store={}", chunk_server.url);
    assert!(read_all(dir, &s_o2, &opts2, &got));
    qemu_img_compare(path_str(&o), path_str(&got));
    let check = hoard_check(&chunk_server.url, "u/h", &cache);
    assert!(check.contains("\"hoarded\": false"), "{check}");
    assert_eq!(json_num(&check, "cached_after"), 0, "{check}");
    status_matches_disk(&cache);
}

#[test]
fn a_hoard_killed_9_leaves_a_whole_cache_and_the_next_one_fetches_the_rest() {
    let (cas, _) = store_with_vm(3);
    let dir = cas.dir();
    // 16 Mbit/s: the 128 chunks take about 4 s to come.
    let slow = ChunkServer::start(cas.s(), &["--limit", "16Mbit"]);
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    let mut hoarding = Command::new(bin())
        .args(["hoard", "u/vm", "--store", &slow.url, "--shared-cache", sc])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn roamdisk hoard");
    poll_until(Duration::from_secs(60), Duration::from_millis(5), || {
        !chunk_files(&cache).is_empty()
    });
    hoarding.kill().expect("kill -9 the hoard");
    hoarding.wait().unwrap();
    let before = chunk_files(&cache).len() as u64;
    assert!(
        (1..128).contains(&before),
        "killed in the middle: {before} chunks"
    );
    // Reopened, the cache is whole: the journal and the files agree, its
    // mark is there, every chunk matches its name.
    let n = status_matches_disk(&cache);
    let st = status_json(&cache);
    assert_eq!(json_num(&st, "present_chunks"), n, "{st}");
    assert_eq!(json_num(&st, "chunks"), n, "{st}");
    assert!(st.contains("\"complete\": false"), "{st}");
    let v = rd(&["cache", "verify", "--json", "--shared-cache", sc]);
    assert!(v.contains("\"damaged\": []"), "{v}");
    assert!(std::fs::read_dir(cache.join("tmp"))
        .unwrap()
        .next()
        .is_none());
    // The next hoard fetches only the rest.
    drop(slow);
    let out = hoard(cas.s(), "u/vm", sc, &["--json"]);
    assert_eq!(json_num(&out, "cached_before"), n, "{out}");
    assert_eq!(json_num(&out, "fetched"), 128 - n, "{out}");
    assert!(out.contains("\"complete\": true"), "{out}");
    assert_eq!(status_matches_disk(&cache), 128);
}

#[test]
fn cache_status_verify_and_evict_tell_and_do_what_is_on_disk() {
    let (cas, src) = store_with_vm(4);
    let dir = cas.dir();
    let sess = dir.join("s");
    open_session(cas.s(), "u/vm", &sess, &[]);
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    let opts = format!("shared-cache={sc}");
    let got = dir.join("got.raw");
    assert!(read_all(dir, &sess, &opts, &got));
    assert_eq!(status_matches_disk(&cache), 128);
    let st = status_json(&cache);
    assert_eq!(json_num(&st, "evictable_chunks"), 128, "{st}");
    assert_eq!(json_num(&st, "capacity"), 65536, "{st}");
    assert_eq!(json_str(&st, "policy"), "lru");
    let table = rd(&["cache", "status", "--shared-cache", sc]);
    assert!(
        table.contains("8 MiB") && table.contains("128 chunks"),
        "{table}"
    );
    assert!(table.contains("no version is hoarded"), "{table}");

    // One chunk damaged in place, same size: a hit would serve it as is.
    let victim = chunk_files(&cache)[17].clone();
    let name = victim.file_name().unwrap().to_str().unwrap().to_string();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[1000] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();
    let v = rd(&["cache", "verify", "--json", "--shared-cache", sc]);
    assert_eq!(json_num(&v, "chunks"), 128, "{v}");
    assert_eq!(json_str(&v, "id"), name, "{v}");
    assert!(!victim.exists());
    assert_eq!(status_matches_disk(&cache), 127);
    // The next read fetches it again, right.
    assert!(read_all(dir, &sess, &opts, &got));
    qemu_img_compare(path_str(&src), path_str(&got));
    poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        victim.exists()
    });
    assert_eq!(status_matches_disk(&cache), 128);
    let v = rd(&["cache", "verify", "--shared-cache", sc]);
    assert!(v.contains("ok: all 128 chunks"), "{v}");

    // A running session pins its chunks: evict keeps them, --all refuses.
    let srv = Server::start(dir, &[&format!("cas[{opts}]:{}", sess.display())]);
    let st = status_json(&cache);
    assert_eq!(json_num(&st, "pid"), srv.pid() as u64, "{st}");
    assert_eq!(json_num(&st, "pinned_chunks"), 128, "{st}");
    let e = rd(&["cache", "evict", "--json", "--shared-cache", sc]);
    assert_eq!(json_num(&e, "chunks"), 0, "{e}");
    assert_eq!(json_num(&e, "kept_pinned"), 128, "{e}");
    let refused = rd_fail(&["cache", "clear", "--all", "--shared-cache", sc]);
    assert!(
        refused.contains("1 session is running") && refused.contains(&srv.pid().to_string()),
        "{refused}"
    );
    srv.stop();
    hoard(cas.s(), "u/vm", sc, &[]);
    let e = rd(&["cache", "evict", "--json", "--shared-cache", sc]);
    assert_eq!(json_num(&e, "kept_hoarded"), 128, "{e}");
    let e = rd(&["cache", "clear", "--all", "--json", "--shared-cache", sc]);
    assert_eq!(json_num(&e, "chunks"), 128, "{e}");
    assert_eq!(json_num(&e, "released"), 1, "{e}");
    assert_eq!(status_matches_disk(&cache), 0);
    let missing = rd_fail(&[
        "cache",
        "status",
        "--shared-cache",
        path_str(&dir.join("none")),
    ]);
    assert!(missing.contains("holds no shared cache"), "{missing}");
}

#[test]
fn a_hoard_into_a_cache_full_of_a_running_sessions_chunks_fails_then_completes_after() {
    let cas = Cas::new();
    let dir = cas.dir();
    let (_, o) = hoarded_and_other(&cas, 5);
    let s_o = dir.join("s-o");
    open_session(cas.s(), "u/o", &s_o, &[]);
    let cache = small_cache(dir, "shared", 24);
    let sc = path_str(&cache);
    // A session reads its whole disk: the cache fills with chunks it pins.
    let srv = Server::start(dir, &[&format!("cas[shared-cache={sc}]:{}", s_o.display())]);
    let got = dir.join("got.raw");
    assert!(convert_ok(&srv.uri(), &got));
    qemu_img_compare(path_str(&o), path_str(&got));
    poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        chunk_files(&cache).len() >= 24
    });
    // The version fits under the cap, but nothing can make room now.
    let err = rd_fail(&["hoard", "u/h", "--store", cas.s(), "--shared-cache", sc]);
    assert!(
        err.contains("is not fully hoarded: 16 of its 16 chunks")
            && err.contains("16 were refused while running sessions pin"),
        "{err}"
    );
    let st = status_json(&cache);
    assert_eq!(json_num(&st, "pinned_chunks"), 24, "{st}");
    assert_eq!(json_num(&st, "present_chunks"), 0, "{st}");
    srv.stop();
    // The session ended: the mark stayed, and the next hoard completes.
    let out = hoard(cas.s(), "u/h", sc, &[]);
    assert!(out.contains("16 of 16 chunks"), "{out}");
    assert_eq!(status_matches_disk(&cache), 24);
}
