#!/usr/bin/env python3
"""TransCom Figure 10 on roamdisk: N emulated clients boot at once from one
golden image served by `roamdisk server`, under five configurations, each
step adding one of the seed's optimizations:

  baseline  no server cache; each client's view (golden + its overlay)
            on the server
  A         + a large server memory cache (LRU) and a small client cache
            (1 MiB LRU)
  B         + FMPQ in both caches (the seed's two-level strategy)
  C         + the client's overlay on the client (thin client:
            cow:LOCAL:cache:fmpq:1M:...:nbd:URI), the server granting the
            golden image read-only
  D         + a transport that carries the server port's full bandwidth
            (C's caches, the server's link at --server-link instead of
            --efficiency of it)

The server's golden image sits behind the `hdd` layer (the seed's 15,000
rpm disk: one head, 3.4 ms seek + half a turn unless sequential), and so
do the clients' overlays on the server (`view-layers`: their writes are
charged to the same head, as TransCom's shadow images share the server's
disk); in C and D each client's overlay is on a disk of its own (an `hdd`
over its `cow`, writes charged). Every client connects with its own
TLS-PSK identity (`nbds://cN@...?tls-psk-file=cN.psk`) and, up to B,
writes into its own view on the server.

The network (the seed's section 3: clients on 100 Mbit/s ports, the
server on a 1 Gbit/s port, one switch): each client's requests cross its
own link (`throttle[rate=--link]`) and then the server's port, one link
shared by all clients (`throttle[rate=R,burst=0,link=server]`, the two in
series: `throttle[rate=100Mbit]:throttle[...,link=server]:nbd:URI`). The
port has no burst: a request holds it bytes/R, the service time of the
network centre of the seed's queueing model.

Strategy D. The seed's D is "the network is the primary bottleneck if the
cache works effectively; Linux's UDP is much more efficient than
Windows'": the same 1 Gbit/s port, a server whose transport gets more out
of it. Its Table 1 measures the Windows server's NIU demand: 0.17 ms per
4 KB request, 0.50 ms per 32 KB, i.e. 0.123 ms per request + 11.5 ns per
byte (87 MB/s). For this trace's reads (28 KiB on average, 96% of the
bytes) that is 0.45 ms per read where the 1 Gbit/s wire needs 0.23 ms:
the transport carries 51% of the port. So baseline to C run on a port of
--efficiency (0.5) x --server-link, and D on the full --server-link (the
upper bound of any transport: what Linux gains is somewhere in between).

Per step and round: the mean, median and max per-client boot time (the
IOEmu replay of `trace synth boot`, one stream per client), the server
cache's hit ratio, the disk's busy time, and the bytes and busy time of
the server's port (its `report=`). Beside it, the MVA prediction
(`roamdisk model mva`) for the same N from demands measured on the same
step: disk = the hdd layer's busy time per client request at N, network =
the server port's busy time (both directions, the seed's one NIU centre)
per client request at N, server CPU = the server process's CPU time per
client request at N, and the client delay Z calibrated from a one-client
run of the step (Z = time per request at N=1 minus the server demands).
Steps run interleaved, round after round, each on a fresh state directory.

Writes DIR/fig10.json, DIR/fig10.txt and DIR/fig10.svg (bars: measured
mean boot time per step, MVA prediction beside it), and a .png of it when
rsvg-convert (package librsvg2-bin) is there.

  bench/server-boot-storm.py --rounds 3 --requests 400 --out bench/results/server-fig10
"""
import argparse, json, os, re, shutil, socket, statistics, subprocess, time

from roamdisk_bench import B, cpu_seconds, free_port, run, stop

STEPS = ["baseline", "A", "B", "C", "D"]


