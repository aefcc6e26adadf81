//! Helpers of the content-addressed image tests (`cas_*.rs`): a folder
//! with a new store, commits, checkouts and sessions run with `roamdisk`
//! (which must succeed), read numbers from its JSON output,
//! measure a store, and play "guest": write into a served disk only the
//! 4 KiB blocks that differ between two states of a disk image, as a guest
//! file system would have written them.

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::common::{
    bin, path_str, qemu_img_compare, qemu_io, random_file, run_python_nbd, tempdir, Server,
};
pub use crate::common::{rd, rd_fail};

/// A new chunk store in `dir/store` (`roamdisk store init`).
pub fn init_store(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    rd(&["store", "init", path_str(&store)]);
    store
}

/// A test's temporary folder and a new chunk store: a local one in
/// `store`, or, when `ROAMDISK_TEST_S3` is set (`s3://BUCKET[/PREFIX]`),
/// one under a unique prefix of that bucket (endpoint and keys from the
/// `AWS_*` variables; `gc-margin=2s` so gc tests need not wait a minute).
pub struct Cas {
    tmp: TempDir,
    /// The local store's folder (in S3 mode a path nothing is in).
    pub store: PathBuf,
    spec: String,
}

/// The bucket (and prefix) of the S3 mode, if on.
pub fn s3_base() -> Option<String> {
    std::env::var("ROAMDISK_TEST_S3")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('/').to_string())
}

/// A prefix no other store of any test process uses.
fn unique_prefix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!(
        "t{nanos:x}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Cas {
    /// A store made by a plain `roamdisk store init`.
    pub fn new() -> Cas {
        Cas::with(&[])
    }

    /// A store made by `roamdisk store init STORE INIT...`: in the S3
    /// bucket in S3 mode, else local.
    pub fn with(init: &[&str]) -> Cas {
        match s3_base() {
            Some(base) => {
                let tmp = tempdir();
                let store = tmp.path().join("store");
                let spec = format!("{base}/{}?gc-margin=2s", unique_prefix());
                rd(&[&["store", "init", &spec], init].concat());
                Cas { tmp, store, spec }
            }
            None => Cas::local_with(init),
        }
    }

    /// A local store (`dir/store`) whatever the mode: for tests that read
    /// or edit the store's files.
    pub fn local() -> Cas {
        Cas::local_with(&[])
    }

    /// [`Cas::local`] with `store init` options.
    pub fn local_with(init: &[&str]) -> Cas {
        let tmp = tempdir();
        let store = tmp.path().join("store");
        rd(&[&["store", "init", path_str(&store)], init].concat());
        let spec = path_str(&store).to_string();
        Cas { tmp, store, spec }
    }

    /// The temporary folder.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// A new file NAME in the folder: SIZE bytes of random data (SEED).
    pub fn random_file(&self, name: &str, size: u64, seed: u64) -> PathBuf {
        let path = self.dir().join(name);
        random_file(&path, size, seed);
        path
    }

    /// A copy NAME of the image OF with SIZE random bytes (SEED) of its own
    /// put at OFFSET: a later state of the same disk.
    pub fn variant(&self, of: &Path, name: &str, (size, seed): (u64, u64), offset: u64) -> PathBuf {
        let v = self.dir().join(name);
        std::fs::copy(of, &v).expect("copy the image");
        let part = self.random_file(&format!("{name}.part"), size, seed);
        put_at(&v, &part, offset);
        v
    }

    /// The store as a `--store` argument (a path or an `s3://` URL).
    pub fn s(&self) -> &str {
        &self.spec
    }
}

/// A new image NAME of SIZE random bytes (SEED) in the store's folder,
/// committed to TO with EXTRA options: the image and the version.
pub fn random_version(
    cas: &Cas,
    (name, size, seed): (&str, u64, u64),
    to: &str,
    extra: &[&str],
) -> (PathBuf, String) {
    let img = cas.random_file(name, size, seed);
    let v = commit_version(cas.s(), path_str(&img), to, extra);
    (img, v)
}

/// `roamdisk hoard IMAGE --store STORE --shared-cache CACHE EXTRA...`;
/// returns stdout.
pub fn hoard(store: &str, image: &str, cache: &str, extra: &[&str]) -> String {
    rd(&[
        &["hoard", image, "--store", store, "--shared-cache", cache],
        extra,
    ]
    .concat())
}

/// A session SESS (checked out while its store is reachable) served with
/// `cas[OPTS]:SESS`, its whole disk copied to OUT by qemu-img: whether
/// that succeeded.
pub fn read_all(dir: &Path, sess: &Path, opts: &str, out: &Path) -> bool {
    let srv = Server::start(dir, &[&format!("cas[{opts}]:{}", sess.display())]);
    let ok = convert_ok(&srv.uri(), out);
    srv.stop();
    ok
}

/// The arguments `commit SRC --to NAME --store STORE EXTRA...`.
pub fn commit_args<'a>(
    store: &'a str,
    src: &'a str,
    to: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    [&["commit", src, "--to", to, "--store", store], extra].concat()
}

