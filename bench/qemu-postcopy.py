#!/usr/bin/env python3
"""QEMU's own postcopy live migration beside roamdisk's lazy resume: the
same guest, the same throttled link.

  guest       bench/isr-lazy.py's: TCG, --memory MiB, --blob MiB of
              pseudo-random data in its tmpfs /tmp, then a counter line to
              /mnt/counter every 100 ms, `count N;` on its second serial
              port; a fresh boot for every measurement, taken at count 30.
  qemu        QEMU A runs the guest on a raw file (a fresh copy of the
              ext4 image per run) opened by both QEMUs (-blockdev
              driver=file,locking=off: shared storage, as QEMU's migration
              expects). QEMU B waits with `-incoming defer`; both sides
              `postcopy-ram` on (B also `postcopy-blocktime`), B
              `migrate-incoming tcp:127.0.0.1:PORT_B`; A `migrate
              tcp:127.0.0.1:PROXY` through a throttling TCP proxy (this
              script: a token bucket at RATE bit/s each direction, 64 KiB
              burst, as `store serve --limit`, and --delay one way, default
              4 ms: an 8 ms round trip), then `migrate-start-postcopy` as
              soon as A's query-migrate says active. --qemu-bandwidth
              link (the default) sets A's max-bandwidth and
              max-postcopy-bandwidth to RATE: left at QEMU's defaults
              (--qemu-bandwidth default) A writes as fast as its socket
              takes it, and on loopback that socket's send buffer grows to
              tcp_wmem's maximum (4 MB, seen with ss -tm): every page B asks
              for then waits behind up to 4 MB of stream (~250 ms at 100
              Mbit/s; a real 8 ms path keeps far less unsent), which is
              this emulation, not QEMU. --preempt turns postcopy-preempt on
              (faulted pages on a second connection, through the same
              proxy and buckets).
              measured from `migrate`: B's guest's next counter line (time
              to running), B's query-migrate `completed` (time to all
              memory), bytes the proxy carried A to B before running, A's
              ram.postcopy-requests (page faults sent to the source) and
              B's postcopy-blocktime (ms the vCPUs waited on pages):
              mean fault latency = blocktime / requests.
  roamdisk    the same guest on a cas session (`roamdisk serve`), suspended
              at count 30 with `roamdisk suspend --qmp` into a fresh store,
              then `roamdisk resume --qmp --json` (lazy, no lookaside, a
              fresh session and shared cache) over `roamdisk store serve
              --limit RATE --latency 2*DELAY` (a round trip per request);
              measured from the start of resume as bench/isr-lazy.py does
              (time to running, bytes the store server wrote before it,
              time to all memory, faults and their p50/p99).

What differs: QEMU migrates a running VM straight to another QEMU: its
precopy pass is cut short by migrate-start-postcopy, A stops and sends
the device state, B runs, then A pushes every RAM page in address order
(zero pages as flags, the rest raw), answering B's page requests in
between on the same stream (postcopy-preempt off, as in QEMU 7.2's
default), while pages the guest dirtied during the precopy pass are sent
again. roamdisk resumes a suspended VM from a store: the page image was
taken at suspend (deduplicated, compressed, zero chunks never sent),
the host resuming fetches each faulted page's chunk over HTTP while it
pushes the rest, the pages the guest touched first last time first; the
store server also carries the disk's working set. QEMU's time includes
its precopy setup; roamdisk's includes creating the session and
fetching the version. The QEMU disk is a local raw file, roamdisk's an NBD
session whose misses come over the same link.

Measurements alternate (qemu first on even runs, roamdisk first on odd).

Usage: bench/qemu-postcopy.py [--rates 10Mbit,100Mbit] [--runs 3] [--memory 256]
       [--blob 24] [--delay 4ms] [--memory-chunk-size 16K] [--preempt]
       [--qemu-bandwidth link|default]
Writes bench/results/qemu-postcopy-STAMP.json.
Needs: a release build (cargo build --release -p roamdisk), scripts/guest-setup,
root (or CAP_SYS_PTRACE) for QEMU's userfaultfd.
"""
import argparse, importlib.util, json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

from roamdisk_bench import B, free_port, run, save_results

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("isr_lazy", os.path.join(HERE, "isr-lazy.py"))
lazy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lazy)
counts, wait_for, rate_bits, median, fmt = (lazy.counts, lazy.wait_for, lazy.rate_bits,
                                            lazy.median, lazy.fmt)


