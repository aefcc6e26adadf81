//! The `borrow:PLAN` layer: what the guest reads before writing (zeroes,
//! never the host's deleted data), where its data lands (exactly the
//! device-mapper table's extents), encryption, zero-scrub at release, and
//! refusal to run when the host changed since the scan or the plan was
//! tampered with.

mod borrow_common;
mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use borrow_common::*;
use common::{debugfs_w, e2fsck_clean, empty_ext4, rd, roamdisk, run, run_stdout, Server};

/// A 64 MiB ext4 image (no partition table) whose free blocks hold the
/// content of a deleted file full of 0x5A bytes.
fn host(dir: &Path) -> PathBuf {
    let img = dir.join("host.img");
    empty_ext4(&img, "64M");
    let secret = dir.join("secret");
    std::fs::write(&secret, vec![0x5Au8; 20 << 20]).unwrap();
    debugfs_w(&img, &format!("write {} secret", secret.display()));
    debugfs_w(&img, "rm secret");
    img
}

/// A temporary folder with a [`host`] image and its plan: (folder, host,
/// plan).
fn host_and_plan() -> (TempDir, PathBuf, PathBuf) {
    let tmp = common::tempdir();
    let img = host(tmp.path());
    let plan = plan_for(tmp.path(), &img);
    (tmp, img, plan)
}

/// The plan's extents and a file `data.bin` of as many random bytes (SEED)
/// as they hold.
fn random_data_for(dir: &Path, plan: &Path, seed: u64) -> (Vec<(String, u64, u64)>, PathBuf) {
    let extents = plan_extents(plan);
    let total: u64 = extents.iter().map(|e| e.2).sum();
    let data = dir.join("data.bin");
    common::random_file(&data, total, seed);
    (extents, data)
}

fn plan_for(dir: &Path, img: &Path) -> PathBuf {
    let plan = dir.join("host.plan");
    scan(&[
        img.to_str().unwrap(),
        "--min-extent",
        "64K",
        "--plan",
        plan.to_str().unwrap(),
    ]);
    plan
}

fn read_at(p: &Path, off: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    std::fs::File::open(p)
        .unwrap()
        .read_exact_at(&mut v, off)
        .unwrap();
    v
}

