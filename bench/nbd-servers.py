#!/usr/bin/env python3
"""roamdisk serve vs qemu-nbd vs nbdkit file, over Unix sockets.

All servers export the same random-filled raw file (small enough to stay in
the page cache). Every row is measured for every server, the servers
interleaved (their order rotated from pass to pass), several passes; the
table shows medians and roamdisk's ratio to the faster competitor.

Only the Python standard library is used. See docs/BENCHMARKS.md.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def fio(id, label, unit, **options):
    """A row measured by fio with these options."""
    return (id, label, unit, "fio", options)


def copy(id, label, **options):
    """A row measured by nbdcopy (options: direction, flush)."""
    return (id, label, "MB/s", "copy", options)


# id, label, unit, kind, parameters: "fio" rows take fio options; "copy"
# rows are nbdcopy directions.
ROWS = [
    fio("randread-qd1", "4 KiB random read, QD 1", "IOPS", rw="randread", bs="4k", iodepth=1),
    fio("randread-qd32", "4 KiB random read, QD 32", "IOPS", rw="randread", bs="4k", iodepth=32),
    fio("randwrite-qd1", "4 KiB random write, QD 1", "IOPS", rw="randwrite", bs="4k", iodepth=1),
    fio("randwrite-qd32", "4 KiB random write, QD 32", "IOPS", rw="randwrite", bs="4k", iodepth=32),
    fio("seqread-1m", "1 MiB sequential read, QD 8", "MB/s", rw="read", bs="1m", iodepth=8),
    fio("seqwrite-1m", "1 MiB sequential write, QD 8", "MB/s", rw="write", bs="1m", iodepth=8),
    copy("nbdcopy-read", "nbdcopy export -> null:", direction="read"),
    copy("nbdcopy-write", "nbdcopy file -> export", direction="write"),
    fio("randwrite-qd1-flush", "4 KiB random write, QD 1, FLUSH/64", "IOPS",
        rw="randwrite", bs="4k", iodepth=1, fsync=64),
    fio("randwrite-qd32-flush", "4 KiB random write, QD 32, FLUSH/64", "IOPS",
        rw="randwrite", bs="4k", iodepth=32, fsync=64),
    fio("seqwrite-1m-flush", "1 MiB sequential write, QD 8, FLUSH/64", "MB/s",
        rw="write", bs="1m", iodepth=8, fsync=64),
    copy("nbdcopy-write-flush", "nbdcopy file -> export, --flush", direction="write", flush=True),
]

COMPETITORS = ("qemu-nbd", "nbdkit")


def die(msg):
    print(f"nbd-servers: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def version(cmd):
    try:
        out = run(cmd).stdout.strip().splitlines()
        return out[0] if out else ""
    except (OSError, subprocess.CalledProcessError) as e:
        return f"unknown ({e})"


def check_tools():
    for t in ("fio", "qemu-nbd", "nbdkit", "nbdcopy", "nbdinfo", "cargo"):
        if shutil.which(t) is None:
            die(f"{t} is not installed (scripts/test installs the test tools; "
                "nbdcopy and nbdinfo come with libnbd-bin)")
    if subprocess.run(["fio", "--enghelp=nbd"], capture_output=True).returncode != 0:
        die("this fio has no nbd engine (needs fio built with libnbd)")
    if subprocess.run(["nbdkit", "file", "--version"], capture_output=True).returncode != 0:
        die("nbdkit has no file plugin (install nbdkit-plugin-file or nbdkit)")


def make_file(path, size, source=None):
    """Write `size` random bytes (or `source`'s) to `path` 4 KiB at a time,
    so that the page cache holds it in 4 KiB folios. Written in large
    pieces, ext4 caches it in large folios and then every 4 KiB random
    write dirties a whole folio: the write rows would measure writeback
    throttling, not the servers."""
    src = open(source, "rb") if source else None
    with open(path, "wb", buffering=0) as f:
        left = size
        while left:
            n = min(left, 4 * MIB)
            block = src.read(n) if src else os.urandom(n)
            for i in range(0, n, 4096):
                f.write(block[i:i + 4096])
            left -= n
        os.fsync(f.fileno())
    if src:
        src.close()


_LOCKED = []


def lock_in_memory(path):
    """Map `path` and mlock it, so that its pages stay in the page cache for
    the whole run. This machine's kernel runs DAMON with a `pageout`
    scheme that evicts file pages unused for about a second: without the
    lock, random and sequential reads of a "warm" image sometimes go to the
    disk, and which server that happens to is luck. Returns False (and the
    run goes on unlocked) if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            return False
        if libc.mlock(addr, size) != 0:
            print(f"nbd-servers: cannot mlock {path}: {os.strerror(ctypes.get_errno())}; "
                  "running with the page cache unlocked", file=sys.stderr)
            return False
        _LOCKED.append((addr, size))
        return True
    finally:
        os.close(fd)


def warm(path):
    """Read `path` so that it is in the page cache (someone on a shared
    machine may have dropped caches)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(4 * MIB):
            pass


def wait_socket(path, proc, timeout=30.0):
    """Wait until the server accepts connections on `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            die(f"server exited early ({proc.args}): {proc.stderr.read()}")
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    die(f"server did not listen on {path}: {proc.args}")


def server_commands(tmp, image, roamdisk_bins):
    """name -> command; each listens on its own socket in `tmp`."""
    cmds = {}
    for i, (name, binpath) in enumerate(roamdisk_bins):
        sock = os.path.join(tmp, f"{name}.sock")
        img = image
        if i:
            # roamdisk locks its image: A/B variants get a copy each.
            img = os.path.join(tmp, f"{name}.img")
            make_file(img, os.path.getsize(image), source=image)
        cmds[name] = (sock, [binpath, "serve", f"raw:{img}", "--socket", sock, "-q"], img)
    sock = os.path.join(tmp, "qemu-nbd.sock")
    # cache=writeback and aio=threads are qemu-nbd's defaults, spelled out:
    # page cache like the others, FLUSH = fdatasync.
    cmds["qemu-nbd"] = (sock, ["qemu-nbd", "-t", "-e", "8", "-f", "raw",
                               "--cache=writeback", "--aio=threads",
                               "-k", sock, image], image)
    sock = os.path.join(tmp, "nbdkit.sock")
    # nbdkit's defaults: 16 threads per connection, page cache.
    cmds["nbdkit"] = (sock, ["nbdkit", "-f", "-U", sock, "file", image], image)
    return cmds


class Server:
    """One server process, restarted if something else stops it (this
    machine is shared: a careless cleanup may kill it by name)."""

    def __init__(self, name, sock, cmd):
        self.name, self.sock, self.cmd = name, sock, cmd
        self.proc = None
        self.restarts = 0

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        wait_socket(self.sock, self.proc)

    def ensure_running(self):
        if self.proc.poll() is not None:
            print(f"{self.name} exited ({self.proc.returncode}); restarting", file=sys.stderr)
            self.restarts += 1
            self.start()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


    def cpu_seconds(self):
        """User + system CPU time the server has used so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return float("nan")


def uri(sock):
    return f"nbd+unix:///?socket={sock}"


def fio_run(sock, p, runtime, ramp):
    cmd = ["fio", "--name=bench", "--ioengine=nbd", f"--uri={uri(sock)}",
           f"--rw={p['rw']}", f"--bs={p['bs']}", f"--iodepth={p['iodepth']}",
           "--time_based", f"--runtime={runtime}", f"--ramp_time={ramp}",
           "--norandommap", "--randrepeat=1", "--output-format=json"]
    if p.get("fsync"):
        cmd.append(f"--fsync={p['fsync']}")
    out = run(cmd).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    d = job["read" if "read" in p["rw"] else "write"]
    ops = d["total_ios"] + (job["sync"]["total_ios"] if p.get("fsync") else 0)
    if p["bs"] == "4k":
        return d["iops"], ops
    return d["bw_bytes"] / 1e6, ops


def copy_run(sock, p, src, size, runtime):
    """MB/s over as many whole copies as fit in about runtime/2 s (at least 2)."""
    if p["direction"] == "read":
        cmd = ["nbdcopy", uri(sock), "null:"]
    else:
        cmd = ["nbdcopy", src, uri(sock)]
    if p.get("flush"):
        cmd.insert(1, "--flush")
    copies, t0 = 0, time.monotonic()
    while copies < 2 or time.monotonic() - t0 < runtime / 2:
        run(cmd)
        copies += 1
    return copies * size / (time.monotonic() - t0) / 1e6, None


def multi_conn(sock):
    try:
        return json.loads(run(["nbdinfo", "--json", uri(sock)]).stdout)[
            "exports"][0].get("can_multi_conn")
    except (subprocess.CalledProcessError, ValueError, KeyError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio job (after ramp)")
    ap.add_argument("--ramp", type=int, default=2, help="fio ramp seconds")
    ap.add_argument("--size-mib", type=int, default=1024, help="export size")
    ap.add_argument("--rows", default="", help="comma-separated row ids (default: all)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=BIN",
                    help="also measure another roamdisk binary (A/B runs)")
    ap.add_argument("--no-build", action="store_true",
                    help="use the existing target/release/roamdisk (development)")
    ap.add_argument("--no-competitors", action="store_true",
                    help="measure roamdisk binaries only (development)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--tmpdir", default=None, help="where the image goes (default: $TMPDIR)")
    a = ap.parse_args()

    check_tools()
    # ROAMDISK_BIN: a frozen copy (others may rebuild target/release meanwhile).
    binary = os.environ.get("ROAMDISK_BIN") or os.path.join(REPO, "target", "release", "roamdisk")
    if a.no_build:
        if not os.access(binary, os.X_OK):
            die(f"--no-build, but there is no {binary}")
    else:
        print("building roamdisk (release)...", file=sys.stderr)
        if subprocess.run(["cargo", "build", "--release", "-q", "-p", "roamdisk"],
                          cwd=REPO).returncode != 0:
            die("cargo build --release -p roamdisk failed")
    bins = [("roamdisk", binary)]
    for spec in a.also:
        name, _, path = spec.partition("=")
        if not path or name in ("roamdisk",) + COMPETITORS:
            die(f"--also wants NAME=BIN with a new NAME, not '{spec}'")
        bins.append((name, os.path.abspath(path)))

    rows = ROWS
    if a.rows:
        want = a.rows.split(",")
        unknown = set(want) - {r[0] for r in ROWS}
        if unknown:
            die(f"unknown rows: {', '.join(sorted(unknown))}")
        rows = [r for r in ROWS if r[0] in want]

    size = a.size_mib * MIB
    tmp = tempfile.mkdtemp(prefix="roamdisk-bench-", dir=a.tmpdir)
    servers = {}
    try:
        image = os.path.join(tmp, "disk.img")
        src = os.path.join(tmp, "src.img")
        print(f"writing {a.size_mib} MiB of random data twice in {tmp}...", file=sys.stderr)
        make_file(image, size)
        make_file(src, size)
        cmds = server_commands(tmp, image, bins)
        locked = all([lock_in_memory(p) for p in sorted({c[2] for c in cmds.values()} | {src})])
        if a.no_competitors:
            cmds = {k: v for k, v in cmds.items() if k not in COMPETITORS}
        names = list(cmds)
        for name, (sock, cmd, _) in cmds.items():
            servers[name] = Server(name, sock, cmd)
            servers[name].start()
        socks = {n: srv.sock for n, srv in servers.items()}
        mc = {n: multi_conn(s) for n, s in socks.items()}

        samples = {r[0]: {n: [] for n in names} for r in rows}
        cpu_used = {r[0]: {n: [] for n in names} for r in rows}
        loads = []
        t_start = time.time()
        for pas in range(a.passes):
            for ri, (rid, label, unit, kind, p) in enumerate(rows):
                k = (pas + ri) % len(names)
                order = names[k:] + names[:k]
                for n in order:
                    servers[n].ensure_running()
                    os.sync()  # start every run with no dirty pages...
                    warm(cmds[n][2])  # ...and the image in the page cache
                    if kind == "copy":
                        warm(src)
                    load = os.getloadavg()[0]
                    for attempt in range(3):
                        try:
                            cpu0 = servers[n].cpu_seconds()
                            if kind == "fio":
                                v, ops = fio_run(socks[n], p, a.runtime, a.ramp)
                            else:
                                v, ops = copy_run(socks[n], p, src, size, a.runtime)
                            cpu = servers[n].cpu_seconds() - cpu0
                            break
                        except subprocess.CalledProcessError as e:
                            if attempt == 2:
                                die(f"{n} {rid} failed: {e.stderr}")
                            print(f"{n} {rid} failed, retrying: {e.stderr.strip()}",
                                  file=sys.stderr)
                            servers[n].ensure_running()
                    samples[rid][n].append(v)
                    cpu_used[rid][n].append(round(cpu, 2))
                    loads.append(load)
                    # fio's ops count excludes the ramp; the CPU time does not.
                    per = (f"  server CPU {cpu / ops * 1e6 * (a.runtime + a.ramp) / a.runtime:.1f} us/op"
                           if ops else f"  server CPU {cpu:.2f} s")
                    print(f"pass {pas + 1}/{a.passes} {rid:22} {n:10} {v:12.1f} {unit}"
                          f"  (load {load:.2f}){per}", file=sys.stderr)
        elapsed = time.time() - t_start
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    medians = {rid: {n: statistics.median(v) for n, v in s.items()} for rid, s in samples.items()}
    table = []
    comp = [n for n in COMPETITORS if n in names]
    head = ["Row", "Unit"] + names + (["ratio"] if comp else [])
    table.append("| " + " | ".join(head) + " |")
    table.append("|" + "---|" * 2 + "---:|" * (len(head) - 2))
    for rid, label, unit, _, _ in rows:
        m = medians[rid]
        cells = [label, unit] + [f"{m[n]:.0f}" for n in names]
        if comp:
            cells.append(f"{m['roamdisk'] / max(m[c] for c in comp):.2f}")
        table.append("| " + " | ".join(cells) + " |")
    print("\n".join(table))

    stamp = datetime.datetime.now(datetime.timezone.utc)
    result = {
        "date": stamp.isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "kernel": platform.release(),
            "load_avg_1min": {"min": min(loads), "median": statistics.median(loads),
                              "max": max(loads)},
        },
        "tools": {
            "fio": version(["fio", "--version"]),
            "qemu-nbd": version(["qemu-nbd", "--version"]),
            "nbdkit": version(["nbdkit", "--version"]),
            "nbdcopy": version(["nbdcopy", "--version"]),
        },
        "servers": {n: cmds[n][1] for n in names},
        "multi_conn": mc,
        "restarts": {n: srv.restarts for n, srv in servers.items()},
        "page_cache_locked": locked,
        "settings": {"passes": a.passes, "runtime_s": a.runtime, "ramp_s": a.ramp,
                     "size_bytes": size},
        "elapsed_s": round(elapsed),
        "rows": [{"id": rid, "label": label, "unit": unit, "params": p,
                  "samples": samples[rid], "server_cpu_s": cpu_used[rid],
                  "median": medians[rid]}
                 for rid, label, unit, _, p in rows],
        "table": table,
    }
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"nbd-servers-{stamp:%Y%m%d-%H%M%S}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"raw results: {os.path.relpath(path, REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