def duration(s):
    for suffix, mult in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    raise SystemExit(f"duration {s}: give it in s, ms or us")


class Qmp:
    """A QMP client over a Unix socket: one command at a time, events
    skipped."""

    def __init__(self, path, seconds=60):
        t0 = time.time()
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.time() - t0 > seconds:
                    raise SystemExit(f"QMP at {path} did not answer")
                time.sleep(0.05)
        self.f = self.s.makefile("rwb")
        self._read()  # the greeting
        self.cmd("qmp_capabilities")

    def _read(self):
        while True:
            line = self.f.readline()
            if not line:
                raise SystemExit("QMP: QEMU closed the connection")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, **({"arguments": args} if args else {})}).encode() + b"\n")
        self.f.flush()
        msg = self._read()
        if "error" in msg:
            raise SystemExit(f"QMP {name}: {msg['error'].get('desc', msg['error'])}")
        return msg.get("return")

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


class Bucket:
    """A token bucket: RATE bytes/s, BURST bytes; take(n) waits its turn
    (senders sharing it are served in order)."""

    def __init__(self, rate, burst=64 << 10):
        self.rate, self.burst, self.tokens, self.t = rate, burst, burst, time.monotonic()
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0
        if wait > 0:
            time.sleep(wait)


class Proxy:
    """A TCP proxy 127.0.0.1:port -> 127.0.0.1:TARGET emulating a link:
    RATE bit/s each direction (one bucket per direction, shared by every
    connection), DELAY seconds one way; at most a burst plus two delays'
    worth of bytes in flight per direction and connection (a link, not a
    bottomless queue). `up` counts bytes carried towards TARGET, `down`
    back."""

    CHUNK = 16 << 10

    def __init__(self, target, rate_bits_s, delay):
        self.target, self.delay = target, delay
        rate = rate_bits_s / 8
        self.buckets = {"up": Bucket(rate), "down": Bucket(rate)}
        self.limit = max(64 << 10, int((64 << 10) + 2 * rate * delay))
        self.bytes = {"up": 0, "down": 0}
        self.lock = threading.Lock()
        self.socks = []
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Small kernel buffers: what waits for the link waits in the proxy,
        # in view of the bucket, not unseen in a socket.
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.ls.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            for s in (a, b):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
            self.socks += [a, b]
            self._pipe(a, b, "up")
            self._pipe(b, a, "down")

    def _pipe(self, src, dst, way):
        q, cv, queued = [], threading.Condition(), [0]

        def reader():
            while True:
                try:
                    data = src.recv(self.CHUNK)
                except OSError:
                    data = b""
                with cv:
                    while queued[0] > self.limit:
                        cv.wait()
                    q.append((time.monotonic(), data))
                    queued[0] += len(data)
                    cv.notify_all()
                if not data:
                    return

        def writer():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    t, data = q.pop(0)
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                late = t + self.delay - time.monotonic()
                if late > 0:
                    time.sleep(late)
                self.buckets[way].take(len(data))
                try:
                    dst.sendall(data)
                except OSError:
                    return
                with self.lock:
                    self.bytes[way] += len(data)
                with cv:
                    queued[0] -= len(data)
                    cv.notify_all()

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=writer, daemon=True).start()

    def carried(self):
        with self.lock:
            return dict(self.bytes)

    def close(self):
        for s in [self.ls] + self.socks:
            try:
                s.close()
            except OSError:
                pass


def migration(q):
    return q.cmd("query-migrate") or {}


