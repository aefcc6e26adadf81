//! The `nbd:URI` layer from the outside: a `roamdisk serve` stacks a cow
//! overlay over another `roamdisk serve`'s export (a bare NBD URI as the
//! inner spec), qemu-io writes through it, and the lower disk is left as it
//! was; `info` reads an NBD URI like any disk; `commit` reads an NBD export
//! with no nbdinfo or nbdcopy on PATH (qemu-img stays: it reads image
//! files).

mod cas_common;
mod common;

use std::path::Path;
use std::process::Command;

use cas_common::{checkout, json_num, json_str, rd, Cas};
use common::{
    assert_files_equal, assert_success, bin, qemu_img_compare, qemu_img_convert, qemu_io,
    random_file, stdout_text, tempdir, Server,
};

const MIB: u64 = 1 << 20;

/// `qemu-img convert -f raw -O FORMAT FROM TO`.
fn convert(from: &str, format: &str, to: &Path) {
    qemu_img_convert(from, format, to.to_str().unwrap());
}

/// DIR/base.raw: 8 MiB of random data (SEED).
fn random_disk(dir: &Path, seed: u64) -> std::path::PathBuf {
    let base = dir.join("base.raw");
    random_file(&base, 8 * MIB, seed);
    base
}

#[test]
fn cow_over_an_nbd_export_leaves_the_export_unchanged() {
    let d = tempdir();
    let dir = d.path();
    let base = random_disk(dir, 7);
    let orig = dir.join("orig.raw");
    std::fs::copy(&base, &orig).unwrap();
    let lower = Server::start_named(dir, "lower.sock", &[&format!("raw:{}", base.display())]);
    let overlay = dir.join("vm.ovl");
    let stack = format!("cow:{}:{}", overlay.display(), lower.uri());
    let upper = Server::start_named(dir, "upper.sock", &[&stack]);

    qemu_io(
        &upper.uri(),
        &[
            "write -P 0xab 1M 64k".into(),
            "write -z 3M 128k".into(),
            "write -P 0xcd 8388096 512".into(),
        ],
    );
    qemu_io(
        &upper.uri(),
        &[
            "read -P 0xab 1M 64k".into(),
            "read -P 0 3M 128k".into(),
            "read -P 0xcd 8388096 512".into(),
        ],
    );
    // Everything else reads from the lower export, through the overlay.
    let got = dir.join("upper.raw");
    convert(&upper.uri(), "raw", &got);
    let mut want = std::fs::read(&orig).unwrap();
    want[MIB as usize..(MIB + 65536) as usize].fill(0xab);
    want[(3 * MIB) as usize..(3 * MIB + 131072) as usize].fill(0);
    want[8388096..8388608].fill(0xcd);
    common::assert_bytes_equal(&std::fs::read(&got).unwrap(), &want, "through the overlay");

    // The lower disk is unchanged, through its server and on disk.
    qemu_img_compare(orig.to_str().unwrap(), &lower.uri());
    drop(upper);
    drop(lower);
    assert_files_equal(&base, &orig);
}

#[test]
fn info_reads_an_nbd_uri_like_any_disk() {
    let d = tempdir();
    let dir = d.path();
    let srv = Server::start(dir, &["mem:4M"]);
    qemu_io(&srv.uri(), &["write -P 1 1M 64k".into()]);
    let out = rd(&["info", &srv.uri(), "--json"]);
    assert_eq!(json_num(&out, "size"), 4 * MIB, "{out}");
    // base:allocation comes through: only the written range is data.
    assert_eq!(json_num(&out, "data"), 65536, "{out}");
    assert!(out.contains("nbd: nbd+unix:///?socket="), "{out}");
}

/// A directory holding only `qemu-img`, for a PATH without nbdinfo and
/// nbdcopy.
fn path_with_only_qemu_img(dir: &Path) -> String {
    let bin_dir = dir.join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let qemu_img = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v qemu-img"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::os::unix::fs::symlink(qemu_img.trim(), bin_dir.join("qemu-img")).unwrap();
    bin_dir.display().to_string()
}

