//! The two cache levels of a session under crashes and a full shared
//! cache (Machine Bank 3.3), for both kinds of private cache: the sparse
//! file (`--cache raw`) and an LBS image (`--cache lbs`).
//!
//! - `kill -9` of the server: every write flushed before it is there after
//!   a restart, and in the version a commit makes;
//! - a shared cache at its byte cap with two sessions running and a third
//!   starting: the cap holds, no chunk a running session still reads from
//!   its base is evicted (the sessions pin them), chunks the cache refuses
//!   are kept in the session's private cache, and after `kill -9` and with
//!   the chunk server gone, every session still reads its whole disk —
//!   nothing cached is fetched again, because nothing can be.

mod cas_common;
mod common;

use std::path::{Path, PathBuf};

use cas_common::{
    checkout, commit_session, commit_version, convert_ok, open_session, Cas, ChunkServer,
};
use common::{path_str, qemu_img_compare, qemu_io, Server};

const SIZE: u64 = 8 << 20;
const K64: u64 = 65536;

/// `cas[shared-cache=CACHE]:SESS` served; its whole disk copied to OUT by
/// qemu-img: whether that succeeded (the disconnect settles the session).
fn read_all(dir: &Path, sess: &Path, cache: &Path, out: &Path) -> bool {
    let srv = serve(dir, sess, cache);
    let ok = convert_ok(&srv.uri(), out);
    srv.stop();
    ok
}

fn serve(dir: &Path, sess: &Path, cache: &Path) -> Server {
    let name = format!("{}.sock", sess.file_name().unwrap().to_str().unwrap());
    Server::start_named(
        dir,
        &name,
        &[&format!(
            "cas[shared-cache={}]:{}",
            cache.display(),
            sess.display()
        )],
    )
}

/// Poll `ok` for up to 30 s.
fn wait_for(ok: impl Fn() -> bool) -> bool {
    common::poll_until(
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(50),
        ok,
    )
}

/// Bytes of the chunk files in a shared cache.
fn cached_bytes(cache: &Path) -> u64 {
    walk(&cache.join("chunks"))
}

fn walk(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path())
                } else {
                    e.metadata().unwrap().len()
                }
            })
            .sum()
        })
        .unwrap_or(0)
}

/// A copy of FILE with BYTE written over `[off, off + len)`.
fn patched(file: &Path, out: &Path, off: u64, len: u64, byte: u8) -> PathBuf {
    let mut b = std::fs::read(file).unwrap();
    b[off as usize..(off + len) as usize].fill(byte);
    std::fs::write(out, b).unwrap();
    out.to_path_buf()
}

fn flushed_writes_survive_kill_9(cache_kind: &str) {
    let cas = Cas::new();
    let dir = cas.dir();
    let src = cas.random_file("disk.raw", SIZE, 31);
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let sess = dir.join("sess");
    open_session(cas.s(), "u/vm", &sess, &["--cache", cache_kind]);
    let shared = dir.join("shared");
    let srv = serve(dir, &sess, &shared);
    // Flushed: 0x11 over 1 MiB at 1 MiB, a partial-sector write at 3 MiB
    // + 100 (read-modify-write of the base), zeroes at 5 MiB.
    qemu_io(
        &srv.uri(),
        &[
            "write -P 0x11 1M 1M".into(),
            format!("write -P 0x22 {} 1000", (3 << 20) + 100),
            "write -z 5M 256K".into(),
            "flush".into(),
        ],
    );
    srv.kill9();
    let mut want = std::fs::read(&src).unwrap();
    want[1 << 20..2 << 20].fill(0x11);
    want[(3 << 20) + 100..(3 << 20) + 1100].fill(0x22);
    want[5 << 20..(5 << 20) + (256 << 10)].fill(0);
    let want_path = dir.join("want.raw");
    std::fs::write(&want_path, &want).unwrap();
    let out = dir.join("out.raw");
    assert!(
        read_all(dir, &sess, &shared, &out),
        "{cache_kind}: reopened"
    );
    qemu_img_compare(path_str(&want_path), path_str(&out));
    // And the commit holds them.
    commit_session(&sess, &["-m", "after kill -9"]);
    let co = dir.join("co.raw");
    checkout(cas.s(), "u/vm", &co, &[]);
    qemu_img_compare(path_str(&want_path), path_str(&co));
}

#[test]
fn flushed_writes_survive_kill_9_with_a_sparse_file_cache() {
    flushed_writes_survive_kill_9("raw");
}

#[test]
fn flushed_writes_survive_kill_9_with_an_lbs_cache() {
    flushed_writes_survive_kill_9("lbs");
}

