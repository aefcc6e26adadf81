#!/usr/bin/env python3
"""TRIM's effect on LBS's write amplification, with a real guest and ext4.

For each mode, a fresh LBS image (default 128 MiB logical, 12% spare) is
served by `roamdisk serve lbs:IMAGE` to the test guest (scripts/guest-setup:
qemu TCG, Debian kernel, busybox; see docs/testing-guest.md) and:

1. setup boot: mke2fs, one file of random bytes filling the file system
   until ENOSPC (every block of the disk has been written: a disk that was
   full once), that file deleted, then 96 KiB files of random bytes up to
   --use percent of what that file held (the file system's room for files);
2. measured boot (a new server, so LBS's counters count this phase only):
   --rounds rounds of deleting --churn percent of the files, chosen at
   random (`shuf`), and writing as many new ones; `sync` each round.

Modes differ only in what tells LBS that deleted blocks are dead:
  fstrim   discards reach LBS (qemu `discard=unmap`); `fstrim` after the
           delete of setup and after each round's deletes
  discard  discards reach LBS; ext4 mounted `-o discard` (online discard at
           each journal commit)
  none     qemu drops every discard (its default, `discard=ignore`): LBS
           learns a block is dead only when the guest writes it again

The server's LBS counters, printed as it stops (`roamdisk: lbs counters`),
give the write amplification of the measured boot: blocks written to the
data file per block the guest wrote, minus 1; blocks the collector moved;
clusters it collected; and the blocks LBS maps at the end next to what ext4
uses.

Usage: bench/lbs-trim.py [--size 128M] [--use 75] [--churn 10] [--rounds 20]
       [--modes fstrim,discard,none] [--passes 1] [--out FILE]
Only the Python standard library; results as JSON in bench/results/.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roamdisk_bench import B, parse_size, run, save_results, stop, wait_unix_listening  # noqa: E402

GUEST_DIR = os.environ.get("ROAMDISK_GUEST_DIR", os.path.expanduser("~/.cache/roamdisk/guest"))
FILE_KIB = 96

SETUP = r"""
mke2fs -q -F -t ext4 -b 4096 -E nodiscard /dev/vda
mount -t ext4 {mount_opts} /dev/vda /mnt
dd if=/dev/urandom of=/mnt/fill bs=1M 2>/dev/null || true
sync
set -- $(df -k /mnt | tail -n 1)
echo "FILLED $3 $4"
rm /mnt/fill
sync
{trim}
mkdir /mnt/d
files=$(($3 * {use} / 100 / {file_kib}))
echo "FILES $files"
i=0
while [ $i -lt $files ]; do
  dd if=/dev/urandom of=/mnt/d/f$i bs={file_kib}k count=1 2>/dev/null
  i=$((i + 1))
done
sync
set -- $(df -k /mnt | tail -n 1)
echo "USED $3 $4"
umount /mnt
"""

ROUNDS = r"""
mount -t ext4 {mount_opts} /dev/vda /mnt
n={files}
r=0
while [ $r -lt {rounds} ]; do
  for f in $(ls /mnt/d | shuf -n {churn}); do rm /mnt/d/$f; done
  sync
  {trim}
  k=0
  while [ $k -lt {churn} ]; do
    dd if=/dev/urandom of=/mnt/d/f$n bs={file_kib}k count=1 2>/dev/null
    n=$((n + 1))
    k=$((k + 1))
  done
  sync
  r=$((r + 1))
