#!/usr/bin/env python3
"""Sequential reads of a session over a slow link: batch gets and read-ahead (issue 12, "Fetch").

One content-addressed image of random data (--size, default 128 MiB: 2,048 chunks of 64 KiB),
served by `roamdisk store serve --limit RATE --latency DELAY` (default 100Mbit, 8ms), read whole
through a fresh session (`cas[shared-cache=off]`, so every chunk crosses the link) by two readers:

  sync64k   `nbdcopy --synchronous --request-size=65536 --connections=1 URI null:` — one 64 KiB
            request at a time, in order: a guest copying a file
  nbdcopy   `nbdcopy URI null:` with its defaults (several connections, many 256 KiB requests
            in flight)

under four conditions: batch gets on or off (off: the chunk server runs with the hidden
`--no-batch-get`, standing in for a server from before them; the client then fetches object by
object) x read-ahead on or off (`readahead=off`). Runs are interleaved; the table gives medians
of --runs, MB/s, and the requests for objects the chunk server answered (its -vv access log:
GETs of one object plus batch gets) per run.

Usage: bench/cas-fetch.py [--runs 3] [--size 128M] [--limit 100Mbit] [--latency 8ms]
Needs: nbdcopy, a release build (cargo build --release -p roamdisk).
"""
import argparse, os, re, shutil, statistics, subprocess, sys, tempfile, time

from roamdisk_bench import B, run, serve, stop, parse_size


def chunk_server(store, log, limit, latency, batch):
    """`roamdisk -vv store serve` on a free loopback port, its log in LOG; returns (process, URL)."""
    args = [B, "-vv", "store", "serve", store, "--listen", "127.0.0.1:0",
            "--limit", limit, "--latency", latency]
    if not batch:
        args.append("--no-batch-get")
    f = open(log, "w")
    p = subprocess.Popen(args, stderr=f)
    for _ in range(400):
        m = re.search(r"(http://[0-9.:]+) ", open(log).read())
        if m:
            return p, m.group(1)
        time.sleep(0.05)
    raise SystemExit(f"store server for {store} did not start")


def object_requests(log):
    """Requests for objects the server answered: GETs of one object, batch gets."""
    n = 0
    for line in open(log):
        if "request served" in line and ("path=/v1/objects/get " in line or
                                         re.search(r"method=GET path=/v1/objects/[0-9a-f]{64}", line)):
            n += 1
    return n


READERS = {
    "sync64k": ["nbdcopy", "--synchronous", "--request-size=65536", "--connections=1"],
    "nbdcopy": ["nbdcopy"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="128M")
    ap.add_argument("--limit", default="100Mbit")
    ap.add_argument("--latency", default="8ms")
    ap.add_argument("--readers", default="sync64k,nbdcopy")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    readers = [r.strip() for r in a.readers.split(",")]
    size = parse_size(a.size)
    d = a.dir or tempfile.mkdtemp(prefix="roamdisk-fetch-", dir="/var/tmp")
    os.makedirs(d, exist_ok=True)
    img = os.path.join(d, "disk.img")
    with open(img, "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    store = os.path.join(d, "store")
    run(B, "-q", "store", "init", store)
    run(B, "-q", "commit", img, "--to", "bench/vm", "--store", store)
    os.unlink(img)
    conds = [(batch, ra) for batch in (True, False) for ra in (True, False)]
    name = {c: f"batch {'on' if c[0] else 'off'}, read-ahead {'on' if c[1] else 'off'}" for c in conds}
    res = {(c, r): [] for c in conds for r in readers}
    reqs = {(c, r): [] for c in conds for r in readers}
    n = 0
    for i in range(a.runs):
        for r in readers:
            for c in conds:
                batch, ra = c
                log = os.path.join(d, "store.log")
                srv, url = chunk_server(store, log, a.limit, a.latency, batch)
                n += 1
                s = os.path.join(d, f"s{n}")
                run(B, "-q", "checkout", "bench/vm", "--session", s, "--store", url)
                before = object_requests(log)
                opt = "shared-cache=off" + ("" if ra else ",readahead=off")
                sock = os.path.join(d, "c.sock")
                p = serve(f"cas[{opt}]:{s}", sock)
                try:
                    t0 = time.monotonic()
                    subprocess.run(READERS[r] + [f"nbd+unix:///?socket={sock}", "null:"], check=True)
                    took = time.monotonic() - t0
                finally:
                    stop(p)
                srv.terminate()
                srv.wait()
                res[(c, r)].append(took)
                reqs[(c, r)].append(object_requests(log) - before)
                shutil.rmtree(s)
                print(f"run {i + 1}: {r:8} {name[c]:28} {took:6.2f} s  {reqs[(c, r)][-1]} requests",
                      file=sys.stderr)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {os.cpu_count()} cores, load {' '.join(load)}; {size >> 20} MiB ({size >> 16} chunks) "
          f"over store serve --limit {a.limit} --latency {a.latency}; median of {a.runs} interleaved runs")
    print("| reader | condition | seconds | MB/s | requests for objects | all runs (s) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in readers:
        for c in conds:
            m = statistics.median(res[(c, r)])
            q = statistics.median(reqs[(c, r)])
            runs = " ".join(f"{x:.2f}" for x in res[(c, r)])
            print(f"| {r} | {name[c]} | {m:.2f} | {size / m / 1e6:.1f} | {q:.0f} | {runs} |")
    if not a.dir:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
