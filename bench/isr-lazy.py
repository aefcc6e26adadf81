#!/usr/bin/env python3
"""ISR table, lazy rows: a suspended VM resumed lazily (postcopy from the
store) and eagerly (the whole memory image first) over a slow link.

bench/isr-resume-live.py times the eager resume of a real guest. This one
adds the lazy resume: `roamdisk resume --qmp` as QEMU's postcopy source,
the guest running before its memory has arrived, each page it touches
fetched when it does, the rest pushed behind.

  guest       qemu-system-x86_64 (TCG, --memory MiB, the test kit of
              scripts/guest-setup) on a cas session of a 256 MiB ext4
              image: it writes --blob MiB of pseudo-random data to its
              tmpfs /tmp (so it is memory the image must carry, not disk),
              prints its md5, then appends a counter line to /mnt/counter
              every 100 ms, printing `count N;` on its second serial port.
  suspend     at count 30, `roamdisk suspend SESSION --qmp QMP --to-media
              right --json [--memory-chunk-size SIZE]`.
  link        one `roamdisk store serve --limit RATE --latency LAT` per run
              (token bucket, 64 KiB burst; every run starts idle).
  conditions  lazy-none    resume, no lookaside
              lazy-right   resume --lookaside right
              eager-none   resume --eager
              eager-right  resume --eager --lookaside right
  measure     from the start of `roamdisk resume bench/live --store URL
              --session NEW --shared-cache FRESH --socket S --qmp Q --json
              [--lookaside right] [--eager]` (QEMU started with `-incoming
              defer` as soon as the disk is served, its NBD disk with
              reconnect-delay=30):
              - time to running: to the guest's next `count` line;
              - bytes before running: what the store server wrote (its
                /proc/PID/io wchar: HTTP bodies and headers) from the start
                of resume to that line, and that over the link rate (the
                physical limit of a link that carried only those bytes);
              - time to all memory: resume's own start offset (when QEMU's
                QMP answered: the `running` document's arrival less its
                `seconds`) plus `all_memory_seconds` from the `restored`
                document (eager: the `running` document's seconds: all of
                the memory is in before the VM runs);
              - from `restored.lazy`: faults, pages on demand and pushed,
                zero pages never sent (zero_chunk_pages -
                zero_chunk_pages_sent), fault latency p50/p99.
              A lazy run waits for all of the memory only when stored bytes
              / rate is under --max-wait seconds (or with --wait-all; with
              --lookaside right, whose resume set holds the memory image,
              it always waits: nothing of it crosses the link);
              otherwise it records the time to running and reports "not
              waited" for the rest.

Conditions rotate their order every run; rates below 10 Mbit/s run
--slow-runs times, the others --runs times; medians are reported.

Usage: bench/isr-lazy.py [--memory 256] [--blob 24] [--rates 1Mbit,10Mbit,100Mbit]
       [--runs 3] [--slow-runs 1] [--conds lazy-none,lazy-right,eager-none,eager-right]
       [--slow-conds CONDS] [--latency 8ms] [--memory-chunk-size 16K] [--fault-group N]
       [--wait-all] [--max-wait 900] [--working-set]
       (a 1 GiB guest: --memory 1024 --blob 300)
Writes bench/results/isr-lazy-STAMP.json.
Needs: a release build (cargo build --release -p roamdisk), scripts/guest-setup,
root (or CAP_SYS_PTRACE) for QEMU's userfaultfd.
"""
import argparse, importlib.util, json, os, shutil, signal, statistics, subprocess, sys, tempfile, threading, time

from roamdisk_bench import B, run, save_results, stop, store_serve

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    """A bench script (a file name with dashes) as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


_live = load("isr_resume_live", "isr-resume-live.py")
GUEST, rate_bits, counts, wait_for, wait_socket, json_docs = (
    _live.GUEST, _live.rate_bits, _live.counts, _live.wait_for, _live.wait_socket, _live.json_docs)

CONDS = ("lazy-none", "lazy-right", "eager-none", "eager-right")

SCRIPT = """
mount -t ext4 /dev/vda /mnt
dd if=/dev/urandom of=/tmp/blob bs=1M count={blob} 2>/dev/null
echo "md5 $(md5sum /tmp/blob | cut -d' ' -f1);"
i=0
while true; do
  i=$((i+1))
  echo "$i $(cut -d' ' -f1 /proc/uptime)" >>/mnt/counter
  echo "count $i;"
  sleep 0.1
