//! A real Linux guest on a content-addressed session: qemu (TCG) boots a
//! Debian kernel whose only disk is `roamdisk serve cas:SESSION`, the
//! session being a checkout of a version held by a chunk server behind an
//! emulated link. The guest reads the start of the disk, makes an ext4
//! file system on it, writes a directory tree and a random file, prints
//! the hashes and powers off. On the host, the session's disk and the
//! version `roamdisk commit cas:SESSION` makes of it must both be clean
//! ext4 file systems holding exactly what the guest wrote.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;
mod guest_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cas_common::{
    checkout, commit_session, commit_version, json_str, open_session, Cas, ChunkServer,
};
use common::{e2fsck_clean, path_str, qemu_img_copy, random_file, run, run_stdout, Server};
use guest_common::{Guest, GuestRun, START_MARK};

const MIB: u64 = 1 << 20;
const DISK_SIZE: u64 = 128 * MIB;
/// Random bytes at the start of the base disk, read back by the guest.
const SIGNATURE: u64 = MIB;
const IMAGE: &str = "alice/vm";
const GUEST_TIMEOUT: Duration = Duration::from_secs(180);

/// The guest's work: its output lines `HASH  PATH` come from sha256sum.
const GUEST_SCRIPT: &str = r#"
head -c 1048576 /dev/vda >/tmp/signature
sha256sum /tmp/signature
mke2fs -q -F -t ext4 -b 4096 -L roamdisk /dev/vda
mount -t ext4 /dev/vda /mnt
mkdir -p /mnt/tree/a/b /mnt/tree/c
echo "hello from the guest" >/mnt/tree/a/b/hello.txt
for i in 1 2 3; do echo "file $i" >/mnt/tree/c/f$i; done
dd if=/dev/urandom of=/mnt/big.bin bs=1M count=4 2>/dev/null
sha256sum /mnt/big.bin
sync
umount /mnt
"#;

/// The chunk store (a folder served over HTTP at 100 MB/s with 2 ms per
/// request) holding IMAGE: a DISK_SIZE disk of zeroes but for SIGNATURE
/// random bytes at its start, whose sha256 is returned too.
fn store_with_base_image() -> (Cas, ChunkServer, String) {
    let cas = Cas::new();
    let base = cas.dir().join("base.raw");
    random_file(&base, SIGNATURE, 7);
    let sig_sha = sha256(&base);
    std::fs::File::options()
        .write(true)
        .open(&base)
        .and_then(|f| f.set_len(DISK_SIZE))
        .expect("grow the base disk");
    let chunks = ChunkServer::start(&cas.store, &["--limit", "100M", "--latency", "2ms"]);
    commit_version(&chunks.url, path_str(&base), IMAGE, &[]);
    (cas, chunks, sig_sha)
}

/// IMAGE checked out from CHUNKS as the session SESS (DIR/NAME), served
/// by `roamdisk serve cas[shared-cache=DIR/shared]:SESS`, its chunks
/// cached in the test's folder rather than the host's cache: the session
/// and its server.
fn serve_session(chunks: &ChunkServer, dir: &Path, name: &str) -> (PathBuf, Server) {
    let sess = dir.join(name);
    open_session(&chunks.url, IMAGE, &sess, &[]);
    let spec = format!(
        "cas[shared-cache={}]:{}",
        dir.join("shared").display(),
        sess.display()
    );
    let srv = Server::start(dir, &[&spec]);
    (sess, srv)
}

