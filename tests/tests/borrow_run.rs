//! `roamdisk borrow run`: the whole session. The VM disk is copied onto
//! borrowed host blocks (whole or on demand), served, modified by a
//! client, and only the modified blocks are copied back to the VM disk;
//! the host file system is left clean, and with --scrub the borrowed
//! blocks are zeroed. The timings of each phase are reported.

mod borrow_common;
mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use borrow_common::*;
use common::{e2fsck_clean, empty_ext4, path_str, rd, roamdisk};

fn host(dir: &Path) -> PathBuf {
    let img = dir.join("host.img");
    empty_ext4(&img, "96M");
    img
}

/// `roamdisk borrow run --host HOST --state VM --socket SOCKET`.
fn borrow_run<'a>(host: &'a Path, vm: &'a Path, socket: &'a Path) -> Vec<&'a str> {
    let paths = [path_str(host), path_str(vm), path_str(socket)];
    vec![
        "borrow", "run", "--host", paths[0], "--state", paths[1], "--socket", paths[2],
    ]
}

/// A 16 MiB VM disk: random data with a 2 MiB hole at 8 MiB.
fn state(dir: &Path) -> PathBuf {
    let s = dir.join("vm.img");
    common::random_file(&s, 16 << 20, 3);
    let f = std::fs::OpenOptions::new().write(true).open(&s).unwrap();
    f.write_all_at(&vec![0u8; 2 << 20], 8 << 20).unwrap();
    s
}

/// Run a session whose client saves the disk as it sees it, then writes
/// 64 KiB of 0xab at 1 MiB and zeroes 8 KiB at 4 MiB. Returns the JSON
/// timings.
fn session(extra: &[&str]) -> (TempDir, String) {
    common::require_tool("qemu-io");
    let tmp = common::tempdir();
    let dir = tmp.path();
    let host = host(dir);
    let vm = state(dir);
    let orig = std::fs::read(&vm).unwrap();
    let seen = dir.join("seen.bin");
    let plan = dir.join("run.plan");
    let exec = format!(
        "nbdcopy \"$ROAMDISK_NBD_URI\" {} && qemu-io -f raw \"$ROAMDISK_NBD_URI\" -c 'write -P 0xab 1M 64k' -c 'write -z 4M 8k'",
        seen.display()
    );
    let socket = dir.join("vm.sock");
    let mut args = borrow_run(&host, &vm, &socket);
    let plan_out = ["--plan-out", path_str(&plan)];
    args.extend(["--min-extent", "256K"].iter().chain(&plan_out));
    args.extend(["--exec", exec.as_str(), "--json"].iter().chain(extra));
    let stdout = rd(&args);
    // The client saw the VM disk exactly.
    assert!(
        std::fs::read(&seen).unwrap() == orig,
        "the served disk differs from the VM disk"
    );
    // Only its changes came back.
    let mut want = orig;
    want[1 << 20..(1 << 20) + (64 << 10)].fill(0xab);
    want[4 << 20..(4 << 20) + (8 << 10)].fill(0);
    assert!(
        std::fs::read(&vm).unwrap() == want,
        "the VM disk after the session is wrong"
    );
    assert!(stdout.contains("\"copy_back_bytes\": 73728"), "{stdout}");
    for k in "scan_s allocate_s copy_in_s serve_s copy_back_s release_s".split(' ') {
        assert!(
            stdout.contains(&format!("\"{k}\": ")),
            "timing {k} missing: {stdout}"
        );
    }
    // The host file system is as clean as before.
    e2fsck_clean(&host);
    (tmp, stdout)
}

/// Panic unless the session's JSON report holds every one of WANT.
fn assert_reports(out: &str, want: &[&str]) {
    for w in want {
        assert!(out.contains(w), "{out}");
    }
}

#[test]
fn whole_copy_in_serve_and_copy_back_of_modified_blocks() {
    let (_tmp, out) = session(&[]);
    // 14 MiB of data (the hole is skipped).
    assert_reports(
        &out,
        &["\"copy_in_bytes\": 14680064", "\"disk_bytes\": 16777216"],
    );
}

#[test]
fn on_demand_copy_in_fetches_what_the_client_reads() {
    let (_tmp, out) = session(&["--on-demand"]);
    // The client read everything, so everything was fetched.
    assert_reports(
        &out,
        &["\"copy_in_bytes\": 0", "\"fetched_bytes\": 16777216"],
    );
}

#[test]
fn scrub_zeroes_the_borrowed_blocks_at_release() {
    let (tmp, out) = session(&["--scrub"]);
    assert!(!out.contains("\"scrubbed_bytes\": 0"), "{out}");
    let host = tmp.path().join("host.img");
    for (_, off, len) in plan_extents(&tmp.path().join("run.plan")) {
        let mut v = vec![0u8; len as usize];
        std::fs::File::open(&host)
            .unwrap()
            .read_exact_at(&mut v, off)
            .unwrap();
        assert!(v.iter().all(|&b| b == 0), "extent at {off} not scrubbed");
    }
}

#[test]
fn a_host_without_enough_free_space_fails_before_serving() {
    let tmp = common::tempdir();
    let host = tmp.path().join("small.img");
    empty_ext4(&host, "8M");
    let vm = state(tmp.path());
    let out = roamdisk(&borrow_run(&host, &vm, &tmp.path().join("s")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("found only")
            && err.contains("small.img")
            && err.contains("16 MiB are needed"),
        "{err}"
    );
}
