#!/usr/bin/env bash
# Start-up and shut-down cost of a borrowed transient disk, broken down as
# the seed's Figures 9 and 10: TP Allocate (scan + open/verify), VM State
# Copy (copy-in), VM State Save (copy-back of the modified state) for 0, 5,
# 50 and 500 MiB of modified state; plus the time to allocate a 100 GiB
# borrowed disk (the seed's experiment size).
#
# Host: a 200 GiB sparse ext4 image, fragmented (fallocated files, every
# other one deleted). VM state: a 4 GiB raw image holding 1 GiB of data
# (the seed's VM had a 4 GB disk). Both live in WORKDIR, on the same disk
# (the portable medium is not emulated: copy-in/back speeds are this
# machine's disk speed).
#
# Usage: bench/borrow-run.sh [WORKDIR]
#   ROAMDISK=path/to/roamdisk (default target/release/roamdisk)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ROAMDISK:-$PWD/target/release/roamdisk}
work=${1:-$(mktemp -d /tmp/borrow-run.XXXXXX)}
mkdir -p "$work"
host=$work/host.img
state=$work/vm.img
sock=$work/vm.sock

if [ ! -f "$host" ]; then
  echo "building a 200 GiB sparse ext4 host image"
  truncate -s 200G "$host"
  mke2fs -q -F -t ext4 -b 4096 -E lazy_itable_init=1,lazy_journal_init=1 "$host"
  python3 - > "$work/alloc.cmds" <<'PY'
import random
r = random.Random(2)
for i in range(1000):
    print(f"write /dev/null f{i}")
    print(f"fallocate /f{i} 0 {r.randint(1, 255) * 256 - 1}")
for i in range(0, 1000, 2):
    print(f"rm /f{i}")
PY
  debugfs -w -f "$work/alloc.cmds" "$host" >/dev/null 2>&1
fi
if [ ! -f "$state" ]; then
  echo "building a 4 GiB VM disk with 1 GiB of data"
  truncate -s 4G "$state"
  for at in 0 1024 2048 3072; do
    dd if=/dev/urandom of="$state" bs=1M count=256 seek=$at conv=notrunc status=none
  done
fi

t() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc -l; }

echo
echo "Allocating a 100 GiB borrowed disk (seed: 100 GB):"
printf '  %-44s %7.3f s\n' "borrow scan --size 100G (discovery + plan)" "$(t "$bin" -q borrow scan "$host" --size 100G --plan "$work/100g.plan")"
printf '  %-44s %7.3f s\n' "borrow check (re-verify every extent free)" "$(t "$bin" borrow check "$work/100g.plan")"
extents=$("$bin" borrow show "$work/100g.plan" --dm-table | wc -l)
echo "  plan: $extents extents"

run() { # MODIFIED_MIB EXTRA-ARGS...
  local mib=$1
  shift
  local exec=true
  if [ "$mib" -gt 0 ]; then
    exec="qemu-io -f raw \"\$ROAMDISK_NBD_URI\" -c 'write -P 0x5a 512M ${mib}M' >/dev/null"
  fi
  "$bin" -q borrow run --host "$host" --state "raw:$state" --socket "$sock" --exec "$exec" --json "$@"
}

echo
printf '%-22s %8s %8s %8s %9s %8s %8s %9s %9s\n' case scan alloc copy-in in-MiB serve back back-MiB release
for c in "0" "5" "50" "500" "0 --on-demand" "50 --scrub"; do
  # shellcheck disable=SC2086
  json=$(run $c)
  python3 - "$c" "$json" <<'PY'
import json, sys
t = json.loads(sys.argv[2])
name = "TP-" + sys.argv[1].split()[0] + " MiB" + ("".join(" " + a.lstrip("-") for a in sys.argv[1].split()[1:]))
print(f"{name:<22} {t['scan_s']:8.3f} {t['allocate_s']:8.3f} {t['copy_in_s']:8.3f} {t['copy_in_bytes']/2**20:9.0f} "
      f"{t['serve_s']:8.3f} {t['copy_back_s']:8.3f} {t['copy_back_bytes']/2**20:9.1f} {t['release_s']:9.3f}")
PY
done
echo
echo "start-up cost = scan + alloc + copy-in; shut-down cost = back + release (seconds)"
if [ -z "${1:-}" ]; then rm -rf "$work"; fi
