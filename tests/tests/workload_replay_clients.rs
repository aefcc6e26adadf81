//! Issue 6 proof: replay with N = 50 clients against one `roamdisk serve`
//! completes and reports a time for every client (TransCom's IOEmu: one
//! thread and one NBD connection per emulated client).

mod common;
use common::*;

/// Rows of the per-client table: (client, requests, seconds, errors).
fn client_rows(stdout: &str) -> Vec<(u32, u64, f64, u64)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for l in stdout.lines() {
        if l.trim_start().starts_with("client") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() != 6 {
            continue;
        }
        if let (Ok(c), Ok(n), Ok(s), Ok(e)) =
            (f[0].parse(), f[1].parse(), f[3].parse(), f[5].parse())
        {
            rows.push((c, n, s, e));
        }
    }
    rows
}

fn records(trace: &str) -> u64 {
    rd(&["trace", "cat", trace]).lines().count() as u64 - 1
}

/// A new boot trace `NAME` in DIR, made by `roamdisk trace synth boot
/// OPTS`; returns its path.
fn boot_trace(dir: &std::path::Path, name: &str, opts: &str) -> String {
    let trace = dir.join(name);
    trace_synth("boot", &trace, opts);
    path_str(&trace).to_string()
}

#[test]
fn fifty_clients_replay_one_trace_against_one_server() {
    let dir = tempdir();
    let t = &boot_trace(dir.path(), "boot1.rdtrace", "--clients 1 --requests 300");
    let per_client = records(t);
    let srv = Server::start(dir.path(), &["mem:8G"]);
    let opts = "--clients 50 --per client --stagger 2";
    let stdout = rd(&argv(&["replay", t, &srv.uri()], opts));
    let rows = client_rows(&stdout);
    assert_eq!(rows.len(), 50, "{stdout}");
    for (i, (c, n, s, e)) in rows.iter().enumerate() {
        assert_eq!(*c, i as u32);
        assert_eq!(*n, per_client, "client {c}");
        assert!(*s > 0.0, "client {c} has no runtime");
        assert_eq!(*e, 0);
    }
    assert!(stdout.contains("over 50 clients"), "{stdout}");
    assert!(
        stdout.contains(&format!("replayed {} requests", 50 * per_client)),
        "{stdout}"
    );
    assert!(srv.stop().success());
}

#[test]
fn a_generated_boot_storm_replays_per_client() {
    let dir = tempdir();
    let d = dir.path();
    let t = &boot_trace(d, "storm.rdtrace", "--clients 50 --requests 100");
    let srv = Server::start(d, &["mem:8G"]);
    let plot = d.join("storm");
    let stdout = rd(&argv(
        &["replay", t, &srv.uri(), "--plot", path_str(&plot)],
        "--per client",
    ));
    let rows = client_rows(&stdout);
    assert_eq!(rows.len(), 50, "{stdout}");
    assert!(rows.iter().all(|r| r.2 > 0.0 && r.3 == 0));
    for f in "storm-clients.png storm-clients.svg storm-latency.png".split(' ') {
        assert!(d.join(f).exists(), "{f} missing");
    }
}
