//! Fetching over the network (issue 12, "Fetch"): adjacent chunks come in
//! one request (batch gets, `POST /v1/objects/get`), and a session reading
//! its base in sequence fetches ahead of the guest (`readahead=on|off`).
//!
//! Requests are counted where they arrive: `roamdisk -vv store serve` logs
//! every request it answers and, for a batch get, how many objects it sent.

#![allow(clippy::disallowed_macros, reason = "a test prints what it measured")]
mod cas_common;
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use cas_common::{checkout, commit_version, open_session, read_all, Cas, ChunkServer};
use common::{path_str, poll_until, qemu_io, run, Server};

const SIZE: u64 = 8 << 20;
const CHUNK: u64 = 65536;
const CHUNKS: usize = (SIZE / CHUNK) as usize;

/// What a chunk server answered for objects, by its access log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Served {
    /// `GET /v1/objects/ID` answered 200.
    gets: usize,
    /// `POST /v1/objects/get` answered, whatever the status.
    batches: usize,
    /// ... of those, answered 405 (a server without batch gets).
    refused_batches: usize,
    /// Objects sent: one per GET, the found ones of each batch.
    objects: usize,
}

impl Served {
    fn requests(&self) -> usize {
        self.gets + self.batches
    }
}

fn served(srv: &ChunkServer) -> Served {
    let mut s = Served::default();
    for line in srv.log_text().lines() {
        if line.contains("request served") {
            if line.contains("method=POST path=/v1/objects/get ") {
                s.batches += 1;
                s.refused_batches += line.contains("status=405") as usize;
            } else if line.contains("method=GET path=/v1/objects/") && line.contains("status=200") {
                s.gets += 1;
                s.objects += 1;
            }
        } else if line.contains("batch get") {
            let found = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("found="))
                .unwrap_or_else(|| panic!("no found= in {line}"));
            s.objects += found.parse::<usize>().expect("a count");
        }
    }
    s
}

/// The growth of what `srv` served while `f` ran.
fn during(srv: &ChunkServer, f: impl FnOnce()) -> Served {
    let a = served(srv);
    f();
    let b = served(srv);
    Served {
        gets: b.gets - a.gets,
        batches: b.batches - a.batches,
        refused_batches: b.refused_batches - a.refused_batches,
        objects: b.objects - a.objects,
    }
}

/// A store with an 8 MiB random disk committed as `u/vm` and its chunk
/// server started with `-vv` (its access log) and `extra`.
fn setup(extra: &[&str]) -> (Cas, std::path::PathBuf, ChunkServer) {
    let cas = Cas::new();
    let src = cas.random_file("disk.raw", SIZE, 21);
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let srv = ChunkServer::start(cas.s(), &[&["-vv"], extra].concat());
    (cas, src, srv)
}

/// A new session NAME over the chunk server.
fn session(cas: &Cas, srv: &ChunkServer, name: &str) -> std::path::PathBuf {
    let s = cas.dir().join(name);
    open_session(&srv.url, "u/vm", &s, &[]);
    s
}

/// Serve `cas[OPTS]:SESS` and copy it whole with nbdcopy as a guest
/// reads a file: one 64 KiB request at a time, in order. The copy goes to
/// OUT (or nowhere); returns how long it took.
fn read_in_order(dir: &Path, sess: &Path, opts: &str, out: Option<&Path>) -> Duration {
    let srv = Server::start(dir, &[&format!("cas[{opts}]:{}", sess.display())]);
    let dst = out.map_or("null:".to_string(), |p| path_str(p).to_string());
    let t0 = Instant::now();
    run(
        "nbdcopy",
        &[
            "--synchronous",
            "--request-size=65536",
            "--connections=1",
            &srv.uri(),
            &dst,
        ],
    );
    let took = t0.elapsed();
    srv.stop();
    took
}

fn same_bytes(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(x == y, "{} and {} differ", a.display(), b.display());
}

/// A session read from start to end, 64 KiB at a time, over `store serve`
/// makes a few requests for its 128 chunks (the read-ahead's windows, in
/// batch gets), gets every chunk about once, and reads the image's bytes:
/// with the shared cache off (the chunks go into the private cache) and
/// with one.
#[test]
fn a_sequential_read_is_a_few_requests_and_the_right_bytes() {
    let (cas, src, srv) = setup(&[]);
    let dir = cas.dir();
    let out = dir.join("out.raw");
    let shared = dir.join("shared");
    for opts in [
        "shared-cache=off".to_string(),
        format!("shared-cache={}", shared.display()),
    ] {
        let s = session(&cas, &srv, "s");
        let _ = std::fs::remove_file(&out);
        let n = during(&srv, || {
            read_in_order(dir, &s, &opts, Some(&out));
        });
        same_bytes(&src, &out);
        eprintln!("{opts}: {n:?}");
        assert!(n.requests() <= CHUNKS / 4, "{opts}: {n:?}");
        assert!(n.batches >= 3, "{opts}: {n:?}");
        assert!(
            (CHUNKS..=CHUNKS + CHUNKS / 8).contains(&n.objects),
            "{opts}: {n:?}"
        );
        std::fs::remove_dir_all(&s).unwrap();
    }
}

