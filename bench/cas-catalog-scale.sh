#!/usr/bin/env bash
# A catalog of many versions (issue: cost at scale): commit a 1 MiB disk
# to one image N times in batches of 1,000, printing the mean time per
# commit of each batch (a commit's cost should not grow with the number of
# versions before it), then time `log` and a checkout of the latest
# version with N versions in the catalog, with their peak RSS.
#
# Usage: bench/cas-catalog-scale.sh [DIR] [N]     (N a multiple of 1000; default 10000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${ROAMDISK_BIN:-$here/../target/release/roamdisk}
dir=${1:-/var/tmp/roamdisk-catalog}
n=${2:-10000}
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
head -c $((1 << 20)) /dev/urandom >d.img
"$B" -q store init store
for ((k = 1; k <= n / 1000; k++)); do
    s=$(date +%s%N)
    for ((i = 0; i < 1000; i++)); do
        "$B" -q commit d.img --to u/vm --store store
    done
    e=$(date +%s%N)
    echo "versions $(((k - 1) * 1000 + 1))-$((k * 1000)): $(((e - s) / 1000 / 1000)) µs per commit"
done
echo "catalog file: $(stat -c %s store/refs/u/vm) bytes"
/usr/bin/time -f "log of $n versions: %e s, peak RSS %M KB" "$B" log u/vm --store store 2>&1 >/dev/null | tail -1
/usr/bin/time -f "checkout of the latest: %e s, peak RSS %M KB" "$B" -q checkout u/vm --store store --output o.raw 2>&1 | tail -1
