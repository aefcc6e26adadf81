//! Random data written over the whole borrowed disk through NBD lands only
//! in the host's free blocks, encrypted, and leaves everything else as it
//! was: no byte outside the plan changes (the whole host images are
//! compared), `e2fsck -fn` passes on every ext partition, every host
//! file's content is unchanged, swap headers are intact, NTFS volumes
//! change only inside clusters their `$Bitmap` marks free, skipped
//! partitions are untouched; and the guest reads back what it wrote.

mod borrow_common;
mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use borrow_common::*;
use common::{e2fsck_clean, run, run_stdout, Server};

/// Compare `[off, off + len)` of two files; returns the offsets (relative
/// to `off`) of 4 KiB blocks that differ.
fn differing_blocks(a: &Path, b: &Path, off: u64, len: u64) -> Vec<u64> {
    let (fa, fb) = (
        std::fs::File::open(a).expect("a"),
        std::fs::File::open(b).expect("b"),
    );
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(ba.len() as u64) as usize;
        fa.read_exact_at(&mut ba[..n], off + pos).expect("read a");
        fb.read_exact_at(&mut bb[..n], off + pos).expect("read b");
        if ba[..n] != bb[..n] {
            for (i, (x, y)) in ba[..n].chunks(4096).zip(bb[..n].chunks(4096)).enumerate() {
                if x != y {
                    out.push(pos + i as u64 * 4096);
                }
            }
        }
        pos += n as u64;
    }
    out
}

fn read_at(p: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    std::fs::File::open(p)
        .expect("open")
        .read_exact_at(&mut v, off)
        .expect("read");
    v
}

