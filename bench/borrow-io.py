#!/usr/bin/env python3
"""Guest I/O speed on a borrowed disk vs the host disk itself.

The seed (TransPart) reports near-host-disk speed for the guest once the
transient disk is allocated. Here the same NBD server serves, side by side
in one run: the host image file itself (raw:), a borrowed disk over the
same kind of image (borrow:, encrypted, the default), the borrowed disk
without encryption, and qemu-nbd on the raw image for reference. fio's nbd
engine drives each over a Unix socket; the first 2 GiB are written
sequentially before the read tests (a borrowed disk reads unwritten blocks
as zeroes without I/O, which would flatter it).

Usage: bench/borrow-io.py [--runtime S] [--size 2G] [--workdir DIR]
Environment: ROAMDISK (default target/release/roamdisk).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("ROAMDISK", os.path.join(ROOT, "target/release/roamdisk"))

TESTS = [
    ("seqwrite-1m", "1 MiB sequential write, QD 8", "MB/s", dict(rw="write", bs="1m", iodepth=8)),
    ("seqread-1m", "1 MiB sequential read, QD 8", "MB/s", dict(rw="read", bs="1m", iodepth=8)),
    ("randwrite-qd32", "4 KiB random write, QD 32", "IOPS", dict(rw="randwrite", bs="4k", iodepth=32)),
    ("randread-qd32", "4 KiB random read, QD 32", "IOPS", dict(rw="randread", bs="4k", iodepth=32)),
    ("randread-qd1", "4 KiB random read, QD 1", "IOPS", dict(rw="randread", bs="4k", iodepth=1)),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def wait_socket(sock, proc):
    for _ in range(400):
        if os.path.exists(sock):
            try:
                run(["nbdinfo", "--size", f"nbd+unix:///?socket={sock}"])
                return
            except subprocess.CalledProcessError:
                pass
        if proc.poll() is not None:
            sys.exit(f"server exited: {proc.stderr.read()}")
        time.sleep(0.05)
    sys.exit("server did not start")


def fio(uri, size, runtime, p):
    out = run(["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--size={size}",
               f"--runtime={runtime}", "--time_based", "--output-format=json",
               f"--rw={p['rw']}", f"--bs={p['bs']}", f"--iodepth={p['iodepth']}",
               "--randrepeat=0"])
    # fio's nbd engine prints a line before the JSON.
    j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = j["write"] if "write" in p["rw"] else j["read"]
    return side["iops"], side["bw_bytes"] / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--workdir")
    a = ap.parse_args()
    for t in ("fio", "nbdinfo", "mke2fs"):
        if not shutil.which(t):
            sys.exit(f"{t} is required (scripts/test installs it)")
    tmp = a.workdir or tempfile.mkdtemp(prefix="borrow-io-")
    os.makedirs(tmp, exist_ok=True)
    host = os.path.join(tmp, "host.img")
    plain = os.path.join(tmp, "plain.img")
    for p in (host, plain):
        if os.path.exists(p):
            os.unlink(p)
        run(["truncate", "-s", "8G", p])
    run(["mke2fs", "-q", "-F", "-t", "ext4", host])
    plan = os.path.join(tmp, "host.plan")
    run([BIN, "-q", "borrow", "scan", host, "--plan", plan])
    targets = [
        ("roamdisk raw:", [BIN, "serve", f"raw:{plain}"]),
        ("roamdisk borrow: (XTS)", [BIN, "serve", f"borrow:{plan}"]),
        ("roamdisk borrow[encrypt=off]:", [BIN, "serve", f"borrow[encrypt=off]:{plan}"]),
    ]
    results = {}
    for label, cmd in targets:
        sock = os.path.join(tmp, "s.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        full = cmd + ["--socket", sock]
        proc = subprocess.Popen(full, stderr=subprocess.PIPE, text=True)
        try:
            wait_socket(sock, proc)
            uri = f"nbd+unix:///?socket={sock}"
            results[label] = {}
            for tid, _, unit, p in TESTS:
                iops, mbs = fio(uri, a.size, a.runtime, p)
                results[label][tid] = mbs if unit == "MB/s" else iops
        finally:
            proc.terminate()
            proc.wait()
    labels = [t[0] for t in targets]
    print(f"{'test':<32}" + "".join(f"{l:>30}" for l in labels))
    for tid, name, unit, _ in TESTS:
        print(f"{name + ' (' + unit + ')':<32}" + "".join(f"{results[l][tid]:>30.0f}" for l in labels))
    if not a.workdir:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
