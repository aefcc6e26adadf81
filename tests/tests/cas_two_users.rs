//! Two users' images derived from one golden image (ext4 populated by
//! `mke2fs -d`; NTFS by `mkntfs` + `ntfscp`): each user changes some files
//! in a session (the changed blocks written through NBD, as the guest
//! would), commits, and the store grows by about the changed data only.
//! The committed versions hold the users' files and stay consistent
//! (`e2fsck -fn`, `ntfscat`).

mod cas_common;
mod common;

use std::path::Path;

use cas_common::{init_store, rd, store_bytes, write_diff};
use common::{mke2fs_from, random_file, run, run_stdout, tempdir, Server};

const MIB: u64 = 1 << 20;

fn golden(dir: &Path, fs: &str) -> std::path::PathBuf {
    let img = dir.join(format!("golden-{fs}.img"));
    run("truncate", &["-s", "96M", img.to_str().unwrap()]);
    let content = dir.join("content");
    std::fs::create_dir_all(content.join("docs")).unwrap();
    for i in 0..6 {
        random_file(&content.join(format!("app{i}.bin")), 2 * MIB, 100 + i);
    }
    for i in 0..40 {
        std::fs::write(
            content.join(format!("docs/note{i}.txt")),
            format!("note {i}\n").repeat(300 + i as usize * 13),
        )
        .unwrap();
    }
    if fs == "ext4" {
        mke2fs_from(content.to_str().unwrap(), img.to_str().unwrap());
    } else {
        run("mkntfs", &["-F", "-Q", "-q", img.to_str().unwrap()]);
        for i in 0..6 {
            let src = content.join(format!("app{i}.bin"));
            run(
                "ntfscp",
                &[
                    "-f",
                    img.to_str().unwrap(),
                    src.to_str().unwrap(),
                    &format!("/app{i}.bin"),
                ],
            );
        }
        let src = content.join("docs/note1.txt");
        run(
            "ntfscp",
            &[
                "-f",
                img.to_str().unwrap(),
                src.to_str().unwrap(),
                "/note1.txt",
            ],
        );
    }
    img
}

/// Put `src` into the file system of `img` as `/name` (replacing it).
fn put_file(fs: &str, img: &Path, src: &Path, name: &str) {
    if fs == "ext4" {
        let _ = run_stdout(
            "debugfs",
            &["-w", "-R", &format!("rm /{name}"), img.to_str().unwrap()],
        );
        run(
            "debugfs",
            &[
                "-w",
                "-R",
                &format!("write {} /{name}", src.display()),
                img.to_str().unwrap(),
            ],
        );
    } else {
        run(
            "ntfscp",
            &[
                "-f",
                img.to_str().unwrap(),
                src.to_str().unwrap(),
                &format!("/{name}"),
            ],
        );
    }
}

fn read_file(fs: &str, img: &Path, name: &str) -> Vec<u8> {
    if fs == "ext4" {
        common::run(
            "debugfs",
            &["-R", &format!("cat /{name}"), img.to_str().unwrap()],
        )
        .stdout
    } else {
        common::run("ntfscat", &[img.to_str().unwrap(), &format!("/{name}")]).stdout
    }
}

fn two_users(fs: &str) {
    let d = tempdir();
    let dir = d.path();
    let store = init_store(dir);
    let s = store.to_str().unwrap();
    let gold = golden(dir, fs);
    rd(&[
        "commit",
        gold.to_str().unwrap(),
        "--to",
        &format!("golden/{fs}"),
        "-m",
        "golden",
        "--store",
        s,
    ]);
    let mut size = store_bytes(&store);
    println!("{fs}: golden committed, store {} KiB", size / 1024);
    for (user, new_mib, seed) in [("alice", 3u64, 1u64), ("bob", 5, 2)] {
        // The guest's view of the disk after the user's work.
        let img = dir.join(format!("{user}-{fs}.img"));
        std::fs::copy(&gold, &img).unwrap();
        let newf = dir.join(format!("{user}.bin"));
        random_file(&newf, new_mib * MIB, 900 + seed);
        put_file(fs, &img, &newf, "work.bin");
        let note = dir.join(format!("{user}.txt"));
        std::fs::write(&note, format!("{user} was here\n").repeat(500)).unwrap();
        put_file(
            fs,
            &img,
            &note,
            if fs == "ext4" {
                "docs/note3.txt"
            } else {
                "note1.txt"
            },
        );
        let sess = dir.join(format!("sess-{user}"));
        rd(&[
            "checkout",
            &format!("golden/{fs}"),
            "--store",
            s,
            "--session",
            sess.to_str().unwrap(),
            "--as",
            &format!("{user}/{fs}"),
        ]);
        let written = {
            let srv = Server::start(dir, &[&format!("cas:{}", sess.display())]);
            let n = write_diff(&srv.uri(), &gold, &img);
            srv.stop();
            n
        };
        rd(&[
            "commit",
            &format!("cas:{}", sess.display()),
            "-m",
            &format!("{user}'s work"),
        ]);
        let now = store_bytes(&store);
        let grew = now - size;
        println!(
            "{fs}: {user} wrote {} KiB ({new_mib} MiB new file), store grew {} KiB to {} KiB",
            written / 1024,
            grew / 1024,
            now / 1024
        );
        assert!(
            grew >= new_mib * MIB * 9 / 10,
            "{user}: the new file must be stored ({grew} bytes)"
        );
        assert!(
            grew <= written + written / 8 + 256 * 1024,
            "{user}: store grew {grew} bytes for {written} changed bytes"
        );
        size = now;
        // The version holds the user's files and a consistent file system.
        let out = dir.join(format!("{user}-out-{fs}.img"));
        rd(&[
            "checkout",
            &format!("{user}/{fs}"),
            "--store",
            s,
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(
            read_file(fs, &out, "work.bin") == std::fs::read(&newf).unwrap(),
            "{user}: work.bin"
        );
        if fs == "ext4" {
            run("e2fsck", &["-fn", out.to_str().unwrap()]);
        }
    }
    let info = rd(&["store", "info", "--store", s]);
    assert!(
        info.contains("alice") && info.contains("bob") && info.contains("golden"),
        "{info}"
    );
    println!("{info}");
}

#[test]
fn two_users_from_an_ext4_golden_image() {
    two_users("ext4");
}

#[test]
fn two_users_from_an_ntfs_golden_image() {
    two_users("ntfs");
}
