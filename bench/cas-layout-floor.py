#!/usr/bin/env python3
"""The floor of a chunk store's layout, without hashing or compression: the
same bytes written durably as one file per chunk (what a version 1 local
store did: O_TMPFILE, write, fsync each, link; 256 fan-out folders; groups of
128) against a few pack files (write, one fsync per pack), against
`dd bs=4M conv=fdatasync`. Interleaved rounds, each output removed (and the
file system synced) before the next row, as bench/cas-commit-peers.sh does.
This is the measurement behind the choice of packs (docs/BENCHMARKS.md,
"Roaming (issue 12)"; docs/formats/cas-store.md, version 2).

Usage: bench/cas-layout-floor.py IMAGE DIR [ROUNDS [CHUNK [PACK]]]
       (defaults: 3 rounds, 64 KiB chunks, 64 MiB packs)
"""
import os
import shutil
import subprocess
import sys
import time

img, root = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CH = int(sys.argv[4]) if len(sys.argv) > 4 else 64 << 10
PACK = int(sys.argv[5]) if len(sys.argv) > 5 else 64 << 20
GROUP = 128


def files(src, dst):
    os.makedirs(dst)
    for i in range(256):
        os.mkdir(f"{dst}/{i:02x}")
    dirs = [os.open(f"{dst}/{i:02x}", os.O_RDONLY | os.O_DIRECTORY) for i in range(256)]
    size, off, n, pending = os.fstat(src).st_size, 0, 0, []
    while off < size:
        f = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o644, dir_fd=dirs[n % 256])
        os.write(f, os.pread(src, CH, off))
        pending.append((f, n % 256, n))
        off, n = off + CH, n + 1
        if len(pending) == GROUP or off >= size:
            for f, _, _ in pending:
                os.fsync(f)
            for f, fan, k in pending:
                os.link(f"/proc/self/fd/{f}", f"{k:064x}", dst_dir_fd=dirs[fan])
                os.close(f)
            pending = []
    for d in dirs:
        os.fsync(d)


def packs(src, dst):
    os.makedirs(dst)
    size, off, n = os.fstat(src).st_size, 0, 0
    while off < size:
        f = os.open(f"{dst}/{n:08x}.pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        end = min(size, off + PACK)
        while off < end:
            os.write(f, os.pread(src, CH, off))
            off += CH
        os.fsync(f)
        os.close(f)
        n += 1
    d = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(d)


def dd(src, dst):
    os.makedirs(dst)
    subprocess.run(["dd", f"if={img}", f"of={dst}/copy", "bs=4M", "conv=fdatasync",
                    "status=none"], check=True)


src = os.open(img, os.O_RDONLY)
os.makedirs(root, exist_ok=True)
out = os.path.join(root, "out")
times = {}
for r in range(rounds):
    for name, fn in [("files", files), ("packs", packs), ("dd", dd)]:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync", "-f", root], check=True)
        t0 = time.time()
        fn(src, out)
        subprocess.run(["sync", "-f", root], check=True)
        t = time.time() - t0
        times.setdefault(name, []).append(t)
        print(f"round {r + 1}: {name} {t:.2f} s", file=sys.stderr, flush=True)
shutil.rmtree(out, ignore_errors=True)
print("| layout | median s | all runs (s) |")
print("| --- | ---: | --- |")
for name, ts in times.items():
    print(f"| {name} | {sorted(ts)[len(ts) // 2]:.2f} | {' '.join(f'{t:.2f}' for t in ts)} |")
