#!/usr/bin/env python3
"""Cost at scale (issue 25): time and peak memory of every content-addressed
operation against the size of the disk, with the slope of each.

For each --sizes (GiB) a sparse disk with a realistic mix is made — per MiB,
25% random data, 15% one repeated MiB (deduplicated), 60% holes — and, in a
fresh store and shared cache:

  commit        roamdisk commit DISK --to bench/vm (a new image)
  commit again  the same disk once more (every chunk already stored)
  log           roamdisk log bench/vm
  checkout      roamdisk checkout bench/vm --output FILE (a raw file)
  dd            dd writes as many bytes as the checkout did, and syncs them
                (conv=fsync): the device's own cost, against which the
                checkout is given as a ratio ("checkout / dd")
  session open  roamdisk info cas[shared-cache=off]:SESSION (after checkout --session)
  hoard         roamdisk hoard bench/vm (every chunk into the shared cache)
  cache status  roamdisk cache status (the cache the hoard filled)
  verify        roamdisk store verify
  gc            roamdisk gc (nothing to collect: the mark and the sweep's listing)

Each is timed once per size and run (--runs, default 1; medians) with /usr/bin/time (wall seconds, peak RSS), after
a sync (nothing the step before wrote is still to be written). The
table gives seconds and MB per GiB of disk, the ratio of the largest size's
per-GiB cost to the smallest's (the issue's bar: within 1.25x), and the
log-log slope of time against size (1.0 = linear). --plot PREFIX writes
PREFIX.svg: seconds per GiB against disk size, one line per operation.

--chunk-size 4K makes stores of many small chunks (16 GiB of this mix: ~1.05 M
chunks stored); --skip hoard leaves out the hoard and cache status (the shared
cache keeps one file per chunk).

--drop-caches empties the page cache before each operation: past the machine's
memory (24 GiB here) a size's data no longer stays cached from the step before,
so without it the largest sizes alone pay for the device.

Usage: bench/scale.py [--sizes 1,2,4] [--runs 3] [--chunk-size 64K] [--skip OP,...] [--drop-caches] [--dir D] [--plot docs/img/scale]
Needs: a release build; about 0.7 GB of free disk per GiB of --sizes at the
largest size (image, store, one checkout at a time; files removed as it goes).
"""
import argparse, json, math, os, random, shutil, statistics, subprocess, sys, tempfile, time

from roamdisk_bench import B, run, save_results

OPS = ["commit", "commit again", "log", "checkout", "dd", "session open", "hoard",
       "cache status", "verify", "gc"]


def make_disk(path, gib, seed=1):
    rng = random.Random(seed)
    repeated = rng.randbytes(1 << 20)
    with open(path, "wb") as f:
        f.truncate(gib << 30)
        for mib in range(gib << 10):
            r = rng.random()
            if r < 0.25:
                f.seek(mib << 20)
                f.write(os.urandom(1 << 20))
            elif r < 0.40:
                f.seek(mib << 20)
                f.write(repeated)


DROP_CACHES = False


