//! TLS interop over TCP loopback: `roamdisk serve` (OpenSSL) against libnbd
//! (`nbdinfo`) and qemu (`qemu-img`), both GnuTLS clients, with X.509
//! certificates (optionally verifying client certificates) and with
//! pre-shared keys in psktool's format. Credentials are generated per test
//! with the openssl CLI and psktool; ports are picked by the kernel.

mod common;
mod nbdwire;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::certs::{make_ca, make_leaf, CLIENT_EXT, SERVER_EXT};
use common::{
    output_text, qemu_psk_creds, qemu_psk_dir, qemu_x509_creds, random_file, run, tempdir, tool,
};
use nbdwire::*;

/// `roamdisk serve ARGS... --listen 127.0.0.1:0`, its port read from the
/// "serving ... on nbd://127.0.0.1:PORT" line it prints.
struct TcpServer {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl TcpServer {
    fn start(dir: &Path, args: &[&str]) -> TcpServer {
        let log = dir.join("serve.log");
        let child = Command::new(common::bin())
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn roamdisk serve");
        let mut s = TcpServer {
            child: Some(child),
            port: 0,
            log,
        };
        s.port = common::wait_for_tcp_port(
            s.child.as_mut().expect("just started"),
            &s.log,
            "roamdisk serve",
        );
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A raw connection with timeouts.
    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        s
    }

    /// [`TcpServer::connect`], greeted: the client's options come next.
    fn greeted(&self) -> TcpStream {
        let mut t = self.connect();
        greet(&mut t).unwrap();
        t
    }

    fn plain_uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/", self.port)
    }

    fn x509_uri(&self, certs: &Path) -> String {
        format!(
            "nbds://127.0.0.1:{}/?tls-certificates={}",
            self.port,
            certs.display()
        )
    }

    fn psk_uri(&self, user: &str, keys: &Path) -> String {
        format!(
            "nbds://{user}@127.0.0.1:{}/?tls-psk-file={}",
            self.port,
            keys.display()
        )
    }

    /// qemu `--image-opts` for this server with TLS object `tls0`.
    fn qemu_opts(&self) -> String {
        format!(
            "driver=nbd,host=127.0.0.1,port={},tls-creds=tls0",
            self.port
        )
    }

    fn assert_no_panic(&self) {
        let log = self.log_text();
        assert!(!log.contains("panicked"), "server panicked:\n{log}");
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            common::sigterm_and_wait(&mut c, 20);
        }
    }
}

