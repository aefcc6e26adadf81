//! A running guest roams (ISR with the VM live): qemu (TCG) runs a guest
//! whose disk is a cas session; the guest writes a file, then appends a
//! counter line to a file every 100 ms. `roamdisk suspend --qmp` stops it
//! mid-run and stores its state and disk; on "host B" (other folders, an
//! empty shared cache, the resume set as lookaside media, the store
//! behind a 10 Mbit/s link) `roamdisk resume --qmp` hands a QEMU started
//! with `-incoming defer` the VM's state and continues it. The guest must
//! not notice: same boot, counter and uptime continuous, its file system
//! never recovered; at the end it syncs and powers off and the host checks
//! the file system (`e2fsck -fn`) and the whole counter file.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;
mod guest_common;
mod roam_common;

use std::path::Path;
use std::time::{Duration, Instant};

use cas_common::{open_session, ChunkServer};
use common::{path_str, Server};
use guest_common::{Guest, GuestRun, RunningGuest};
use roam_common::{
    between, check_disk, counts, memory_done_line, restored_line, store_with_ext4, suspend, IMAGE,
};

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// A line the guest keeps 2,000 times in its RAM (a tmpfs file): in the
/// memory image, never in an encrypted store in plaintext.
const MARKER: &str = "TOP-SECRET-MEMORY-MARKER-2718281828";

/// The guest: keeps MARKER in RAM, writes /a.bin (4 MiB, synced: on the disk before any
/// suspend) and prints its hash, then counts to COUNT, a line `I UPTIME`
/// in /counter every 100 ms; then re-reads /a.bin from the disk (caches
/// dropped), prints its hash and the boot id again, unmounts and powers
/// off.
fn script(count: u32) -> String {
    format!(
        r#"
mount -t ext4 /dev/vda /mnt
echo "boot $(cat /proc/sys/kernel/random/boot_id)"
i=0
while [ $i -lt 2000 ]; do echo {MARKER}; i=$((i+1)); done >/tmp/marker
dd if=/dev/urandom of=/mnt/a.bin bs=64k count=64 2>/dev/null
sync
sha256sum /mnt/a.bin
i=0
while [ $i -lt {count} ]; do
  i=$((i+1))
  echo "$i $(cut -d' ' -f1 /proc/uptime)" >>/mnt/counter
  echo "count $i;"
  sleep 0.1
done
sync
echo 3 >/proc/sys/vm/drop_caches
sha256sum /mnt/a.bin
echo "boot $(cat /proc/sys/kernel/random/boot_id)"
umount /mnt
"#
    )
    .replace("{MARKER}", MARKER)
}

/// `roamdisk resume IMAGE` into HOST/sess (HOST/shared its shared cache),
/// MEDIA as lookaside, STORE as the store, served on HOST/resume.sock,
/// handing the VM's state to the QEMU at HOST/guest-qmp.sock.
fn resume(host: &Path, store: &str, media: &Path, extra: &[&str]) -> Server {
    roam_common::resume(
        host,
        store,
        &[&["--lookaside", path_str(media)], extra].concat(),
    )
}

/// The guest on `host`, its disk served on SOCKET; `incoming`: a QEMU
/// waiting for a VM's state (`-incoming defer`).
fn guest(host: &Path, socket: &Path, incoming: bool, count: u32) -> RunningGuest {
    let g = Guest::new(host).nbd_disk(socket, "");
    let g = if incoming {
        g.qemu_args(&["-incoming", "defer"])
    } else {
        g
    };
    g.spawn(&script(count))
}

/// Assert the whole run: one boot, counts 1..=COUNT across the hosts in
/// order with no gap or repeat, /a.bin read back identical at the end.
fn check_runs(runs: &[&GuestRun], count: u32) {
    let all: Vec<u32> = runs.iter().flat_map(|r| counts(r)).collect();
    assert_eq!(all, (1..=count).collect::<Vec<_>>(), "counter across hosts");
    let ids: Vec<String> = runs.iter().flat_map(|r| between(r, "boot ", "")).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], ids[1], "the guest booted again");
    let hashes: Vec<String> = runs
        .iter()
        .flat_map(|r| between(r, "", "  /mnt/a.bin"))
        .collect();
    assert_eq!(hashes.len(), 2, "{hashes:?}");
    assert_eq!(hashes[0], hashes[1], "/a.bin read back from the disk");
    for r in runs {
        assert!(
            !r.console.contains("recovery") && !r.console.contains("EXT4-fs error"),
            "the file system was recovered or failed:\n{}",
            r.console
        );
    }
}

