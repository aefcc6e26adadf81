//! `roamdisk server` with a `[cache]` and a `metrics` address (issue 13):
//! real clients (qemu-io over TLS-PSK and over the Unix socket, nbdinfo)
//! drive the real binary while `/metrics` is scraped. Each client's
//! bytes and requests are counted apart, even on a read-only image they
//! share; the cache counts exactly the block reads that reached it; an
//! overlay's size grows with a write; open connections and refusals
//! (no grant, a plain client on TLS, a key of no client, a wrong key) are
//! counted by reason; `server status` (table and `--json`) agrees with `/metrics`;
//! and a trace replayed through the server counts the hits and misses
//! `roamdisk sim --sharing shared` counts for the same trace, policy,
//! size, block size and shards, over two images sharing the cache.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

/// A site: a golden image `desk`, alice and bob with views of it (PSK
/// over TCP), `local` (this uid, on the Unix socket) with it read-only.
struct Site {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
    metrics: u16,
    /// qemu's tls-creds-psk folder (keys.psk holds every key).
    qemu_psk: PathBuf,
}

/// A server config in DIR (socket `srv.sock`) with its metrics endpoint on
/// a free port, then REST: the config and the port.
fn config_with_metrics(dir: &Path, rest: &str) -> (PathBuf, u16) {
    let metrics = free_port();
    let config = write_server_config(
        dir,
        &format!("socket = \"srv.sock\"\nmetrics = \"127.0.0.1:{metrics}\"\n{rest}"),
    );
    (config, metrics)
}

