//! A running guest resumed before its memory arrives (lazy resume):
//! qemu (TCG) runs a guest whose disk is a cas session; it keeps a file of
//! pseudo-random data in a tmpfs (in RAM only) and its hash, and appends a
//! counter line to a file on its disk every 100 ms. `roamdisk suspend
//! --qmp` stores its state as a page image; on "host B" (other folders, an
//! empty shared cache, no media, the store behind a throttled `store
//! serve`) `roamdisk resume --qmp` is QEMU's postcopy source: the guest
//! runs on while its pages come. Once all are in, the test tells the guest
//! (a line on its third serial port) to hash its file again: it must
//! match; the counter must be continuous, the boot the same, the file
//! system clean.
//!
//! Also, each a test: the store gone for 20 s mid-memory, the `resume`
//! killed mid-memory and run again (QEMU's postcopy recovery), a damaged
//! memory chunk on lookaside media, a QEMU that refuses postcopy (eager,
//! said why), a stream with a section roamdisk does not store (refused at
//! suspend, the VM runs on), and a version suspended by the build before
//! the page image (its memory a stream: resumed eagerly).

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;
mod guest_common;
mod roam_common;

use std::path::Path;
use std::time::{Duration, Instant};

use cas_common::{open_session, ChunkServer};
use common::{path_str, rd, Server};
use guest_common::{Guest, GuestRun, RunningGuest};
use roam_common::{
    between, check_disk_within, counts, memory_done_line, restored_line, store_with_ext4, suspend,
    IMAGE,
};

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The guest: MIB MiB of pseudo-random data in /tmp (a tmpfs: RAM) and
/// its hash, then a counter line every 100 ms on the disk; a line on
/// /dev/ttyS2 makes it hash the data again (`rehash H;`), count 10 more,
/// and end (sync, the boot id again, unmount).
fn script(mib: u32) -> String {
    format!(
        r#"
mount -t ext4 /dev/vda /mnt
echo "boot $(cat /proc/sys/kernel/random/boot_id)"
dd if=/dev/urandom of=/tmp/blob bs=1M count={mib} 2>/dev/null
echo "hash $(md5sum </tmp/blob | cut -d' ' -f1);"
( read x </dev/ttyS2; touch /tmp/go ) &
i=0
left=-1
while [ $left -ne 0 ]; do
  i=$((i+1))
  echo "$i $(cut -d' ' -f1 /proc/uptime)" >>/mnt/counter
  echo "count $i;"
  if [ $left -lt 0 ]; then
    if [ -e /tmp/go ]; then
      echo "rehash $(md5sum </tmp/blob | cut -d' ' -f1);"
      left=10
    fi
  fi
  if [ $left -gt 0 ]; then left=$((left-1)); fi
  sleep 0.1
done
sync
echo "boot $(cat /proc/sys/kernel/random/boot_id)"
umount /mnt
"#
    )
}

/// A guest of `mib` MiB of RAM on `host`, its disk served on SOCKET
/// (waiting up to a minute for its server to come back, as a takeover
/// needs); `incoming`: a QEMU waiting for a VM's state.
fn guest(host: &Path, socket: &Path, mem: u32, incoming: bool) -> Guest {
    let g = Guest::new(host)
        .memory_mib(mem)
        .nbd_disk(socket, "")
        .reconnect(60)
        .control();
    if incoming {
        g.qemu_args(&["-incoming", "defer"])
    } else {
        g
    }
}

/// The hash the guest printed first, and its hash after the memory came.
fn hashes(a: &GuestRun, b: &GuestRun) -> (String, String) {
    let first = between(a, "hash ", ";");
    let again = between(b, "rehash ", ";");
    assert_eq!(first.len(), 1, "{first:?}\n{}", a.output);
    assert_eq!(again.len(), 1, "{again:?}\n{}", b.output);
    (first[0].clone(), again[0].clone())
}

/// Host A: a session of IMAGE, the guest with `blob` MiB in its tmpfs,
/// run to its 5th count, then suspended (`extra` to suspend); its run.
struct HostA {
    run: GuestRun,
    count: u32,
}

fn run_on_a(fast: &ChunkServer, a: &Path, mem: u32, blob: u32, media: Option<&Path>) -> HostA {
    std::fs::create_dir_all(a).expect("host A");
    let sess = a.join("sess");
    open_session(&fast.url, IMAGE, &sess, &[]);
    let spec = format!(
        "cas[shared-cache={}]:{}",
        a.join("shared").display(),
        sess.display()
    );
    let srv = Server::start(a, &[&spec]);
    let mut g = guest(a, &srv.socket, mem, false).spawn(&script(blob));
    g.wait_output("count 5;", GUEST_TIMEOUT);
    let out = match media {
        Some(m) => suspend(&g, &sess, m, &[]),
        None => rd(&[
            "suspend",
            path_str(&sess),
            "--qmp",
            path_str(g.qmp_socket()),
        ]),
    };
    println!(
        "host A: {}",
        out.lines().find(|l| l.contains("VM state")).unwrap_or(&out)
    );
    let run = g.wait(Duration::from_secs(30));
    let count = *counts(&run).last().expect("host A counted");
    drop(srv);
    HostA { run, count }
}

