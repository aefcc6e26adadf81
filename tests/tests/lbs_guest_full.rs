//! LBS on a full disk (issue 15), with a real guest: qemu (TCG) boots a
//! Debian kernel whose disk is `roamdisk serve lbs:IMAGE` (64 MiB logical,
//! 12% spare), with discards passed through (`discard=unmap`). The guest
//! makes ext4 on it and fills it until ENOSPC with 96 KiB files (24 blocks,
//! so LBS's 256 KiB clusters hold pieces of several files), deletes every
//! other file, runs `fstrim`, and does it again: the image is rewritten
//! several times over while nearly full, so the collector works on a full
//! image. The last round's files are hashed in the guest, then the older
//! files go and a last `fstrim` runs.
//!
//! On the host: the image read back through `roamdisk serve` must be a
//! clean ext4 (`e2fsck -fn`) whose last-round files have the guest's
//! hashes; `roamdisk lbs check` verifies every block; the server's LBS
//! counters show the collector moved blocks; and the trims reached LBS:
//! it maps no more blocks than ext4 uses, although every block of the disk
//! was written.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod common;
mod guest_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{e2fsck_clean, path_str, qemu_img_copy, roamdisk, run, run_stdout, tempdir, Server};
use guest_common::{Guest, GuestRun};

const MIB: u64 = 1 << 20;
const DISK_SIZE: u64 = 64 * MIB;
const BLOCK: u64 = 4096;
const GUEST_TIMEOUT: Duration = Duration::from_secs(240);

/// The guest's work. `fill R` writes 96 KiB files `/mnt/rR.N` of random
/// bytes until the file system is full (the last one may be cut short);
/// `thin` deletes every other file on the disk. Output lines: `FULL R
/// FILES USED_KIB AVAIL_KIB` after each fill, busybox's `/mnt: N bytes
/// trimmed` after each fstrim, md5sum's `HASH  /mnt/r4.N`, `DF USED_KIB`.
const GUEST_SCRIPT: &str = r#"
mke2fs -q -F -t ext4 -b 4096 -L full /dev/vda
mount -t ext4 /dev/vda /mnt
fill() {
  i=0
  while dd if=/dev/urandom of=/mnt/r$1.$i bs=32k count=3 2>/dev/null; do
    i=$((i + 1))
  done
  sync
  set -- $1 $i $(df -k /mnt | tail -n 1)
  echo "FULL $1 $2 $5 $6"
}
thin() {
  n=0
  for f in /mnt/r*; do
    n=$((n + 1))
    if [ $((n % 2)) -eq 0 ]; then rm "$f"; fi
  done
  sync
}
for r in 1 2 3; do
  fill $r
  thin
  fstrim -v /mnt
done
fill 4
md5sum /mnt/r4.*
rm -f /mnt/r1.* /mnt/r2.* /mnt/r3.*
sync
fstrim -v /mnt
set -- $(df -k /mnt | tail -n 1)
echo "DF $3"
umount /mnt
"#;

/// The JSON counters `roamdisk serve` logs for its LBS image as it stops.
fn lbs_counters(log: &str) -> serde_json::Value {
    let line = log
        .lines()
        .find_map(|l| l.split_once("roamdisk: lbs counters of (default): "))
        .map(|(_, json)| json)
        .unwrap_or_else(|| panic!("no LBS counters in the server's log:\n{log}"));
    serde_json::from_str(line).expect("the counters are JSON")
}

