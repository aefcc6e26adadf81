//! The seed's useful-update experiment (Machine Bank 5.2, Figure 9) on a
//! guest-like session: a disk with an MBR, an ext4 partition and a swap
//! partition; the "guest" zeroes its swap at boot, creates 50 MB of
//! temporary files, swaps, edits a few files and deletes the temporary
//! files — each step's changed blocks written through NBD into a `cas`
//! session. The update commit must store at most 20% of the dirty sectors
//! (the seed dropped 80-85%), with P1/P2/P3 each accounting for its share;
//! the version must be a clean ext4 holding the edits, and the session must
//! still read exactly what the guest wrote.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;

use std::path::Path;

use cas_common::{
    checkout, commit, commit_session, json_num, json_str, open_session, put_at, session_spec,
    write_diff, Cas,
};
use common::{
    assert_success, debugfs_w, e2fsck_clean, mke2fs_from, path_str, qemu_img_compare, random_file,
    run, run_stdout, Server,
};

const MIB: u64 = 1 << 20;
const P1_START: u64 = MIB;
const P1_LEN: u64 = 128 * MIB;
const P2_START: u64 = P1_START + P1_LEN;
const P2_LEN: u64 = 48 * MIB;
const DISK: u64 = 192 * MIB;

/// Rebuild the whole disk from its partition images.
fn assemble(base: &Path, p1: &Path, p2: &Path, out: &Path) {
    std::fs::copy(base, out).unwrap();
    put_at(out, p1, P1_START);
    put_at(out, p2, P2_START);
}

fn overwrite(file: &Path, offset: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(data, offset).unwrap();
}

