#!/usr/bin/python3
"""Chaos on `roamdisk server`: many clients write and verify their own data
while the server, the clients, the golden image's reader and the links fail.

    /usr/bin/python3 bench/chaos-server.py --minutes 30 --clients 100   # bench
    /usr/bin/python3 bench/chaos-server.py --minutes 3 --clients 20     # CI

The world (all on loopback, in a temporary folder):

- the golden image (8 MiB of random bytes) is read by its own process,
  `roamdisk serve raw:golden.img --read-only` on a Unix socket, and the
  server's image is `nbd:` over that socket (the nbd layer reconnects);
- `roamdisk server` serves it to N clients, each with its own
  copy-on-write view, over TLS-PSK on TCP, each client known by its PSK
  identity;
- every client connects through a TCP proxy in this process that now and
  then drops a connection and stalls another for up to 4 s;
- every client (a thread with its own libnbd handle) writes runs of 4 KiB
  blocks stamped with its name, the block and a generation, flushes, and
  reads back; after any error it reconnects and reads its whole disk.

Meanwhile, every 3-10 s, one of: the server killed (SIGKILL) or stopped
(SIGTERM) and started again, the golden image's reader killed and started
again, a client dropping its connection without a flush.

What must hold, checked on every read: each block reads as the golden
image (never written), its content at the client's last acknowledged flush,
or one written after it; never another client's block, another block, a
generation that was never written or a torn mix. Every failure a client
sees must be an error (no hang past the stalls, no wrong data), and no
process may panic. The script prints a summary, writes `--json`, and exits
1 if anything was lost or mixed up.

Needs Debian's python3-libnbd (`/usr/bin/python3`), and a built roamdisk
(`--bin`, default target/release/roamdisk).
"""

import argparse
import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import nbd

BLOCK = 4096
DISK = 8 << 20
BLOCKS = DISK // BLOCK
MAGIC = b"RDCHAOS1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def content(client, block, gen):
    """The bytes client `client` writes to `block` at generation `gen`."""
    head = MAGIC + struct.pack("<IIQ", client, block, gen)
    body = random.Random(client << 40 | block << 20 | gen).randbytes(BLOCK - len(head))
    return head + body


def kind(e):
    """An error's message without its numbers (to count errors by kind)."""
    return re.sub(r"\d+", "N", str(e))[:140]


def log_lines(path):
    """The server's WARN and ERROR lines by kind (numbers and names dropped)."""
    c = collections.Counter()
    with open(path, errors="replace") as f:
        for line in f:
            m = re.search(r"\b(WARN|ERROR)\b(.*)", line)
            if m:
                text = re.sub(r"\x1b\[[0-9;]*m", "", m.group(0))
                c[re.sub(r"\d+", "N", re.sub(r"c\d{3}", "cN", text))[:160]] += 1
    return dict(c.most_common(25))


class Proc:
    """A child process, started again on demand; its output in a log."""

    def __init__(self, name, args, log, ready):
        self.name, self.args, self.log, self.ready = name, args, log, ready
        self.p = None
        self.starts = 0

    def start(self):
        f = open(self.log, "a")
        f.write(f"\n=== start {self.starts + 1} at {time.time():.3f}\n")
        f.flush()
        self.p = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
        self.starts += 1
        t0 = time.time()
        while not self.ready():
            if self.p.poll() is not None:
                raise SystemExit(f"chaos: {self.name} exited at start: see {self.log}")
            if time.time() - t0 > 30:
                raise SystemExit(f"chaos: {self.name} not ready after 30 s: see {self.log}")
            time.sleep(0.05)

    def kill(self, sig):
        if self.p and self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                return "did not stop within 30 s"
        return None


def tcp_ready(port):
    def f():
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False
    return f


def unix_ready(path):
    def f():
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
            return True
        except OSError:
            return False
    return f