fn site(cache: &str) -> Site {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    random_file(&dir.join("desk.img"), 16 * MIB, 7);
    let keys = dir.join("server.psk");
    for who in ["alice", "bob", "mallory"] {
        psk_add(&keys, who);
    }
    let qemu_psk = qemu_psk_dir(&dir, "qemu-psk", &keys);
    let (config, metrics) = config_with_metrics(
        &dir,
        &format!(
            r#"listen = ["127.0.0.1:0"]
tls-psk = "server.psk"
{cache}{desk}{alice}{bob}{local}"#,
            desk = raw_image("desk", &dir.join("desk.img")),
            alice = psk_client("alice", r#"view = ["desk"]"#),
            bob = psk_client("bob", r#"view = ["desk"]"#),
            local = local_client("local", r#"read-only = ["desk"]"#),
        ),
    );
    Site {
        _tmp: tmp,
        dir,
        config,
        metrics,
        qemu_psk,
    }
}

/// `qemu-io` as `who` over TLS-PSK, running `cmds` on `desk`.
fn qemu_io_psk(site: &Site, port: u16, who: &str, cmds: &[&str]) -> Command {
    let creds = qemu_psk_creds(&site.qemu_psk, who);
    let mut c = Command::new("qemu-io");
    c.args(qemu_io_tls_args(creds, port, "desk", cmds));
    c
}

fn ok(mut c: Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    check_qemu_io(&out, what);
    stdout_text(&out)
}

/// GET http://127.0.0.1:PORT/PATH with curl.
fn get(port: u16, path: &str) -> String {
    run_stdout(
        "curl",
        &[
            "-sSf",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{port}{path}"),
        ],
    )
}

/// The samples of a scrape, checked against the text format as we go:
/// each sample's family has HELP and TYPE lines before it, counters end
/// in `_total`, a histogram's `+Inf` bucket equals its `_count`.
fn scrape(port: u16) -> HashMap<String, f64> {
    let text = get(port, "/metrics");
    assert!(
        text.ends_with('\n'),
        "the last line must end with a newline"
    );
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: Vec<String> = Vec::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.push(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split(' ');
            let (name, kind) = (w.next().unwrap(), w.next().unwrap());
            assert!(helped.iter().any(|h| h == name), "TYPE before HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "a counter without _total: {line}");
            }
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("NAME VALUE");
        let name = key.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let f = name.strip_suffix(s)?;
                (types.get(f).map(String::as_str) == Some("histogram")).then_some(f)
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "no TYPE for {line}");
        samples.insert(key.to_string(), value.parse::<f64>().expect("a number"));
    }
    // +Inf bucket = count, for every histogram series.
    for (k, v) in &samples {
        if let Some(series) = k.strip_suffix(",le=\"+Inf\"}") {
            let count = series.replacen("_bucket{", "_count{", 1) + "}";
            assert_eq!(samples.get(&count), Some(v), "{k} vs {count}");
        }
    }
    samples
}

fn sample(m: &HashMap<String, f64>, key: &str) -> u64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in the scrape")) as u64
}

fn per(name: &str, client: &str) -> String {
    format!("{name}{{client=\"{client}\",image=\"desk\"}}")
}

fn reqs(client: &str, op: &str) -> String {
    format!("roamdisk_server_requests_total{{client=\"{client}\",image=\"desk\",op=\"{op}\"}}")
}

/// Wait until `f` holds for a fresh scrape.
fn until(port: u16, what: &str, f: impl Fn(&HashMap<String, f64>) -> bool) {
    let t0 = Instant::now();
    loop {
        let m = scrape(port);
        if f(&m) {
            return;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let mut seen: Vec<_> = m
                .iter()
                .filter(|(k, _)| !k.contains("_bucket") && !k.contains("duration"))
                .collect();
            seen.sort_by(|a, b| a.0.cmp(b.0));
            panic!("never: {what}; last scrape:\n{seen:#?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn metrics_count_each_client_the_cache_and_the_overlays() {
    require_tool("qemu-io");
    require_tool("curl");
    require_tool("psktool");
    require_tool("nbdinfo");
    // 8 MiB of 4 KiB blocks in 16 shards: the 768 blocks read below
    // all stay (no eviction), so hits and misses are known exactly.
    let s = site("[cache]\nsize = \"8M\"");
    let srv = ServerProc::start_tcp(&s.config, s.dir.join("server.log"));
    let port = srv.port();
    let m = scrape(s.metrics);
    assert_eq!(
        sample(&m, "roamdisk_server_cache_capacity_bytes{policy=\"FMPQ\"}"),
        8 * MIB
    );
    assert_eq!(
        sample(&m, "roamdisk_server_cache_misses_total{image=\"desk\"}"),
        0
    );

    // alice reads 1 MiB (256 misses), then writes one whole 64 KiB
    // cluster of her view (no read of the golden image).
    ok(
        qemu_io_psk(&s, port, "alice", &["read 0 1M"]),
        "alice reads",
    );
    let m = scrape(s.metrics);
    let before = m
        .get(&per("roamdisk_server_overlay_allocated_bytes", "alice"))
        .copied()
        .unwrap_or(0.0) as u64;
    assert!(before < 64 << 10, "nothing written yet: {before}");
    ok(
        qemu_io_psk(&s, port, "alice", &["write -P 0xa1 1M 64k", "flush"]),
        "alice writes",
    );
    // bob reads 2 MiB twice (512 misses, then 512 hits), on one
    // connection kept open while we look.
    let mut bob = qemu_io_psk(&s, port, "bob", &[]);
    let mut bob = bob
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // (qemu-io takes one command per wake-up from a pipe: one at a time.)
    for pass in 1..=2u64 {
        writeln!(bob.stdin.as_mut().unwrap(), "read 4M 2M").unwrap();
        until(s.metrics, "bob connected and read 2 MiB more", |m| {
            m.get(&per("roamdisk_server_connections", "bob")) == Some(&1.0)
                && m.get(&per("roamdisk_server_read_bytes_total", "bob"))
                    == Some(&((pass * 2 * MIB) as f64))
        });
    }
    drop(bob.stdin.take());
    let out = bob.wait_with_output().unwrap();
    check_qemu_io(&out, "bob reads");
    // local reads 512 KiB of alice's first MiB, read-only: 128 hits.
    let desk = format!(
        "nbd+unix:///desk?socket={}",
        s.dir.join("srv.sock").display()
    );
    let out = Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", "read 0 512k", &desk])
        .output()
        .unwrap();
    check_qemu_io(&out, "local reads");
    // Refused: local asks for an image it has no grant for; a plain
    // client on the TLS-only TCP listener.
    let out = Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", "read 0 4k"])
        .arg(desk.replace("/desk?", "/nothing?"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/desk"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    // mallory has a key the server knows but is no client; a key the
    // server does not know fails the TLS handshake.
    let keys = s.dir.join("server.psk");
    let wrong = s.dir.join("wrong.psk");
    psk_add(&wrong, "alice");
    for (who, file) in [("mallory", &keys), ("alice", &wrong)] {
        let out = Command::new("nbdinfo")
            .arg(format!(
                "nbds://{who}@127.0.0.1:{port}/desk?tls-psk-file={}",
                file.display()
            ))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{who}");
    }

    until(s.metrics, "bob disconnected", |m| {
        m.get(&per("roamdisk_server_connections", "bob")) == Some(&0.0)
    });
    let m = scrape(s.metrics);
    // Per-client bytes: exactly what each qemu-io read and wrote.
    for (who, read, written) in [
        ("alice", MIB, 64 << 10),
        ("bob", 4 * MIB, 0),
        ("local", 512 << 10, 0),
    ] {
        assert_eq!(
            sample(&m, &per("roamdisk_server_read_bytes_total", who)),
            read,
            "{who}"
        );
        assert_eq!(
            sample(&m, &per("roamdisk_server_written_bytes_total", who)),
            written,
            "{who}"
        );
        assert!(sample(&m, &reqs(who, "read")) >= 1, "{who}");
        assert_eq!(sample(&m, &per("roamdisk_server_connections", who)), 0);
    }
    assert_eq!(sample(&m, &reqs("alice", "write")), 1);
    assert_eq!(
        sample(&m, &per("roamdisk_server_connections_total", "alice")),
        2
    );
    assert_eq!(
        sample(&m, &per("roamdisk_server_connections_total", "bob")),
        1
    );
    // The cache saw every block read, none of the write: 256 + 2 * 512 +
    // 128 accesses, of which the second pass of bob and local's hit.
    let hits = sample(&m, "roamdisk_server_cache_hits_total{image=\"desk\"}");
    let misses = sample(&m, "roamdisk_server_cache_misses_total{image=\"desk\"}");
    let read_blocks = (MIB + 4 * MIB + (512 << 10)) / 4096;
    assert_eq!(hits + misses, read_blocks);
    assert_eq!((hits, misses), (512 + 128, 256 + 512));
    assert_eq!(
        sample(&m, "roamdisk_server_cache_evictions_total{image=\"desk\"}"),
        0
    );
    assert_eq!(
        sample(&m, "roamdisk_server_cache_bytes{image=\"desk\"}"),
        misses * 4096
    );
    // alice's overlay grew by the cluster she wrote; bob's stayed empty.
    let alloc = sample(&m, &per("roamdisk_server_overlay_allocated_bytes", "alice"));
    assert!(alloc >= before + (64 << 10), "{before} -> {alloc}");
    assert_eq!(
        sample(&m, &per("roamdisk_server_overlay_mapped_bytes", "alice")),
        64 << 10
    );
    assert_eq!(
        sample(&m, &per("roamdisk_server_overlay_mapped_bytes", "bob")),
        0
    );
    // Refusals, per reason.
    assert_eq!(
        sample(&m, "roamdisk_server_refusals_total{reason=\"not_granted\"}"),
        1
    );
    assert!(
        sample(
            &m,
            "roamdisk_server_refusals_total{reason=\"tls_required\"}"
        ) >= 1
    );
    for reason in ["unknown_client", "tls_failed"] {
        let key = format!("roamdisk_server_refusals_total{{reason=\"{reason}\"}}");
        assert_eq!(sample(&m, &key), 1, "{reason}");
    }

    // `server status`: the JSON document agrees with the scrape...
    let json = rd(&["server", "status", path_str(&s.config), "--json"]);
    let st: serde_json::Value = serde_json::from_str(&json).expect("status --json parses");
    assert_eq!(st["format"], "roamdisk-server-status");
    assert_eq!(st["cache"]["policy"], "FMPQ");
    assert_eq!(st["cache"]["hits"].as_u64(), Some(hits));
    assert_eq!(st["cache"]["misses"].as_u64(), Some(misses));
    assert_eq!(st["images"][0]["cache"]["hits"].as_u64(), Some(hits));
    let clients = st["clients"].as_array().unwrap();
    for c in clients {
        let who = c["client"].as_str().unwrap();
        assert_eq!(
            c["ops"]["read"]["bytes"].as_u64(),
            Some(sample(&m, &per("roamdisk_server_read_bytes_total", who))),
            "{who}"
        );
        assert_eq!(
            c["ops"]["read"]["requests"].as_u64(),
            Some(sample(&m, &reqs(who, "read"))),
            "{who}"
        );
        assert!(c["ops"]["read"]["latency_p99_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(clients.len(), 3);
    assert_eq!(st["refusals"]["not_granted"].as_u64(), Some(1));
    // ... and so does the table.
    let table = rd(&["server", "status", path_str(&s.config)]);
    let row = |who: &str| {
        table
            .lines()
            .find(|l| l.starts_with(who))
            .unwrap_or_else(|| panic!("no row for {who}:\n{table}"))
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("alice")[..3], ["alice", "desk", "view"], "{table}");
    assert_eq!(row("local")[..3], ["local", "desk", "read-only"], "{table}");
    assert_eq!(row("bob")[6..8], ["4", "MiB"], "{table}");
    let ratio = format!(
        "hit ratio {:.1}%",
        hits as f64 * 100.0 / (hits + misses) as f64
    );
    assert!(table.contains(&ratio), "{ratio}\n{table}");
    assert!(table.contains("not_granted 1"), "{table}");
    srv.stop();

    // The server is gone: status says so.
    let e = rd_fail(&["server", "status", path_str(&s.config)]);
    assert!(e.contains("is the server running?"), "{e}");
}

#[test]
fn status_without_a_metrics_key_says_what_to_add() {
    let s = site("");
    let text = std::fs::read_to_string(&s.config)
        .unwrap()
        .replace(&format!("metrics = \"127.0.0.1:{}\"\n", s.metrics), "");
    std::fs::write(&s.config, text).unwrap();
    let e = rd_fail(&["server", "status", path_str(&s.config)]);
    assert!(e.contains("no metrics key"), "{e}");
    let help = rd(&["server", "status", "--help"]);
    assert!(
        help.contains("Examples:") && help.contains("--json"),
        "{help}"
    );
}

/// A read-only trace over two devices, device and block drawn from a hot
/// set most of the time: reuse within each image, and both competing for
/// one cache. CSV.
fn two_device_trace(path: &Path, requests: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    writeln!(f, "time_ns,client,device,op,offset,len,fragment").unwrap();
    let mut x = 17u64;
    let mut rnd = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    for i in 0..requests {
        let dev = rnd(2);
        let off = if rnd(10) < 7 {
            rnd(2 * MIB)
        } else {
            rnd(30 * MIB)
        };
        let len = [512, 4096, 4096, 8192, 16384, 65536][rnd(6) as usize];
        writeln!(f, "{},0,{dev},read,{off},{len},0", 1000 * i).unwrap();
    }
}

#[test]
fn server_cache_hits_equal_the_simulators_for_a_two_image_trace() {
    let tmp = tempdir();
    let dir = tmp.path();
    let trace = dir.join("two.csv");
    two_device_trace(&trace, 6000);
    // Data everywhere: the server answers reads of ranges it knows to be
    // holes without reading, so a sparse image would not reach the cache.
    for d in 0..2 {
        random_file(&dir.join(format!("img{d}.raw")), 32 * MIB, d + 1);
    }
    for (policy, size, block, shards) in [
        ("fmpq", "1M", "4K", "1"),
        ("fmpq", "2M", "4K", "16"),
        ("lru", "2M", "16K", "4"),
        ("2q", "1M", "4K", "4"),
        ("s3fifo", "4M", "64K", "2"),
    ] {
        let run = dir.join(format!("{policy}-{size}-{block}-{shards}"));
        std::fs::create_dir(&run).unwrap();
        let (config, _) = config_with_metrics(
            &run,
            &format!(
                r#"[cache]
policy = "{policy}"
size = "{size}"
block = "{block}"
shards = {shards}
{}{}{}"#,
                raw_image("img0", &dir.join("img0.raw")),
                raw_image("img1", &dir.join("img1.raw")),
                local_client("local", r#"read-only = ["img0", "img1"]"#),
            ),
        );
        let srv = ServerProc::start(&config, run.join("server.log"));
        let sock = run.join("srv.sock");
        // One stream in trace order: each request to its image's export.
        rd(&[
            "replay",
            path_str(&trace),
            "--per",
            "client",
            "--map",
            &format!("0=nbd+unix:///img0?socket={}", sock.display()),
            "--map",
            &format!("1=nbd+unix:///img1?socket={}", sock.display()),
            "-q",
        ]);
        let json = rd(&["server", "status", path_str(&config), "--json"]);
        let st: serde_json::Value = serde_json::from_str(&json).unwrap();
        srv.stop();
        let server = (
            st["cache"]["hits"].as_u64().unwrap(),
            st["cache"]["misses"].as_u64().unwrap(),
        );
        let sim = sim_counts(path_str(&trace), policy, size, block, shards);
        assert_eq!(
            server, sim,
            "{policy} {size} {block} x{shards}: server (hits, misses) vs sim"
        );
        assert!(
            server.0 > 1000,
            "{policy}: the trace should have reuse: {server:?}"
        );
        // Each image has its share, and the shares add up.
        let per_image: Vec<(u64, u64)> = st["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["cache"]["hits"].as_u64().unwrap(),
                    i["cache"]["misses"].as_u64().unwrap(),
                )
            })
            .collect();
        assert!(
            per_image.iter().all(|&(h, m)| h > 0 && m > 0),
            "{per_image:?}"
        );
        assert_eq!(
            per_image.iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            server
        );
    }
}
