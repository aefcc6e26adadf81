#!/usr/bin/env python3
"""ISR resume experiment (issue 12; seed: ISR lookaside caching, Figure 7).

How long `roamdisk resume` takes to bring a suspended VM's resume set (its
memory image and the disk chunks its last boot read) onto a new host over a
slow link, with and without a lookaside medium (the folder `roamdisk suspend
--to-media` wrote, as on a USB key).

  setup       a 512 MiB disk (random data in 1-8 MiB extents, 60% of it, and
              in every 64 KiB chunk the boot reads; zeros elsewhere) is
              committed as bench/vm; a session of it replays the reads of
              `trace synth boot --clients 1 --requests N` (offsets folded
              into the disk), which records its working set; `roamdisk
              suspend --memory MEM --to-media right` with a 16 MiB memory
              image (3/4 random, 1/4 zeros). A second image, bench/other,
              made the same way from other random bytes, gives the wrong
              medium; a copy of `right` with one byte flipped in every
              object file (chunks and version package) is the corrupted one.
  link        one `roamdisk store serve --limit RATE --latency 8ms` per rate
              (token bucket, 64 KiB burst; every condition starts idle)
  conditions  none     resume with no lookaside
              right    --lookaside right
              wrong    --lookaside wrong (the other image's resume set)
              corrupt  --lookaside corrupt
  measure     wall time of `roamdisk resume bench/vm --store URL --session
              NEW --shared-cache FRESH --memory-out M --json` (it exits when
              the memory image is written and the working set is on the
              host); bytes per source from its JSON. After every run the
              memory image is compared with the suspended one and the new
              session is served and every boot read is read back over NBD
              and compared with the original disk.
  fixed costs the requests every resume makes over the link whatever the
              media hold (the catalog, the version package twice: see
              docs/BENCHMARKS.md), timed once per rate and run.

Conditions are interleaved (their order rotates every run); rates below
10 Mbit/s run --slow-runs times (1 Mbit/s moves ~30 MB in ~4 min), the
others --runs times. Medians are reported. Targets (issue 12): none/right
>= 26x at 1 Mbit/s (the seed: 317 s / 12 s); wrong and corrupt within 10%
of none; every byte read back correct.

Usage: bench/isr-resume.py [--rates 1Mbit,10Mbit,100Mbit] [--runs 3]
       [--slow-runs 1] [--quick]
Writes bench/results/isr-resume-STAMP.{json,csv,svg}.
Needs: a release build (cargo build --release -p roamdisk).
"""
import argparse, csv, hashlib, json, os, random, shutil, statistics, subprocess, sys, tempfile, time
import urllib.request

from roamdisk_bench import B, ROOT, Nbd, boot_trace, run, serve, stop, store_serve, parse_size

MiB = 1 << 20
CHUNK = 64 << 10
CONDS = ["none", "right", "wrong", "corrupt"]
LABEL = {
    "none": "no lookaside",
    "right": "lookaside: its medium",
    "wrong": "wrong medium",
    "corrupt": "corrupted medium",
}
# The seed's Figure 7 (resume latency, s), as its text gives them: 41 MB
# compressed memory image, lookaside on a USB keychain.
SEED = {1e6: (317, 12), 10e6: (39, 12)}


def rate_bits(s):
    for suffix, mult in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    raise SystemExit(f"rate {s}: give it in kbit, Mbit or Gbit")


def make_disk(path, size, reads, seed):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        off = 0
        while off < size:
            ext = rng.choice([1, 2, 4, 8]) * MiB
            if rng.random() < 0.6:
                f.seek(off)
                f.write(rng.randbytes(min(ext, size - off)))
            off += ext
        for off, ln in sorted(set(reads)):
            a0, a1 = off // CHUNK * CHUNK, (off + ln + CHUNK - 1) // CHUNK * CHUNK
            f.seek(a0)
            f.write(rng.randbytes(a1 - a0))


def make_memory(path, size, seed):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(bytes(MiB) if i % 4 == 0 else rng.randbytes(MiB))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(MiB), b""):
            h.update(b)
    return h.hexdigest()


def ranges_digest_file(path, reads):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for off, ln in reads:
            f.seek(off)
            h.update(f.read(ln))
    return h.hexdigest()


