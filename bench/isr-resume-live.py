#!/usr/bin/env python3
"""ISR resume experiment with a real, running VM (issue 24; seed: ISR
lookaside caching, Figure 7).

bench/isr-resume.py times a resume of a made-up memory file. This one
suspends a real QEMU guest and times how long the guest takes to run again
on a new host over a slow link, with and without its resume set as a
lookaside medium.

  guest       qemu-system-x86_64 (TCG, --memory MiB, the test kit of
              scripts/guest-setup) on a cas session of a 256 MiB ext4
              image: it writes 24 MiB of files and syncs, then appends a
              counter line every 100 ms, printing `count N;` on its second
              serial port.
  suspend     at count 30, `roamdisk suspend SESSION --qmp QMP --to-media
              right`: the VM's migration stream goes into the store as the
              memory image; the resume set (memory image, working set, the
              chunks the guest wrote) goes to `right`.
  link        one `roamdisk store serve --limit RATE --latency 8ms` per run
              (token bucket, 64 KiB burst; every run starts idle)
  conditions  none     resume with no lookaside
              right    --lookaside right
  measure     from the start of `roamdisk resume bench/live --store URL
              --session NEW --shared-cache FRESH --socket S --qmp Q
              [--lookaside right] --json` (QEMU started with `-incoming
              defer` as soon as the disk is served) to the guest's next
              `count` line: the guest running again. Bytes fetched over the
              link, from resume's JSON (memory image and working set).

Conditions alternate (their order rotates every run); rates below 10 Mbit/s
run --slow-runs times, the others --runs times; medians are reported.
Target (issue 24): none/right >= 26x at 1 Mbit/s (the seed: 317 s / 12 s).

Usage: bench/isr-resume-live.py [--rates 1Mbit,10Mbit,100Mbit] [--runs 3]
       [--slow-runs 1] [--memory 256]
Writes bench/results/isr-resume-live-STAMP.json.
Needs: a release build (cargo build --release -p roamdisk) and
scripts/guest-setup.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, threading, time

from roamdisk_bench import B, run, save_results, stop, store_serve

GUEST = os.environ.get("ROAMDISK_GUEST_DIR", os.path.expanduser("~/.cache/roamdisk/guest"))
SEED = {1e6: (317, 12), 10e6: (39, 12)}

SCRIPT = """
mount -t ext4 /dev/vda /mnt
mkdir -p /mnt/data
for i in 1 2 3 4 5 6; do dd if=/dev/urandom of=/mnt/data/f$i bs=64k count=64 2>/dev/null; done
sync
cat /mnt/data/* >/dev/null
i=0
while true; do
  i=$((i+1))
  echo "$i $(cut -d' ' -f1 /proc/uptime)" >>/mnt/counter
  echo "count $i;"
  sleep 0.1
done
"""


def rate_bits(s):
    for suffix, mult in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    raise SystemExit(f"rate {s}: give it in kbit, Mbit or Gbit")


def qemu(d, tag, sock, memory, incoming, script):
    """Start the guest's QEMU on SCRIPT with its files in D (TAG-*);
    returns (process, QMP socket, output file)."""
    out, qmp = os.path.join(d, f"{tag}-out.log"), os.path.join(d, f"{tag}.qmp")
    for f in (out, qmp):
        if os.path.exists(f):
            os.unlink(f)
    args = [os.path.join(GUEST, "qemu-system-x86_64"), "-accel", "tcg", "-cpu", "max", "-M", "pc",
            "-m", str(memory), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", os.path.join(GUEST, "kernel/vmlinuz"),
            "-initrd", os.path.join(GUEST, "initramfs.gz"), "-append", "console=ttyS0 panic=-1",
            "-serial", f"file:{os.path.join(d, tag + '-console.log')}", "-serial", f"file:{out}",
            "-qmp", f"unix:{qmp},server=on,wait=off",
            "-fw_cfg", f"name=opt/roamdisk/script,file={script}",
            "-blockdev", f"driver=nbd,node-name=disk0,server.type=unix,server.path={sock}",
            "-device", "virtio-blk-pci,drive=disk0"]
    if incoming:
        args += ["-incoming", "defer"]
    p = subprocess.Popen(args, stdout=open(os.path.join(d, f"{tag}-qemu.log"), "w"),
                         stderr=subprocess.STDOUT)
    return p, qmp, out


def counts(path):
    try:
        text = open(path, errors="replace").read()
    except FileNotFoundError:
        return []
    return [int(l.strip()[6:-1]) for l in text.splitlines()
            if l.strip().startswith("count ") and l.strip().endswith(";")]


def wait_for(cond, seconds, what):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > seconds:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_socket(path, proc, what):
    wait_for(lambda: os.path.exists(path) or proc.poll() is not None, 60, what)
    if proc.poll() is not None:
        raise SystemExit(f"{what} exited early")


def json_docs(text):
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        j = text.find("{", i)
        if j < 0:
            break
        try:
            doc, i = dec.raw_decode(text, j)
            out.append(doc)
        except json.JSONDecodeError:
            i = j + 1
    return out


def setup(d, store, memory):
    """The suspended guest: returns what the suspend reported."""
    open(os.path.join(d, "script.sh"), "w").write(SCRIPT)
    img = os.path.join(d, "base.raw")
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", img], check=True)
    run(B, "-q", "commit", f"raw:{img}", "--to", "bench/live", "--store", store)
    sess = os.path.join(d, "a-sess")
    run(B, "-q", "checkout", "bench/live", "--session", sess, "--store", store)
    sock = os.path.join(d, "a.sock")
    srv = subprocess.Popen([B, "-q", "serve", f"cas[shared-cache={d}/a-shared]:{sess}",
                            "--socket", sock], stderr=subprocess.DEVNULL)
    wait_socket(sock, srv, "the server on host A")
    g, qmp, out = qemu(d, "a", sock, memory, False, os.path.join(d, "script.sh"))
    wait_for(lambda: 30 in counts(out), 300, "the guest on host A to count to 30")
    rep = json.loads(run(B, "suspend", sess, "--qmp", qmp, "--to-media",
                         os.path.join(d, "right"), "--store", store, "--json"))
    g.wait(timeout=60)
    srv.wait(timeout=60)
    return rep


def one(d, store, rate, cond, memory, n):
    link, url = store_serve(store, rate, "8ms")
    h = os.path.join(d, f"b-{n}")
    os.makedirs(h)
    sock = os.path.join(h, "b.sock")
    args = [B, "resume", "bench/live", "--store", url, "--session", os.path.join(h, "sess"),
            "--shared-cache", os.path.join(h, "shared"), "--socket", sock,
            "--qmp", os.path.join(h, "b.qmp"), "--json"]
    if cond == "right":
        args += ["--lookaside", os.path.join(d, "right")]
    t0 = time.time()
    r = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    text = []
    reader = threading.Thread(target=lambda: text.extend(r.stdout), daemon=True)
    reader.start()
    g = None
    try:
        wait_socket(sock, r, "roamdisk resume")
        g, _, out = qemu(h, "b", sock, memory, True, os.path.join(d, "script.sh"))
        wait_for(lambda: counts(out) or g.poll() is not None or r.poll() is not None, 1200,
                 "the guest to run again")
        if g.poll() is not None or r.poll() is not None:
            raise SystemExit(f"QEMU or resume ended early; see {h}")
        took = time.time() - t0
        first = counts(out)[0]
        # The working-set report comes once it is all here.
        wait_for(lambda: '"working_set"' in "".join(text) or r.poll() is not None, 600,
                 "the working set")
        g.kill()
        g.wait()
        g = None
        stop(r)
        reader.join(timeout=10)
        docs = json_docs("".join(text))
    finally:
        if g:
            g.kill()
        if r.poll() is None:
            r.kill()
        link.kill()
        link.wait()
    restored = next((x["restored"] for x in docs if "restored" in x), {})
    report = next((x for x in docs if "working_set" in x), {})
    mem = restored.get("memory", {})
    ws = report.get("working_set", {}).get("got", {})
    res = {"rate": rate, "cond": cond, "seconds": took, "first_count": first,
           "memory_fetched": mem.get("store_bytes"), "memory_lookaside": mem.get("lookaside_bytes"),
           "ws_fetched": ws.get("store_bytes"), "ws_lookaside": ws.get("lookaside_bytes"),
           "restore_seconds": restored.get("seconds")}
    shutil.rmtree(h, ignore_errors=True)
    return res



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1Mbit,10Mbit,100Mbit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slow-runs", type=int, default=1)
    ap.add_argument("--memory", type=int, default=256, help="guest RAM, MiB")
    ap.add_argument("--out")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="isr-live-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    store = os.path.join(d, "store")
    run(B, "-q", "store", "init", store)
    rep = setup(d, store, a.memory)
    rs = rep.get("resume_set", {})
    print(f"suspended: memory image {rep['live']['bytes']} B; resume set "
          f"{rs.get('copied')} objects, {rs.get('copied_bytes')} B", file=sys.stderr)
    results, n = [], 0
    for rate in a.rates.split(","):
        runs = a.slow_runs if rate_bits(rate) < 10e6 else a.runs
        for k in range(runs):
            for cond in (["none", "right"] if k % 2 == 0 else ["right", "none"]):
                n += 1
                res = one(d, store, rate, cond, a.memory, n)
                print(json.dumps(res), file=sys.stderr)
                results.append(res)
    print("\n| link, 8 ms | no lookaside (s) | its resume set (s) | none / right | bytes fetched: none | bytes fetched: right | seed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in a.rates.split(","):
        med = {c: statistics.median(r["seconds"] for r in results if r["rate"] == rate and r["cond"] == c)
               for c in ("none", "right")}
        fetched = {c: statistics.median((r["memory_fetched"] or 0) + (r["ws_fetched"] or 0)
                                        for r in results if r["rate"] == rate and r["cond"] == c)
                   for c in ("none", "right")}
        seed = SEED.get(rate_bits(rate))
        seed_s = f"{seed[0]} s / {seed[1]} s = {seed[0] / seed[1]:.1f}x" if seed else "-"
        print(f"| {rate} | {med['none']:.2f} | {med['right']:.2f} | **{med['none'] / med['right']:.0f}x** "
              f"| {fetched['none'] / 1e6:.1f} MB | {fetched['right'] / 1e6:.2f} MB | {seed_s} |")
    save_results(a.out, "isr-resume-live", {"suspend": rep, "runs": results,
                                             "args": vars(a)})
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
