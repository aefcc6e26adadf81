//! Faults of content-addressed images, each giving a clear error or
//! recovering, and never losing the previous version:
//! - a corrupted chunk, a missing chunk, a truncated version package
//!   (index): checkout fails naming the object, `store verify` lists it;
//! - a full store (quota, the same `no-space` as ENOSPC): the commit fails
//!   naming the chunk, the catalog is untouched;
//! - kill -9 in the middle of a commit: the previous version is current and
//!   intact, and gc collects the dead commit's uploads once its lease
//!   expires;
//! - gc running again and again while a commit reuses the chunks of a
//!   version that was just dropped: the new version is complete;
//! - kill -9 in the middle of a gc, and a gc that died with chunks set
//!   aside: nothing referenced is lost, the next gc finishes the job.

mod cas_common;
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cas_common::{json_num, json_str, object_file, object_files, rd, rd_fail};
use common::{bin, qemu_img_compare, random_file, run, tempdir};

fn init(dir: &Path, extra: &[&str]) -> String {
    let store = dir.join("store");
    let s = store.to_str().unwrap().to_string();
    let mut args = vec!["store", "init", &s];
    args.extend_from_slice(extra);
    rd(&args);
    s
}

fn commit(s: &str, img: &Path, to: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "commit",
        img.to_str().unwrap(),
        "--to",
        to,
        "--store",
        s,
        "--json",
    ];
    args.extend_from_slice(extra);
    json_str(&rd(&args), "version")
}

fn checkout_same(s: &str, rev: &str, want: &Path, out: &Path) {
    let _ = std::fs::remove_file(out);
    rd(&[
        "checkout",
        rev,
        "--store",
        s,
        "--output",
        out.to_str().unwrap(),
    ]);
    qemu_img_compare(want.to_str().unwrap(), out.to_str().unwrap());
}

