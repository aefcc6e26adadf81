#!/usr/bin/env bash
# Free-space scan speed: roamdisk vs e2freefrag on a 1 TiB sparse ext4
# image (4 KiB blocks) fragmented with thousands of holes, same run, warm
# page cache for both (each tool runs once untimed first).
#
# Usage: bench/borrow-scan.sh [WORKDIR] [RUNS]
#   ROAMDISK=path/to/roamdisk (default target/release/roamdisk)
# The image is sparse (a few hundred MiB on disk); WORKDIR defaults to a
# temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ROAMDISK:-$PWD/target/release/roamdisk}
work=${1:-$(mktemp -d /tmp/borrow-scan.XXXXXX)}
runs=${2:-5}
mkdir -p "$work"
files=${FILES:-6000}

t() { # print the wall seconds of "$@" (output discarded)
  local s e
  s=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  e=$(date +%s.%N)
  echo "$e - $s" | bc -l
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Two images: default ext4 (flex_bg, metadata_csum: untouched groups are
# BLOCK_UNINIT and have no bitmap on disk), and one without uninit_bg,
# where every one of the 8192 block bitmaps is on disk and read.
for variant in default all-bitmaps; do
  img=$work/tib-$variant.img
  if [ ! -f "$img" ]; then
    echo "building $img: 1 TiB sparse ext4, $files fallocated files, every other one deleted"
    truncate -s 1T "$img"
    if [ $variant = default ]; then
      mke2fs -q -F -t ext4 -b 4096 -E lazy_itable_init=1,lazy_journal_init=1 "$img"
    else
      mke2fs -q -F -t ext4 -b 4096 -O ^metadata_csum,^uninit_bg -N 200000 "$img"
    fi
    # Files of 1..255 MiB allocated (uninitialized extents: no data
    # written), then every other one removed: thousands of free holes of
    # assorted sizes between allocated runs.
    python3 - "$files" > "$work/alloc.cmds" <<'PY'
import random, sys
r = random.Random(1)
n = int(sys.argv[1])
for i in range(n):
    print(f"write /dev/null f{i}")
    blocks = r.randint(1, 255) * 256
    print(f"fallocate /f{i} 0 {blocks - 1}")
for i in range(0, n, 2):
    print(f"rm /f{i}")
PY
    debugfs -w -f "$work/alloc.cmds" "$img" >/dev/null 2>&1
    e2fsck -fn "$img" >/dev/null
  fi
  echo "== $variant: $(du -h --apparent-size "$img" | cut -f1) apparent, $(du -h "$img" | cut -f1) on disk"
  ours_free=$("$bin" borrow free "$img" | awk 'NR==1 {print $6}')
  tool_blocks=$(e2freefrag "$img" | awk '/^Free blocks:/ {print $3}')
  tool_free=$((tool_blocks * 4096))
  holes=$(e2freefrag "$img" | awk '/^Num. free extent:/ {print $4}')
  echo "free bytes: roamdisk $ours_free, e2freefrag $tool_free; free extents (e2freefrag): $holes"
  [ "$ours_free" = "$tool_free" ] || { echo "MISMATCH"; exit 1; }
  t e2freefrag "$img" >/dev/null; t "$bin" borrow scan "$img" >/dev/null
  : > "$work/e2ff.t"; : > "$work/scan.t"; : > "$work/free.t"
  for _ in $(seq "$runs"); do
    t e2freefrag "$img" >> "$work/e2ff.t"
    t "$bin" -q borrow scan "$img" --json >> "$work/scan.t"
    t "$bin" borrow free "$img" >> "$work/free.t"
  done
  printf '%-52s %8s\n' "command (median of $runs, warm cache)" seconds
  printf '%-52s %8.3f\n' "e2freefrag IMAGE" "$(median < "$work/e2ff.t")"
  printf '%-52s %8.3f\n' "roamdisk borrow scan IMAGE (plan, 4 MiB filter)" "$(median < "$work/scan.t")"
  printf '%-52s %8.3f\n' "roamdisk borrow free IMAGE (every extent listed)" "$(median < "$work/free.t")"
done
if [ -z "${1:-}" ]; then rm -rf "$work"; fi