def qemu_one(d, rate, delay, memory, script, blob, n, preempt=False, bandwidth="link"):
    """QEMU A -> QEMU B, postcopy, through the proxy at RATE; BANDWIDTH
    "link": A's max-bandwidth and max-postcopy-bandwidth set to RATE,
    "default": QEMU's own."""
    h = os.path.join(d, f"q-{n}")
    os.makedirs(h)
    disk = os.path.join(h, "disk.raw")
    subprocess.run(["cp", "--sparse=always", lazy.base_image(d), disk], check=True)
    a, aqmp, aout = lazy.qemu(h, "a", memory, script, lazy.file_disk(disk))
    proxy, qa, qb, bq = None, None, None, None
    try:
        wait_for(lambda: 30 in counts(aout) or a.poll() is not None, 300 + 2 * blob,
                 "QEMU A's guest to count to 30")
        if a.poll() is not None:
            raise SystemExit(f"QEMU A exited; see {h}/a-qemu.log")
        bq, bqmp, bout = lazy.qemu(h, "b", memory, script, lazy.file_disk(disk), incoming=True)
        qa, qb = Qmp(aqmp), Qmp(bqmp)
        caps = [{"capability": "postcopy-ram", "state": True}]
        if preempt:
            caps.append({"capability": "postcopy-preempt", "state": True})
        qb.cmd("migrate-set-capabilities",
               capabilities=caps + [{"capability": "postcopy-blocktime", "state": True}])
        qa.cmd("migrate-set-capabilities", capabilities=caps)
        if bandwidth == "link":
            bps = int(rate_bits(rate) / 8)
            qa.cmd("migrate-set-parameters", **{"max-bandwidth": bps, "max-postcopy-bandwidth": bps})
        port = free_port()
        qb.cmd("migrate-incoming", uri=f"tcp:127.0.0.1:{port}")
        proxy = Proxy(port, rate_bits(rate), delay)
        t0 = time.time()
        qa.cmd("migrate", uri=f"tcp:127.0.0.1:{proxy.port}")
        while True:
            st = migration(qa).get("status")
            if st in ("active", "postcopy-active", "completed"):
                break
            if st in ("failed", "cancelled") or time.time() - t0 > 120:
                raise SystemExit(f"QEMU A's migration: {st}; see {h}")
            time.sleep(0.005)
        t_active = time.time()
        if st == "active":
            qa.cmd("migrate-start-postcopy")
        t_postcopy = time.time()
        wait_for(lambda: counts(bout) or bq.poll() is not None or a.poll() is not None,
                 1200, "QEMU B's guest to run")
        t_run = time.time()
        before = proxy.carried()
        if not counts(bout):
            raise SystemExit(f"QEMU A or B exited; see {h}")
        first = counts(bout)[0]
        while True:
            mb = migration(qb)
            if mb.get("status") in ("completed", "failed"):
                break
            if bq.poll() is not None or time.time() - t0 > 3600:
                raise SystemExit(f"QEMU B's migration did not complete; see {h}")
            time.sleep(0.02)
        t_done = time.time()
        if mb.get("status") != "completed":
            raise SystemExit(f"QEMU B's migration failed; see {h}")
        wait_for(lambda: migration(qa).get("status") in ("completed", "failed"), 60,
                 "QEMU A's migration to end")
        ma = migration(qa)
        last = max(counts(bout))
        wait_for(lambda: max(counts(bout)) > last or bq.poll() is not None, 30, "B's guest to count on")
        runs_on = bq.poll() is None
        total = proxy.carried()
    finally:
        for q in (qa, qb):
            if q:
                q.close()
        for p in (a, bq):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        if proxy:
            proxy.close()
    ram = ma.get("ram") or {}
    requests = ram.get("postcopy-requests")
    blocktime = mb.get("postcopy-blocktime")
    res = {"method": "qemu", "rate": rate, "preempt": preempt, "bandwidth": bandwidth, "seconds": t_run - t0, "first_count": first,
           "active_after": t_active - t0, "postcopy_after": t_postcopy - t0,
           "all_memory_seconds": t_done - t0, "bytes_before_running": before["up"],
           "bytes_back_before_running": before["down"], "bytes_total": total["up"],
           "bytes_back_total": total["down"], "physical_limit": before["up"] * 8 / rate_bits(rate),
           "runs_on": runs_on, "postcopy_requests": requests, "postcopy_blocktime_ms": blocktime,
           "postcopy_vcpu_blocktime_ms": mb.get("postcopy-vcpu-blocktime"),
           "fault_mean_ms": blocktime / requests if requests and blocktime is not None else None,
           "ram_transferred": ram.get("transferred"), "ram_normal": ram.get("normal"),
           "ram_duplicate": ram.get("duplicate"), "ram_dirty_sync_count": ram.get("dirty-sync-count"),
           "downtime_ms": ma.get("downtime"), "total_time_ms": ma.get("total-time"),
           "source": ma, "destination": mb}
    shutil.rmtree(h, ignore_errors=True)
    return res


