#!/usr/bin/env python3
"""The server cache's miss path with many clients (issue 13).

`roamdisk server CONFIG` with and without its `[cache]` (FMPQ, smaller
than the data), and with and without its `metrics` endpoint (which meters
every client's requests), in the same run: 50 clients (`roamdisk replay
--per client` of a 50-client CSV trace, one NBD connection each, over the
Unix socket, a read-only grant) each read their own disjoint region of
the golden image once, in 4 KiB reads in shuffled order. No block is read
twice, so every cache access is a miss: this measures what the cache (and
the metering) cost when they cannot help.

The golden image is a file of data (not sparse: a hole is answered
without reading), held in the page cache after the first round: the
cheapest image to read, so the cache's own cost shows as much as it can.
Configurations are interleaved, their order rotated from round to round;
the table shows the medians of requests/s, the ratios, and the server's
CPU time (user + system) per request. Only the Python standard library is
used. See docs/BENCHMARKS.md, "Server cache (issue 13)".
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from roamdisk_bench import ROOT, cpu_seconds, free_port, save_results, stop, wait_unix_listening, parse_size


def write_image(path, size):
    """A file of non-zero bytes (every block allocated)."""
    block = bytes(range(1, 256)) * (1 << 12)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def write_trace(path, clients, region, bs, seed):
    """Client c reads [c * region, (c + 1) * region) once, in shuffled bs reads."""
    r = random.Random(seed)
    with open(path, "w") as f:
        f.write("time_ns,client,device,op,offset,len,fragment\n")
        t = 0
        for c in range(clients):
            blocks = list(range(region // bs))
            r.shuffle(blocks)
            for b in blocks:
                t += 1
                f.write(f"{t},{c},0,read,{c * region + b * bs},{bs},0\n")


def config(path, img, sock, cache, metrics_port):
    lines = ['format = "roamdisk-server"', "version = 1", 'state = "state"',
             f'socket = "{sock}"']
    if metrics_port:
        lines.append(f'metrics = "127.0.0.1:{metrics_port}"')
    if cache:
        lines += ["[cache]", f'policy = "{cache[0]}"', f'size = "{cache[1]}"']
    lines += ["[[image]]", 'name = "golden"', f'stack = "raw:{img}"',
              "[[client]]", 'name = "lab"', f"uid = {os.getuid()}", 'read-only = ["golden"]']
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def start(binpath, cfg, sock, log):
    proc = subprocess.Popen([binpath, "server", cfg, "-q"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=log)
    wait_unix_listening(proc, sock, f"server-miss-path: the server ({cfg})")
    return proc


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "roamdisk"))
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--region", default="8M", help="bytes each client reads (default 8M)")
    ap.add_argument("--bs", default="4K", help="request size (default 4K)")
    ap.add_argument("--policy", default="fmpq")
    ap.add_argument("--cache", default="64M", help="cache size, below the data (default 64M)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="JSON results (default bench/results/server-miss-path-DATE.json)")
    a = ap.parse_args()

    region, bs = parse_size(a.region), parse_size(a.bs)
    data = a.clients * region
    assert parse_size(a.cache) < data, "the cache must be smaller than the data"
    tmp = tempfile.mkdtemp(prefix="server-miss-")
    img = os.path.join(tmp, "golden.img")
    write_image(img, data)
    trace = os.path.join(tmp, "clients.csv")
    write_trace(trace, a.clients, region, bs, 1)
    sock = os.path.join(tmp, "s.sock")
    cache = (a.policy, a.cache)
    configs = [("no cache", None, False), (f"cache {a.policy}", cache, False),
               ("no cache, metrics", None, True), (f"cache {a.policy}, metrics", cache, True)]
    rps = {c[0]: [] for c in configs}
    cpu = {c[0]: [] for c in configs}
    hits = {}
    log = open(os.path.join(tmp, "server.log"), "w")
    try:
        for rnd in range(a.rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for name, c, metrics in order:
                port = free_port() if metrics else None
                cfg = os.path.join(tmp, "server.toml")
                config(cfg, img, sock, c, port)
                proc = start(a.bin, cfg, sock, log)
                try:
                    cpu0 = cpu_seconds(proc.pid)
                    out = subprocess.run(
                        [a.bin, "replay", trace, f"nbd+unix:///golden?socket={sock}",
                         "--per", "client", "--json", "-q"],
                        check=True, text=True, capture_output=True).stdout
                    r = json.loads(out)
                    assert r["errors"] == 0 and r["requests"] == data // bs, r
                    rps[name].append(r["requests_per_s"])
                    cpu[name].append((cpu_seconds(proc.pid) - cpu0) / r["requests"] * 1e6)
                    if metrics and c:
                        st = json.loads(subprocess.run(
                            [a.bin, "server", "status", cfg, "--json"],
                            check=True, text=True, capture_output=True).stdout)
                        hits[name] = hits.get(name, 0) + st["cache"]["hits"]
                finally:
                    stop(proc, 40)
                print(f"round {rnd + 1} {name}: {rps[name][-1]:.0f} requests/s", file=sys.stderr)
    finally:
        log.close()
        for root, dirs, files in os.walk(tmp, topdown=False):
            for f in files:
                os.unlink(os.path.join(root, f))
            for d in dirs:
                os.rmdir(os.path.join(root, d))
        os.rmdir(tmp)

    med = {k: statistics.median(v) for k, v in rps.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    base = {False: med["no cache"], True: med["no cache, metrics"]}
    print(f"{a.clients} clients x {a.region} each, {a.bs} reads once in shuffled order "
          f"({data >> 20} MiB), cache {a.policy} {a.cache}, {a.rounds} rounds, medians")
    print(f"{'configuration':<26}{'requests/s':>12}{'vs no cache':>13}{'vs metrics off':>16}"
          f"{'CPU us/req':>12}")
    table = {}
    for name, c, metrics in configs:
        vs_cache = med[name] / base[metrics]
        off = name.replace(", metrics", "")
        vs_metrics = med[name] / med[off]
        print(f"{name:<26}{med[name]:>12.0f}{vs_cache:>13.3f}{vs_metrics:>16.3f}{cmed[name]:>12.2f}")
        table[name] = {"runs": rps[name], "median": med[name], "vs_no_cache": vs_cache,
                       "vs_metrics_off": vs_metrics, "cpu_us_per_request": cpu[name],
                       "cpu_median": cmed[name]}
    print("cache hits (no reuse: expect 0): " + ", ".join(f"{k} {v}" for k, v in hits.items()))
    save_results(a.out, "server-miss-path", {"args": vars(a), "results": table, "hits": hits})


if __name__ == "__main__":
    main()
