//! Two users' images derived from one golden image (ext4 populated by
//! `mke2fs -d`; NTFS by `mkntfs` + `ntfscp`): each user changes some files
//! in a session (the changed blocks written through NBD, as the guest
//! would), commits, and the store grows by about the changed data only.
//! The committed versions hold the users' files and stay consistent
//! (`e2fsck -fn`, `ntfscat`).

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;

use std::path::Path;

use cas_common::{
    checkout, commit, commit_session, open_session, rd, session_spec, store_bytes, write_diff, Cas,
};
use common::{debugfs_w, e2fsck_clean, mke2fs_from, path_str, random_file, run, Server};

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
            ntfscp(&img, &src, &format!("/app{i}.bin"));
        }
        ntfscp(&img, &content.join("docs/note1.txt"), "/note1.txt");
    }
    img
}

/// Put `src` into the file system of `img` as `/name` (replacing it).
fn put_file(fs: &str, img: &Path, src: &Path, name: &str) {
    if fs == "ext4" {
        debugfs_w(img, &format!("rm /{name}"));
        debugfs_w(img, &format!("write {} /{name}", src.display()));
    } else {
        ntfscp(img, src, &format!("/{name}"));
    }
}

/// `ntfscp -f IMG SRC DEST`: copy SRC into the NTFS image IMG as DEST.
fn ntfscp(img: &Path, src: &Path, dest: &str) {
    run("ntfscp", &["-f", path_str(img), path_str(src), dest]);
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
    // Local: measures the store's files (store_bytes).
    let cas = Cas::local();
    let (dir, s, store) = (cas.dir(), cas.s(), &cas.store);
    let gold = golden(dir, fs);
    commit(
        s,
        path_str(&gold),
        &format!("golden/{fs}"),
        &["-m", "golden"],
    );
    let mut size = store_bytes(store);
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
        let user_fs = format!("{user}/{fs}");
        open_session(s, &format!("golden/{fs}"), &sess, &["--as", &user_fs]);
        let written = {
            let srv = Server::start(dir, &[&session_spec(&sess)]);
            let n = write_diff(&srv.uri(), &gold, &img);
            srv.stop();
            n
        };
        commit_session(&sess, &["-m", &format!("{user}'s work")]);
        let now = store_bytes(store);
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
        checkout(s, &user_fs, &out, &[]);
        assert!(
            read_file(fs, &out, "work.bin") == std::fs::read(&newf).unwrap(),
            "{user}: work.bin"
        );
        if fs == "ext4" {
            e2fsck_clean(&out);
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
