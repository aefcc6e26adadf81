#!/usr/bin/env python3
"""Run every case of tests/tests/hostile_input.rs against a roamdisk binary
and write the table of docs/hostile-input.md: each mistyped input, the
command, its exit status and the first line of what it said.

Usage: bench/hostile-table.py [--bin target/release/roamdisk] [--out docs/hostile-input.md]

The test (`cargo nextest run -p roamdisk-tests -E 'binary(hostile_input)'`)
is what checks them; this only writes down what a user sees. Only the
Python standard library is used.
"""
import argparse, ast, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rust_to_py(text):
    """A Rust literal of strings, slices and tuples as Python source:
    `&[` becomes `[` outside string literals."""
    out, i, instr = [], 0, False
    while i < len(text):
        c = text[i]
        if instr:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                instr = False
        elif c == '"':
            instr = True
            out.append(c)
        elif c == "&":
            pass
        else:
            out.append(c)
        i += 1
    return "".join(out)


def balanced(src, at):
    """The text from the `(` at `at` to its matching `)`, strings skipped."""
    depth, i, instr = 0, at, False
    while True:
        c = src[i]
        if instr:
            if c == "\\":
                i += 1
            elif c == '"':
                instr = False
        elif c == '"':
            instr = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return src[at:i + 1]
        i += 1


def cases(src):
    """(what, args, env) of every `case(...)` in the test's CASES table."""
    keys = {m.group(1): ast.literal_eval(rust_to_py(m.group(2)))
            for m in re.finditer(r'const (\w+): &\[\(&str, &str\)\] = (&\[.*?\]);', src, re.S)}
    body = src[src.index("const CASES"):]
    body = body[:body.index("\n];")]
    out = []
    for m in re.finditer(r"\bcase\(", body):
        text = rust_to_py(balanced(body, m.end() - 1))
        for name, v in keys.items():
            text = re.sub(rf"\b{name}\b", repr(v), text)
        what, args, env = ast.literal_eval(text)
        out.append((what, args, list(env)))
    return out


def junk(d):
    noise = bytes((i * 7919 + 13) % 251 for i in range(1 << 16))
    files = {"junk.bin": noise, "empty": b"", "junk.key": b"hello\n", "jo.img": noise,
             "jo.img.cowmap": noise[:4096], "jl.lbsd": noise, "jl.lbsm": noise[:8192],
             "el.lbsd": b"", "el.lbsm": b"", "junk.toml": b"[[[ this is = not toml\n\x00\xff",
             "types.toml": b'format = 7\nversion = "one"\nsocket = [1, 2]\n[[export]]\nname = 5\n',
             "token.txt": b"0123456789abcdef0123456789abcdef\n"}
    server = ('format = "roamdisk-server"\nversion = 1\nstate = "st"\nsocket = "s.sock"\n{}\n'
              '[[image]]\nname = "d"\nstack = "mem:1M"\n')
    files["metrics-net.toml"] = server.format('metrics = "0.0.0.0:9477"').encode()
    files["metrics-token.toml"] = server.format(
        'metrics = "127.0.0.1:0"\nmetrics-token-file = "token.txt"').encode()
    files["metrics-unix.toml"] = server.format('metrics = "unix:"').encode()
    for n, b in files.items():
        open(os.path.join(d, n), "wb").write(b)
    os.chmod(os.path.join(d, "token.txt"), 0o644)
    os.makedirs(os.path.join(d, "badstore"))
    open(os.path.join(d, "badstore/store.toml"), "wb").write(b"magic = 3\n\xff\xfe")
    os.makedirs(os.path.join(d, "badcache"))
    open(os.path.join(d, "badcache/cache.toml"), "wb").write(noise[:300])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/roamdisk"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/hostile-input.md"))
    a = ap.parse_args()
    src = open(os.path.join(ROOT, "tests/tests/hostile_input.rs")).read()
    table = cases(src)
    rows, panics = [], 0
    with tempfile.TemporaryDirectory() as d:
        junk(d)
        store = os.path.join(d, "store")
        subprocess.run([a.bin, "-q", "store", "init", store], check=True)
        subprocess.run([a.bin, "-q", "commit", "mem:1M", "--to", "u/vm", "--store", store], check=True)
        for what, args, env in table:
            argv = [x.replace("{DIR}", d) for x in args]
            e = {"PATH": os.environ["PATH"], "HOME": d}
            e.update({k: v.replace("{DIR}", d) for k, v in env})
            r = subprocess.run(["timeout", "--signal=KILL", "20", a.bin, *argv], env=e,
                               capture_output=True, text=True, errors="replace")
            said = next((l for l in r.stderr.splitlines() if l.strip()), "").replace(d, "DIR")
            said = said.replace("|", "\\|")
            if len(said) > 220:
                said = said[:217] + "..."
            panics += r.returncode == 101 or "panicked" in r.stderr
            shown = " ".join(argv).replace(d, "DIR").replace("|", "\\|")
            envs = " ".join(f"{k}={v}" for k, v in env).replace("|", "\\|")
            rows.append(f"| {len(rows) + 1} | {what} | `{envs + ' ' if envs else ''}roamdisk {shown}` | {r.returncode} | {said} |")
    head = f"""# Hostile and mistyped input

Every input below is a case of `tests/tests/hostile_input.rs`, which the test command runs:
each must end within 20 s with exit status 1 (an error) or 2 (a usage error) and a message,
never a panic (101) or a hang. **{len(rows)} inputs, {panics} panics.** DIR is a folder of junk
files (random bytes as images, stores, caches, keys, configs; empty files; TOML of the wrong
types) and a real store holding `u/vm`; the S3 cases run against no server (or port 1).

Regenerate with `bench/hostile-table.py` (it runs the cases against `target/release/roamdisk`).

| # | input | command | exit | what it says (first line) |
| ---: | --- | --- | ---: | --- |
"""
    open(a.out, "w").write(head + "\n".join(rows) + "\n")
    print(f"{len(rows)} cases, {panics} panics: {a.out}")
    return 1 if panics else 0


if __name__ == "__main__":
    sys.exit(main())
