#!/usr/bin/env python3
"""Chaos on the chunk server in front of an S3 store: users commit, check
out and collect while the chunk server, Swift's object servers and the
users' own processes fail.

    python3 bench/chaos-store.py --minutes 30 --users 20    # bench
    python3 bench/chaos-store.py --minutes 3 --users 8      # a short run

The world, on loopback in a temporary folder: a Swift cluster with s3api
(scripts/swift-setup and swift-run: 3 nodes, 3 replicas), a chunk store in
one of its buckets, and `roamdisk store serve s3://...` in front of it. Each
user (a thread running `roamdisk` commands) owns a 2 MiB raw image and, at
random: changes 1-16 of its 4 KiB blocks and commits it to USER/desk through
the chunk server (one commit in twenty killed with SIGKILL part-way), checks
out a version it committed earlier and compares it byte for byte, or runs a
gc of the store. Every 3-10 s one of: the chunk server killed (SIGKILL) and
started again; one of Swift's object servers killed for 2-10 s; one paused
(SIGSTOP) for 1-8 s.

What must hold: every version a commit reported stays in the store and
checks out exactly as it was committed, during the run and at the end, and
`roamdisk store verify` finds nothing bad or missing at the end. Every
command that fails must exit 1 with an error message (no panic, no signal
but ours, no hang past a 10-minute guard). Prints a summary, writes
`--json`, exits 1 if anything was lost.
"""