def ranges_digest_nbd(sock, reads):
    h = hashlib.sha256()
    c = Nbd(sock)
    for off, ln in reads:
        h.update(c.pread(ln, off))
    c.close()
    return h.hexdigest()


def write_csv_trace(path, reads):
    with open(path, "w") as f:
        f.write("time_ns,client,device,op,offset,len,fragment\n")
        for i, (off, ln) in enumerate(reads):
            f.write(f"{i * 1000},0,0,read,{off},{ln},0\n")


def prepare(d, store, name, seed, reads, trace, disk_size, mem_size):
    """An image with a recorded working set, suspended to a medium."""
    img = os.path.join(d, f"{name}.raw")
    make_disk(img, disk_size, reads, seed)
    run(B, "-q", "commit", f"raw:{img}", "--to", f"bench/{name}", "--store", store)
    sess = os.path.join(d, f"{name}-boot")
    run(B, "-q", "checkout", f"bench/{name}", "--session", sess, "--store", store)
    sock = os.path.join(d, "boot.sock")
    p = serve(f"cas[shared-cache=off]:{sess}", sock)
    try:
        run(B, "-q", "replay", trace, f"nbd+unix:///?socket={sock}")
    finally:
        stop(p)
    mem = os.path.join(d, f"{name}.mem")
    make_memory(mem, mem_size, seed + 100)
    media = os.path.join(d, f"media-{name}")
    s = json.loads(run(B, "suspend", sess, "--memory", mem, "--to-media", media,
                       "--store", store, "--json"))
    return {"img": img, "mem": mem, "media": media, "suspend": s}


def corrupt_copy(src, dst):
    """A copy of a medium with one byte flipped in the middle of every object."""
    shutil.copytree(src, dst)
    n = 0
    for dp, _, files in os.walk(os.path.join(dst, "objects")):
        for fn in files:
            p = os.path.join(dp, fn)
            with open(p, "r+b") as f:
                mid = os.path.getsize(p) // 2
                f.seek(mid)
                b = f.read(1)
                f.seek(mid)
                f.write(bytes([b[0] ^ 0xFF]))
            n += 1
    return n


def probe(url, catalog, version):
    """The requests a resume makes over the link whatever the media hold:
    the catalog, then the version package twice (VersionView::open, then
    the session's offline copy)."""
    def get(path):
        t = time.monotonic()
        with urllib.request.urlopen(f"{url}/v1/{path}") as r:
            n = len(r.read())
        return time.monotonic() - t, n
    cat_s, cat_b = get(f"refs/{catalog}")
    p1_s, pkg_b = get(f"objects/{version}")
    p2_s, _ = get(f"objects/{version}")
    return {"catalog_s": cat_s, "catalog_bytes": cat_b, "package_s": [p1_s, p2_s],
            "package_bytes": pkg_b, "total_s": cat_s + p1_s + p2_s}


def resume_once(d, url, cond, media, ref, reads):
    sess = os.path.join(d, "resumed")
    cache = os.path.join(d, "fresh-shared-cache")
    mem_out = os.path.join(d, "resumed.mem")
    for p in (sess, cache):
        shutil.rmtree(p, ignore_errors=True)
    cmd = [B, "resume", "bench/vm", "--store", url, "--session", sess, "--shared-cache", cache,
           "--memory-out", mem_out, "--json"]
    if media:
        cmd += ["--lookaside", media]
    t0 = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - t0
    j = json.loads(out)
    mem_ok = sha256_file(mem_out) == ref["mem_sha256"]
    sock = os.path.join(d, "resumed.sock")
    p = serve(f"cas[shared-cache={cache}]:{sess}", sock)
    try:
        ws_ok = ranges_digest_nbd(sock, reads) == ref["ws_sha256"]
    finally:
        stop(p)
    ws = j["working_set"]
    src = {k: j["memory"][k] + ws["got"][k]
           for k in ("shared_cache_bytes", "lookaside_bytes", "store_bytes")}
    for p in (sess, cache):
        shutil.rmtree(p, ignore_errors=True)
    os.unlink(mem_out)
    return {"wall_s": wall, "roamdisk_s": j["seconds"], "memory_ok": mem_ok, "reads_ok": ws_ok,
            "working_set_done": ws["done"] and ws["got"]["bytes"] == ws["bytes"],
            "resume_set_bytes": j["memory"]["bytes"] + ws["bytes"], **src}


