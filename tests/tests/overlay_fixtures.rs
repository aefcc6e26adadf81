//! Overlay maps written by an earlier build stay readable.
//!
//! `tests/fixtures/overlay-map-v1/` was written by roamdisk at commit
//! 383977c (before the cow map and the cas session map became one engine):
//! a cow overlay (`cow[cluster=4K]`) and a cas session, each written by
//! qemu-io over NBD with flushes between the writes and a trim, then
//! stopped with SIGTERM. `SOURCES` below lists the writes; the test checks
//! every byte against a model of them and against the digest the old build
//! read, then opens each one writable (which compacts its map), writes,
//! reopens, and cuts the last commit off the map to check the rollback.

mod common;

use common::*;
use std::path::{Path, PathBuf};

const SIZE: usize = 256 << 10;

/// The fixture's base: byte `i` is `(7 i + 3) mod 251`.
fn base() -> Vec<u8> {
    (0..SIZE).map(|i| ((i * 7 + 3) % 251) as u8).collect()
}

/// A write in the fixture: `Some(byte)` fills, `None` zeroes or trims.
type Write = (usize, usize, Option<u8>);

const COW_WRITES: &[Write] = &[
    (4096, 8192, Some(0x41)),
    (65536, 65536, None),
    (1000, 100, Some(0x42)),
    (131072, 65536, None),
    (200000, 3000, Some(0x43)),
];

const CAS_WRITES: &[Write] = &[
    (512, 1024, Some(0x51)),
    (8192, 16384, None),
    (100000, 700, Some(0x52)),
    (131072, 65536, None),
    (200003, 3000, Some(0x53)),
];

/// sha256 of each disk as read by the build that wrote the fixture.
const COW_SHA256: &str = "0d2f3ea524aacdc06a2950a302b2ba9440f5ae2df8b16403bdf50b5aa3875c46";
const CAS_SHA256: &str = "c687fffd7f07f7b10a036c2cce29862248a16dbdc9cd961900242aee40a4a700";

fn model(writes: &[Write]) -> Vec<u8> {
    let mut d = base();
    for &(off, len, v) in writes {
        d[off..off + len].fill(v.unwrap_or(0));
    }
    d
}

/// Copy the fixture into a fresh directory (git keeps no empty folders, so
/// the store's working folders are made here).
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempdir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/overlay-map-v1");
    run(
        "cp",
        &["-r", src.to_str().unwrap(), t.path().to_str().unwrap()],
    );
    let dir = t.path().join("overlay-map-v1");
    for d in ["store/leases", "store/tmp", "store/trash"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    (t, dir)
}

fn cow_spec(dir: &Path) -> String {
    spec_cow_raw(dir, &dir.join("base.img"))
}

fn cas_spec(dir: &Path) -> String {
    format!(
        "cas[store={}]:{}",
        dir.join("store").display(),
        dir.join("session").display()
    )
}

/// Read the whole disk through `roamdisk serve SPEC` and qemu-img.
fn read_disk(dir: &Path, spec: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec![spec];
    args.extend_from_slice(extra);
    let srv = Server::start(dir, &args);
    let out = dir.join("read.raw");
    let _ = std::fs::remove_file(&out);
    qemu_img_copy(&srv.uri(), out.to_str().unwrap());
    srv.stop();
    std::fs::read(&out).unwrap()
}

fn sha256(dir: &Path, data: &[u8]) -> String {
    let p = dir.join("digest.in");
    std::fs::write(&p, data).unwrap();
    run_stdout("sha256sum", &[p.to_str().unwrap()])
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn check(spec_of: fn(&Path) -> String, writes: &[Write], digest: &str, map: &str) {
    let (_t, dir) = fixture();
    let spec = spec_of(&dir);

    // 1. Read-only: every byte as the old build wrote it.
    let got = read_disk(&dir, &spec, &["--read-only"]);
    assert_bytes_equal(&got, &model(writes), "fixture read by this build");
    assert_eq!(sha256(&dir, &got), digest, "digest of the old build's read");

    // 2. The last commit cut off: the disk reverts to the previous flush
    //    (the last write was made after it).
    let map_path = dir.join(map);
    let saved = std::fs::read(&map_path).unwrap();
    std::fs::write(&map_path, &saved[..saved.len() - 32]).unwrap();
    let got = read_disk(&dir, &spec, &["--read-only"]);
    let mut want = model(&writes[..writes.len() - 1]);
    let (off, len, _) = writes[writes.len() - 1];
    want[off..off + len].copy_from_slice(&base()[off..off + len]);
    assert_bytes_equal(&got, &want, "map without its last commit");
    std::fs::write(&map_path, &saved).unwrap();

    // 3. Writable: the map is compacted on open and takes new writes.
    let srv = Server::start(&dir, &[&spec]);
    qemu_io(
        &srv.uri(),
        &["write -P 0x77 61440 4096".into(), "flush".into()],
    );
    srv.stop();
    let got = read_disk(&dir, &spec, &["--read-only"]);
    let mut want = model(writes);
    want[61440..65536].fill(0x77);
    assert_bytes_equal(&got, &want, "after a write through this build");
}

#[test]
fn cow_overlay_written_by_the_old_build_reads_identically() {
    check(cow_spec, COW_WRITES, COW_SHA256, "overlay.img.cowmap");
}

#[test]
fn cas_session_written_by_the_old_build_reads_identically() {
    check(cas_spec, CAS_WRITES, CAS_SHA256, "session/states");
}
