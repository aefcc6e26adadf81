//! Faults of content-addressed images, each giving a clear error or
//! recovering, and never losing the previous version:
//! - a corrupted chunk (in a pack), a missing pack, a truncated version
//!   package (index): checkout fails naming the object, `store verify`
//!   lists it;
//! - a full store (quota, the same `no-space` as ENOSPC): the commit fails
//!   naming the chunk, the catalog is untouched;
//! - kill -9 in the middle of a commit: the previous version is current and
//!   intact, and gc collects the dead commit's uploads once its lease
//!   expires;
//! - gc running again and again while a commit reuses the chunks of a
//!   version that was just dropped: the new version is complete, the
//!   dropped version's packs the commit does not touch are removed during
//!   the commit, the rest once they are old;
//! - kill -9 in the middle of a gc, and a gc that died with chunks set
//!   aside: nothing referenced is lost, the next gc finishes the job.

mod cas_common;
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use cas_common::{
    checkout_fail, checkout_same, commit_args, commit_version, gc_until_exit, json_num, json_str,
    object_count, object_file, object_files, packed_objects, random_version, rd, rd_fail,
    store_files, Cas,
};
use common::{bin, path_str, run};

/// A local store without compression (object sizes are the data's), with
/// more `store init` options. Local even in S3 mode: these tests read or
/// edit the store's files (cas_s3 has the S3 variants).
fn uncompressed_local(more: &[&str]) -> Cas {
    Cas::local_with(&[&["--compression", "none"], more].concat())
}

