//! Who may read a `roamdisk server`'s metrics (issue 26): the endpoint on
//! a Unix socket (mode 0660, removed when the server stops), behind a
//! bearer token (read again per request, so a new token works without a
//! restart; a file other users can read is refused), and over HTTPS with
//! the server's certificate. curl is the scraper; `roamdisk server status`
//! must get through each of them with what the config says.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::certs::{make_ca, make_leaf, SERVER_EXT};
use common::*;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// DIR/token holding `token`, mode 0600.
fn write_token(dir: &Path, token: &str) -> PathBuf {
    let p = dir.join("token");
    std::fs::write(&p, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A config in DIR: the NBD socket, one golden image, a local client, then
/// REST (the metrics keys).
fn config(dir: &Path, rest: &str) -> PathBuf {
    random_file(&dir.join("desk.img"), 1 << 20, 3);
    write_server_config(
        dir,
        &format!(
            "socket = \"srv.sock\"\n{rest}\n{}{}",
            raw_image("desk", &dir.join("desk.img")),
            local_client("local", r#"read-only = ["desk"]"#)
        ),
    )
}

/// curl ARGS plus `-w %{http_code}` and the token header if any: the HTTP
/// status (000 when no HTTP answer came) and the body.
fn curl(args: &[&str], token: Option<&str>) -> (String, String) {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = c.args(args).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

#[test]
fn metrics_on_a_unix_socket_behind_a_token() {
    let tmp = tempdir();
    let dir = tmp.path();
    write_token(dir, TOKEN);
    let cfg = config(
        dir,
        "metrics = \"unix:m.sock\"\nmetrics-token-file = \"token\"",
    );
    let srv = ServerProc::start(&cfg, dir.join("server.log"));
    let sock = dir.join("m.sock");
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660, "socket mode");
    let at = |path: &str| {
        [
            "--unix-socket".to_string(),
            path_str(&sock).to_string(),
            format!("http://localhost{path}"),
        ]
    };
    let args = at("/metrics");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let (code, body) = curl(&args, None);
    assert_eq!(code, "401", "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    srv.assert_logged(&["metrics", "without a token"]);
    let (code, _) = curl(&args, Some("not-the-token-at-all-0000"));
    assert_eq!(code, "401");
    srv.assert_logged(&["metrics", "wrong token"]);
    let (code, body) = curl(&args, Some(TOKEN));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("roamdisk_server_"), "{body}");

    let table = rd(&["server", "status", path_str(&cfg)]);
    assert!(table.contains("desk"), "{table}");

    // A new token works at once, the old one no more.
    let fresh = "fedcba9876543210fedcba9876543210";
    write_token(dir, fresh);
    assert_eq!(curl(&args, Some(TOKEN)).0, "401");
    assert_eq!(curl(&args, Some(fresh)).0, "200");
    let json = rd(&["server", "status", "--json", path_str(&cfg)]);
    assert!(json.contains("roamdisk-server-status"), "{json}");

    // A status client with the wrong token is told so.
    std::fs::write(
        dir.join("other.toml"),
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("\"token\"", "\"token2\""),
    )
    .unwrap();
    let p = dir.join("token2");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = rd_fail(&["server", "status", path_str(&dir.join("other.toml"))]);
    assert!(e.contains("refused") && e.contains("token2"), "{e}");

    srv.stop();
    assert!(!sock.exists(), "the metrics socket is removed at exit");
    let e = rd_fail(&["server", "status", path_str(&cfg)]);
    assert!(e.contains("is the server running?"), "{e}");
}

#[test]
fn metrics_over_https_with_the_servers_certificate() {
    let tmp = tempdir();
    let dir = tmp.path();
    let ca = dir.join("ca");
    make_ca(&ca, "metrics-ca");
    make_leaf(&ca, "server", SERVER_EXT);
    write_token(dir, TOKEN);
    let port = free_port();
    let cfg = config(
        dir,
        &format!(
            "tls-cert = \"ca/server-cert.pem\"\ntls-key = \"ca/server-key.pem\"\n\
             metrics = \"127.0.0.1:{port}\"\nmetrics-tls = true\nmetrics-token-file = \"token\""
        ),
    );
    let srv = ServerProc::start(&cfg, dir.join("server.log"));
    assert!(
        srv.log_text()
            .contains(&format!("metrics on https://127.0.0.1:{port}")),
        "{}",
        srv.log_text()
    );
    let cafile = path_str(&ca.join("ca-cert.pem")).to_string();
    let url = format!("https://127.0.0.1:{port}/metrics");
    let (code, body) = curl(&["--cacert", &cafile, &url], Some(TOKEN));
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("roamdisk_server_"), "{body}");
    assert_eq!(curl(&["--cacert", &cafile, &url], None).0, "401");
    // Plain HTTP gets no HTTP answer.
    let (code, _) = curl(&[&format!("http://127.0.0.1:{port}/metrics")], Some(TOKEN));
    assert_ne!(code, "200");
    // `server status` trusts the server's own certificate.
    let table = rd(&["server", "status", path_str(&cfg)]);
    assert!(table.contains("desk"), "{table}");
    srv.stop();
}

#[test]
fn unsafe_metrics_settings_are_refused_at_start() {
    let tmp = tempdir();
    let dir = tmp.path();
    let token = write_token(dir, TOKEN);
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = free_port();
    let cfg = config(
        dir,
        &format!("metrics = \"127.0.0.1:{port}\"\nmetrics-token-file = \"token\""),
    );
    let e = rd_fail(&["server", path_str(&cfg)]);
    assert!(
        e.contains("readable by every user") && e.contains("chmod"),
        "{e}"
    );
    std::fs::write(&token, "short\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = rd_fail(&["server", path_str(&cfg)]);
    assert!(e.contains("at least 16"), "{e}");
    let cfg = config(dir, "metrics = \"0.0.0.0:9477\"");
    let e = rd_fail(&["server", path_str(&cfg)]);
    assert!(e.contains("reachable from other hosts"), "{e}");
    std::fs::write(dir.join("m.sock"), "a file").unwrap();
    let cfg = config(dir, "metrics = \"unix:m.sock\"");
    let e = rd_fail(&["server", path_str(&cfg)]);
    assert!(e.contains("not a socket"), "{e}");
}