/// Start `roamdisk serve SPEC` expecting it to fail; returns its stderr.
fn serve_fails(spec: &str) -> String {
    let dir = common::tempdir();
    let out = roamdisk(&[
        "serve",
        spec,
        "--socket",
        dir.path().join("s").to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "serving {spec} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_guest_reads_zeroes_never_the_hosts_deleted_data() {
    let (tmp, img, plan) = host_and_plan();
    // The deleted file's blocks are free, so they are borrowed...
    let secret_on_host = plan_extents(&plan).iter().any(|(_, off, len)| {
        read_at(&img, *off, (*len).min(1 << 20))
            .iter()
            .all(|&b| b == 0x5A)
    });
    assert!(
        secret_on_host,
        "the test needs borrowed blocks holding deleted data"
    );
    // ...but the guest sees zeroes.
    let server = Server::start(tmp.path(), &[&format!("borrow:{}", plan.display())]);
    let out = tmp.path().join("read.bin");
    run("nbdcopy", &[&server.uri(), out.to_str().unwrap()]);
    let v = std::fs::read(&out).unwrap();
    assert!(v.len() > 20 << 20);
    assert!(v.iter().all(|&b| b == 0), "the guest saw host data");
}

#[test]
fn without_encryption_data_lands_exactly_at_the_dm_table_extents() {
    let (tmp, img, plan) = host_and_plan();
    let (extents, data) = random_data_for(tmp.path(), &plan, 7);
    let server = Server::start(
        tmp.path(),
        &[&format!("borrow[encrypt=off]:{}", plan.display())],
    );
    run("nbdcopy", &[data.to_str().unwrap(), &server.uri()]);
    assert!(server.stop().success());
    let want = std::fs::read(&data).unwrap();
    let mut logical = 0usize;
    for (dev, off, len) in &extents {
        assert_eq!(Path::new(dev), img.as_path());
        let got = read_at(&img, *off, *len);
        assert!(
            got == want[logical..logical + *len as usize],
            "extent at {off} does not hold logical bytes {logical}.."
        );
        logical += *len as usize;
    }
    e2fsck_clean(&img);
}

#[test]
fn encrypted_data_is_unreadable_on_the_host_and_scrub_zeroes_it() {
    let (tmp, img, plan) = host_and_plan();
    let (extents, data) = random_data_for(tmp.path(), &plan, 9);
    let want = std::fs::read(&data).unwrap();
    // Encrypted: the host holds neither plaintext nor the old content.
    let server = Server::start(tmp.path(), &[&format!("borrow:{}", plan.display())]);
    run("nbdcopy", &[data.to_str().unwrap(), &server.uri()]);
    let back = tmp.path().join("back.bin");
    run("nbdcopy", &[&server.uri(), back.to_str().unwrap()]);
    assert!(server.stop().success());
    common::assert_files_equal(&data, &back);
    let (_, off0, len0) = &extents[0];
    let host0 = read_at(&img, *off0, *len0);
    assert!(host0 != want[..*len0 as usize], "plaintext on the host");
    assert!(
        host0
            .chunks(4096)
            .all(|c| c.iter().any(|&b| b != 0x5A && b != 0)),
        "a block was not written"
    );
    // Scrub: every written block reads as zeroes once the export stops.
    let server = Server::start(
        tmp.path(),
        &[&format!("borrow[scrub=on]:{}", plan.display())],
    );
    run("nbdcopy", &[data.to_str().unwrap(), &server.uri()]);
    assert!(server.stop().success());
    for (_, off, len) in &extents {
        assert!(
            read_at(&img, *off, *len).iter().all(|&b| b == 0),
            "extent at {off} not scrubbed"
        );
    }
    e2fsck_clean(&img);
}

#[test]
fn a_host_changed_since_the_scan_is_refused() {
    let (tmp, img, plan) = host_and_plan();
    let ok = rd(&["borrow", "check", plan.to_str().unwrap()]);
    assert!(ok.contains("matches the host"));
    // The host writes a file (as a booted host OS would).
    let f = tmp.path().join("new");
    std::fs::write(&f, b"owner's new file").unwrap();
    debugfs_w(&img, &format!("write {} new", f.display()));
    let err = serve_fails(&format!("borrow:{}", plan.display()));
    assert!(
        err.contains("changed since the scan") && err.contains("borrow scan"),
        "{err}"
    );
    let out = roamdisk(&["borrow", "check", plan.to_str().unwrap()]);
    assert!(!out.status.success());
    // A mount count bump alone (superblock only) is enough.
    let plan2 = plan_for(tmp.path(), &img);
    debugfs_w(&img, "ssv mnt_count 7");
    let err = serve_fails(&format!("borrow:{}", plan2.display()));
    assert!(err.contains("superblock"), "{err}");
}

#[test]
fn a_tampered_plan_is_refused() {
    let (tmp, img, plan) = host_and_plan();
    let text = std::fs::read_to_string(&plan).unwrap();
    let (_, off, _) = plan_extents(&plan)[0];
    // Point the first extent at block 0 (the superblock): aligned and
    // inside the partition, so only the free-space check can catch it.
    let bad = tmp.path().join("bad.plan");
    std::fs::write(
        &bad,
        text.replacen(&format!("\"offset\": {off}"), "\"offset\": 0", 1),
    )
    .unwrap();
    let err = serve_fails(&format!("borrow:{}", bad.display()));
    assert!(err.contains("no longer free"), "{err}");
    let before = std::fs::read(&img).unwrap();
    let err = serve_fails(
        &format!("borrow[verify=identity]:{}", plan.display()).replace(".plan", ".nope"),
    );
    assert!(err.contains("cannot read plan"), "{err}");
    // Unknown version, garbage, extents outside their partition.
    let v9 = tmp.path().join("v9.plan");
    std::fs::write(&v9, text.replacen("\"version\": 1", "\"version\": 9", 1)).unwrap();
    assert!(serve_fails(&format!("borrow:{}", v9.display())).contains("version 9 is not supported"));
    let junk = tmp.path().join("junk.plan");
    std::fs::write(&junk, "{\"format\": 3").unwrap();
    assert!(serve_fails(&format!("borrow:{}", junk.display())).contains("bad JSON"));
    let far = tmp.path().join("far.plan");
    std::fs::write(
        &far,
        text.replacen(
            &format!("\"offset\": {off}"),
            "\"offset\": 1099511627776",
            1,
        ),
    )
    .unwrap();
    assert!(serve_fails(&format!("borrow:{}", far.display())).contains("outside partition"));
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused plan wrote to the host"
    );
    let size = run_stdout("stat", &["-c", "%s", img.to_str().unwrap()]);
    assert_eq!(size.trim(), (64u64 << 20).to_string());
}