/// `sha256sum FILE`: the hex digest.
fn sha256(file: &Path) -> String {
    run_stdout("sha256sum", &[path_str(file)])
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

/// The digest the guest's `sha256sum PATH` printed.
fn guest_sha256(run: &GuestRun, path: &str) -> String {
    let suffix = format!("  {path}");
    run.lines()
        .into_iter()
        .find_map(|l| l.strip_suffix(&suffix))
        .unwrap_or_else(|| panic!("no sha256sum of {path} in:\n{}", run.console))
        .to_string()
}

/// IMAGE must be a clean ext4 holding what GUEST_SCRIPT wrote, its
/// `/big.bin` hashing to BIG_SHA.
fn assert_guest_files(image: &Path, big_sha: &str) {
    e2fsck_clean(image);
    let img = path_str(image);
    let big = image.with_extension("big.bin");
    let _ = std::fs::remove_file(&big);
    run(
        "debugfs",
        &["-R", &format!("dump /big.bin {}", path_str(&big)), img],
    );
    assert_eq!(std::fs::metadata(&big).expect("dumped").len(), 4 * MIB);
    assert_eq!(sha256(&big), big_sha, "/big.bin in {img}");
    let hello = run_stdout("debugfs", &["-R", "cat /tree/a/b/hello.txt", img]);
    assert_eq!(hello, "hello from the guest\n", "{img}");
    let ls = run_stdout("debugfs", &["-R", "ls /tree/c", img]);
    for f in ["f1", "f2", "f3"] {
        assert!(ls.contains(f), "no /tree/c/{f} in {img}:\n{ls}");
    }
    let f2 = run_stdout("debugfs", &["-R", "cat /tree/c/f2", img]);
    assert_eq!(f2, "file 2\n", "{img}");
}

/// Commit the session SESS, check the new version out into DIR and check
/// the guest's files in it; returns the checked-out image.
fn committed_files(chunks: &ChunkServer, sess: &Path, dir: &Path, big_sha: &str) -> PathBuf {
    let out = commit_session(sess, &["-m", "after the guest", "--json"]);
    let v = json_str(&out, "version");
    let committed = dir.join("committed.raw");
    checkout(
        &chunks.url,
        &format!("{IMAGE}@{}", &v[..12]),
        &committed,
        &[],
    );
    assert_guest_files(&committed, big_sha);
    committed
}

#[test]
fn a_guest_formats_and_fills_a_session_and_its_commit_holds_the_files() {
    let (cas, chunks, sig_sha) = store_with_base_image();
    let dir = cas.dir();
    let (sess, srv) = serve_session(&chunks, dir, "sess");
    let t0 = Instant::now();
    let mut guest = Guest::new(dir)
        .nbd_disk(&srv.socket, "")
        .spawn(GUEST_SCRIPT);
    guest.wait_output(START_MARK, GUEST_TIMEOUT);
    let status = guest.qmp(r#"{"execute": "query-status"}"#);
    assert!(status.contains("\"running\""), "QMP query-status: {status}");
    let run = guest.wait(GUEST_TIMEOUT);
    run.assert_ok();
    println!("guest run: {:?} (whole: {:?})", run.elapsed, t0.elapsed());
    assert_eq!(
        guest_sha256(&run, "/tmp/signature"),
        sig_sha,
        "the guest read the base disk's first MiB"
    );
    let big_sha = guest_sha256(&run, "/mnt/big.bin");

    // The session as the server shows it, then stopped cleanly.
    let live = dir.join("session.raw");
    qemu_img_copy(&srv.uri(), path_str(&live));
    let st = srv.stop();
    assert!(st.success(), "roamdisk serve exited with {st}");
    assert_guest_files(&live, &big_sha);

    // The session's commit carries the guest's writes.
    committed_files(&chunks, &sess, dir, &big_sha);
    println!("whole test: {:?}", t0.elapsed());
}

/// The guest on a resumed host: reads back what the first guest wrote,
/// adds a file.
const SECOND_GUEST_SCRIPT: &str = r#"
mount -t ext4 /dev/vda /mnt
sha256sum /mnt/big.bin
cat /mnt/tree/a/b/hello.txt
echo "written on the second host" >/mnt/tree/second.txt
sync
umount /mnt
"#;

/// Roaming end to end: a guest fills a session on one host; the session is
/// suspended with a memory image and its resume set written to a folder
/// (the USB key); `roamdisk resume` in another folder with another shared
/// cache (the next host) serves it at once with the folder as lookaside,
/// and a second guest finds the files and adds one; the host side then
/// checks the resumed session's commit with e2fsck and debugfs.
#[test]
fn a_guest_suspended_on_one_host_resumes_on_another_with_its_resume_set() {
    let (cas, chunks, _) = store_with_base_image();
    let dir = cas.dir();
    let (sess, srv) = serve_session(&chunks, dir, "host-a/sess");
    let first = Guest::new(dir)
        .nbd_disk(&srv.socket, "")
        .run(GUEST_SCRIPT, GUEST_TIMEOUT);
    first.assert_ok();
    let big_sha = guest_sha256(&first, "/mnt/big.bin");
    assert!(srv.stop().success());

    let memory = dir.join("vm.mem");
    random_file(&memory, 4 * MIB, 8);
    let usb = dir.join("usb");
    let out = run_stdout(
        path_str(&common::bin()),
        &[
            "suspend",
            path_str(&sess),
            "--memory",
            path_str(&memory),
            "--to-media",
            path_str(&usb),
        ],
    );
    assert!(out.contains("suspended alice/vm@"), "{out}");

    // The next host: its own folder and shared cache; served at once.
    let host_b = dir.join("host-b");
    std::fs::create_dir_all(&host_b).unwrap();
    let mem_out = host_b.join("vm.mem");
    let resumed = host_b.join("sess");
    let srv = Server::start_command(
        &host_b,
        "resume.sock",
        "resume",
        &[
            IMAGE,
            "--store",
            &chunks.url,
            "--session",
            path_str(&resumed),
            "--shared-cache",
            path_str(&host_b.join("shared")),
            "--lookaside",
            path_str(&usb),
            "--memory-out",
            path_str(&mem_out),
        ],
    );
    assert_eq!(
        std::fs::read(&mem_out).unwrap(),
        std::fs::read(&memory).unwrap(),
        "the memory image is written before the disk is served"
    );
    let second = Guest::new(&host_b)
        .nbd_disk(&srv.socket, "")
        .run(SECOND_GUEST_SCRIPT, GUEST_TIMEOUT);
    second.assert_ok();
    assert_eq!(guest_sha256(&second, "/mnt/big.bin"), big_sha);
    assert!(
        second.lines().contains(&"hello from the guest"),
        "{}",
        second.console
    );
    let log = srv.log_text();
    assert!(srv.stop().success(), "{log}");

    let committed = committed_files(&chunks, &resumed, &host_b, &big_sha);
    let second_txt = run_stdout(
        "debugfs",
        &["-R", "cat /tree/second.txt", path_str(&committed)],
    );
    assert_eq!(second_txt, "written on the second host\n");
}

/// The guest's failures reach the test: a failing command ends the script
/// (`sh -e`) with its status, and a guest with no disk still powers off.
#[test]
fn a_failing_guest_script_is_reported_with_its_status() {
    let tmp = common::tempdir();
    let run = Guest::new(tmp.path()).run("echo before\nfalse\necho after\n", GUEST_TIMEOUT);
    assert!(!run.ok(), "{}", run.console);
    assert_eq!(run.exit, Some(1), "{}", run.console);
    assert_eq!(run.lines(), vec!["before"], "{}", run.console);
    assert!(run.qemu_status.is_some_and(|s| s.success()), "{run:?}");
}