/// [`roam_common::resume`] with a watchdog of 5 s.
fn resume(host: &Path, store: &str, extra: &[&str]) -> Server {
    roam_common::resume(host, store, &[&["--watchdog", "5s"], extra].concat())
}

/// The percentage of stored pages in QEMU the resume last reported
/// (`memory arriving NN%` on its stderr), 0 before any.
fn arrived_pct(srv: &Server) -> u32 {
    srv.log_text()
        .lines()
        .filter_map(|l| {
            l.split_once("memory arriving ")?
                .1
                .split('%')
                .next()?
                .parse()
                .ok()
        })
        .next_back()
        .unwrap_or(0)
}

/// Wait until the resume reports at least `pct`% of the pages in QEMU.
fn wait_arrived(srv: &Server, pct: u32) {
    let t0 = Instant::now();
    while arrived_pct(srv) < pct {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "the memory never reached {pct}%:\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After the memory has all come: the rehash, the end of the run, the
/// checks (one boot, the counter continuous from host A, the data's hash
/// the same, the disk clean with every counter line).
fn finish(fast: &ChunkServer, b: &Path, a: &HostA, g: RunningGuest, srv: Server) {
    // The rehash of the data (under TCG, seconds for 300 MiB) runs between
    // two counter lines.
    finish_within(fast, b, a, g, srv, 30.0)
}

/// [`finish`], the guest's uptime allowed to jump by `max_jump` seconds
/// between two counter lines (it waited on pages).
fn finish_within(
    fast: &ChunkServer,
    b: &Path,
    a: &HostA,
    g: RunningGuest,
    srv: Server,
    max_jump: f64,
) {
    g.send_control("go");
    let run = g.wait(GUEST_TIMEOUT);
    run.assert_ok();
    let (h1, h2) = hashes(&a.run, &run);
    assert_eq!(h1, h2, "the data in the guest's RAM changed");
    let all: Vec<u32> = counts(&a.run).into_iter().chain(counts(&run)).collect();
    let n = *all.last().expect("counts");
    assert_eq!(all, (1..=n).collect::<Vec<_>>(), "counter across hosts");
    let ids: Vec<String> = [&a.run, &run]
        .iter()
        .flat_map(|r| between(r, "boot ", ""))
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], ids[1], "the guest booted again");
    let log = srv.log_text();
    srv.stop();
    assert!(!log.contains("panicked"), "{log}");
    check_disk_within(&fast.url, &b.join("sess"), b, n, &[], max_jump);
}

/// The last `count N;` in a guest's output so far.
fn last_count(output: &str) -> u32 {
    output
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("count ")?
                .strip_suffix(';')?
                .parse()
                .ok()
        })
        .next_back()
        .expect("the guest counted")
}

/// The guest's first count after `after`, and how long after `t0` it came.
fn next_count(g: &mut RunningGuest, after: u32, t0: Instant) -> f64 {
    g.wait_output(&format!("count {};", after + 1), GUEST_TIMEOUT);
    t0.elapsed().as_secs_f64()
}

#[test]
fn a_guest_of_1_gib_runs_before_its_memory_arrives_and_gets_every_page() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = run_on_a(&fast, &dir.join("a"), 1024, 300, None);
    let link = ChunkServer::start(&cas.store, &["--limit", "100Mbit"]);
    let b = dir.join("b");
    let t0 = Instant::now();
    let srv = resume(&b, &link.url, &[]);
    let mut g = guest(&b, &b.join("resume.sock"), 1024, true).spawn(&script(300));
    let line = restored_line(&srv);
    assert!(
        line.contains("lazily") && line.contains("the VM is running"),
        "{line}"
    );
    let ran = next_count(&mut g, a.count, t0);
    // The guest counted on before its memory was all here: the resume
    // had not reported it complete.
    let early = srv.out_text();
    println!("host B: the next count {ran:.2} s after resume started (100 Mbit/s):\n{line}");
    assert!(
        !early.contains("  memory       all "),
        "the memory had all arrived before the guest ran on:\n{early}"
    );
    let done = memory_done_line(&srv);
    println!("host B: {done}");
    assert!(done.contains("never sent"), "{done}");
    finish(&fast, &b, &a, g, srv);
}