done
"""

# Every process this bench started, killed on the way out (also on Ctrl-C,
# SIGTERM and exceptions).
PROCS = []


def track(p):
    PROCS.append(p)
    return p


def spawn(args, **kw):
    return track(subprocess.Popen(args, **kw))


def kill_all():
    for p in reversed(PROCS):
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in PROCS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    PROCS.clear()


def on_signals():
    """SIGTERM and SIGHUP end the bench as Ctrl-C does (through finally);
    Ctrl-C does even where SIGINT came ignored (a background job)."""
    def bye(sig, _frame):
        raise SystemExit(128 + sig)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, bye)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def end(p, timeout=30):
    """The clean stop (SIGTERM), then SIGKILL if it does not come."""
    if p.poll() is not None:
        return
    try:
        stop(p, timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def nbd_disk(sock, reconnect=None):
    """A -blockdev for the NBD disk on Unix socket SOCK."""
    s = f"driver=nbd,node-name=disk0,server.type=unix,server.path={sock}"
    return s + (f",reconnect-delay={reconnect}" if reconnect else "")


def file_disk(path):
    """A -blockdev for a raw file two QEMUs may open at once (migration
    with shared storage)."""
    return f"driver=file,node-name=disk0,filename={path},locking=off"


def qemu(d, tag, memory, script, disk, incoming=False, extra=()):
    """Start the guest's QEMU on SCRIPT with its files in D (TAG-*) and
    DISK (a -blockdev, node disk0) as its virtio disk; returns (process,
    QMP socket, output file). bench/isr-resume-live.py's qemu(), the disk
    given."""
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
            "-blockdev", disk, "-device", "virtio-blk-pci,drive=disk0", *extra]
    if incoming:
        args += ["-incoming", "defer"]
    p = spawn(args, stdout=open(os.path.join(d, f"{tag}-qemu.log"), "w"), stderr=subprocess.STDOUT)
    return p, qmp, out


def md5_of(out):
    try:
        for l in open(out, errors="replace"):
            l = l.strip()
            if l.startswith("md5 ") and l.endswith(";"):
                return l[4:-1]
    except FileNotFoundError:
        pass
    return None


def wchar(pid):
    """Bytes process PID has written so far (to sockets, pipes and files)."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise SystemExit(f"no wchar in /proc/{pid}/io")


def drain(pipe):
    """Read PIPE to its end in the background (a full pipe would block the
    process writing it)."""
    threading.Thread(target=lambda: [None for _ in pipe], daemon=True).start()


def write_script(path, blob):
    with open(path, "w") as f:
        f.write(SCRIPT.format(blob=blob))
    return path


def base_image(d):
    """The guest's disk before it boots: a 256 MiB ext4 image (made once)."""
    img = os.path.join(d, "base.raw")
    if not os.path.exists(img):
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", img], check=True)
    return img


def boot_and_suspend(d, store, memory, script, blob, media=None, chunk_size=None,
                     image="bench/live", base=None):
    """Commit the base image (BASE, else base_image(D)) to STORE as IMAGE,
    boot the guest on a cas session of it (files in D) and suspend it at
    count 30 (--to-media MEDIA if given); returns (what the suspend
    reported, the blob's md5)."""
    run(B, "-q", "commit", f"raw:{base or base_image(d)}", "--to", image, "--store", store)
    sess = os.path.join(d, "a-sess")
    run(B, "-q", "checkout", image, "--session", sess, "--store", store)
    sock = os.path.join(d, "a.sock")
    srv = spawn([B, "-q", "serve", f"cas[shared-cache={d}/a-shared]:{sess}", "--socket", sock],
                stderr=subprocess.DEVNULL)
    wait_socket(sock, srv, "the server on host A")
    g, qmp, out = qemu(d, "a", memory, script, nbd_disk(sock))
    wait_for(lambda: 30 in counts(out) or g.poll() is not None, 300 + 2 * blob,
             "the guest on host A to count to 30")
    if g.poll() is not None:
        raise SystemExit(f"QEMU on host A exited; see {d}/a-qemu.log")
    args = [B, "suspend", sess, "--qmp", qmp, "--store", store, "--json"]
    if media:
        args += ["--to-media", media]
    if chunk_size:
        args += ["--memory-chunk-size", chunk_size]
    rep = json.loads(run(*args))
    g.wait(timeout=60)
    srv.wait(timeout=60)
    return rep, md5_of(out)


