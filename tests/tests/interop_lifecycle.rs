//! Connection and server life cycle: SIGTERM shuts down cleanly (status 0,
//! socket removed, acknowledged writes in the file, even with clients
//! connected or writing), and a client that vanishes mid-stream loses
//! nothing the server acknowledged, while the server keeps serving others.
//! The vanishing-client case runs on a raw file and on a cow stack, which is
//! then restarted to show the acknowledged writes persist.

mod common;

use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;
const BS: u64 = 65536;

/// Python helpers every script shares: block `i` of a stream is 8-byte
/// copies of its global number, so a block written to the wrong place shows.
const PRELUDE: &str = r#"
import os, signal, sys, nbd
signal.alarm(60)
BS = 65536
def block(start, i):
    return ((start // BS + i) % 2**64).to_bytes(8, "little") * (BS // 8)
def say(*a):
    print(*a, flush=True)
"#;

fn script(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

/// Writes blocks at `START + i*BS`: 16 synchronous writes, a flush, 16 more
/// synchronous writes, then a burst of BURST queued writes; once a quarter
/// of the burst is acknowledged it kills itself (SIGKILL) with the rest in
/// flight. Prints `acked I` for every acknowledged write.
const DYING_WRITER: &str = r#"
uri, START, BURST = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
for i in range(16):
    h.pwrite(block(START, i), START + i * BS)
    say("acked", i)
h.flush()
for i in range(16, 32):
    h.pwrite(block(START, i), START + i * BS)
    say("acked", i)
cookies = {}
for i in range(32, 32 + BURST):
    cookies[h.aio_pwrite(block(START, i), START + i * BS)] = i
done = 0
while done < BURST // 4:
    h.poll(-1)
    for ck, i in list(cookies.items()):
        if h.aio_command_completed(ck):
            say("acked", i)
            del cookies[ck]
            done += 1
say("inflight", h.aio_in_flight())
os.kill(os.getpid(), signal.SIGKILL)
"#;

/// Reads back blocks `0..N` at `START + i*BS`: an acknowledged block must
/// hold its data; any other one its data or the old bytes (from file OLD).
/// Prints one letter per block: W (written) or O (old).
const VERIFIER: &str = r#"
uri, old_path, START, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
acked = set(int(x) for x in sys.argv[5].split(",") if x)
h = nbd.NBD()
h.connect_uri(uri)
old = open(old_path, "rb")
sig = []
for i in range(N):
    got = h.pread(BS, START + i * BS)
    old.seek(START + i * BS)
    if got == block(START, i):
        sig.append("W")
    elif i in acked:
        sys.exit(f"acknowledged block {i} at {START + i * BS} was lost")
    elif got == old.read(BS):
        sig.append("O")
    else:
        sys.exit(f"block {i} at {START + i * BS} holds neither its data nor the old bytes")
h.shutdown()
say("".join(sig))
"#;

/// Connects, says `ready`, waits for a line on stdin, then writes, flushes
/// and reads back one block and says `ok`.
const BYSTANDER: &str = r#"
uri, START = sys.argv[1], int(sys.argv[2])
h = nbd.NBD()
h.connect_uri(uri)
h.pread(BS, START)
say("ready")
sys.stdin.readline()
h.pwrite(block(START, 0), START)
h.flush()
assert h.pread(BS, START) == block(START, 0)
h.shutdown()
say("ok")
"#;

/// Start a script with the [`PRELUDE`], to be talked to line by line.
fn spawn_python(body: &str, args: &[&str], name: &str) -> Talker {
    Talker::spawn(python_nbd(&script(body), args), Stdio::piped(), name)
}

fn verify(uri: &str, old: &Path, start: u64, n: u64, acked: &[u64]) -> String {
    let acked: Vec<String> = acked.iter().map(u64::to_string).collect();
    run_python_nbd(
        &script(VERIFIER),
        &[
            uri,
            old.to_str().expect("utf-8"),
            &start.to_string(),
            &n.to_string(),
            &acked.join(","),
        ],
    )
    .trim()
    .to_string()
}

/// Proof 10: SIGTERM with a client connected (idle, its last write not
/// flushed) exits promptly with status 0, removes the socket, and the write
/// is in the file; the client sees the connection close.
#[test]
fn sigterm_with_client_connected_exits_zero_and_keeps_writes() {
    let (_dir, img, srv) = serve_blank(16 * MIB, &[]);
    let socket = srv.socket.clone();
    // A qemu-io session that has come and gone.
    qemu_io(&srv.uri(), &["write -P 0x5a 4096 100000".into()]);
    // A client that wrote without flushing and stays connected.
    let mut client = spawn_python(
        r#"
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"roamdisk" * 8192, 8 * 1048576 + 3)
say("written")
sys.stdin.readline()
try:
    h.pread(512, 0)
    say("still served")
except nbd.Error as e:
    say("closed")
"#,
        &[&srv.uri()],
        "client",
    );
    assert_eq!(client.line(), "written");
    let log_path = srv.log.clone();
    let t0 = Instant::now();
    let status = srv.stop();
    let took = t0.elapsed();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.success(),
        "exit status {status} after SIGTERM:\n{log}"
    );
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?} with an idle client connected"
    );
    assert!(!socket.exists(), "socket {} left behind", socket.display());
    assert!(log.contains("stopped cleanly"), "log:\n{log}");
    client.tell("go");
    assert_eq!(client.line(), "closed");
    client.wait_success();

    let got = std::fs::read(&img).expect("read");
    assert!(
        got[4096..104_096].iter().all(|&b| b == 0x5a),
        "qemu-io write missing"
    );
    let at = 8 * MIB as usize + 3;
    assert_eq!(
        &got[at..at + 65536],
        b"roamdisk".repeat(8192).as_slice(),
        "unflushed write missing"
    );
    assert!(
        got[..4096].iter().all(|&b| b == 0),
        "bytes before the writes changed"
    );
}