/// Start `roamdisk ARGS` in the background, its output discarded.
fn spawn_quiet(args: &[&str]) -> std::process::Child {
    Command::new(bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `roamdisk gc --store STORE --json EXTRA...`; returns its report.
fn gc(s: &str, extra: &[&str]) -> String {
    rd(&[&["gc", "--store", s, "--json"], extra].concat())
}

/// Make every object look an hour old (as if committed long ago).
fn age_objects(store: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    for f in store_files(store) {
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
}

#[test]
fn damaged_and_missing_objects_are_named() {
    // Local: damages pack and package files (cas_s3 does it in S3).
    let cas = uncompressed_local(&[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (img, v) = random_version(&cas, ("a.img", 4 << 20, 1), "u/a", &[]);
    let store = &cas.store;
    // The commit's chunks are in packs, its version package is a file.
    let chunks = packed_objects(store);
    assert_eq!(chunks.len(), 64);
    assert_eq!(object_files(store), vec![object_file(store, &v)]);
    // 1. A corrupted chunk.
    let bad = &chunks[5];
    let at = (bad.offset + 1000) as usize;
    let mut b = std::fs::read(&bad.pack).unwrap();
    b[at] ^= 0xff;
    std::fs::write(&bad.pack, &b).unwrap();
    let out = dir.join("out.raw");
    let e = checkout_fail(s, "u/a", &out, &[]);
    assert!(e.contains(&bad.id) && e.contains("corrupt"), "{e}");
    assert!(!out.exists(), "a failed checkout leaves no partial file");
    let e = rd_fail(&["store", "verify", "--store", s]);
    assert!(e.contains("1 of 65 objects"), "{e}");
    b[at] ^= 0xff;
    std::fs::write(&bad.pack, &b).unwrap();
    rd(&["store", "verify", "--store", s]);
    // 2. A missing pack: the checkout names a chunk that was in it.
    let gone = &chunks[9].pack;
    let saved = std::fs::read(gone).unwrap();
    std::fs::remove_file(gone).unwrap();
    let e = checkout_fail(s, "u/a", &out, &[]);
    let named = chunks.iter().find(|c| c.pack == *gone && e.contains(&c.id));
    assert!(named.is_some() && e.contains("missing"), "{e}");
    let e = rd_fail(&["store", "verify", "--store", s]);
    assert!(e.contains("1 of 1 versions miss objects"), "{e}");
    std::fs::write(gone, &saved).unwrap();
    // 3. A truncated version package (its index).
    let pkg = object_file(store, &v);
    let whole = std::fs::read(&pkg).unwrap();
    std::fs::write(&pkg, &whole[..whole.len() - 100]).unwrap();
    let e = checkout_fail(s, "u/a", &out, &[]);
    assert!(e.contains(&v) && e.contains("version"), "{e}");
    // gc refuses to run on an unreadable version rather than sweep.
    let e = rd_fail(&["gc", "--store", s]);
    assert!(e.contains("nothing was removed"), "{e}");
    std::fs::write(&pkg, &whole).unwrap();
    checkout_same(s, "u/a", &img, &out);
}

#[test]
fn a_full_store_fails_the_commit_and_keeps_the_previous_version() {
    // Local: --quota is for local stores (S3 refuses it; buckets have their own quotas).
    let cas = uncompressed_local(&["--quota", "3M"]);
    let (dir, s) = (cas.dir(), cas.s());
    let (small, _) = random_version(&cas, ("small.img", 2 << 20, 2), "u/vm", &[]);
    let big = cas.variant(&small, "big.img", (4 << 20, 3), 2 << 20);
    let e = rd_fail(&["commit", path_str(&big), "--to", "u/vm", "--store", s]);
    assert!(e.contains("is full") && e.contains("does not fit"), "{e}");
    assert!(e.contains("previous version is intact"), "{e}");
    let log = rd(&["log", "u/vm", "--store", s]);
    assert_eq!(log.lines().count(), 2, "{log}");
    checkout_same(s, "u/vm", &small, &dir.join("out.raw"));
}

#[test]
fn kill_9_mid_commit_keeps_the_previous_version_and_gc_collects_the_rest() {
    // Local: counts the store's objects (object_count).
    let cas = uncompressed_local(&[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (v1, _) = random_version(&cas, ("v1.img", 8 << 20, 4), "u/vm", &["-m", "first"]);
    // Big enough that the killed commit has named a pack or two (32 MiB
    // of chunks each) and is writing the next one.
    let v2 = cas.random_file("v2.img", 160 << 20, 5);
    let mut child = spawn_quiet(&commit_args(
        s,
        path_str(&v2),
        "u/vm",
        &["--limit-rate", "32M", "-q"],
    ));
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    child.wait().unwrap();
    let store = &cas.store;
    assert!(
        object_count(store) > 129,
        "the killed commit had uploaded chunks"
    );
    let log = rd(&["log", "u/vm", "--store", s, "--json"]);
    assert_eq!(log.matches("\"version\"").count(), 1, "{log}");
    checkout_same(s, "u/vm", &v1, &dir.join("out.raw"));
    // Its lease still looks alive: a gc keeps its uploads.
    std::thread::sleep(Duration::from_secs(6));
    let r = gc(s, &[]);
    assert_eq!(json_num(&r, "removed_objects"), 0, "{r}");
    assert_eq!(json_num(&r, "live_leases"), 1, "{r}");
    // Once the lease has expired, they are collected.
    let r = gc(s, &["--lease-timeout", "1s"]);
    assert_eq!(json_num(&r, "stale_leases"), 1, "{r}");
    assert!(json_num(&r, "removed_objects") > 0, "{r}");
    assert_eq!(
        object_count(store),
        129,
        "only the first version's objects remain"
    );
    rd(&["store", "verify", "--store", s]);
    checkout_same(s, "u/vm", &v1, &dir.join("out2.raw"));
    // The next commit works.
    commit_version(s, path_str(&v2), "u/vm", &[]);
    checkout_same(s, "u/vm", &v2, &dir.join("out3.raw"));
}

#[test]
fn gc_during_a_commit_never_removes_what_the_commit_uses() {
    // Local: ages the store's files (cas_s3 has an S3 variant).
    let cas = uncompressed_local(&[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (a, _) = random_version(&cas, ("a.img", 64 << 20, 6), "u/a", &[]);
    // B shares its first 20 MiB with A, then has 12 MiB of its own.
    let b = cas.variant(&a, "b.img", (12 << 20, 7), 20 << 20);
    run("truncate", &["-s", "32M", b.to_str().unwrap()]);
    let store = &cas.store;
    age_objects(store);
    let mut child = spawn_quiet(&commit_args(
        s,
        path_str(&b),
        "u/b",
        &["--limit-rate", "6M", "-q"],
    ));
    std::thread::sleep(Duration::from_millis(300));
    // A is dropped: its chunks are garbage unless the commit reuses them.
    rd(&["rm", "u/a", "--all", "--store", s]);
    let (runs, removed) = gc_until_exit(
        s,
        &mut child,
        Duration::from_secs(120),
        Duration::from_millis(200),
    );
    assert!(child.wait().unwrap().success());
    assert!(runs >= 3, "gc ran {runs} times during the commit");
    // A's packs of its last 32 MiB, which B never touched, went while B
    // was committing; the packs B reused keep A's other chunks for now.
    assert!(
        removed >= 32 * 16,
        "gc removed A's packs that B does not use ({removed})"
    );
    checkout_same(s, "u/b", &b, &dir.join("out.raw"));
    rd(&["store", "verify", "--store", s]);
    // Once nothing touches them, the packs B reused are rewritten without
    // A's 12 MiB that B does not have.
    age_objects(store);
    let r = gc(s, &[]);
    assert!(removed + json_num(&r, "removed_objects") >= 44 * 16, "{r}");
    let r = gc(s, &[]);
    assert_eq!(json_num(&r, "referenced"), json_num(&r, "objects"), "{r}");
    checkout_same(s, "u/b", &b, &dir.join("out2.raw"));
}

#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "the test moves an object aside by hand, as a killed gc leaves it"
)]
fn kill_9_mid_gc_loses_nothing_referenced() {
    // Local: moves a package into the store's trash folder by hand.
    let cas = uncompressed_local(&[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (keep, _) = random_version(&cas, ("keep.img", 4 << 20, 8), "u/keep", &[]);
    let (_junk, _) = random_version(
        &cas,
        ("junk.img", 24 << 20, 9),
        "u/junk",
        &["--chunk-size", "4K"],
    );
    rd(&["rm", "u/junk", "--all", "--store", s]);
    let store = &cas.store;
    age_objects(store);
    let mut child = spawn_quiet(&["gc", "--store", s, "-q"]);
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    // What a gc leaves when it dies between its two renames: referenced
    // objects in the trash.
    let files = object_files(store);
    let keep_log = rd(&["log", "u/keep", "--store", s, "--json"]);
    let kv = json_str(&keep_log, "version");
    let victim = files
        .iter()
        .find(|f| f.file_name().unwrap().to_str().unwrap() == kv)
        .unwrap()
        .clone();
    std::fs::rename(&victim, store.join("trash").join(&kv)).unwrap();
    // Readers find it; the next gc puts everything back and finishes.
    checkout_same(s, "u/keep", &keep, &dir.join("out.raw"));
    std::fs::rename(&victim, store.join("trash").join(&kv)).unwrap();
    let r = gc(s, &[]);
    assert!(json_num(&r, "restored") >= 1, "{r}");
    assert_eq!(json_num(&r, "referenced"), 65);
    // An unreferenced object the killed gc had already moved aside comes
    // back touched (a commit may have wanted it), so it is kept as recent
    // by this run and collected by a later one.
    let recent = json_num(&r, "kept_recent") as usize;
    assert_eq!(object_count(store), 65 + recent, "{r}");
    assert_eq!(std::fs::read_dir(store.join("trash")).unwrap().count(), 0);
    age_objects(store);
    let r = gc(s, &[]);
    assert_eq!(object_count(store), 65, "{r}");
    rd(&["store", "verify", "--store", s]);
    checkout_same(s, "u/keep", &keep, &dir.join("out2.raw"));
}