/// `roamdisk commit SRC --to NAME --store STORE EXTRA...`; returns stdout.
pub fn commit(store: &str, src: &str, to: &str, extra: &[&str]) -> String {
    rd(&commit_args(store, src, to, extra))
}

/// `roamdisk gc --store STORE --json` again and again, PAUSE apart, until
/// the background CHILD (a commit) has ended, at most LIMIT: (gc runs,
/// objects they removed).
pub fn gc_until_exit(
    store: &str,
    child: &mut Child,
    limit: Duration,
    pause: Duration,
) -> (u64, u64) {
    let t0 = Instant::now();
    let (mut runs, mut removed) = (0, 0);
    loop {
        let r = rd(&["gc", "--store", store, "--json"]);
        removed += json_num(&r, "removed_objects");
        runs += 1;
        if child.try_wait().unwrap().is_some() {
            return (runs, removed);
        }
        assert!(
            t0.elapsed() < limit,
            "commit did not finish within {limit:?}"
        );
        std::thread::sleep(pause);
    }
}

/// [`commit`] with `--json`; returns the new version's id.
pub fn commit_version(store: &str, src: &str, to: &str, extra: &[&str]) -> String {
    json_str(
        &commit(store, src, to, &[&["--json"], extra].concat()),
        "version",
    )
}

/// `roamdisk checkout REV --store STORE --output OUT EXTRA...`; returns
/// stdout.
pub fn checkout(store: &str, rev: &str, out: &Path, extra: &[&str]) -> String {
    rd(&checkout_args(store, rev, out, extra))
}

/// [`checkout`], which must fail; returns stderr.
pub fn checkout_fail(store: &str, rev: &str, out: &Path, extra: &[&str]) -> String {
    rd_fail(&checkout_args(store, rev, out, extra))
}

fn checkout_args<'a>(
    store: &'a str,
    rev: &'a str,
    out: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    [
        &["checkout", rev, "--store", store, "--output", path_str(out)],
        extra,
    ]
    .concat()
}

/// Check out REV into OUT (replacing it) and `qemu-img compare` it with
/// WANT.
pub fn checkout_same(store: &str, rev: &str, want: &Path, out: &Path) {
    let _ = std::fs::remove_file(out);
    checkout(store, rev, out, &[]);
    qemu_img_compare(path_str(want), path_str(out));
}

/// `roamdisk checkout REV --store STORE --session SESS EXTRA...`: a new
/// session over version REV.
pub fn open_session(store: &str, rev: &str, sess: &Path, extra: &[&str]) {
    let args = [
        "checkout",
        rev,
        "--store",
        store,
        "--session",
        path_str(sess),
    ];
    rd(&[&args[..], extra].concat());
}

/// The stack spec of a session, `cas:SESS`.
pub fn session_spec(sess: &Path) -> String {
    format!("cas:{}", sess.display())
}

/// `roamdisk commit cas:SESS EXTRA...`; returns stdout.
pub fn commit_session(sess: &Path, extra: &[&str]) -> String {
    rd(&[&["commit", &session_spec(sess)], extra].concat())
}

/// Serve the session SESS over NBD (socket in DIR), run `qemu-io` with
/// CMDS against it, and stop the server.
pub fn qemu_io_session(dir: &Path, sess: &Path, cmds: &[String]) {
    let srv = Server::start(dir, &[&session_spec(sess)]);
    qemu_io(&srv.uri(), cmds);
    srv.stop();
}

/// The text after `"key":` in a JSON text, from its value on.
fn json_value<'a>(text: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("no \"{key}\" in:\n{text}"))
        + pat.len();
    text[at..].trim_start()
}

/// The first number after `"key":` in a JSON text.
pub fn json_num(text: &str, key: &str) -> u64 {
    let rest = json_value(text, key);
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("\"{key}\" is not a number in:\n{text}"))
}

/// The first string after `"key":` in a JSON text.
pub fn json_str(text: &str, key: &str) -> String {
    let rest = json_value(text, key);
    let rest = rest.strip_prefix('"').expect("a string value");
    rest[..rest.find('"').expect("closing quote")].to_string()
}

/// Bytes of every object file and pack file of a local store.
pub fn store_bytes(store: &Path) -> u64 {
    store_files(store)
        .iter()
        .map(|f| std::fs::metadata(f).expect("meta").len())
        .sum()
}

/// Every loose object file of a local store (`objects/XX/ID`: version
/// packages, objects put one at a time).
pub fn object_files(store: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for fan in std::fs::read_dir(store.join("objects")).expect("objects dir") {
        for f in std::fs::read_dir(fan.expect("entry").path()).expect("fan-out dir") {
            v.push(f.expect("entry").path());
        }
    }
    v.sort();
    v
}