def roamdisk_one(d, rate, delay, memory, script, blob, n, chunk_size=None):
    """Boot, `roamdisk suspend --qmp` into a fresh store, lazy resume over
    `store serve --limit RATE --latency 2*DELAY`."""
    h = os.path.join(d, f"r-{n}")
    os.makedirs(h)
    store = os.path.join(h, "store")
    run(B, "-q", "store", "init", store)
    rep, md5 = lazy.boot_and_suspend(h, store, memory, script, blob, None, chunk_size,
                                      base=lazy.base_image(d))
    stored = lazy.stored_bytes(rep)
    est = stored * 8 / rate_bits(rate)
    latency = f"{2 * delay * 1000:g}ms"
    res = lazy.one(h, store, rate, "lazy-none", memory, script, n, latency, wait_all=True, est=est)
    res.update({"method": "roamdisk", "latency": latency, "stored_bytes": stored,
                "blob_md5": md5, "suspend": rep,
                "fault_mean_ms": None})
    shutil.rmtree(h, ignore_errors=True)
    return res


def table(results, rates, delay):
    print(f"\n| link, {2 * delay * 1000:g} ms round trip | method | time to running (s) "
          "| time to all memory (s) | bytes before running | ÷ rate (s) | page faults "
          "| fault latency (ms) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for rate in rates:
        for method in ("qemu", "roamdisk"):
            rs = [r for r in results if r["rate"] == rate and r["method"] == method]
            if not rs:
                continue
            m = {k: median(r.get(k) for r in rs) for k in (
                "seconds", "all_memory_seconds", "bytes_before_running", "physical_limit",
                "postcopy_requests", "faults", "fault_mean_ms", "fault_p50_us", "fault_p99_us")}
            if method == "qemu":
                faults = fmt(m["postcopy_requests"], ".0f")
                lat = f"mean {fmt(m['fault_mean_ms'], '.1f')} (blocktime / requests)"
            else:
                faults = fmt(m["faults"], ".0f")
                lat = (f"p50 {m['fault_p50_us'] / 1000:.1f}, p99 {m['fault_p99_us'] / 1000:.1f}"
                       if m["fault_p50_us"] is not None else "-")
            label = ("QEMU postcopy (live)" + (", preempt" if rs[0].get("preempt") else "")
                     + ("" if rs[0].get("bandwidth") == "link" else ", default bandwidth")
                     if method == "qemu" else "roamdisk lazy resume")
            print(f"| {rate} | {label} | {m['seconds']:.2f} | {fmt(m['all_memory_seconds'], '.2f')} "
                  f"| {m['bytes_before_running'] / 1e6:.2f} MB | {m['physical_limit']:.2f} "
                  f"| {faults} | {lat} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="10Mbit,100Mbit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--memory", type=int, default=256, help="guest RAM, MiB")
    ap.add_argument("--blob", type=int, default=24, help="MiB of random data in the guest's /tmp")
    ap.add_argument("--delay", default="4ms", help="one-way delay of the link")
    ap.add_argument("--memory-chunk-size", help="suspend --memory-chunk-size (default: its own)")
    ap.add_argument("--preempt", action="store_true",
                    help="QEMU: postcopy-preempt on (faulted pages on a channel of their own)")
    ap.add_argument("--qemu-bandwidth", choices=("link", "default"), default="link",
                    help="QEMU A's max-bandwidth and max-postcopy-bandwidth: the link rate, "
                    "or QEMU's defaults")
    ap.add_argument("--out")
    a = ap.parse_args()
    delay = duration(a.delay)
    rates = a.rates.split(",")
    for r in rates:
        rate_bits(r)
    lazy.on_signals()
    d = tempfile.mkdtemp(prefix="qemu-postcopy-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    ok = False
    try:
        script = lazy.write_script(os.path.join(d, "script.sh"), a.blob)
        lazy.base_image(d)
        results, n = [], 0
        for rate in rates:
            for k in range(a.runs):
                for method in (("qemu", "roamdisk") if k % 2 == 0 else ("roamdisk", "qemu")):
                    n += 1
                    if method == "qemu":
                        res = qemu_one(d, rate, delay, a.memory, script, a.blob, n, a.preempt,
                                       a.qemu_bandwidth)
                    else:
                        res = roamdisk_one(d, rate, delay, a.memory, script, a.blob, n,
                                           a.memory_chunk_size)
                    print(json.dumps({k: v for k, v in res.items() if k not in (
                        "source", "destination", "suspend", "restored", "running_lazy")}),
                        file=sys.stderr)
                    results.append(res)
        table(results, rates, delay)
        save_results(a.out, "qemu-postcopy", {"runs": results, "args": vars(a)})
        ok = True
    finally:
        lazy.kill_all()
        if ok:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"the bench's files are kept in {d}", file=sys.stderr)


if __name__ == "__main__":
    main()
