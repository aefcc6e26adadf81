#!/usr/bin/env python3
"""Same-run A/B of two roamdisk builds (issue 23: "performance must not
move"). Each row runs with both binaries, interleaved (the order flips
every pass), for --passes passes; the table gives each build's median and
the ratio new / old (above 1: the new build is faster).

Rows:
  nbd-qd1        `serve raw:IMG`, fio 4 KiB random reads, queue depth 1 (IOPS)
  nbd-qd32       the same at queue depth 32 (IOPS)
  commit-1g      `commit raw:IMG` of 1 GiB of random data into a new local store (MB/s)
  cas-primed     a session whose shared cache holds every chunk (`hoard`), fio 4 KiB
                 random reads, queue depth 32 (IOPS)
  server-miss    bench/server-miss-path.py's cache row: 50 clients reading once through
                 the server's FMPQ cache, every access a miss (requests/s)
  lbs-steady     bench/lbs.py's steady-state rows (hot/cold and zipf:1.1) on a full
                 1 GiB LBS image (XTS + CRC-32C), fio 4 KiB random writes QD 16 with a
                 FLUSH every 64 (IOPS; lbs.py interleaves the two builds itself)

Usage: bench/ab.py --old OLD_BIN [--new NEW_BIN] [--passes 3] [--rows a,b]
Needs: fio, qemu-img (scripts/test installs them). Only the standard library.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from roamdisk_bench import ROOT, stop, wait_unix_listening

ROWS = ["nbd-qd1", "nbd-qd32", "commit-1g", "cas-primed", "server-miss", "lbs-steady"]
RUNTIME = 8


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def random_file(path, size):
    with open("/dev/urandom", "rb") as r, open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(r.read(n))
            left -= n


def serve(b, spec, sock, *extra):
    if os.path.exists(sock):
        os.unlink(sock)
    p = subprocess.Popen([b, "-q", "serve", spec, "--socket", sock, *extra],
                         stderr=subprocess.DEVNULL)
    wait_unix_listening(p, sock, "roamdisk serve")
    return p


def fio_read(sock, depth, size):
    out = run("fio", "--name=r", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
              "--rw=randread", "--bs=4k", f"--iodepth={depth}", f"--size={size}",
              f"--runtime={RUNTIME}", "--time_based", "--output-format=json")
    return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]


class Work:
    """Files shared by both builds' runs (made once)."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.img = os.path.join(tmp, "data.img")
        random_file(self.img, 1 << 30)

    def nbd(self, b, depth):
        sock = os.path.join(self.tmp, "nbd.sock")
        p = serve(b, f"raw:{self.img}", sock, "--read-only")
        try:
            return fio_read(sock, depth, "1g")
        finally:
            stop(p)

    def commit(self, b):
        store = os.path.join(self.tmp, "store-commit")
        shutil.rmtree(store, ignore_errors=True)
        t0 = time.monotonic()
        run(b, "-q", "commit", f"raw:{self.img}", "--to", "ab/disk", "--store", store)
        dt = time.monotonic() - t0
        shutil.rmtree(store, ignore_errors=True)
        return (1 << 30) / dt / 1e6

    def cas_primed(self, b):
        d = os.path.join(self.tmp, "cas")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        store, cache, sess = (os.path.join(d, x) for x in ("store", "shared", "session"))
        env = dict(os.environ, ROAMDISK_SHARED_CACHE=cache)
        small = os.path.join(d, "disk.img")
        with open(self.img, "rb") as src, open(small, "wb") as dst:
            dst.write(src.read(512 << 20))
        run(b, "-q", "commit", f"raw:{small}", "--to", "ab/vm", "--store", store, env=env)
        run(b, "-q", "hoard", "ab/vm", "--store", store, env=env)
        run(b, "-q", "checkout", "ab/vm", "--session", sess, "--store", store, env=env)
        sock = os.path.join(d, "s.sock")
        p = subprocess.Popen([b, "-q", "serve", f"cas:{sess}", "--socket", sock],
                             env=env, stderr=subprocess.DEVNULL)
        wait_unix_listening(p, sock, "roamdisk serve cas:")
        try:
            return fio_read(sock, 32, "512m")
        finally:
            stop(p)
            shutil.rmtree(d, ignore_errors=True)

    def server_miss(self, b):
        out = os.path.join(self.tmp, "miss.json")
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "server-miss-path.py"),
                        "--bin", b, "--rounds", "1", "--out", out],
                       check=True, capture_output=True, text=True)
        with open(out) as f:
            r = json.load(f)["results"]
        os.unlink(out)
        return r["cache fmpq"]["median"]


