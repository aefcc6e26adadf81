//! A shared cache written by an earlier build stays readable.
//!
//! `tests/fixtures/shared-cache-v2/` was written by roamdisk at the commit
//! `expected.json` names (`made_by`), the last build of the one-file-per-
//! chunk layout (`cache.toml` version 2), by the `make.sh` beside it: a
//! store of three images (`u/b` shares half of `u/a`'s chunks; `u/c` has
//! 16 KiB chunks and a 3 KiB tail), a cache of 12 chunks' cap into which
//! `u/a` was hoarded and `u/b`, `u/c`, `u/b` checked out (evictions). The
//! test opens the cache with this build and checks what it holds: every
//! chunk the old build held is there, verifies against its id and serves
//! a session of the hoarded version with the store gone; the hoard mark
//! still keeps its chunks while other images stream through.

#![allow(
    clippy::disallowed_methods,
    reason = "the test moves a store folder away and back, as an unplugged disk would"
)]

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// Copy the fixture into a fresh directory (git keeps no empty folders, so
/// the working folders are made here).
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempdir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/shared-cache-v2");
    run(
        "cp",
        &["-r", src.to_str().unwrap(), t.path().to_str().unwrap()],
    );
    let dir = t.path().join("shared-cache-v2");
    for d in [
        "store/leases",
        "store/tmp",
        "store/trash",
        "cache/pins",
        "cache/tmp",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    (t, dir)
}

fn expected(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

fn sha256(path: &Path) -> String {
    let out = run_stdout("sha256sum", &[path.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().to_string()
}

/// `roamdisk ARGS` with the fixture's cache as the host's shared cache.
fn rd_cached(cache: &Path, args: &[&str]) -> String {
    command_stdout(
        std::process::Command::new(bin())
            .args(args)
            .env("ROAMDISK_SHARED_CACHE", cache),
        &format!("roamdisk {args:?}"),
    )
}

fn cache_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let cache = dir.join("cache");
    let out = rd(&[
        &["cache"],
        args,
        &["--json", "--shared-cache", path_str(&cache)],
    ]
    .concat());
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn a_cache_of_the_one_file_per_chunk_layout_serves_every_chunk_it_held() {
    let (_t, dir) = fixture();
    let want = expected(&dir);
    let resident = want["resident"].as_object().unwrap();
    let held: u64 = resident.values().map(|v| v.as_u64().unwrap()).sum();
    assert!(resident.len() >= 10, "the fixture holds chunks: {want}");

    let st = cache_json(&dir, &["status"]);
    assert_eq!(st["chunks"].as_u64(), Some(resident.len() as u64), "{st}");
    assert_eq!(st["bytes"].as_u64(), Some(held), "{st}");
    let hoards = st["hoards"].as_array().unwrap();
    assert_eq!(hoards.len(), 1, "{st}");
    assert_eq!(hoards[0]["name"], "u/a", "{st}");
    assert_eq!(
        hoards[0]["present_chunks"].as_u64(),
        want["hoard_a"]["chunks"].as_u64(),
        "{st}"
    );

    // Every chunk the old build held is here and is the chunk it names.
    let v = cache_json(&dir, &["verify"]);
    assert_eq!(v["chunks"].as_u64(), Some(resident.len() as u64), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(held), "{v}");
    assert!(v["damaged"].as_array().unwrap().is_empty(), "{v}");

    // The hoarded version serves whole with its store gone.
    let store = dir.join("store");
    let cache = dir.join("cache");
    let sess = dir.join("s-a");
    rd_cached(
        &cache,
        &[
            "checkout",
            "u/a",
            "--store",
            path_str(&store),
            "--session",
            path_str(&sess),
        ],
    );
    std::fs::rename(&store, dir.join("store.gone")).unwrap();
    let srv = Server::start(
        &dir,
        &[&format!(
            "cas[shared-cache={}]:{}",
            cache.display(),
            sess.display()
        )],
    );
    let got = dir.join("a.out");
    qemu_img_convert(&srv.uri(), "raw", path_str(&got));
    srv.stop();
    assert_eq!(
        sha256(&got),
        want["sha256"]["a"],
        "u/a read from the old cache"
    );
    std::fs::rename(dir.join("store.gone"), &store).unwrap();

    // The other images read right through it (the mark keeps u/a's chunks).
    for name in ["b", "c"] {
        let out = dir.join(format!("{name}.out"));
        rd_cached(
            &cache,
            &[
                "checkout",
                &format!("u/{name}"),
                "--store",
                path_str(&store),
                "--output",
                path_str(&out),
            ],
        );
        assert_eq!(sha256(&out), want["sha256"][name], "u/{name}");
    }
    let check = rd(&[
        "hoard",
        "u/a",
        "--check",
        "--json",
        "--store",
        path_str(&store),
        "--shared-cache",
        path_str(&cache),
    ]);
    assert!(check.contains("\"complete\": true"), "{check}");
}