/// SIGTERM while a client streams writes with 64 in flight: status 0, and
/// every write the server acknowledged is in the file.
#[test]
fn sigterm_during_write_burst_keeps_acknowledged_writes() {
    let size = 64 * MIB;
    let (_dir, img, srv) = serve_blank(size, &[]);
    let start = 777u64;
    let n = (size - start) / BS;
    let mut client = spawn_python(
        r#"
uri, START, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
say("connected")
cookies = {}
i = 0
acked = 0
try:
    while True:
        while h.aio_in_flight() < 64:
            cookies[h.aio_pwrite(block(START, i % N), START + (i % N) * BS)] = i % N
            i += 1
        h.poll(-1)
        for ck, j in list(cookies.items()):
            if h.aio_command_completed(ck):
                del cookies[ck]
                acked += 1
                say("acked", j)
        if h.aio_is_dead() or h.aio_is_closed():
            break
except nbd.Error as e:
    pass
say("end", acked)
"#,
        &[&srv.uri(), &start.to_string(), &n.to_string()],
        "client",
    );
    assert_eq!(client.line(), "connected");
    // Let it stream a while.
    let mut acked = Vec::new();
    while acked.len() < 300 {
        let l = client.line();
        let j: u64 = l
            .strip_prefix("acked ")
            .expect("acked line")
            .parse()
            .expect("n");
        acked.push(j);
    }
    let status = srv.stop();
    assert!(
        status.success(),
        "exit status {status} after SIGTERM mid-burst"
    );
    let mut end = None;
    for l in client.out.lines() {
        let l = l.expect("line");
        if let Some(j) = l.strip_prefix("acked ") {
            acked.push(j.parse().expect("n"));
        } else if let Some(k) = l.strip_prefix("end ") {
            end = Some(k.parse::<usize>().expect("n"));
        }
    }
    let wait = client.child.wait_with_output().expect("wait client");
    assert_eq!(
        end,
        Some(acked.len()),
        "client did not end cleanly: {}",
        String::from_utf8_lossy(&wait.stderr)
    );
    let got = std::fs::read(&img).expect("read");
    for &j in &acked {
        let at = (start + j * BS) as usize;
        let want = (j + start / BS).to_le_bytes().repeat((BS / 8) as usize);
        assert!(
            got[at..at + BS as usize] == want[..],
            "acknowledged write {j} at {at} is not in the file"
        );
    }
}