def lbs_steady(old, new, passes):
    """bench/lbs.py's steady-state rows for both builds (it interleaves)."""
    out = tempfile.mkdtemp(prefix="roamdisk-ab-lbs-")
    try:
        env = dict(os.environ, ROAMDISK_BIN=new)
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lbs.py"),
                        "--also", f"old={old}", "--configs", "lbs-xts-crc32c,lbs-xts-crc32c@old",
                        "--rows", "steady-hotcold,steady-zipf", "--size", "1G",
                        "--runtime", str(RUNTIME), "--passes", str(passes), "--out", out],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        name = next(n for n in os.listdir(out) if n.endswith(".json"))
        with open(os.path.join(out, name)) as f:
            r = json.load(f)["results"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        f"lbs-steady-{row}": (r["lbs-xts-crc32c@old"][f"steady-{row}"], r["lbs-xts-crc32c"][f"steady-{row}"])
        for row in ("hotcold", "zipf")
    }


UNITS = {"nbd-qd1": "IOPS", "nbd-qd32": "IOPS", "commit-1g": "MB/s", "cas-primed": "IOPS",
         "server-miss": "requests/s", "lbs-steady-hotcold": "IOPS", "lbs-steady-zipf": "IOPS"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the build before the change")
    ap.add_argument("--new", default=os.path.join(ROOT, "target", "release", "roamdisk"))
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--out", default=None, help="JSON results (default bench/results/ab-DATE.json)")
    a = ap.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            sys.exit(f"unknown row {r} (rows: {', '.join(ROWS)})")
    for tool in ("fio", "qemu-img"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (scripts/test installs the tools)")
    tmp = tempfile.mkdtemp(prefix="roamdisk-ab-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    res = {}
    try:
        w = Work(tmp)
        jobs = {
            "nbd-qd1": lambda b: w.nbd(b, 1),
            "nbd-qd32": lambda b: w.nbd(b, 32),
            "commit-1g": w.commit,
            "cas-primed": w.cas_primed,
            "server-miss": w.server_miss,
        }
        builds = [("old", a.old), ("new", a.new)]
        for p in range(a.passes):
            order = builds if p % 2 == 0 else builds[::-1]
            for row in [r for r in rows if r in jobs]:
                for tag, b in order:
                    v = jobs[row](b)
                    res.setdefault(row, {"old": [], "new": []})[tag].append(v)
                    print(f"pass {p + 1} {row} {tag}: {v:.1f}", file=sys.stderr)
        if "lbs-steady" in rows:
            for row, (old, new) in lbs_steady(a.old, a.new, a.passes).items():
                res[row] = {"old": old, "new": new}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| row | unit | old (median of {a.passes}) | new | new / old | runs old | runs new |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    table = {}
    for row, v in res.items():
        mo, mn = statistics.median(v["old"]), statistics.median(v["new"])
        table[row] = dict(v, median_old=mo, median_new=mn, ratio=mn / mo)
        runs = lambda xs: " / ".join(f"{x:.0f}" for x in xs)
        print(f"| {row} | {UNITS[row]} | {mo:.0f} | {mn:.0f} | **{mn / mo:.3f}** | {runs(v['old'])} | {runs(v['new'])} |")
    out = a.out or os.path.join(ROOT, "bench", "results",
                                time.strftime("ab-%Y%m%d-%H%M.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"old": a.old, "new": a.new, "passes": a.passes, "results": table}, f, indent=1)


if __name__ == "__main__":
    main()
