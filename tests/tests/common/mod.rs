//! Helpers shared by the black-box tests: find the `roamdisk` binary, start
//! a server on a temporary Unix socket, run real client tools.
//!
//! A missing tool fails the test with a message naming `scripts/test`,
//! which installs every tool; nothing is skipped.

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]
#![allow(dead_code)]

pub mod certs;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The `roamdisk` binary under test: `$ROAMDISK_BIN`, else the workspace's
/// release build, else its debug build.
pub fn bin() -> PathBuf {
    if let Ok(p) = std::env::var("ROAMDISK_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    // The newer of the two builds: a release binary left from an older
    // tree must not silently stand in for the debug one just built.
    let newest = ["release", "debug"]
        .iter()
        .map(|profile| root.join("target").join(profile).join("roamdisk"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return p;
    }
    panic!("roamdisk binary not found: run `cargo build -p roamdisk` or scripts/test (sets ROAMDISK_BIN)");
}

/// Fail loudly if a client tool is missing.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(found, "required tool '{name}' is not installed: run scripts/test, which installs every test dependency");
}

/// A test path as `&str` (temporary paths are UTF-8).
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Panic with `what`, the exit status and both outputs unless a finished
/// command succeeded.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run a client tool (nbdinfo, qemu-io, ...) with a 20 s limit and extra
/// environment; returns its output whatever the status (124: timed out).
pub fn tool(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    require_tool(cmd);
    Command::new("timeout")
        .arg("20")
        .arg(cmd)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"))
}

/// A finished command's status, stdout and stderr, for messages.
pub fn output_text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A finished command's stdout as text.
pub fn stdout_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run a command to completion; panic with its output if it fails.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    require_tool(cmd);
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert_success(&out, &format!("{cmd} {args:?}"));
    out
}

/// Check DONE every EVERY until it holds or LIMIT has passed: whether it
/// held.
pub fn poll_until(limit: Duration, every: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while !done() {
        if t0.elapsed() > limit {
            return false;
        }
        std::thread::sleep(every);
    }
    true
}

/// SIGKILL the process in CHILD, if there is one still, and reap it.
pub fn kill_and_reap(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Run a prepared command to completion; panic with `what` and its output
/// unless it succeeds. Returns stdout.
pub fn command_stdout(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert_success(&out, what);
    stdout_text(&out)
}

/// Run a command and return its stdout as a string (must succeed).
pub fn run_stdout(cmd: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&run(cmd, args).stdout).into_owned()
}

/// Run `roamdisk` with arguments; returns the output whatever the status.
pub fn roamdisk(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run roamdisk")
}

/// ARGS followed by the whitespace-separated words of OPTS: a command line
/// whose fixed options read as one string (`argv(&["sperf", img], "--area
/// 8M")`). OPTS holds no paths, so no word has a space in it.
pub fn argv<'a>(args: &[&'a str], opts: &'a str) -> Vec<&'a str> {
    args.iter()
        .copied()
        .chain(opts.split_whitespace())
        .collect()
}

/// Run `roamdisk ARGS`; panic with its output unless it succeeds. Returns
/// stdout.
pub fn rd(args: &[&str]) -> String {
    let out = roamdisk(args);
    assert_success(&out, &format!("roamdisk {args:?}"));
    stdout_text(&out)
}

/// `roamdisk trace synth KIND -o OUT OPTS...`: a generated trace in OUT.
pub fn trace_synth(kind: &str, out: &Path, opts: &str) {
    rd(&argv(&["trace", "synth", kind, "-o", path_str(out)], opts));
}

/// A new temporary folder holding NAME, a trace made by [`trace_synth`]:
/// (folder, trace).
pub fn synth_in_tempdir(kind: &str, name: &str, opts: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let trace = dir.path().join(name);
    trace_synth(kind, &trace, opts);
    (dir, trace)
}

