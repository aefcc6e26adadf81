#!/usr/bin/env python3
"""TransCom Figure 10 on roamdisk: N emulated clients boot at once from one
golden image served by `roamdisk server`, under four configurations, each
step adding one of the seed's optimizations:

  baseline  no server cache; each client's view (golden + its overlay)
            on the server
  A         + a large server memory cache (LRU) and a small client cache
            (1 MiB LRU)
  B         + FMPQ in both caches (the seed's two-level strategy)
  C         + the client's overlay on the client (thin client:
            cow:LOCAL:cache:fmpq:1M:...:nbd:URI), the server granting the
            golden image read-only

The server's golden image sits behind the `hdd` layer (the seed's 15,000
rpm disk: one head, 3.4 ms seek + half a turn unless sequential), and so
do the clients' overlays on the server (`view-layers`: their writes are
charged to the same head, as TransCom's shadow images share the server's
disk); in C each client's overlay is on a disk of its own (an `hdd` over
its `cow`, writes charged). Each client sits behind its own 100 Mbit/s
link (`throttle`). Every client connects
with its own TLS-PSK identity (`nbds://cN@...?tls-psk-file=cN.psk`) and,
up to B, writes into its own view on the server.

Per step and round: the mean, median and max per-client boot time (the
IOEmu replay of `trace synth boot`, one stream per client), the server
cache's hit ratio and the disk's busy time. Beside it, the MVA prediction
(`roamdisk model mva`) for the same N from demands measured on the same
step: disk = the hdd layer's busy time per client request at N, server
CPU = the server process's CPU time per client request at N, and the
client delay Z calibrated from a one-client run of the step
(Z = time per request at N=1 minus the server demands). Steps run
interleaved, round after round, each on a fresh state directory.

Writes DIR/fig10.json, DIR/fig10.txt and DIR/fig10.svg (bars: measured
mean boot time per step, MVA prediction beside it), and a .png of it when
rsvg-convert (package librsvg2-bin) is there.

  bench/server-boot-storm.py --rounds 3 --requests 400 --out bench/results/server-fig10
"""
import argparse, json, os, shutil, socket, statistics, subprocess, time

from roamdisk_bench import B, cpu_seconds, free_port, run, stop

STEPS = ["baseline", "A", "B", "C"]