class Proxy:
    """TCP proxy between the clients and the server that drops and stalls."""

    def __init__(self, listen, target, rng):
        self.listen, self.target, self.rng = listen, target, rng
        self.conns = []
        self.drops = self.stalls = 0
        self.loop = asyncio.new_event_loop()

    async def pipe(self, r, w, gate):
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                await gate.wait()
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def handle(self, cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            cw.close()
            return
        gate = asyncio.Event()
        gate.set()
        conn = (cw, sw, gate)
        self.conns.append(conn)
        try:
            await asyncio.gather(self.pipe(cr, sw, gate), self.pipe(sr, cw, gate))
        finally:
            if conn in self.conns:
                self.conns.remove(conn)

    async def chaos(self, stop):
        while not stop.is_set():
            await asyncio.sleep(self.rng.uniform(1, 5))
            if not self.conns:
                continue
            cw, sw, gate = self.rng.choice(self.conns)
            if self.rng.random() < 0.5:
                self.drops += 1
                cw.transport.abort()
                sw.transport.abort()
            else:
                self.stalls += 1
                gate.clear()
                self.loop.call_later(self.rng.uniform(0.5, 4), gate.set)

    def run(self, stop):
        """Forward until the process ends; drop and stall until `stop`."""
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(
            asyncio.start_server(self.handle, "127.0.0.1", self.listen))
        self.loop.create_task(self.chaos(stop))
        self.loop.run_forever()


class Client(threading.Thread):
    def __init__(self, idx, world, seed):
        super().__init__(daemon=True)
        self.idx, self.w = idx, world
        self.name_ = f"c{idx:03d}"
        self.rng = random.Random(seed)
        self.allowed = [[0] for _ in range(BLOCKS)]  # generation 0: the golden image
        self.current = [0] * BLOCKS
        self.gen = 0
        self.h = None
        self.crash = threading.Event()
        self.stats = collections.Counter()
        self.errors = collections.Counter()
        self.failures = []

    def connect(self):
        h = nbd.NBD()
        h.set_export_name("desk")
        h.set_tls(nbd.TLS_REQUIRE)
        h.set_tls_username(self.name_)
        h.set_tls_psk_file(self.w.psk)
        h.connect_tcp("127.0.0.1", str(self.w.proxy_port))
        self.h = h
        self.stats["connects"] += 1

    def close(self):
        if self.h is not None:
            try:
                self.h.shutdown()
            except nbd.Error:
                pass
            self.h = None

    def check_block(self, b, data):
        if data[:8] != MAGIC:
            gen = 0 if data == self.w.golden[b * BLOCK:(b + 1) * BLOCK] else None
            if gen is None:
                return f"block {b}: neither the golden image nor a stamped block"
        else:
            client, block, gen = struct.unpack("<IIQ", data[8:24])
            if client != self.idx:
                return f"block {b}: holds client {client}'s data (MIXED UP)"
            if block != b:
                return f"block {b}: holds block {block}'s data"
            if data != content(client, block, gen):
                return f"block {b}: generation {gen} torn or altered"
        if gen not in self.allowed[b]:
            return (f"block {b}: generation {gen}, but the last flush left {self.allowed[b][0]} "
                    f"and {self.allowed[b][1:]} were written since (LOST)")
        self.current[b] = gen
        return None

    def verify_all(self):
        for off in range(0, DISK, 1 << 20):
            data = self.h.pread(1 << 20, off)
            for i in range(0, 1 << 20, BLOCK):
                why = self.check_block((off + i) // BLOCK, data[i:i + BLOCK])
                if why:
                    self.failures.append(why)
        self.stats["verified_disks"] += 1

    def step(self):
        r = self.rng.random()
        if r < 0.65:
            n = self.rng.randint(1, 8)
            b0 = self.rng.randrange(BLOCKS - n + 1)
            buf = bytearray()
            for b in range(b0, b0 + n):
                self.gen += 1
                self.allowed[b].append(self.gen)
                buf += content(self.idx, b, self.gen)
            self.h.pwrite(bytes(buf), b0 * BLOCK)
            for b in range(b0, b0 + n):
                self.current[b] = self.allowed[b][-1]
            self.stats["writes"] += 1
        elif r < 0.8:
            self.h.flush()
            for b in range(BLOCKS):
                self.allowed[b] = [self.current[b]]
            self.stats["flushes"] += 1
        else:
            n = self.rng.randint(1, 16)
            b0 = self.rng.randrange(BLOCKS - n + 1)
            data = self.h.pread(n * BLOCK, b0 * BLOCK)
            for i in range(n):
                why = self.check_block(b0 + i, data[i * BLOCK:(i + 1) * BLOCK])
                if why:
                    self.failures.append(why)
            self.stats["reads"] += 1

    def reconnect(self):
        self.close()
        delay = 0.05
        while True:
            try:
                self.connect()
                self.verify_all()
                return True
            except nbd.Error as e:
                self.errors[kind(e)] += 1
                self.close()
                if self.w.stop.is_set() and self.w.final.is_set():
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 2)

    def run(self):
        self.reconnect()
        while not self.w.stop.is_set():
            if self.crash.is_set():
                # A client that dies: its connection gone, no flush.
                self.crash.clear()
                self.stats["crashes"] += 1
                self.h = None  # dropped without NBD_CMD_DISC
                self.reconnect()
                continue
            try:
                self.step()
            except nbd.Error as e:
                self.errors[kind(e)] += 1
                self.stats["errors"] += 1
                self.reconnect()
        # The end: a last full check on a calm world.
        self.w.final.wait()
        self.reconnect()
        try:
            self.h.flush()
            self.verify_all()
        except nbd.Error as e:
            self.failures.append(f"the final check failed: {e}")
        self.close()


class World:
    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="roamdisk-chaos-")
        self.stop = threading.Event()
        self.final = threading.Event()
        rng = random.Random(a.seed)
        self.golden = rng.randbytes(DISK)
        with open(os.path.join(self.dir, "golden.img"), "wb") as f:
            f.write(self.golden)
        self.psk = os.path.join(self.dir, "clients.psk")
        with open(self.psk, "w") as f:
            for i in range(a.clients):
                f.write(f"c{i:03d}:{rng.randbytes(32).hex()}\n")
        gsock = os.path.join(self.dir, "golden.sock")
        self.golden_proc = Proc(
            "golden reader",
            [a.bin, "serve", f"raw:{self.dir}/golden.img", "--read-only", "--socket", gsock, "-q"],
            os.path.join(self.dir, "golden.log"), unix_ready(gsock))
        self.server_port = free_port()
        self.proxy_port = free_port()
        cfg = os.path.join(self.dir, "server.toml")
        with open(cfg, "w") as f:
            f.write(f'format = "roamdisk-server"\nversion = 1\nstate = "state"\n'
                    f'listen = ["127.0.0.1:{self.server_port}"]\ntls-psk = "clients.psk"\n'
                    f'[cache]\nsize = "4M"\n'
                    f'[[image]]\nname = "desk"\nstack = "nbd[timeout=10s]:nbd+unix:///?socket={gsock}"\n')
            for i in range(a.clients):
                f.write(f'[[client]]\nname = "c{i:03d}"\npsk-identity = "c{i:03d}"\nview = ["desk"]\n')
        self.server = Proc("server", [a.bin, "server", cfg],
                           os.path.join(self.dir, "server.log"), tcp_ready(self.server_port))
        self.events = collections.Counter()
        self.stop_trouble = []

    def chaos(self, rng, clients):
        while not self.stop.wait(rng.uniform(3, 10)):
            r = rng.random()
            if r < 0.3:
                self.events["server SIGKILL"] += 1
                self.server.kill(signal.SIGKILL)
                time.sleep(rng.uniform(0, 2))
                self.server.start()
            elif r < 0.45:
                self.events["server SIGTERM"] += 1
                why = self.server.kill(signal.SIGTERM)
                if why:
                    self.stop_trouble.append(f"server {why}")
                elif self.server.p.returncode != 0:
                    self.stop_trouble.append(f"server SIGTERM exit {self.server.p.returncode}")
                self.server.start()
            elif r < 0.65:
                self.events["golden reader SIGKILL"] += 1
                self.golden_proc.kill(signal.SIGKILL)
                time.sleep(rng.uniform(0, 3))
                self.golden_proc.start()
            else:
                self.events["client crash"] += 1
                rng.choice(clients).crash.set()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "target", "release", "roamdisk"))
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"chaos: no roamdisk at {a.bin}: build it (cargo build --release) or give --bin")
    w = World(a)
    w.golden_proc.start()
    w.server.start()
    rng = random.Random(a.seed)
    proxy = Proxy(w.proxy_port, w.server_port, random.Random(a.seed + 1))
    threading.Thread(target=proxy.run, args=(w.stop,), daemon=True).start()
    time.sleep(0.3)
    clients = [Client(i, w, a.seed * 1000 + i) for i in range(a.clients)]
    for c in clients:
        c.start()
    chaos = threading.Thread(target=w.chaos, args=(rng, clients), daemon=True)
    t0 = time.time()
    chaos.start()
    last = t0
    while time.time() - t0 < a.minutes * 60:
        time.sleep(5)
        if time.time() - last >= 60:
            last = time.time()
            ops = sum(sum(c.stats[k] for k in ("writes", "flushes", "reads")) for c in clients)
            print(f"chaos: {(last - t0) / 60:.0f} min, {ops} client requests, "
                  f"events {dict(w.events)}, proxy drops {proxy.drops} stalls {proxy.stalls}",
                  flush=True)
    w.stop.set()
    chaos.join()
    # A calm world for the final check: everything up.
    if w.server.p.poll() is not None:
        w.server.start()
    if w.golden_proc.p.poll() is not None:
        w.golden_proc.start()
    time.sleep(5)  # the proxy's last stall ends; it keeps forwarding
    w.final.set()
    deadline = time.time() + 300
    for c in clients:
        c.join(max(1, deadline - time.time()))
    hung = [c.name_ for c in clients if c.is_alive()]
    why = w.server.kill(signal.SIGTERM)
    if why or w.server.p.returncode != 0:
        w.stop_trouble.append(f"final server SIGTERM: {why or w.server.p.returncode}")
    w.golden_proc.kill(signal.SIGTERM)
    panics = []
    for log in ("server.log", "golden.log"):
        with open(os.path.join(w.dir, log), errors="replace") as f:
            panics += [f"{log}: {l.strip()}" for l in f if "panicked" in l]
    failures = [f"{c.name_}: {f}" for c in clients for f in c.failures]
    stats = collections.Counter()
    errors = collections.Counter()
    for c in clients:
        stats.update(c.stats)
        errors.update(c.errors)
    result = {
        "minutes": a.minutes, "clients": a.clients, "seed": a.seed,
        "requests": dict(stats), "events": dict(w.events),
        "proxy_drops": proxy.drops, "proxy_stalls": proxy.stalls,
        "server_starts": w.server.starts, "golden_reader_starts": w.golden_proc.starts,
        "client_errors": dict(errors.most_common()),
        "server_log": log_lines(os.path.join(w.dir, "server.log")),
        "failures": failures[:100], "failure_count": len(failures),
        "hung_clients": hung, "panics": panics[:20], "stop_trouble": w.stop_trouble,
        "dir": w.dir,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bin": a.bin,
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = failures or hung or panics or w.stop_trouble
    if bad:
        sys.exit(f"chaos: FAILED: {len(failures)} data failures, {len(hung)} hung clients, "
                 f"{len(panics)} panics, {len(w.stop_trouble)} unclean stops (logs in {w.dir})")
    shutil.rmtree(w.dir, ignore_errors=True)
    print(f"chaos: passed: {stats['writes']} writes, {stats['flushes']} flushes, "
          f"{stats['reads']} reads, {stats['verified_disks']} whole-disk checks, no data lost "
          f"or mixed up")


if __name__ == "__main__":
    main()