/// A suspend whose store goes away while the VM's state streams in
/// (an 8 Mbit/s link killed after 1.5 s): it fails, commits nothing, and
/// the guest runs on — checked by waiting for it to count to `then`.
fn failed_suspend(g: &mut RunningGuest, sess: &Path, store: &Path, then: u32) {
    let mut link = ChunkServer::start(store, &["--limit", "8Mbit"]);
    let mut child = std::process::Command::new(common::bin())
        .args(["suspend", path_str(sess), "--qmp", path_str(g.qmp_socket())])
        .args(["--store", &link.url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("roamdisk suspend");
    // The VM stops (its counter stands still) once the suspend has
    // begun: the state is then streaming into the store.
    let t0 = Instant::now();
    let mut seen = (g.output().len(), Instant::now());
    while seen.1.elapsed() < Duration::from_millis(1500) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the VM never stopped"
        );
        std::thread::sleep(Duration::from_millis(100));
        let n = g.output().len();
        if n != seen.0 {
            seen = (n, Instant::now());
        }
    }
    link.stop();
    let t0 = Instant::now();
    let mut err = String::new();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for suspend") {
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "suspend hangs with its store gone"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "failed suspend ({:.2} s after the store went): {err}",
        t0.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("nothing was committed and the VM runs on"),
        "{err}"
    );
    g.wait_output(&format!("count {then};"), GUEST_TIMEOUT);
}

/// Host A runs the guest to count `at`, suspends it to MEDIA; returns
/// A's finished run. With `fail_first`, a suspend that fails comes first
/// (at `at`; the real one then at `at + 10`).
fn run_on_a_and_suspend(
    fast: &ChunkServer,
    a: &Path,
    media: &Path,
    at: u32,
    count: u32,
    fail_first: Option<&Path>,
    session_args: &[&str],
) -> GuestRun {
    std::fs::create_dir_all(a).expect("host A");
    let sess = a.join("sess");
    open_session(&fast.url, IMAGE, &sess, session_args);
    let spec = format!(
        "cas[shared-cache={}]:{}",
        a.join("shared").display(),
        sess.display()
    );
    let srv = Server::start(a, &[&spec]);
    let mut g = guest(a, &srv.socket, false, count);
    g.wait_output(&format!("count {at};"), GUEST_TIMEOUT);
    if let Some(store) = fail_first {
        failed_suspend(&mut g, &sess, store, at + 10);
    }
    suspend(&g, &sess, media, &[]);
    let run = g.wait(Duration::from_secs(30));
    // QEMU must be gone (the VM must not run on here). Once in one CI run
    // its QMP socket closed before `quit` could be sent (not seen since):
    // its status and log are printed rather than failing the roam.
    let status = run
        .qemu_status
        .expect("QEMU on host A still runs after the suspend");
    if !status.success() {
        println!(
            "QEMU on host A ended {status} after the suspend:\n{}",
            run.qemu_text()
        );
    }
    // The suspend ended the server (its session had to be committed).
    let mut srv = srv;
    let ended = srv.ended_within(Duration::from_secs(5));
    assert!(
        ended.is_some(),
        "the server of the suspended session still runs:\n{}",
        srv.log_text()
    );
    run
}