/// Run `roamdisk ARGS`, which must fail; returns stderr.
pub fn rd_fail(args: &[&str]) -> String {
    let out = roamdisk(args);
    assert!(
        !out.status.success(),
        "roamdisk {args:?} should have failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A new file of `size` bytes that read as zeroes (a hole), like
/// `truncate -s SIZE PATH`.
pub fn blank_file(path: &Path, size: u64) {
    std::fs::File::create(path)
        .expect("create")
        .set_len(size)
        .expect("set_len");
}

/// A running `roamdisk serve` on a Unix socket in a temporary directory.
pub struct Server {
    child: Option<Child>,
    pub socket: PathBuf,
    /// Its stderr (log lines) and its stdout (reports).
    pub log: PathBuf,
    pub out: PathBuf,
}

impl Server {
    /// Start `roamdisk serve ARGS... --socket DIR/nbd.sock` and wait until
    /// the socket accepts connections.
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        Self::start_named(dir, "nbd.sock", args)
    }

    pub fn start_named(dir: &Path, sock: &str, args: &[&str]) -> Server {
        Self::start_command(dir, sock, "serve", args)
    }

    /// Start `roamdisk COMMAND ARGS... --socket DIR/SOCK` (a command that
    /// serves NBD, such as `serve` or `resume`) and wait until it listens.
    pub fn start_command(dir: &Path, sock: &str, command: &str, args: &[&str]) -> Server {
        let socket = dir.join(sock);
        let log = dir.join(format!("{sock}.log"));
        let logf = std::fs::File::create(&log).expect("log file");
        let out = dir.join(format!("{sock}.out"));
        let outf = std::fs::File::create(&out).expect("output file");
        let child = Command::new(bin())
            .arg(command)
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(outf)
            .stderr(logf)
            .spawn()
            .expect("spawn roamdisk serve");
        let mut s = Server {
            child: Some(child),
            socket,
            log,
            out,
        };
        s.wait_ready();
        s
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("roamdisk serve exited early ({st}):\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "roamdisk serve did not listen within 20 s:\n{}",
            self.log_text()
        );
    }

    /// The NBD URI of the default export.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// The NBD URI of a named export.
    pub fn uri_of(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// qemu's JSON-free image name for the default export.
    pub fn qemu_name(&self) -> String {
        format!("nbd:unix:{}", self.socket.display())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What it printed on stdout so far.
    pub fn out_text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.terminate()
    }

    /// SIGKILL (a crash) and wait.
    pub fn kill9(mut self) {
        kill_and_reap(&mut self.child);
    }

    /// Its exit status if it has ended by itself (waiting up to
    /// `within`), else None (it still runs).
    pub fn ended_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut().expect("running");
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().expect("wait for roamdisk") {
                return Some(st);
            }
            if t0.elapsed() > within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        sigterm_and_wait(&mut c, 40)
            .unwrap_or_else(|| panic!("roamdisk serve did not stop within 40 s of SIGTERM"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate();
        }
    }
}

/// The stack spec `raw:PATH`.
pub fn spec_raw(path: &Path) -> String {
    format!("raw:{}", path.display())
}

/// The stack spec `cow:DIR/overlay.img:raw:BASE`: a copy-on-write overlay
/// in DIR over the raw file BASE.
pub fn spec_cow_raw(dir: &Path, base: &Path) -> String {
    format!(
        "cow:{}:{}",
        dir.join("overlay.img").display(),
        spec_raw(base)
    )
}

/// A new temporary folder holding `disk.raw`, SIZE bytes of zeroes, served
/// by `roamdisk serve raw:DISK EXTRA...`: (folder, image, server).
pub fn serve_blank(size: u64, extra: &[&str]) -> (tempfile::TempDir, PathBuf, Server) {
    serve_new_file(|img| blank_file(img, size), extra)
}

/// [`serve_blank`], the image SIZE random bytes (SEED).
pub fn serve_random(size: u64, seed: u64, extra: &[&str]) -> (tempfile::TempDir, PathBuf, Server) {
    serve_new_file(|img| random_file(img, size, seed), extra)
}

/// A new temporary folder holding `disk.raw`, made by MAKE, served by
/// `roamdisk serve raw:DISK EXTRA...`: (folder, image, server).
fn serve_new_file(
    make: impl FnOnce(&Path),
    extra: &[&str],
) -> (tempfile::TempDir, PathBuf, Server) {
    let dir = tempdir();
    let img = dir.path().join("disk.raw");
    make(&img);
    let srv = Server::start(dir.path(), &[&[spec_raw(&img).as_str()], extra].concat());
    (dir, img, srv)
}

/// Write `size` bytes of deterministic pseudo-random data to `path`.
pub fn random_file(path: &Path, size: u64, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).expect("write");
        left -= n as u64;
    }
    f.flush().expect("flush");
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("roamdisk-test-")
        .tempdir()
        .expect("tempdir")
}

