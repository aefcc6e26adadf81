#!/opt/roamdisk-swift/bin/python
"""Commit and checkout speed of a content-addressed image on three stores,
side by side in one run (issue 14):

* local   — a store folder (`--store DIR`), the embedded default;
* http    — `roamdisk store serve DIR` on loopback, the HTTP chunk server;
* s3      — `s3://bench/...` on a 3-node, 3-replica OpenStack Swift cluster
            with s3api on loopback (scripts/swift-setup, scripts/swift-run);
* s3-http — `roamdisk store serve s3://...`: the chunk server fronting S3.

Each round commits the same incompressible image into a new store of each
kind (interleaved), then checks it out to a file; MB/s of the image's size,
medians over rounds. Then the object store's own request rates with boto3,
16 requests in flight: PUT/s and GET/s of objects the size of one chunk
(what storing every chunk as an object would cost) and of one pack (what
the S3 store does), and how many requests a commit and a checkout made.

Run with the Swift virtualenv's python (it has boto3):
    bench/cas-s3.py --size 512M --rounds 3
Results: bench/results/cas-s3-DATE.json, and the table printed.
"""
import argparse, concurrent.futures, json, os, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roamdisk_bench import B, ROOT, parse_size, save_results, stop, store_serve  # noqa: E402

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402


def sh(*args, env=None):
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def swift_env(d):
    env = dict(os.environ)
    for line in sh(os.path.join(ROOT, "scripts/swift-run"), "env", d).splitlines():
        k, v = line.removeprefix("export ").split("=", 1)
        env[k] = v
    return env


def timed(args, env):
    t = time.perf_counter()
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def rates(s3, bucket, size, n):
    """PUT/s and GET/s of N objects of SIZE bytes, 16 in flight."""
    body = os.urandom(size)
    keys = [f"rate/{size}/{i}" for i in range(n)]
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        t = time.perf_counter()
        list(ex.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=body), keys))
        put = n / (time.perf_counter() - t)
        t = time.perf_counter()
        list(ex.map(lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(), keys))
        get = n / (time.perf_counter() - t)
        list(ex.map(lambda k: s3.delete_object(Bucket=bucket, Key=k), keys))
    return put, get


def count_keys(s3, bucket, prefix):
    n = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        n += len(page.get("Contents", []))
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M", help="image size (default 512M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--swift", help="an existing cluster folder (default: a new one, started and stopped here)")
    ap.add_argument("--port", type=int, default=8480, help="base port of a new cluster")
    ap.add_argument("--out")
    a = ap.parse_args()
    size = parse_size(a.size)
    work = tempfile.mkdtemp(prefix="cas-s3-bench-")
    own = a.swift is None
    swift = a.swift or os.path.join(work, "swift")
    if own:
        sh(os.path.join(ROOT, "scripts/swift-setup"), swift, "--port", str(a.port))
        sh(os.path.join(ROOT, "scripts/swift-run"), "start", swift)
    env = swift_env(swift)
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    s3 = boto3.client("s3", config=Config(max_pool_connections=32))
    bucket = "bench"
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    img = os.path.join(work, "disk.img")
    with open(img, "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    samples = {k: {"commit": [], "checkout": []} for k in ("local", "http", "s3", "s3-http")}
    requests = {}
    try:
        for r in range(a.rounds):
            for kind in samples:
                servers = []
                if kind in ("local", "http"):
                    store = os.path.join(work, f"{kind}-{r}")
                    sh(B, "store", "init", store, "--compression", "none")
                else:
                    store = f"s3://{bucket}/{kind}-{r}-{os.getpid()}"
                    sh(B, "store", "init", store, "--compression", "none", env=env)
                loc = store
                if kind.endswith("http"):
                    p, loc = store_serve(store)
                    servers.append(p)
                try:
                    c = timed([B, "-q", "commit", img, "--to", "bench/vm", "--store", loc], env)
                    out = os.path.join(work, "out.raw")
                    k = timed([B, "-q", "checkout", "bench/vm", "--output", out, "--store", loc], env)
                    if r == 0:
                        subprocess.run(["cmp", img, out], check=True)
                    os.unlink(out)
                finally:
                    for p in servers:
                        stop(p)
                samples[kind]["commit"].append(size / c / 1e6)
                samples[kind]["checkout"].append(size / k / 1e6)
                if kind == "s3" and r == 0:
                    prefix = store.removeprefix(f"s3://{bucket}/") + "/"
                    requests = {
                        "packs": count_keys(s3, bucket, prefix + "packs/"),
                        "objects": count_keys(s3, bucket, prefix + "objects/"),
                    }
                if kind in ("local", "http"):
                    shutil.rmtree(store)
                print(f"round {r + 1} {kind}: commit {samples[kind]['commit'][-1]:.0f} MB/s, "
                      f"checkout {samples[kind]['checkout'][-1]:.0f} MB/s", flush=True)
        chunk_put, chunk_get = rates(s3, bucket, 64 << 10, 400)
        pack_put, pack_get = rates(s3, bucket, 32 << 20, 16)
    finally:
        if own:
            subprocess.run([os.path.join(ROOT, "scripts/swift-run"), "stop", swift])
        shutil.rmtree(work, ignore_errors=True)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in samples.items()}
    print(f"\n{a.size} image, {a.rounds} rounds, medians")
    print("| store | commit MB/s | of local | checkout MB/s | of local |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, d in med.items():
        print(f"| {k} | {d['commit']:.0f} | {d['commit'] / med['local']['commit']:.2f}x "
              f"| {d['checkout']:.0f} | {d['checkout'] / med['local']['checkout']:.2f}x |")
    print(f"\ncommit to s3 stored {requests.get('packs')} packs + {requests.get('objects')} single objects")
    print("| object size | PUT/s | GET/s | MB/s PUT | MB/s GET |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, sz, p, g in (("64 KiB (one chunk)", 64 << 10, chunk_put, chunk_get),
                           ("32 MiB (one pack)", 32 << 20, pack_put, pack_get)):
        print(f"| {name} | {p:.0f} | {g:.0f} | {p * sz / 1e6:.0f} | {g * sz / 1e6:.0f} |")
    save_results(a.out, "cas-s3", {
        "size": size, "rounds": a.rounds, "samples": samples, "medians": med,
        "s3_objects": requests,
        "rates": {"chunk": [chunk_put, chunk_get], "pack": [pack_put, pack_get]},
    })


if __name__ == "__main__":
    main()