class Setup:
    def __init__(self, a):
        self.a = a
        self.dir = os.path.abspath(a.dir)
        os.makedirs(self.dir, exist_ok=True)
        self.trace = os.path.join(self.dir, f"boot{a.clients}x{a.requests}.rdtrace")
        if not os.path.exists(self.trace):
            run(B, "-q", "trace", "synth", "boot", "--clients", str(a.clients),
                "--requests", str(a.requests), "--seed", str(a.seed), "-o", self.trace)
        self.one = os.path.join(self.dir, f"boot1x{a.requests}.rdtrace")
        if not os.path.exists(self.one):
            run(B, "-q", "trace", "synth", "boot", "--clients", "1",
                "--requests", str(a.requests), "--seed", str(a.seed), "-o", self.one)
        # The boot trace reaches 7.5 GB into the disk. The golden image is
        # sparse; the hdd layer reports it all as data, so every read is
        # paid on the emulated disk.
        self.golden = os.path.join(self.dir, "golden.img")
        if not os.path.exists(self.golden):
            with open(self.golden, "wb") as f:
                f.truncate(8 << 30)
        self.keys = os.path.join(self.dir, "keys")
        self.server_psk = os.path.join(self.keys, "server.psk")
        if not os.path.exists(self.server_psk):
            os.makedirs(self.keys, exist_ok=True)
            lines = []
            for c in range(a.clients):
                key = os.urandom(32).hex()
                line = f"c{c}:{key}\n"
                lines.append(line)
                with open(os.path.join(self.keys, f"c{c}.psk"), "w") as f:
                    f.write(line)
            with open(self.server_psk, "w") as f:
                f.writelines(lines)

    def config(self, step, state, port, mport, disk_report):
        a = self.a
        stack = f"hdd[head=server,report={disk_report}]:raw:{self.golden}"
        grant = "read-only" if step == "C" else "view"
        out = [
            'format = "roamdisk-server"',
            "version = 1",
            f'state = "{state}"',
            f'listen = ["127.0.0.1:{port}"]',
            f'tls-psk = "{self.server_psk}"',
            f'metrics = "127.0.0.1:{mport}"',
        ]
        if a.auth == "uid":
            out.append(f'socket = "{self.dir}/srv-{port}.sock"')
        if step != "baseline":
            policy = "lru" if step == "A" else "fmpq"
            out += ["", "[cache]", f'policy = "{policy}"', f'size = "{a.server_cache}"']
        out += [
            "",
            "[[image]]",
            'name = "golden"',
            f'stack = "{stack}"',
        ]
        if grant == "view":
            # The views' overlays live on the same disk as the golden image.
            out.append('view-layers = "hdd[head=server,charge=writes]"')
        for c in range(a.clients):
            out += ["", "[[client]]", f'name = "c{c}"', f'psk-identity = "c{c}"',
                    f'{grant} = ["golden"]']
            if a.auth == "uid" and c == 0:
                out.append(f"uid = {os.getuid()}")
        return "\n".join(out) + "\n"

    def target(self, step, port, work):
        """The replay target: each emulated client's own stack."""
        a = self.a
        uri = (f"nbds://c{{client}}@127.0.0.1:{port}/golden"
               f"?tls-psk-file={self.keys}/c{{client}}.psk")
        if a.auth == "uid":
            uri = f"nbd+unix:///golden?socket={self.dir}/srv-{port}.sock"
        link = f"throttle[rate={a.link}]:nbd:{uri}"
        if step == "baseline":
            return link
        policy = "lru" if step == "A" else "fmpq"
        cached = f"cache:{policy}:{a.client_cache}:{link}"
        if step in ("A", "B"):
            return cached
        # The client's overlay on its own local disk (a disk per client).
        return f"hdd[charge=writes]:cow:{work}/client{{client}}.cow:{cached}"