/// The store goes away for 20 s at ~30% of the memory and comes back at
/// the same address: the guest waits on what it lacks, then carries on.
#[test]
fn the_store_gone_for_20_s_mid_memory_delays_the_guest_and_loses_nothing() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = run_on_a(&fast, &dir.join("a"), 256, 64, None);
    let mut link = ChunkServer::start(&cas.store, &["--limit", "20Mbit"]);
    let at = link.url.trim_start_matches("http://").to_string();
    let b = dir.join("b");
    let srv = resume(&b, &link.url, &[]);
    let mut g = guest(&b, &b.join("resume.sock"), 256, true).spawn(&script(64));
    next_count(&mut g, a.count, Instant::now());
    wait_arrived(&srv, 25);
    link.stop();
    let gone = arrived_pct(&srv);
    std::thread::sleep(Duration::from_secs(20));
    let during = arrived_pct(&srv);
    let _back = ChunkServer::start_at(&cas.store, &at, &["--limit", "20Mbit"]);
    println!("store away at {gone}%, {during}% after 20 s");
    assert!(during < 100, "the memory came with the store away");
    let done = memory_done_line(&srv);
    println!("host B: {done}\n{}", srv.log_text());
    finish_within(&fast, &b, &a, g, srv, 60.0);
}

/// The resume killed with SIGKILL at ~30% of the memory, then run again
/// with the same arguments: it takes the paused postcopy over.
#[test]
fn a_resume_killed_mid_memory_is_taken_over_by_running_it_again() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = run_on_a(&fast, &dir.join("a"), 256, 64, None);
    let link = ChunkServer::start(&cas.store, &["--limit", "20Mbit"]);
    let b = dir.join("b");
    let srv = resume(&b, &link.url, &[]);
    let mut g = guest(&b, &b.join("resume.sock"), 256, true).spawn(&script(64));
    next_count(&mut g, a.count, Instant::now());
    wait_arrived(&srv, 25);
    srv.kill9();
    let status = g.qmp(r#"{"execute": "query-migrate"}"#);
    let t0 = Instant::now();
    let mut paused = status.contains("postcopy-paused");
    while !paused && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        paused = g
            .qmp(r#"{"execute": "query-migrate"}"#)
            .contains("postcopy-paused");
    }
    assert!(paused, "QEMU did not pause its postcopy: {status}");
    let srv = resume(&b, &link.url, &[]);
    let line = restored_line(&srv);
    assert!(line.contains("taken over"), "{line}\n{}", srv.log_text());
    let done = memory_done_line(&srv);
    println!("host B, taken over: {done}");
    finish(&fast, &b, &a, g, srv);
}

/// Every pack of the resume set on the media damaged: its memory chunks
/// fail their check and come from the store.
#[test]
fn a_damaged_memory_chunk_on_the_media_is_fetched_from_the_store() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let media = dir.join("usb");
    let a = run_on_a(&fast, &dir.join("a"), 256, 64, Some(&media));
    let mut damaged = 0;
    for p in cas_common::pack_files(&media) {
        let mut bytes = std::fs::read(&p).expect("a pack");
        if bytes.len() > 1 << 20 {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x5a;
            std::fs::write(&p, bytes).expect("damage a pack");
            damaged += 1;
        }
    }
    assert!(damaged > 0, "no pack to damage on the media");
    let b = dir.join("b");
    let srv = resume(&b, &fast.url, &["--lookaside", path_str(&media)]);
    let g = guest(&b, &b.join("resume.sock"), 256, true).spawn(&script(64));
    let done = memory_done_line(&srv);
    let out = srv.out_text();
    println!("host B: {done}\n{out}");
    assert!(
        out.contains("failed verification"),
        "the damage went unnoticed:\n{out}"
    );
    finish(&fast, &b, &a, g, srv);
}

/// A version hoarded on host B (its memory image too): once resume has
/// started, the store goes away and every page comes from the shared
/// cache.
#[test]
fn a_hoarded_version_resumes_lazily_with_the_store_gone() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = run_on_a(&fast, &dir.join("a"), 256, 32, None);
    let mut link = ChunkServer::start(&cas.store, &[]);
    let b = dir.join("b");
    let out = cas_common::hoard(&link.url, IMAGE, path_str(&b.join("shared")), &[]);
    assert!(out.contains("the network may go"), "{out}");
    let srv = resume(&b, &link.url, &[]);
    link.stop();
    let g = guest(&b, &b.join("resume.sock"), 256, true).spawn(&script(32));
    let done = memory_done_line(&srv);
    println!("host B, hoarded: {done}");
    assert!(
        done.contains("0 B from lookaside media, 0 B fetched"),
        "{done}\n{}",
        srv.log_text()
    );
    finish(&fast, &b, &a, g, srv);
}