/// Proof 11: clients vanish (SIGKILL) mid-stream: a libnbd client with a
/// burst in flight, and qemu-io in the middle of an aio burst. A client
/// connected all along is still served, and a fresh connection reads back
/// every acknowledged write. With `restart`, the server is then stopped and
/// started again on the same stack, and the writes are still there.
fn vanishing_clients(dir: &Path, spec: &str, old: &Path, restart: bool) {
    let mut srv = Server::start(dir, &[spec]);
    let uri = srv.uri();
    let start = 1000u64; // unaligned: cow must merge with the old bytes
    let burst = 256u64;
    let blocks = 32 + burst;
    let bystander_at = 48 * MIB;

    let at = bystander_at.to_string();
    let mut bystander = spawn_python(BYSTANDER, &[&uri, &at], "bystander");
    assert_eq!(bystander.line(), "ready");

    // qemu-io, fed an endless stream of aio writes on stdin, killed in the
    // middle of it.
    let mut qio = qemu_io_command(&uri, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn qemu-io");
    let mut feed = qio.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || {
        for i in 0..1_000_000u64 {
            let cmd = format!("aio_write -P 0x77 {} 32768\n", 24 * MIB + (i % 512) * 32768);
            if feed.write_all(cmd.as_bytes()).is_err() {
                return i;
            }
        }
        panic!("qemu-io was never killed");
    });

    let writer = python_nbd(
        &script(DYING_WRITER),
        &[&uri, &start.to_string(), &burst.to_string()],
    )
    .output()
    .expect("run writer");
    assert!(
        qio.try_wait().expect("try_wait").is_none(),
        "qemu-io ended before it was killed"
    );
    qio.kill().expect("kill qemu-io");
    qio.wait().expect("wait qemu-io");
    let fed = feeder.join().expect("feeder");
    assert!(fed > 64, "qemu-io was sent only {fed} writes");
    let text = String::from_utf8_lossy(&writer.stdout);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        writer.status.signal(),
        Some(9),
        "writer did not die by SIGKILL:\n{text}\n{}",
        String::from_utf8_lossy(&writer.stderr)
    );
    let acked: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("acked "))
        .map(|n| n.parse().expect("n"))
        .collect();
    assert!(acked.len() as u64 >= 32 + burst / 4, "{text}");
    let inflight: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("inflight "))
        .expect("inflight line")
        .parse()
        .expect("n");
    assert!(inflight > 0, "nothing was in flight when the writer died");

    // The bystander, connected all along, is still served.
    bystander.tell("go");
    assert_eq!(bystander.line(), "ok");
    bystander.wait_success();

    let sig = verify(&uri, old, start, blocks, &acked);
    assert_eq!(sig.len() as u64, blocks);
    assert!(sig[..32].chars().all(|c| c == 'W'), "{sig}");
    if restart {
        let status = srv.stop();
        assert!(status.success(), "exit status {status}");
        srv = Server::start(dir, &[spec]);
        let after = verify(&srv.uri(), old, start, blocks, &acked);
        assert_eq!(after, sig, "blocks changed across the restart");
    }
    drop(srv);
}

#[test]
fn vanished_clients_lose_no_acknowledged_write_raw() {
    let dir = tempdir();
    let img = dir.path().join("disk.raw");
    let old = dir.path().join("old.raw");
    for p in [&img, &old] {
        blank_file(p, 64 * MIB);
    }
    vanishing_clients(dir.path(), &spec_raw(&img), &old, false);
}

#[test]
fn vanished_clients_lose_no_acknowledged_write_cow_and_survive_restart() {
    let dir = tempdir();
    let base = dir.path().join("base.raw");
    random_file(&base, 64 * MIB, 41);
    let old = dir.path().join("old.raw");
    std::fs::copy(&base, &old).expect("copy");
    let spec = spec_cow_raw(dir.path(), &base);
    vanishing_clients(dir.path(), &spec, &old, true);
    let a = std::fs::read(&base).expect("read base");
    assert!(
        a == std::fs::read(&old).expect("read old"),
        "the cow base was modified"
    );
}