import argparse
import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 2 << 20
BLOCK = 4096
BUCKET = "roamdisk-chaos"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_range_free(base):
    for p in range(base, base + 41):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def tcp_ready(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


class World:
    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="roamdisk-chaos-store-")
        self.stop = threading.Event()
        self.events = collections.Counter()
        self.lock = threading.Lock()
        self.swift = os.path.join(self.dir, "swift")
        rng = random.Random(a.seed)
        for _ in range(100):
            base = 10000 + rng.randrange(250) * 40
            if port_range_free(base):
                break
        subprocess.run([f"{ROOT}/scripts/swift-setup", self.swift, "--port", str(base)],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([f"{ROOT}/scripts/swift-run", "start", self.swift], check=True,
                       stdout=subprocess.DEVNULL)
        env_text = subprocess.run([f"{ROOT}/scripts/swift-run", "env", self.swift], check=True,
                                  capture_output=True, text=True).stdout
        self.env = dict(os.environ)
        for k, v in re.findall(r"(AWS_\w+)=['\"]?([^'\"\n]*)", env_text):
            self.env[k] = v
        venv = os.environ.get("ROAMDISK_SWIFT_VENV", "/opt/roamdisk-swift")
        subprocess.run([f"{venv}/bin/python", "-c",
                        f"import boto3; boto3.client('s3').create_bucket(Bucket='{BUCKET}')"],
                       check=True, env=self.env)
        self.s3 = f"s3://{BUCKET}/store"
        self.run([a.bin, "store", "init", self.s3, "-q"], check=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = None
        self.server_starts = 0
        self.start_server()

    def run(self, args, check=False, timeout=600):
        r = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise SystemExit(f"chaos-store: {' '.join(args)} failed:\n{r.stderr}")
        return r

    def start_server(self):
        log = open(os.path.join(self.dir, "chunk-server.log"), "a")
        log.write(f"\n=== start at {time.time():.3f}\n")
        log.flush()
        self.server = subprocess.Popen(
            [self.a.bin, "store", "serve", self.s3, "--listen", f"127.0.0.1:{self.port}"],
            env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.server_starts += 1
        t0 = time.time()
        while not tcp_ready(self.port):
            if self.server.poll() is not None or time.time() - t0 > 60:
                raise SystemExit(f"chaos-store: the chunk server did not start: {self.dir}")
            time.sleep(0.05)

    def swift_run(self, *args):
        subprocess.run([f"{ROOT}/scripts/swift-run", *args], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def chaos(self, rng):
        while not self.stop.wait(rng.uniform(3, 10)):
            r = rng.random()
            if r < 0.35:
                self.events["chunk server SIGKILL"] += 1
                self.server.kill()
                self.server.wait()
                time.sleep(rng.uniform(0, 2))
                self.start_server()
            elif r < 0.7:
                n = str(rng.randint(1, 3))
                self.events["object server killed"] += 1
                self.swift_run("kill", self.swift, n)
                time.sleep(rng.uniform(2, 10))
                self.swift_run("start", self.swift)
            else:
                n = str(rng.randint(1, 3))
                self.events["object server paused"] += 1
                self.swift_run("pause", self.swift, n)
                time.sleep(rng.uniform(1, 8))
                self.swift_run("resume", self.swift, n)


def clear_error(r):
    """Whether a failed command failed clearly: exit 1, a message, no panic."""
    return r.returncode == 1 and r.stderr.strip() and "panicked" not in r.stderr


class User(threading.Thread):
    def __init__(self, i, w, seed):
        super().__init__(daemon=True)
        self.i, self.w = i, w
        self.name_ = f"u{i:02d}"
        self.rng = random.Random(seed)
        self.img = os.path.join(w.dir, f"{self.name_}.img")
        with open(self.img, "wb") as f:
            f.write(self.rng.randbytes(SIZE))
        self.versions = {}  # version id -> sha256 of the image committed
        self.stats = collections.Counter()
        self.errors = collections.Counter()
        self.failures = []
        self.gen = 0

    def note_error(self, what, r):
        msg = (r.stderr.strip().splitlines() or ["(nothing)"])[-1]
        self.errors[f"{what}: " + re.sub(r"[0-9a-f]{8,}|\d+", "N", msg)[:150]] += 1
        if not clear_error(r):
            self.failures.append(f"{what} exit {r.returncode} without a clear error: {r.stderr[-500:]}")

    def commit(self):
        with open(self.img, "r+b") as f:
            for _ in range(self.rng.randint(1, 16)):
                self.gen += 1
                f.seek(self.rng.randrange(SIZE // BLOCK) * BLOCK)
                f.write(f"{self.name_} gen {self.gen} ".encode().ljust(BLOCK, b"."))
        with open(self.img, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        args = [self.w.a.bin, "commit", f"raw:{self.img}", "--to", f"{self.name_}/desk",
                "--store", self.w.url, "--json", "-q"]
        if self.rng.random() < 0.05:
            # The user's process killed part-way: nothing is reported.
            p = subprocess.Popen(args, env=self.w.env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(self.rng.uniform(0, 0.5))
            p.kill()
            p.wait()
            self.stats["commits killed"] += 1
            return
        r = self.w.run(args)
        if r.returncode == 0:
            v = json.loads(r.stdout)["version"]
            self.versions[v] = digest
            self.stats["commits"] += 1
        else:
            self.stats["commits failed"] += 1
            self.note_error("commit", r)

    def checkout(self, v, final=False):
        out = os.path.join(self.w.dir, f"{self.name_}.out")
        if os.path.exists(out):
            os.remove(out)
        r = self.w.run([self.w.a.bin, "checkout", f"{self.name_}/desk@{v}", "--output", out,
                        "--store", self.w.url, "-q"])
        if r.returncode != 0:
            self.stats["checkouts failed"] += 1
            self.note_error("checkout", r)
            if final:
                self.failures.append(f"version {v}: the final checkout failed: {r.stderr[-300:]}")
            return
        with open(out, "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if got != self.versions[v]:
            self.failures.append(f"version {v} checks out with other content (LOST)")
        self.stats["checkouts"] += 1

    def gc(self):
        r = self.w.run([self.w.a.bin, "gc", "--store", self.w.url, "-q"])
        if r.returncode == 0:
            self.stats["gcs"] += 1
        else:
            self.stats["gcs failed"] += 1
            self.note_error("gc", r)

    def run(self):
        while not self.w.stop.is_set():
            x = self.rng.random()
            try:
                if x < 0.6 or not self.versions:
                    self.commit()
                elif x < 0.93:
                    self.checkout(self.rng.choice(list(self.versions)))
                else:
                    self.gc()
            except subprocess.TimeoutExpired as e:
                self.failures.append(f"a command hung for 10 minutes: {e.cmd}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "roamdisk"))
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"chaos-store: no roamdisk at {a.bin}: build it or give --bin")
    w = World(a)
    users = [User(i, w, a.seed * 1000 + i) for i in range(a.users)]
    for u in users:
        u.start()
    chaos = threading.Thread(target=w.chaos, args=(random.Random(a.seed),), daemon=True)
    chaos.start()
    t0 = time.time()
    last = t0
    while time.time() - t0 < a.minutes * 60:
        time.sleep(5)
        if time.time() - last >= 60:
            last = time.time()
            n = sum(u.stats["commits"] for u in users)
            print(f"chaos-store: {(last - t0) / 60:.0f} min, {n} commits, {dict(w.events)}",
                  flush=True)
    w.stop.set()
    chaos.join()
    for u in users:
        u.join(900)
    # A calm world: every node and the chunk server up, then every version.
    w.swift_run("start", w.swift)
    for n in "123":
        w.swift_run("resume", w.swift, n)
    if w.server.poll() is not None:
        w.start_server()
    for u in users:
        for v in list(u.versions):
            u.checkout(v, final=True)
    verify = w.run([a.bin, "store", "verify", "--store", w.s3, "--json", "-q"])
    verify_ok = verify.returncode == 0
    with open(os.path.join(w.dir, "chunk-server.log"), errors="replace") as f:
        panics = [l.strip() for l in f if "panicked" in l]
    w.server.terminate()
    w.server.wait()
    subprocess.run([f"{ROOT}/scripts/swift-run", "stop", w.swift], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    stats, errors = collections.Counter(), collections.Counter()
    for u in users:
        stats.update(u.stats)
        errors.update(u.errors)
    failures = [f"{u.name_}: {f}" for u in users for f in u.failures]
    result = {
        "minutes": a.minutes, "users": a.users, "seed": a.seed,
        "operations": dict(stats), "events": dict(w.events),
        "chunk_server_starts": w.server_starts,
        "versions_checked_at_end": sum(len(u.versions) for u in users),
        "errors": dict(errors.most_common(30)),
        "store_verify": verify.stdout.strip()[-2000:] if verify_ok else verify.stderr[-2000:],
        "failures": failures[:100], "failure_count": len(failures), "panics": panics[:20],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bin": a.bin,
        "dir": w.dir,
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if failures or panics or not verify_ok:
        sys.exit(f"chaos-store: FAILED: {len(failures)} failures, {len(panics)} panics, "
                 f"store verify {'ok' if verify_ok else 'FAILED'} (logs in {w.dir})")
    shutil.rmtree(w.dir, ignore_errors=True)
    print(f"chaos-store: passed: {stats['commits']} commits, {stats['checkouts']} checkouts, "
          f"{stats['gcs']} gcs; every committed version checks out")


if __name__ == "__main__":
    main()
