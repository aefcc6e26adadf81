#!/usr/bin/env bash
# sperf on the flashsim SD-card model: the seed's Figures 1-5 for the
# Class 6 preset, and Figures 2 and 4 for the three presets side by side.
# Usage: bench/workload-sperf.sh [PLOT_DIR]   (default docs/img)
# Needs: cargo build --release -p roamdisk
set -euo pipefail
cd "$(dirname "$0")/.."
R=${ROAMDISK_BIN:-target/release/roamdisk}
OUT=${1:-docs/img}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"

echo "== sperf, flashsim class6, Figures 1-5 (simulated card time)"
"$R" sperf flashsim:class6:mem:128M --figure all --plot "$TMP/class6"
echo "== sperf, three card presets, Figures 2 and 4"
"$R" sperf flashsim:class6:mem:128M flashsim:class4:mem:128M flashsim:class10:mem:128M \
  --figure 2,4 --plot "$TMP/cards"

for f in 1 2 3 4 5; do
  cp "$TMP/class6/sperf-fig$f.svg" "$OUT/workload-sperf-fig$f.svg"
done
cp "$TMP/cards/sperf-fig2.svg" "$OUT/workload-sperf-cards-fig2.svg"
cp "$TMP/cards/sperf-fig4.svg" "$OUT/workload-sperf-cards-fig4.svg"
echo "plots in $OUT/workload-sperf-*.svg"
