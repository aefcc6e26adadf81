//! The chunk server on a network: `roamdisk store serve` with TLS (a CA
//! and server certificate made by openssl) and a users file made by
//! `roamdisk store user`, driven by the `roamdisk` client and by curl.
//! Clients with the right CA, without it and with another one; missing,
//! wrong, revoked and renewed tokens; alice against bob's catalogs
//! unshared, shared read-only and shared for writing; admin-only gc; a
//! chunk whose bytes do not match its name; an open server asked to listen
//! on a non-loopback address. Every refusal is checked twice: in what the
//! client says, and in the server's log line (user, peer, method, path,
//! status, reason).

mod cas_common;
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cas_common::{qemu_io_session, session_spec, Cas, ChunkServer};
use common::certs::{make_ca, make_leaf, SERVER_EXT};
use common::{assert_files_equal, assert_success, bin, path_str, qemu_io, rd, require_tool};

/// A store served over TLS to alice, bob and root (an admin), each with a
/// token file `USER.token` next to the store.
struct Net {
    cas: Cas,
    users: PathBuf,
    srv: ChunkServer,
}

impl Net {
    fn start() -> Net {
        Net::start_in(Cas::new())
    }

    /// [`Net::start`] serving the store CAS.
    fn start_in(cas: Cas) -> Net {
        let dir = cas.dir();
        let ca = dir.join("ca");
        make_ca(&ca, "roamdisk-test-ca");
        make_leaf(&ca, "server", SERVER_EXT);
        let users = dir.join("users.toml");
        for (user, admin) in [("alice", false), ("bob", false), ("root", true)] {
            let token = dir.join(format!("{user}.token"));
            let mut args = vec!["store", "user", "add", user, "--users", path_str(&users)];
            args.extend(["--token-file", path_str(&token)]);
            if admin {
                args.push("--admin");
            }
            rd(&args);
            let mode = std::fs::metadata(&token).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{user}'s token file");
        }
        let text = std::fs::read_to_string(&users).unwrap();
        let alice = std::fs::read_to_string(dir.join("alice.token")).unwrap();
        assert!(
            text.contains("format = \"roamdisk-store-users\"") && !text.contains(alice.trim()),
            "the users file keeps hashes, not tokens:\n{text}"
        );
        let srv = ChunkServer::start(
            cas.s(),
            &[
                "--users",
                path_str(&users),
                "--tls-cert",
                path_str(&ca.join("server-cert.pem")),
                "--tls-key",
                path_str(&ca.join("server-key.pem")),
            ],
        );
        assert!(srv.url.starts_with("https://127.0.0.1:"), "{}", srv.url);
        Net { cas, users, srv }
    }

    fn dir(&self) -> &Path {
        self.cas.dir()
    }

    fn token(&self, user: &str) -> PathBuf {
        self.dir().join(format!("{user}.token"))
    }

    fn ca(&self) -> PathBuf {
        self.dir().join("ca/ca-cert.pem")
    }

    /// `roamdisk ARGS --store URL [--ca CA] [--token-file TOKEN]`, with no
    /// credentials from the environment.
    fn run(&self, args: &[&str], ca: Option<&Path>, token: Option<&Path>) -> Output {
        let mut c = Command::new(bin());
        c.args(args).args(["--store", &self.srv.url]);
        if let Some(ca) = ca {
            c.args(["--ca", path_str(ca)]);
        }
        if let Some(t) = token {
            c.args(["--token-file", path_str(t)]);
        }
        c.env_remove("ROAMDISK_STORE_TOKEN_FILE")
            .env_remove("ROAMDISK_STORE_CA")
            .output()
            .expect("run roamdisk")
    }

    /// `roamdisk ARGS` as USER with the right CA; must succeed. Returns
    /// (stdout, stderr).
    fn ok_as(&self, user: &str, args: &[&str]) -> (String, String) {
        let o = self.run(args, Some(&self.ca()), Some(&self.token(user)));
        assert_success(&o, &format!("roamdisk {args:?} as {user}"));
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// A new random disk NAME of SIZE (SEED) in the folder, committed by
    /// alice as `alice/vm`.
    fn alice_commits(&self, (name, size, seed): (&str, u64, u64)) -> PathBuf {
        let raw = self.cas.random_file(name, size, seed);
        self.ok_as("alice", &["commit", path_str(&raw), "--to", "alice/vm"]);
        raw
    }

    /// [`Net::run`], which must fail saying every one of `says`.
    fn fails(&self, args: &[&str], ca: Option<&Path>, token: Option<&Path>, says: &[&str]) {
        let o = self.run(args, ca, token);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "roamdisk {args:?} should have failed:\n{err}"
        );
        for s in says {
            assert!(
                err.contains(s),
                "roamdisk {args:?} does not say {s:?}:\n{err}"
            );
        }
    }