/// The system `python3`, which has libnbd's `nbd` module (Debian's
/// python3-libnbd); the `python3` first on PATH may be another interpreter
/// without it, which also breaks `nbdsh`.
pub const PYTHON_NBD: &str = "/usr/bin/python3";

/// Start a Python script that may `import nbd`; `args` become `sys.argv[1:]`.
/// Fails the test if the interpreter or the module is missing. The script
/// dies (SIGALRM) after two minutes, so a hung server cannot hang the test.
pub fn python_nbd(script: &str, args: &[&str]) -> Command {
    let probe = Command::new(PYTHON_NBD)
        .args(["-c", "import nbd"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON_NBD}: {e}; run scripts/test"));
    assert!(
        probe.status.success(),
        "{PYTHON_NBD} cannot import nbd (package python3-libnbd): run scripts/test\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let mut c = Command::new(PYTHON_NBD);
    c.arg("-c")
        .arg(format!("import signal\nsignal.alarm(120)\n{script}"))
        .args(args);
    c
}

/// Run a libnbd Python script to completion; panic with its output if it
/// fails. Returns its stdout.
pub fn run_python_nbd(script: &str, args: &[&str]) -> String {
    let out = python_nbd(script, args).output().expect("run python");
    assert_success(&out, &format!("python script:\n{script}\n"));
    stdout_text(&out)
}

/// A child process talked to line by line: its stdin and stdout are pipes.
pub struct Talker {
    pub child: Child,
    pub out: BufReader<ChildStdout>,
    name: String,
}

impl Talker {
    /// Start CMD with piped stdin and stdout, and STDERR; NAME is what
    /// failures call it.
    pub fn spawn(mut cmd: Command, stderr: Stdio, name: &str) -> Talker {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Talker {
            child,
            out,
            name: name.to_string(),
        }
    }

    /// The next line it prints, trimmed; fails if it ended without one.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("read child stdout");
        assert!(!line.is_empty(), "{} ended without output", self.name);
        line.trim().to_string()
    }

    /// Send it LINE (with a newline); it must still be reading.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("tell {}: {e}", self.name));
    }

    /// Wait for it to exit, which it must do with status 0.
    pub fn wait_success(mut self) {
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "{} exited with {status}", self.name);
    }

    /// Send it an empty line if it still reads and reap it, whatever
    /// became of it (after a crash of its server).
    pub fn release(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.child.wait();
    }
}

/// Panic unless a `qemu-io` run succeeded: exit status 0 and no failed
/// command or pattern mismatch in its output (qemu-io reports some of
/// those with exit status 0).
pub fn check_qemu_io(out: &Output, what: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lower = text.to_lowercase();
    assert!(
        out.status.success()
            && !lower.contains("pattern verification failed")
            && !lower.contains("failed")
            && !lower.contains("error"),
        "qemu-io ({what}) failed ({}):\n{text}",
        out.status
    );
}

/// `qemu-img convert -f raw -O raw FROM TO`: copy a raw image or an NBD
/// export into a new file (or export).
pub fn qemu_img_copy(from: &str, to: &str) {
    run("qemu-img", &["convert", "-f", "raw", "-O", "raw", from, to]);
}

/// `mke2fs -q -t ext4 -d CONTENT IMAGE`: an ext4 file system holding the
/// files of the folder CONTENT, filling the (existing) file IMAGE.
pub fn mke2fs_from(content: &str, image: &str) {
    run("mke2fs", &["-q", "-t", "ext4", "-d", content, image]);
}

/// `truncate -s SIZE PATH`: a file of SIZE (`64M`, or bytes) that reads
/// as zeroes.
pub fn truncate(path: &Path, size: &str) {
    run("truncate", &["-s", size, path_str(path)]);
}

/// A new empty ext4 file system of SIZE in the file PATH (`truncate`,
/// then `mke2fs -q -F -t ext4`).
pub fn empty_ext4(path: &Path, size: &str) {
    truncate(path, size);
    run("mke2fs", &["-q", "-F", "-t", "ext4", path_str(path)]);
}

