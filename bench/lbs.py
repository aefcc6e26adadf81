#!/usr/bin/env python3
"""LBS served by roamdisk vs raw, qcow2 and qcow2+LUKS served by qemu-nbd.

Every configuration gets a fresh image of the same size, measured with
fio's NBD engine: 4 KiB random writes with a FLUSH every 64 writes and
without on the fresh image; then the image is filled with sequential 1 MiB
writes and measured for 1 MiB sequential write and read and for 4 KiB
random writes with flushes on the full image (LBS's garbage collector at
steady state). Configurations are interleaved (order rotated each pass),
several passes, medians. The table gives each configuration's median and,
for LBS with XTS + a checksum, the ratio to qcow2+LUKS; and the cost of each
checksum and of encryption over plain LBS (no checksum, no encryption).

Only the Python standard library is used. See docs/BENCHMARKS.md.
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20

# (id, label, unit, fio parameters, phase): "fresh" rows run on the new,
# empty image; then the image is filled with sequential 1 MiB writes; "full"
# rows run on the full image (for LBS: garbage collection at steady state).
ROWS = [
    ("randwrite-flush", "4 KiB random write, QD 16, FLUSH/64 (fresh image)", "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16, fsync=64), "fresh"),
    ("randwrite", "4 KiB random write, QD 16 (fresh image)", "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16), "fresh"),
    ("seqwrite-1m", "1 MiB sequential write, QD 8", "MB/s", dict(rw="write", bs="1m", iodepth=8), "full"),
    ("seqread-1m", "1 MiB sequential read, QD 8", "MB/s", dict(rw="read", bs="1m", iodepth=8), "full"),
    ("randwrite-full-flush", "4 KiB random write, QD 16, FLUSH/64 (full image)", "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16, fsync=64), "full"),
    # "steady" rows: on the full image, first the same writes untimed for
    # --precondition times the image size, so LBS's cleaner has reached its
    # steady state for that distribution, then measured.
    ("steady-zipf", "4 KiB random write, QD 16, FLUSH/64, zipf:1.1 (full image, steady state)", "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16, fsync=64, random_distribution="zipf:1.1", norandommap=1),
     "steady"),
    ("steady-hotcold", "4 KiB random write, QD 16, FLUSH/64, 90% to 10% of the disk (full image, steady state)",
     "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16, fsync=64, random_distribution="zoned:90/10:10/90",
          norandommap=1), "steady"),
    ("steady-uniform", "4 KiB random write, QD 16, FLUSH/64, uniform (full image, steady state)", "IOPS",
     dict(rw="randwrite", bs="4k", iodepth=16, fsync=64, norandommap=1), "steady"),
]

# name -> (kind, options)
CONFIGS = {
    "lbs-xts-crc32c": ("lbs", dict(checksum="crc32c", encrypt=True)),
    "lbs-plain": ("lbs", dict(checksum="none", encrypt=False)),
    "lbs-fletcher32": ("lbs", dict(checksum="fletcher32", encrypt=False)),
    "lbs-crc32c": ("lbs", dict(checksum="crc32c", encrypt=False)),
    "lbs-sha256": ("lbs", dict(checksum="sha256", encrypt=False)),
    "lbs-blake3": ("lbs", dict(checksum="blake3", encrypt=False)),
    "lbs-xts": ("lbs", dict(checksum="none", encrypt=True)),
    "lbs-xts-sha256": ("lbs", dict(checksum="sha256", encrypt=True)),
    "raw": ("qemu", dict(fmt="raw")),
    "qcow2": ("qemu", dict(fmt="qcow2")),
    "qcow2-luks": ("qemu", dict(fmt="qcow2-luks")),
}
MAIN = "lbs-xts-crc32c"
BASELINE = "qcow2-luks"
LUKS_SECRET = "roamdisk-bench-secret"
# --also TAG=BIN: another roamdisk binary, for configurations named NAME@TAG.
ALSO = {}


def die(msg):
    print(f"bench/lbs.py: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def wait_socket(path, proc, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            die(f"server exited early: {' '.join(proc.args)}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    die(f"server did not listen on {path}")


class Server:
    def __init__(self, name, work, size, roamdisk):
        # NAME@TAG: configuration NAME served by the binary given as --also TAG=BIN.
        self.name = name
        base, _, tag = name.partition("@")
        self.kind, self.opts = CONFIGS[base]
        if tag:
            roamdisk = ALSO[tag]
        self.dir = tempfile.mkdtemp(prefix=f"{name.replace('@', '-')}-", dir=work)
        self.sock = os.path.join(self.dir, "s.sock")
        self.size = size
        self.roamdisk = roamdisk
        self.proc = None

    def start(self):
        d = self.dir
        if self.kind == "lbs":
            img = os.path.join(d, "img.lbsd")
            cmd = [self.roamdisk, "-q", "lbs", "create", img, "--size", str(self.size), "--checksum", self.opts["checksum"]]
            spec = f"lbs:{img}"
            if self.opts["encrypt"]:
                key = os.path.join(d, "img.key")
                cmd += ["--encrypt", "--key-file", key]
                spec = f"lbs[key-file={key}]:{img}"
            run(cmd)
            self.proc = subprocess.Popen([self.roamdisk, "-q", "serve", spec, "--socket", self.sock], stderr=subprocess.DEVNULL)
        else:
            fmt = self.opts["fmt"]
            if fmt == "raw":
                img = os.path.join(d, "img.raw")
                with open(img, "wb") as f:
                    f.truncate(self.size)
                args = ["-f", "raw", img]
            elif fmt == "qcow2":
                img = os.path.join(d, "img.qcow2")
                run(["qemu-img", "create", "-q", "-f", "qcow2", img, str(self.size)])
                args = ["-f", "qcow2", img]
            else:
                img = os.path.join(d, "img.qcow2")
                sec = f"secret,id=sec0,data={LUKS_SECRET}"
                run(["qemu-img", "create", "-q", "-f", "qcow2", "--object", sec,
                     "-o", "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=100", img, str(self.size)])
                args = ["--object", sec, "--image-opts",
                        f"driver=qcow2,file.driver=file,file.filename={img},encrypt.key-secret=sec0"]
            self.proc = subprocess.Popen(["qemu-nbd", "-t", "-e", "8", "-k", self.sock] + args, stderr=subprocess.DEVNULL)
        wait_socket(self.sock, self.proc)
        return self

    def uri(self):
        return f"nbd+unix:///?socket={self.sock}"

    def stop(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def fio(uri, size, runtime, params, name="job", time_based=True, io_size=None):
    cmd = ["fio", "--output-format=json", f"--name={name}", "--ioengine=nbd", f"--uri={uri}",
           f"--size={size}", "--direct=1", "--randrepeat=0"]
    if time_based:
        cmd += ["--time_based", f"--runtime={runtime}", "--ramp_time=1"]
    if io_size:
        cmd.append(f"--io_size={io_size}")
    for k, v in params.items():
        cmd.append(f"--{k}={v}")
    out = run(cmd).stdout
    j = json.loads(out[out.index("{"):])
    job = j["jobs"][0]
    if job.get("error"):
        die(f"fio error {job['error']} on {uri}")
    side = job["write"] if params["rw"] in ("write", "randwrite") else job["read"]
    return side


def measure(server, size, runtime, rows, precondition):
    uri = server.uri()
    res = {}
    filled = False
    for rid, _label, unit, params, phase in rows:
        if phase in ("full", "steady") and not filled:
            # Fill once, so reads read data and writes overwrite.
            fio(uri, size, runtime, dict(rw="write", bs="1m", iodepth=8), time_based=False)
            filled = True
        if phase == "steady" and precondition > 0:
            fio(uri, size, runtime, params, time_based=False, io_size=int(size * precondition))
        side = fio(uri, size, runtime, params)
        res[rid] = side["bw_bytes"] / 1e6 if unit == "MB/s" else side["iops"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--size", default="4G",
                    help="image size (default 4G: fresh-image rows never fill it); several, comma-separated "
                         "(e.g. 1G,16G), run every configuration at each size, interleaved, and add each "
                         "size's ratios and the largest size's IOPS over the smallest's")
    ap.add_argument("--runtime", type=int, default=8, help="seconds per fio row (default 8)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    ap.add_argument("--rows", default=",".join(r[0] for r in ROWS),
                    help="comma-separated subset of rows: " + ", ".join(r[0] for r in ROWS))
    ap.add_argument("--precondition", type=float, default=1.0,
                    help="untimed writes before each steady-state row, in image sizes (default 1)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--also", action="append", default=[], metavar="TAG=BIN",
                    help="another roamdisk binary (A/B runs): add lbs configurations as NAME@TAG to --configs")
    a = ap.parse_args()
    for spec in a.also:
        tag, _, path = spec.partition("=")
        if not tag or not os.access(path, os.X_OK):
            die(f"--also {spec}: want TAG=BIN with an executable BIN")
        ALSO[tag] = path
    for tool in ("fio", "qemu-nbd", "qemu-img", "cargo"):
        if not shutil.which(tool):
            die(f"{tool} is not installed (scripts/test installs the tools)")
    roamdisk = os.environ.get("ROAMDISK_BIN")
    if not roamdisk:
        run(["cargo", "build", "--release", "--quiet", "-p", "roamdisk"], cwd=REPO)
        roamdisk = os.path.join(REPO, "target", "release", "roamdisk")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = {z: int(z[:-1]) * units[z[-1]] if z[-1] in units else int(z) for z in a.size.split(",") if z}
    configs = [c for c in a.configs.split(",") if c]
    for n in configs:
        base, _, tag = n.partition("@")
        if base not in CONFIGS or (tag and (tag not in ALSO or CONFIGS[base][0] != "lbs")):
            die(f"unknown configuration {n} (NAME@TAG needs an lbs NAME and --also TAG=BIN)")
    want = [r for r in a.rows.split(",") if r]
    rows = [r for r in ROWS if r[0] in want]
    if len(rows) != len(want):
        die(f"unknown row in --rows {a.rows}")
    work = tempfile.mkdtemp(prefix="roamdisk-bench-lbs-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    # One column per configuration and size (NAME/SIZE when several sizes).
    multi = len(sizes) > 1
    names = [f"{n}/{z}" if multi else n for z in sizes for n in configs]
    results = {n: {r[0]: [] for r in rows} for n in names}
    try:
        for p in range(a.passes):
            order = names[p % len(names):] + names[:p % len(names)]
            for n in order:
                config, _, z = n.partition("/")
                size = sizes[z] if multi else next(iter(sizes.values()))
                s = Server(config, work, size, roamdisk).start()
                try:
                    r = measure(s, size, a.runtime, rows, a.precondition)
                finally:
                    s.stop()
                for k, v in r.items():
                    results[n][k].append(v)
                print(f"pass {p + 1}/{a.passes} {n}: " + ", ".join(f"{k}={v:.0f}" for k, v in r.items()), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {n: {k: statistics.median(v) for k, v in rows.items()} for n, rows in results.items()}
    lines = []
    # Ratio columns: MAIN / BASELINE at each size; MAIN at the largest size
    # over MAIN at the smallest.
    suffixes = [f"/{z}" for z in sizes] if multi else [""]
    ratios = [(f"{MAIN}{x} / {BASELINE}{x}", MAIN + x, BASELINE + x) for x in suffixes
              if MAIN + x in names and BASELINE + x in names]
    if multi and MAIN in configs:
        lo, hi = suffixes[0], suffixes[-1]
        ratios.append((f"{MAIN}{hi} / {MAIN}{lo}", MAIN + hi, MAIN + lo))
    head = "| row | unit | " + " | ".join(names) + " |" + "".join(f" {r[0]} |" for r in ratios)
    lines.append(head)
    lines.append("|" + " --- |" * (head.count("|") - 1))
    for rid, label, unit, _params, _phase in rows:
        cells = [f"{med[n][rid]:.0f}" for n in names]
        ratio = "".join(f" **{med[x][rid] / med[y][rid]:.2f}** |" for _, x, y in ratios)
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |" + ratio)
    if "lbs-plain" in names:
        lines.append("")
        lines.append("Cost over plain LBS (no checksum, no encryption), in % of plain LBS's median (positive = slower):")
        lines.append("")
        others = [n for n in names if n.startswith("lbs-") and n != "lbs-plain"]
        lines.append("| row | " + " | ".join(others) + " |")
        lines.append("|" + " --- |" * (len(others) + 1))
        for rid, label, unit, _params, _phase in rows:
            base = med["lbs-plain"][rid]
            lines.append(f"| {label} | " + " | ".join(f"{(1 - med[n][rid] / base) * 100:+.1f}%" for n in others) + " |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(a.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(a.out, f"lbs-{stamp}.json"), "w") as f:
        json.dump({"sizes": sizes, "runtime": a.runtime, "passes": a.passes, "precondition": a.precondition,
                   "rows": [r[0] for r in rows], "results": results, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
