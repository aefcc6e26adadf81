#!/bin/sh
# Machine Bank's block-size model (Figures 4-5) with the seed's FixDelay
# 8 ms and Bandwidth 6 MB/s on
#  - the seed's own traces as we model them (section 3.3): Windows XP
#    booting under Virtual PC (vpc-boot) and launching Office (vpc-office),
#    one VM each;
#  - the 50-client Linux-like boot trace, per-client and shared caches;
# plus sweeps of the generators' sequential share
# (crates/cachesim/examples/blocksize_sweep.rs) showing how the optimum
# follows the length of sequential runs. Output in bench/results/cachesim/.
set -eu
. "$(dirname "$0")/cachesim-env.sh"
build blocksize_sweep
for K in vpc-boot vpc-office; do
  T=$WORK/$K.rdtrace
  "$R" trace synth "$K" --seed 1 -o "$T" -q
  "$R" trace stats "$T" > "$OUT/$K-stats.txt"
  "$R" model blocksize "$T" --fix-delay 8ms --bandwidth 6MB/s --plot "$OUT/$K-blocksize" -q \
    | tee "$OUT/$K-blocksize.txt"
done
"$ROOT/target/release/examples/blocksize_sweep" vpc | tee "$OUT/vpc-blocksize-sweep.txt"
B=$WORK/boot.rdtrace
[ -f "$B" ] || "$R" trace synth boot --seed 1 -o "$B" -q
"$R" model blocksize "$B" --fix-delay 8ms --bandwidth 6MB/s --plot "$OUT/boot-blocksize" -q \
  | tee "$OUT/boot-blocksize.txt"
"$R" model blocksize "$B" --fix-delay 8ms --bandwidth 6MB/s --shared-cache -q \
  | tee "$OUT/boot-blocksize-shared.txt"
"$ROOT/target/release/examples/blocksize_sweep" boot | tee "$OUT/boot-blocksize-sweep.txt"