/// `debugfs -w -R REQUEST IMAGE`: change an ext2/3/4 image in place.
pub fn debugfs_w(image: &Path, request: &str) {
    run("debugfs", &["-w", "-R", request, path_str(image)]);
}

/// `e2fsck -fn IMAGE`: fails the test unless the ext2/3/4 file system in
/// IMAGE is clean.
pub fn e2fsck_clean(image: &Path) {
    run("e2fsck", &["-fn", path_str(image)]);
}

/// `qemu-img convert -f raw -O FORMAT FROM TO`.
pub fn qemu_img_convert(from: &str, format: &str, to: &str) {
    run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", format, from, to],
    );
}

/// `qemu-img compare -f raw -F raw A B`: fails the test unless the two
/// raw images (files or NBD exports) read the same.
pub fn qemu_img_compare(a: &str, b: &str) {
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b]);
}

/// `qemu-img convert -n -f raw -O raw FROM TO`: copy into an existing
/// target (an export), without creating it.
pub fn qemu_img_copy_into(from: &str, to: &str) {
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", from, to],
    );
}

/// `qemu-img convert -n -W -m 16 -f raw -O raw FROM TO`: copy into an
/// existing target with 16 coroutines writing out of order.
pub fn qemu_img_copy_into_parallel(from: &str, to: &str) {
    let args = ["convert", "-n", "-W", "-m", "16", "-f", "raw", "-O", "raw"];
    run("qemu-img", &[&args[..], &[from, to]].concat());
}

/// Run `qemu-io -f raw IMAGE -c CMD...` (IMAGE a file or an NBD URI) and
/// check it with [`check_qemu_io`]. Returns its stdout.
pub fn qemu_io(image: &str, cmds: &[String]) -> String {
    require_tool("qemu-io");
    let out = qemu_io_command(image, cmds).output().expect("run qemu-io");
    check_qemu_io(&out, image);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `qemu-io -f raw IMAGE -c CMD...` command, not started.
pub fn qemu_io_command(image: &str, cmds: &[String]) -> Command {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", image]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    c
}

/// qemu's `tls-creds-x509` object `tls0` for a client whose credentials
/// (ca-cert.pem, and client-cert.pem and client-key.pem if it has them)
/// are in DIR.
pub fn qemu_x509_creds(dir: &Path) -> String {
    format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        dir.display()
    )
}

/// qemu's `tls-creds-psk` object `tls0` for USER, its key in DIR/keys.psk
/// ([`qemu_psk_dir`]).
pub fn qemu_psk_creds(dir: &Path, user: &str) -> String {
    format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username={user}",
        dir.display()
    )
}

/// `qemu-io` arguments that run `cmds` on `export` of the NBD server at
/// 127.0.0.1:`port` over TLS, with qemu's credentials object `creds`
/// (`tls-creds-x509,...` or `tls-creds-psk,...`, whose id is `tls0`).
pub fn qemu_io_tls_args(creds: String, port: u16, export: &str, cmds: &[&str]) -> Vec<String> {
    let mut v = vec![
        "--object".to_string(),
        creds,
        "--image-opts".to_string(),
        format!("driver=nbd,host=127.0.0.1,port={port},export={export},tls-creds=tls0"),
    ];
    for c in cmds {
        v.push("-c".into());
        v.push(c.to_string());
    }
    v
}

/// Panic at the first differing byte of two files (or if their sizes differ).
pub fn assert_files_equal(a: &Path, b: &Path) {
    use std::os::unix::fs::FileExt;
    let (fa, fb) = (
        std::fs::File::open(a).expect("open a"),
        std::fs::File::open(b).expect("open b"),
    );
    let (la, lb) = (
        fa.metadata().expect("meta").len(),
        fb.metadata().expect("meta").len(),
    );
    assert_eq!(la, lb, "{} and {} differ in size", a.display(), b.display());
    let mut ba = vec![0u8; 4 << 20];
    let mut bb = vec![0u8; 4 << 20];
    let mut off = 0u64;
    while off < la {
        let n = (la - off).min(ba.len() as u64) as usize;
        fa.read_exact_at(&mut ba[..n], off).expect("read a");
        fb.read_exact_at(&mut bb[..n], off).expect("read b");
        if ba[..n] != bb[..n] {
            let i = (0..n).find(|&i| ba[i] != bb[i]).expect("a difference");
            panic!(
                "{} and {} differ at byte {}: {:#04x} vs {:#04x}",
                a.display(),
                b.display(),
                off + i as u64,
                ba[i],
                bb[i]
            );
        }
        off += n as u64;
    }
}

