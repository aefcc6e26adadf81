#!/bin/sh
# Machine Bank's block-size model (Figures 4-5) on the 50-client boot trace
# with the seed's FixDelay 8 ms and Bandwidth 6 MB/s, per-client and
# shared caches, plus a sweep of the boot generator's sequential share
# (crates/cachesim/examples/blocksize_sweep.rs) showing how the optimum
# follows the length of sequential runs. Output in bench/results/cachesim/.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
R=$ROOT/target/release/roamdisk
WORK=${WORK:-/tmp/roamdisk-cachesim-bench}
OUT=$ROOT/bench/results/cachesim
mkdir -p "$WORK" "$OUT"
[ -n "${NO_BUILD:-}" ] || (cd "$ROOT" && cargo build --release -q -p roamdisk && \
  cargo build --release -q -p roamdisk-cachesim --example blocksize_sweep)
B=$WORK/boot.rdtrace
[ -f "$B" ] || "$R" trace synth boot --seed 1 -o "$B" -q
"$R" model blocksize "$B" --fix-delay 8ms --bandwidth 6MB/s --plot "$OUT/boot-blocksize" -q \
  | tee "$OUT/boot-blocksize.txt"
"$R" model blocksize "$B" --fix-delay 8ms --bandwidth 6MB/s --shared-cache -q \
  | tee "$OUT/boot-blocksize-shared.txt"
"$ROOT/target/release/examples/blocksize_sweep" | tee "$OUT/boot-blocksize-sweep.txt"