/// A chunk server without batch gets (one from before them, stood in for
/// by the hidden `--no-batch-get`) answers them 405: the client falls back
/// to one GET per object, remembers it, and reads right — a session read
/// in order and a checkout (which gathers 64 chunks at a time).
#[test]
fn a_server_without_batch_gets_is_asked_object_by_object() {
    let (cas, src, srv) = setup(&["--no-batch-get"]);
    let dir = cas.dir();
    let out = dir.join("out.raw");
    let s = session(&cas, &srv, "s");
    let n = during(&srv, || {
        read_in_order(dir, &s, "shared-cache=off", Some(&out));
    });
    same_bytes(&src, &out);
    eprintln!("session: {n:?}");
    assert!(n.refused_batches >= 1, "{n:?}");
    assert_eq!(n.refused_batches, n.batches, "{n:?}");
    assert!(n.batches <= 4, "asked again and again: {n:?}");
    assert!(n.gets >= CHUNKS, "{n:?}");
    assert_eq!(n.objects, n.gets);
    let co = dir.join("checkout.raw");
    let n = during(&srv, || {
        checkout(&srv.url, "u/vm", &co, &[]);
    });
    same_bytes(&src, &co);
    assert!(n.gets > CHUNKS && n.refused_batches >= 1, "{n:?}");
    // The same checkout from a server with batch gets: a few requests.
    let fast = ChunkServer::start(cas.s(), &["-vv"]);
    let co2 = dir.join("checkout2.raw");
    let n = during(&fast, || {
        checkout(&fast.url, "u/vm", &co2, &[]);
    });
    same_bytes(&src, &co2);
    eprintln!("checkout: {n:?}");
    assert!(n.requests() <= CHUNKS / 8, "{n:?}");
}

/// Behind a slow link (`store serve --latency 20ms`), a session read in
/// order with read-ahead is several times faster than without (where each
/// 64 KiB read waits for its own round trip: 128 x 20 ms at least), and
/// reads the same bytes. Random reads start no read-ahead: they fetch
/// exactly the chunks they read; two reads in sequence then do.
#[test]
fn read_ahead_speeds_a_sequential_read_and_leaves_random_reads_alone() {
    let (cas, src, srv) = setup(&["--latency", "20ms"]);
    let dir = cas.dir();
    let out = dir.join("out.raw");
    let off = session(&cas, &srv, "off");
    let on = session(&cas, &srv, "on");
    let t_off = read_in_order(dir, &off, "shared-cache=off,readahead=off", None);
    let t_on = read_in_order(dir, &on, "shared-cache=off", Some(&out));
    same_bytes(&src, &out);
    eprintln!("read-ahead {t_on:?}, without {t_off:?}");
    assert!(
        t_off >= Duration::from_millis(20 * CHUNKS as u64),
        "{t_off:?}"
    );
    assert!(t_on * 2 < t_off, "read-ahead {t_on:?}, without {t_off:?}");

    let s = session(&cas, &srv, "random");
    let nbd = Server::start(dir, &[&format!("cas[shared-cache=off]:{}", s.display())]);
    // The even chunks of the first half in a scrambled order: no read
    // follows its chunk's predecessor.
    let picks: Vec<u64> = (0..32u64).map(|k| (k * 13 % 32) * 2).collect();
    let cmds: Vec<String> = picks
        .iter()
        .map(|c| format!("read {} 4k", c * CHUNK + 8192))
        .collect();
    let n = during(&srv, || {
        qemu_io(&nbd.uri(), &cmds);
    });
    assert_eq!(n.objects, picks.len(), "{n:?}");
    // Chunks 100 and 101 read in sequence start a run: the next four come
    // without being read.
    let before = served(&srv);
    qemu_io(
        &nbd.uri(),
        &[
            format!("read {} 4k", 100 * CHUNK),
            format!("read {} 4k", 101 * CHUNK),
        ],
    );
    poll_until(Duration::from_secs(10), Duration::from_millis(50), || {
        served(&srv).objects >= before.objects + 2 + 4
    });
    let n = served(&srv).objects - before.objects;
    assert_eq!(n, 2 + 4, "chunks 100, 101 and a window of 4");
    nbd.stop();
}