#[test]
fn guest_session_commits_at_most_a_fifth_of_its_dirty_sectors() {
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());

    // The golden disk: MBR, ext4 with some software, swap.
    let content = dir.join("content");
    std::fs::create_dir_all(content.join("etc")).unwrap();
    for i in 0..8 {
        random_file(&content.join(format!("lib{i}.so")), MIB, 40 + i);
    }
    for i in 0..30 {
        std::fs::write(
            content.join(format!("etc/conf{i}")),
            format!("key{i} = value\n").repeat(100),
        )
        .unwrap();
    }
    let p1 = dir.join("p1.img");
    let p2 = dir.join("p2.img");
    run(
        "truncate",
        &["-s", &P1_LEN.to_string(), p1.to_str().unwrap()],
    );
    mke2fs_from(content.to_str().unwrap(), p1.to_str().unwrap());
    run(
        "truncate",
        &["-s", &P2_LEN.to_string(), p2.to_str().unwrap()],
    );
    run("mkswap", &[p2.to_str().unwrap()]);
    // Pages left in swap by an earlier run of the golden system.
    let old_pages = dir.join("old-pages");
    random_file(&old_pages, 32 * MIB, 98);
    overwrite(&p2, MIB, &std::fs::read(&old_pages).unwrap());
    let empty = dir.join("empty.img");
    run(
        "truncate",
        &["-s", &DISK.to_string(), empty.to_str().unwrap()],
    );
    let table = dir.join("table.sfdisk");
    std::fs::write(
        &table,
        format!(
            "label: dos\nstart={}, size={}, type=83\nstart={}, size={}, type=82\n",
            P1_START / 512,
            P1_LEN / 512,
            P2_START / 512,
            P2_LEN / 512
        ),
    )
    .unwrap();
    let out = std::process::Command::new("sfdisk")
        .arg(empty.to_str().unwrap())
        .stdin(std::fs::File::open(&table).unwrap())
        .output()
        .expect("run sfdisk");
    assert_success(&out, "sfdisk");
    let golden = dir.join("golden.img");
    assemble(&empty, &p1, &p2, &golden);
    commit(s, path_str(&golden), "golden/linux", &[]);
    let sess = dir.join("sess");
    open_session(s, "golden/linux", &sess, &["--as", "dave/linux"]);

    // The guest's session, step by step.
    let prev = dir.join("prev.img");
    let cur = dir.join("cur.img");
    std::fs::copy(&golden, &prev).unwrap();
    let srv = Server::start(dir, &[&session_spec(&sess)]);
    let mut written = 0u64;
    let mut step = |p1: &Path, p2: &Path| {
        assemble(&empty, p1, p2, &cur);
        written += write_diff(&srv.uri(), &prev, &cur);
        std::fs::copy(&cur, &prev).unwrap();
    };
    // Boot: the swap pages are cleared (the header page is kept).
    overwrite(&p2, 4096, &vec![0u8; (P2_LEN - 4096) as usize]);
    step(&p1, &p2);
    // 50 MB of temporary files.
    for i in 0..5 {
        let t = dir.join(format!("tmp{i}"));
        random_file(&t, 10 * MIB, 70 + i);
        debugfs_w(&p1, &format!("write {} /tmp{i}", t.display()));
    }
    step(&p1, &p2);
    // Swapping: 16 MiB of pages.
    let pages = dir.join("pages");
    random_file(&pages, 16 * MIB, 99);
    overwrite(&p2, 2 * MIB, &std::fs::read(&pages).unwrap());
    step(&p1, &p2);
    // Edit a few files.
    for i in [3, 7, 11] {
        let f = dir.join(format!("conf{i}"));
        std::fs::write(&f, format!("key{i} = edited by dave\n").repeat(2000)).unwrap();
        debugfs_w(&p1, &format!("rm /etc/conf{i}"));
        debugfs_w(&p1, &format!("write {} /etc/conf{i}", f.display()));
    }
    let doc = dir.join("report.bin");
    random_file(&doc, 256 * 1024, 5);
    debugfs_w(&p1, &format!("write {} /report.bin", doc.display()));
    step(&p1, &p2);
    // Delete the temporary files.
    for i in 0..5 {
        debugfs_w(&p1, &format!("rm /tmp{i}"));
    }
    step(&p1, &p2);
    // The session reads exactly what the guest wrote.
    qemu_img_compare(cur.to_str().unwrap(), &srv.uri());
    srv.stop();

    let out = commit_session(&sess, &["-m", "dave's session", "--json"]);
    let dirty = json_num(&out, "dirty");
    let p1z = json_num(&out, "p1_zero");
    let p2f = json_num(&out, "p2_free");
    let p3s = json_num(&out, "p3_swap");
    let kept = json_num(&out, "committed");
    println!(
        "written {} KiB; dirty {dirty} sectors; P1 -{p1z}, P2 -{p2f}, P3 -{p3s}; committed {kept} ({:.1}%)",
        written / 1024,
        kept as f64 * 100.0 / dirty as f64
    );
    assert_eq!(dirty, p1z + p2f + p3s + kept);
    assert!(
        kept * 5 <= dirty,
        "committed {kept} of {dirty} dirty sectors: more than 20%"
    );
    assert!(
        p2f * 512 >= 45 * MIB,
        "P2 must drop the deleted temporary files ({p2f} sectors)"
    );
    assert!(
        p3s * 512 >= 15 * MIB,
        "P3 must drop the swapped pages ({p3s} sectors)"
    );
    assert!(
        p1z * 512 >= 15 * MIB,
        "P1 must take the cleared swap pages not reused ({p1z} sectors)"
    );

    // The version: a clean ext4 with the edits, the swap header intact.
    let v = json_str(&out, "version");
    let got = dir.join("dave.img");
    checkout(s, &format!("dave/linux@{}", &v[..12]), &got, &[]);
    let bytes = std::fs::read(&got).unwrap();
    let gp1 = dir.join("got-p1.img");
    std::fs::write(
        &gp1,
        &bytes[P1_START as usize..(P1_START + P1_LEN) as usize],
    )
    .unwrap();
    e2fsck_clean(&gp1);
    let conf = run_stdout("debugfs", &["-R", "cat /etc/conf7", gp1.to_str().unwrap()]);
    assert!(
        conf.starts_with("key7 = edited by dave"),
        "{}",
        &conf[..conf.len().min(80)]
    );
    let rep = common::run("debugfs", &["-R", "cat /report.bin", gp1.to_str().unwrap()]).stdout;
    assert!(rep == std::fs::read(&doc).unwrap(), "report.bin");
    let gold = std::fs::read(&golden).unwrap();
    let h = P2_START as usize..P2_START as usize + 4096;
    assert!(bytes[h.clone()] == gold[h], "swap header kept");
}
