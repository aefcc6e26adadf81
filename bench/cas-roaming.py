#!/usr/bin/env python3
"""Machine Bank Figure 8 conditions in one run (issue: roaming).

One content-addressed image, four ways to run it, two workloads:

  conditions  local raw    the disk as a plain file (`roamdisk serve raw:`)
              remote       a session over the HTTP chunk server, no shared cache
              empty        a session over the HTTP chunk server, empty shared cache
              primed       a session whose host's shared cache already holds
                           every chunk (filled by another session before)
  workloads   boot         `roamdisk replay` of a boot-like trace (trace synth
                           boot --clients 1: 4,049 requests, 75% sequential,
                           ~105 MiB read over an 8.5 GB disk)
              fio          4 KiB random reads, queue depth 32, --runtime seconds,
                           over the first --fio-span of the disk (IOPS)

The image is sparse: random bytes in the first --fio-span and wherever the
boot trace reads, holes elsewhere, so every read lands on data. The chunk server can be slowed down with
--limit / --latency (the seed's lab is 100 Mbit/s). Each condition runs
--runs times, interleaved; the table gives medians and each condition's ratio
to local raw. Target (issue): primed >= 0.9x local raw on both workloads.

Usage: bench/cas-roaming.py [--runs 3] [--limit 100Mbit --latency 1ms]
Needs: fio, a release build (cargo build --release -p roamdisk).
"""
import argparse, json, os, random, shutil, statistics, subprocess, sys, tempfile, time

from roamdisk_bench import B, boot_trace, run, serve, stop, store_serve, parse_size


def boot(sock, trace):
    out = run(B, "replay", trace, f"nbd+unix:///?socket={sock}", "--json")
    return json.loads(out)["wall_s"]


def fio(sock, size, runtime):
    out = run("fio", "--name=r", "--ioengine=nbd", f"--uri=nbd+unix:///?socket={sock}",
              "--rw=randread", "--bs=4k", "--iodepth=32", f"--size={size}",
              f"--runtime={runtime}", "--time_based", "--output-format=json")
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return j["iops"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", default=None, help="chunk server bandwidth, e.g. 100Mbit")
    ap.add_argument("--latency", default=None, help="chunk server latency, e.g. 1ms")
    ap.add_argument("--runtime", type=int, default=10, help="fio: seconds per run")
    ap.add_argument("--fio-span", default="512M", help="fio: the random data at the start of the disk it reads")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--conditions", default="local raw,remote,empty,primed",
                    help="comma-separated subset of the conditions to run")
    ap.add_argument("--workloads", default="boot,fio", help="comma-separated: boot, fio")
    a = ap.parse_args()
    conds = [c.strip() for c in a.conditions.split(",")]
    works = [w.strip() for w in a.workloads.split(",")]
    for c in conds:
        if c not in ("local raw", "remote", "empty", "primed"):
            ap.error(f"unknown condition {c!r}")
    for w in works:
        if w not in ("boot", "fio"):
            ap.error(f"unknown workload {w!r}")
    if "local raw" not in conds:
        ap.error("the conditions must include 'local raw' (every ratio is to it)")
    d = a.dir or tempfile.mkdtemp(prefix="roamdisk-roaming-", dir="/var/tmp")
    os.makedirs(d, exist_ok=True)
    trace = os.path.join(d, "boot.rdtrace")
    reads = [(off, ln) for _, off, ln in boot_trace(trace)]
    size = max(o + l for o, l in reads)
    size = (size + (1 << 20) - 1) // (1 << 20) << 20
    img = os.path.join(d, "disk.img")
    rng = random.Random(1)
    fio_span = parse_size(a.fio_span)
    with open(img, "wb") as f:
        f.truncate(size)
        for off in range(0, fio_span, 1 << 20):
            f.seek(off)
            f.write(rng.randbytes(1 << 20))
        for off, ln in sorted(set(reads)):
            # Whole 64 KiB chunks of data around every request.
            a0, a1 = off // 65536 * 65536, (off + ln + 65535) // 65536 * 65536
            f.seek(a0)
            f.write(rng.randbytes(a1 - a0))
    store = os.path.join(d, "store")
    run(B, "-q", "store", "init", store)
    run(B, "-q", "commit", img, "--to", "bench/vm", "--store", store)
    srv, url = store_serve(store, a.limit, a.latency)
    env = dict(os.environ)
    n = [0]

    def session(shared):
        n[0] += 1
        s = os.path.join(d, f"s{n[0]}")
        run(B, "-q", "checkout", "bench/vm", "--session", s, "--store", url)
        opt = "shared-cache=off" if shared is None else f"shared-cache={shared}"
        return f"cas[{opt}]:{s}"

    primed_cache = os.path.join(d, "primed-cache")
    sock = os.path.join(d, "prime.sock")
    p = serve(session(primed_cache), sock)
    subprocess.run(["nbdcopy", f"nbd+unix:///?socket={sock}", "null:"], check=True)
    stop(p)
    time.sleep(1)

    res = {(c, w): [] for c in conds for w in works}
    for r in range(a.runs):
        for w in works:
            for c in conds:
                if c == "local raw":
                    spec = f"raw:{img}"
                elif c == "remote":
                    spec = session(None)
                elif c == "empty":
                    spec = session(os.path.join(d, f"empty-cache-{r}-{w}"))
                else:
                    spec = session(primed_cache)
                sock = os.path.join(d, "c.sock")
                p = serve(spec, sock, env)
                try:
                    if w == "boot":
                        res[(c, w)].append(boot(sock, trace))
                    else:
                        res[(c, w)].append(fio(sock, fio_span, a.runtime))
                finally:
                    stop(p)
                unit = "s" if w == "boot" else "IOPS"
                print(f"run {r + 1}: {w:4} {c:9} {res[(c, w)][-1]:.3f} {unit}", file=sys.stderr)
    srv.terminate()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {os.cpu_count()} cores, load {' '.join(load)}, chunk server limit {a.limit or 'none'}, "
          f"latency {a.latency or 'none'}, median of {a.runs} interleaved runs")
    print(f"| condition | boot replay (s) | speed of local raw | fio 4K randread QD32, {a.runtime} s (IOPS) | of local raw |")
    print("| --- | ---: | ---: | ---: | ---: |")
    med = {k: statistics.median(v) for k, v in res.items()}
    nan = float("nan")
    for c in conds:
        mb, mf = med.get((c, "boot"), nan), med.get((c, "fio"), nan)
        rb = med.get(("local raw", "boot"), nan) / mb
        rf = mf / med.get(("local raw", "fio"), nan)
        print(f"| {c} | {mb:.3f} | {rb:.2f}x | {mf:.0f} | {rf:.2f}x |")
    if not a.dir:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