/// Panic at the first byte where `got` differs from `want`.
pub fn assert_bytes_equal(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if got != want {
        let i = (0..got.len())
            .find(|&i| got[i] != want[i])
            .expect("a difference");
        panic!("{what}: byte {i} is {:#04x}, want {:#04x}", got[i], want[i]);
    }
}

/// The TCP port a `roamdisk serve --listen 127.0.0.1:0` (or `roamdisk
/// server`) logs in its "on nbd://127.0.0.1:PORT" line, waiting for it;
/// panics with the log if `child` exits first or 20 s pass.
pub fn wait_for_tcp_port(child: &mut Child, log: &Path, what: &str) -> u16 {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("on nbd://127.0.0.1:").nth(1) {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if rest.len() > digits.len() {
                return digits.parse().expect("port number");
            }
        }
        if let Some(st) = child.try_wait().ok().flatten() {
            panic!("{what} exited early ({st}):\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{what} did not listen within 20 s:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// The value after `"key":` at the first occurrence of it past `from`.
pub fn num_after(text: &str, from: usize, key: &str) -> (u64, usize) {
    let pat = format!("\"{key}\":");
    let at = text[from..]
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        + from
        + pat.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (digits.parse().unwrap(), at)
}

/// The simulator's (hits, misses) for one policy at one size.
pub fn sim_counts(trace: &str, policy: &str, size: &str, block: &str, shards: &str) -> (u64, u64) {
    let json = rd(&[
        "sim",
        trace,
        "--policy",
        policy,
        "--size",
        size,
        "--block",
        block,
        "--shards",
        shards,
        "--sharing",
        "shared",
        "--no-lru-curve",
        "--json",
    ])
    .replace(char::is_whitespace, "");
    let (_, at) = num_after(&json, 0, "shards");
    let at = json[..at].rfind("\"results\"").expect("results") + 1;
    let (short_hits, at) = num_after(&json, at, "hits");
    let (short_misses, at) = num_after(&json, at, "misses");
    let (long_hits, at) = num_after(&json, at, "hits");
    let (long_misses, _) = num_after(&json, at, "misses");
    (short_hits + long_hits, short_misses + long_misses)
}

/// SIGTERM to CHILD (`kill -TERM`), then wait up to SECONDS for it to
/// exit: its status, or `None` when it did not (it is then killed and
/// reaped).
pub fn sigterm_and_wait(c: &mut Child, seconds: u64) -> Option<ExitStatus> {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(seconds) {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
    None
}

/// A TCP port on 127.0.0.1 free a moment ago (for a config that must
/// name its port up front).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A running `roamdisk server CONFIG`, its stderr in `log`; killed when
/// dropped, unless stopped first.
pub struct ServerProc {
    child: Option<Child>,
    pub log: PathBuf,
    /// The TCP port of a `listen`, when started by [`ServerProc::start_tcp`].
    tcp_port: Option<u16>,
}

impl ServerProc {
    /// Start it and wait for its "serving ... on" line (the TCP port of
    /// a `listen` is then in [`ServerProc::port`]).
    pub fn start(config: &Path, log: PathBuf) -> ServerProc {
        let child = Command::new(bin())
            .args(["server", path_str(config)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn roamdisk server");
        let mut s = ServerProc {
            child: Some(child),
            log,
            tcp_port: None,
        };
        let t0 = Instant::now();
        while !s.log_text().contains("serving") {
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("roamdisk server exited early ({st}):\n{}", s.log_text());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "roamdisk server did not start:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Start it with a config that has `listen`, and wait for the TCP port
    /// it logs too ([`ServerProc::port`]).
    pub fn start_tcp(config: &Path, log: PathBuf) -> ServerProc {
        let mut s = ServerProc::start(config, log);
        let log = s.log.clone();
        let port = wait_for_tcp_port(s.child.as_mut().expect("running"), &log, "roamdisk server");
        s.tcp_port = Some(port);
        s
    }

    /// The TCP port it listens on (started by [`ServerProc::start_tcp`]).
    pub fn port(&self) -> u16 {
        self.tcp_port
            .expect("a server started by ServerProc::start_tcp")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log must get, within 5 s, a warning line holding every one of
    /// `words`.
    pub fn assert_logged(&self, words: &[&str]) {
        let t0 = Instant::now();
        loop {
            let log = self.log_text();
            if log
                .lines()
                .any(|l| l.contains("WARN") && words.iter().all(|w| l.contains(w)))
            {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "no warning with {words:?} in the server log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send SIGHUP (the server reads its config again).
    pub fn sighup(&self) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        run("kill", &["-HUP", &pid]);
    }

    /// SIGKILL (a crash), waited for.
    pub fn kill9(mut self) {
        kill_and_reap(&mut self.child);
    }

    /// SIGTERM, and it must exit cleanly within 30 s.
    pub fn stop(mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let st = sigterm_and_wait(&mut c, 30)
            .unwrap_or_else(|| panic!("roamdisk server did not stop within 30 s"));
        assert!(
            st.success(),
            "server exited with {st}:\n{}",
            self.log_text()
        );
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// Write DIR/server.toml, a `roamdisk server` config: the format line,
/// version 1, `state = "state"`, then REST; returns its path.
pub fn write_server_config(dir: &Path, rest: &str) -> PathBuf {
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!("format = \"roamdisk-server\"\nversion = 1\nstate = \"state\"\n{rest}"),
    )
    .expect("write server.toml");
    config
}

/// `DIR/NAME`, a folder as qemu's `tls-creds-psk` wants it: a copy of the
/// PSK file KEYS as `keys.psk`.
pub fn qemu_psk_dir(dir: &Path, name: &str, keys: &Path) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir(&d).unwrap();
    std::fs::copy(keys, d.join("keys.psk")).unwrap();
    d
}

/// A server config's `[[image]]` table: NAME serving the raw file PATH.
pub fn raw_image(name: &str, path: &Path) -> String {
    format!(
        "\n[[image]]\nname = \"{name}\"\nstack = \"raw:{}\"\n",
        path.display()
    )
}

/// A server config's `[[client]]` table: NAME, proved by ID (a line such as
/// `cert-cn = "NAME"` or `uid = N`), with its GRANTS (`view = [...]`,
/// `read-only = [...]` lines).
pub fn client_table(name: &str, id: &str, grants: &str) -> String {
    format!("\n[[client]]\nname = \"{name}\"\n{id}\n{grants}\n")
}

/// [`client_table`] of a client known by this process's uid (on the Unix
/// socket).
pub fn local_client(name: &str, grants: &str) -> String {
    client_table(name, &format!("uid = {}", uid()), grants)
}

/// [`client_table`] of a client whose TLS-PSK identity is its NAME.
pub fn psk_client(name: &str, grants: &str) -> String {
    client_table(name, &format!("psk-identity = \"{name}\""), grants)
}

/// This process's uid, as a config's `uid = ...` wants it.
pub fn uid() -> String {
    run_stdout("id", &["-u"]).trim().to_string()
}

/// `psktool -u NAME -p FILE`: a new random TLS-PSK key for NAME added to
/// FILE (made if missing).
pub fn psk_add(file: &Path, name: &str) {
    run("psktool", &["-u", name, "-p", path_str(file)]);
}

/// A libnbd client writing 4 KiB at 0 of the export at URI, whatever the
/// server allows: it prints "REFUSED errno" or "WROTE".
pub fn nbd_direct_write(uri: &str) -> Output {
    let script = format!(
        "import nbd\nh = nbd.NBD()\nh.set_strict_mode(0)\nh.set_uri_allow_local_file(True)\nh.connect_uri({uri:?})\ntry:\n    h.pwrite(b'x' * 4096, 0)\n    print('WROTE')\nexcept nbd.Error as e:\n    print('REFUSED', e.errno)\n"
    );
    python_nbd(&script, &[]).output().expect("run python")
}
