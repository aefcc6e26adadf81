//! The HTTP chunk server end to end: `roamdisk store serve` on a loopback
//! port; an initial commit of a qcow2 image, a session served over NBD and
//! its update commit, a checkout, log, gc and store info all go through
//! the server; a chunk damaged on the server is refused by name.

mod cas_common;
mod common;

use cas_common::{
    checkout, checkout_fail, commit_session, commit_version, json_str, object_file, open_session,
    qemu_io_session, rd, Cas, ChunkServer,
};
use common::{path_str, qemu_img_compare, qemu_img_convert, qemu_io};

#[test]
fn commit_session_checkout_and_gc_through_the_chunk_server() {
    // Local: damages a chunk file of the store (cas_s3 serves S3).
    let cas = Cas::local_with(&["--hash", "sha256"]);
    let dir = cas.dir();
    let srv = ChunkServer::start(cas.s(), &[]);
    let url = srv.url.clone();
    let raw = cas.random_file("disk.raw", 12 << 20, 21);
    qemu_io(path_str(&raw), &["write -z 4M 2M".into()]);
    let qcow = dir.join("disk.qcow2");
    qemu_img_convert(path_str(&raw), "qcow2", path_str(&qcow));
    let v1 = commit_version(&url, path_str(&qcow), "erin/vm", &[]);
    // A session over HTTP, served over NBD, written by qemu-io.
    let sess = dir.join("sess");
    open_session(&url, "erin/vm", &sess, &[]);
    let cmds = vec![
        "write -P 7 1M 200k".to_string(),
        "write -P 9 10M 64k".to_string(),
    ];
    qemu_io_session(dir, &sess, &cmds);
    qemu_io(path_str(&raw), &cmds);
    let out = commit_session(&sess, &["-m", "edit", "--json"]);
    let v2 = json_str(&out, "version");
    let got = dir.join("got.raw");
    checkout(&url, &format!("erin/vm@{}", &v2[..8]), &got, &[]);
    qemu_img_compare(path_str(&raw), path_str(&got));
    let log = rd(&["log", "erin/vm", "--store", &url]);
    assert!(log.contains(&v1[..12]) && log.contains(&v2[..12]), "{log}");
    let r = rd(&["gc", "--store", &url, "--json"]);
    assert!(r.contains("\"removed_objects\": 0"), "{r}");
    let info = rd(&["store", "info", "--store", &url]);
    assert!(info.contains("sha256") && info.contains("erin"), "{info}");
    // A chunk damaged on the server: the checkout names it.
    let pkg = std::fs::read(object_file(&cas.store, &v1)).unwrap();
    assert!(pkg.len() > 16);
    // (The commit's chunks went up in batch puts, which the local store
    // behind the server writes as packs.)
    let victim = cas_common::packed_objects(&cas.store)
        .into_iter()
        .find(|o| o.len > 60000)
        .expect("a whole chunk in a pack");
    let id = victim.id.clone();
    let mut b = std::fs::read(&victim.pack).unwrap();
    b[(victim.offset + victim.len) as usize - 7] ^= 1;
    std::fs::write(&victim.pack, b).unwrap();
    let e = checkout_fail(&url, "erin/vm", &dir.join("x.raw"), &[]);
    assert!(e.contains(&id) && e.contains("corrupt"), "{e}");
}
