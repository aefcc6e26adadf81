#!/usr/bin/env python3
"""Writes with flushes into a new session against the same image as a raw file.

A guest that flushes often (a database, a journaling file system, the boot
replay's 49 flushes) pays for every flush; a session's flush is one record
appended to its write-ahead log and synced (docs/formats/cas-session.md),
a raw file's is one fdatasync. Three fio jobs over NBD, each run on a new
session (checked out from a local store, shared cache off) and on a copy of
the image as a raw file made for that run (so neither has its blocks
allocated by an earlier run), interleaved, medians of --runs:

  randwrite4k-fsync1     4 KiB random writes, QD 1, a flush after each (--runtime s)
  randwrite4k-qd16-f32   4 KiB random writes, QD 16, a flush every 32 (--runtime s)
  seqwrite1M-f16         1 MiB sequential writes, QD 4, a flush every 16, 256 MiB

--base-bin BIN adds the session under another build (before/after a change).

Usage: bench/cas-session-flush.py [--runs 5] [--runtime 4] [--jobs a,b] [--base-bin /path/to/roamdisk]
Needs: fio, a release build (cargo build --release -p roamdisk).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

import roamdisk_bench
from roamdisk_bench import B, run, serve, stop

JOBS = {
    "randwrite4k-fsync1": ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1", "--time_based"],
    "randwrite4k-qd16-f32": ["--rw=randwrite", "--bs=4k", "--iodepth=16", "--fsync=32", "--time_based"],
    "seqwrite1M-f16": ["--rw=write", "--bs=1M", "--iodepth=4", "--fsync=16"],
}


def fio(sock, args, runtime, size):
    out = run("fio", "--name=w", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
              f"--size={size}", f"--runtime={runtime}", "--output-format=json", *args)
    return json.loads(out[out.index("{"):])["jobs"][0]["write"]["bw_bytes"] / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=4)
    ap.add_argument("--base-bin", default=None, help="also run the session under this roamdisk build")
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated subset of the jobs")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    jobs = {j: JOBS[j] for j in a.jobs.split(",")}
    d = a.dir or tempfile.mkdtemp(prefix="roamdisk-flush-", dir="/var/tmp")
    os.makedirs(d, exist_ok=True)
    img = os.path.join(d, "disk.img")
    size = 1 << 30
    with open(img, "wb") as f:
        f.truncate(size)
        f.write(os.urandom(64 << 20))
    store = os.path.join(d, "store")
    run(B, "-q", "store", "init", store)
    run(B, "-q", "commit", img, "--to", "bench/vm", "--store", store)
    conds = ["raw", "session"] + (["session (base)"] if a.base_bin else [])
    res = {(c, j): [] for c in conds for j in jobs}
    sock = os.path.join(d, "s.sock")
    n = 0
    for r in range(a.runs):
        for j, args in jobs.items():
            for c in conds:
                n += 1
                env = dict(os.environ)
                if c == "raw":
                    copy = os.path.join(d, "copy.img")
                    subprocess.run(["cp", "--sparse=always", img, copy], check=True)
                    spec = f"raw:{copy}"
                else:
                    s = os.path.join(d, f"s{n}")
                    run(B, "-q", "checkout", "bench/vm", "--session", s, "--store", store)
                    spec = f"cas[shared-cache=off]:{s}"
                # serve() starts roamdisk_bench.B: the build under test for this condition.
                roamdisk_bench.B = a.base_bin if c == "session (base)" else B
                p = serve(spec, sock, env)
                try:
                    res[(c, j)].append(fio(sock, args, a.runtime, "256M" if "seq" in j else "512M"))
                finally:
                    stop(p)
                    roamdisk_bench.B = B
                if c != "raw":
                    shutil.rmtree(s)
                print(f"run {r + 1}: {j:22} {c:15} {res[(c, j)][-1]:8.1f} MB/s", file=sys.stderr)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {os.cpu_count()} cores, load {' '.join(load)}, medians of {a.runs} interleaved runs (MB/s)")
    print("| job | " + " | ".join(conds) + " | session / raw" + (" | session / base" if a.base_bin else "") + " |")
    print("| --- |" + " ---: |" * (len(conds) + 1 + bool(a.base_bin)))
    for j in jobs:
        m = {c: statistics.median(res[(c, j)]) for c in conds}
        row = f"| {j} | " + " | ".join(f"{m[c]:.1f}" for c in conds) + f" | {m['session'] / m['raw']:.2f}x"
        if a.base_bin:
            row += f" | {m['session'] / m['session (base)']:.2f}x"
        print(row + " |")
    if not a.dir:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