    /// `roamdisk ARGS` as USER with the right CA, which must fail saying
    /// every one of `says`.
    fn fails_as(&self, user: &str, args: &[&str], says: &[&str]) {
        self.fails(args, Some(&self.ca()), Some(&self.token(user)), says)
    }

    /// `roamdisk store user ARGS --users FILE`.
    fn user_cmd(&self, args: &[&str]) -> String {
        rd(&[
            &["store", "user"],
            args,
            &["--users", path_str(&self.users)],
        ]
        .concat())
    }

    /// The server logged a refusal whose line holds every one of `parts`.
    fn assert_logged(&self, parts: &[&str]) {
        let log = self.srv.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains("request refused") && parts.iter().all(|p| l.contains(p))),
            "no refusal with {parts:?} in the server's log:\n{log}"
        );
    }

    /// curl METHOD PATH [BODY] against the server, as USER (or no one);
    /// returns (status, body).
    fn curl(
        &self,
        user: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Path>,
    ) -> (u16, String) {
        require_tool("curl");
        let mut c = Command::new("curl");
        c.args(["-sS", "--cacert", path_str(&self.ca()), "-X", method]);
        c.args(["-w", "\n%{http_code}"]);
        if let Some(u) = user {
            let t = std::fs::read_to_string(self.token(u)).unwrap();
            c.args(["-H", &format!("Authorization: Bearer {}", t.trim())]);
        }
        if let Some(b) = body {
            c.args(["--data-binary", &format!("@{}", path_str(b))]);
        }
        let o = c
            .arg(format!("{}{path}", self.srv.url))
            .output()
            .expect("run curl");
        assert_success(&o, &format!("curl {method} {path}"));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = out.rsplit_once('\n').expect("status line");
        (code.trim().parse().expect("HTTP status"), body.to_string())
    }
}

#[test]
fn commit_checkout_and_a_session_over_tls_with_the_right_ca_only() {
    let net = Net::start();
    let dir = net.dir();
    let raw = net.alice_commits(("disk.raw", 4 << 20, 5));
    let got = dir.join("got.raw");
    net.ok_as(
        "alice",
        &["checkout", "alice/vm", "--output", path_str(&got)],
    );
    assert_files_equal(&raw, &got);
    // Without the CA (the system's roots do not have it), and with another
    // CA, the client refuses the server, says what to do, and does not retry.
    let other = dir.join("other-ca");
    make_ca(&other, "someone-else");
    for ca in [None, Some(other.join("ca-cert.pem"))] {
        let o = net.run(
            &["log", "alice/vm"],
            ca.as_deref(),
            Some(&net.token("alice")),
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && e.contains("certificate") && e.contains("--ca FILE"),
            "{ca:?}: {e}"
        );
        assert!(
            !e.contains("attempts"),
            "a certificate refusal is final: {e}"
        );
    }
    // The environment names the token file and the CA.
    let o = Command::new(bin())
        .args(["log", "alice/vm", "--store", &net.srv.url])
        .env("ROAMDISK_STORE_TOKEN_FILE", net.token("alice"))
        .env("ROAMDISK_STORE_CA", net.ca())
        .output()
        .unwrap();
    assert_success(&o, "roamdisk log with the credentials in the environment");
    // A session keeps the paths of its token file and CA, not the token,
    // and is served and committed with no credentials on the command line.
    let sess = dir.join("sess");
    net.ok_as(
        "alice",
        &["checkout", "alice/vm", "--session", path_str(&sess)],
    );
    let conf = std::fs::read_to_string(sess.join("session.toml")).unwrap();
    let token = std::fs::read_to_string(net.token("alice")).unwrap();
    assert!(
        conf.contains("token-file = ")
            && conf.contains("alice.token")
            && conf.contains("ca-file = "),
        "{conf}"
    );
    assert!(
        !conf.contains(token.trim()),
        "no secret in session.toml:\n{conf}"
    );
    let cmds = vec!["write -P 3 1M 128k".to_string()];
    qemu_io_session(dir, &sess, &cmds);
    qemu_io(path_str(&raw), &cmds);
    rd(&["commit", &session_spec(&sess), "-m", "over tls"]);
    let v2 = dir.join("v2.raw");
    net.ok_as(
        "alice",
        &["checkout", "alice/vm", "--output", path_str(&v2)],
    );
    assert_files_equal(&raw, &v2);
}

