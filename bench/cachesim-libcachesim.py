#!/usr/bin/env python3
"""Cross-check roamdisk's LRU, 2Q, ARC and S3-FIFO against libCacheSim on the
same key streams, and compare their speed.

For each generated trace (`roamdisk trace synth`), `roamdisk sim
--export-keys` writes the block keys the server cache sees (after the
4 KiB block split and the copy-on-write sharing model) in libCacheSim's txt
format. Both simulators then replay that stream at several cache sizes;
the script compares exact miss counts and prints requests/s of each
policy's core loop (ours: crates/cachesim/examples/policy_speed.rs;
libCacheSim's: a small driver compiled against its static libraries).

libCacheSim (github.com/1a1a11a/libCacheSim) is cloned and built OUTSIDE
this repository (default /tmp/libcachesim, Debian's libglib2.0-dev and
libzstd-dev), nothing of it is kept here.

    bench/cachesim-libcachesim.py [--lcs-dir /tmp/libcachesim] [--work DIR]

NO_BUILD=1 skips rebuilding roamdisk (uses target/release as it is).
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RD = os.path.join(ROOT, "target", "release", "roamdisk")
SPEED = os.path.join(ROOT, "target", "release", "examples", "policy_speed")

# Our driver over libCacheSim's API: exact miss counts and core-loop speed.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "libCacheSim.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: driver KEYS CAPACITY ALGO[,ALGO] [REPEAT]\n"); return 2; }
  FILE *f = fopen(argv[1], "r"); if (!f) { perror(argv[1]); return 1; }
  size_t n = 0, cap_keys = 1 << 20; uint64_t *keys = malloc(cap_keys * 8); unsigned long long k;
  while (fscanf(f, "%llu", &k) == 1) { if (n == cap_keys) { cap_keys *= 2; keys = realloc(keys, cap_keys * 8); } keys[n++] = k; }
  fclose(f);
  int64_t cap = atoll(argv[2]); int repeat = argc > 4 ? atoi(argv[4]) : 1;
  char *algos = strdup(argv[3]); request_t *req = new_request(); req->obj_size = 1;
  for (char *a = strtok(algos, ","); a; a = strtok(NULL, ",")) {
    double best = 1e30; int64_t misses = 0;
    for (int r = 0; r < repeat; r++) {
      common_cache_params_t cc = {.cache_size = cap, .hashpower = getenv("HP") ? atoi(getenv("HP")) : 24, .consider_obj_metadata = false};
      cache_t *c;
      if (!strcmp(a, "LRU")) c = LRU_init(cc, NULL);
      else if (!strcmp(a, "TwoQ")) c = TwoQ_init(cc, NULL);
      else if (!strcmp(a, "ARC")) c = ARC_init(cc, NULL);
      else if (!strcmp(a, "S3FIFO")) c = S3FIFO_init(cc, NULL);
      else { fprintf(stderr, "unknown %s\n", a); return 2; }
      misses = 0; double t0 = now();
      for (size_t i = 0; i < n; i++) { req->obj_id = keys[i]; req->clock_time = i; if (!c->get(c, req)) misses++; }
      double t = now() - t0; if (t < best) best = t; c->cache_free(c);
    }
    printf("%s %lld %.3f\n", a, (long long)misses, n / best / 1e6);
  }
  return 0;
}
"""

LIBS = [
    "cache/libcachelib.a", "cache/eviction/libevictionC.a", "cache/eviction/libevictionCPP.a",
    "traceReader/libtraceReader.a", "profiler/libprofiler.a", "dataStructure/libdataStructure.a",
    "dataStructure/hash/libds_hash.a", "utils/libutils.a", "cache/admission/libadmissionC.a",
    "cache/admission/libadmissionCpp.a", "cache/prefetch/libprefetchC.a", "cache/libcachelib.a",
    "dataStructure/libdataStructure.a", "traceReader/libtraceReader.a", "utils/libutils.a",
]

