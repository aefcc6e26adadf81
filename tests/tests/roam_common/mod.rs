//! What the roaming tests with a real guest share (`guest_roam.rs`,
//! `guest_lazy.rs`): a store holding an empty ext4 image, `suspend --qmp`
//! and its report, the resume's report lines, the guest's output read
//! back, and the disk checked after roaming.

#![allow(dead_code)]
#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cas_common::{checkout, commit_session, commit_version, json_str, Cas, ChunkServer};
use crate::common::{e2fsck_clean, path_str, run, run_stdout, Server};
use crate::guest_common::{GuestRun, RunningGuest};

pub const MIB: u64 = 1 << 20;
pub const IMAGE: &str = "alice/vm";

/// The store (a folder, served at full speed) holding IMAGE: a 128 MiB
/// empty ext4 file system made on the host; with `encrypt`, encrypted
/// with a new key, whose file is returned.
pub fn store_with_ext4(encrypt: bool) -> (Cas, ChunkServer, Option<PathBuf>) {
    let cas = Cas::local();
    let base = cas.dir().join("base.raw");
    std::fs::File::create(&base)
        .and_then(|f| f.set_len(128 * MIB))
        .expect("base image");
    run(
        "mke2fs",
        &["-q", "-F", "-t", "ext4", "-L", "roam", path_str(&base)],
    );
    let fast = ChunkServer::start(&cas.store, &[]);
    let key = encrypt.then(|| cas.dir().join("alice.key"));
    let extra: Vec<&str> = match &key {
        Some(k) => vec!["--encrypt", "--key-file", path_str(k)],
        None => Vec::new(),
    };
    commit_version(&fast.url, path_str(&base), IMAGE, &extra);
    (cas, fast, key)
}

/// `roamdisk suspend SESS --qmp (G's socket) --to-media MEDIA EXTRA...`;
/// its stdout. A failure shows QEMU's side too.
pub fn suspend(g: &RunningGuest, sess: &Path, media: &Path, extra: &[&str]) -> String {
    let t0 = Instant::now();
    let args = [
        &[
            "suspend",
            path_str(sess),
            "--qmp",
            path_str(g.qmp_socket()),
            "--to-media",
            path_str(media),
        ],
        extra,
    ]
    .concat();
    let o = crate::common::roamdisk(&args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "roamdisk {args:?} failed ({}):\n{out}{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr),
        g.report()
    );
    println!("suspend took {:.2} s:\n{out}", t0.elapsed().as_secs_f64());
    assert!(out.contains("VM state"), "{out}");
    out
}

/// `roamdisk resume IMAGE --qmp` on HOST (its session, shared cache and
/// QEMU's QMP socket there), the store at STORE, served on
/// HOST/resume.sock; `extra` after.
pub fn resume(host: &Path, store: &str, extra: &[&str]) -> Server {
    std::fs::create_dir_all(host).expect("host folder");
    Server::start_command(
        host,
        "resume.sock",
        "resume",
        &[
            &[
                IMAGE,
                "--store",
                store,
                "--session",
                path_str(&host.join("sess")),
                "--shared-cache",
                path_str(&host.join("shared")),
                "--qmp",
                path_str(&host.join("guest-qmp.sock")),
            ],
            extra,
        ]
        .concat(),
    )
}

/// The resume process's report line on the VM's state, once it is there.
pub fn restored_line(srv: &Server) -> String {
    let t0 = Instant::now();
    loop {
        let out = srv.out_text();
        if let Some(l) = out.lines().find(|l| l.contains("VM state")) {
            return l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no VM state line from resume:\n{out}\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The resume process's report line once every page of a lazy resume is
/// in QEMU.
pub fn memory_done_line(srv: &Server) -> String {
    let t0 = Instant::now();
    loop {
        let out = srv.out_text();
        if let Some(l) = out.lines().find(|l| l.contains("  memory       all ")) {
            return l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "no memory line from resume:\n{out}\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The guest's output lines PREFIX...SUFFIX, what lies between, in order.
pub fn between(run: &GuestRun, prefix: &str, suffix: &str) -> Vec<String> {
    run.output
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix)?.strip_suffix(suffix))
        .map(str::to_string)
        .collect()
}

/// The `count N;` numbers in a run's output, in order.
pub fn counts(run: &GuestRun) -> Vec<u32> {
    between(run, "count ", ";")
        .iter()
        .map(|n| n.parse().expect("a count"))
        .collect()
}

/// Commit the session SESS (through STORE), check the version out and
/// check it: a clean ext4 whose /counter holds `1 ..= count`, one line
/// each, its uptimes never going back nor jumping by more than 5 s.
pub fn check_disk(store: &str, sess: &Path, dir: &Path, count: u32, extra: &[&str]) {
    check_disk_within(store, sess, dir, count, extra, 5.0)
}

/// [`check_disk`], the uptime allowed to jump by up to `max_jump` seconds
/// between two lines (a guest that waited on its memory).
pub fn check_disk_within(
    store: &str,
    sess: &Path,
    dir: &Path,
    count: u32,
    extra: &[&str],
    max_jump: f64,
) {
    let out = commit_session(sess, &["--store", store, "-m", "after roaming", "--json"]);
    let v = json_str(&out, "version");
    let image = dir.join("final.raw");
    checkout(store, &format!("{IMAGE}@{}", &v[..12]), &image, extra);
    e2fsck_clean(&image);
    let text = run_stdout("debugfs", &["-R", "cat /counter", path_str(&image)]);
    let lines: Vec<(u32, f64)> = text
        .lines()
        .map(|l| {
            let (i, up) = l.split_once(' ').unwrap_or_else(|| panic!("line {l:?}"));
            (i.parse().expect("count"), up.parse().expect("uptime"))
        })
        .collect();
    let want: Vec<u32> = (1..=count).collect();
    assert_eq!(
        lines.iter().map(|l| l.0).collect::<Vec<_>>(),
        want,
        "the counter file:\n{text}"
    );
    let max_step = lines
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .fold(0.0f64, f64::max);
    let min_step = lines
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .fold(f64::MAX, f64::min);
    println!("guest uptime steps between counter lines: {min_step:.2}-{max_step:.2} s");
    assert!(min_step >= 0.0, "the guest's uptime went back:\n{text}");
    assert!(max_step < max_jump, "the guest's uptime jumped:\n{text}");
}