/// SIGTERM, then give the server 10 s to exit. If it has not by then, run
/// `release` (which must unblock it), wait for it anyway and fail with
/// `late` and the time it took. The exit status must be 0.
fn assert_prompt_stop(srv: Server, release: impl FnOnce(), late: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    let stopper = std::thread::spawn(move || {
        let status = srv.stop();
        let _ = tx.send(());
        status
    });
    let was_late = rx.recv_timeout(Duration::from_secs(10)).is_err();
    if was_late {
        release();
    }
    let status = stopper.join().expect("stop");
    let took = t0.elapsed();
    assert!(!was_late, "{late} ({took:?})");
    assert!(status.success(), "exit status {status}");
}

/// Connect to SRV's socket and read the server's greeting (`NBDMAGIC`...).
fn connect_greeted(srv: &Server) -> UnixStream {
    let mut s = UnixStream::connect(&srv.socket).expect("connect");
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).expect("server greeting");
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s
}

/// With `--max-connections 1` in use and one more client waiting, SIGTERM
/// must still stop the server (it has nothing in flight to finish).
#[test]
fn sigterm_with_connection_limit_reached_still_shuts_down() {
    let (_dir, _img, srv) = serve_blank(MIB, &["--max-connections", "1"]);
    let mut first = spawn_python(
        r#"
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(512, 0)
say("ready")
sys.stdin.readline()
"#,
        &[&srv.uri()],
        "first client",
    );
    assert_eq!(first.line(), "ready");
    let second = UnixStream::connect(&srv.socket).expect("connect");
    std::thread::sleep(Duration::from_millis(300));
    let mut stdin = first.child.stdin.take().expect("stdin");
    let release = move || {
        let _ = stdin.write_all(b"go\n");
        drop(second);
    };
    assert_prompt_stop(
        srv,
        release,
        "SIGTERM was ignored while the connection limit was reached: the server \
         exited only after the connected client left",
    );
    let _ = first.child.wait();
}

/// A client that connected but says nothing (still in the handshake, no
/// request in flight) must not hold up SIGTERM for the 30 s handshake
/// time-out.
#[test]
fn sigterm_with_client_idle_in_handshake_exits_promptly() {
    let (_dir, _img, srv) = serve_blank(MIB, &[]);
    let idle = connect_greeted(&srv);
    let why = "SIGTERM waited for a client idle in the handshake";
    assert_prompt_stop(srv, move || drop(idle), why);
}

/// A client that stalls in the middle of a write's payload (the request is
/// not complete, so nothing is in flight) must not hold up SIGTERM for the
/// 30 s drain time-out.
#[test]
fn sigterm_with_client_stalled_mid_payload_exits_promptly() {
    let (_dir, img, srv) = serve_blank(MIB, &[]);
    // Fixed newstyle handshake by hand: greeting, client flags
    // (FIXED_NEWSTYLE | NO_ZEROES), NBD_OPT_EXPORT_NAME "".
    let mut s = connect_greeted(&srv);
    s.write_all(&3u32.to_be_bytes()).expect("flags");
    let mut opt = 0x4948_4156_454F_5054u64.to_be_bytes().to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).expect("option");
    let mut export = [0u8; 10];
    s.read_exact(&mut export).expect("export size and flags");
    assert_eq!(u64::from_be_bytes(export[..8].try_into().expect("8")), MIB);
    // NBD_CMD_WRITE of 64 KiB at 0, of which only 100 bytes are sent.
    let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
    req.extend_from_slice(&0u16.to_be_bytes());
    req.extend_from_slice(&1u16.to_be_bytes());
    req.extend_from_slice(&7u64.to_be_bytes());
    req.extend_from_slice(&0u64.to_be_bytes());
    req.extend_from_slice(&65536u32.to_be_bytes());
    req.extend_from_slice(&[0x55; 100]);
    s.write_all(&req).expect("partial request");
    std::thread::sleep(Duration::from_millis(300));
    let why = "SIGTERM waited for a client stalled in the middle of a write payload";
    assert_prompt_stop(srv, move || drop(s), why);
    let got = std::fs::read(&img).expect("read");
    assert!(
        got.iter().all(|&b| b == 0),
        "an incomplete write reached the file"
    );
}
