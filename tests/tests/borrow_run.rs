//! `roamdisk borrow run`: the whole session. The VM disk is copied onto
//! borrowed host blocks (whole or on demand), served, modified by a
//! client, and only the modified blocks are copied back to the VM disk;
//! the host file system is left clean, and with --scrub the borrowed
//! blocks are zeroed. The timings of each phase are reported.

mod borrow_common;
mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use borrow_common::*;
use common::{roamdisk, run};

fn host(dir: &Path) -> PathBuf {
    let img = dir.join("host.img");
    run("truncate", &["-s", "96M", img.to_str().unwrap()]);
    run("mke2fs", &["-q", "-F", "-t", "ext4", img.to_str().unwrap()]);
    img
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
fn session(dir: &Path, extra: &[&str]) -> String {
    common::require_tool("qemu-io");
    let host = host(dir);
    let vm = state(dir);
    let orig = std::fs::read(&vm).unwrap();
    let seen = dir.join("seen.bin");
    let plan = dir.join("run.plan");
    let exec = format!(
        "nbdcopy \"$ROAMDISK_NBD_URI\" {} && qemu-io -f raw \"$ROAMDISK_NBD_URI\" -c 'write -P 0xab 1M 64k' -c 'write -z 4M 8k'",
        seen.display()
    );
    let mut args = vec![
        "borrow",
        "run",
        "--host",
        host.to_str().unwrap(),
        "--state",
        vm.to_str().unwrap(),
        "--socket",
        dir.join("vm.sock").to_str().unwrap().to_string().leak(),
        "--min-extent",
        "256K",
        "--plan-out",
        plan.to_str().unwrap(),
        "--exec",
        exec.as_str(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = roamdisk(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "borrow run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    for k in [
        "scan_s",
        "allocate_s",
        "copy_in_s",
        "serve_s",
        "copy_back_s",
        "release_s",
    ] {
        assert!(
            stdout.contains(&format!("\"{k}\": ")),
            "timing {k} missing: {stdout}"
        );
    }
    // The host file system is as clean as before.
    let fsck = std::process::Command::new("e2fsck")
        .args(["-fn", host.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    stdout
}

#[test]
fn whole_copy_in_serve_and_copy_back_of_modified_blocks() {
    let tmp = common::tempdir();
    let out = session(tmp.path(), &[]);
    // 14 MiB of data (the hole is skipped).
    assert!(out.contains("\"copy_in_bytes\": 14680064"), "{out}");
    assert!(out.contains("\"disk_bytes\": 16777216"), "{out}");
}

#[test]
fn on_demand_copy_in_fetches_what_the_client_reads() {
    let tmp = common::tempdir();
    let out = session(tmp.path(), &["--on-demand"]);
    assert!(out.contains("\"copy_in_bytes\": 0"), "{out}");
    // The client read everything, so everything was fetched.
    assert!(out.contains("\"fetched_bytes\": 16777216"), "{out}");
}

#[test]
fn scrub_zeroes_the_borrowed_blocks_at_release() {
    let tmp = common::tempdir();
    let out = session(tmp.path(), &["--scrub"]);
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
    run("truncate", &["-s", "8M", host.to_str().unwrap()]);
    run(
        "mke2fs",
        &["-q", "-F", "-t", "ext4", host.to_str().unwrap()],
    );
    let vm = state(tmp.path());
    let out = roamdisk(&[
        "borrow",
        "run",
        "--host",
        host.to_str().unwrap(),
        "--state",
        vm.to_str().unwrap(),
        "--socket",
        tmp.path().join("s").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("found only")
            && err.contains("small.img")
            && err.contains("16.0 MiB are needed"),
        "{err}"
    );
}