def resume_and_resuspend(d, store, memory, script, media):
    """One lazy resume of bench/live at full speed (it records the pages
    the guest touches first: the memory working set), the guest left
    counting 20 s, then suspended again (--to-media MEDIA): the version
    the runs then resume carries that working set. What that suspend
    reported."""
    h = os.path.join(d, "b-ws")
    os.makedirs(h)
    sock, sess = os.path.join(h, "b.sock"), os.path.join(h, "sess")
    r = spawn([B, "resume", "bench/live", "--store", store, "--session", sess,
               "--shared-cache", os.path.join(h, "shared"), "--socket", sock,
               "--qmp", os.path.join(h, "b.qmp"), "--json"],
              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    docs = Docs(r.stdout)
    wait_socket(sock, r, "roamdisk resume")
    g, qmp, out = qemu(h, "b", memory, script, nbd_disk(sock, 30), incoming=True)
    wait_for(lambda: docs.has("restored") or r.poll() is not None, 900, "all of the memory")
    n = max(counts(out) or [0])
    wait_for(lambda: max(counts(out) or [0]) >= n + 150 or g.poll() is not None, 120,
             "the guest to count on")
    rep = json.loads(run(B, "suspend", sess, "--qmp", qmp, "--store", store, "--json",
                         "--to-media", media))
    g.wait(timeout=60)
    r.wait(timeout=60)
    return rep


def stored_bytes(rep):
    """The memory image's bytes in the store (stored sizes if the suspend
    says, else the bytes of its stored chunks)."""
    live = rep.get("live") or {}
    return (live.get("upload") or {}).get("uploaded_bytes") or live.get("data_bytes") or live.get("bytes") or 0


class Docs:
    """The JSON documents a process prints on stdout (pretty-printed, each
    ending with a line `}`), each with the time it was complete."""

    def __init__(self, pipe):
        self.docs, self.text, self.lock = [], [], threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe):
        pending = []
        for line in pipe:
            t = time.time()
            pending.append(line)
            with self.lock:
                self.text.append(line)
            if line.rstrip() == "}":
                try:
                    doc = json.loads("".join(pending))
                except json.JSONDecodeError:
                    continue
                pending = []
                with self.lock:
                    self.docs.append((t, doc))

    def get(self, key):
        """(time, value) of the first document with top-level KEY."""
        with self.lock:
            return next(((t, x[key]) for t, x in self.docs if key in x), (None, None))

    def has(self, key):
        return self.get(key)[0] is not None


