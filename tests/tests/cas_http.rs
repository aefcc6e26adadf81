//! The HTTP chunk server end to end: `roamdisk store serve` on a loopback
//! port; an initial commit of a qcow2 image, a session served over NBD and
//! its update commit, a checkout, log, gc and store info all go through
//! the server; a chunk damaged on the server is refused by name.

mod cas_common;
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use cas_common::{json_str, object_file, rd, rd_fail};
use common::{bin, qemu_img_compare, qemu_img_convert, qemu_io, random_file, tempdir, Server};

struct ChunkServer(Child);

impl Drop for ChunkServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &std::path::Path) -> (ChunkServer, String) {
    let mut child = Command::new(bin())
        .args([
            "store",
            "serve",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn store serve");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in: {line}"))
        .to_string();
    (ChunkServer(child), url)
}

#[test]
fn commit_session_checkout_and_gc_through_the_chunk_server() {
    let d = tempdir();
    let dir = d.path();
    let sdir = dir.join("store");
    rd(&["store", "init", sdir.to_str().unwrap(), "--hash", "sha256"]);
    let (_srv, url) = start(&sdir);
    let raw = dir.join("disk.raw");
    random_file(&raw, 12 << 20, 21);
    qemu_io(raw.to_str().unwrap(), &["write -z 4M 2M".into()]);
    let qcow = dir.join("disk.qcow2");
    qemu_img_convert(raw.to_str().unwrap(), "qcow2", qcow.to_str().unwrap());
    let out = rd(&[
        "commit",
        qcow.to_str().unwrap(),
        "--to",
        "erin/vm",
        "--store",
        &url,
        "--json",
    ]);
    let v1 = json_str(&out, "version");
    // A session over HTTP, served over NBD, written by qemu-io.
    let sess = dir.join("sess");
    rd(&[
        "checkout",
        "erin/vm",
        "--store",
        &url,
        "--session",
        sess.to_str().unwrap(),
    ]);
    let cmds = vec![
        "write -P 7 1M 200k".to_string(),
        "write -P 9 10M 64k".to_string(),
    ];
    {
        let nbd = Server::start(dir, &[&format!("cas:{}", sess.display())]);
        qemu_io(&nbd.uri(), &cmds);
        nbd.stop();
    }
    qemu_io(raw.to_str().unwrap(), &cmds);
    let out = rd(&[
        "commit",
        &format!("cas:{}", sess.display()),
        "-m",
        "edit",
        "--json",
    ]);
    let v2 = json_str(&out, "version");
    let got = dir.join("got.raw");
    rd(&[
        "checkout",
        &format!("erin/vm@{}", &v2[..8]),
        "--store",
        &url,
        "--output",
        got.to_str().unwrap(),
    ]);
    qemu_img_compare(raw.to_str().unwrap(), got.to_str().unwrap());
    let log = rd(&["log", "erin/vm", "--store", &url]);
    assert!(log.contains(&v1[..12]) && log.contains(&v2[..12]), "{log}");
    let r = rd(&["gc", "--store", &url, "--json"]);
    assert!(r.contains("\"removed_objects\": 0"), "{r}");
    let info = rd(&["store", "info", "--store", &url]);
    assert!(info.contains("sha256") && info.contains("erin"), "{info}");
    // A chunk damaged on the server: the checkout names it.
    let pkg = std::fs::read(object_file(&sdir, &v1)).unwrap();
    assert!(pkg.len() > 16);
    let victim = cas_common::object_files(&sdir)
        .into_iter()
        .find(|f| {
            let n = f.file_name().unwrap().to_str().unwrap();
            n != v1 && n != v2 && std::fs::metadata(f).unwrap().len() > 60000
        })
        .unwrap();
    let id = victim.file_name().unwrap().to_str().unwrap().to_string();
    let mut b = std::fs::read(&victim).unwrap();
    let n = b.len();
    b[n - 7] ^= 1;
    std::fs::write(&victim, b).unwrap();
    let e = rd_fail(&[
        "checkout",
        "erin/vm",
        "--store",
        &url,
        "--output",
        dir.join("x.raw").to_str().unwrap(),
    ]);
    assert!(e.contains(&id) && e.contains("corrupt"), "{e}");
}
