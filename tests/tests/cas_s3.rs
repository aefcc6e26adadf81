//! The S3 chunk store (`s3://BUCKET/PREFIX`) against a loopback OpenStack
//! Swift cluster with s3api (docs/testing-s3.md), one private cluster per
//! test (`scripts/swift-setup DIR --port BASE`, `scripts/swift-run`):
//! - an object server killed (kill -9) in the middle of a commit: the
//!   commit completes or fails cleanly, a later checkout is identical;
//! - an object server hung (SIGSTOP) during a commit;
//! - a corrupted pack, a missing pack, a missing or truncated version
//!   package: errors name the chunk or the version, gc refuses, `store
//!   verify` reports the damage, nothing is lost once they are back;
//! - wrong credentials and an endpoint that never answers: quick, clear
//!   errors, no catalog change;
//! - gc during a commit that reuses a removed version's chunks;
//! - two commits to one image at once: both versions stay;
//! - `roamdisk store serve s3://...` in front of the bucket;
//! - a hoarded session served with the cluster stopped.
//!
//! Objects are edited with boto3 from the Swift virtualenv; nothing is
//! skipped: a missing virtualenv fails the test (scripts/test installs it).

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]
#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]

mod cas_common;
mod common;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cas_common::{
    checkout, checkout_fail, checkout_same, commit_args, commit_version, gc_until_exit, hoard,
    json_num, json_str, open_session, random_version, rd, rd_fail, read_all, Cas, ChunkServer,
};
use common::{bin, command_stdout, output_text, path_str, qemu_img_compare, tempdir};

const BUCKET: &str = "roamdisk-test";

/// The workspace's `scripts/` folder.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("scripts")
}

/// The Python of the Swift virtualenv (with boto3).
fn venv_python() -> PathBuf {
    let venv =
        std::env::var("ROAMDISK_SWIFT_VENV").unwrap_or_else(|_| "/opt/roamdisk-swift".into());
    let py = Path::new(&venv).join("bin/python");
    assert!(
        py.is_file(),
        "the Swift virtualenv ({venv}) is missing: run scripts/test, which installs it (scripts/swift-setup)"
    );
    py
}

/// Whether nothing listens on, and nothing can be refused at, any port of a
/// cluster based at BASE (see scripts/swift-setup: BASE, BASE+1,
/// BASE+11..13, +21..23, +31..33).
fn ports_free(base: u16) -> bool {
    let offsets = [0, 1, 11, 12, 13, 21, 22, 23, 31, 32, 33];
    offsets
        .iter()
        .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok())
}

/// A private loopback Swift cluster in a temporary folder; stopped when
/// dropped. The store's AWS_* variables are set in this (test) process,
/// so every `roamdisk` it runs talks to this cluster.
struct Swift {
    /// Kept (not removed) when the test fails, for its logs.
    dir: Option<tempfile::TempDir>,
    endpoint: String,
}

impl Swift {
    /// Start a cluster on a port range of SLOT (a per-test constant, 1..=9):
    /// bases 20000 + 40 * SLOT + 400 * k, so two tests never try the same
    /// range; the first free one is taken.
    fn start(slot: u16) -> Swift {
        assert!((1..=9).contains(&slot));
        venv_python();
        let base = (0..25u16)
            .map(|k| 20000 + 40 * slot + 400 * k)
            .find(|&b| ports_free(b))
            .expect("a free port range for Swift");
        let dir = tempfile::Builder::new()
            .prefix("roamdisk-swift-")
            .tempdir()
            .expect("tempdir");
        let out = Command::new(scripts().join("swift-setup"))
            .arg(dir.path())
            .args(["--port", &base.to_string()])
            .output()
            .expect("run scripts/swift-setup");
        assert!(out.status.success(), "swift-setup: {}", output_text(&out));
        let mut swift = Swift {
            dir: Some(dir),
            endpoint: String::new(),
        };
        swift.run(&["start"]);
        let env = swift.run(&["env"]);
        for line in env.lines() {
            let line = line.trim().trim_start_matches("export ");
            if let Some((k, v)) = line.split_once('=') {
                if k.starts_with("AWS_") {
                    let v = v.trim_matches(|c| c == '\'' || c == '"');
                    std::env::set_var(k, v);
                    if k == "AWS_ENDPOINT_URL" {
                        swift.endpoint = v.to_string();
                    }
                }
            }
        }
        assert!(!swift.endpoint.is_empty(), "no endpoint in:\n{env}");
        std::env::set_var("ROAMDISK_TEST_S3", format!("s3://{BUCKET}"));
        swift.python(&["mb", BUCKET]);
        swift
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("cluster folder").path()
    }