/// Every pack file of a local store (`packs/NAME.pack`).
pub fn pack_files(store: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(store.join("packs")) {
        Ok(rd) => rd.map(|e| e.expect("entry").path()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Every file holding objects: loose object files and packs.
pub fn store_files(store: &Path) -> Vec<PathBuf> {
    let mut v = object_files(store);
    v.extend(pack_files(store));
    v
}

/// The object file of a hex id.
pub fn object_file(store: &Path, hex: &str) -> PathBuf {
    store.join("objects").join(&hex[..2]).join(hex)
}

/// One object in a pack, as the pack's index says
/// (`docs/formats/cas-pack.md`: trailer = index offset u64, count u32, ...;
/// 48-byte entries = id, offset u64, length u32, reserved).
pub struct Packed {
    pub pack: PathBuf,
    pub id: String,
    pub offset: u64,
    pub len: u64,
}

/// Every object in every pack of a local store.
pub fn packed_objects(store: &Path) -> Vec<Packed> {
    let mut out = Vec::new();
    for pack in pack_files(store) {
        let b = std::fs::read(&pack).expect("pack");
        let t = &b[b.len() - 56..];
        let le = |x: &[u8]| x.iter().rev().fold(0u64, |a, &c| (a << 8) | c as u64);
        let (at, count) = (le(&t[..8]) as usize, le(&t[8..12]) as usize);
        for e in b[at..at + count * 48].chunks_exact(48) {
            out.push(Packed {
                pack: pack.clone(),
                id: e[..32].iter().map(|x| format!("{x:02x}")).collect(),
                offset: le(&e[32..40]),
                len: le(&e[40..44]),
            });
        }
    }
    out
}

/// Objects in a local store: loose files and packed objects.
pub fn object_count(store: &Path) -> usize {
    object_files(store).len() + packed_objects(store).len()
}

/// Write into the NBD export `uri` every 4 KiB block where `new` differs
/// from `old` (both raw images of the same size). Returns the bytes
/// written.
pub fn write_diff(uri: &str, old: &Path, new: &Path) -> u64 {
    let script = r#"
import sys, nbd
uri, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
h = nbd.NBD()
h.connect_uri(uri)
B = 4096
n = 0
with open(old, 'rb') as a, open(new, 'rb') as b:
    off = 0
    while True:
        x = a.read(1 << 20)
        y = b.read(1 << 20)
        if not y:
            break
        for i in range(0, len(y), B):
            if x[i:i+B] != y[i:i+B]:
                h.pwrite(y[i:i+B], off + i)
                n += len(y[i:i+B])
        off += len(y)
h.flush()
h.shutdown()
print(n)
"#;
    let out = run_python_nbd(script, &[uri, old.to_str().unwrap(), new.to_str().unwrap()]);
    out.trim().parse().expect("bytes written")
}

/// Copy `part` into `disk` at byte `offset` (in place).
pub fn put_at(disk: &Path, part: &Path, offset: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let data = std::fs::read(part).expect("read part");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .expect("open disk");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&data).expect("write");
}

/// `qemu-img convert` of an export to a raw file OUT (replaced): whether
/// it succeeded.
pub fn convert_ok(uri: &str, out: &Path) -> bool {
    let _ = std::fs::remove_file(out);
    Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", uri, path_str(out)])
        .output()
        .expect("qemu-img")
        .status
        .success()
}

/// `roamdisk store serve STORE --listen 127.0.0.1:0 EXTRA...` on a free
/// loopback port, its stderr (the log) kept in a file; killed when
/// dropped.
pub struct ChunkServer {
    child: Child,
    /// `http://127.0.0.1:PORT`, or `https://` with `--tls-cert`.
    pub url: String,
    log: tempfile::NamedTempFile,
}

impl ChunkServer {
    /// STORE: a local store's folder or an `s3://` URL (`cas.s()`).
    pub fn start(store: impl AsRef<std::ffi::OsStr>, extra: &[&str]) -> ChunkServer {
        Self::start_at(store, "127.0.0.1:0", extra)
    }

    /// [`ChunkServer::start`] listening on `listen` (`HOST:PORT`): a
    /// server restarted where its clients know it.
    pub fn start_at(
        store: impl AsRef<std::ffi::OsStr>,
        listen: &str,
        extra: &[&str],
    ) -> ChunkServer {
        let log = tempfile::Builder::new()
            .prefix("roamdisk-store-serve-")
            .suffix(".log")
            .tempfile()
            .expect("log file");
        let child = Command::new(bin())
            .args(["store", "serve"])
            .arg(store)
            .args(["--listen", listen])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log file"))
            .spawn()
            .expect("spawn store serve");
        let mut srv = ChunkServer {
            child,
            url: String::new(),
            log,
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            let text = srv.log_text();
            if let Some(url) = text
                .split_whitespace()
                .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            {
                // The whole address is written once a space follows it.
                if text.contains(&format!("{url} ")) {
                    srv.url = url.to_string();
                    return srv;
                }
            }
            if let Ok(Some(st)) = srv.child.try_wait() {
                panic!("roamdisk store serve exited early ({st}):\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "roamdisk store serve did not listen within 20 s:\n{}",
            srv.log_text()
        );
    }

    /// Kill the server (its clients find nothing listening).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for ChunkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