def timed(tmp, *args, cmd=None):
    """Run roamdisk ARGS (or the command CMD) under /usr/bin/time: (wall
    seconds, peak RSS MB). With --drop-caches, the page cache is emptied
    first (written data synced): every size then starts from the device,
    not from memory."""
    out = os.path.join(tmp, "time.out")
    subprocess.run(["sync"], check=True)
    if DROP_CACHES:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    subprocess.run(["/usr/bin/time", "-o", out, "-f", "%e %M", *(cmd or [B, "-q", *args])],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s, kb = open(out).read().split()[-2:]
    return float(s), int(kb) / 1024


def measure(d, gib, chunk_size, skip):
    disk = os.path.join(d, "disk.img")
    make_disk(disk, gib)
    store, cache = os.path.join(d, "store"), os.path.join(d, "cache")
    run(B, "-q", "store", "init", store)
    res = {}
    commit = ["commit", disk, "--to", "bench/vm", "--store", store, "--chunk-size", chunk_size]
    res["commit"] = timed(d, *commit)
    res["commit again"] = timed(d, *commit)
    os.unlink(disk)
    res["log"] = timed(d, "log", "bench/vm", "--store", store)
    out = os.path.join(d, "out.raw")
    res["checkout"] = timed(d, "checkout", "bench/vm", "--store", store, "--output", out)
    written = os.stat(out).st_blocks * 512
    os.unlink(out)
    # The device's own cost for the bytes the checkout wrote: dd writes as
    # many from /dev/zero and syncs them (the checkout syncs too).
    res["dd"] = timed(d, cmd=["dd", "if=/dev/zero", f"of={out}", "bs=1M", "conv=fsync",
                              f"count={-(-written // (1 << 20))}", "status=none"])
    os.unlink(out)
    sess = os.path.join(d, "sess")
    run(B, "-q", "checkout", "bench/vm", "--session", sess, "--store", store)
    res["session open"] = timed(d, "info", f"cas[shared-cache=off]:{sess}")
    shutil.rmtree(sess)
    res["verify"] = timed(d, "store", "verify", "--store", store)
    res["gc"] = timed(d, "gc", "--store", store)
    if "hoard" in skip:
        shutil.rmtree(store)
        return res
    # A cap the whole disk fits under (chunks are counted at 64 KiB).
    os.makedirs(cache)
    with open(os.path.join(cache, "cache.toml"), "w") as f:
        f.write('magic = "roamdisk-shared-cache"\nversion = 2\n'
                f"size = {(gib + 1) << 30}\nunit = 65536\npolicy = \"lru\"\n")
    # ext4 does not reuse inodes freed in the last 30 s: a hoard (a file
    # per chunk) right after the previous size's files were removed spends
    # its time scanning the inode bitmap (`recently_deleted`, 83% of a
    # 256 MiB hoard's samples; 2.2-4 s against 0.62 s). Let them age.
    time.sleep(31)
    res["hoard"] = timed(d, "hoard", "bench/vm", "--store", store, "--shared-cache", cache)
    res["cache status"] = timed(d, "cache", "status", "--shared-cache", cache)
    shutil.rmtree(cache)
    shutil.rmtree(store)
    return res


def slope(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-3)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float("nan")


def svg(path, sizes, per_gib):
    """Seconds per GiB against GiB (log x), one polyline per operation."""
    w, h, m = 760, 420, 60
    top = max(v for vs in per_gib.values() for v in vs) * 1.1 or 1
    lo, hi = math.log(min(sizes)), math.log(max(sizes))
    x = lambda s: m + (math.log(s) - lo) / ((hi - lo) or 1) * (w - 2 * m - 150)
    y = lambda v: h - m - v / top * (h - 2 * m)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
              "#e377c2", "#7f7f7f", "#bcbd22"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2 - 150}" y="20" font-size="14">Seconds per GiB of disk against disk size (flat = linear)</text>',
         f'<line x1="{m}" y1="{h - m}" x2="{w - m - 150}" y2="{h - m}" stroke="black"/>',
         f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
         f'<text x="{(w - 150) / 2}" y="{h - 15}">disk size (GiB, log scale)</text>']
    for s in sizes:
        o.append(f'<text x="{x(s) - 5}" y="{h - m + 18}">{s}</text>')
    for k in range(5):
        v = top * k / 4
        o.append(f'<text x="5" y="{y(v) + 4}">{v:.2f}</text>')
    for i, (op, vs) in enumerate(per_gib.items()):
        c = colors[i % len(colors)]
        pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(sizes, vs))
        o.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{w - m - 140}" y="{m + 16 * i}" fill="{c}">{op}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o))
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,2,4", help="disk sizes in GiB, comma-separated")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--chunk-size", default="64K", help="chunk size of the commits (default 64K)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="empty the page cache before each operation (root; sizes past the memory otherwise pay for the device alone)")
    ap.add_argument("--skip", default="", help="operations to leave out: hoard (and cache status)")
    ap.add_argument("--runs", type=int, default=1,
                    help="measure every size this many times (sizes interleaved) and give medians")
    ap.add_argument("--plot", default=None, help="write PREFIX.svg")
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/scale-DATE.json)")
    a = ap.parse_args()
    global DROP_CACHES
    DROP_CACHES = a.drop_caches
    sizes = [int(s) for s in a.sizes.split(",")]
    base = a.dir or tempfile.mkdtemp(prefix="roamdisk-scale-", dir="/var/tmp")
    runs = {gib: [] for gib in sizes}
    for r in range(a.runs):
        for gib in sizes:
            d = os.path.join(base, f"{gib}g")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            runs[gib].append(measure(d, gib, a.chunk_size, a.skip.split(",")))
            shutil.rmtree(d, ignore_errors=True)
            print(f"run {r + 1}, {gib} GiB: " + ", ".join(f"{op} {t:.2f} s" for op, (t, _) in runs[gib][-1].items()),
                  file=sys.stderr)
    # Per operation and size: the median time, the largest peak RSS.
    res = {gib: {op: (statistics.median(m[op][0] for m in ms), max(m[op][1] for m in ms))
                 for op in ms[0]} for gib, ms in runs.items()}
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {os.cpu_count()} cores, load {' '.join(load)}; median of {a.runs} run(s) per size, sizes interleaved")
    head = " | ".join(f"{g} GiB s (s/GiB, MB)" for g in sizes)
    print(f"| operation | {head} | largest / smallest per GiB | slope |")
    print("| --- |" + " ---: |" * (len(sizes) + 2))
    per_gib = {}
    ops = [op for op in OPS if op in res[sizes[0]]]
    for op in ops:
        ts = [res[g][op][0] for g in sizes]
        per_gib[op] = [t / g for t, g in zip(ts, sizes)]
        cells = " | ".join(f"{res[g][op][0]:.2f} ({res[g][op][0] / g:.3f}, {res[g][op][1]:.0f})" for g in sizes)
        ratio = per_gib[op][-1] / per_gib[op][0] if per_gib[op][0] > 0 else float("nan")
        print(f"| {op} | {cells} | {ratio:.2f}x | {slope(sizes, ts):.2f} |")
        if op == "dd":
            # The checkout's cost over the device's for the same bytes.
            over = [res[g]["checkout"][0] / max(res[g]["dd"][0], 1e-3) for g in sizes]
            cells = " | ".join(f"{o:.2f}" for o in over)
            print(f"| checkout / dd | {cells} | {over[-1] / over[0]:.2f}x | — |")
    if a.plot:
        svg(a.plot + ".svg", sizes, per_gib)
    save_results(a.out, "scale", {"sizes_gib": sizes, "chunk_size": a.chunk_size, "drop_caches": a.drop_caches,
                                  "runs": a.runs,
                                  "results": {str(g): {op: {"s": t, "rss_mb": m} for op, (t, m) in r.items()}
                                              for g, r in res.items()},
                                  "each_run": {str(g): [{op: {"s": t, "rss_mb": m} for op, (t, m) in r.items()}
                                                        for r in ms] for g, ms in runs.items()}})
    if not a.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