def parse_bits(s):
    """A link rate in bits per second: 1Gbit, 100Mbit, 500kbit."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)bit\s*", s)
    if not m:
        raise SystemExit(f"'{s}' is not a link rate: write it in bits per second, e.g. 1Gbit or 100Mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]


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
        grant = "read-only" if step in ("C", "D") else "view"
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

    def server_link_bits(self, step):
        """The server port's rate for `step`, bits per second: the seed's
        Windows transport (--efficiency of the port) up to C, all of it
        in D."""
        full = parse_bits(self.a.server_link)
        return full if step == "D" else full * self.a.efficiency

    def target(self, step, port, work, link_report):
        """The replay target: each emulated client's own stack."""
        a = self.a
        uri = (f"nbds://c{{client}}@127.0.0.1:{port}/golden"
               f"?tls-psk-file={self.keys}/c{{client}}.psk")
        if a.auth == "uid":
            uri = f"nbd+unix:///golden?socket={self.dir}/srv-{port}.sock"
        # The client's own link, then the server's port (shared by every
        # client of this replay process): in series, as in the seed's
        # switched LAN. The port has no burst (a request holds it
        # bytes/rate, MVA's network centre).
        kbit = round(self.server_link_bits(step) / 1e3)
        port_link = f"throttle[rate={kbit}kbit,burst=0,link=server,report={link_report}]"
        link = f"throttle[rate={a.link}]:{port_link}:nbd:{uri}"
        if step == "baseline":
            return link
        policy = "lru" if step == "A" else "fmpq"
        cached = f"cache[report={work}/client-cache{{client}}.json]:{policy}:{a.client_cache}:{link}"
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
    link_report = os.path.join(work, "link.json")
    cfg = os.path.join(work, "server.toml")
    with open(cfg, "w") as f:
        f.write(s.config(step, os.path.join(work, "state"), port, mport, disk_report))
    srv = start_server(cfg, os.path.join(work, "server.log"), port)
    cpu0 = cpu_seconds(srv.pid)
    r = subprocess.run([B, "-q", "replay", trace, s.target(step, port, work, link_report),
                        "--per", "client", "--json"], capture_output=True, text=True)
    cpu = cpu_seconds(srv.pid) - cpu0
    status = json.loads(run(B, "server", "status", cfg, "--json"))
    stop(srv, 120)
    if r.returncode != 0:
        raise SystemExit(f"replay failed ({step}, N={n}): {r.stderr}\n"
                         f"{open(os.path.join(work, 'server.log')).read()[-3000:]}")
    rep = json.loads(r.stdout)
    disk = json.load(open(disk_report))
    link = json.load(open(link_report))
    cache = status.get("cache")
    # The clients' caches (A on): what they kept off the port.
    ccache = [json.load(open(os.path.join(work, f))) for f in os.listdir(work)
              if f.startswith("client-cache")]
    times = [c["runtime_s"] for c in rep["clients"]]
    out = {
        "step": step, "round": rnd, "clients": n,
        "requests": rep["requests"],
        "wall_s": rep["wall_s"],
        "mean_s": statistics.mean(times), "median_s": statistics.median(times),
        "max_s": max(times),
        "disk_requests": disk["requests"], "disk_busy_s": disk["busy_seconds"],
        "server_cpu_s": cpu,
        "link_bits": s.server_link_bits(step),
        "link_down_bytes": link["down"]["bytes"], "link_up_bytes": link["up"]["bytes"],
        "link_down_busy_s": link["down"]["busy_seconds"], "link_up_busy_s": link["up"]["busy_seconds"],
        "link_busy_s": link["down"]["busy_seconds"] + link["up"]["busy_seconds"],
        "link_wait_s": link["down"]["wait_seconds"] + link["up"]["wait_seconds"],
        "cache_hits": cache["hits"] if cache else None,
        "cache_misses": cache["misses"] if cache else None,
        "client_hits": sum(c["hits"] for c in ccache),
        "client_misses": sum(c["misses"] for c in ccache),
        "client_cache_bytes": sum(c["bytes_from_cache"] for c in ccache),
    }
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def mva(n, per_req_disk, per_req_cpu, per_req_link, z):
    """`roamdisk model mva` at population n: the response time R(n), the
    throughput and the residence time at the network centre (the port)."""
    j = json.loads(run(B, "model", "mva", "--disk", f"{per_req_disk}s", "--cpu", f"{per_req_cpu}s",
                       "--memory", "0s", "--network", f"{per_req_link}s", "--client-delay", f"{z}s",
                       "--hit", "0", "--clients", str(n), "--max-clients", str(n),
                       "--step", "1", "--json"))
    points = j["vs_clients"][0][1]
    p = [q for q in points if q["clients"] == n][0]
    return p["response"], p["throughput"], p["residence"][3]


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
    ap.add_argument("--server-link", default="1Gbit",
                    help="the server's port, shared by every client (bits per second)")
    ap.add_argument("--efficiency", type=float, default=0.5,
                    help="the share of the server's port the transport carries up to C "
                         "(the seed's Table 1: 0.5 for this trace); D carries all of it")
    ap.add_argument("--dir", default="/tmp/roamdisk-fig10")
    ap.add_argument("--out", default=None, help="STEM for .json/.txt/.svg (default DIR/fig10)")
    ap.add_argument("--keep", action="store_true", help="keep each run's state and logs")
    ap.add_argument("--auth", choices=["psk", "uid"], default="psk",
                    help="uid: every client on the Unix socket as one client, one view (a smoke test of this script)")
    a = ap.parse_args()
    if not 0 < a.efficiency <= 1:
        raise SystemExit("--efficiency: a share of the port, more than 0 and at most 1 (e.g. 0.5)")
    parse_bits(a.server_link)
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
                      f"server cpu {r['server_cpu_s']:.2f} s, port {r['link_down_bytes'] / 1e6:.0f}"
                      f"+{r['link_up_bytes'] / 1e6:.1f} MB / {r['link_busy_s']:.2f} s busy"
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
        d_link = med(big, "link_busy_s") / med(big, "requests")
        # Z from N=1: its time per request minus its own server demands.
        t1 = med(one, "mean_s") / med(one, "requests")
        d1 = (med(one, "disk_busy_s") + med(one, "server_cpu_s") + med(one, "link_busy_s")) / med(one, "requests")
        z = max(t1 - d1, 0.0)
        resp, x, r_link = mva(a.clients, d_disk, d_cpu, d_link, z)
        pred = n_req * (resp + z)
        demands = {"disk": d_disk, "server port": d_link, "server CPU": d_cpu}
        hits = [r for r in big if r["cache_hits"] is not None]
        hit = (med(hits, "cache_hits") / (med(hits, "cache_hits") + med(hits, "cache_misses"))) if hits else 0.0
        rows.append({
            "step": st, "mean_s": med(big, "mean_s"), "median_s": med(big, "median_s"),
            "max_s": med(big, "max_s"), "wall_s": med(big, "wall_s"),
            "server_hit_ratio": hit, "disk_requests": med(big, "disk_requests"),
            "disk_demand_ms": d_disk * 1e3, "cpu_demand_ms": d_cpu * 1e3, "z_ms": z * 1e3,
            "link_mbit": med(big, "link_bits") / 1e6,
            "link_down_mb": med(big, "link_down_bytes") / 1e6, "link_up_mb": med(big, "link_up_bytes") / 1e6,
            "link_demand_ms": d_link * 1e3,
            # Busy time over the time to boot them all (the port's two
            # directions summed, as its one MVA centre).
            "disk_util": statistics.median(r["disk_busy_s"] / r["wall_s"] for r in big),
            "link_util": statistics.median(r["link_busy_s"] / r["wall_s"] for r in big),
            "mva_mean_s": pred,
            "mva_disk_util": x * d_disk, "mva_link_util": x * d_link,
            # Time a request spends at the port (queueing included).
            "link_residence_ms": med(big, "link_wait_s") / med(big, "requests") * 1e3,
            "mva_link_residence_ms": r_link * 1e3,
            "client_hit_ratio": med(big, "client_hits") / max(med(big, "client_hits") + med(big, "client_misses"), 1),
            "client_cache_mb": med(big, "client_cache_bytes") / 1e6,
            "bottleneck": max(demands, key=demands.get),
            "rounds_mean_s": [r["mean_s"] for r in big],
        })
    base = rows[0]["mean_s"]
    base_wall = rows[0]["wall_s"]
    base_link = rows[0]["link_down_mb"] + rows[0]["link_up_mb"]
    lines = [f"{a.clients} clients x {a.requests} requests (trace synth boot --seed {a.seed}), "
             f"server cache {a.server_cache}, client cache {a.client_cache}, client link {a.link}, "
             f"server port {a.server_link} (x {a.efficiency} up to C), {a.rounds} round(s), medians", "",
             "| step | server port (Mbit/s) | all booted (s) | vs baseline | mean boot (s) | median (s) | max (s) | "
             "mean vs baseline | MVA mean boot (s) | MVA / measured | bottleneck (largest demand) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['link_mbit']:.0f} | {r['wall_s']:.2f} | {(r['wall_s'] / base_wall - 1) * 100:+.0f}% | "
                     f"{r['mean_s']:.2f} | {r['median_s']:.2f} | {r['max_s']:.2f} | "
                     f"{(r['mean_s'] / base - 1) * 100:+.0f}% | {r['mva_mean_s']:.2f} | "
                     f"{r['mva_mean_s'] / r['mean_s']:.2f} | {r['bottleneck']} |")
    lines += ["",
              "| step | client hit ratio (MB kept off the port) | server hit ratio | disk requests | disk demand (ms/req) | "
              "disk util. (measured / MVA) | port MB down + up | port bytes vs baseline | port demand (ms/req) | "
              "port util. (measured / MVA) | time at the port (ms/req, measured / MVA) | server CPU (ms/req) | Z (ms) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        mb = r["link_down_mb"] + r["link_up_mb"]
        lines.append(f"| {r['step']} | {r['client_hit_ratio']*100:.1f}% ({r['client_cache_mb']:.0f}) | "
                     f"{r['server_hit_ratio']*100:.1f}% | {r['disk_requests']:.0f} | "
                     f"{r['disk_demand_ms']:.3f} | {r['disk_util']*100:.0f}% / {r['mva_disk_util']*100:.0f}% | "
                     f"{r['link_down_mb']:.0f} + {r['link_up_mb']:.1f} | {(mb / base_link - 1) * 100:+.0f}% | "
                     f"{r['link_demand_ms']:.3f} | {r['link_util']*100:.0f}% / {r['mva_link_util']*100:.0f}% | "
                     f"{r['link_residence_ms']:.2f} / {r['mva_link_residence_ms']:.2f} | "
                     f"{r['cpu_demand_ms']:.3f} | {r['z_ms']:.2f} |")
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
