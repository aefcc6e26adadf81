"""Helpers the benches share (bench/cas-roaming.py, bench/isr-resume.py,
bench/cache-miss-path.py, bench/server-miss-path.py, ...).

The roamdisk binary (ROAMDISK_BIN, else the release build), running it,
serving a stack over NBD on a Unix socket, waiting for a server to listen,
the throttled HTTP chunk server, a synthetic boot trace, a process's CPU
time, a free port, the results file, and a minimal NBD client to read byte
ranges back (python3 stdlib only: the benches run on the pyenv python,
which has no libnbd binding).
"""
import datetime, json, os, re, signal, socket, struct, subprocess, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.environ.get("ROAMDISK_BIN", os.path.join(ROOT, "target/release/roamdisk"))


def parse_size(s):
    """A size: 4096, 64K, 128M, 2G (powers of 1024; K/M/G in either case)."""
    units = {"K": 10, "M": 20, "G": 30}
    u = s[-1].upper()
    return int(s[:-1]) << units[u] if u in units else int(s)


def run(*args, **kw):
    """Run a command, fail on a non-zero exit, return its stdout."""
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def serve(spec, sock, env=None):
    """`roamdisk serve SPEC --socket SOCK`; returns once the socket exists."""
    if os.path.exists(sock):
        os.unlink(sock)
    p = subprocess.Popen([B, "-q", "serve", spec, "--socket", sock], env=env,
                         stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock):
            return p
        time.sleep(0.05)
    raise SystemExit(f"server for {spec} did not start")


def stop(p, timeout=60):
    """SIGTERM (the clean stop: a session writes its state) and wait."""
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=timeout)


def wait_unix_listening(proc, sock, what, seconds=20):
    """Wait until the Unix socket SOCK accepts a connection; exit saying
    WHAT exited early if PROC ends first, or (killing it) that WHAT did not
    listen within SECONDS."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited early")
            time.sleep(0.02)
    proc.kill()
    raise SystemExit(f"{what} did not listen")


def cpu_seconds(pid):
    """User + system CPU time process PID has used so far, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    """A TCP port on 127.0.0.1 free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_results(out, bench, doc):
    """DOC and the date as JSON in OUT (default
    bench/results/BENCH-YYYYmmdd-HHMM.json); prints where."""
    now = datetime.datetime.now()
    out = out or os.path.join(ROOT, "bench", "results",
                              f"{bench}-{now.strftime('%Y%m%d-%H%M')}.json")
    with open(out, "w") as f:
        json.dump({**doc, "date": now.isoformat(timespec="seconds")}, f, indent=1)
    print(f"results: {out}")


def store_serve(store, limit=None, latency=None):
    """`roamdisk store serve STORE` on a free loopback port, behind the
    emulated link (--limit/--latency) when given; returns (process, URL)."""
    args = [B, "store", "serve", store, "--listen", "127.0.0.1:0"]
    if limit:
        args += ["--limit", limit]
    if latency:
        args += ["--latency", latency]
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"(http://[0-9.:]+)", line)
        if m:
            return p, m.group(1)
    raise SystemExit(f"store server for {store} did not start")


def boot_trace(path, requests=None):
    """`trace synth boot --clients 1` into PATH; returns its reads and
    writes as (op, offset, length), in order."""
    args = [B, "-q", "trace", "synth", "boot", "--clients", "1", "-o", path]
    if requests:
        args += ["--requests", str(requests)]
    run(*args)
    ops = []
    for line in run(B, "trace", "cat", path).splitlines()[1:]:
        t, c, dev, op, off, ln, frag = line.split(",")
        if op in ("read", "write"):
            ops.append((op, int(off), int(ln)))
    return ops


class Nbd:
    """A minimal NBD client over a Unix socket: fixed newstyle handshake,
    EXPORT_NAME "", simple replies, READ only (docs/formats/nbd.md)."""

    def __init__(self, sock):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(sock)
        magic, opt, hflags = struct.unpack(">8s8sH", self._recv(18))
        if magic != b"NBDMAGIC" or opt != b"IHAVEOPT":
            raise IOError("not an NBD newstyle server")
        no_zeroes = hflags & 2
        self.s.sendall(struct.pack(">I", 1 | (2 if no_zeroes else 0)))
        self.s.sendall(struct.pack(">8sII", b"IHAVEOPT", 1, 0))  # EXPORT_NAME ""
        self.size, _flags = struct.unpack(">QH", self._recv(10))
        if not no_zeroes:
            self._recv(124)
        self.handle = 0

    def _recv(self, n):
        b = bytearray()
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise IOError("NBD server closed the connection")
            b += c
        return bytes(b)

    def pread(self, length, offset):
        self.handle += 1
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, self.handle, offset, length))
        magic, err, handle = struct.unpack(">IIQ", self._recv(16))
        if magic != 0x67446698 or handle != self.handle:
            raise IOError("bad NBD reply")
        if err:
            raise IOError(f"NBD read of {length} at {offset}: error {err}")
        return self._recv(length)

    def close(self):
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 2, 0, 0, 0))  # DISC
        self.s.close()