OURS = {"LRU": "lru", "TwoQ": "2q", "ARC": "arc", "S3FIFO": "s3fifo"}


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def build_libcachesim(d):
    build = os.path.join(d, "_build")
    if not os.path.exists(os.path.join(build, "libCacheSim", "cache", "libcachelib.a")):
        if not os.path.isdir(d):
            sh(["git", "clone", "--depth", "1", "https://github.com/1a1a11a/libCacheSim", d])
        missing = [p for p in ("libglib2.0-dev", "libzstd-dev", "cmake", "pkg-config")
                   if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
        if missing:
            sh(["apt-get", "install", "-y", "-q"] + missing)
        sh(["cmake", "-S", d, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            "-DENABLE_TESTS=OFF", "-DUSE_HUGEPAGE=OFF"])
        sh(["make", "-C", build, "-j2", "cachesim"])
    drv = os.path.join(build, "roamdisk-driver")
    src = drv + ".c"
    with open(src, "w") as f:
        f.write(DRIVER)
    inc = os.path.join(d, "libCacheSim", "include")
    glib = sh(["pkg-config", "--cflags", "--libs", "glib-2.0"]).split()
    sh(["gcc", "-O3", "-DNDEBUG", "-I" + inc, "-I" + os.path.join(inc, "libCacheSim"), src, "-o", drv]
       + [os.path.join(build, "libCacheSim", l) for l in LIBS]
       + glib + ["-lzstd", "-lstdc++", "-lm", "-lpthread"])
    commit = sh(["git", "-C", d, "log", "-1", "--format=%h %ad", "--date=short"]).strip()
    return drv, commit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lcs-dir", default="/tmp/libcachesim")
    ap.add_argument("--work", default="/tmp/roamdisk-cachesim-bench")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if not os.environ.get("NO_BUILD"):
        sh(["cargo", "build", "--release", "-q", "-p", "roamdisk"], cwd=ROOT)
        sh(["cargo", "build", "--release", "-q", "-p", "roamdisk-cachesim", "--example", "policy_speed"],
           cwd=ROOT)
    drv, commit = build_libcachesim(args.lcs_dir)

    traces = {
        "desktop": ["desktop", "--clients", "15", "--seed", "1"],
        "boot": ["boot", "--seed", "1"],
        "email": ["android-email", "--seed", "1"],
    }
    results = {"libcachesim": commit, "date": datetime.date.today().isoformat(), "runs": []}
    rows = []
    for name, synth in traces.items():
        tr = os.path.join(args.work, name + ".rdtrace")
        keys = os.path.join(args.work, name + ".keys")
        sh([RD, "trace", "synth"] + synth + ["-o", tr, "-q"])
        sh([RD, "sim", tr, "--policy", "lru", "--size", "1/16", "--no-lru-curve",
            "--export-keys", keys, "-q"])
        with open(keys) as f:
            ids = [int(x) for x in f]
        ws = max(ids) + 1
        for frac in (64, 16, 4):
            cap = max(ws // frac, 20)
            specs = ",".join(OURS.values()) + ",2q[am=rest]"
            out = json.loads(sh([RD, "sim", tr, "--policy", specs, "--size", str(cap * 4096),
                                 "--no-lru-curve", "--json", "-q"]))
            ours = {}
            for r in out["levels"][0]["results"]:
                ours[r["policy"]] = r["short"]["misses"] + r["long"]["misses"]
            theirs = {}
            for line in sh([drv, keys, str(cap), ",".join(OURS), "1"]).splitlines():
                a, m, _ = line.split()
                theirs[a] = int(m)
            for a, p in OURS.items():
                label = {"lru": "LRU", "2q": "2Q", "arc": "ARC", "s3fifo": "S3-FIFO"}[p]
                row = {"trace": name, "requests": len(ids), "working_set": ws, "capacity": cap,
                       "policy": label, "roamdisk": ours[label], "libcachesim": theirs[a]}
                if a == "TwoQ":
                    row["roamdisk_am_rest"] = ours["2Q[am=rest]"]
                rows.append(row)
        # Speed at 1/16 of the working set.
        cap = max(ws // 16, 20)
        ours_speed = {}
        for line in sh([SPEED, keys, str(cap), str(args.repeat)]).splitlines():
            m = re.match(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
            if m:
                ours_speed[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        # libCacheSim's speed depends on its hash table's initial size
        # (hashpower); report the best of three.
        lcs_speed = {}
        for hp in (16, 20, 24):
            env = dict(os.environ, HP=str(hp))
            out = subprocess.run([drv, keys, str(cap), ",".join(OURS), str(args.repeat)],
                                 check=True, text=True, capture_output=True, env=env).stdout
            for line in out.splitlines():
                a, _, s = line.split()
                lcs_speed[a] = max(lcs_speed.get(a, 0.0), float(s))
        results["runs"].append({"trace": name, "capacity": cap, "ours_mreq_s": ours_speed,
                                "libcachesim_mreq_s": lcs_speed})
    results["misses"] = rows
    load = os.getloadavg()
    results["loadavg"] = load

    print(f"libCacheSim {commit}; load average {load[0]:.1f} on {os.cpu_count()} cores\n")
    print("| trace | requests | working set | cache (blocks) | policy | roamdisk misses | libCacheSim misses | equal |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        note = ""
        if "roamdisk_am_rest" in r:
            note = f" (am=rest: {r['roamdisk_am_rest']})"
        eq = "yes" if r["roamdisk"] == r["libcachesim"] else "NO"
        print(f"| {r['trace']} | {r['requests']} | {r['working_set']} | {r['capacity']} | {r['policy']} "
              f"| {r['roamdisk']}{note} | {r['libcachesim']} | {eq} |")
    print("\n| trace | cache | policy | roamdisk dense ids (Mreq/s) | roamdisk u64 hash (Mreq/s) "
          "| libCacheSim, best hashpower (Mreq/s) |")
    print("|---|---:|---|---:|---:|---:|")
    for run in results["runs"]:
        for a, p in OURS.items():
            label = {"lru": "LRU", "2q": "2Q", "arc": "ARC", "s3fifo": "S3-FIFO"}[p]
            h, dn = run["ours_mreq_s"].get(label, (0, 0))
            print(f"| {run['trace']} | {run['capacity']} | {label} | {dn:.1f} | {h:.1f} "
                  f"| {run['libcachesim_mreq_s'][a]:.1f} |")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    out = os.path.join(ROOT, "bench", "results",
                       "cachesim-libcachesim-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {out}")
    bad = [r for r in rows if r["roamdisk"] != r["libcachesim"] and r.get("roamdisk_am_rest") != r["libcachesim"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
