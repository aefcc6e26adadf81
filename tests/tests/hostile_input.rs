//! Hostile and mistyped input, tried as a user would type it: malformed
//! environment (S3 endpoints, regions, keys), URIs, sizes, layer specs,
//! junk files given as images, stores, caches, configurations, traces and
//! plans. Every case must end within its time limit with a clear error:
//! exit status 1 or 2, a message on stderr, never a panic (status 101) and
//! never a hang. The table of cases is `docs/hostile-input.md`.

#![allow(
    clippy::disallowed_methods,
    reason = "the cases run with this test's PATH"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bin, path_str, tempdir};

/// One mistyped command: what it is, the arguments (`{DIR}` is replaced by
/// the test's folder of junk files), extra environment.
struct Case {
    what: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const fn case(
    what: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
) -> Case {
    Case { what, args, env }
}

/// Keys that let an S3 client get as far as the endpoint.
const KEYS: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
];

const CASES: &[Case] = &[
    // Environment: S3 endpoints, regions, credentials.
    case(
        "endpoint without a scheme",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "127.0.0.1:9000"),
        ],
    ),
    case(
        "endpoint scheme only",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://"),
        ],
    ),
    case(
        "endpoint of another scheme",
        &["store", "init", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "ftp://127.0.0.1"),
        ],
    ),
    case(
        "endpoint with a space",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://exa mple"),
        ],
    ),
    case(
        "endpoint with a bad port",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:99999"),
        ],
    ),
    case(
        "endpoint where nothing listens",
        &["log", "u/vm", "--store", "s3://bucket-x?retries=0"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ],
    ),
    case(
        "endpoint in the query, without a scheme",
        &[
            "log",
            "u/vm",
            "--store",
            "s3://bucket-x?endpoint=localhost:9000",
        ],
        KEYS,
    ),
    case(
        "region with a space",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_REGION", "us east"),
        ],
    ),
    case(
        "region with a slash",
        &["log", "u/vm", "--store", "s3://bucket-x?region=a/b"],
        KEYS,
    ),
    case(
        "no credentials at all",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[("AWS_ENDPOINT_URL", "http://127.0.0.1:1")],
    ),
    case(
        "a key without its secret",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ],
    ),
    case(
        "a secret without its key",
        &["log", "u/vm", "--store", "s3://bucket-x"],
        &[
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ],
    ),
    case(
        "ROAMDISK_STORE of a junk file",
        &["log", "u/vm"],
        &[("ROAMDISK_STORE", "{DIR}/junk.bin")],
    ),
    case(
        "ROAMDISK_STORE of an unknown scheme",
        &["log", "u/vm"],
        &[("ROAMDISK_STORE", "gopher://x")],
    ),
    case(
        "RUST_LOG junk",
        &["info", "raw:{DIR}/nothing"],
        &[("RUST_LOG", "=[[[,,=")],
    ),
    // Store locations.
    case(
        "S3 bucket in capitals",
        &["log", "u/vm", "--store", "s3://Bucket"],
        KEYS,
    ),
    case(
        "S3 bucket too short",
        &["log", "u/vm", "--store", "s3://ab"],
        KEYS,
    ),
    case(
        "S3 prefix with ..",
        &["log", "u/vm", "--store", "s3://bucket-x/../y"],
        KEYS,
    ),
    case(
        "S3 secret in the query",
        &[
            "log",
            "u/vm",
            "--store",
            "s3://bucket-x?secret_access_key=x",
        ],
        KEYS,
    ),
    case(
        "S3 unknown setting",
        &["log", "u/vm", "--store", "s3://bucket-x?colour=blue"],
        KEYS,
    ),
    case(
        "S3 parallel not a number",
        &["log", "u/vm", "--store", "s3://bucket-x?parallel=lots"],
        KEYS,
    ),
    case(
        "S3 timeout not a duration",
        &["log", "u/vm", "--store", "s3://bucket-x?timeout=soon"],
        &[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ],
    ),
    case(
        "S3 credentials of an unknown kind",
        &["log", "u/vm", "--store", "s3://bucket-x?credentials=imds"],
        KEYS,
    ),
    case(
        "HTTP store with no host",
        &["log", "u/vm", "--store", "http://"],
        &[],
    ),
    case(
        "HTTP store where nothing listens",
        &["log", "u/vm", "--store", "http://127.0.0.1:1"],
        &[],
    ),
    case(
        "store of an unknown scheme",
        &["log", "u/vm", "--store", "ftp://x/y"],
        &[],
    ),
    case(
        "store that is a file",
        &["log", "u/vm", "--store", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "store that does not exist",
        &["log", "u/vm", "--store", "{DIR}/nothing"],
        &[],
    ),
    case(
        "store whose settings are junk",
        &["log", "u/vm", "--store", "{DIR}/badstore"],
        &[],
    ),
    case(
        "store init over a file",
        &["store", "init", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "image name without a user",
        &["log", "vm", "--store", "{DIR}/store"],
        &[],
    ),
    case(
        "image name with a slash too many",
        &["log", "a/b/c", "--store", "{DIR}/store"],
        &[],
    ),
    case(
        "version that is not there",
        &[
            "checkout",
            "u/vm@ffff",
            "--output",
            "{DIR}/out.raw",
            "--store",
            "{DIR}/store",
        ],
        &[],
    ),
    case(
        "date that is not a date",
        &[
            "checkout",
            "u/vm@2026-13-45",
            "--output",
            "{DIR}/out.raw",
            "--store",
            "{DIR}/store",
        ],
        &[],
    ),
    // Layer specs and sizes.
    case(
        "mem of 2^64-1 bytes",
        &["info", "mem:18446744073709551615"],
        &[],
    ),
    case("mem of 0 bytes", &["info", "mem:0"], &[]),
    case("mem of a negative size", &["info", "mem:-1"], &[]),
    case("mem of an unknown unit", &["info", "mem:1Q"], &[]),
    case("mem of 2^70 bytes", &["info", "mem:1048576P"], &[]),
    case("unknown layer", &["info", "floppy:a.img"], &[]),
    case("empty spec", &["info", ""], &[]),
    case("raw of a missing file", &["info", "raw:{DIR}/nothing"], &[]),
    case("raw of a folder", &["info", "raw:{DIR}"], &[]),
    case("cow without a base", &["info", "cow:{DIR}/o.img"], &[]),
    case(
        "cow over junk",
        &["info", "cow:{DIR}/jo.img:raw:{DIR}/junk.bin"],
        &[],
    ),
    case("lbs of junk", &["info", "lbs:{DIR}/jl.lbsd"], &[]),
    case("lbs of empty files", &["lbs", "info", "{DIR}/el.lbsd"], &[]),
    case(
        "lbs create of 0 bytes",
        &["lbs", "create", "{DIR}/zero.lbsd", "--size", "0"],
        &[],
    ),
    case(
        "lbs create of 2^64 bytes",
        &["lbs", "create", "{DIR}/huge.lbsd", "--size", "16384P"],
        &[],
    ),
    case(
        "lbs create of a huge block",
        &[
            "lbs",
            "create",
            "{DIR}/hb.lbsd",
            "--size",
            "1G",
            "--block-size",
            "8G",
        ],
        &[],
    ),
    case("lbs check of junk", &["lbs", "check", "{DIR}/jl.lbsd"], &[]),
    case("nbd URI without a socket", &["info", "nbd+unix:///"], &[]),
    case(
        "nbd URI with a bad port",
        &["info", "nbd://127.0.0.1:99999"],
        &[],
    ),
    case(
        "nbd URI where nothing listens",
        &["info", "nbd://127.0.0.1:1"],
        &[],
    ),
    case(
        "cas of a folder that is no session",
        &["info", "cas:{DIR}"],
        &[],
    ),
    case("cas of junk", &["info", "cas:{DIR}/junk.bin"], &[]),
    case(
        "throttle of nonsense",
        &["info", "throttle[rate=fast]:mem:1M"],
        &[],
    ),
    case("unclosed options", &["info", "lbs[key-file=x:mem:1M"], &[]),
    case(
        "flashsim of an unknown card",
        &["info", "flashsim:class99:mem:1M"],
        &[],
    ),
    // Commands and their arguments.
    case(
        "commit of a missing disk",
        &[
            "commit",
            "{DIR}/nothing.img",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
        ],
        &[],
    ),
    case(
        "commit with chunk size 0",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--chunk-size",
            "0",
        ],
        &[],
    ),
    case(
        "commit with chunk size 3 bytes",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--chunk-size",
            "3",
        ],
        &[],
    ),
    case(
        "commit with chunk size 1 TiB",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--chunk-size",
            "1T",
        ],
        &[],
    ),
    case(
        "commit with chunk size 4 GiB + 64 KiB",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--chunk-size",
            "4194368K",
        ],
        &[],
    ),
    case(
        "commit with a key file in a missing folder",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--encrypt",
            "--key-file",
            "{DIR}/no/such/dir/k.key",
        ],
        &[],
    ),
    case(
        "commit with a junk key file",
        &[
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--encrypt",
            "--key-file",
            "{DIR}/junk.key",
        ],
        &[],
    ),
    case(
        "serve on a socket in a missing folder",
        &["serve", "mem:1M", "--socket", "{DIR}/no/such/dir/s.sock"],
        &[],
    ),
    case(
        "serve on a bad address",
        &["serve", "mem:1M", "--listen", "300.1.1.1:10809"],
        &[],
    ),
    case(
        "serve a junk config",
        &["serve", "--config", "{DIR}/junk.toml"],
        &[],
    ),
    case(
        "serve a config of wrong types",
        &["serve", "--config", "{DIR}/types.toml"],
        &[],
    ),
    case(
        "server with a missing config",
        &["server", "{DIR}/nothing.toml"],
        &[],
    ),
    case(
        "server with a junk config",
        &["server", "{DIR}/junk.toml"],
        &[],
    ),
    case(
        "server with a config of wrong types",
        &["server", "{DIR}/types.toml"],
        &[],
    ),
    case(
        "server metrics on a network address without a token or TLS",
        &["server", "{DIR}/metrics-net.toml"],
        &[],
    ),
    case(
        "server metrics token file readable by every user",
        &["server", "{DIR}/metrics-token.toml"],
        &[],
    ),
    case(
        "server metrics on unix: without a path",
        &["server", "{DIR}/metrics-unix.toml"],
        &[],
    ),
    case(
        "store serve on a bad address",
        &["store", "serve", "{DIR}/store", "--listen", "nowhere"],
        &[],
    ),
    case(
        "store serve with a missing users file",
        &[
            "store",
            "serve",
            "{DIR}/store",
            "--listen",
            "127.0.0.1:0",
            "--users",
            "{DIR}/nothing.toml",
        ],
        &[],
    ),
    case(
        "store serve with a junk certificate",
        &[
            "store",
            "serve",
            "{DIR}/store",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "{DIR}/junk.bin",
            "--tls-key",
            "{DIR}/junk.bin",
        ],
        &[],
    ),
    case(
        "cache status of junk",
        &["cache", "status", "--shared-cache", "{DIR}/badcache"],
        &[],
    ),
    case(
        "cache status of a file",
        &["cache", "status", "--shared-cache", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "hoard into a junk cache",
        &[
            "hoard",
            "u/vm",
            "--store",
            "{DIR}/store",
            "--shared-cache",
            "{DIR}/badcache",
        ],
        &[],
    ),
    case(
        "resume into a file",
        &[
            "resume",
            "u/vm",
            "--session",
            "{DIR}/junk.bin",
            "--store",
            "{DIR}/store",
        ],
        &[],
    ),
    case(
        "resume --qmp of a QMP socket that is a junk file",
        &[
            "resume",
            "u/vm",
            "--session",
            "{DIR}/qmp-sess",
            "--store",
            "{DIR}/store",
            "--socket",
            "{DIR}/qmp-sess.sock",
            "--qmp",
            "{DIR}/junk.bin",
            "--qmp-wait",
            "1s",
        ],
        &[],
    ),
    case(
        "resume --watchdog of junk",
        &[
            "resume",
            "u/vm",
            "--session",
            "{DIR}/wd-sess",
            "--store",
            "{DIR}/store",
            "--socket",
            "{DIR}/wd.sock",
            "--qmp",
            "{DIR}/wd.qmp",
            "--watchdog",
            "soon",
        ],
        &[],
    ),
    case(
        "resume --eager without --qmp",
        &["resume", "u/vm", "--session", "{DIR}/e-sess", "--eager"],
        &[],
    ),
    case(
        "suspend --memory-chunk-size not a power of two",
        &[
            "suspend",
            "{DIR}",
            "--qmp",
            "{DIR}/junk.bin",
            "--memory-chunk-size",
            "24K",
        ],
        &[],
    ),
    case(
        "suspend --qmp of a junk file",
        &["suspend", "{DIR}/qmp-sess", "--qmp", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "suspend of a folder that is no session",
        &["suspend", "{DIR}", "--memory", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "trace stats of junk",
        &["trace", "stats", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "trace stats of an empty file",
        &["trace", "stats", "{DIR}/empty"],
        &[],
    ),
    case(
        "trace convert of junk",
        &[
            "trace",
            "convert",
            "{DIR}/junk.bin",
            "-o",
            "{DIR}/t.rdtrace",
        ],
        &[],
    ),
    case(
        "trace synth of an unknown workload",
        &["trace", "synth", "spreadsheet", "-o", "{DIR}/t.rdtrace"],
        &[],
    ),
    case(
        "trace synth of 0 clients",
        &[
            "trace",
            "synth",
            "desktop",
            "--clients",
            "0",
            "-o",
            "{DIR}/t.rdtrace",
        ],
        &[],
    ),
    case(
        "replay of junk",
        &["replay", "{DIR}/junk.bin", "mem:1M"],
        &[],
    ),
    case(
        "sim of junk",
        &["sim", "{DIR}/junk.bin", "--size", "1M"],
        &[],
    ),
    case(
        "sim of a nonsense policy",
        &["sim", "{DIR}/junk.bin", "--policy", "psychic"],
        &[],
    ),
    case(
        "model mva of a hit ratio above 1",
        &["model", "mva", "--hit", "1.5", "--clients", "5"],
        &[],
    ),
    case(
        "model mva of 0 clients",
        &["model", "mva", "--hit", "0.5", "--clients", "0"],
        &[],
    ),
    case(
        "sperf of an area past the disk",
        &["sperf", "mem:1M", "--area", "1G"],
        &[],
    ),
    case(
        "sperf of block size 0",
        &["sperf", "mem:1M", "--area", "1M", "--bs", "0"],
        &[],
    ),
    case(
        "borrow show of junk",
        &["borrow", "show", "{DIR}/junk.bin"],
        &[],
    ),
    case(
        "borrow scan of junk",
        &[
            "borrow",
            "scan",
            "{DIR}/junk.bin",
            "--plan",
            "{DIR}/p.plan",
            "--min-size",
            "1",
        ],
        &[],
    ),
    case(
        "borrow scan of an empty file",
        &[
            "borrow",
            "scan",
            "{DIR}/empty",
            "--plan",
            "{DIR}/p.plan",
            "--min-size",
            "1",
        ],
        &[],
    ),
    case(
        "serve of a junk borrow plan",
        &["info", "borrow:{DIR}/junk.bin"],
        &[],
    ),
];

/// The junk the cases point at.
fn junk(dir: &Path) {
    let w = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    let mut noise = vec![0u8; 1 << 16];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    w("junk.bin", &noise);
    w("empty", b"");
    w("junk.key", b"hello\n");
    w("jo.img", &noise);
    w("jo.img.cowmap", &noise[..4096]);
    w("jl.lbsd", &noise);
    w("jl.lbsm", &noise[..8192]);
    w("el.lbsd", b"");
    w("el.lbsm", b"");
    w("junk.toml", b"[[[ this is = not toml\n\x00\xff");
    w(
        "types.toml",
        b"format = 7\nversion = \"one\"\nsocket = [1, 2]\n[[export]]\nname = 5\n",
    );
    let server = |metrics: &str| {
        format!("format = \"roamdisk-server\"\nversion = 1\nstate = \"st\"\nsocket = \"s.sock\"\n{metrics}\n[[image]]\nname = \"d\"\nstack = \"mem:1M\"\n")
    };
    w(
        "metrics-net.toml",
        server("metrics = \"0.0.0.0:9477\"").as_bytes(),
    );
    w(
        "metrics-token.toml",
        server("metrics = \"127.0.0.1:0\"\nmetrics-token-file = \"token.txt\"").as_bytes(),
    );
    w("token.txt", b"0123456789abcdef0123456789abcdef\n");
    std::fs::set_permissions(
        dir.join("token.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    w(
        "metrics-unix.toml",
        server("metrics = \"unix:\"").as_bytes(),
    );
    std::fs::create_dir(dir.join("badstore")).unwrap();
    std::fs::write(dir.join("badstore/store.toml"), b"magic = 3\n\xff\xfe").unwrap();
    std::fs::create_dir(dir.join("badcache")).unwrap();
    std::fs::write(dir.join("badcache/cache.toml"), &noise[..300]).unwrap();
}

#[test]
fn every_mistyped_command_ends_with_a_clear_error_not_a_panic_or_a_hang() {
    let dir = tempdir();
    junk(dir.path());
    // A real store holding u/vm, for the cases that must get past
    // opening it and finding the image.
    let store = dir.path().join("store");
    for args in [
        vec!["-q", "store", "init", path_str(&store)],
        vec![
            "-q",
            "commit",
            "mem:1M",
            "--to",
            "u/vm",
            "--store",
            path_str(&store),
        ],
    ] {
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let limit = Duration::from_secs(20);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut failures = Vec::new();
    for c in CASES {
        let args: Vec<String> = c
            .args
            .iter()
            .map(|a| a.replace("{DIR}", path_str(dir.path())))
            .collect();
        let t0 = Instant::now();
        let out = Command::new("timeout")
            .arg("--signal=KILL")
            .arg(limit.as_secs().to_string())
            .arg(bin())
            .args(&args)
            // Nothing of the caller's (AWS_*, ROAMDISK_*, XDG_*...).
            .env_clear()
            .env("PATH", &path)
            .env("HOME", dir.path())
            .envs(
                c.env
                    .iter()
                    .map(|(k, v)| (*k, v.replace("{DIR}", path_str(dir.path())))),
            )
            .output()
            .unwrap();
        let took = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        let problem = if code.is_none() || took >= limit {
            Some(format!("did not end within {limit:?} ({})", out.status))
        } else if code == Some(101) || stderr.contains("panicked") {
            Some("panicked".to_string())
        } else if !matches!(code, Some(1) | Some(2)) {
            Some(format!("exit status {code:?}, expected an error (1 or 2)"))
        } else if stderr.trim().is_empty() {
            Some("failed without a message".to_string())
        } else {
            None
        };
        if let Some(p) = problem {
            failures.push(format!(
                "{} — roamdisk {args:?} {:?}: {p}\n{stderr}",
                c.what, c.env
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile inputs were not refused cleanly:\n\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n\n")
    );
}