def start_server(cfg_path, log_path, port):
    log = open(log_path, "w")
    p = subprocess.Popen([B, "server", cfg_path], stdout=subprocess.DEVNULL, stderr=log)
    t0 = time.time()
    while time.time() - t0 < 30:
        if p.poll() is not None:
            raise SystemExit(f"roamdisk server exited: {open(log_path).read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    raise SystemExit("roamdisk server did not start listening")


def one_run(s, step, rnd, trace, n):
    """Replay `trace` (n clients) against a fresh server for `step`."""
    a = s.a
    work = os.path.join(s.dir, f"run-{step}-{rnd}-{n}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    port = free_port()
    mport = free_port()
    disk_report = os.path.join(work, "disk.json")
    cfg = os.path.join(work, "server.toml")
    with open(cfg, "w") as f:
        f.write(s.config(step, os.path.join(work, "state"), port, mport, disk_report))
    srv = start_server(cfg, os.path.join(work, "server.log"), port)
    cpu0 = cpu_seconds(srv.pid)
    r = subprocess.run([B, "-q", "replay", trace, s.target(step, port, work),
                        "--per", "client", "--json"], capture_output=True, text=True)
    cpu = cpu_seconds(srv.pid) - cpu0
    status = json.loads(run(B, "server", "status", cfg, "--json"))
    stop(srv, 120)
    if r.returncode != 0:
        raise SystemExit(f"replay failed ({step}, N={n}): {r.stderr}\n"
                         f"{open(os.path.join(work, 'server.log')).read()[-3000:]}")
    rep = json.loads(r.stdout)
    disk = json.load(open(disk_report))
    cache = status.get("cache")
    times = [c["runtime_s"] for c in rep["clients"]]
    out = {
        "step": step, "round": rnd, "clients": n,
        "requests": rep["requests"],
        "wall_s": rep["wall_s"],
        "mean_s": statistics.mean(times), "median_s": statistics.median(times),
        "max_s": max(times),
        "disk_requests": disk["requests"], "disk_busy_s": disk["busy_seconds"],
        "server_cpu_s": cpu,
        "cache_hits": cache["hits"] if cache else None,
        "cache_misses": cache["misses"] if cache else None,
    }
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def mva(n, per_req_disk, per_req_cpu, z):
    """`roamdisk model mva` at population n: the response time R(n)."""
    j = json.loads(run(B, "model", "mva", "--disk", f"{per_req_disk}s", "--cpu", f"{per_req_cpu}s",
                       "--memory", "0s", "--network", "0s", "--client-delay", f"{z}s",
                       "--hit", "0", "--clients", str(n), "--max-clients", str(n),
                       "--step", "1", "--json"))
    points = j["vs_clients"][0][1]
    p = [q for q in points if q["clients"] == n][0]
    return p["response"], p["throughput"]


def svg(path, steps, measured, predicted, title):
    w, h, left, bottom = 640, 360, 70, 50
    top = max(max(measured), max(predicted)) * 1.15
    bw = (w - left - 20) / len(steps)
    y = lambda v: h - bottom - (h - bottom - 30) * v / top
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w/2}" y="18" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{left}" y1="{h-bottom}" x2="{w-10}" y2="{h-bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="30" x2="{left}" y2="{h-bottom}" stroke="black"/>',
           f'<text x="16" y="{h/2}" transform="rotate(-90 16 {h/2})" text-anchor="middle">mean boot time per client (s)</text>']
    for i in range(6):
        v = top * i / 5
        out.append(f'<text x="{left-6}" y="{y(v)+4}" text-anchor="end">{v:.0f}</text>')
        out.append(f'<line x1="{left}" y1="{y(v)}" x2="{w-10}" y2="{y(v)}" stroke="#ddd"/>')
    for i, st in enumerate(steps):
        x0 = left + i * bw + bw * 0.15
        for j, (v, col) in enumerate(((measured[i], "#3465a4"), (predicted[i], "#f57900"))):
            x = x0 + j * bw * 0.35
            out.append(f'<rect x="{x}" y="{y(v)}" width="{bw*0.33}" height="{h-bottom-y(v)}" fill="{col}"/>')
            out.append(f'<text x="{x+bw*0.165}" y="{y(v)-4}" text-anchor="middle" font-size="10">{v:.1f}</text>')
        out.append(f'<text x="{left+i*bw+bw/2}" y="{h-bottom+18}" text-anchor="middle">{st}</text>')
    lx = w - 200
    out.append(f'<rect x="{lx}" y="40" width="12" height="12" fill="#3465a4"/><text x="{lx+18}" y="50">measured (median of rounds)</text>')
    out.append(f'<rect x="{lx}" y="58" width="12" height="12" fill="#f57900"/><text x="{lx+18}" y="68">MVA prediction</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=400, help="requests per client (trace synth boot)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--server-cache", default="256M")
    ap.add_argument("--client-cache", default="1M")
    ap.add_argument("--link", default="100Mbit", help="each client's link")
    ap.add_argument("--dir", default="/tmp/roamdisk-fig10")
    ap.add_argument("--out", default=None, help="STEM for .json/.txt/.svg (default DIR/fig10)")
    ap.add_argument("--keep", action="store_true", help="keep each run's state and logs")
    ap.add_argument("--auth", choices=["psk", "uid"], default="psk",
                    help="uid: every client on the Unix socket as one client, one view (a smoke test of this script)")
    a = ap.parse_args()
    steps = a.steps.split(",")
    s = Setup(a)
    stem = a.out or os.path.join(s.dir, "fig10")
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    runs = []
    for rnd in range(a.rounds):
        for st in steps:
            for trace, n in ((s.one, 1), (s.trace, a.clients)):
                r = one_run(s, st, rnd, trace, n)
                runs.append(r)
                print(f"round {rnd} {st:8} N={n:3}: mean {r['mean_s']:.2f} s, max {r['max_s']:.2f} s, "
                      f"disk {r['disk_requests']} req / {r['disk_busy_s']:.2f} s busy, "
                      f"server cpu {r['server_cpu_s']:.2f} s"
                      + (f", cache hits {r['cache_hits']} misses {r['cache_misses']}" if r["cache_hits"] is not None else ""),
                      flush=True)
    rows = []
    for st in steps:
        big = [r for r in runs if r["step"] == st and r["clients"] == a.clients]
        one = [r for r in runs if r["step"] == st and r["clients"] == 1]
        med = lambda rs, k: statistics.median(r[k] for r in rs)
        n_req = med(big, "requests") / a.clients
        d_disk = med(big, "disk_busy_s") / med(big, "requests")
        d_cpu = med(big, "server_cpu_s") / med(big, "requests")
        # Z from N=1: its time per request minus its own server demands.
        t1 = med(one, "mean_s") / med(one, "requests")
        d1 = (med(one, "disk_busy_s") + med(one, "server_cpu_s")) / med(one, "requests")
        z = max(t1 - d1, 0.0)
        resp, _ = mva(a.clients, d_disk, d_cpu, z)
        pred = n_req * (resp + z)
        hits = [r for r in big if r["cache_hits"] is not None]
        hit = (med(hits, "cache_hits") / (med(hits, "cache_hits") + med(hits, "cache_misses"))) if hits else 0.0
        rows.append({
            "step": st, "mean_s": med(big, "mean_s"), "median_s": med(big, "median_s"),
            "max_s": med(big, "max_s"), "wall_s": med(big, "wall_s"),
            "server_hit_ratio": hit, "disk_requests": med(big, "disk_requests"),
            "disk_demand_ms": d_disk * 1e3, "cpu_demand_ms": d_cpu * 1e3, "z_ms": z * 1e3,
            "mva_mean_s": pred,
            "rounds_mean_s": [r["mean_s"] for r in big],
        })
    base = rows[0]["mean_s"]
    base_wall = rows[0]["wall_s"]
    lines = [f"{a.clients} clients x {a.requests} requests (trace synth boot --seed {a.seed}), "
             f"server cache {a.server_cache}, client cache {a.client_cache}, link {a.link}, "
             f"{a.rounds} round(s), medians", "",
             "| step | all booted (s) | vs baseline | mean boot (s) | median (s) | max (s) | mean vs baseline | server hit ratio | disk requests | "
             "disk demand (ms/req) | server CPU (ms/req) | Z (ms) | MVA mean boot (s) | MVA / measured |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['wall_s']:.2f} | {(r['wall_s'] / base_wall - 1) * 100:+.0f}% | "
                     f"{r['mean_s']:.2f} | {r['median_s']:.2f} | {r['max_s']:.2f} | "
                     f"{(r['mean_s'] / base - 1) * 100:+.0f}% | {r['server_hit_ratio']*100:.1f}% | "
                     f"{r['disk_requests']:.0f} | {r['disk_demand_ms']:.3f} | {r['cpu_demand_ms']:.3f} | "
                     f"{r['z_ms']:.2f} | {r['mva_mean_s']:.2f} | {r['mva_mean_s'] / r['mean_s']:.2f} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    with open(stem + ".txt", "w") as f:
        f.write(text)
    with open(stem + ".json", "w") as f:
        json.dump({"args": vars(a), "rows": rows, "runs": runs}, f, indent=1)
    svg(stem + ".svg", steps, [r["mean_s"] for r in rows], [r["mva_mean_s"] for r in rows],
        f"{a.clients} clients booting at once (TransCom Figure 10)")
    wrote = ".svg"
    if shutil.which("rsvg-convert"):  # Debian's librsvg2-bin
        subprocess.run(["rsvg-convert", stem + ".svg", "-o", stem + ".png"], check=True)
        wrote += ", .png"
    print(f"wrote {stem}.txt, .json, {wrote}")


if __name__ == "__main__":
    main()