def svg_plot(path, rates, med, title):
    """Grouped bars, log scale: seconds per condition and rate, and the
    seed's two figures as markers."""
    W, H, L, R, T, Bm = 1000, 620, 90, 240, 50, 70
    lo, hi = 0.1, 1000.0
    import math

    def y(v):
        v = min(max(v, lo), hi)
        return T + (H - T - Bm) * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))
    colors = {"none": "#1F77B4", "right": "#2CA02C", "wrong": "#FF7F0E", "corrupt": "#D62728"}
    o = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg">',
         f'<rect x="0" y="0" width="{W}" height="{H}" fill="#FFFFFF"/>',
         f'<text x="{(W - R + L) / 2}" y="28" text-anchor="middle" font-family="sans-serif" font-size="18">{title}</text>']
    for e in range(-1, 4):
        v = 10.0 ** e
        o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#000" opacity="0.15"/>')
        o.append(f'<text x="{L - 8}" y="{y(v) + 5:.1f}" text-anchor="end" font-family="sans-serif" font-size="14">{v:g}</text>')
    o.append(f'<text x="24" y="{(T + H - Bm) / 2}" transform="rotate(-90 24 {(T + H - Bm) / 2})" text-anchor="middle" '
             f'font-family="sans-serif" font-size="15">resume time (s, log scale)</text>')
    gw = (W - R - L) / len(rates)
    bw = gw * 0.8 / len(CONDS)
    for i, rate in enumerate(rates):
        x0 = L + i * gw + gw * 0.1
        for k, c in enumerate(CONDS):
            v = med.get((rate, c))
            if v is None:
                continue
            x = x0 + k * bw
            o.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bw * 0.9:.1f}" height="{y(lo) - y(v):.1f}" fill="{colors[c]}"/>')
            inside = y(lo) - y(v) > 24  # the label inside the bar's top, clear of the seed's marker
            o.append(f'<text x="{x + bw * 0.45:.1f}" y="{y(v) + 16 if inside else y(v) - 5:.1f}" text-anchor="middle" '
                     f'font-family="sans-serif" font-size="12" fill="{"#FFFFFF" if inside else "#000000"}">{v:.3g}</text>')
        seed = SEED.get(rate_bits(rate))
        if seed:
            for k, v in ((0, seed[0]), (1, seed[1])):
                cx, cy = x0 + k * bw + bw * 0.45, y(v)
                o.append(f'<path d="M{cx - 7:.1f},{cy:.1f} L{cx:.1f},{cy - 7:.1f} L{cx + 7:.1f},{cy:.1f} L{cx:.1f},{cy + 7:.1f} Z" '
                         f'fill="none" stroke="#000" stroke-width="2"/>')
        o.append(f'<text x="{L + i * gw + gw / 2:.1f}" y="{H - Bm + 24}" text-anchor="middle" font-family="sans-serif" font-size="15">{rate}/s, 8 ms</text>')
    o.append(f'<line x1="{L}" x2="{L}" y1="{T}" y2="{H - Bm}" stroke="#000"/>')
    o.append(f'<line x1="{L}" x2="{W - R}" y1="{H - Bm}" y2="{H - Bm}" stroke="#000"/>')
    ly = T + 10
    for c in CONDS:
        o.append(f'<rect x="{W - R + 20}" y="{ly}" width="16" height="16" fill="{colors[c]}"/>')
        o.append(f'<text x="{W - R + 44}" y="{ly + 13}" font-family="sans-serif" font-size="14">{LABEL[c]}</text>')
        ly += 26
    o.append(f'<path d="M{W - R + 21},{ly + 8} L{W - R + 28},{ly + 1} L{W - R + 35},{ly + 8} L{W - R + 28},{ly + 15} Z" fill="none" stroke="#000" stroke-width="2"/>')
    o.append(f'<text x="{W - R + 44}" y="{ly + 13}" font-family="sans-serif" font-size="14">seed (no lookaside,</text>')
    o.append(f'<text x="{W - R + 44}" y="{ly + 31}" font-family="sans-serif" font-size="14">lookaside), 41 MB</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1Mbit,10Mbit,100Mbit", help="link rates, comma-separated")
    ap.add_argument("--latency", default="8ms")
    ap.add_argument("--runs", type=int, default=3, help="runs per condition at 10 Mbit/s and above")
    ap.add_argument("--slow-runs", type=int, default=1, help="runs per condition below 10 Mbit/s")
    ap.add_argument("--disk", default="512M", help="disk size")
    ap.add_argument("--memory", default="16M", help="memory image size (MiB multiple)")
    ap.add_argument("--requests", type=int, default=600, help="boot trace requests (the working set)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 10Mbit,100Mbit, 1 run, 256 MiB disk, 8 MiB memory, 300 requests")
    ap.add_argument("--dir", default=None, help="work here and keep it (default: a temporary folder)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    ap.add_argument("--replot", metavar="JSON", help="only redraw the plot of an earlier run's JSON (next to it)")
    args = ap.parse_args()
    if args.replot:
        j = json.load(open(args.replot))
        med = {(m["rate"], m["condition"]): m["wall_s"] for m in j["medians"]}
        rs = j["meta"]["resume_set"]
        svg_plot(args.replot[:-len(".json")] + ".svg", j["meta"]["rates"], med,
                 f"ISR resume: {rs['copied_bytes'] / 1e6:.0f} MB resume set over an emulated link")
        return
    if args.quick:
        args.rates, args.runs, args.slow_runs = "10Mbit,100Mbit", 1, 1
        args.disk, args.memory, args.requests = "256M", "8M", 300
    args.disk = parse_size(args.disk)
    rates = args.rates.split(",")
    d = args.dir or tempfile.mkdtemp(prefix="roamdisk-isr-", dir="/var/tmp")
    os.makedirs(d, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M")
    stamp = time.strftime("%Y%m%d-%H%M")
    load0 = open("/proc/loadavg").read().split()[:3]

    # The boot's reads, folded into the disk (the trace spans 8.5 GB).
    raw_trace = os.path.join(d, "boot.rdtrace")
    reads = [(off % args.disk, ln) for op, off, ln in boot_trace(raw_trace, args.requests)
             if op == "read" and off % args.disk + ln <= args.disk]
    trace = os.path.join(d, "boot-reads.csv")
    write_csv_trace(trace, reads)
    store = os.path.join(d, "store")
    run(B, "-q", "store", "init", store)
    mem_size = parse_size(args.memory)
    print(f"setup in {d}: {len(reads)} boot reads, {sum(l for _, l in reads) / MiB:.1f} MiB", file=sys.stderr)
    right = prepare(d, store, "vm", 1, reads, trace, args.disk, mem_size)
    other = prepare(d, store, "other", 2, reads, trace, args.disk, mem_size)
    corrupt = os.path.join(d, "media-corrupt")
    flipped = corrupt_copy(right["media"], corrupt)
    media = {"none": None, "right": right["media"], "wrong": other["media"], "corrupt": corrupt}
    ref = {"mem_sha256": sha256_file(right["mem"]), "ws_sha256": ranges_digest_file(right["img"], reads)}
    rs = right["suspend"]["resume_set"]
    version = right["suspend"]["commit"]["version"]
    package_bytes = right["suspend"]["commit"]["package_bytes"]
    print(f"resume set: {rs['memory_chunks']} memory + {rs['working_set_chunks']} working-set chunks, "
          f"{rs['copied_bytes'] / 1e6:.1f} MB on the medium; version package {package_bytes} B encoded; "
          f"{flipped} objects damaged in the corrupted copy", file=sys.stderr)

    servers = {rate: store_serve(store, rate, args.latency) for rate in rates}
    runs_for = {rate: args.slow_runs if rate_bits(rate) < 10e6 else args.runs for rate in rates}
    samples, probes = [], []
    try:
        for r in range(max(runs_for.values())):
            for rate in rates:
                if r >= runs_for[rate]:
                    continue
                url = servers[rate][1]
                time.sleep(1)  # an idle link: a full bucket for every measurement
                pr = probe(url, "bench/vm", version)
                probes.append({"rate": rate, "run": r + 1, **pr})
                order = CONDS[r % len(CONDS):] + CONDS[:r % len(CONDS)]
                for c in order:
                    time.sleep(1)
                    s = resume_once(d, url, c, media[c], ref, reads)
                    s.update(rate=rate, condition=c, run=r + 1)
                    samples.append(s)
                    ok = "ok" if s["memory_ok"] and s["reads_ok"] and s["working_set_done"] else "WRONG DATA"
                    print(f"run {r + 1}: {rate:>7} {c:8} {s['wall_s']:8.2f} s  lookaside "
                          f"{s['lookaside_bytes'] / 1e6:5.1f} MB, store {s['store_bytes'] / 1e6:5.1f} MB  {ok}",
                          file=sys.stderr)
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait()

    med = {}
    for rate in rates:
        for c in CONDS:
            v = [s["wall_s"] for s in samples if s["rate"] == rate and s["condition"] == c]
            if v:
                med[(rate, c)] = statistics.median(v)
    load1 = open("/proc/loadavg").read().split()[:3]
    all_ok = all(s["memory_ok"] and s["reads_ok"] and s["working_set_done"] for s in samples)
    print(f"# {started}, {os.cpu_count()} cores, load {' '.join(load0)} -> {' '.join(load1)}; loopback, "
          f"link emulated by store serve --limit RATE --latency {args.latency}; resume set "
          f"{rs['copied_bytes'] / 1e6:.1f} MB; medians of {args.runs} interleaved runs "
          f"({args.slow_runs} below 10 Mbit/s)")
    print("| link | no lookaside (s) | its medium (s) | wrong medium (s) | corrupted medium (s) "
          "| none / medium | wrong / none | corrupted / none | seed none / medium |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in rates:
        n, m, w, x = (med[(rate, c)] for c in CONDS)
        seed = SEED.get(rate_bits(rate))
        seed_s = f"{seed[0]} / {seed[1]} = {seed[0] / seed[1]:.1f}x" if seed else "-"
        print(f"| {rate}/s | {n:.2f} | {m:.2f} | {w:.2f} | {x:.2f} | **{n / m:.1f}x** | {w / n:.3f} | {x / n:.3f} | {seed_s} |")
    print()
    print("| link | catalog GET (s) | version package GET, 1st / 2nd (s) | sum (s) | of the lookaside resume |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for rate in rates:
        ps = [p for p in probes if p["rate"] == rate]
        cat = statistics.median(p["catalog_s"] for p in ps)
        p1 = statistics.median(p["package_s"][0] for p in ps)
        p2 = statistics.median(p["package_s"][1] for p in ps)
        print(f"| {rate}/s | {cat:.3f} | {p1:.3f} / {p2:.3f} | {cat + p1 + p2:.3f} | "
              f"{(cat + p1 + p2) / med[(rate, 'right')]:.0%} |")
    print(f"\nevery memory image and every boot read correct: {'yes' if all_ok else 'NO'} ({len(samples)} resumes)")

    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"isr-resume-{stamp}")
    meta = {"started": started, "cores": os.cpu_count(), "load_before": load0, "load_after": load1,
            "rates": rates, "latency": args.latency, "runs": runs_for, "disk_bytes": args.disk,
            "memory_bytes": mem_size, "boot_reads": len(reads),
            "boot_read_bytes": sum(l for _, l in reads), "resume_set": rs,
            "package_bytes": package_bytes, "package_stored_bytes": probes[0]["package_bytes"],
            "corrupted_objects": flipped, "all_correct": all_ok,
            "binary": B}
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "samples": samples, "probes": probes,
                   "medians": [{"rate": k[0], "condition": k[1], "wall_s": v} for k, v in med.items()]},
                  f, indent=1)
    with open(base + ".csv", "w", newline="") as f:
        cols = ["rate", "condition", "run", "wall_s", "roamdisk_s", "lookaside_bytes", "store_bytes",
                "shared_cache_bytes", "resume_set_bytes", "memory_ok", "reads_ok", "working_set_done"]
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(samples)
    svg_plot(base + ".svg", rates, med,
             f"ISR resume: {rs['copied_bytes'] / 1e6:.0f} MB resume set over an emulated link")
    print(f"wrote {base}.json, .csv, .svg", file=sys.stderr)
    if not args.dir:
        shutil.rmtree(d, ignore_errors=True)
    if not all_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