#[test]
fn missing_wrong_revoked_and_renewed_tokens() {
    let net = Net::start();
    let dir = net.dir();
    let raw = net.alice_commits(("disk.raw", 1 << 20, 6));
    let log = ["log", "alice/vm"];
    let ca = Some(net.ca());
    let ca = ca.as_deref();
    // No token.
    net.fails(&log, ca, None, &["needs a token", "--token-file"]);
    net.assert_logged(&[
        "user=anonymous",
        "peer=127.0.0.1:",
        "method=GET",
        "path=/v1/store",
        "status=401",
        "reason=no token",
    ]);
    // A token of the right form with the wrong secret.
    let wrong = dir.join("wrong.token");
    std::fs::write(&wrong, format!("alice.{}\n", "0".repeat(64))).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let refused = ["refused the token for alice", "check --token-file"];
    net.fails(&log, ca, Some(&wrong), &refused);
    net.assert_logged(&[
        "user=anonymous",
        "status=401",
        "reason=wrong token for user alice",
    ]);
    // A token file others may read works, with a warning.
    let alice = net.token("alice");
    std::fs::set_permissions(&alice, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_, err) = net.ok_as("alice", &log);
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&alice, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Revoked while the server runs: the next request is refused.
    net.user_cmd(&["revoke", "alice"]);
    net.fails_as("alice", &log, &[refused[0], "revoked"]);
    net.assert_logged(&["status=401", "reason=revoked token of user alice"]);
    net.ok_as("bob", &["commit", path_str(&raw), "--to", "bob/vm"]);
    // A new token lets alice in again; the old one stays out.
    let renewed = dir.join("alice2.token");
    net.user_cmd(&["token", "alice", "--token-file", path_str(&renewed)]);
    assert_success(
        &net.run(&log, ca, Some(&renewed)),
        "log with the renewed token",
    );
    net.fails_as("alice", &log, &refused);
    net.assert_logged(&["reason=wrong token for user alice", "path=/v1/store"]);
    // SIGHUP re-reads the users file; the server keeps serving.
    common::run("kill", &["-HUP", &net.srv.pid().to_string()]);
    assert_success(&net.run(&log, ca, Some(&renewed)), "log after SIGHUP");
    // A users file that no longer parses shuts the gate for everyone.
    let broken = "format = \"roamdisk-store-users\"\nversion = 7\n";
    std::fs::write(&net.users, broken).unwrap();
    net.fails_as("bob", &log, &["users file is broken", "version"]);
    net.assert_logged(&["user=anonymous", "status=503"]);
}

