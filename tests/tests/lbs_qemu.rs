//! qemu's tools use an LBS disk end to end over NBD: a populated ext4
//! image goes in with `qemu-img convert` and comes back out identical and
//! `e2fsck`-clean; a pattern-writing client with periodic flushes is cut by
//! `kill -9` of the server, and after reopening every block written before
//! the last acknowledged flush holds its pattern.

mod common;

use common::{
    mke2fs_from, qemu_img_compare, qemu_img_copy, qemu_img_copy_into, rd, roamdisk, run,
    run_stdout, tempdir, Server,
};
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;

fn create_lbs(dir: &std::path::Path, name: &str, size: &str, extra: &[&str]) -> String {
    let img = dir.join(name);
    let img = img.to_str().unwrap().to_string();
    let mut args = vec!["lbs", "create", &img, "--size", size];
    args.extend_from_slice(extra);
    rd(&args);
    img
}

/// A new temporary folder with a new LBS disk NAME of SIZE served as
/// `lbs:DISK`: (folder, disk, spec, server).
fn serve_new_lbs(name: &str, size: &str) -> (TempDir, String, String, Server) {
    let d = tempdir();
    let img = create_lbs(d.path(), name, size, &[]);
    let spec = format!("lbs:{img}");
    let s = Server::start(d.path(), &[&spec]);
    (d, img, spec, s)
}

/// SPEC served again, read-only, after a crash (its recovery): the
/// export's bytes, through a copy in DIR.
fn bytes_after_reopen(dir: &Path, spec: &str) -> Vec<u8> {
    let s = Server::start(dir, &[spec, "--read-only"]);
    export_bytes(&s.uri(), &dir.join("after.img"))
}

/// Copy a served export into a raw file with `qemu-img convert`.
fn export_to(uri: &str, dest: &std::path::Path) {
    qemu_img_copy(uri, dest.to_str().unwrap());
}

/// The bytes of a served export, through `qemu-img convert` into `dest`.
fn export_bytes(uri: &str, dest: &std::path::Path) -> Vec<u8> {
    export_to(uri, dest);
    std::fs::read(dest).unwrap()
}

#[test]
fn ext4_image_round_trips_through_lbs_and_stays_clean() {
    let d = tempdir();
    let dir = d.path();
    // A populated ext4 image made by mke2fs -d.
    let content = dir.join("content");
    std::fs::create_dir_all(content.join("etc")).unwrap();
    std::fs::create_dir_all(content.join("home/user")).unwrap();
    for i in 0..200 {
        std::fs::write(
            content.join(format!("home/user/file{i}.txt")),
            format!("file {i}\n").repeat(200 + i * 7),
        )
        .unwrap();
    }
    common::random_file(&content.join("home/user/blob.bin"), 20 << 20, 7);
    let ext4 = dir.join("golden.img");
    run("truncate", &["-s", "128M", ext4.to_str().unwrap()]);
    mke2fs_from(content.to_str().unwrap(), ext4.to_str().unwrap());

    let key = dir.join("vm.key");
    let img = create_lbs(
        dir,
        "vm.lbsd",
        "128M",
        &[
            "--encrypt",
            "--key-file",
            key.to_str().unwrap(),
            "--checksum",
            "blake3",
        ],
    );
    let spec = format!("lbs[key-file={}]:{img}", key.display());
    {
        let s = Server::start(dir, &[&spec]);
        qemu_img_copy_into(ext4.to_str().unwrap(), &s.uri());
        assert!(s.stop().success());
    }
    let back = dir.join("back.img");
    {
        let s = Server::start(dir, &[&spec, "--read-only"]);
        export_to(&s.uri(), &back);
        qemu_img_compare(ext4.to_str().unwrap(), back.to_str().unwrap());
    }
    run("e2fsck", &["-fn", back.to_str().unwrap()]);
    // The CLI's own check verifies every block.
    let out = roamdisk(&["lbs", "check", &img, "--key-file", key.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the data file holds no plaintext of the file system's text files.
    let raw = std::fs::read(dir.join("vm.lbsd")).unwrap();
    assert!(
        !raw.windows(12).any(|w| w == b"file 17\nfile"),
        "plaintext in the encrypted data file"
    );
}

const PY: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
bs = 65536
n = h.get_size() // bs
i = 0
while True:
    blk = (i * 7919) % n
    h.pwrite(bytes([(i % 250) + 1]) * bs, blk * bs)
    i += 1
    if i % 8 == 0:
        h.flush()
        print("FLUSHED", i, flush=True)
"#;

#[test]
fn kill_9_loses_nothing_acknowledged_by_a_flush() {
    let (d, img, spec, s) = serve_new_lbs("k.lbsd", "64M");
    let dir = d.path();
    let child = common::python_nbd(PY, &[&s.uri()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run python3 with libnbd");
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("FLUSHED "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .max()
        .expect("the client acknowledged at least one flush before the kill");
    assert!(
        last >= 16,
        "too few writes before the kill ({last}); the machine is very slow"
    );

    // Reopen (recovery) and check every write up to the last flush.
    let bytes = bytes_after_reopen(dir, &spec);
    let n = (64u64 << 20) / 65536;
    // Each block must hold the pattern of its last write before the last
    // acknowledged flush, or of a write issued after it (at most the 8
    // writes before the next flush), or zeroes if never written.
    let mut allowed: std::collections::HashMap<u64, Vec<u8>> = std::collections::HashMap::new();
    for i in 0..last {
        allowed.insert((i * 7919) % n, vec![((i % 250) + 1) as u8]);
    }
    for i in last..last + 9 {
        allowed
            .entry((i * 7919) % n)
            .or_insert_with(|| vec![0])
            .push(((i % 250) + 1) as u8);
    }
    for blk in 0..n {
        let b = &bytes[(blk * 65536) as usize..((blk + 1) * 65536) as usize];
        let first = b[0];
        assert!(
            b.iter().all(|&x| x == first),
            "block {blk} is torn or garbage after recovery"
        );
        let ok = allowed.get(&blk).map_or(first == 0, |a| a.contains(&first));
        assert!(
            ok,
            "block {blk} holds {first}, allowed {:?} (last acknowledged flush after write {last})",
            allowed.get(&blk)
        );
    }
    let info = run_stdout(&common::bin().to_string_lossy(), &["lbs", "info", &img]);
    assert!(info.contains("mapped:"), "{info}");
}

/// Writes a client never flushed are still there after it disconnects and
/// the server is then killed with SIGKILL: a disconnect settles the export
/// (for LBS, its write buffer is flushed) before the connection closes.
#[test]
fn writes_settled_at_disconnect_survive_kill_9() {
    let (d, _img, spec, s) = serve_new_lbs("s.lbsd", "16M");
    // 40 writes of 4 KiB: 160 KiB, less than LBS's 256 KiB write buffer, so
    // without the settle they would live only in the server's memory.
    let script = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(40):
    h.pwrite(bytes([i + 1]) * 4096, i * 65536)
h.shutdown()
print("done")
"#;
    let out = common::python_nbd(script, &[&s.uri()])
        .output()
        .expect("run the writer");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("done"),
        "writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.kill9();
    let bytes = bytes_after_reopen(d.path(), &spec);
    for i in 0..40usize {
        let b = &bytes[i * 65536..i * 65536 + 4096];
        assert!(
            b.iter().all(|&x| x == (i + 1) as u8),
            "write {i} was lost or torn after the disconnect and kill -9"
        );
    }
}
