//! TransCom's strategy C, thin clients: a client runs `roamdisk serve
//! cow:LOCAL.cow:nbd:nbds://...` on a Unix socket, its writes in a local
//! overlay, the golden image read from `roamdisk server` over TCP with TLS
//! (certificates or a pre-shared key per client). The real binaries
//! throughout: qemu-io, qemu-img and a Linux guest (qemu's NBD client) on
//! the thin client's socket; the server grants the thin client read-only
//! and must never see a write; per-client identities reach only their
//! own grants; a thin client reconnects over TLS after the server is
//! killed; `roamdisk replay` gives each emulated client its own identity
//! and each one's writes land in its own view on the server.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod common;
mod guest_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::certs::{client_dir, make_ca, make_leaf, CLIENT_EXT, SERVER_EXT};
use common::{
    assert_bytes_equal, client_table, e2fsck_clean, free_port, nbd_direct_write, num_after,
    path_str, psk_add, psk_client, qemu_img_copy, qemu_io, random_file, raw_image, rd, rd_fail,
    run, run_stdout, tempdir, write_server_config, Server, ServerProc,
};
use guest_common::Guest;

const MIB: u64 = 1 << 20;

/// How the thin client proves itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Auth {
    Cert,
    Psk,
}

/// A site: its folder, golden image and server config.
struct Site {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
    golden: PathBuf,
    /// The thin client's credential: a certificates folder (ca-cert.pem,
    /// client-cert.pem, client-key.pem) or its own PSK file.
    cred: PathBuf,
}

impl Site {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn server(&self, log: &str) -> ServerProc {
        ServerProc::start_tcp(&self.config, self.path(log))
    }

    /// The thin client's URI for `export` on `port`.
    fn uri(&self, auth: Auth, port: u16, export: &str) -> String {
        match auth {
            Auth::Cert => format!(
                "nbds://127.0.0.1:{port}/{export}?tls-certificates={}",
                self.cred.display()
            ),
            Auth::Psk => format!(
                "nbds://thin@127.0.0.1:{port}/{export}?tls-psk-file={}",
                self.cred.display()
            ),
        }
    }

    /// `roamdisk serve cow:LOCAL:nbd:URI -v` on DIR/thin.sock (-v: the
    /// log says when a connection is re-established).
    fn thin_client(&self, local: &Path, uri: &str) -> Server {
        let stack = format!("cow:{}:nbd:{uri}", local.display());
        Server::start_named(&self.dir, "thin.sock", &[&stack, "-v"])
    }
}

/// The line of `name` in the psktool file `from`, alone in a new file.
fn own_line(from: &Path, name: &str, to: &Path) {
    let text = std::fs::read_to_string(from).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .expect("a line for the identity");
    std::fs::write(to, format!("{line}\n")).unwrap();
}

/// A site whose server holds GOLDEN (`size` random bytes, or `golden`
/// given) as image "golden", TLS by `auth`, the client "thin" granted
/// `grant` (`read-only` or `view`) and `extra` TOML after it.
fn site(auth: Auth, golden: Option<PathBuf>, size: u64, grant: &str, port: u16) -> Site {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    let golden = golden.unwrap_or_else(|| {
        let g = dir.join("golden.img");
        random_file(&g, size, 11);
        g
    });
    let (tls, identity, cred) = match auth {
        Auth::Cert => {
            let ca = dir.join("ca");
            make_ca(&ca, "site-ca");
            make_leaf(&ca, "server", SERVER_EXT);
            make_leaf(&ca, "thin", CLIENT_EXT);
            let d = client_dir(&dir, "thin-certs", &ca, &ca, "thin");
            (
                "tls-cert = \"ca/server-cert.pem\"\ntls-key = \"ca/server-key.pem\"\ntls-verify-ca = \"ca/ca-cert.pem\"\n",
                "cert-cn = \"thin\"",
                d,
            )
        }
        Auth::Psk => {
            let keys = dir.join("server.psk");
            psk_add(&keys, "thin");
            let own = dir.join("thin.psk");
            own_line(&keys, "thin", &own);
            ("tls-psk = \"server.psk\"\n", "psk-identity = \"thin\"", own)
        }
    };
    let config = write_server_config(
        &dir,
        &format!(
            "listen = [\"127.0.0.1:{port}\"]\n{tls}\n{}{}",
            raw_image("golden", &golden),
            client_table("thin", identity, &format!("{grant} = [\"golden\"]")),
        ),
    );
    Site {
        _tmp: tmp,
        dir,
        config,
        golden,
        cred,
    }
}