#[test]
fn commit_reads_an_nbd_export_without_nbdinfo_or_nbdcopy() {
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());
    let raw = cas.random_file("disk.raw", 6 * MIB, 3);
    qemu_io(raw.to_str().unwrap(), &["write -z 2M 1M".into()]);
    let qcow2 = dir.join("disk.qcow2");
    convert(raw.to_str().unwrap(), "qcow2", &qcow2);
    let srv = Server::start(dir, &[&format!("raw:{}", raw.display()), "--read-only"]);
    let path = path_with_only_qemu_img(dir);
    let commit = |src: &str, to: &str| {
        let out = Command::new(bin())
            .args(["commit", src, "--to", to, "--store", s, "--json"])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert_success(&out, &format!("commit {src}"));
        stdout_text(&out)
    };
    let a = commit(&srv.uri(), "n/nbd");
    let b = commit(qcow2.to_str().unwrap(), "n/qcow2");
    assert!(json_num(&a, "new_objects") > 50, "{a}");
    assert_eq!(json_num(&b, "new_objects"), 0, "same content: {b}");
    for (out, to) in [(&a, "n/nbd"), (&b, "n/qcow2")] {
        let v = json_str(out, "version");
        let back = dir.join(format!("{}.raw", to.replace('/', "-")));
        checkout(s, &format!("{to}@{}", &v[..8]), &back, &[]);
        assert_files_equal(&back, &raw);
    }
}

/// A TCP relay on loopback to a Unix socket that can go silent: while
/// `frozen`, it keeps every connection open but forwards nothing either
/// way (a network that drops packets without a reset).
struct SilentLink {
    port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentLink {
    fn to(socket: &Path) -> SilentLink {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (f, socket) = (frozen.clone(), socket.to_path_buf());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = std::os::unix::net::UnixStream::connect(&socket) else {
                    return;
                };
                let pipe =
                    |mut from: Box<dyn Read + Send>,
                     mut to: Box<dyn Write + Send>,
                     f: std::sync::Arc<std::sync::atomic::AtomicBool>| {
                        std::thread::spawn(move || {
                            let mut b = vec![0u8; 1 << 16];
                            while let Ok(n) = from.read(&mut b) {
                                if n == 0 {
                                    return;
                                }
                                if !f.load(Ordering::SeqCst) && to.write_all(&b[..n]).is_err() {
                                    return;
                                }
                            }
                        });
                    };
                pipe(
                    Box::new(c.try_clone().unwrap()),
                    Box::new(s.try_clone().unwrap()),
                    f.clone(),
                );
                pipe(Box::new(s), Box::new(c), f.clone());
            }
        });
        SilentLink { port, frozen }
    }

    fn freeze(&self, on: bool) {
        self.frozen.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A silently dropped network does not hang a guest for ever (issue 24):
/// `nbd[timeout=2s]:` over a link that goes silent fails a read with an
/// I/O error once its reconnects give up (seconds, not never), and once
/// the link is back the next read reconnects and succeeds, same server.
#[test]
fn a_silent_network_fails_requests_after_the_timeout_and_reconnects_after() {
    let d = tempdir();
    let dir = d.path();
    let base = random_disk(dir, 9);
    let want = std::fs::read(&base).unwrap();
    let lower = Server::start_named(dir, "lower.sock", &[&format!("raw:{}", base.display())]);
    let link = SilentLink::to(&lower.socket);
    let spec = format!("nbd[timeout=2s]:nbd://127.0.0.1:{}/", link.port);
    let upper = Server::start_named(dir, "upper.sock", &[&spec]);
    let read = |off: u64| {
        let t0 = std::time::Instant::now();
        let out = common::qemu_io_command(&upper.uri(), &[format!("read -v {off} 16")])
            .output()
            .expect("run qemu-io");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (t0.elapsed(), text)
    };
    let hex = |off: usize| format!("{off:08x}:  {:02x} {:02x}", want[off], want[off + 1]);
    let (_, ok) = read(4096);
    assert!(ok.contains(&hex(4096)), "{ok}");
    link.freeze(true);
    let (took, failed) = read(MIB);
    eprintln!("with the link silent, the read failed after {took:?}");
    assert!(failed.contains("Input/output error"), "{failed}");
    assert!(
        took > std::time::Duration::from_millis(1500) && took < std::time::Duration::from_secs(60),
        "the read failed after {took:?}"
    );
    link.freeze(false);
    let (took, back) = read(2 * MIB);
    eprintln!("with the link back, the read took {took:?}");
    assert!(
        back.contains(&hex(2 * MIB as usize)),
        "after the link came back: {back}"
    );
}