    /// `scripts/swift-run CMD DIR ARGS...` (must succeed); its stdout.
    fn run(&self, args: &[&str]) -> String {
        command_stdout(
            Command::new(scripts().join("swift-run"))
                .arg(args[0])
                .arg(self.dir())
                .args(&args[1..]),
            &format!("swift-run {args:?}"),
        )
    }

    /// [`BOTO`] with ARGS (must succeed); its stdout.
    fn python(&self, args: &[&str]) -> String {
        command_stdout(
            Command::new(venv_python()).arg("-c").arg(BOTO).args(args),
            &format!("boto3 {args:?}"),
        )
    }
}

impl Drop for Swift {
    fn drop(&mut self) {
        let _ = Command::new(scripts().join("swift-run"))
            .arg("stop")
            .arg(self.dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if std::thread::panicking() {
            let kept = self.dir.take().expect("cluster folder").keep();
            eprintln!(
                "the Swift cluster's folder (logs in log/) is kept: {}",
                kept.display()
            );
        }
    }
}

/// Object edits with boto3 (endpoint and keys from the AWS_* variables).
/// `mb B`; `packs B PREFIX` (per chunk of every pack: key id offset len,
/// from the pack's index, docs/formats/cas-pack.md); `ls B PREFIX`;
/// `get B KEY FILE`; `put B KEY FILE`; `flip B KEY OFFSET`; `rm B KEY`;
/// `cut B KEY N` (drop the last N bytes).
const BOTO: &str = r#"
import sys, boto3
s3 = boto3.client('s3')
cmd, b = sys.argv[1], sys.argv[2]
a = sys.argv[3:]
def get(k):
    return s3.get_object(Bucket=b, Key=k)['Body'].read()
def keys(prefix):
    out = []
    for page in s3.get_paginator('list_objects_v2').paginate(Bucket=b, Prefix=prefix):
        out += [o['Key'] for o in page.get('Contents', [])]
    return sorted(out)
if cmd == 'mb':
    s3.create_bucket(Bucket=b)
elif cmd == 'ls':
    print('\n'.join(keys(a[0])))
elif cmd == 'packs':
    for k in keys(a[0] + '/packs/'):
        if not k.endswith('.pack'):
            continue
        d = get(k)
        t = d[-56:]
        at = int.from_bytes(t[:8], 'little')
        n = int.from_bytes(t[8:12], 'little')
        for i in range(n):
            e = d[at + 48 * i: at + 48 * (i + 1)]
            print(k, e[:32].hex(), int.from_bytes(e[32:40], 'little'), int.from_bytes(e[40:44], 'little'))
elif cmd == 'get':
    open(a[1], 'wb').write(get(a[0]))
elif cmd == 'put':
    s3.put_object(Bucket=b, Key=a[0], Body=open(a[1], 'rb').read())
elif cmd == 'flip':
    d = bytearray(get(a[0]))
    d[int(a[1])] ^= 0xff
    s3.put_object(Bucket=b, Key=a[0], Body=bytes(d))
elif cmd == 'rm':
    s3.delete_object(Bucket=b, Key=a[0])
elif cmd == 'cut':
    d = get(a[0])
    s3.put_object(Bucket=b, Key=a[0], Body=d[:len(d) - int(a[1])])
else:
    sys.exit('unknown command ' + cmd)
"#;

/// A cluster started on SLOT ([`Swift::start`]), a store in its bucket:
/// `s3://roamdisk-test/PREFIX?gc-margin=2s` (cas_common's S3 mode), and
/// the store's key prefix.
fn s3_store(slot: u16, init: &[&str]) -> (Swift, Cas, String) {
    let swift = Swift::start(slot);
    let cas = Cas::with(init);
    let s = cas.s();
    assert!(s.starts_with("s3://"), "{s}");
    let prefix = s[format!("s3://{BUCKET}/").len()..]
        .split('?')
        .next()
        .unwrap()
        .to_string();
    (swift, cas, prefix)
}

/// One chunk in a pack object, as the pack's index says.
struct Packed {
    key: String,
    id: String,
    offset: u64,
}

fn packed(swift: &Swift, prefix: &str) -> Vec<Packed> {
    swift
        .python(&["packs", BUCKET, prefix])
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Packed {
                key: w[0].to_string(),
                id: w[1].to_string(),
                offset: w[2].parse().unwrap(),
            }
        })
        .collect()
}

