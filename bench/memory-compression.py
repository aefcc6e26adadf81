#!/usr/bin/env python3
"""How a VM's memory compresses, chunk by chunk: what a page image's
chunks cost on the link under each codec (issue 37: "choose the memory
image's chunk size and compression by measurement").

Reads a QEMU migration stream of a stopped VM (QEMU's QMP `stop`, then
`migrate` with uri `exec:cat > FILE`), rebuilds pc.ram from its page
records, cuts it at fixed offsets into chunks of each --chunks size as a
suspend does, drops the all-zero ones (stored as nothing) and compresses
each stored chunk on its own with zstd at several levels and lz4 (a chunk
that does not shrink is stored as it is). Prints stored bytes, their share
of the raw bytes, and compression and decompression rates on this machine.

Usage: bench/memory-compression.py STREAM [--chunks 16K,64K]
Needs: pip install zstandard lz4
"""
import argparse, struct, time

import lz4.frame
import zstandard


def ram_of(b):
    """pc.ram, rebuilt from a precopy stream (the layout of
    docs/formats/qemu-migration.md)."""
    p = 8
    if b[p] == 7:
        p += 5 + struct.unpack(">I", b[p + 1:p + 5])[0]
        while b[p] == 5:
            raise SystemExit("configuration subsections: not handled here")
    assert b[p] == 1, "a RAM START section"
    q = p + 5
    q += 1 + b[q] + 8
    tot = struct.unpack(">Q", b[q:q + 8])[0] & ~0xFFF
    q += 8
    blocks = {}
    while tot > 0:
        nl = b[q]
        name = b[q + 1:q + 1 + nl].decode()
        q += 1 + nl
        ln = struct.unpack(">Q", b[q:q + 8])[0]
        q += 8
        tot -= ln
        blocks[name] = bytearray(ln)
    q += 8
    if b[q] == 0x7E:
        q += 5
    last = None
    while True:
        t = b[q]
        q += 1
        if t not in (2, 3):
            break
        q += 4
        while True:
            a = struct.unpack(">Q", b[q:q + 8])[0]
            q += 8
            fl, off = a & 0xFFF, a & ~0xFFF
            if fl & 0x10:
                break
            if not fl & 0x20:
                nl = b[q]
                last = b[q + 1:q + 1 + nl].decode()
                q += 1 + nl
            if fl & 2:
                q += 1
            else:
                blocks[last][off:off + 4096] = b[q:q + 4096]
                q += 4096
        if b[q] == 0x7E:
            q += 5
        if t == 3:
            break
    return bytes(blocks["pc.ram"])


def size(s):
    return int(s[:-1]) << (10 if s.endswith("K") else 20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stream")
    ap.add_argument("--chunks", default="16K,64K")
    a = ap.parse_args()
    ram = ram_of(open(a.stream, "rb").read())
    print("| chunk | codec | stored chunks | raw MB | stored MB | share | compress MB/s | decompress MB/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cs in map(size, a.chunks.split(",")):
        chunks = [c for c in (ram[i:i + cs] for i in range(0, len(ram), cs)) if any(c)]
        raw = sum(map(len, chunks))
        codecs = [(f"zstd:{l}", zstandard.ZstdCompressor(level=l).compress,
                   zstandard.ZstdDecompressor().decompress) for l in (1, 3, 9, 19)]
        codecs.append(("lz4", lz4.frame.compress, lz4.frame.decompress))
        for name, comp, decomp in codecs:
            t0 = time.time()
            out = [comp(c) for c in chunks]
            tc = time.time() - t0
            stored = sum(min(len(o), len(c)) for o, c in zip(out, chunks))
            t0 = time.time()
            for o in out:
                decomp(o)
            td = time.time() - t0
            print(f"| {cs >> 10} KiB | {name} | {len(chunks)} | {raw / 1e6:.1f} | {stored / 1e6:.1f} "
                  f"| {stored / raw * 100:.0f}% | {raw / tc / 1e6:.0f} | {raw / td / 1e6:.0f} |")


if __name__ == "__main__":
    main()