done
set -- $(df -k /mnt | tail -n 1)
echo "USED $3 $4"
umount /mnt
"""


def qemu_args(script, console, output, disk):
    return [
        os.path.join(GUEST_DIR, "qemu-system-x86_64"),
        "-accel", "tcg", "-cpu", "max", "-M", "pc", "-m", "256",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-kernel", os.path.join(GUEST_DIR, "kernel/vmlinuz"),
        "-initrd", os.path.join(GUEST_DIR, "initramfs.gz"),
        "-append", "console=ttyS0 panic=-1",
        "-serial", f"file:{console}", "-serial", f"file:{output}",
        "-fw_cfg", f"name=opt/roamdisk/script,file={script}",
        "-blockdev", disk, "-device", "virtio-blk-pci,drive=disk0",
    ]


def boot(work, name, script, sock, discard):
    """Run SCRIPT in the guest on the export at SOCK; returns its output
    lines and the seconds it took."""
    path = os.path.join(work, f"{name}.sh")
    with open(path, "w") as f:
        f.write(script)
    console = os.path.join(work, f"{name}.console")
    output = os.path.join(work, f"{name}.out")
    disk = f"driver=nbd,node-name=disk0,server.type=unix,server.path={sock}"
    if discard:
        disk += ",discard=unmap"
    t0 = time.time()
    subprocess.run(qemu_args(path, console, output, disk), check=True, timeout=900,
                   stdin=subprocess.DEVNULL, capture_output=True)
    secs = time.time() - t0
    text = open(output, errors="replace").read().replace("\r", "")
    if "roamdisk-guest: exit 0" not in text:
        sys.stderr.write(open(console, errors="replace").read()[-4000:])
        raise SystemExit(f"guest {name} failed")
    lines = text.split("roamdisk-guest: start\n", 1)[1].splitlines()
    return [l for l in lines if not l.startswith("roamdisk-guest:")], secs


def served(img, sock, log):
    """`roamdisk serve lbs:IMG`, its stderr (the counters at stop) in LOG."""
    p = subprocess.Popen([B, "serve", f"lbs:{img}", "--socket", sock],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"))
    wait_unix_listening(p, sock, "roamdisk serve")
    return p


def counters(log):
    for line in open(log):
        m = re.search(r"roamdisk: lbs counters of [^:]*: (\{.*\})", line)
        if m:
            return json.loads(m.group(1))
    raise SystemExit(f"no LBS counters in {log}")


def value(lines, prefix):
    for line in lines:
        if line.startswith(prefix):
            return [int(w) for w in line[len(prefix):].split()]
    raise SystemExit(f"no {prefix!r} line in the guest's output: {lines}")


def one(mode, a, work):
    work = tempfile.mkdtemp(prefix=f"{mode}-", dir=work)
    img = os.path.join(work, f"{mode}.lbsd")
    run(B, "-q", "lbs", "create", img, "--size", a.size)
    blocks = parse_size(a.size) // 4096
    clusters = json.loads(run(B, "lbs", "info", img, "--json"))["clusters"]
    sock = os.path.join(work, f"{mode}.sock")
    discard = mode != "none"
    mount_opts = "-o discard" if mode == "discard" else ""
    trim = "fstrim /mnt" if mode == "fstrim" else ""

    log = os.path.join(work, f"{mode}-setup.log")
    p = served(img, sock, log)
    setup, setup_secs = boot(work, f"{mode}-setup", SETUP.format(
        mount_opts=mount_opts, trim=trim, use=a.use, file_kib=FILE_KIB), sock, discard)
    stop(p)
    c0 = counters(log)
    files = value(setup, "FILES ")[0]
    churn = max(1, files * a.churn // 100)

    log = os.path.join(work, f"{mode}-rounds.log")
    p = served(img, sock, log)
    lines, secs = boot(work, f"{mode}-rounds", ROUNDS.format(
        mount_opts=mount_opts, trim=trim, files=files, churn=churn, rounds=a.rounds,
        file_kib=FILE_KIB), sock, discard)
    stop(p)
    c = counters(log)
    used_kib, avail_kib = value(lines, "USED ")
    client, physical = c["client_blocks"], c["physical_blocks"]
    r = {
        "mode": mode, "logical_blocks": blocks, "clusters": clusters,
        "setup_filled_kib": value(setup, "FILLED ")[0], "setup_client_blocks": c0["client_blocks"],
        "setup_mapped_blocks": c0["mapped_blocks"], "files": files, "churn_files": churn,
        "rounds": a.rounds, "fs_used_kib": used_kib, "fs_avail_kib": avail_kib,
        "client_blocks": client, "physical_blocks": physical, "gc_moved": c["gc_moved"],
        "gc_clusters": c["gc_clusters"], "mapped_blocks_end": c["mapped_blocks"],
        "write_amplification_pct": round((physical / client - 1) * 100, 2),
        "moved_per_client_block": round(c["gc_moved"] / client, 3),
        "guest_seconds": round(secs, 1), "setup_seconds": round(setup_secs, 1),
    }
    print(json.dumps(r), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="128M")
    ap.add_argument("--use", type=int, default=75, help="percent of the file system's room in files")
    ap.add_argument("--churn", type=int, default=10, help="percent of the files replaced per round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--modes", default="fstrim,discard,none")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    for f in ("qemu-system-x86_64", "kernel/vmlinuz", "initramfs.gz"):
        if not os.path.exists(os.path.join(GUEST_DIR, f)):
            raise SystemExit(f"{GUEST_DIR}/{f} is missing: run scripts/guest-setup")
    results = []
    with tempfile.TemporaryDirectory(prefix="roamdisk-lbs-trim-") as work:
        for _ in range(a.passes):
            for mode in a.modes.split(","):
                results.append(one(mode, a, work))
    print()
    print("| mode | guest wrote (blocks) | GC moved | GC clusters | write amplification | LBS maps at the end | ext4 file blocks (df) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in a.modes.split(","):
        rs = [r for r in results if r["mode"] == mode]
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {mode} | {med('client_blocks'):.0f} | {med('gc_moved'):.0f} | {med('gc_clusters'):.0f} "
              f"| {med('write_amplification_pct'):.1f}% | {med('mapped_blocks_end'):.0f} "
              f"| {med('fs_used_kib') // 4:.0f} |")
    save_results(a.out, "lbs-trim", {"args": vars(a), "results": results})


if __name__ == "__main__":
    main()