def one(d, store, rate, cond, memory, script, n, latency="8ms", wait_all=False,
        max_wait=900.0, est=0.0, image="bench/live", media=None, fault_group=None):
    """One resume of IMAGE under COND over a fresh link at RATE; EST: the
    seconds its stored memory takes at RATE (whether to wait for all of
    it). Returns the run's numbers."""
    eager, right = cond.startswith("eager"), cond.endswith("-right")
    link, url = store_serve(store, rate, latency)
    track(link)
    drain(link.stderr)
    h = os.path.join(d, f"b-{n}")
    os.makedirs(h)
    sock = os.path.join(h, "b.sock")
    args = [B, "resume", image, "--store", url, "--session", os.path.join(h, "sess"),
            "--shared-cache", os.path.join(h, "shared"), "--socket", sock,
            "--qmp", os.path.join(h, "b.qmp"), "--json"]
    if right:
        args += ["--lookaside", media or os.path.join(d, "right")]
    if eager:
        args += ["--eager"]
    if fault_group is not None and not eager:
        args += ["--fault-group", str(fault_group)]
    bps = rate_bits(rate)
    wait = not eager and (wait_all or est < max_wait)
    w0 = wchar(link.pid)
    t0 = time.time()
    r = spawn(args, stdout=subprocess.PIPE, stderr=open(os.path.join(h, "resume.log"), "w"), text=True)
    docs = Docs(r.stdout)
    g = None
    try:
        wait_socket(sock, r, "roamdisk resume")
        g, _, out = qemu(h, "b", memory, script, nbd_disk(sock, 30), incoming=True)
        wait_for(lambda: counts(out) or g.poll() is not None or r.poll() is not None,
                 max(600, 4 * est + 120), "the guest to run again")
        t_run = time.time()
        w_run = wchar(link.pid)
        if not counts(out):
            raise SystemExit(f"QEMU or resume ended early; see {h}")
        first = counts(out)[0]
        if wait or eager:
            wait_for(lambda: docs.has("restored") or r.poll() is not None or g.poll() is not None,
                     max(600, 4 * est + 120), "all of the memory")
        t_done = docs.get("restored")[0]
        # Still running once all of it is in?
        last = max(counts(out))
        wait_for(lambda: max(counts(out)) > last or g.poll() is not None, 30, "the guest to count on")
        runs_on = g.poll() is None
        w_end = wchar(link.pid)
        g.kill()
        g.wait()
        g = None
        end(r)
        docs.thread.join(timeout=10)
    finally:
        if g:
            g.kill()
        if r.poll() is None:
            r.kill()
        link.kill()
        link.wait()
    t_running_doc, running = docs.get("running")
    _, restored = docs.get("restored")
    running, restored = running or {}, restored or {}
    # When QEMU's QMP answered, from resume's start: its clock starts there.
    offset = t_running_doc - t0 - running["seconds"] if t_running_doc else None
    if eager:
        all_mem = offset + running["seconds"] if offset is not None else None
    elif restored.get("all_memory_seconds") is not None and offset is not None:
        all_mem = offset + restored["all_memory_seconds"]
    else:
        all_mem = None
    lz = restored.get("lazy") or {}
    src = lz.get("sources") or {}
    res = {"rate": rate, "cond": cond, "seconds": t_run - t0, "first_count": first,
           "mode": running.get("mode"), "state": running.get("state"),
           "eager_because": running.get("eager_because"),
           "waited": wait or eager, "qmp_offset": offset,
           "running_seconds": running.get("seconds"),
           "all_memory_seconds": all_mem,
           "restored_at": t_done - t0 if t_done else None,
           "bytes_before_running": w_run - w0, "bytes_total": w_end - w0,
           "physical_limit": (w_run - w0) * 8 / bps,
           "runs_on": runs_on,
           "faults": lz.get("faults"), "duplicate_requests": lz.get("duplicate_requests"),
           "demand_pages": lz.get("demand_pages"), "pushed_pages": lz.get("pushed_pages"),
           "zero_records": lz.get("zero_records"), "zero_chunk_pages": lz.get("zero_chunk_pages"),
           "zero_chunk_pages_sent": lz.get("zero_chunk_pages_sent"),
           "never_sent": (lz["zero_chunk_pages"] - lz["zero_chunk_pages_sent"]) if lz else None,
           "demand_bytes": lz.get("demand_bytes"), "pushed_bytes": lz.get("pushed_bytes"),
           "missing_pages": lz.get("missing_pages"), "complete": lz.get("complete"),
           "fault_p50_us": lz.get("fault_p50_us"), "fault_p99_us": lz.get("fault_p99_us"),
           "fault_max_us": lz.get("fault_max_us"), "lazy_seconds": lz.get("seconds"),
           "memory_store_bytes": (src or restored.get("memory") or running.get("memory") or {}).get("store_bytes"),
           "memory_lookaside_bytes": (src or restored.get("memory") or running.get("memory") or {}).get("lookaside_bytes"),
           "memory_shared_cache_bytes": (src or restored.get("memory") or running.get("memory") or {}).get("shared_cache_bytes"),
           "running_lazy": running.get("lazy"), "restored": restored}
    shutil.rmtree(h, ignore_errors=True)
    return res


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def table(results, rates, conds, latency):
    print(f"\n| link, {latency} | resume | time to running (s) | time to all memory (s) "
          "| bytes before running | ÷ rate (s) | pages on demand | pushed | zero, never sent "
          "| fault p50 / p99 (ms) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in rates:
        for cond in conds:
            rs = [r for r in results if r["rate"] == rate and r["cond"] == cond]
            if not rs:
                continue
            m = {k: median(r[k] for r in rs) for k in (
                "seconds", "all_memory_seconds", "bytes_before_running", "physical_limit",
                "demand_pages", "pushed_pages", "never_sent", "fault_p50_us", "fault_p99_us")}
            lazy = cond.startswith("lazy")
            waited = any(r["waited"] for r in rs)
            rest = "not waited" if lazy and not waited else "-"
            p = (f"{m['fault_p50_us'] / 1000:.1f} / {m['fault_p99_us'] / 1000:.1f}"
                 if m["fault_p50_us"] is not None else rest)
            print(f"| {rate} | {cond} | {m['seconds']:.2f} | {fmt(m['all_memory_seconds'], '.2f', rest)} "
                  f"| {m['bytes_before_running'] / 1e6:.2f} MB | {m['physical_limit']:.2f} "
                  f"| {fmt(m['demand_pages'], '.0f', rest)} | {fmt(m['pushed_pages'], '.0f', rest)} "
                  f"| {fmt(m['never_sent'], '.0f', rest)} | {p} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory", type=int, default=256, help="guest RAM, MiB")
    ap.add_argument("--blob", type=int, help="MiB of random data in the guest's /tmp "
                    "(default 24, or 300 for a guest of 1 GiB or more)")
    ap.add_argument("--rates", default="1Mbit,10Mbit,100Mbit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slow-runs", type=int, default=1, help="runs at rates under 10 Mbit/s")
    ap.add_argument("--conds", default=",".join(CONDS))
    ap.add_argument("--slow-conds", help="the conditions run at rates under 10 Mbit/s "
                    "(default: --conds; an eager resume of 1 GiB at 1 Mbit/s takes ~45 min)")
    ap.add_argument("--fault-group", type=int,
                    help="resume --fault-group N for the lazy conditions (default: auto)")
    ap.add_argument("--latency", default="8ms", help="store serve --latency")
    ap.add_argument("--memory-chunk-size", help="suspend --memory-chunk-size (default: its own)")
    ap.add_argument("--wait-all", action="store_true",
                    help="wait for all of the memory at every rate")
    ap.add_argument("--max-wait", type=float, default=900,
                    help="wait for all of the memory only if stored bytes / rate is under this (s)")
    ap.add_argument("--working-set", action="store_true",
                    help="measure a version that carries a memory working set: one lazy "
                    "resume and suspend first")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.blob is None:
        a.blob = 300 if a.memory >= 1024 else 24
    conds = a.conds.split(",")
    slow_conds = a.slow_conds.split(",") if a.slow_conds else conds
    for c in conds + slow_conds:
        if c not in CONDS:
            raise SystemExit(f"--conds: {c}? one of {', '.join(CONDS)}")
    rates = a.rates.split(",")
    for r in rates:
        rate_bits(r)
    on_signals()
    d = tempfile.mkdtemp(prefix="isr-lazy-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    ok = False
    try:
        store = os.path.join(d, "store")
        run(B, "-q", "store", "init", store)
        script = write_script(os.path.join(d, "script.sh"), a.blob)
        rep, md5 = boot_and_suspend(d, store, a.memory, script, a.blob, os.path.join(d, "right"),
                                    a.memory_chunk_size)
        media = None
        if a.working_set:
            media = os.path.join(d, "right-ws")
            rep = resume_and_resuspend(d, store, a.memory, script, media)
            print(f"suspended again after a lazy resume: memory working set "
                  f"{(rep.get('live') or {}).get('working_set_chunks')} chunks, "
                  f"{(rep.get('live') or {}).get('upload', {}).get('reused_objects')} memory "
                  f"objects reused", file=sys.stderr)
        live, rs = rep.get("live") or {}, rep.get("resume_set") or {}
        stored = stored_bytes(rep)
        print(f"suspended: RAM {live.get('ram_bytes')} B, stream {live.get('bytes')} B, "
              f"{live.get('data_bytes')} B in stored chunks ({stored} B stored), "
              f"{live.get('zero_pages')} zero pages; resume set {rs.get('copied')} objects, "
              f"{rs.get('copied_bytes')} B; blob md5 {md5}", file=sys.stderr)
        results, n = [], 0
        for rate in rates:
            bps = rate_bits(rate)
            est = stored * 8 / bps
            runs = a.slow_runs if bps < 10e6 else a.runs
            cs = slow_conds if bps < 10e6 else conds
            for k in range(runs):
                order = cs[k % len(cs):] + cs[:k % len(cs)]
                for cond in order:
                    n += 1
                    # With the resume set the memory comes from the medium.
                    e = 0.0 if cond.endswith("-right") and rs.get("memory_chunks") else est
                    res = one(d, store, rate, cond, a.memory, script, n, a.latency, a.wait_all,
                              a.max_wait, e, media=media, fault_group=a.fault_group)
                    print(json.dumps({k: v for k, v in res.items()
                                      if k not in ("restored", "running_lazy")}), file=sys.stderr)
                    results.append(res)
        table(results, rates, conds, a.latency)
        save_results(a.out, "isr-lazy", {"suspend": rep, "blob_md5": md5, "stored_bytes": stored,
                                         "runs": results, "args": vars(a)})
        ok = True
    finally:
        kill_all()
        if ok:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"the bench's files are kept in {d}", file=sys.stderr)


if __name__ == "__main__":
    main()
