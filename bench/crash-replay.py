#!/usr/bin/env python3
"""Power cuts at every file-system step of the local chunk store and the
shared chunk cache, found in an strace of the real `roamdisk` commands.

    python3 bench/crash-replay.py --workload store --seeds 45 --json out.json  # every point
    python3 bench/crash-replay.py --seeds 2 --states 50 --seed 100             # the CI's run

A workload (a bash script of `roamdisk` commands, some of them at once)
runs once under `strace -f`. bench/crash_trace.py turns the trace into the
ordered file-system steps the commands made under the traced folder (the
store, or the shared cache) and builds the tree a power cut would leave
after each step: only what was synced (`durable`), everything (`all`: a
killed process), and random mixes of lost, kept and torn unsynced writes
with a random prefix of unsynced name changes (`random`). The model of
what a file system keeps is in crash_trace.py's docstring and
docs/BENCHMARKS.md. Each distinct tree is written to the traced folder's
own path and checked with the real binary:

store:  `store verify` finds nothing bad or missing; every version a commit
        reported is in its catalog (unless an `rm` of it had started), a
        reported `rm` stays done and a reported tag stays; every version in
        any catalog checks out byte for byte as one of the images
        committed; every fifth tree takes a new commit, a gc and a second
        verify. Trees are written a day old, so that gc takes what cut
        commits left.
cache:  `cache status` opens it; `cache verify` finds no damaged chunk (a
        hit is served without hashing, so a torn chunk file under its name
        would be served as wrong data); every reported hoard not yet being
        released is still complete; every reported release stays done;
        every version checks out byte for byte through the cache.

Exits 1 if any tree fails; the first failing trees are kept for study.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crash_trace as ct  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def image(path, size, seed, base=None, changes=0):
    """A disk image: random bytes, or `base` with `changes` 64 KiB pieces
    rewritten (dedup between versions), some of it zeroes."""
    rng = random.Random(seed)
    if base is None:
        data = bytearray(rng.randbytes(size))
        data[size // 4 : size // 4 + 128 * 1024] = bytes(128 * 1024)
    else:
        with open(base, "rb") as f:
            data = bytearray(f.read())
        for _ in range(changes):
            off = rng.randrange(0, size // 65536) * 65536
            data[off : off + 65536] = rng.randbytes(65536)
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


SED_ID = "sed -n 's/^committed [^@]*@\\([0-9a-f]*\\).*/\\1/p'"


class Workload:
    """Set-up, the traced script, and the checks of one workload. Each
    command runs as `rd-step-N` (bash's `exec -a`), so the trace names
    which step every process was."""

    def __init__(self, name, work, binary, seed):
        self.name = name
        self.work = work
        self.bin = binary
        self.seed = seed
        self.rng = random.Random(seed)
        self.images = {}  # file name -> sha256
        self.env = dict(os.environ, NO_COLOR="1", ROAMDISK_LOG="warn")
        self.lines = ["set -u", f"cd {work}"]
        self.steps = {}  # step -> (kind, details)

    def rd(self, *args, env=None, check=False, timeout=120):
        p = subprocess.run(
            [self.bin, *args],
            capture_output=True,
            text=True,
            env=env or self.env,
            timeout=timeout,
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"roamdisk {' '.join(args)}: {p.stderr.strip()}")
        return p

    def group(self, steps):
        """Run these steps at once: [(kind, details, args-string)]."""
        for kind, details, argstr in steps:
            i = len(self.steps)
            self.steps[i] = (kind, details)
            bg = " &" if len(steps) > 1 else ""
            self.lines.append(
                f"(exec -a rd-step-{i} {self.bin} {argstr}) > out/{i}{bg}")
        if len(steps) > 1:
            self.lines.append("wait")

    @property
    def script(self):
        return "\n".join(self.lines) + "\n"

    @staticmethod
    def step_of(argv):
        if argv and argv[0].startswith("rd-step-"):
            return int(argv[0][len("rd-step-"):])
        return None

    def group_sizes(self):
        """6-9 groups of steps: one step, or (about a third) two at once.
        Drawn as the caller goes, so each group's own draws come between."""
        for _ in range(self.rng.randint(6, 9)):
            yield 2 if self.rng.random() < 0.35 else 1

    def new_image(self, size_mib, base=None, changes=0):
        name = f"i{len(self.images)}.img"
        self.images[name] = image(f"{self.work}/{name}", size_mib * MIB,
                                  self.rng.randrange(1 << 30),
                                  base and f"{self.work}/{base}", changes)
        return name


# ------------------------------------------------------------------ store


class StoreWorkload(Workload):
    """A fresh local store: commits of new and changed images (some two at
    once, to one image or two), tags, rms and gcs (some beside a commit),
    in an order drawn from the seed."""

    def setup(self):
        w, rng = self.work, self.rng
        self.store = os.path.join(w, "store")
        self.root = self.store
        s = self.store
        self.group([("init", {}, f"store init {s}")])
        commits = []  # step ids of commits
        removed = set()
        for n in self.group_sizes():
            steps = []
            for _ in range(n):
                r = rng.random()
                live = [c for c in commits if c not in removed]
                if r < 0.55 or not live:
                    name = rng.choice(["u/a", "u/b"])
                    mine = [self.steps[c][1]["img"] for c in commits
                            if self.steps[c][1]["name"] == name]
                    if mine and rng.random() < 0.8:
                        img = self.new_image(rng.randint(1, 3), rng.choice(mine), rng.randint(1, 12))
                    else:
                        img = self.new_image(rng.randint(1, 3))
                    i = len(self.steps) + len(steps)
                    steps.append(("commit", {"name": name, "img": img},
                                  f"commit raw:{w}/{img} --to {name} -m s{i} --store {s}"))
                elif r < 0.68:
                    c = rng.choice(live)
                    i = len(self.steps) + len(steps)
                    name = self.steps[c][1]["name"]
                    steps.append(("tag", {"of": c, "tag": f"t{i}"},
                                  f"tag {name}@$({SED_ID} out/{c}) t{i} --store {s}"))
                elif r < 0.8 and len(live) > 1:
                    c = rng.choice(live)
                    removed.add(c)
                    name = self.steps[c][1]["name"]
                    steps.append(("rm", {"of": c},
                                  f"rm {name}@$({SED_ID} out/{c}) --store {s}"))
                else:
                    steps.append(("gc", {}, f"gc --store {s}"))
            if sum(1 for k, _, _ in steps if k == "gc") > 1:
                steps = steps[:1]
            first = len(self.steps)
            self.group(steps)
            commits += [first + j for j, (k, _, _) in enumerate(steps) if k == "commit"]
        self.images["z.img"] = image(f"{w}/z.img", MIB, 6)

    def outcome(self):
        """The version id each commit reported."""
        self.ids = {}
        for i, (kind, d) in self.steps.items():
            if kind == "commit":
                with open(f"{self.work}/out/{i}") as f:
                    for line in f.read().splitlines():
                        if line.startswith("committed "):
                            self.ids[i] = line.split()[1].split("@")[1]

    def check(self, n, acked, started, after_gc=False):
        """Errors (strings) found in the tree at the store's path."""
        errs = []
        s = self.store
        if not os.path.exists(f"{s}/store.toml"):
            if 0 in acked:
                errs.append("store.toml lost after `store init` reported success")
            return errs
        p = self.rd("store", "verify", "--store", s, "--json")
        if p.returncode != 0:
            if 0 not in acked and "no chunk store" in p.stderr:
                return errs  # the store's own files not all there yet
            return [f"store verify failed: {p.stderr.strip()[-400:]}"]
        v = json.loads(p.stdout)
        if v["bad"] or v["missing"]:
            errs.append(f"store verify: bad {v['bad'][:3]} missing {v['missing'][:3]}")
        # the image each version must read as (every commit's id, from its output)
        expect = {vid: self.images[self.steps[i][1]["img"]] for i, vid in self.ids.items()}
        logs = {}
        for name in ("u/a", "u/b"):
            p = self.rd("log", name, "--store", s, "--json")
            if p.returncode != 0:
                if "there is no image" in p.stderr:
                    logs[name] = []  # every version lost is caught below
                    continue
                errs.append(f"log {name}: {p.stderr.strip()[-300:]}")
                logs[name] = []
                continue
            logs[name] = json.loads(p.stdout)
        rm_started = {d["of"] for i, (k, d) in self.steps.items() if k == "rm" and i in started}
        rm_acked = {d["of"] for i, (k, d) in self.steps.items() if k == "rm" and i in acked}
        for i, vid in self.ids.items():
            name = self.steps[i][1]["name"]
            present = any(e["version"].startswith(vid) for e in logs[name])
            if i in acked and not present and i not in rm_started:
                errs.append(f"version {name}@{vid} reported by commit step {i} is lost")
            if i in rm_acked and present:
                errs.append(f"{name}@{vid} is back after a reported rm")
        for i, (k, d) in self.steps.items():
            if k == "tag" and i in acked and d["of"] not in rm_started:
                name = self.steps[d["of"]][1]["name"]
                tagged = [e for e in logs[name] if d["tag"] in e["tags"]]
                if not tagged or not tagged[0]["version"].startswith(self.ids[d["of"]]):
                    errs.append(f"tag {d['tag']} lost after `tag` reported success")
        out = f"{self.work}/checkout.raw"
        for name, entries in logs.items():
            for e in entries:
                if os.path.exists(out):
                    os.remove(out)
                p = self.rd("checkout", f"{name}@{e['version']}", "--output", out, "--store", s)
                if p.returncode != 0:
                    errs.append(f"checkout {name}@{e['version'][:12]}: {p.stderr.strip()[-300:]}")
                else:
                    want = [h for vid, h in expect.items() if e["version"].startswith(vid)]
                    if not want:
                        errs.append(f"{name}@{e['version'][:12]} is no version a commit made")
                    elif sha(out) != want[0]:
                        errs.append(f"{name}@{e['version'][:12]} does not read as the image committed")
        if n % 5 == 0 and not errs and not after_gc:
            p = self.rd("commit", f"raw:{self.work}/z.img", "--to", "u/z", "--store", s)
            if p.returncode != 0:
                errs.append(f"a new commit after the cut failed: {p.stderr.strip()[-300:]}")
            p = self.rd("gc", "--store", s)
            if p.returncode != 0:
                errs.append(f"gc after the cut failed: {p.stderr.strip()[-300:]}")
            p = self.rd("store", "verify", "--store", s, "--json")
            if p.returncode != 0 or json.loads(p.stdout)["bad"] or json.loads(p.stdout)["missing"]:
                errs.append(f"store verify after commit+gc: {p.stdout[-300:]} {p.stderr[-300:]}")
            # and every reported version, tag and rm still holds after that gc
            errs += [f"after a gc: {e}" for e in self.check(n, acked, started, after_gc=True)]
        return errs


# ------------------------------------------------------------------ cache


class CacheWorkload(Workload):
    """Checkouts through a small shared cache (evictions as it fills),
    hoards and releases, eviction and verification, some two at once, in
    an order drawn from the seed."""

    def setup(self):
        w, rng = self.work, self.rng
        self.store = os.path.join(w, "store")
        self.root = os.path.join(w, "cache")
        self.vers = []  # (name, id, image, chunks)
        imgs = []
        for k in range(rng.randint(3, 5)):
            size = rng.randint(1, 2)
            if imgs and rng.random() < 0.5:
                img = self.new_image(size, rng.choice(imgs), rng.randint(2, 8))
            else:
                img = self.new_image(size)
            imgs.append(img)
            name = f"u/v{k}"
            p = self.rd("commit", f"raw:{w}/{img}", "--to", name, "--store", self.store, check=True)
            vid = p.stdout.split("@", 1)[1].split()[0]
            self.vers.append((name, vid, img, os.path.getsize(f"{w}/{img}") // 65536))
        cap = rng.randint(48, 96)
        os.makedirs(self.root)
        with open(f"{self.root}/cache.toml", "w") as f:
            f.write('magic = "roamdisk-shared-cache"\nversion = 2\n'
                    f'size = {cap * 65536}\nunit = 65536\npolicy = "lru"\n')
        self.env["ROAMDISK_SHARED_CACHE"] = self.root
        self.lines.append(f"export ROAMDISK_SHARED_CACHE={self.root}")
        s = self.store
        hoarded = set()
        for n in self.group_sizes():
            steps = []
            for _ in range(n):
                r = rng.random()
                v = rng.randrange(len(self.vers))
                name, vid, _, chunks = self.vers[v]
                room = cap - sum(self.vers[h][3] for h in hoarded)
                i = len(self.steps) + len(steps)
                if v not in hoarded and chunks <= room and (r < 0.5 or not self.steps):
                    hoarded.add(v)
                    steps.append(("hoard", {"v": v}, f"hoard {name}@{vid} --store {s}"))
                elif r < 0.7 and n == 1:
                    self.session(v)
                    continue
                elif r < 0.6:
                    # reads the cache (a full checkout does not fill it)
                    steps.append(("checkout", {"v": v},
                                  f"checkout {name}@{vid} --output {w}/o{i}.raw --store {s}"))
                elif r < 0.8 and hoarded:
                    v = rng.choice(sorted(hoarded))
                    hoarded.discard(v)
                    name, vid = self.vers[v][:2]
                    steps.append(("release", {"v": v},
                                  f"hoard --release {name}@{vid} --store {s}"))
                elif r < 0.9:
                    steps.append(("evict", {}, "cache evict"))
                else:
                    steps.append(("verify", {}, "cache verify"))
            # a release beside a hoard of the same version is a race the
            # user asked for: keep one of them
            if len({d.get("v") for k, d, _ in steps if k in ("hoard", "release")}) < \
                    sum(1 for k, _, _ in steps if k in ("hoard", "release")):
                k, d, _ = steps[1]
                if k == "hoard":
                    hoarded.discard(d["v"])
                else:
                    hoarded.add(d["v"])
                steps = steps[:1]
            self.group(steps)

    def session(self, v):
        """A session of version v: checked out, served over NBD, read
        whole by nbdcopy (filling the cache and pinning what it holds),
        then stopped with SIGTERM."""
        w, s = self.work, self.store
        name, vid = self.vers[v][:2]
        i = len(self.steps)
        sd = f"{w}/sess{i}"
        self.steps[i] = ("session", {"v": v})
        self.steps[i + 1] = ("serve", {"v": v})
        self.lines += [
            f"(exec -a rd-step-{i} {self.bin} checkout {name}@{vid} --session {sd} "
            f"--store {s}) > out/{i}",
            f"(exec -a rd-step-{i + 1} {self.bin} serve cas:{sd} --socket {sd}.sock) "
            f"> out/{i + 1} 2>&1 &",
            "srv=$!",
            f"for t in $(seq 200); do [ -S {sd}.sock ] && break; sleep 0.05; done",
            f"nbdcopy 'nbd+unix:///?socket={sd}.sock' {sd}.copy",
            "kill -TERM $srv",
            "wait $srv",
        ]

    def outcome(self):
        pass

    def check(self, n, acked, started):
        errs = []
        p = self.rd("cache", "status", "--json")
        if p.returncode != 0:
            return [f"cache status failed: {p.stderr.strip()[-400:]}"]
        st = json.loads(p.stdout)
        if st["sessions"]:
            errs.append(f"sessions that died in the cut still pin chunks: {st['sessions']}")
        if st["damaged_marks"]:
            errs.append(f"damaged hoard marks: {st['damaged_marks']}")
        p = self.rd("cache", "verify", "--json")
        if p.returncode != 0:
            return errs + [f"cache verify failed: {p.stderr.strip()[-400:]}"]
        v = json.loads(p.stdout)
        if v["damaged"]:
            errs.append(f"cache verify: {len(v['damaged'])} damaged chunks, e.g. {v['damaged'][0]}")
        # the last hoard/release of each version decides what must hold
        last = {}
        for i in sorted(self.steps):
            k, d = self.steps[i]
            if k in ("hoard", "release") and i in started:
                last[d["v"]] = (k, i in acked)
        for vi, (k, done) in last.items():
            name, vid = self.vers[vi][:2]
            if k == "hoard" and done:
                p = self.rd("hoard", f"{name}@{vid}", "--check", "--json", "--store", self.store)
                if p.returncode != 0:
                    errs.append(f"hoard --check {name}: {p.stderr.strip()[-300:]}")
                else:
                    h = json.loads(p.stdout)
                    if not (h["hoarded"] and h["complete"]):
                        errs.append(f"hoard of {name}@{vid[:12]} reported done, now "
                                    f"{h['percent']:.0f}% hoarded={h['hoarded']}")
            if k == "release" and done:
                if any(x["version"].startswith(vid) for x in st["hoards"]):
                    errs.append(f"released hoard of {name} is back")
        out = f"{self.work}/checkout.raw"
        for name, vid, img, _ in self.vers:
            if os.path.exists(out):
                os.remove(out)
            p = self.rd("checkout", f"{name}@{vid}", "--output", out, "--store", self.store)
            if p.returncode != 0:
                errs.append(f"checkout {name}@{vid[:12]} through the cache: {p.stderr.strip()[-300:]}")
            elif sha(out) != self.images[img]:
                errs.append(f"{name}@{vid[:12]} through the cache differs from what was committed")
        return errs


WORKLOADS = {"store": StoreWorkload, "cache": CacheWorkload}


def run_workload(wl, args):
    os.makedirs(f"{wl.work}/out", exist_ok=True)
    wl.setup()
    with open(f"{wl.work}/workload.sh", "w") as f:
        f.write(wl.script)
    trace = f"{wl.work}/trace.txt"
    m = ct.initial(wl.root, wl.work)  # the tree before the workload
    t0 = time.time()
    subprocess.run(
        ["strace", "-f", "-q", "-xx", "-s", "16777216", "-e", f"trace={ct.STRACE_CALLS}",
         "-o", trace, "bash", f"{wl.work}/workload.sh"],
        check=True, env=wl.env, cwd=wl.work,
    )
    ct.parse(trace, m)
    acks = [(a.at, wl.step_of(a.argv), a.status) for a in m.acks
            if wl.step_of(a.argv) is not None]
    bad = [a for a in acks if a[2] != 0]
    if bad or len(acks) != len(wl.steps):
        raise RuntimeError(f"{wl.name} {wl.seed}: commands failed in the traced run: {bad} "
                           f"({len(acks)} of {len(wl.steps)} ended); see {wl.work}/out")
    wl.outcome()
    # when each command started (its execve): an rm "had started" after it
    starts = {wl.step_of(argv): at for at, argv in m.execs if wl.step_of(argv) is not None}
    cs = ct.CrashStates(m)
    final = cs.state(len(m.ops), "all", random.Random(0))
    final_ok = check_final_model(wl.root, final)
    rng = random.Random(args.seed)
    plan = []
    for k in cs.points():
        plan.append((k, "durable"))
        plan.append((k, "all"))
        plan.append((k, "posix"))
        for _ in range(args.variants):
            plan.append((k, "random"))
    seen = set()
    res = {"workload": wl.name, "seed": wl.seed, "steps": len(wl.steps), "ops": len(m.ops), "points": len(cs.points()),
           "syncs": sum(1 for o in m.ops if o.kind in ("sync", "syncfs")),
           "trace_seconds": round(time.time() - t0, 2), "states_built": 0,
           "states_checked": 0, "failures": [], "final_tree_matches": final_ok}
    order = list(range(len(plan)))
    if args.states and args.states < len(plan):
        rng.shuffle(order)
    t1 = time.time()
    for idx in order:
        if args.states and res["states_checked"] >= args.states:
            break
        k, variant = plan[idx]
        names, data, isdir = cs.state(k, variant, random.Random(rng.random()))
        res["states_built"] += 1
        acked = {s for at, s, st in acks if at <= k}
        started = {s for s, at in starts.items() if at < k}
        key = (ct.state_key(names, data, isdir), tuple(sorted(acked)), tuple(sorted(started)))
        if key in seen:
            continue
        seen.add(key)
        # written a day ago: gc's age rules see every file as old enough
        # to take (leases of the processes the cut killed are stale)
        ct.materialize(wl.root, names, data, isdir, age=86400)
        n = res["states_checked"]
        errs = wl.check(n, acked, started)
        res["states_checked"] += 1
        if errs:
            keep = f"{wl.work}/failed-{len(res['failures'])}"
            if len(res["failures"]) < 5 and os.path.isdir(wl.root):
                shutil.copytree(wl.root, keep, symlinks=True)
            res["failures"].append({"point": k, "variant": variant, "acked": sorted(acked),
                                    "errors": errs, "tree": keep})
            print(f"{wl.name} {wl.seed}: FAIL at point {k}/{len(m.ops)} ({variant}): {errs}", flush=True)
        if not args.quiet and res["states_checked"] % 200 == 0:
            print(f"{wl.name} {wl.seed}: {res['states_checked']} trees checked, "
                  f"{len(res['failures'])} failed", flush=True)
    res["check_seconds"] = round(time.time() - t1, 1)
    return res


def check_final_model(root, final):
    """The model after every op must be the tree the workload left: the
    parser followed every step."""
    names, data, isdir = final
    real = {}
    if os.path.isdir(root):
        real[root] = "d"
        for d, dirs, files in os.walk(root):
            for x in dirs:
                real[os.path.join(d, x)] = "d"
            for x in files:
                with open(os.path.join(d, x), "rb") as f:
                    real[os.path.join(d, x)] = hashlib.sha256(f.read()).hexdigest()
    model = {p: ("d" if isdir[i] else hashlib.sha256(bytes(data.get(i, b""))).hexdigest())
             for p, i in names.items()}
    if real != model:
        diff = sorted(set(real.items()) ^ set(model.items()))[:6]
        raise RuntimeError(f"the model of the trace does not end as the real tree: {diff}")
    return True


def one(job):
    name, seed, args = job
    work = os.path.join(args.work, f"roamdisk-crash-{name}-{seed}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    wl = WORKLOADS[name](name, work, os.path.abspath(args.bin), seed)
    try:
        r = run_workload(wl, args)
    except Exception as e:  # a workload that cannot run or be read fails, the rest go on
        print(f"{name} seed {seed}: ERROR {e!r}", flush=True)
        return {"workload": name, "seed": seed, "steps": len(wl.steps), "ops": 0, "points": 0,
                "syncs": 0, "states_built": 0, "states_checked": 0, "check_seconds": 0,
                "failures": [{"error": repr(e), "work": work}]}
    print(f"{name} seed {seed}: {len(wl.steps)} commands, {r['ops']} file-system steps "
          f"({r['syncs']} syncs), {r['points']} cut points, {r['states_checked']} distinct "
          f"trees checked of {r['states_built']} built, {len(r['failures'])} failed, "
          f"{r['check_seconds']} s", flush=True)
    if not r["failures"]:
        shutil.rmtree(work, ignore_errors=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--workload", choices=["store", "cache", "both"], default="both",
                    help="the local chunk store, the shared chunk cache, or both (default)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/roamdisk"),
                    help="the roamdisk binary (default: target/release/roamdisk)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="workloads of each kind, drawn from seeds --seed, --seed+1, ...")
    ap.add_argument("--seed", type=int, default=1, help="the first workload's seed")
    ap.add_argument("--states", type=int, default=0,
                    help="check at most this many distinct trees per workload, "
                         "drawn at random from every point (default: all)")
    ap.add_argument("--variants", type=int, default=2,
                    help="random crash states per point, besides `durable` and `all`")
    ap.add_argument("--jobs", type=int, default=2, help="workloads checked at once")
    ap.add_argument("--work", default="/dev/shm",
                    help="where workloads run (a tmpfs is fastest; default /dev/shm)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quiet", action="store_true", help="no progress lines within a workload")
    args = ap.parse_args()
    if shutil.which("strace") is None:
        sys.exit("crash-replay: strace is needed (apt-get install strace)")
    names = ["store", "cache"] if args.workload == "both" else [args.workload]
    jobs = [(n, args.seed + i, args) for i in range(args.seeds) for n in names]
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing
        with multiprocessing.Pool(args.jobs) as pool:
            results = pool.map(one, jobs, chunksize=1)
    else:
        results = [one(j) for j in jobs]
    total = {}
    for n in names:
        rs = [r for r in results if r["workload"] == n]
        total[n] = {k: sum(r[k] for r in rs) for k in
                    ("steps", "ops", "points", "syncs", "states_built", "states_checked")}
        total[n]["workloads"] = len(rs)
        total[n]["failed"] = sum(len(r["failures"]) for r in rs)
        t = total[n]
        print(f"{n}: {t['workloads']} workloads, {t['steps']} commands, {t['points']} cut points, "
              f"{t['states_built']} crash trees ({t['states_checked']} distinct, each checked), "
              f"{t['failed']} failed", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0),
                       "args": {k: v for k, v in vars(args).items() if k != "json"},
                       "total": total, "results": results}, f, indent=1)
    sys.exit(1 if any(r["failures"] for r in results) else 0)


if __name__ == "__main__":
    main()
