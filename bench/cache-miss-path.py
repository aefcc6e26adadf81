#!/usr/bin/env python3
"""The cache layer's miss path (issue 13): 4 KiB random reads with no reuse.

`roamdisk serve raw:IMG` against `roamdisk serve cache:POLICY:SIZE:raw:IMG`
over a Unix socket, fio's nbd engine reading 4 KiB blocks in random order
without repeating one (fio's random map), from an image much larger than
the cache: every read is a miss, so this measures what the cache costs when
it cannot help. The configurations are interleaved, their order rotated
from pass to pass; the table shows medians, the ratio cached/uncached and
the server's CPU time (user + system) per read.

The image is sparse (a hole reads as zeroes without touching the disk):
the cheapest possible NEXT, so the cache's own cost is as visible as it can
be. Only the Python standard library is used. See docs/BENCHMARKS.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

from roamdisk_bench import ROOT, cpu_seconds, save_results, stop, wait_unix_listening


def serve(binpath, spec, sock, log):
    proc = subprocess.Popen([binpath, "serve", spec, "--socket", sock, "-q"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    wait_unix_listening(proc, sock, f"cache-miss-path: {spec}")
    return proc


def fio(sock, iodepth, io_size, seed):
    cmd = ["fio", "--name=miss", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
           "--rw=randread", "--bs=4k", f"--iodepth={iodepth}", f"--io_size={io_size}",
           f"--randseed={seed}", "--output-format=json"]
    out = subprocess.run(cmd, check=True, text=True, capture_output=True).stdout
    read = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return read["iops"], read["total_ios"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "roamdisk"))
    ap.add_argument("--image-size", default="16G", help="sparse image size (default 16G)")
    ap.add_argument("--cache", default="64M", help="cache size (default 64M)")
    ap.add_argument("--policies", default="lru,fmpq", help="cache policies (default lru,fmpq)")
    ap.add_argument("--iodepths", default="1,16", help="fio queue depths (default 1,16)")
    ap.add_argument("--io-size", default="256M", help="bytes read per run (default 256M)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", help="JSON results file (default bench/results/cache-miss-path-DATE.json)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="cache-miss-")
    img = os.path.join(tmp, "img.raw")
    subprocess.run(["truncate", "-s", a.image_size, img], check=True)
    sock = os.path.join(tmp, "s.sock")
    report = os.path.join(tmp, "cache.json")
    configs = [("no cache", f"raw:{img}")] + [
        (f"cache {p}", f"cache[report={report}]:{p}:{a.cache}:raw:{img}")
        for p in a.policies.split(",")]
    depths = [int(d) for d in a.iodepths.split(",")]
    results = {(c, d): [] for c, _ in configs for d in depths}
    cpu = {(c, d): [] for c, _ in configs for d in depths}
    hits = {}
    log = open(os.path.join(tmp, "serve.log"), "w")
    try:
        for ps in range(a.passes):
            order = configs[ps % len(configs):] + configs[:ps % len(configs)]
            for name, spec in order:
                for d in depths:
                    proc = serve(a.bin, spec, sock, log)
                    try:
                        iops, ios = fio(sock, d, a.io_size, 100 + ps)
                        results[(name, d)].append(iops)
                        cpu[(name, d)].append(cpu_seconds(proc.pid) / ios * 1e6)
                    finally:
                        stop(proc, 40)
                    if name != "no cache":
                        with open(report) as f:
                            r = json.load(f)
                        hits[name] = hits.get(name, 0) + r["hits"]
    finally:
        log.close()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)

    print(f"4 KiB random reads, no reuse: {a.io_size} per run from a {a.image_size} sparse image, "
          f"cache {a.cache}, {a.passes} passes, medians (IOPS)")
    print(f"{'configuration':<16}" + "".join(f"{'QD ' + str(d):>12}{'ratio':>8}{'CPU us/op':>11}"
                                            for d in depths))
    table = {}
    for name, _ in configs:
        row = f"{name:<16}"
        for d in depths:
            m = statistics.median(results[(name, d)])
            base = statistics.median(results[("no cache", d)])
            c = statistics.median(cpu[(name, d)])
            row += f"{m:>12.0f}{m / base:>8.3f}{c:>11.2f}"
            table.setdefault(name, {})[f"qd{d}"] = {"runs": results[(name, d)], "median": m,
                                                    "ratio": m / base, "cpu_us_per_op": cpu[(name, d)],
                                                    "cpu_median": c}
        print(row)
    print("cache hits over all runs (no reuse: expect 0): " +
          ", ".join(f"{k} {v}" for k, v in hits.items()))
    save_results(a.out, "cache-miss-path", {"args": vars(a), "results": table, "hits": hits})


if __name__ == "__main__":
    main()