/// A 1 GiB random disk committed as `u/big`, its chunk server (`-vv`) and
/// a session on it; the shared cache `shared` of at most `cap` bytes
/// (`None`: its default cap).
fn big_session(
    cap: Option<u64>,
) -> (
    Cas,
    std::path::PathBuf,
    ChunkServer,
    std::path::PathBuf,
    String,
) {
    const BIG: u64 = 1 << 30;
    let cas = Cas::new();
    let src = cas.random_file("big.raw", BIG, 24);
    commit_version(cas.s(), path_str(&src), "u/big", &[]);
    let srv = ChunkServer::start(cas.s(), &["-vv"]);
    let dir = cas.dir();
    let sess = dir.join("big-session");
    open_session(&srv.url, "u/big", &sess, &[]);
    let shared = dir.join("shared");
    if let Some(cap) = cap {
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::write(
            shared.join("cache.toml"),
            format!("magic = \"roamdisk-shared-cache\"\nversion = 1\nsize = {cap}\nunit = 65536\npolicy = \"lru\"\n"),
        )
        .unwrap();
    }
    let opts = format!("shared-cache={}", shared.display());
    (cas, src, srv, sess, opts)
}

/// A host keeps every chunk it fetched (issue 24): a 1 GiB session read
/// once at full speed (qemu-img convert, many requests in flight, faster
/// than the shared cache's disk writes) over `store serve` on loopback.
/// The chunk server sent each chunk exactly once; then, with the server
/// stopped, a second full read of the session is byte-identical: every
/// chunk came from this host. With the shared cache's default cap, and
/// with a cap of half the disk (what does not fit there goes to the
/// session's private cache).
#[test]
fn a_session_read_at_full_speed_keeps_every_chunk_it_fetched() {
    for cap in [None, Some(512u64 << 20)] {
        let (cas, src, srv, sess, opts) = big_session(cap);
        let dir = cas.dir();
        let out = dir.join("first.raw");
        let n = during(&srv, || {
            assert!(
                read_all(dir, &sess, &opts, &out),
                "cap {cap:?}: the first read failed"
            );
        });
        same_bytes(&src, &out);
        eprintln!("cap {cap:?}: first read: {n:?}");
        assert_eq!(
            n.objects,
            ((1u64 << 30) / CHUNK) as usize,
            "cap {cap:?}: {n:?}"
        );
        drop(srv);
        std::fs::remove_file(&out).unwrap();
        let again = dir.join("second.raw");
        assert!(
            read_all(dir, &sess, &opts, &again),
            "cap {cap:?}: with the chunk server stopped, the second read failed"
        );
        same_bytes(&src, &again);
    }
}

/// Offline, fast and honest (issue 24): with its chunk server stopped, a
/// session opens in well under a second; a read of a chunk that is not on
/// this host fails at once, and the log says why and what to do; the
/// server restarted on its address, the same read in the same session
/// succeeds (fetching resumes by itself).
#[test]
fn a_session_without_its_store_opens_fast_fails_fast_and_recovers() {
    let (cas, src, srv) = setup(&[]);
    let dir = cas.dir();
    let s = session(&cas, &srv, "s");
    let listen = srv.url.trim_start_matches("http://").to_string();
    drop(srv);
    // The fastest of three opens: the time is the session's, not the
    // load of a shared CI machine (one open took 714 ms there, ~190 ms
    // idle, of which 100 ms is the designed second try).
    let spec = format!("cas[shared-cache=off]:{}", s.display());
    let mut opens = Vec::new();
    let nbd = loop {
        let t0 = Instant::now();
        let nbd = Server::start(dir, &[&spec]);
        opens.push(t0.elapsed());
        if opens.len() == 3 {
            break nbd;
        }
        nbd.stop();
    };
    println!("opened without its store in {opens:?}");
    let opened = *opens.iter().min().unwrap();
    assert!(opened < Duration::from_millis(500), "opened in {opens:?}");
    let read = |at: u64| {
        let t0 = Instant::now();
        let out = common::qemu_io_command(&nbd.uri(), &[format!("read -v {at} 512")])
            .output()
            .expect("run qemu-io");
        (
            t0.elapsed(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for at in [0, 3 * CHUNK, 100 * CHUNK] {
        let (took, said) = read(at);
        assert!(said.contains("Input/output error"), "read at {at}: {said}");
        assert!(
            took < Duration::from_millis(500),
            "read at {at} failed after {took:?}"
        );
    }
    let log = std::fs::read_to_string(&nbd.log).unwrap();
    assert!(
        log.contains("cannot be reached")
            && log.contains("roamdisk hoard")
            && log.contains("resumes by itself"),
        "{log}"
    );
    let srv = ChunkServer::start_at(cas.s(), &listen, &[]);
    let want = std::fs::read(&src).unwrap();
    let at = 100 * CHUNK as usize;
    let mut back = String::new();
    let ok = poll_until(Duration::from_secs(10), Duration::from_millis(200), || {
        back = read(at as u64).1;
        !back.contains("error")
    });
    assert!(ok, "the read still fails with the store back: {back}");
    let first = format!("{:08x}:  {:02x} {:02x}", at, want[at], want[at + 1]);
    assert!(back.contains(&first), "{first} not in {back}");
    drop(srv);
    nbd.stop();
}
