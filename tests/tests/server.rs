//! `roamdisk server CONFIG`: one golden image, three clients with their own
//! views. alice proves herself with a client certificate (matched by its
//! CN), bob with a certificate matched by its SHA-256 fingerprint, carol
//! with a TLS-PSK key over TCP and with her uid on the Unix socket. Real
//! clients (qemu-io, nbdinfo, nbdcopy; GnuTLS) drive the real binary:
//! each client's writes stay in its own view, the golden file never
//! changes, every refusal is in the server's log with the identity, views
//! survive kill -9, and `server reset` / `server promote` work on a
//! stopped server.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::certs::{client_dir, make_ca, make_leaf, CLIENT_EXT, SERVER_EXT};
use common::{
    client_table, nbd_direct_write, output_text, path_str, poll_until, psk_add, psk_client,
    qemu_io_tls_args, qemu_psk_creds, qemu_psk_dir, qemu_x509_creds, random_file, raw_image, rd,
    rd_fail, require_tool, run, run_stdout, tempdir, tool, uid, write_server_config, ServerProc,
};

const SIZE: u64 = 8 << 20;

/// The grant of the golden image's view.
const DESKTOP: &str = r#"view = ["desktop"]"#;

/// A running `roamdisk server CONFIG` of a [`Fixture`], its TCP port read
/// from its log; the URIs of its clients.
struct Srv {
    proc: ServerProc,
    port: u16,
    socket: PathBuf,
}

impl std::ops::Deref for Srv {
    type Target = ServerProc;
    fn deref(&self) -> &ServerProc {
        &self.proc
    }
}

impl Srv {
    fn start(f: &Fixture) -> Srv {
        let log = f.dir.join(format!("server-{}.log", f.starts()));
        let proc = ServerProc::start_tcp(&f.config, log);
        Srv {
            port: proc.port(),
            proc,
            socket: f.dir.join("srv.sock"),
        }
    }

    fn cert_uri(&self, export: &str, certs: &Path) -> String {
        format!(
            "nbds://127.0.0.1:{}/{export}?tls-certificates={}",
            self.port,
            certs.display()
        )
    }

    fn psk_uri(&self, export: &str, user: &str, keys: &Path) -> String {
        format!(
            "nbds://{user}@127.0.0.1:{}/{export}?tls-psk-file={}",
            self.port,
            keys.display()
        )
    }

    fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// `nbdinfo URI` must fail (WHY says what its success would mean),
    /// and the log says LOGGED.
    fn refuses(&self, uri: &str, why: &str, logged: &[&str]) {
        fails("nbdinfo", &[uri], why);
        self.assert_logged(logged);
    }

    fn kill9(self) {
        self.proc.kill9();
    }

    fn stop(self) {
        self.proc.stop();
    }
}

/// The files of a three-client site.
struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
    golden: PathBuf,
    /// Credential folders as GnuTLS clients want them (ca-cert.pem,
    /// client-cert.pem, client-key.pem).
    alice: PathBuf,
    bob: PathBuf,
    /// A certificate from our CA for a client the config does not know.
    dave: PathBuf,
    /// A certificate from another CA, with CN=alice.
    rogue: PathBuf,
    carol_psk: PathBuf,
    carol_wrong_psk: PathBuf,
    mallory_psk: PathBuf,
    /// qemu's tls-creds-psk folder for carol (keys.psk).
    carol_qemu: PathBuf,
    started: std::cell::Cell<u32>,
}

impl Fixture {
    fn starts(&self) -> u32 {
        let n = self.started.get() + 1;
        self.started.set(n);
        n
    }
}

/// DIR/FILE with a new key for USER (psktool).
fn psk(dir: &Path, file: &str, user: &str) -> PathBuf {
    let p = dir.join(file);
    psk_add(&p, user);
    p
}

