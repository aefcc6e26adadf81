#!/usr/bin/env bash
# Commit of a disk image of new data (random bytes: nothing to deduplicate,
# nothing to compress) against the hash functions' own speed on the same
# file, in the same run: b3sum (all cores and one), sha256sum (one core,
# and two at once on the two halves = all cores here), then
# `roamdisk commit` into a fresh store for each hash function, with and
# without zstd. Also prints the compressed index size of the commit.
#
# Usage: bench/cas-commit-speed.sh            (4 GiB image in /dev/shm)
#        SIZE=1G DIR=/var/tmp/x bench/cas-commit-speed.sh
#        ROAMDISK_BIN=/tmp/rd COMPARE_BIN=/tmp/rd-old bench/cas-commit-speed.sh
#        (COMPARE_BIN adds a row: the same commit by another build)
#        DISK_STORE=/var/tmp/s bench/cas-commit-speed.sh   (adds a store on a disk)
# Needs: b3sum, sha256sum, a release build (cargo build --release -p roamdisk).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-4G}
DIR=${DIR:-/dev/shm/roamdisk-cas-bench}
B=${ROAMDISK_BIN:-$PWD/target/release/roamdisk}
. bench/cas-env.sh
random_image "$DIR" "$SIZE"
half=$((bytes / 2 / 4194304))
cat "$img" > /dev/null

secs() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
# row WHAT SECONDS [REFERENCE-SECONDS]: the last column is the speed as a
# share of the reference's (the hash function on all cores, same run).
row() {
  local pct=""
  [ -n "${3:-}" ] && pct=$(printf "%.0f%%" "$(echo "100 * $3 / $2" | bc -l)")
  printf "| %-44s | %8.2f | %8.0f | %6s |\n" "$1" "$2" "$(echo "$bytes / 1000000 / $2" | bc -l)" "$pct"
}
sha_halves() {
  (dd if="$img" bs=4M count="$half" status=none | sha256sum > /dev/null) &
  (dd if="$img" bs=4M skip="$half" status=none | sha256sum > /dev/null) &
  wait
}
recommit() {  # the same image again: every chunk is already stored
  "$B" commit "$img" --to bench/disk --store "$DIR/store" --json -q > /dev/null 2>&1
}
commit() {  # hash compression [binary]
  local bin=${3:-$B}
  rm -rf "$DIR/store"
  "$bin" -q store init "$DIR/store" --hash "$1" --compression "$2"
  "$bin" commit "$img" --to bench/disk --store "$DIR/store" --json -q > "$DIR/commit.json" 2>/dev/null
}

echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), image $SIZE of random data in $DIR"
echo "| what | seconds | MB/s | of hash, all cores |"
echo "| --- | ---: | ---: | ---: |"
b3=$(secs b3sum "$img")
row "b3sum (all cores)" "$b3"
row "b3sum --num-threads 1" "$(secs b3sum --num-threads 1 "$img")"
row "roamdisk commit, blake3, no compression" "$(secs commit blake3 none)" "$b3"
idx=$(grep -o '"index_bytes": [0-9]*' "$DIR/commit.json" | grep -o '[0-9]*$')
row "roamdisk commit again (all chunks stored)" "$(secs recommit)" "$b3"
if [ -n "${COMPARE_BIN:-}" ]; then  # another build, e.g. before a change
  row "$(basename "$COMPARE_BIN") commit, blake3, no compression" "$(secs commit blake3 none "$COMPARE_BIN")" "$b3"
fi
row "roamdisk commit, blake3, zstd" "$(secs commit blake3 zstd)" "$b3"
row "sha256sum (one core)" "$(secs sha256sum "$img")"
sha2=$(secs sha_halves)
row "sha256sum x2 on the two halves (all cores)" "$sha2"
row "roamdisk commit, sha256, no compression" "$(secs commit sha256 none)" "$sha2"
row "roamdisk commit again, sha256 (all stored)" "$(secs recommit)" "$sha2"
if [ -n "${DISK_STORE:-}" ]; then  # a store on a real disk (fsync per chunk)
  rm -rf "$DISK_STORE"; "$B" -q store init "$DISK_STORE" --compression none
  t=$(secs "$B" commit "$img" --to bench/disk --store "$DISK_STORE" -q)
  row "roamdisk commit, blake3, store on $DISK_STORE" "$t" "$b3"; rm -rf "$DISK_STORE"
fi
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "compressed index of the $SIZE commit: $idx bytes = $(echo "$idx * 100 / $bytes" | bc -l | cut -c1-6)% of the disk (every chunk non-zero: the worst case)"
rm -rf "$DIR/store" "$DIR/commit.json"