fn counter(c: &serde_json::Value, name: &str) -> u64 {
    c[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {c}"))
}

/// `roamdisk lbs info IMAGE --json`.
fn lbs_info(img: &str) -> serde_json::Value {
    let out = roamdisk(&["lbs", "info", img, "--json"]);
    common::assert_success(&out, "roamdisk lbs info");
    serde_json::from_slice(&out.stdout).expect("lbs info --json is JSON")
}

/// The `FULL` lines: (round, files, used KiB, available KiB).
fn fills(run: &GuestRun) -> Vec<(u32, u64, u64, u64)> {
    run.lines()
        .into_iter()
        .filter_map(|l| l.strip_prefix("FULL "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .map(|w| w.parse().expect("a number"))
                .collect();
            (v[0] as u32, v[1], v[2], v[3])
        })
        .collect()
}

/// Bytes each `fstrim -v` said it trimmed.
fn trims(run: &GuestRun) -> Vec<u64> {
    run.lines()
        .into_iter()
        .filter_map(|l| l.strip_prefix("/mnt: "))
        .filter_map(|l| l.strip_suffix(" bytes trimmed"))
        .map(|n| n.trim().parse().expect("a byte count"))
        .collect()
}

/// md5sum's lines: path in the file system (`/r4.N`) -> hash.
fn guest_md5s(run: &GuestRun) -> BTreeMap<String, String> {
    run.lines()
        .into_iter()
        .filter_map(|l| {
            let (hash, path) = l.split_once("  ")?;
            let name = path.strip_prefix("/mnt")?;
            (hash.len() == 32).then(|| (name.to_string(), hash.to_string()))
        })
        .collect()
}

/// Dump every file of FILES from the ext4 IMAGE into DIR with one debugfs
/// run and check each one's md5 against the guest's.
fn assert_files_read_back(image: &Path, dir: &Path, files: &BTreeMap<String, String>) {
    std::fs::create_dir_all(dir).unwrap();
    let cmds: String = files
        .keys()
        .map(|f| format!("dump {f} {}/{}\n", dir.display(), &f[1..]))
        .collect();
    let cmd_file = dir.join("debugfs.cmds");
    std::fs::write(&cmd_file, cmds).unwrap();
    run("debugfs", &["-f", path_str(&cmd_file), path_str(image)]);
    for (f, want) in files {
        let got = run_stdout("md5sum", &[path_str(&dir.join(&f[1..]))]);
        let got = got.split_whitespace().next().expect("an md5");
        assert_eq!(
            got, want,
            "{f}: the host reads other bytes than the guest wrote"
        );
    }
}

#[test]
fn a_guest_fills_discards_and_rewrites_ext4_on_lbs_and_it_stays_clean() {
    let d = tempdir();
    let dir = d.path();
    let img = dir.join("full.lbsd");
    let img = path_str(&img);
    let out = roamdisk(&[
        "lbs",
        "create",
        img,
        "--size",
        "64M",
        "--overprovision",
        "112",
    ]);
    common::assert_success(&out, "roamdisk lbs create");
    let clusters = counter(&lbs_info(img), "clusters");

    let t0 = Instant::now();
    let spec = format!("lbs:{img}");
    let srv = Server::start(dir, &[&spec]);
    let run = Guest::new(dir)
        .nbd_disk(&srv.socket, "")
        .discard()
        .run(GUEST_SCRIPT, GUEST_TIMEOUT);
    run.assert_ok();
    let guest_time = run.elapsed;
    let st = srv.stop();
    let log = std::fs::read_to_string(dir.join("nbd.sock.log")).unwrap_or_default();
    assert!(st.success(), "roamdisk serve exited with {st}:\n{log}");
    let c = lbs_counters(&log);
    println!("guest run {guest_time:?}; LBS counters: {c}");
    for l in run.lines() {
        if !l.contains("  /mnt/") {
            println!("guest: {l}");
        }
    }

    // Every round filled the file system.
    let fills = fills(&run);
    assert_eq!(
        fills.iter().map(|f| f.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4],
        "{}",
        run.console
    );
    for &(r, files, used, avail) in &fills {
        assert!(
            files > 0 && avail * 50 < used,
            "round {r} did not fill the file system: {files} files, {used} KiB used, {avail} KiB left"
        );
    }
    // Each fstrim trimmed something (the freed half at least).
    let trims = trims(&run);
    assert_eq!(trims.len(), 4, "{}", run.console);
    assert!(trims.iter().all(|&t| t > 4 * MIB), "fstrim: {trims:?}");

    // The collector ran on the full image and moved live blocks; clients
    // wrote more than the data file holds, so clusters were reused.
    let client = counter(&c, "client_blocks");
    let physical = counter(&c, "physical_blocks");
    let moved = counter(&c, "gc_moved");
    assert!(
        counter(&c, "gc_clusters") > 0,
        "the collector never ran: {c}"
    );
    assert!(moved > 0, "the collector moved nothing: {c}");
    let data_blocks = clusters * 256 * 1024 / BLOCK;
    assert!(
        client > data_blocks,
        "clients wrote {client} blocks, less than the {data_blocks} of the data file: {c}"
    );
    assert!(physical >= client + moved - counter(&c, "absorbed"), "{c}");
    assert_eq!(counter(&c, "integrity_errors"), 0, "{c}");

    // From the host: a clean ext4 with the last round's files intact.
    let srv = Server::start(dir, &[&spec, "--read-only"]);
    let raw = dir.join("back.raw");
    qemu_img_copy(&srv.uri(), path_str(&raw));
    assert!(srv.stop().success());
    e2fsck_clean(&raw);
    // The trims reached LBS: it maps no more blocks than ext4 uses (data
    // and metadata, with a little slack), though every block of the disk
    // was written.
    let sb = run_stdout("dumpe2fs", &["-h", path_str(&raw)]);
    let field = |name: &str| -> u64 {
        sb.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in dumpe2fs -h:\n{sb}"))
    };
    let ext4_used = field("Block count:") - field("Free blocks:");
    let df_used = run.value("DF ").trim().parse::<u64>().expect("KiB") * 1024 / BLOCK;
    let mapped = counter(&lbs_info(img), "mapped_blocks");
    assert_eq!(
        mapped,
        counter(&c, "mapped_blocks"),
        "lbs info vs the server"
    );
    let logical_blocks = DISK_SIZE / BLOCK;
    println!("LBS maps {mapped} blocks; ext4 uses {ext4_used} ({df_used} for files, as df counts)");
    assert!(
        mapped <= ext4_used + 64,
        "LBS maps {mapped} blocks, ext4 uses {ext4_used}: the trims did not all reach it"
    );
    assert!(
        mapped < logical_blocks * 3 / 4,
        "{mapped} of {logical_blocks}"
    );
    let md5s = guest_md5s(&run);
    let last_round = fills.last().unwrap().1;
    assert!(
        md5s.len() as u64 >= last_round,
        "{} hashes for {last_round} files",
        md5s.len()
    );
    assert_files_read_back(&raw, &dir.join("files"), &md5s);
    let ls = run_stdout("debugfs", &["-R", "ls -p /", path_str(&raw)]);
    assert!(!ls.contains("/r1."), "round 1's files were deleted:\n{ls}");
    let out = roamdisk(&["lbs", "check", img]);
    common::assert_success(&out, "roamdisk lbs check");
    println!(
        "{} files checked; whole test {:?}",
        md5s.len(),
        t0.elapsed()
    );
}