fn fixture() -> Fixture {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    let ca = dir.join("ca");
    make_ca(&ca, "site-ca");
    for (who, ext) in [
        ("server", SERVER_EXT),
        ("alice", CLIENT_EXT),
        ("bob", CLIENT_EXT),
        ("dave", CLIENT_EXT),
    ] {
        make_leaf(&ca, who, ext);
    }
    let other = dir.join("other-ca");
    make_ca(&other, "someone-else");
    make_leaf(&other, "alice", CLIENT_EXT);
    let fp = run_stdout(
        "openssl",
        &[
            "x509",
            "-noout",
            "-fingerprint",
            "-sha256",
            "-in",
            path_str(&ca.join("bob-cert.pem")),
        ],
    );
    let fp = fp
        .trim()
        .split('=')
        .nth(1)
        .expect("fingerprint")
        .to_string();
    let server_keys = psk(&dir, "server.psk", "carol");
    let carol_psk = dir.join("carol.psk");
    std::fs::copy(&server_keys, &carol_psk).unwrap();
    let carol_qemu = qemu_psk_dir(&dir, "carol-qemu", &server_keys);
    let golden = dir.join("golden.img");
    random_file(&golden, SIZE, 7);
    let tools = dir.join("tools.img");
    random_file(&tools, 1 << 20, 8);
    let config = write_server_config(
        &dir,
        &format!(
            r#"socket = "srv.sock"
listen = ["127.0.0.1:0"]
tls-cert = "ca/server-cert.pem"
tls-key = "ca/server-key.pem"
tls-verify-ca = "ca/ca-cert.pem"
tls-psk = "server.psk"
{desktop}description = "the lab's desktop"
{tools}{alice}{bob}{carol}"#,
            desktop = raw_image("desktop", &golden),
            tools = raw_image("tools", &tools),
            alice = client_table(
                "alice",
                r#"cert-cn = "alice""#,
                &format!("{DESKTOP}\nread-only = [\"tools\"]")
            ),
            bob = client_table("bob", &format!(r#"cert-sha256 = "{fp}""#), DESKTOP),
            carol = psk_client("carol", &format!("uid = {}\n{DESKTOP}", uid())),
        ),
    );
    Fixture {
        alice: client_dir(&dir, "alice", &ca, &ca, "alice"),
        bob: client_dir(&dir, "bob", &ca, &ca, "bob"),
        dave: client_dir(&dir, "dave", &ca, &ca, "dave"),
        rogue: client_dir(&dir, "rogue", &ca, &other, "alice"),
        carol_psk,
        carol_wrong_psk: psk(&dir, "carol-wrong.psk", "carol"),
        mallory_psk: psk(&dir, "mallory.psk", "mallory"),
        carol_qemu,
        config,
        golden,
        dir,
        _tmp: tmp,
        started: std::cell::Cell::new(0),
    }
}

fn ok(cmd: &str, args: &[&str]) -> String {
    let o = tool(cmd, args, &[]);
    assert!(o.status.success(), "{cmd} {args:?}: {}", output_text(&o));
    let all = output_text(&o).to_lowercase();
    assert!(
        !all.contains("verification failed") && !all.contains("failed"),
        "{cmd} {args:?}: {}",
        output_text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(cmd: &str, args: &[&str], why: &str) {
    let o = tool(cmd, args, &[]);
    assert_ne!(o.status.code(), Some(124), "{cmd} {args:?} timed out");
    let lower = output_text(&o).to_lowercase();
    assert!(
        !o.status.success() || lower.contains("failed") || lower.contains("error"),
        "{cmd} {args:?} succeeded: {why}\n{}",
        output_text(&o)
    );
}

/// How a client reaches the server.
enum Via<'a> {
    Cert(&'a Path),
    Psk(&'a Path),
}

/// `qemu-io --image-opts` for `export` over TLS.
fn qemu_io_tls(srv: &Srv, via: &Via, export: &str, cmds: &[&str]) -> Vec<String> {
    let object = match via {
        Via::Cert(d) => qemu_x509_creds(d),
        Via::Psk(d) => qemu_psk_creds(d, "carol"),
    };
    qemu_io_tls_args(object, srv.port, export, cmds)
}

/// [`qemu_io_tls`] run by [`ok`]: it must succeed.
fn qemu_io_tls_ok(srv: &Srv, via: &Via, export: &str, cmds: &[&str]) -> String {
    ok("qemu-io", &strs(&qemu_io_tls(srv, via, export, cmds)))
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The export at `uri` copied to a file in `dir` (nbdcopy).
fn fetch(dir: &Path, uri: &str, name: &str) -> Vec<u8> {
    let out = dir.join(name);
    ok("nbdcopy", &[uri, path_str(&out)]);
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    bytes
}

#[test]
fn each_client_writes_and_reads_its_own_view_and_the_golden_image_is_unchanged() {
    let f = fixture();
    let golden = std::fs::read(&f.golden).unwrap();
    let srv = Srv::start(&f);

    // Each client lists only its own grants.
    let list = ok("nbdinfo", &["--list", &srv.cert_uri("", &f.alice)]);
    assert!(
        list.contains("export=\"desktop\"") && list.contains("export=\"tools\""),
        "{list}"
    );
    assert!(list.contains("the lab's desktop"), "{list}");
    let list = ok("nbdinfo", &["--list", &srv.cert_uri("", &f.bob)]);
    assert!(
        list.contains("export=\"desktop\"") && !list.contains("tools"),
        "{list}"
    );
    let list = ok(
        "nbdinfo",
        &["--list", &srv.psk_uri("", "carol", &f.carol_psk)],
    );
    assert!(
        list.contains("export=\"desktop\"") && !list.contains("tools"),
        "{list}"
    );

    // alice and bob write different data at the same place.
    let a = Via::Cert(&f.alice);
    let b = Via::Cert(&f.bob);
    qemu_io_tls_ok(&srv, &a, "desktop", &["write -P 0xa1 0 1M", "flush"]);
    qemu_io_tls_ok(&srv, &b, "desktop", &["write -P 0xb2 512k 1M", "flush"]);
    // Each reads back its own.
    qemu_io_tls_ok(&srv, &a, "desktop", &["read -P 0xa1 0 1M"]);
    qemu_io_tls_ok(&srv, &b, "desktop", &["read -P 0xb2 512k 1M"]);
    // Two connections of one client share its view: the first sees what
    // the second wrote while it was connected.
    require_tool("qemu-io");
    let first = Command::new("qemu-io")
        .args(strs(&qemu_io_tls(
            &srv,
            &a,
            "desktop",
            &["read -P 0xa1 0 64k", "sleep 2000", "read -P 0xa5 4M 64k"],
        )))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qemu-io");
    std::thread::sleep(Duration::from_millis(500));
    qemu_io_tls_ok(&srv, &a, "desktop", &["write -P 0xa5 4M 64k"]);
    let first = first.wait_with_output().unwrap();
    let t = output_text(&first).to_lowercase();
    assert!(first.status.success() && !t.contains("failed"), "{t}");
    // Whole views: alice's has only her write, bob's only his, carol's none.
    let mut want_a = golden.clone();
    want_a[..1 << 20].fill(0xa1);
    want_a[4 << 20..(4 << 20) + (64 << 10)].fill(0xa5);
    let mut want_b = golden.clone();
    want_b[512 << 10..(512 << 10) + (1 << 20)].fill(0xb2);
    assert!(
        fetch(&f.dir, &srv.cert_uri("desktop", &f.alice), "a.img") == want_a,
        "alice's view"
    );
    assert!(
        fetch(&f.dir, &srv.cert_uri("desktop", &f.bob), "b.img") == want_b,
        "bob's view"
    );
    let carol = fetch(
        &f.dir,
        &srv.psk_uri("desktop", "carol", &f.carol_psk),
        "c.img",
    );
    assert!(carol == golden, "carol sees another client's writes");
    // carol on the Unix socket, known by her uid, gets the same view.
    assert!(fetch(&f.dir, &srv.unix_uri("desktop"), "u.img") == golden);
    // The empty name is the client's first grant.
    assert!(fetch(&f.dir, &srv.cert_uri("", &f.alice), "d.img") == want_a);
    srv.stop();
    assert!(
        std::fs::read(&f.golden).unwrap() == golden,
        "the golden image changed"
    );
    for c in ["alice", "bob", "carol"] {
        let o = f.dir.join("state/clients").join(c).join("desktop.cow");
        assert!(o.exists(), "no overlay {}", o.display());
    }
}

#[test]
fn every_refusal_is_refused_and_logged_with_the_identity() {
    let f = fixture();
    let srv = Srv::start(&f);
    // An image bob is not granted, and names of other clients' views.
    srv.refuses(
        &srv.cert_uri("tools", &f.bob),
        "bob opened tools",
        &[
            "refused",
            "export=tools",
            "client 'bob' has no grant",
            "127.0.0.1",
        ],
    );
    for name in ["alice", "alice%2Fdesktop", "clients%2Falice%2Fdesktop.cow"] {
        fails(
            "nbdinfo",
            &[&srv.psk_uri(name, "carol", &f.carol_psk)],
            "carol opened another's view",
        );
    }
    srv.assert_logged(&[
        "refused",
        "psk=carol",
        "export=alice/desktop",
        "client 'carol'",
    ]);
    // Writing to a read-only grant.
    let a = Via::Cert(&f.alice);
    let o = tool(
        "qemu-io",
        &strs(&qemu_io_tls(&srv, &a, "tools", &["write -P 1 0 4k"])),
        &[],
    );
    let t = output_text(&o).to_lowercase();
    assert!(
        t.contains("read-only") || t.contains("permission denied") || t.contains("failed"),
        "write to a read-only grant: {t}"
    );
    let mut read = vec!["-r".to_string()];
    read.extend(qemu_io_tls(&srv, &a, "tools", &["read 0 4k"]));
    ok("qemu-io", &strs(&read));
    // qemu refuses to open it read-write (the export says read-only); a
    // client that writes anyway gets EPERM, and the log says who.
    let o = nbd_direct_write(&srv.cert_uri("tools", &f.alice));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("REFUSED") && !out.contains("WROTE"),
        "{}",
        output_text(&o)
    );
    srv.assert_logged(&[
        "refused: write to a read-only export",
        "CN=alice",
        "export=tools",
    ]);
    // A certificate from our CA for a client the config does not know.
    srv.refuses(
        &srv.cert_uri("desktop", &f.dave),
        "unknown client served",
        &["refused", "CN=dave", "unknown client", "export=desktop"],
    );
    let list = tool("nbdinfo", &["--list", &srv.cert_uri("", &f.dave)], &[]);
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains("desktop"),
        "{}",
        output_text(&list)
    );
    srv.assert_logged(&["refused: LIST from an unknown client", "CN=dave"]);
    // A certificate from another CA, even with a known CN.
    srv.refuses(
        &srv.cert_uri("desktop", &f.rogue),
        "rogue certificate accepted",
        &["refused: TLS handshake failed", "127.0.0.1"],
    );
    // A wrong key for a known PSK identity, and an unknown identity.
    srv.refuses(
        &srv.psk_uri("desktop", "carol", &f.carol_wrong_psk),
        "wrong key",
        &[
            "refused: TLS handshake failed",
            "PSK identity 'carol': the client's key is not the one in the PSK file",
        ],
    );
    srv.refuses(
        &srv.psk_uri("desktop", "mallory", &f.mallory_psk),
        "unknown PSK",
        &[
            "refused: TLS handshake failed",
            "unknown PSK identity 'mallory' (no key for it in the PSK file)",
        ],
    );
    assert!(
        !srv.log_text().contains("no suitable signature algorithm"),
        "OpenSSL's words for an unknown identity reached the log:\n{}",
        srv.log_text()
    );
    // Plain TCP.
    srv.refuses(
        &format!("nbd://127.0.0.1:{}/desktop", srv.port),
        "plain TCP served",
        &["refused: plain client on a TLS-only server", "127.0.0.1"],
    );
    // Nobody wrote anything: no client has an overlay but the ones that
    // opened their own view.
    assert!(!f.dir.join("state/clients/dave").exists());
    assert!(!f.dir.join("state/clients/bob/tools.cow").exists());
    // Still serving the legitimate clients.
    ok("nbdinfo", &["--size", &srv.cert_uri("desktop", &f.alice)]);
    assert!(!srv.log_text().contains("panicked"));
}

/// `server promote carol desktop --config CFG --to TO EXTRA...`.
fn promote_carol<'a>(cfg: &'a str, to: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [
        &[
            "server", "promote", "carol", "desktop", "--config", cfg, "--to", to,
        ],
        extra,
    ]
    .concat()
}

#[test]
fn views_survive_kill_9_and_reset_and_promote_need_a_stopped_server() {
    let f = fixture();
    let golden = std::fs::read(&f.golden).unwrap();
    let cfg = path_str(&f.config);
    let srv = Srv::start(&f);
    // carol over TLS-PSK with qemu, then flush; then kill -9.
    let c = Via::Psk(&f.carol_qemu);
    qemu_io_tls_ok(&srv, &c, "desktop", &["write -P 0xc3 1M 2M", "flush"]);
    srv.kill9();
    let srv = Srv::start(&f);
    // On the Unix socket (uid) after the restart: the data is there.
    ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &srv.unix_uri("desktop"),
            "-c",
            "read -P 0xc3 1M 2M",
        ],
    );
    // A running server holds the state lock.
    let e = rd_fail(&["server", "reset", "carol", "desktop", "--config", cfg]);
    assert!(e.contains("running"), "{e}");
    let out = f.dir.join("promoted.img");
    let promote = promote_carol(cfg, path_str(&out), &[]);
    let e = rd_fail(&promote);
    assert!(e.contains("running"), "{e}");
    srv.stop();
    // Promote: golden + carol's overlay as a new raw image.
    rd(&promote);
    let mut want = golden.clone();
    want[1 << 20..3 << 20].fill(0xc3);
    assert!(std::fs::read(&out).unwrap() == want, "promoted image");
    // ...and as a new version in a chunk store.
    let store = f.dir.join("store");
    let st = path_str(&store);
    rd(&promote_carol(
        cfg,
        "lab/desktop",
        &["--store", st, "-m", "carol's"],
    ));
    let back = f.dir.join("checked-out.img");
    rd(&[
        "checkout",
        "lab/desktop",
        "--output",
        path_str(&back),
        "--store",
        st,
    ]);
    assert!(std::fs::read(&back).unwrap() == want, "promoted version");
    // Reset refuses what carol has no view of, then resets her view.
    let e = rd_fail(&["server", "reset", "carol", "tools", "--config", cfg]);
    assert!(e.contains("no grant"), "{e}");
    let said = rd(&["server", "reset", "carol", "--config", cfg]);
    assert!(said.contains("carol/desktop: overlay removed"), "{said}");
    let srv = Srv::start(&f);
    assert!(
        fetch(
            &f.dir,
            &srv.psk_uri("desktop", "carol", &f.carol_psk),
            "c.img"
        ) == golden
    );
    srv.stop();
    assert!(std::fs::read(&f.golden).unwrap() == golden);
}

#[test]
fn config_mistakes_name_the_file_and_the_key() {
    let dir = tempdir();
    let cfg = dir.path().join("server.toml");
    let c = path_str(&cfg);
    let head =
        "format = \"roamdisk-server\"\nversion = 1\nstate = \"state\"\nsocket = \"s.sock\"\n";
    for (text, want) in [
        ("[[export]]\nname = \"a\"\n", "key 'format' is missing"),
        ("format = \"roamdisk-server\"\nversion = 7\n", "key 'version'"),
        (
            &format!("{head}[[image]]\nname = \"a\"\nstack = \"mem:1M\"\nread-only = true\n")[..],
            "read-only",
        ),
        (
            &format!("{head}[[image]]\nname = \"a\"\nstack = \"mem:1M\"\n[[client]]\nname = \"x\"\nuid = 5\nview = [\"b\"]\n")[..],
            "client 'x' key 'view': no [[image]] named 'b'",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let e = rd_fail(&["server", c]);
        assert!(e.contains(c) && e.contains(want), "{text}\n=> {e}");
    }
    assert!(
        !dir.path().join("state").exists(),
        "state made for a bad config"
    );
    // Stacks are checked when the server opens them (the state taken).
    for (layers, want) in [
        ("hdd:raw:x.img", "layer 'raw' does not wrap another"),
        ("hdd[charge=some]", "charge 'some'"),
        ("nosuch", "unknown layer 'nosuch'"),
    ] {
        let text = format!(
            "{head}[[image]]\nname = \"a\"\nstack = \"mem:1M\"\nview-layers = \"{layers}\"\n"
        );
        std::fs::write(&cfg, &text).unwrap();
        let e = rd_fail(&["server", c]);
        assert!(
            e.contains("image 'a' key 'view-layers'") && e.contains(want),
            "{text}\n=> {e}"
        );
    }
}

/// A client killed with many writes in flight and no flush: the server
/// keeps serving, the other clients' views hold every byte they flushed
/// (before, during and after the kill, and across a kill -9 of the
/// server), the golden image is unchanged, and the killed client's own
/// view reads back, each 4 KiB block whole: its old bytes or its new ones.
#[test]
fn a_client_killed_mid_write_leaves_every_other_client_intact() {
    let f = fixture();
    let golden = std::fs::read(&f.golden).unwrap();
    let srv = Srv::start(&f);
    let (alice, bob) = (Via::Cert(&f.alice), Via::Cert(&f.bob));
    for (who, pattern, at) in [(&alice, "0xa1", "0"), (&bob, "0xb2", "2M")] {
        let w = format!("write -P {pattern} {at} 1M");
        qemu_io_tls_ok(&srv, who, "desktop", &[&w, "flush"]);
    }
    // carol streams 4 KiB writes over her whole view, 64 in flight, never
    // flushing; she says STARTED once the first 512 are acknowledged.
    let script = format!(
        r#"import nbd, sys
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri({uri:?})
size = h.get_size()
buf = nbd.Buffer.from_bytearray(bytearray(b'\xc3' * 4096))
done = 0
off = 0
while True:
    while h.aio_in_flight() < 64:
        h.aio_pwrite(buf, off % size, completion=lambda *a: 1)
        off += 4096
    h.poll(-1)
    done += 1
    if done == 512:
        print('STARTED', flush=True)
"#,
        uri = srv.psk_uri("desktop", "carol", &f.carol_psk)
    );
    let mut carol = common::python_nbd(&script, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the python client");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(carol.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    if line.trim() != "STARTED" {
        let _ = carol.kill();
        let o = carol.wait_with_output().unwrap();
        panic!(
            "carol never got going: {line}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // alice writes and flushes while carol is mid-stream, and carol dies.
    qemu_io_tls_ok(&srv, &alice, "desktop", &["write -P 0xa4 4M 1M", "flush"]);
    carol.kill().unwrap();
    let _ = carol.wait();
    // bob writes after the kill.
    qemu_io_tls_ok(&srv, &bob, "desktop", &["write -P 0xb5 6M 1M", "flush"]);
    let mut want_alice = golden.clone();
    want_alice[..1 << 20].fill(0xa1);
    want_alice[4 << 20..5 << 20].fill(0xa4);
    let mut want_bob = golden.clone();
    want_bob[2 << 20..3 << 20].fill(0xb2);
    want_bob[6 << 20..7 << 20].fill(0xb5);
    let check = |srv: &Srv, round: &str| {
        let a = fetch(&f.dir, &srv.cert_uri("desktop", &f.alice), "a.img");
        assert!(a == want_alice, "{round}: alice's view changed");
        let b = fetch(&f.dir, &srv.cert_uri("desktop", &f.bob), "b.img");
        assert!(b == want_bob, "{round}: bob's view changed");
        let c = fetch(
            &f.dir,
            &srv.psk_uri("desktop", "carol", &f.carol_psk),
            "c.img",
        );
        let mut written = 0;
        for (i, (got, old)) in c.chunks(4096).zip(golden.chunks(4096)).enumerate() {
            if got != old {
                assert!(
                    got.iter().all(|&x| x == 0xc3),
                    "{round}: carol's block {i} is neither hers nor the golden image's"
                );
                written += 1;
            }
        }
        written
    };
    let written = check(&srv, "after the kill");
    assert!(written >= 512, "only {written} of carol's blocks landed");
    assert!(!srv.log_text().contains("panicked"), "{}", srv.log_text());
    srv.kill9();
    let srv = Srv::start(&f);
    check(&srv, "after kill -9 of the server");
    srv.stop();
    assert!(std::fs::read(&f.golden).unwrap() == golden);
}

/// Revoking a client: its key leaves the PSK file and its `[[client]]`
/// the config, and after a restart it is refused (and logged) while the
/// others go on; its overlay stays on disk, out of everyone's reach.
#[test]
fn a_revoked_client_is_refused_after_the_restart() {
    let f = fixture();
    let srv = Srv::start(&f);
    let c = Via::Psk(&f.carol_qemu);
    qemu_io_tls_ok(&srv, &c, "desktop", &["write -P 0x5c 0 64k", "flush"]);
    srv.stop();
    let psk = f.dir.join("server.psk");
    // Another key stays in the file.
    psk_add(&psk, "erin");
    let keys = std::fs::read_to_string(&psk).unwrap();
    let kept: String = keys
        .lines()
        .filter(|l| !l.starts_with("carol:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(kept, keys, "carol's key was in the file");
    std::fs::write(&psk, kept).unwrap();
    let cfg = std::fs::read_to_string(&f.config).unwrap();
    let at = cfg
        .find("[[client]]\nname = \"carol\"")
        .expect("carol's block");
    std::fs::write(&f.config, &cfg[..at]).unwrap();
    let srv = Srv::start(&f);
    srv.refuses(
        &srv.psk_uri("desktop", "carol", &f.carol_psk),
        "a revoked key served",
        &["refused: TLS handshake failed", "PSK identity 'carol'"],
    );
    // On the Unix socket her uid no longer names anyone either.
    srv.refuses(
        &srv.unix_uri("desktop"),
        "a revoked uid served",
        &["refused", "unknown client"],
    );
    // The others go on, and carol's overlay is no one's.
    ok("nbdinfo", &["--size", &srv.cert_uri("desktop", &f.alice)]);
    fails(
        "nbdinfo",
        &[&srv.cert_uri("carol/desktop", &f.alice)],
        "alice opened carol's overlay",
    );
    assert!(f.dir.join("state/clients/carol/desktop.cow").exists());
    srv.stop();
}

/// Revoking a client without a restart: its key leaves the PSK file and
/// its `[[client]]` the config, and within a second of SIGHUP it can no
/// longer connect — by its key or by its uid — while the others go on
/// and a client added by the same reload gets in. A reload that changes
/// what only a restart applies is refused, logged, and changes nothing.
#[test]
fn a_revoked_client_cannot_connect_within_a_second_of_sighup() {
    let f = fixture();
    let srv = Srv::start(&f);
    let carol = srv.psk_uri("desktop", "carol", &f.carol_psk);
    ok("nbdinfo", &["--size", &carol]);
    ok("nbdinfo", &["--size", &srv.unix_uri("desktop")]);
    // A change only a restart applies: refused whole.
    let cfg = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(
        &f.config,
        cfg.replace("listen = [\"127.0.0.1:0\"]", "listen = [\"127.0.0.1:1\"]"),
    )
    .unwrap();
    srv.sighup();
    let refused = poll_until(Duration::from_secs(5), Duration::from_millis(20), || {
        srv.log_text().contains("config not reloaded")
    });
    assert!(refused, "no refusal logged:\n{}", srv.log_text());
    assert!(
        srv.log_text().contains("listen changed: restart"),
        "{}",
        srv.log_text()
    );
    ok("nbdinfo", &["--size", &carol]);
    // Revoke carol, add erin (a key and a client).
    std::fs::write(&f.config, &cfg).unwrap();
    let psk = f.dir.join("server.psk");
    psk_add(&psk, "erin");
    let keys = std::fs::read_to_string(&psk).unwrap();
    let erin_keys = f.dir.join("erin.psk");
    let erin_line: String = keys.lines().filter(|l| l.starts_with("erin:")).collect();
    std::fs::write(&erin_keys, format!("{erin_line}\n")).unwrap();
    let kept: String = keys
        .lines()
        .filter(|l| !l.starts_with("carol:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&psk, kept).unwrap();
    let at = cfg
        .find("[[client]]\nname = \"carol\"")
        .expect("carol's block");
    let next = format!("{}{}", &cfg[..at], psk_client("erin", DESKTOP));
    std::fs::write(&f.config, next).unwrap();
    let t0 = Instant::now();
    srv.sighup();
    let gone = poll_until(Duration::from_secs(1), Duration::from_millis(20), || {
        !tool("nbdinfo", &["--size", &carol], &[]).status.success()
    });
    let took = t0.elapsed();
    assert!(
        gone,
        "carol still connects {took:?} after SIGHUP:\n{}",
        srv.log_text()
    );
    assert!(
        srv.log_text().contains("config reloaded"),
        "{}",
        srv.log_text()
    );
    srv.refuses(&carol, "a revoked key served", &["PSK identity 'carol'"]);
    srv.refuses(
        &srv.unix_uri("desktop"),
        "a revoked uid served",
        &["unknown client"],
    );
    // The others go on; erin, added by the reload, gets in.
    ok("nbdinfo", &["--size", &srv.cert_uri("desktop", &f.alice)]);
    ok(
        "nbdinfo",
        &["--size", &srv.psk_uri("desktop", "erin", &erin_keys)],
    );
    srv.stop();
}

/// `view-layers`: the views' writes and the golden image's reads on one
/// emulated disk (`hdd[head=...]`), as the Figure 10 bench runs them.
#[test]
fn view_layers_put_the_views_writes_on_the_golden_images_disk() {
    let dir = tempdir();
    let d = dir.path();
    let golden = d.join("golden.img");
    random_file(&golden, 8 << 20, 3);
    let report = d.join("disk.json");
    let cfg = d.join("server.toml");
    let uid = uid();
    std::fs::write(
        &cfg,
        format!(
            "format = \"roamdisk-server\"\nversion = 1\nstate = \"{st}\"\nsocket = \"{sock}\"\n\n\
             [[image]]\nname = \"g\"\nstack = \"hdd[head=srv,report={rep}]:raw:{g}\"\n\
             view-layers = \"hdd[head=srv,charge=writes]\"\n\n\
             [[client]]\nname = \"me\"\nuid = {uid}\nview = [\"g\"]\n",
            st = d.join("state").display(),
            sock = d.join("s.sock").display(),
            rep = report.display(),
            g = golden.display(),
        ),
    )
    .unwrap();
    let srv = common::ServerProc::start(&cfg, d.join("server.log"));
    let uri = format!("nbd+unix:///g?socket={}", d.join("s.sock").display());
    // One whole-cluster write (no copy-up read) and one read elsewhere.
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 7 1M 64k",
            "-c",
            "flush",
            "-c",
            "read 4M 64k",
            &uri,
        ],
    );
    srv.stop();
    let j = std::fs::read_to_string(&report).unwrap();
    assert!(j.contains("\"requests\":2,"), "{j}");
    assert!(j.contains("\"bytes\":131072,"), "{j}");
}