#[test]
fn alice_reads_and_writes_bobs_catalogs_only_as_shared() {
    let net = Net::start();
    let dir = net.dir();
    let one = net.cas.random_file("one.raw", 1 << 20, 1);
    let two = net.cas.random_file("two.raw", 1 << 20, 2);
    net.ok_as("bob", &["commit", path_str(&one), "--to", "bob/vm"]);
    net.ok_as("bob", &["commit", path_str(&one), "--to", "bob/private"]);
    net.ok_as("alice", &["commit", path_str(&two), "--to", "alice/vm"]);
    let commit_two = ["commit", path_str(&two), "--to", "bob/vm"];
    // Not shared: alice can neither read nor update bob/vm.
    let no_read = "user alice may not read catalog bob/vm";
    net.fails_as("alice", &["log", "bob/vm"], &[no_read]);
    net.assert_logged(&[
        "user=alice",
        "peer=127.0.0.1:",
        "method=GET",
        "path=/v1/refs/bob/vm",
        "status=403",
        &format!("reason={no_read}"),
    ]);
    net.fails_as("alice", &commit_two, &[no_read]);
    net.fails_as("alice", &["rm", "bob/vm", "--all"], &[no_read]);
    // Listing shows alice only what she may read.
    let (code, list) = net.curl(Some("alice"), "GET", "/v1/refs", None);
    assert_eq!((code, list.as_str()), (200, "alice/vm"));
    // Shared read-only: alice reads bob/vm, and still may not update it.
    net.user_cmd(&["share", "bob/vm", "--with", "alice"]);
    let got = dir.join("got.raw");
    net.ok_as("alice", &["checkout", "bob/vm", "--output", path_str(&got)]);
    assert_files_equal(&one, &got);
    let (_, list) = net.curl(Some("alice"), "GET", "/v1/refs", None);
    assert_eq!(list, "alice/vm\nbob/vm");
    let no_write = "user alice may not write catalog bob/vm";
    net.fails_as("alice", &commit_two, &[no_write]);
    // Labelled as the write it was (a PUT), not as a read.
    net.fails_as(
        "alice",
        &["rm", "bob/vm", "--all"],
        &[no_write, "cas: write: chunk server"],
    );
    net.fails_as(
        "alice",
        &["gc"],
        &["needs an admin", "cas: write: chunk server"],
    );
    net.assert_logged(&[
        "user=alice",
        "method=PUT",
        "path=/v1/refs/bob/vm",
        "status=403",
        &format!("reason={no_write}"),
    ]);
    let private = ["may not read catalog bob/private"];
    net.fails_as("alice", &["log", "bob/private"], &private);
    // Shared for writing: alice commits to bob/vm, bob sees it.
    net.user_cmd(&["share", "bob/vm", "--with", "alice", "--write"]);
    net.ok_as("alice", &commit_two);
    let got2 = dir.join("got2.raw");
    net.ok_as("bob", &["checkout", "bob/vm", "--output", path_str(&got2)]);
    assert_files_equal(&two, &got2);
    // Unshared again.
    net.user_cmd(&["unshare", "bob/vm", "--with", "alice"]);
    net.fails_as("alice", &["log", "bob/vm"], &[no_read]);
    // gc needs an admin; the admin's gc keeps every version.
    net.fails_as("alice", &["gc"], &["needs an admin"]);
    net.assert_logged(&["user=alice", "status=403", "needs an admin"]);
    let (out, _) = net.ok_as("root", &["gc", "--json"]);
    assert!(out.contains("\"removed_objects\": 0"), "{out}");
    let (_, list) = net.curl(Some("root"), "GET", "/v1/refs", None);
    assert_eq!(list, "alice/vm\nbob/private\nbob/vm");
    let listed = net.user_cmd(&["list"]);
    assert!(
        listed.contains("root") && listed.contains("yes"),
        "{listed}"
    );
}

#[test]
fn a_chunk_whose_bytes_do_not_match_its_name_is_refused() {
    // Local: looks for the refused chunk's file in the store.
    let net = Net::start_in(Cas::local());
    let body = net.cas.random_file("chunk.bin", 4096, 9);
    let id = "ab".repeat(32);
    let path = format!("/v1/objects/{id}");
    let (code, answer) = net.curl(Some("alice"), "PUT", &path, Some(&body));
    assert_eq!(code, 422, "{answer}");
    net.assert_logged(&[
        "user=alice",
        "method=PUT",
        &format!("path={path}"),
        "status=422",
    ]);
    assert!(!cas_common::object_file(&net.cas.store, &id).exists());
    let (code, _) = net.curl(None, "PUT", &path, Some(&body));
    assert_eq!(code, 401);
    net.assert_logged(&["user=anonymous", "method=PUT", "status=401"]);
    let (code, _) = net.curl(
        Some("alice"),
        "DELETE",
        &format!("{path}?older-than=0"),
        None,
    );
    assert_eq!(code, 403, "removing objects needs an admin");
    net.assert_logged(&["user=alice", "method=DELETE", "needs an admin"]);
}

/// `timeout 20 roamdisk store serve ARGS`, which must fail at once;
/// returns stderr.
fn serve_refused(args: &[&str]) -> String {
    let o = Command::new("timeout")
        .arg("20")
        .arg(bin())
        .args([&["store", "serve"], args].concat())
        .output()
        .expect("run timeout");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_ne!(
        o.status.code(),
        Some(124),
        "store serve {args:?} kept running"
    );
    assert!(!o.status.success(), "{err}");
    err
}

#[test]
fn an_open_server_stays_on_loopback() {
    let cas = Cas::new();
    let e = serve_refused(&[cas.s(), "--listen", "0.0.0.0:0"]);
    assert!(
        e.contains("refusing to serve") && e.contains("--users") && e.contains("--insecure"),
        "{e}"
    );
    let users = cas.dir().join("users.toml");
    rd(&[
        "store",
        "user",
        "add",
        "alice",
        "--users",
        path_str(&users),
        "-q",
    ]);
    let e = serve_refused(&[
        cas.s(),
        "--listen",
        "0.0.0.0:0",
        "--users",
        path_str(&users),
    ]);
    assert!(e.contains("without TLS") && e.contains("--tls-cert"), "{e}");
}
