# Drives a `cache:...:raw:IMG` export with libnbd: random reads, writes,
# zeroes and trims from one connection compared byte for byte with the
# same operations on a plain file, then two writers and two readers racing
# on the same blocks, then every byte of the export against IMG (no stale
# cached block).
# argv: URI IMG MODEL BLOCK SEED
import os, random, sys, threading
import nbd

uri, img, model, block, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rnd = random.Random(seed)

def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h

h = connect()
size = h.get_size()
mf = os.open(model, os.O_RDWR)
rf = os.open(img, os.O_RDONLY)
assert os.fstat(mf).st_size == size, (os.fstat(mf).st_size, size)

# Phase 1: one connection against the model file.
hot = [rnd.randrange(size) for _ in range(24)]
for step in range(3000):
    # Mostly near a few hot spots, so the cache hits; sometimes anywhere.
    off = rnd.choice(hot) + rnd.randrange(-3 * block, 3 * block) if rnd.random() < 0.8 else rnd.randrange(size)
    off = min(max(off, 0), size - 1)
    n = min(rnd.choice([1, 511, 4096, block, block + 1, 3 * block - 7, rnd.randrange(1, 4 * block)]), size - off)
    op = rnd.random()
    if op < 0.55:
        got = h.pread(n, off)
        want = os.pread(mf, n, off)
        if got != want:
            i = next(i for i in range(n) if got[i] != want[i])
            sys.exit(f"step {step}: read {off}+{n} differs at byte {off + i}: {got[i]} != {want[i]}")
    elif op < 0.85:
        data = bytes([rnd.randrange(1, 256)]) * n if rnd.random() < 0.5 else rnd.randbytes(n)
        h.pwrite(data, off)
        os.pwrite(mf, data, off)
    elif op < 0.95:
        h.zero(n, off)
        os.pwrite(mf, bytes(n), off)
    else:
        h.trim(n, off)
        # What NEXT reads after a trim is its business: take it from IMG.
        os.pwrite(mf, os.pread(rf, n, off), off)
print("phase 1 ok")

# Phase 2: writers and readers of the same blocks on four connections.
# What a read racing a write of the same bytes returns is unspecified, and
# a raw file does not even keep 4 KiB pages whole (the kernel copies a page
# while a write fills it: the same script against `raw:IMG` alone sees
# mixed pages), so the readers only read; what must hold is checked after
# the race: the cache holds no stale block. (Whole cached blocks are never
# torn: `racing_writes_and_reads_leave_no_stale_or_torn_block` in
# crates/cachesim/src/layer.rs checks that over a page-atomic NEXT.)
blocks = min(6, size // block)
def writer(t):
    c = connect()
    r = random.Random(seed * 10 + t)
    for i in range(400):
        b = r.randrange(blocks)
        pages = max(1, block // 4096)
        p0 = r.randrange(pages)
        np = r.randrange(1, pages - p0 + 1)
        c.pwrite(bytes([(t - 1) * 120 + i % 120 + 1]) * (np * 4096), b * block + p0 * 4096)
    c.shutdown()
def reader(t):
    c = connect()
    r = random.Random(seed * 20 + t)
    for i in range(400):
        b = r.randrange(blocks)
        off = b * block + r.randrange(block)
        c.pread(min(r.randrange(1, 2 * block), size - off), off)
    c.shutdown()
ts = [threading.Thread(target=writer, args=(t,)) for t in (1, 2)] + [threading.Thread(target=reader, args=(t,)) for t in (1, 2)]
for t in ts: t.start()
for t in ts: t.join()

# Every byte the export reads equals IMG's (no stale cached block).
h.flush()
step = 1 << 20
for off in range(0, size, step):
    n = min(step, size - off)
    got, want = h.pread(n, off), os.pread(rf, n, off)
    if got != want:
        i = next(i for i in range(n) if got[i] != want[i])
        sys.exit(f"after the race: byte {off + i} reads {got[i]} through the cache, {want[i]} in the image")
print("phase 2 ok")