#[test]
fn a_running_guest_roams_to_another_host_and_back_in_the_same_boot() {
    const COUNT: u32 = 240;
    let (cas, fast, _) = store_with_ext4(false);
    let dir = cas.dir();
    let slow = ChunkServer::start(&cas.store, &["--limit", "10Mbit", "--latency", "8ms"]);

    let first = run_on_a_and_suspend(
        &fast,
        &dir.join("a"),
        &dir.join("usb"),
        40,
        COUNT,
        None,
        &[],
    );

    // Host B: the store behind a 10 Mbit/s link, the resume set at hand.
    let b = dir.join("b");
    let t0 = Instant::now();
    let srv = resume(&b, &slow.url, &dir.join("usb"), &[]);
    let mut g = guest(&b, &srv.socket, true, COUNT);
    let line = restored_line(&srv);
    println!(
        "host B: running again {:.2} s after resume started: {line}",
        t0.elapsed().as_secs_f64()
    );
    assert!(line.contains("the VM is running"), "{line}");
    assert!(line.contains("lazily"), "{line}");
    let memory = memory_done_line(&srv);
    println!("host B: {memory}");
    assert!(
        memory.contains("0 B fetched"),
        "the memory came from the media: {memory}"
    );
    g.wait_output("count 120;", GUEST_TIMEOUT);
    // Back to host A: the return trip's commit goes over the fast link.
    let out = suspend(
        &g,
        &b.join("sess"),
        &dir.join("usb2"),
        &["--store", &fast.url],
    );
    assert!(out.contains("the server of the session"), "{out}");
    let second = g.wait(Duration::from_secs(30));
    assert!(second.qemu_status.is_some_and(|s| s.success()));
    drop(srv);

    let a2 = dir.join("a2");
    let srv = resume(&a2, &fast.url, &dir.join("usb2"), &[]);
    let g = guest(&a2, &srv.socket, true, COUNT);
    assert!(restored_line(&srv).contains("the VM is running"));
    let third = g.wait(GUEST_TIMEOUT);
    third.assert_ok();
    srv.stop();
    check_runs(&[&first, &second, &third], COUNT);
    check_disk(&fast.url, &a2.join("sess"), &a2, COUNT, &[]);
}

/// On an encrypted image. Also: a suspend on host A whose store goes away
/// mid-stream fails, commits nothing, and the guest runs on there; and
/// the VM's memory reaches the store and the media only encrypted.
#[test]
fn a_resumed_guest_runs_on_from_the_media_with_the_store_gone() {
    const COUNT: u32 = 80;
    let (cas, fast, key) = store_with_ext4(true);
    let key = key.expect("an encrypted image's key");
    let key_args = ["--key-file", path_str(&key)];
    let dir = cas.dir();
    let first = run_on_a_and_suspend(
        &fast,
        &dir.join("a"),
        &dir.join("usb"),
        20,
        COUNT,
        Some(&cas.store),
        &key_args,
    );

    // Host B reaches the store through its own server, which goes away
    // once resume has started: what the guest reads comes from the media.
    let mut link = ChunkServer::start(&cas.store, &["--limit", "10Mbit"]);
    let b = dir.join("b");
    let srv = resume(&b, &link.url, &dir.join("usb"), &key_args);
    link.stop();
    let g = guest(&b, &srv.socket, true, COUNT);
    let line = restored_line(&srv);
    assert!(line.contains("the VM is running"), "{line}");
    let second = g.wait(GUEST_TIMEOUT);
    second.assert_ok();
    let log = srv.log_text();
    let resumed = srv.out_text();
    srv.stop();
    assert!(!log.contains("ERROR"), "{log}");
    check_runs(&[&first, &second], COUNT);
    check_disk(&fast.url, &b.join("sess"), &b, COUNT, &key_args);

    // The VM's memory went to the store and the media encrypted like the
    // disk: the marker it held in RAM is in no object there, and is in
    // the memory image the key decrypts.
    let mut files = cas_common::store_files(&cas.store);
    files.extend(cas_common::store_files(&dir.join("usb")));
    // Both hold the 96 MiB memory image (~48 MiB compressed): the files
    // scanned are its bytes, however many packs they are in.
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    assert!(bytes > 64 << 20, "{} files of {bytes} bytes", files.len());
    for f in &files {
        let bytes = std::fs::read(f).expect("a stored object");
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "plaintext guest memory in {}",
            f.display()
        );
    }
    let version = resumed
        .split_once(&format!("resumed {IMAGE}@"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no version in resume's report:\n{resumed}"))
        .to_string();
    let mem = dir.join("memory.out");
    cas_common::rd(&[
        "resume",
        &format!("{IMAGE}@{version}"),
        "--store",
        &fast.url,
        "--session",
        path_str(&dir.join("check")),
        "--shared-cache",
        "off",
        "--memory-out",
        path_str(&mem),
        "--key-file",
        path_str(&key),
    ]);
    let plain = std::fs::read(&mem).expect("the memory image");
    assert!(
        plain.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
        "the marker is not in the decrypted memory image ({} bytes)",
        plain.len()
    );
}
