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
    let out = roamdisk(&["trace", "cat", trace]);
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).lines().count() as u64 - 1
}

#[test]
fn fifty_clients_replay_one_trace_against_one_server() {
    let dir = tempdir();
    let d = dir.path();
    let trace = d.join("boot1.rdtrace");
    let t = trace.to_str().unwrap();
    let out = roamdisk(&[
        "trace",
        "synth",
        "boot",
        "--clients",
        "1",
        "--requests",
        "300",
        "-o",
        t,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let per_client = records(t);
    let srv = Server::start(d, &["mem:8G"]);
    let out = roamdisk(&[
        "replay",
        t,
        &srv.uri(),
        "--clients",
        "50",
        "--per",
        "client",
        "--stagger",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let trace = d.join("storm.rdtrace");
    let t = trace.to_str().unwrap();
    let out = roamdisk(&[
        "trace",
        "synth",
        "boot",
        "--clients",
        "50",
        "--requests",
        "100",
        "-o",
        t,
    ]);
    assert!(out.status.success());
    let srv = Server::start(d, &["mem:8G"]);
    let out = roamdisk(&[
        "replay",
        t,
        &srv.uri(),
        "--per",
        "client",
        "--plot",
        d.join("storm").to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = client_rows(&stdout);
    assert_eq!(rows.len(), 50, "{stdout}");
    assert!(rows.iter().all(|r| r.2 > 0.0 && r.3 == 0));
    for f in [
        "storm-clients.png",
        "storm-clients.svg",
        "storm-latency.png",
    ] {
        assert!(d.join(f).exists(), "{f} missing");
    }
}