/// `nbdinfo ARGS` must succeed; returns stdout.
fn nbdinfo_ok(args: &[&str]) -> String {
    let o = tool("nbdinfo", args, &[]);
    assert!(
        o.status.success(),
        "nbdinfo {args:?} failed: {}",
        output_text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `nbdinfo ARGS` must fail (and not time out); returns its output.
fn nbdinfo_fails(args: &[&str], why: &str) -> Output {
    let o = tool("nbdinfo", args, &[("LIBNBD_DEBUG", "1")]);
    assert_ne!(o.status.code(), Some(124), "nbdinfo {args:?} timed out");
    assert!(!o.status.success(), "nbdinfo {args:?} succeeded: {why}");
    o
}

/// X.509 credentials: a CA, a server certificate for 127.0.0.1, a client
/// certificate, and an unrelated CA with its own client certificate.
/// The `*_dir` directories are laid out as GnuTLS clients (libnbd's
/// tls-certificates, qemu's tls-creds-x509 dir) expect.
struct X509 {
    ca_cert: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    /// ca-cert.pem only.
    ca_dir: PathBuf,
    /// ca-cert.pem, client-cert.pem, client-key.pem.
    client_dir: PathBuf,
    /// The other CA's ca-cert.pem: does not trust our server.
    other_ca_dir: PathBuf,
    /// Our ca-cert.pem with a client certificate from the other CA.
    rogue_client_dir: PathBuf,
}

fn x509(dir: &Path) -> X509 {
    let ca = dir.join("ca");
    make_ca(&ca, "roamdisk-test-ca");
    make_leaf(&ca, "server", SERVER_EXT);
    make_leaf(&ca, "client", CLIENT_EXT);
    let other = dir.join("other-ca");
    make_ca(&other, "someone-else");
    make_leaf(&other, "client", CLIENT_EXT);
    let layout = |name: &str, files: &[(&Path, &str)]| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (from_dir, f) in files {
            std::fs::copy(from_dir.join(f), d.join(f)).unwrap();
        }
        d
    };
    X509 {
        ca_cert: ca.join("ca-cert.pem"),
        server_cert: ca.join("server-cert.pem"),
        server_key: ca.join("server-key.pem"),
        ca_dir: layout("trust", &[(&ca, "ca-cert.pem")]),
        client_dir: layout(
            "client",
            &[
                (&ca, "ca-cert.pem"),
                (&ca, "client-cert.pem"),
                (&ca, "client-key.pem"),
            ],
        ),
        other_ca_dir: layout("other-trust", &[(&other, "ca-cert.pem")]),
        rogue_client_dir: layout(
            "rogue-client",
            &[
                (&ca, "ca-cert.pem"),
                (&other, "client-cert.pem"),
                (&other, "client-key.pem"),
            ],
        ),
    }
}

impl X509 {
    /// `roamdisk serve ARGS... --tls-cert SERVER --tls-key KEY` in DIR.
    fn serve(&self, dir: &Path, args: &[&str]) -> TcpServer {
        let tls = [
            "--tls-cert",
            s(&self.server_cert),
            "--tls-key",
            s(&self.server_key),
        ];
        TcpServer::start(dir, &[args, &tls[..]].concat())
    }
}

/// A new folder with [`x509`] credentials, and `roamdisk serve ARGS` with
/// them.
fn x509_serving(args: &[&str]) -> (tempfile::TempDir, X509, TcpServer) {
    let dir = tempdir();
    let c = x509(dir.path());
    let srv = c.serve(dir.path(), args);
    (dir, c, srv)
}

/// `psktool -u USER -p FILE` (a fresh random key).
fn psk(dir: &Path, file: &str, user: &str) -> PathBuf {
    let p = dir.join(file);
    run("psktool", &["-u", user, "-p", p.to_str().unwrap()]);
    p
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

// ------------------------------------------------------------------ X.509

#[test]
fn x509_nbdinfo_connects_and_an_untrusted_server_is_refused() {
    let (_dir, c, srv) = x509_serving(&["mem:64M"]);
    let out = nbdinfo_ok(&[&srv.x509_uri(&c.ca_dir)]);
    assert!(out.contains("with TLS"), "{out}");
    assert_eq!(
        nbdinfo_ok(&["--size", &srv.x509_uri(&c.ca_dir)]).trim(),
        "67108864"
    );
    // A client trusting another CA must not talk to us.
    nbdinfo_fails(
        &["--size", &srv.x509_uri(&c.other_ca_dir)],
        "server certificate accepted by a client trusting another CA",
    );
    // Still serving.
    nbdinfo_ok(&["--size", &srv.x509_uri(&c.ca_dir)]);
    srv.assert_no_panic();
}

#[test]
fn x509_qemu_img_convert_round_trip() {
    let dir = tempdir();
    let c = x509(dir.path());
    let src = dir.path().join("src.img");
    random_file(&src, 8 << 20, 1);
    let served = dir.path().join("served.img");
    std::fs::File::create(&served)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let spec = format!("raw:{}", served.display());
    let srv = c.serve(dir.path(), &[&spec]);
    // Write over TLS...
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            s(&src),
            "--object",
            &qemu_x509_creds(&c.client_dir),
            "--target-image-opts",
            &srv.qemu_opts(),
        ],
    );
    // ...and read back over TLS.
    let out = dir.path().join("out.img");
    run(
        "qemu-img",
        &[
            "convert",
            "--object",
            &qemu_x509_creds(&c.ca_dir),
            "--image-opts",
            &srv.qemu_opts(),
            "-O",
            "raw",
            s(&out),
        ],
    );
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap(),
        "image read back over TLS differs from the source"
    );
    drop(srv);
    assert!(
        std::fs::read(&served).unwrap() == std::fs::read(&src).unwrap(),
        "served file differs from the source"
    );
}

#[test]
fn x509_verify_ca_requires_a_client_certificate() {
    let dir = tempdir();
    let c = x509(dir.path());
    let srv = c.serve(dir.path(), &["mem:64M", "--tls-verify-ca", s(&c.ca_cert)]);
    nbdinfo_fails(
        &["--size", &srv.x509_uri(&c.ca_dir)],
        "no client certificate, yet --tls-verify-ca let it in",
    );
    nbdinfo_fails(
        &["--size", &srv.x509_uri(&c.rogue_client_dir)],
        "client certificate from another CA accepted",
    );
    assert_eq!(
        nbdinfo_ok(&["--size", &srv.x509_uri(&c.client_dir)]).trim(),
        "67108864"
    );
    let obj = qemu_x509_creds(&c.client_dir);
    let out = run(
        "qemu-img",
        &["info", "--object", &obj, "--image-opts", &srv.qemu_opts()],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("67108864"));
    srv.assert_no_panic();
}

// -------------------------------------------------------------------- PSK