/// A QEMU that cannot do postcopy (no CAP_SYS_PTRACE: userfaultfd is
/// refused) gets the whole memory first, and the resume says why.
#[test]
fn a_qemu_without_postcopy_gets_the_memory_whole_and_runs() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = run_on_a(&fast, &dir.join("a"), 256, 32, None);
    let b = dir.join("b");
    let srv = resume(&b, &fast.url, &[]);
    let g = guest(&b, &b.join("resume.sock"), 256, true)
        .wrap(&["setpriv", "--bounding-set=-sys_ptrace"])
        .spawn(&script(32));
    let line = restored_line(&srv);
    println!("host B: {line}");
    assert!(
        line.contains("handed to QEMU whole") && line.contains("QEMU refused postcopy"),
        "{line}"
    );
    finish(&fast, &b, &a, g, srv);
}

/// A stream with a section roamdisk does not store (QEMU's dirty-bitmap
/// migration of a block node) is refused at suspend, naming it; the VM
/// runs on, and suspends once the capability is off.
#[test]
fn a_stream_with_a_section_roamdisk_does_not_store_is_refused_and_the_vm_runs_on() {
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let a = dir.join("a");
    std::fs::create_dir_all(&a).expect("host A");
    let sess = a.join("sess");
    open_session(&fast.url, IMAGE, &sess, &[]);
    let spec = format!(
        "cas[shared-cache={}]:{}",
        a.join("shared").display(),
        sess.display()
    );
    let srv = Server::start(&a, &[&spec]);
    let mut g = guest(&a, &srv.socket, 256, false).spawn(&script(8));
    g.wait_output("count 3;", GUEST_TIMEOUT);
    for cmd in [
        r#"{"execute": "block-dirty-bitmap-add", "arguments": {"node": "disk0", "name": "bm0"}}"#,
        r#"{"execute": "migrate-set-capabilities", "arguments": {"capabilities": [{"capability": "dirty-bitmaps", "state": true}]}}"#,
    ] {
        let r = g.qmp(cmd);
        assert!(r.contains("\"return\""), "{cmd}: {r}");
    }
    let o = common::roamdisk(&[
        "suspend",
        path_str(&sess),
        "--qmp",
        path_str(g.qmp_socket()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("refused suspend: {err}");
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("dirty-bitmap") && err.contains("VM runs on"),
        "{err}"
    );
    let n = last_count(&g.output());
    g.wait_output(&format!("count {};", n + 5), GUEST_TIMEOUT);
    let r = g.qmp(r#"{"execute": "migrate-set-capabilities", "arguments": {"capabilities": [{"capability": "dirty-bitmaps", "state": false}]}}"#);
    assert!(r.contains("\"return\""), "{r}");
    let out = rd(&[
        "suspend",
        path_str(&sess),
        "--qmp",
        path_str(g.qmp_socket()),
    ]);
    assert!(out.contains("VM state"), "{out}");
}

/// The fixture's store holds a version suspended by roamdisk at commit
/// 79d616b (before the page image: its memory a migration stream), made
/// with `store init`, an 8 MiB ext4 committed as alice/legacy, a session
/// served to a `-m 128` guest (the guest kit's QEMU 7.2, kernel and
/// initramfs, one virtio disk over NBD) and `suspend --qmp` at once, while
/// the guest was still in its firmware (so the image is 700 KiB). Resumed
/// now, it goes eagerly and the guest boots on and runs its script.
#[test]
fn a_version_suspended_by_the_build_before_the_page_image_resumes_eagerly() {
    let t = common::tempdir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/legacy-suspend");
    common::run("cp", &["-r", path_str(&src), path_str(t.path())]);
    let store = t.path().join("legacy-suspend/store");
    for d in ["leases", "tmp", "trash"] {
        std::fs::create_dir_all(store.join(d)).expect("store folder");
    }
    let b = t.path().join("b");
    std::fs::create_dir_all(&b).expect("host B");
    let srv = Server::start_command(
        &b,
        "resume.sock",
        "resume",
        &[
            "alice/legacy",
            "--store",
            path_str(&store),
            "--session",
            path_str(&b.join("sess")),
            "--shared-cache",
            "off",
            "--qmp",
            path_str(&b.join("guest-qmp.sock")),
        ],
    );
    let g = Guest::new(&b)
        .memory_mib(128)
        .nbd_disk(&b.join("resume.sock"), "")
        .qemu_args(&["-incoming", "defer"])
        .spawn("echo hello-from-an-old-suspend");
    let line = restored_line(&srv);
    println!("{line}");
    assert!(line.contains("handed to QEMU whole"), "{line}");
    let run = g.wait(GUEST_TIMEOUT);
    run.assert_ok();
    assert!(
        run.output.contains("hello-from-an-old-suspend"),
        "{}",
        run.output
    );
    srv.stop();
}
