#!/usr/bin/env bash
# gc alone at two store sizes (issue: cost at scale): a store of one
# version of a disk of each size in GiB (bench/scale.py's mix of data,
# zeros and repeated blocks; 4 KiB chunks: 1 GiB ~66k objects, 16 GiB
# ~1.05M), then RUNS gc runs of each size alternating, with a sync before
# each (nothing to collect: the cost is the mark and the listing). Prints
# each time, the medians and the cost per GiB of the larger size against
# the smaller (the bar is <= 1.25x). ROAMDISK_BIN picks the build.
#
# Usage: bench/gc-alone.sh [SMALL_GIB] [LARGE_GIB] [RUNS] [DIR]   (default 1 16 5 /var/tmp/roamdisk-gc-alone)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${ROAMDISK_BIN:-$here/../target/release/roamdisk}
small=${1:-1}
large=${2:-16}
runs=${3:-5}
dir=${4:-/var/tmp/roamdisk-gc-alone}
rm -rf "$dir"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
for g in "$small" "$large"; do
    python3 -c "import sys; sys.path.insert(0, '$here'); import scale; scale.make_disk('$dir/disk.img', $g)"
    "$B" -q store init "$dir/$g"
    "$B" -q commit "$dir/disk.img" --to bench/vm --store "$dir/$g" --chunk-size 4K
    rm "$dir/disk.img"
done
declare -A times
for ((r = 1; r <= runs; r++)); do
    for g in "$small" "$large"; do
        sync
        s=$(date +%s%N)
        "$B" -q gc --store "$dir/$g" >/dev/null
        times[$g]+="$((($(date +%s%N) - s) / 1000000)) "
    done
    echo "run $r: ${small} GiB $(echo ${times[$small]} | awk '{print $NF}') ms, ${large} GiB $(echo ${times[$large]} | awk '{print $NF}') ms"
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
ms=$(echo "${times[$small]}" | median)
ml=$(echo "${times[$large]}" | median)
echo "medians: ${small} GiB $ms ms, ${large} GiB $ml ms; per GiB ${large} / ${small}: $(awk -v s="$ms" -v l="$ml" -v a="$small" -v b="$large" 'BEGIN {printf "%.2f", (l / b) / (s / a)}')x"
