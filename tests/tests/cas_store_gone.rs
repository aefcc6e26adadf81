//! A fully hoarded version opens and serves with its store gone, as
//! `roamdisk hoard` promises ("the network may go"), whatever the store
//! is: here a store folder renamed away (an unplugged disk, an unmounted
//! share) and a chunk server stopped; `cas_s3` stops an S3 endpoint.
//! `hoard --check` reads the level from the hoard mark, and a session
//! whose store folder is missing is never advised to create a store there.

#![allow(
    clippy::disallowed_methods,
    reason = "the test moves a store folder away and back, as an unplugged disk would"
)]

mod cas_common;
mod common;

use std::path::Path;

use cas_common::{
    hoard, json_num, json_str, open_session, random_version, read_all, Cas, ChunkServer,
};
use common::{path_str, qemu_img_compare, rd_fail};

const CHUNK: u64 = 65536;

fn check_complete(store: &str, image: &str, cache: &Path, chunks: u64) {
    let check = hoard(store, image, path_str(cache), &["--check", "--json"]);
    assert_eq!(json_num(&check, "cached_after"), chunks, "{check}");
    assert!(check.contains("\"complete\": true"), "{check}");
    assert!(check.contains("\"hoarded\": true"), "{check}");
}

#[test]
fn a_hoarded_session_serves_every_byte_with_its_store_folder_renamed_away() {
    let cas = Cas::local();
    let dir = cas.dir();
    let (h, _) = random_version(&cas, ("hoarded.raw", 16 * CHUNK, 5), "u/h", &[]);
    random_version(&cas, ("other.raw", 8 * CHUNK, 6), "u/o", &[]);
    let (s_h, s_o) = (dir.join("s-h"), dir.join("s-o"));
    open_session(cas.s(), "u/h", &s_h, &[]);
    open_session(cas.s(), "u/o", &s_o, &[]);
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    let out = hoard(cas.s(), "u/h", sc, &[]);
    assert!(out.contains("the network may go"), "{out}");

    // The disk that held the store is unplugged.
    std::fs::rename(&cas.store, dir.join("store.unplugged")).unwrap();
    let got = dir.join("got.raw");
    let opts = format!("shared-cache={sc}");
    assert!(read_all(dir, &s_h, &opts, &got), "served offline");
    qemu_img_compare(path_str(&h), path_str(&got));
    check_complete(cas.s(), "u/h", &cache, 16);
    // By an id prefix too; and a version no mark names is the store's error.
    let vid = json_str(
        &hoard(cas.s(), "u/h", sc, &["--check", "--json"]),
        "version",
    );
    check_complete(cas.s(), &format!("u/h@{}", &vid[..8]), &cache, 16);
    let e = rd_fail(&[
        "hoard",
        "u/o",
        "--check",
        "--store",
        cas.s(),
        "--shared-cache",
        sc,
    ]);
    assert!(e.contains("no hoard mark"), "{e}");

    // What needs the store says it cannot be reached, never "create one".
    let e = rd_fail(&["commit", &format!("cas:{}", s_o.display()), "-m", "x"]);
    assert!(e.contains("cannot be reached"), "{e}");
    assert!(!e.contains("store init"), "{e}");
    // A session that kept no copy of the store's settings (an older
    // session) names the folder it misses and what to do.
    std::fs::remove_file(s_o.join("store.toml")).unwrap();
    let e = rd_fail(&["info", &format!("cas:{}", s_o.display())]);
    assert!(e.contains("is not at") && e.contains("--store"), "{e}");
    assert!(!e.contains("store init"), "{e}");

    // Plugged in again: the other session reads from the store.
    std::fs::rename(dir.join("store.unplugged"), &cas.store).unwrap();
    assert!(read_all(dir, &s_o, &opts, &got));
}

#[test]
fn a_hoarded_session_serves_and_checks_with_its_chunk_server_stopped() {
    let cas = Cas::new();
    let dir = cas.dir();
    let (h, _) = random_version(&cas, ("hoarded.raw", 16 * CHUNK, 7), "u/h", &[]);
    let server = ChunkServer::start(cas.s(), &[]);
    let url = server.url.clone();
    let s_h = dir.join("s-h");
    open_session(&url, "u/h", &s_h, &[]);
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    hoard(&url, "u/h", sc, &[]);
    drop(server);
    let got = dir.join("got.raw");
    assert!(read_all(dir, &s_h, &format!("shared-cache={sc}"), &got));
    qemu_img_compare(path_str(&h), path_str(&got));
    check_complete(&url, "u/h", &cache, 16);
}
