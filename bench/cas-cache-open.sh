#!/usr/bin/env bash
# Opening a large shared cache (issue: cost at scale): a version of
# 204,800 chunks (800 MiB of random data cut at 4 KiB) hoarded into a
# shared cache, then the time and peak memory of `roamdisk cache status`
# and of opening a session on that version over the cache (`roamdisk info
# cas[...]`), medians of RUNS, for this build and, with BASE_BIN, another
# one in the same rounds. Needs ~1.7 GB in DIR.
#
# Usage: bench/cas-cache-open.sh [DIR] [RUNS]    (BASE_BIN=/path/to/roamdisk)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${ROAMDISK_BIN:-$here/../target/release/roamdisk}
dir=${1:-/var/tmp/roamdisk-cache-open}
runs=${2:-5}
mkdir -p "$dir"
cd "$dir"
if [ ! -d cache/chunks ]; then
    rm -rf store cache sess big.img
    head -c $((800 << 20)) /dev/urandom >big.img
    "$B" -q store init store
    "$B" -q commit big.img --to bench/big --store store --chunk-size 4K
    rm big.img
    # 204,800 chunks counted at 64 KiB each need a cap above 12.5 GiB.
    "$B" -q hoard bench/big --store store --shared-cache "$dir/cache" 2>/dev/null || true
    sed -i 's/^size = .*/size = 21474836480/' cache/cache.toml
    "$B" -q hoard bench/big --store store --shared-cache "$dir/cache"
fi
[ -d sess ] || "$B" -q checkout bench/big --session sess --store store
echo "chunk files: $(find cache/chunks -type f | wc -l)"
bins=("$B")
[ -n "${BASE_BIN:-}" ] && bins+=("$BASE_BIN")
declare -A t
for ((r = 0; r < runs; r++)); do
    for bin in "${bins[@]}"; do
        for what in status open; do
            if [ $what = status ]; then
                cmd=("$bin" cache status --shared-cache "$dir/cache")
            else
                cmd=("$bin" info "cas[shared-cache=$dir/cache]:sess")
            fi
            /usr/bin/time -o "$dir/time.out" -f "%e %M" "${cmd[@]}" >/dev/null 2>&1
            t[$bin,$what]+="$(tail -1 "$dir/time.out");"
        done
    done
done
for bin in "${bins[@]}"; do
    for what in status open; do
        echo "${t[$bin,$what]}" | tr ';' '\n' | grep . | sort -n | awk -v b="$bin" -v w="$what" \
            '{s[NR]=$1; m[NR]=$2} END {printf "%-40s %-7s median %.2f s (of %d), peak RSS %d MB\n", b, w, s[int((NR+1)/2)], NR, m[int((NR+1)/2)]/1024}'
    done
done
echo "statx calls of one cache status: $(strace -f -c "$B" cache status --shared-cache "$dir/cache" 2>&1 >/dev/null | awk '$NF=="statx" {print $4}')"