/// Make every object look an hour old (as if committed long ago).
fn age_objects(store: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    for f in object_files(store) {
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
    let d = tempdir();
    let dir = d.path();
    let s = init(dir, &["--compression", "none"]);
    let img = dir.join("a.img");
    random_file(&img, 4 << 20, 1);
    let v = commit(&s, &img, "u/a", &[]);
    let store = Path::new(&s);
    let files = object_files(store);
    let chunks: Vec<_> = files.iter().filter(|f| !f.ends_with(&v)).cloned().collect();
    assert_eq!(chunks.len(), 64);
    // 1. A corrupted chunk.
    let bad = &chunks[5];
    let bad_id = bad.file_name().unwrap().to_str().unwrap().to_string();
    let mut b = std::fs::read(bad).unwrap();
    b[1000] ^= 0xff;
    std::fs::write(bad, &b).unwrap();
    let out = dir.join("out.raw");
    let e = rd_fail(&[
        "checkout",
        "u/a",
        "--store",
        &s,
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains(&bad_id) && e.contains("corrupt"), "{e}");
    assert!(!out.exists(), "a failed checkout leaves no partial file");
    let e = rd_fail(&["store", "verify", "--store", &s]);
    assert!(e.contains("1 of 65 objects"), "{e}");
    b[1000] ^= 0xff;
    std::fs::write(bad, &b).unwrap();
    rd(&["store", "verify", "--store", &s]);
    // 2. A missing chunk.
    let gone = &chunks[9];
    let gone_id = gone.file_name().unwrap().to_str().unwrap().to_string();
    let saved = std::fs::read(gone).unwrap();
    std::fs::remove_file(gone).unwrap();
    let e = rd_fail(&[
        "checkout",
        "u/a",
        "--store",
        &s,
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains(&gone_id) && e.contains("missing"), "{e}");
    std::fs::write(gone, &saved).unwrap();
    // 3. A truncated version package (its index).
    let pkg = object_file(store, &v);
    let whole = std::fs::read(&pkg).unwrap();
    std::fs::write(&pkg, &whole[..whole.len() - 100]).unwrap();
    let e = rd_fail(&[
        "checkout",
        "u/a",
        "--store",
        &s,
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains(&v) && e.contains("version"), "{e}");
    // gc refuses to run on an unreadable version rather than sweep.
    let e = rd_fail(&["gc", "--store", &s]);
    assert!(e.contains("nothing was removed"), "{e}");
    std::fs::write(&pkg, &whole).unwrap();
    checkout_same(&s, "u/a", &img, &out);
}

#[test]
fn a_full_store_fails_the_commit_and_keeps_the_previous_version() {
    let d = tempdir();
    let dir = d.path();
    let s = init(dir, &["--compression", "none", "--quota", "3M"]);
    let small = dir.join("small.img");
    random_file(&small, 2 << 20, 2);
    commit(&s, &small, "u/vm", &[]);
    let big = dir.join("big.img");
    std::fs::copy(&small, &big).unwrap();
    let extra = dir.join("extra");
    random_file(&extra, 4 << 20, 3);
    run("truncate", &["-s", "6M", big.to_str().unwrap()]);
    cas_common::put_at(&big, &extra, 2 << 20);
    let e = rd_fail(&[
        "commit",
        big.to_str().unwrap(),
        "--to",
        "u/vm",
        "--store",
        &s,
    ]);
    assert!(e.contains("is full") && e.contains("does not fit"), "{e}");
    assert!(e.contains("previous version is intact"), "{e}");
    let log = rd(&["log", "u/vm", "--store", &s]);
    assert_eq!(log.lines().count(), 2, "{log}");
    checkout_same(&s, "u/vm", &small, &dir.join("out.raw"));
}

#[test]
fn kill_9_mid_commit_keeps_the_previous_version_and_gc_collects_the_rest() {
    let d = tempdir();
    let dir = d.path();
    let s = init(dir, &["--compression", "none"]);
    let v1 = dir.join("v1.img");
    random_file(&v1, 8 << 20, 4);
    commit(&s, &v1, "u/vm", &["-m", "first"]);
    let v2 = dir.join("v2.img");
    random_file(&v2, 48 << 20, 5);
    let mut child = Command::new(bin())
        .args([
            "commit",
            v2.to_str().unwrap(),
            "--to",
            "u/vm",
            "--store",
            &s,
            "--limit-rate",
            "8M",
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    child.wait().unwrap();
    let store = Path::new(&s);
    assert!(
        object_files(store).len() > 129,
        "the killed commit had uploaded chunks"
    );
    let log = rd(&["log", "u/vm", "--store", &s, "--json"]);
    assert_eq!(log.matches("\"version\"").count(), 1, "{log}");
    checkout_same(&s, "u/vm", &v1, &dir.join("out.raw"));
    // Its lease still looks alive: a gc keeps its uploads.
    std::thread::sleep(Duration::from_secs(6));
    let r = rd(&["gc", "--store", &s, "--json"]);
    assert_eq!(json_num(&r, "removed_objects"), 0, "{r}");
    assert_eq!(json_num(&r, "live_leases"), 1, "{r}");
    // Once the lease has expired, they are collected.
    let r = rd(&["gc", "--store", &s, "--json", "--lease-timeout", "1s"]);
    assert_eq!(json_num(&r, "stale_leases"), 1, "{r}");
    assert!(json_num(&r, "removed_objects") > 0, "{r}");
    assert_eq!(
        object_files(store).len(),
        129,
        "only the first version's objects remain"
    );
    rd(&["store", "verify", "--store", &s]);
    checkout_same(&s, "u/vm", &v1, &dir.join("out2.raw"));
    // The next commit works.
    commit(&s, &v2, "u/vm", &[]);
    checkout_same(&s, "u/vm", &v2, &dir.join("out3.raw"));
}

#[test]
fn gc_during_a_commit_never_removes_what_the_commit_uses() {
    let d = tempdir();
    let dir = d.path();
    let s = init(dir, &["--compression", "none"]);
    let a = dir.join("a.img");
    random_file(&a, 32 << 20, 6);
    commit(&s, &a, "u/a", &[]);
    // B shares its first 20 MiB with A.
    let b = dir.join("b.img");
    std::fs::copy(&a, &b).unwrap();
    let tail = dir.join("tail");
    random_file(&tail, 12 << 20, 7);
    cas_common::put_at(&b, &tail, 20 << 20);
    let store = Path::new(&s);
    age_objects(store);
    let mut child = Command::new(bin())
        .args([
            "commit",
            b.to_str().unwrap(),
            "--to",
            "u/b",
            "--store",
            &s,
            "--limit-rate",
            "6M",
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A is dropped: its chunks are garbage unless the commit reuses them.
    rd(&["rm", "u/a", "--all", "--store", &s]);
    let t0 = Instant::now();
    let mut removed = 0;
    let mut runs = 0;
    loop {
        let r = rd(&["gc", "--store", &s, "--json"]);
        removed += json_num(&r, "removed_objects");
        runs += 1;
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "commit did not finish"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(child.wait().unwrap().success());
    assert!(runs >= 3, "gc ran {runs} times during the commit");
    assert!(
        removed >= 12 * 16,
        "gc removed A's unshared chunks ({removed})"
    );
    checkout_same(&s, "u/b", &b, &dir.join("out.raw"));
    rd(&["store", "verify", "--store", &s]);
    let r = rd(&["gc", "--store", &s, "--json"]);
    assert_eq!(json_num(&r, "referenced"), json_num(&r, "objects"), "{r}");
}

#[test]
fn kill_9_mid_gc_loses_nothing_referenced() {
    let d = tempdir();
    let dir = d.path();
    let s = init(dir, &["--compression", "none"]);
    let keep = dir.join("keep.img");
    random_file(&keep, 4 << 20, 8);
    commit(&s, &keep, "u/keep", &[]);
    let junk = dir.join("junk.img");
    random_file(&junk, 24 << 20, 9);
    commit(&s, &junk, "u/junk", &["--chunk-size", "4K"]);
    rd(&["rm", "u/junk", "--all", "--store", &s]);
    let store = Path::new(&s);
    age_objects(store);
    let mut child = Command::new(bin())
        .args(["gc", "--store", &s, "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    // What a gc leaves when it dies between its two renames: referenced
    // objects in the trash.
    let files = object_files(store);
    let keep_log = rd(&["log", "u/keep", "--store", &s, "--json"]);
    let kv = json_str(&keep_log, "version");
    let victim = files
        .iter()
        .find(|f| f.file_name().unwrap().to_str().unwrap() == kv)
        .unwrap()
        .clone();
    std::fs::rename(&victim, store.join("trash").join(&kv)).unwrap();
    // Readers find it; the next gc puts everything back and finishes.
    checkout_same(&s, "u/keep", &keep, &dir.join("out.raw"));
    std::fs::rename(&victim, store.join("trash").join(&kv)).unwrap();
    let r = rd(&["gc", "--store", &s, "--json"]);
    assert!(json_num(&r, "restored") >= 1, "{r}");
    assert_eq!(json_num(&r, "referenced"), 65);
    // An unreferenced object the killed gc had already moved aside comes
    // back touched (a commit may have wanted it), so it is kept as recent
    // by this run and collected by a later one.
    let recent = json_num(&r, "kept_recent") as usize;
    assert_eq!(object_files(store).len(), 65 + recent, "{r}");
    assert_eq!(std::fs::read_dir(store.join("trash")).unwrap().count(), 0);
    age_objects(store);
    let r = rd(&["gc", "--store", &s, "--json"]);
    assert_eq!(object_files(store).len(), 65, "{r}");
    rd(&["store", "verify", "--store", &s]);
    checkout_same(&s, "u/keep", &keep, &dir.join("out2.raw"));
}