#[test]
fn psk_nbdinfo_and_qemu_img_work_and_a_wrong_key_fails() {
    let dir = tempdir();
    let keys = psk(dir.path(), "keys.psk", "alice");
    let wrong = psk(dir.path(), "wrong.psk", "alice");
    let bob = psk(dir.path(), "bob.psk", "bob");
    let src = dir.path().join("src.img");
    random_file(&src, 4 << 20, 2);
    let spec = format!("raw:{}", src.display());
    let srv = TcpServer::start(dir.path(), &[&spec, "--read-only", "--tls-psk", s(&keys)]);
    assert_eq!(
        nbdinfo_ok(&["--size", &srv.psk_uri("alice", &keys)]).trim(),
        "4194304"
    );
    nbdinfo_fails(
        &["--size", &srv.psk_uri("alice", &wrong)],
        "wrong key accepted",
    );
    nbdinfo_fails(
        &["--size", &srv.psk_uri("bob", &bob)],
        "unknown identity accepted",
    );
    nbdinfo_fails(&["--size", &srv.plain_uri()], "plain client served");
    // qemu reads DIR/keys.psk.
    let qdir = qemu_psk_dir(dir.path(), "qemu-psk", &keys);
    let obj = qemu_psk_creds(&qdir, "alice");
    let out = dir.path().join("out.img");
    run(
        "qemu-img",
        &[
            "convert",
            "--object",
            &obj,
            "--image-opts",
            &srv.qemu_opts(),
            "-O",
            "raw",
            s(&out),
        ],
    );
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap());
    nbdinfo_ok(&["--size", &srv.psk_uri("alice", &keys)]);
    srv.assert_no_panic();
}

// ------------------------------------------------------------------ modes

#[test]
fn tls_require_refuses_plain_clients_and_keeps_serving_tls() {
    let (_dir, c, srv) = x509_serving(&["mem:64M", "--tls", "require"]);
    // libnbd: refused, and the server's reason reaches the client.
    let o = nbdinfo_fails(
        &[&srv.plain_uri()],
        "plain client served under --tls require",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("requires TLS"), "{}", output_text(&o));

    // On the wire: every option but STARTTLS and ABORT gets ERR_TLS_REQD.
    let mut t = srv.greeted();
    for (opt, payload) in [
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (OPT_LIST, Vec::new()),
        (OPT_INFO, info_payload("", &[])),
        (OPT_GO, info_payload("", &[])),
        (OPT_SET_META_CONTEXT, meta_payload("", &["base:allocation"])),
        (999, b"junk".to_vec()),
    ] {
        assert_eq!(
            option_result(&mut t, opt, &payload),
            REP_ERR_TLS_REQD,
            "option {opt}"
        );
    }
    // EXPORT_NAME cannot be refused politely: hang-up.
    send_option(&mut t, OPT_EXPORT_NAME, b"").unwrap();
    expect_closed(&mut t, "plain EXPORT_NAME under --tls require");
    // ABORT is still honoured.
    let mut t = srv.greeted();
    send_option(&mut t, OPT_ABORT, &[]).unwrap();
    assert_eq!(read_option_reply(&mut t).unwrap().rtype, REP_ACK);
    expect_closed(&mut t, "ABORT");
    // STARTTLS followed by garbage instead of a ClientHello.
    let mut t = srv.greeted();
    assert_eq!(option_result(&mut t, OPT_STARTTLS, b"x"), REP_ERR_INVALID);
    assert_eq!(option_result(&mut t, OPT_STARTTLS, &[]), REP_ACK);
    t.write_all(&pattern(512, 1)).unwrap();
    expect_closed(&mut t, "garbage instead of a TLS handshake");

    let out = nbdinfo_ok(&[&srv.x509_uri(&c.ca_dir)]);
    assert!(out.contains("with TLS"), "{out}");
    srv.assert_no_panic();
}

#[test]
fn tls_on_serves_plain_and_tls_clients() {
    let dir = tempdir();
    let c = x509(dir.path());
    let keys = psk(dir.path(), "keys.psk", "alice");
    let sub = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        d
    };
    let x509_dir = sub("x509");
    let x509_srv = c.serve(&x509_dir, &["mem:64M", "--tls", "on"]);
    let psk_dir = sub("psk");
    let psk_srv = TcpServer::start(&psk_dir, &["mem:64M", "--tls", "on", "--tls-psk", s(&keys)]);
    for (srv, tls_uri) in [
        (&x509_srv, x509_srv.x509_uri(&c.ca_dir)),
        (&psk_srv, psk_srv.psk_uri("alice", &keys)),
    ] {
        let plain = nbdinfo_ok(&[&srv.plain_uri()]);
        assert!(plain.contains("without TLS"), "{plain}");
        let tls = nbdinfo_ok(&[&tls_uri]);
        assert!(tls.contains("with TLS"), "{tls}");
        // A raw plain client does I/O.
        let mut cl = Client::handshake(srv.connect(), &Opts::default()).unwrap();
        cl.check_io(0, 3);
        cl.disconnect();
        srv.assert_no_panic();
    }
}

#[test]
fn tls_off_refuses_starttls_by_policy() {
    let (_dir, c, srv) = x509_serving(&["mem:64M", "--tls", "off"]);
    nbdinfo_fails(
        &["--size", &srv.x509_uri(&c.ca_dir)],
        "TLS client served under --tls off",
    );
    let mut t = srv.greeted();
    assert_eq!(option_result(&mut t, OPT_STARTTLS, &[]), REP_ERR_POLICY);
    let mut cl = Client::negotiate(t, &Opts::default()).unwrap();
    cl.check_io(0, 4);
    assert_eq!(nbdinfo_ok(&["--size", &srv.plain_uri()]).trim(), "67108864");
}