/// `roamdisk ARGS` in the background, output discarded.
fn spawn(args: &[&str]) -> Child {
    Command::new(bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roamdisk")
}

/// A finished background `roamdisk`'s output.
fn finish(c: Child) -> Output {
    c.wait_with_output().expect("wait roamdisk")
}

/// The versions `roamdisk log IMAGE --json` lists.
fn versions(s: &str, image: &str) -> Vec<String> {
    let log = rd(&["log", image, "--store", s, "--json"]);
    let mut v = Vec::new();
    let mut rest = log.as_str();
    while let Some(i) = rest.find("\"version\":") {
        rest = &rest[i..];
        v.push(json_str(rest, "version"));
        rest = &rest[10..];
    }
    v
}

/// `roamdisk gc --store S --json`.
fn gc(s: &str) -> String {
    rd(&["gc", "--store", s, "--json"])
}

/// `roamdisk commit IMG --to u/vm --store S --json` in the background,
/// at a quarter of IMG's size a second (it takes 4 s or more), with
/// `swift-run DISRUPT` done to the cluster AFTER into it (the commit must
/// still be running then): the commit's output.
fn commit_disrupted(
    swift: &Swift,
    s: &str,
    img: &Path,
    after: Duration,
    disrupt: &[&str],
) -> Output {
    let what = format!("{disrupt:?} after {after:?}");
    let rate = format!("{}M", img.metadata().unwrap().len() >> 20 >> 2);
    let t0 = Instant::now();
    let mut child = spawn(&commit_args(
        s,
        path_str(img),
        "u/vm",
        &["--json", "--limit-rate", &rate],
    ));
    std::thread::sleep(after);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the commit ended before {what}"
    );
    swift.run(disrupt);
    let out = finish(child);
    // Its whole stderr, so that a failure in CI says what the commit met.
    println!(
        "commit with {what}: {:.1} s, {}; it said:\n{}",
        t0.elapsed().as_secs_f64(),
        if out.status.success() {
            "succeeded"
        } else {
            "failed"
        },
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `roamdisk ARGS` with ENV, which must fail within LIMIT; its stderr.
fn fails_within(args: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let t0 = Instant::now();
    let o = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run roamdisk");
    let took = t0.elapsed();
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    println!("{args:?} failed after {:.1} s", took.as_secs_f64());
    assert!(!o.status.success(), "{args:?} succeeded:\n{e}");
    assert!(took < limit, "{args:?} took {took:?} to fail:\n{e}");
    e
}

#[test]
fn an_object_server_killed_mid_commit_loses_nothing() {
    let (swift, cas, _) = s3_store(1, &[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (v1, _) = random_version(&cas, ("v1.img", 8 << 20, 1), "u/vm", &["-m", "first"]);
    let v2 = cas.random_file("v2.img", 200 << 20, 2);
    // At most 50 MB/s: the commit takes 4 s or more.
    let out = commit_disrupted(&swift, s, &v2, Duration::from_millis(2500), &["kill", "2"]);
    swift.run(&["start"]);
    let got = dir.join("out.raw");
    if out.status.success() {
        let v = json_str(&String::from_utf8_lossy(&out.stdout), "version");
        // Every reader sees the new version: the catalog is found by
        // listing refs/, and a Swift listing comes from one container
        // replica (docs/testing-s3.md), so read it several times.
        let reads: Vec<Vec<String>> = (0..6).map(|_| versions(s, "u/vm")).collect();
        let stale: Vec<&Vec<String>> = reads
            .iter()
            .filter(|vs| vs.len() != 2 || !vs.contains(&v))
            .collect();
        assert!(
            stale.is_empty(),
            "{} of 6 reads of the catalog after the restart miss the committed version {v}: {stale:?}",
            stale.len()
        );
        checkout_same(s, &format!("u/vm@{}", &v[..12]), &v2, &got);
        checkout_same(s, "u/vm", &v2, &got);
    } else {
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("previous version is intact"), "{e}");
        let vs = versions(s, "u/vm");
        assert_eq!(vs.len(), 1, "{vs:?}");
        checkout_same(s, "u/vm", &v1, &got);
    }
    rd(&["store", "verify", "--store", s]);
}

#[test]
fn an_object_server_hung_mid_commit_costs_time_only() {
    let (swift, cas, _) = s3_store(2, &[]);
    let (dir, s) = (cas.dir(), cas.s());
    let img = cas.random_file("disk.img", 64 << 20, 3);
    // At most 16 MB/s: the commit takes 4 s or more.
    let out = commit_disrupted(&swift, s, &img, Duration::from_secs(1), &["pause", "1"]);
    swift.run(&["resume", "1"]);
    let vs = versions(s, "u/vm");
    if out.status.success() {
        assert_eq!(vs.len(), 1, "{vs:?}");
        checkout_same(s, "u/vm", &img, &dir.join("out.raw"));
    } else {
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("u/vm"), "{e}");
        assert!(vs.is_empty(), "{vs:?}");
    }
}

/// Version V of `u/a` in store S cannot be read: a checkout to OUT fails
/// naming it, gc refuses to run rather than sweep, and `store verify`
/// fails saying VERIFY_SAYS.
fn assert_version_unreadable(s: &str, v: &str, out: &Path, verify_says: &str) {
    let e = checkout_fail(s, "u/a", out, &[]);
    assert!(e.contains(v) && e.contains("version"), "{e}");
    let e = rd_fail(&["gc", "--store", s]);
    assert!(e.contains("nothing was removed"), "{e}");
    let e = rd_fail(&["store", "verify", "--store", s]);
    assert!(e.contains(verify_says), "{e}");
}

#[test]
fn damaged_and_missing_objects_are_named() {
    let (swift, cas, prefix) = s3_store(3, &["--compression", "none"]);
    let (dir, s) = (cas.dir(), cas.s());
    let (img, v) = random_version(&cas, ("a.img", 4 << 20, 4), "u/a", &[]);
    let chunks = packed(&swift, &prefix);
    assert_eq!(chunks.len(), 64);
    let objects = swift.python(&["ls", BUCKET, &format!("{prefix}/objects/")]);
    let pkg = format!("{prefix}/objects/{v}");
    assert_eq!(
        objects.trim(),
        pkg,
        "one single object, the version package"
    );
    let out = dir.join("out.raw");
    // 1. A corrupted chunk.
    let bad = &chunks[5];
    let at = (bad.offset + 1000).to_string();
    swift.python(&["flip", BUCKET, &bad.key, &at]);
    let e = checkout_fail(s, "u/a", &out, &[]);
    assert!(e.contains(&bad.id) && e.contains("corrupt"), "{e}");
    assert!(!out.exists(), "a failed checkout leaves no partial file");
    let e = rd_fail(&["store", "verify", "--store", s]);
    assert!(e.contains("1 of 65 objects"), "{e}");
    swift.python(&["flip", BUCKET, &bad.key, &at]);
    rd(&["store", "verify", "--store", s]);
    // 2. A missing pack: the checkout names a chunk that was in it.
    let gone = chunks[9].key.clone();
    let saved = dir.join("pack");
    swift.python(&["get", BUCKET, &gone, path_str(&saved)]);
    swift.python(&["rm", BUCKET, &gone]);
    let e = checkout_fail(s, "u/a", &out, &[]);
    let named = chunks.iter().find(|c| c.key == gone && e.contains(&c.id));
    assert!(named.is_some() && e.contains("missing"), "{e}");
    // `store verify` names the version whose objects are gone.
    let e = rd_fail(&["store", "verify", "--store", s]);
    assert!(e.contains("1 of 1 versions miss objects"), "{e}");
    swift.python(&["put", BUCKET, &gone, path_str(&saved)]);
    // 3. A truncated version package (its index).
    let whole = dir.join("pkg");
    swift.python(&["get", BUCKET, &pkg, path_str(&whole)]);
    swift.python(&["cut", BUCKET, &pkg, "100"]);
    assert_version_unreadable(s, &v, &out, "1 of 65 objects");
    // 4. A missing version package.
    swift.python(&["rm", BUCKET, &pkg]);
    assert_version_unreadable(s, &v, &out, "1 of 1 versions miss objects");
    swift.python(&["put", BUCKET, &pkg, path_str(&whole)]);
    rd(&["store", "verify", "--store", s]);
    checkout_same(s, "u/a", &img, &out);
}

#[test]
fn wrong_credentials_fail_at_once_and_change_nothing() {
    let (_swift, cas, _) = s3_store(4, &[]);
    let (dir, s) = (cas.dir(), cas.s());
    let (img, _) = random_version(&cas, ("a.img", 2 << 20, 5), "u/vm", &[]);
    let img2 = cas.random_file("b.img", 2 << 20, 6);
    let out = dir.join("out.raw");
    let cases: [&[&str]; 3] = [
        &["commit", path_str(&img2), "--to", "u/vm", "--store", s],
        &["checkout", "u/vm", "--store", s, "--output", path_str(&out)],
        &["store", "info", "--store", s],
    ];
    for args in cases {
        let e = fails_within(
            args,
            &[("AWS_SECRET_ACCESS_KEY", "not-the-secret")],
            Duration::from_secs(10),
        );
        assert!(
            e.contains("AWS_SECRET_ACCESS_KEY") && e.contains("refused access"),
            "{args:?}:\n{e}"
        );
    }
    assert!(!out.exists(), "a failed checkout leaves no file");
    assert_eq!(versions(s, "u/vm").len(), 1);
    checkout_same(s, "u/vm", &img, &out);
}

#[test]
fn an_endpoint_that_never_answers_fails_within_the_timeouts() {
    let tmp = tempdir();
    // Accepts every connection and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let store = "s3://hang/p?timeout=2s&retries=1&retry-timeout=5s";
    let img = tmp.path().join("a.img");
    common::random_file(&img, 1 << 20, 7);
    let out = tmp.path().join("out.raw");
    let cases: [&[&str]; 3] = [
        &["store", "info", "--store", store],
        &["commit", path_str(&img), "--to", "u/vm", "--store", store],
        &[
            "checkout",
            "u/vm",
            "--store",
            store,
            "--output",
            path_str(&out),
        ],
    ];
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ];
    for args in cases {
        let e = fails_within(args, &env, Duration::from_secs(20));
        assert!(e.contains("did not answer"), "{args:?}:\n{e}");
    }
    assert!(!out.exists());
}

#[test]
fn gc_during_a_commit_that_reuses_removed_chunks() {
    let (_swift, cas, _) = s3_store(5, &["--compression", "none"]);
    let (dir, s) = (cas.dir(), cas.s());
    // A: 96 MiB; B: A with 4 MiB of its own at 40 MiB.
    let (a, _) = random_version(&cas, ("a.img", 96 << 20, 8), "u/a", &[]);
    let b = cas.variant(&a, "b.img", (4 << 20, 9), 40 << 20);
    rd(&["rm", "u/a", "--all", "--store", s]);
    // Older than gc-margin=2s: A's chunks are garbage unless B reuses them.
    std::thread::sleep(Duration::from_secs(3));
    let mut child = spawn(&commit_args(
        s,
        path_str(&b),
        "u/b",
        &["--limit-rate", "16M", "-q"],
    ));
    std::thread::sleep(Duration::from_millis(300));
    let (runs, mut removed) =
        gc_until_exit(s, &mut child, Duration::from_secs(180), Duration::ZERO);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(runs >= 2, "gc ran {runs} times during the commit");
    println!("{runs} gc runs during the commit removed {removed} objects");
    checkout_same(s, "u/b", &b, &dir.join("out.raw"));
    rd(&["store", "verify", "--store", s]);
    // A's 4 MiB that B does not have (64 chunks) go once nothing touches
    // their packs any more.
    std::thread::sleep(Duration::from_secs(3));
    let r = gc(s);
    removed += json_num(&r, "removed_objects");
    assert!(removed >= 64, "A's own chunks were freed ({removed}): {r}");
    let r = gc(s);
    assert_eq!(json_num(&r, "referenced"), json_num(&r, "objects"), "{r}");
    rd(&["store", "verify", "--store", s]);
    checkout_same(s, "u/b", &b, &dir.join("out2.raw"));
}

#[test]
fn two_commits_to_one_image_at_once_both_stay() {
    let (_swift, cas, _) = s3_store(6, &[]);
    let (dir, s) = (cas.dir(), cas.s());
    random_version(&cas, ("base.img", 4 << 20, 10), "u/vm", &[]);
    let x = cas.random_file("x.img", 48 << 20, 11);
    let y = cas.random_file("y.img", 48 << 20, 12);
    let cx = spawn(&commit_args(s, path_str(&x), "u/vm", &["--json"]));
    let cy = spawn(&commit_args(s, path_str(&y), "u/vm", &["--json"]));
    let (ox, oy) = (finish(cx), finish(cy));
    assert!(ox.status.success(), "{}", output_text(&ox));
    assert!(oy.status.success(), "{}", output_text(&oy));
    let vx = json_str(&String::from_utf8_lossy(&ox.stdout), "version");
    let vy = json_str(&String::from_utf8_lossy(&oy.stdout), "version");
    let vs = versions(s, "u/vm");
    assert_eq!(vs.len(), 3, "{vs:?}");
    assert!(vs.contains(&vx) && vs.contains(&vy), "{vs:?}");
    let log = rd(&["log", "u/vm", "--store", s]);
    assert!(log.contains(&vx[..12]) && log.contains(&vy[..12]), "{log}");
    checkout_same(s, &format!("u/vm@{}", &vx[..12]), &x, &dir.join("x.out"));
    checkout_same(s, &format!("u/vm@{}", &vy[..12]), &y, &dir.join("y.out"));
}

#[test]
fn the_chunk_server_fronts_an_s3_store() {
    let (_swift, cas, _) = s3_store(7, &[]);
    let dir = cas.dir();
    let srv = ChunkServer::start(cas.s(), &[]);
    let url = srv.url.clone();
    let img = cas.random_file("disk.img", 24 << 20, 13);
    let v1 = commit_version(&url, path_str(&img), "erin/vm", &[]);
    let img2 = cas.variant(&img, "disk2.img", (1 << 20, 14), 5 << 20);
    let v2 = commit_version(&url, path_str(&img2), "erin/vm", &[]);
    let got = dir.join("got.raw");
    checkout(&url, &format!("erin/vm@{}", &v1[..12]), &got, &[]);
    qemu_img_compare(path_str(&img), path_str(&got));
    checkout_same(&url, "erin/vm", &img2, &got);
    // The same versions straight from S3.
    checkout_same(cas.s(), "erin/vm", &img2, &got);
    let log = rd(&["log", "erin/vm", "--store", &url]);
    assert!(log.contains(&v1[..12]) && log.contains(&v2[..12]), "{log}");
    let r = rd(&["gc", "--store", &url, "--json"]);
    assert!(r.contains("\"removed_objects\": 0"), "{r}");
}

#[test]
fn a_hoarded_session_serves_every_byte_with_its_s3_store_stopped() {
    let (swift, cas, _) = s3_store(8, &[]);
    let dir = cas.dir();
    let (img, _) = random_version(&cas, ("hoarded.raw", 16 << 16, 21), "u/h", &[]);
    let sess = dir.join("s-h");
    open_session(cas.s(), "u/h", &sess, &[]);
    let cache = dir.join("shared");
    let sc = path_str(&cache);
    let out = hoard(cas.s(), "u/h", sc, &[]);
    assert!(out.contains("the network may go"), "{out}");
    // The object store goes away: its endpoint refuses connections.
    drop(swift);
    let got = dir.join("got.raw");
    assert!(read_all(dir, &sess, &format!("shared-cache={sc}"), &got));
    qemu_img_compare(path_str(&img), path_str(&got));
    let check = hoard(cas.s(), "u/h", sc, &["--check", "--json"]);
    assert_eq!(json_num(&check, "cached_after"), 16, "{check}");
    assert!(check.contains("\"complete\": true"), "{check}");
}