#[test]
fn a_full_shared_cache_keeps_what_running_sessions_need_and_the_rest_stays_private() {
    let cas = Cas::new();
    let dir = cas.dir();
    let a = cas.random_file("a.raw", SIZE, 41);
    let b = cas.random_file("b.raw", SIZE, 42);
    commit_version(cas.s(), path_str(&a), "u/a", &[]);
    commit_version(cas.s(), path_str(&b), "u/b", &[]);
    let chunks = ChunkServer::start(cas.s(), &[]);
    let url = chunks.url.clone();
    // The shared cache holds 10 MiB: image a (8 MiB) and a quarter of b.
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let cap = 10u64 << 20;
    std::fs::write(
        shared.join("cache.toml"),
        format!("magic = \"roamdisk-shared-cache\"\nversion = 1\nsize = {cap}\nunit = 65536\npolicy = \"lru\"\n"),
    )
    .unwrap();
    let s1 = dir.join("s1");
    let s2 = dir.join("s2");
    let s3 = dir.join("s3");
    open_session(&url, "u/a", &s1, &[]);
    open_session(&url, "u/b", &s2, &["--cache", "lbs"]);
    open_session(&url, "u/a", &s3, &[]);
    let out = dir.join("out.raw");
    // Session 1 runs (and pins a's chunks) while session 2 reads all of b
    // and writes, flushed, 64 KiB at 2 MiB.
    let run1 = serve(dir, &s1, &shared);
    assert!(convert_ok(&run1.uri(), &out));
    qemu_img_compare(path_str(&a), path_str(&out));
    // The cache stores what it is handed in the background.
    assert!(
        wait_for(|| cached_bytes(&shared) == SIZE),
        "a's chunks were not all stored: {} bytes",
        cached_bytes(&shared)
    );
    let run2 = serve(dir, &s2, &shared);
    assert!(convert_ok(&run2.uri(), &out));
    qemu_img_compare(path_str(&b), path_str(&out));
    qemu_io(
        &run2.uri(),
        &[format!("write -P 0x33 {} {K64}", 2 << 20), "flush".into()],
    );
    let filled = wait_for(|| cached_bytes(&shared) >= cap - 2 * K64);
    let used = cached_bytes(&shared);
    assert!(
        used <= cap,
        "the shared cache holds {used} bytes, over its {cap}-byte cap"
    );
    assert!(filled, "the cache was not filled: {used} bytes");
    // Crash: kill -9 of session 2's server, then the network goes.
    run2.kill9();
    drop(chunks);
    // A third session starts on a: every chunk is still in the cache.
    assert!(
        read_all(dir, &s3, &shared, &out),
        "a's chunks were evicted while session 1 ran"
    );
    qemu_img_compare(path_str(&a), path_str(&out));
    // Session 2 restarts: what the cache refused is in its private cache,
    // and its flushed write is there.
    let want_b = patched(&b, &dir.join("want-b.raw"), 2 << 20, K64, 0x33);
    assert!(
        read_all(dir, &s2, &shared, &out),
        "session 2 needed the network after its restart"
    );
    qemu_img_compare(path_str(&want_b), path_str(&out));
    assert!(cached_bytes(&shared) <= cap);
    run1.stop();
}

/// A guest write over sectors the session holds CLEAN (fetched ahead into
/// its private cache with the shared cache off) lands in the private cache
/// in place and is logged only at the next flush. The server is killed
/// before that flush: after the restart the session must not keep calling
/// those sectors CLEAN (equal to the base), or the next commit skips bytes
/// the session itself now reads. The commit and the session agree.
#[test]
fn an_unflushed_write_over_clean_sectors_is_not_lost_to_the_next_commit() {
    let cas = Cas::new();
    let dir = cas.dir();
    let src = cas.random_file("disk.raw", SIZE, 47);
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let sess = dir.join("sess");
    open_session(cas.s(), "u/vm", &sess, &[]);
    let srv = Server::start_named(
        dir,
        "clean.sock",
        &[&format!("cas[shared-cache=off]:{}", sess.display())],
    );
    // Three chunks read in sequence: read-ahead fetches the next ones into
    // the private cache as CLEAN, in the background.
    qemu_io(
        &srv.uri(),
        &[
            "read 0 64k".into(),
            "read 64k 64k".into(),
            "read 128k 64k".into(),
        ],
    );
    let base = std::fs::read(&src).unwrap();
    let target = 5 * K64;
    let private = sess.join("cache.raw");
    assert!(
        wait_for(|| {
            let mut b = vec![0u8; K64 as usize];
            std::fs::File::open(&private)
                .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, target))
                .is_ok()
                && b[..] == base[target as usize..(target + K64) as usize]
        }),
        "read-ahead did not bring chunk 5 into the private cache"
    );
    // Write over it and kill the server while the connection is open (a
    // disconnect would flush).
    let script = format!(
        "import nbd, os\nh = nbd.NBD()\nh.connect_uri({:?})\nh.pwrite(b'\\x77' * 4096, {})\nos.kill({}, 9)\n",
        srv.uri(),
        target + 4096,
        srv.pid()
    );
    common::run_python_nbd(&script, &[]);
    srv.kill9();
    // What the session reads now, and what its commit holds, agree.
    let now = dir.join("now.raw");
    assert!(read_all(dir, &sess, Path::new("off"), &now), "reopened");
    commit_session(&sess, &["-m", "after kill -9"]);
    let co = dir.join("co.raw");
    checkout(cas.s(), "u/vm", &co, &[]);
    qemu_img_compare(path_str(&now), path_str(&co));
}