#[test]
fn random_writes_over_the_whole_borrowed_disk_leave_the_host_intact() {
    for t in [
        "nbdcopy", "nbdinfo", "e2fsck", "ntfscat", "ntfsinfo", "debugfs",
    ] {
        common::require_tool(t);
    }
    let tmp = common::tempdir();
    let dir = tmp.path();
    let c = corpus(&dir.join("corpus"));
    let disks = ["gpt", "mbr"];
    let orig: BTreeMap<&str, PathBuf> = disks
        .iter()
        .map(|d| {
            let o = dir.join(format!("{d}.orig"));
            copy_sparse(&c.disk(d), &o);
            (*d, o)
        })
        .collect();
    let plan = dir.join("plan.json");
    // Every free extent of at least 4 KiB: the most fragmented plan.
    c.scan_all(&plan);
    let extents = plan_extents(&plan);
    let total: u64 = extents.iter().map(|e| e.2).sum();
    assert!(
        extents.len() > 100,
        "a fragmented plan ({} extents)",
        extents.len()
    );
    assert!(
        total > 150 << 20,
        "most free space is borrowed ({total} bytes)"
    );

    // Fill the whole borrowed disk with random data and read it back.
    let data = dir.join("random.bin");
    common::random_file(&data, total, 42);
    let server = Server::start(dir, &[&format!("borrow:{}", plan.display())]);
    let size: u64 = run_stdout("nbdinfo", &["--size", &server.uri()])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(size, total);
    run("nbdcopy", &[data.to_str().unwrap(), &server.uri()]);
    let back = dir.join("back.bin");
    run("nbdcopy", &[&server.uri(), back.to_str().unwrap()]);
    assert!(server.stop().success());
    common::assert_files_equal(&data, &back);

    // 1. No byte outside the plan changed; every block inside it did, and
    //    holds ciphertext, not the guest's plaintext.
    let mut logical = 0;
    let mut ranges: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for (dev, off, len) in &extents {
        ranges
            .entry(dev.clone())
            .or_default()
            .push((*off, *len, logical));
        logical += len;
    }
    for d in disks {
        let now = c.disk(d);
        let key = now.to_str().unwrap().to_string();
        let mut r = ranges.get(&key).cloned().unwrap_or_default();
        r.sort_unstable();
        let size = std::fs::metadata(&now).unwrap().len();
        let mut pos = 0;
        for &(off, len, log) in &r {
            let diff = differing_blocks(&orig[d], &now, pos, off - pos);
            assert!(
                diff.is_empty(),
                "{d}: bytes changed outside the plan at {:?}",
                &diff[..diff.len().min(4)]
                    .iter()
                    .map(|b| pos + b)
                    .collect::<Vec<_>>()
            );
            let same = len / 4096 - differing_blocks(&orig[d], &now, off, len).len() as u64;
            assert_eq!(
                same, 0,
                "{d}: {same} borrowed 4 KiB blocks at {off}+{len} were not written"
            );
            for k in (0..len).step_by(256 << 10) {
                let host = read_at(&now, off + k, 4096);
                let plain = read_at(&data, log + k, 4096);
                assert_ne!(
                    host,
                    plain,
                    "{d}: plaintext found on the host at {}",
                    off + k
                );
            }
            pos = off + len;
        }
        let diff = differing_blocks(&orig[d], &now, pos, size - pos);
        assert!(diff.is_empty(), "{d}: bytes changed after the last extent");
    }

    // 2. Per partition: fsck, files, swap headers, NTFS free clusters,
    //    skipped partitions untouched.
    for d in disks {
        let lay = layout(&c.disk(d));
        for row in c.rows.iter().filter(|r| r.disk == d) {
            let (start, len) = lay[&row.part];
            let now = dir.join(format!("{d}-{}.now", row.part));
            let was = dir.join(format!("{d}-{}.was", row.part));
            extract(&c.disk(d), start, len, &now);
            extract(&orig[d], start, len, &was);
            let changed = differing_blocks(&was, &now, 0, len);
            if !row.used {
                assert!(
                    changed.is_empty(),
                    "{}: skipped ({}) but {} blocks changed",
                    row.name,
                    row.reason,
                    changed.len()
                );
            }
            match row.fs.as_str() {
                "ext2" | "ext3" | "ext4" if row.used => {
                    // After borrowing: the file system is still clean.
                    e2fsck_clean(&now);
                    assert!(
                        !changed.is_empty(),
                        "{}: borrowed but not written",
                        row.name
                    );
                }
                "ntfs" => {
                    let (free, free_count, cs) = ntfs_tool_view(&was);
                    for b in &changed {
                        let inside = free.iter().any(|&(s, l)| *b >= s && b + 4096 <= s + l);
                        assert!(inside, "{}: block at {b} changed but is not in a free cluster (cluster size {cs})", row.name);
                    }
                    let (_, free_after, _) = ntfs_tool_view(&now);
                    assert_eq!(
                        free_after, free_count,
                        "{}: ntfsinfo's free count changed",
                        row.name
                    );
                }
                "swap" => {
                    assert_eq!(
                        read_at(&was, 0, 4096),
                        read_at(&now, 0, 4096),
                        "{}: swap header",
                        row.name
                    );
                    if row.used {
                        assert!(!changed.is_empty() && !changed.contains(&0), "{}", row.name);
                    }
                }
                _ => {}
            }
            // Every host file is unchanged.
            for f in c.files.iter().filter(|f| f.disk == d && f.part == row.part) {
                let want = std::fs::read(&f.source).unwrap();
                let got = if f.fs == "ext" {
                    let out = dir.join("dumped");
                    let _ = std::fs::remove_file(&out);
                    run(
                        "debugfs",
                        &[
                            "-R",
                            &format!("dump {} {}", f.path, out.display()),
                            now.to_str().unwrap(),
                        ],
                    );
                    std::fs::read(&out).unwrap_or_default()
                } else {
                    run("ntfscat", &["-f", now.to_str().unwrap(), &f.path]).stdout
                };
                assert!(
                    got == want,
                    "{}: host file {} changed ({} bytes, want {})",
                    row.name,
                    f.path,
                    got.len(),
                    want.len()
                );
            }
            std::fs::remove_file(&now).unwrap();
            std::fs::remove_file(&was).unwrap();
        }
    }
}