/// A libnbd client writing 4 KiB at 0 as the thin client's identity,
/// straight to the server: "REFUSED errno" or "WROTE".
fn direct_write(uri: &str) -> String {
    let o = nbd_direct_write(uri);
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The thin client round: qemu-io and qemu-img through `cow:LOCAL:nbd:
/// nbds://...`; the writes are in LOCAL only, the golden image and the
/// server's state untouched, and the server never saw a write (the log
/// that would name one is shown to work by a direct write that it does
/// name).
fn thin_client_round(auth: Auth) {
    let s = site(auth, None, 16 * MIB, "read-only", 0);
    let golden = std::fs::read(&s.golden).unwrap();
    let srv = s.server("server.log");
    let uri = s.uri(auth, srv.port(), "golden");
    let local = s.path("local.cow");
    let thin = s.thin_client(&local, &uri);
    qemu_io(
        &thin.uri(),
        &[
            "write -P 0x5a 1M 256k".into(),
            "write -z 8M 64k".into(),
            "write -P 0xa5 16773120 4096".into(),
            "flush".into(),
        ],
    );
    qemu_io(
        &thin.uri(),
        &[
            "read -P 0x5a 1M 256k".into(),
            "read -P 0 8M 64k".into(),
            "read -P 0xa5 16773120 4096".into(),
        ],
    );
    let mut want = golden.clone();
    want[MIB as usize..(MIB + 256 * 1024) as usize].fill(0x5a);
    want[(8 * MIB) as usize..(8 * MIB + 65536) as usize].fill(0);
    want[16773120..].fill(0xa5);
    let view = s.path("view.raw");
    qemu_img_copy(&thin.uri(), path_str(&view));
    assert_bytes_equal(
        &std::fs::read(&view).unwrap(),
        &want,
        "the thin client's disk",
    );
    let thin_log = thin.log_text();
    assert!(thin.stop().success(), "{thin_log}");

    // The writes are in LOCAL: a new thin client on it reads them back.
    assert!(local.exists());
    let thin = s.thin_client(&local, &uri);
    std::fs::remove_file(&view).unwrap();
    qemu_img_copy(&thin.uri(), path_str(&view));
    assert_bytes_equal(&std::fs::read(&view).unwrap(), &want, "after a restart");
    assert!(thin.stop().success());

    // The server never saw a write; one sent straight to it is refused
    // and logged, so the log would have told.
    assert!(
        !srv.log_text().contains("refused: write"),
        "{}",
        srv.log_text()
    );
    let said = direct_write(&uri);
    assert!(
        said.contains("REFUSED") && !said.contains("WROTE"),
        "{said}"
    );
    srv.assert_logged(&["refused: write to a read-only export", "export=golden"]);
    srv.stop();
    assert!(
        std::fs::read(&s.golden).unwrap() == golden,
        "the golden image changed"
    );
    assert!(
        !s.path("state/clients/thin/golden.cow").exists(),
        "the server made a view for a read-only grant"
    );
}

#[test]
fn a_thin_client_with_a_certificate_keeps_its_writes_local() {
    thin_client_round(Auth::Cert);
}

#[test]
fn a_thin_client_with_a_psk_keeps_its_writes_local() {
    thin_client_round(Auth::Psk);
}

/// What the server's certificate is checked against, and how a failed
/// check reads: a CA that did not sign it, a name it does not carry.
#[test]
fn a_server_certificate_that_does_not_verify_is_refused_with_the_reason() {
    let s = site(Auth::Cert, None, MIB, "read-only", 0);
    let srv = s.server("server.log");
    let other = s.path("other-ca");
    make_ca(&other, "someone-else");
    let certs = s.path("other-certs");
    std::fs::create_dir(&certs).unwrap();
    std::fs::copy(other.join("ca-cert.pem"), certs.join("ca-cert.pem")).unwrap();
    let port = srv.port();
    let e = rd_fail(&[
        "info",
        &format!(
            "nbds://127.0.0.1:{port}/golden?tls-certificates={}",
            certs.display()
        ),
    ]);
    assert!(
        e.contains("the server's certificate for '127.0.0.1' failed verification")
            && e.contains("ca-cert.pem"),
        "{e}"
    );
    let e = rd_fail(&[
        "info",
        &format!(
            "{}&tls-hostname=disks.example",
            s.uri(Auth::Cert, port, "golden")
        ),
    ]);
    assert!(e.contains("'disks.example' failed verification"), "{e}");
    // The right CA and name: served.
    let ok = rd(&["info", &s.uri(Auth::Cert, port, "golden")]);
    assert!(ok.contains("1 MiB") && ok.contains("TLS"), "{ok}");
    srv.stop();
}

/// Two PSK identities, each granted its own image: each reaches only its
/// own; a wrong key, an unknown identity and a plain connection to the
/// TLS listener are refused, each with a reason the user can act on, and
/// logged by the server; TLS asked of a server without it says so.
#[test]
fn each_psk_identity_reaches_only_its_own_grant() {
    let tmp = tempdir();
    let d = tmp.path();
    let (a, b) = (d.join("a.img"), d.join("b.img"));
    random_file(&a, 4 * MIB, 1);
    random_file(&b, 6 * MIB, 2);
    let keys = d.join("server.psk");
    psk_add(&keys, "ca");
    psk_add(&keys, "cb");
    for who in ["ca", "cb"] {
        own_line(&keys, who, &d.join(format!("{who}.psk")));
    }
    psk_add(&d.join("ca-wrong.psk"), "ca");
    psk_add(&d.join("mallory.psk"), "mallory");
    let config = write_server_config(
        d,
        &format!(
            "listen = [\"127.0.0.1:0\"]\ntls-psk = \"server.psk\"\n{}{}{}{}",
            raw_image("a", &a),
            raw_image("b", &b),
            psk_client("ca", r#"read-only = ["a"]"#),
            psk_client("cb", r#"read-only = ["b"]"#),
        ),
    );
    let srv = ServerProc::start_tcp(&config, d.join("server.log"));
    let uri = |who: &str, file: &str, export: &str| {
        format!(
            "nbds://{who}@127.0.0.1:{}/{export}?tls-psk-file={}",
            srv.port(),
            d.join(file).display()
        )
    };
    let size = |out: &str| num_after(out, 0, "size").0;
    assert_eq!(
        size(&rd(&["info", &uri("ca", "ca.psk", "a"), "--json"])),
        4 * MIB
    );
    assert_eq!(
        size(&rd(&["info", &uri("cb", "cb.psk", "b"), "--json"])),
        6 * MIB
    );
    // The empty name is the client's first grant.
    assert_eq!(
        size(&rd(&["info", &uri("cb", "cb.psk", ""), "--json"])),
        6 * MIB
    );
    for (who, other) in [("ca", "b"), ("cb", "a")] {
        let e = rd_fail(&["info", &uri(who, &format!("{who}.psk"), other)]);
        assert!(
            e.contains(&format!("the server refused export '{other}'")),
            "{e}"
        );
        srv.assert_logged(&["refused", &format!("psk={who}"), &format!("export={other}")]);
    }
    let e = rd_fail(&["info", &uri("ca", "ca-wrong.psk", "a")]);
    assert!(
        e.contains("the TLS-PSK handshake as identity 'ca' failed"),
        "{e}"
    );
    srv.assert_logged(&["refused: TLS handshake failed", "PSK identity 'ca'"]);
    let e = rd_fail(&["info", &uri("mallory", "mallory.psk", "a")]);
    assert!(
        e.contains("the TLS-PSK handshake as identity 'mallory' failed"),
        "{e}"
    );
    srv.assert_logged(&["refused: TLS handshake failed", "PSK identity 'mallory'"]);
    // An identity the client's own file has no key for: refused before
    // connecting.
    let e = rd_fail(&["info", &uri("cb", "ca.psk", "b")]);
    assert!(e.contains("has no key for identity 'cb'"), "{e}");
    let e = rd_fail(&["info", &format!("nbd://127.0.0.1:{}/a", srv.port())]);
    assert!(e.contains("the server requires TLS: use nbds://"), "{e}");
    srv.assert_logged(&["refused: plain client on a TLS-only server"]);
    assert!(!srv.log_text().contains("panicked"));
    srv.stop();

    // A server with no TLS at all.
    let plain = d.join("plain.log");
    let mut child = Command::new(common::bin())
        .args([
            "serve",
            &format!("raw:{}", a.display()),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&plain).unwrap())
        .spawn()
        .unwrap();
    let port = common::wait_for_tcp_port(&mut child, &plain, "roamdisk serve");
    let e = rd_fail(&[
        "info",
        &format!(
            "nbds://ca@127.0.0.1:{port}/?tls-psk-file={}",
            d.join("ca.psk").display()
        ),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(e.contains("the server does not offer TLS"), "{e}");
}

/// kill -9 of the server under a serving thin client: the next read that
/// needs the golden image waits while the thin client reconnects (TLS
/// again) to the restarted server; nothing written (locally, flushed) is
/// lost and every byte reads as it should.
#[test]
fn a_thin_client_reconnects_over_tls_after_the_server_is_killed() {
    let port = free_port();
    let s = site(Auth::Psk, None, 32 * MIB, "read-only", port);
    let golden = std::fs::read(&s.golden).unwrap();
    let srv = s.server("server-1.log");
    assert_eq!(srv.port(), port);
    let local = s.path("local.cow");
    let thin = s.thin_client(&local, &s.uri(Auth::Psk, port, "golden"));
    qemu_io(&thin.uri(), &["write -P 0x11 0 1M".into(), "flush".into()]);
    srv.kill9();

    // A whole-disk read starts while the server is down...
    let view = s.path("view.raw");
    let copier = Command::new("qemu-img")
        .args([
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &thin.uri(),
            path_str(&view),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run qemu-img");
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        thin.log_text().contains("NBD connection lost"),
        "the read did not wait for the server:\n{}",
        thin.log_text()
    );
    // ...and ends after it is back.
    let srv = s.server("server-2.log");
    let out = copier.wait_with_output().expect("wait for qemu-img");
    assert!(
        out.status.success(),
        "qemu-img convert through the thin client: {}\nthin client:\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        thin.log_text(),
        srv.log_text()
    );
    let mut want = golden.clone();
    want[..MIB as usize].fill(0x11);
    assert_bytes_equal(
        &std::fs::read(&view).unwrap(),
        &want,
        "read across the restart",
    );
    let log = thin.log_text();
    assert!(
        log.contains("NBD connection lost") && log.contains("NBD connection re-established"),
        "the thin client did not reconnect:\n{log}"
    );
    // Writing goes on; everything flushed is there after a restart of the
    // thin client too.
    qemu_io(
        &thin.uri(),
        &["write -P 0x22 20M 2M".into(), "flush".into()],
    );
    assert!(thin.stop().success());
    want[(20 * MIB) as usize..(22 * MIB) as usize].fill(0x22);
    let thin = s.thin_client(&local, &s.uri(Auth::Psk, port, "golden"));
    std::fs::remove_file(&view).unwrap();
    qemu_img_copy(&thin.uri(), path_str(&view));
    assert_bytes_equal(&std::fs::read(&view).unwrap(), &want, "after both restarts");
    assert!(thin.stop().success());
    srv.stop();
    assert!(std::fs::read(&s.golden).unwrap() == golden);
}

/// `roamdisk replay --clients 4` with `nbds://c{client}@...`: each
/// emulated client connects with its own PSK identity (one key file
/// holding the four lines) and its writes land in its own view on the
/// server, none in the golden image.
#[test]
fn replay_gives_each_emulated_client_its_own_identity_and_view() {
    let tmp = tempdir();
    let d = tmp.path();
    let golden = d.join("golden.img");
    common::truncate(&golden, "64G");
    let keys = d.join("keys.psk");
    let mut clients = String::new();
    for i in 0..4 {
        psk_add(&keys, &format!("c{i}"));
        clients.push_str(&psk_client(&format!("c{i}"), r#"view = ["golden"]"#));
    }
    let config = write_server_config(
        d,
        &format!(
            "listen = [\"127.0.0.1:0\"]\ntls-psk = \"keys.psk\"\n{}{clients}",
            raw_image("golden", &golden),
        ),
    );
    let trace = d.join("desk.rdtrace");
    common::trace_synth("desktop", &trace, "--clients 1 --requests 400");
    let srv = ServerProc::start_tcp(&config, d.join("server.log"));
    let target = format!(
        "nbds://c{{client}}@127.0.0.1:{}/golden?tls-psk-file={}",
        srv.port(),
        keys.display()
    );
    let out = rd(&[
        "replay",
        path_str(&trace),
        &target,
        "--clients",
        "4",
        "--per",
        "client",
    ]);
    assert!(
        out.contains("over 4 clients") && out.contains("replayed 1600 requests"),
        "{out}"
    );
    srv.stop();
    assert_eq!(std::fs::metadata(&golden).unwrap().len(), 64 << 30);
    assert_eq!(
        run_stdout("du", &["-k", path_str(&golden)])
            .split_whitespace()
            .next(),
        Some("0"),
        "the golden image got data"
    );
    let mut written = Vec::new();
    for i in 0..4 {
        let ovl = d.join(format!("state/clients/c{i}/golden.cow"));
        assert!(ovl.exists(), "no view for c{i}");
        let info = rd(&[
            "info",
            &format!("cow:{}:raw:{}", ovl.display(), golden.display()),
            "--json",
        ]);
        written.push(num_after(&info, 0, "data").0);
    }
    println!("bytes of data in each view: {written:?}");
    assert!(written[0] > 0, "c0's view holds no data: {written:?}");
    assert!(written.iter().all(|w| *w == written[0]), "{written:?}");
}

const GUEST_SCRIPT: &str = r#"
mount -t ext4 /dev/vda /mnt
cat /mnt/hello.txt
echo "written by the guest" >/mnt/guest.txt
dd if=/dev/urandom of=/mnt/big.bin bs=1M count=2 2>/dev/null
sha256sum /mnt/big.bin
sync
umount /mnt
"#;

/// A Linux guest (qemu TCG, its own NBD client) on a thin client whose
/// golden ext4 disk comes from `roamdisk server` over TLS (X.509): it
/// mounts it, reads the golden file, writes files, syncs and powers off;
/// the thin client's disk is then a clean ext4 with the guest's files,
/// and the golden image's bytes are unchanged.
#[test]
fn a_guest_boots_on_a_thin_client_over_tls() {
    let tmp = tempdir();
    let content = tmp.path().join("content");
    std::fs::create_dir(&content).unwrap();
    std::fs::write(content.join("hello.txt"), "hello from the golden image\n").unwrap();
    let golden = tmp.path().join("golden.ext4");
    common::truncate(&golden, "64M");
    common::mke2fs_from(path_str(&content), path_str(&golden));
    let s = site(Auth::Cert, Some(golden), 0, "read-only", 0);
    let before = std::fs::read(&s.golden).unwrap();
    let srv = s.server("server.log");
    let thin = s.thin_client(
        &s.path("local.cow"),
        &s.uri(Auth::Cert, srv.port(), "golden"),
    );
    let t0 = Instant::now();
    let guest = Guest::new(&s.dir)
        .nbd_disk(&thin.socket, "")
        .run(GUEST_SCRIPT, Duration::from_secs(120));
    guest.assert_ok();
    println!("guest run: {:?}", t0.elapsed());
    assert!(
        guest.lines().contains(&"hello from the golden image"),
        "{}",
        guest.console
    );
    let big_sha = guest
        .lines()
        .into_iter()
        .find_map(|l| l.strip_suffix("  /mnt/big.bin"))
        .unwrap_or_else(|| panic!("no sha256sum in:\n{}", guest.console))
        .to_string();

    let view = s.path("view.raw");
    qemu_img_copy(&thin.uri(), path_str(&view));
    assert!(thin.stop().success());
    srv.stop();
    e2fsck_clean(&view);
    let img = path_str(&view);
    assert_eq!(
        run_stdout("debugfs", &["-R", "cat /guest.txt", img]),
        "written by the guest\n"
    );
    let big = s.path("big.bin");
    run(
        "debugfs",
        &["-R", &format!("dump /big.bin {}", path_str(&big)), img],
    );
    let sha = run_stdout("sha256sum", &[path_str(&big)]);
    assert_eq!(sha.split_whitespace().next(), Some(big_sha.as_str()));
    assert!(
        std::fs::read(&s.golden).unwrap() == before,
        "the golden image changed"
    );
}

/// A URI that works with nbdinfo works with us: nbdkit (GnuTLS) with a
/// PSK file and with a certificates folder, the same `nbds://` URI given
/// to nbdinfo (libnbd) and to `roamdisk info`.
#[test]
fn the_same_nbds_uri_works_with_nbdinfo_and_with_roamdisk() {
    let s = site(Auth::Cert, None, MIB, "read-only", 0);
    let keys = s.path("server.psk");
    psk_add(&keys, "thin");
    let srv_certs = s.path("nbdkit-certs");
    std::fs::create_dir(&srv_certs).unwrap();
    for (from, to) in [
        ("ca-cert.pem", "ca-cert.pem"),
        ("server-cert.pem", "server-cert.pem"),
        ("server-key.pem", "server-key.pem"),
    ] {
        std::fs::copy(s.path("ca").join(from), srv_certs.join(to)).unwrap();
    }
    common::require_tool("nbdkit");
    for (flag, auth) in [
        (format!("--tls-psk={}", keys.display()), Auth::Psk),
        (
            format!("--tls-certificates={}", srv_certs.display()),
            Auth::Cert,
        ),
    ] {
        let port = free_port();
        let mut kit = Command::new("nbdkit")
            .args([
                "-f",
                "--tls=require",
                &flag,
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["memory", "6M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nbdkit");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "nbdkit did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let uri = match auth {
            Auth::Psk => format!(
                "nbds://thin@127.0.0.1:{port}/?tls-psk-file={}",
                keys.display()
            ),
            Auth::Cert => s.uri(Auth::Cert, port, ""),
        };
        let theirs = run_stdout("nbdinfo", &["--size", &uri]);
        let ours = num_after(&rd(&["info", &uri, "--json"]), 0, "size").0;
        let _ = kit.kill();
        let _ = kit.wait();
        assert_eq!(theirs.trim(), (6 * MIB).to_string(), "{auth:?}");
        assert_eq!(ours, 6 * MIB, "{auth:?}");
    }
}
