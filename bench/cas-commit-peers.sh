#!/usr/bin/env bash
# Commit of new data against what a user would pick for the same job, same
# disk, same run (issue: roaming, "commit speed"): `roamdisk commit` into a
# fresh store, `restic backup` into a fresh repository, `casync make` into a
# fresh chunk store, and the durable-copy limit `dd bs=4M conv=fdatasync`
# (the issue's) with `dd bs=64K` beside it: on the measuring VM, 4 MiB
# writes fill the page cache with large folios that are slow to touch the
# first time (guest memory the balloon has reported free to the host), so
# `bs=4M` is 2-4x slower than `bs=64K` there.
# Every row ends with `sync -f` on the target file system, so each one is
# timed until its data is on disk (restic and casync do not all fsync).
# The image is random data (nothing to deduplicate or compress) kept in the
# page cache, so every row reads the same warm source. Each round starts
# one tool later in the list, so no tool always follows the same one (what
# the previous tool left behind -- freed page cache, 16,000 just-deleted
# files -- changes the next one's time on this VM).
#
# Usage: bench/cas-commit-peers.sh                 (1 GiB, 3 interleaved runs)
#        SIZE=4G RUNS=5 DIR=/var/tmp/x bench/cas-commit-peers.sh
#        BASE_BIN=/tmp/roamdisk-old bench/cas-commit-peers.sh
#                  (adds a row for another roamdisk build, same rounds)
# Prints a Markdown table: median seconds, MB/s and CPU seconds (user +
# system) per tool, and roamdisk's speed as a multiple of the faster peer
# and of dd.
# Needs: restic, casync (Debian packages), a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-1G}
RUNS=${RUNS:-3}
DIR=${DIR:-/var/tmp/roamdisk-commit-peers}
B=${ROAMDISK_BIN:-$PWD/target/release/roamdisk}
for t in restic casync dd; do
  command -v "$t" > /dev/null || { echo "missing $t: apt-get install restic casync" >&2; exit 1; }
done
. bench/cas-env.sh
random_image "$DIR" "$SIZE"
export RESTIC_PASSWORD=bench

clean() { rm -rf "$DIR/out"; mkdir -p "$DIR/out"; sync -f "$DIR"; cat "$img" > /dev/null; }
run_roamdisk() {
  "$B" -q store init "$DIR/out/store"
  "$B" commit "$img" --to bench/disk --store "$DIR/out/store" -q > /dev/null
}
run_base() {
  "$BASE_BIN" -q store init "$DIR/out/store"
  "$BASE_BIN" commit "$img" --to bench/disk --store "$DIR/out/store" -q > /dev/null
}
run_restic() {
  restic -q init --repo "$DIR/out/restic" > /dev/null
  restic -q backup --repo "$DIR/out/restic" "$img" > /dev/null
}
run_casync() { casync make --store="$DIR/out/casync.castr" "$DIR/out/disk.caibx" "$img" > /dev/null; }
run_dd() { dd if="$img" of="$DIR/out/copy.img" bs=4M conv=fdatasync status=none; }
run_dd64k() { dd if="$img" of="$DIR/out/copy.img" bs=64K conv=fdatasync status=none; }
timed() {  # "SECONDS CPU" for "$@" and a file-system sync after it
  local t0 t1
  t0=$(date +%s.%N)
  { TIMEFORMAT='%U %S'; time "$@" 2>&3; } 3>&2 2> "$DIR/cpu"
  sync -f "$DIR/out"; t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc -l) $(awk '{print $1 + $2}' "$DIR/cpu")"
}

tools=(roamdisk restic casync dd dd64k)
[ -n "${BASE_BIN:-}" ] && tools=(roamdisk base restic casync dd dd64k)
declare -A times cpus
n=${#tools[@]}
for ((r = 1; r <= RUNS; r++)); do
  for ((k = 0; k < n; k++)); do
    t=${tools[$(((r - 1 + k) % n))]}
    clean
    read -r s c < <(timed "run_$t")
    times[$t]="${times[$t]:-} $s"
    cpus[$t]="${cpus[$t]:-} $c"
    echo "run $r: $t $s s, $c s CPU" >&2
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
declare -A med medcpu
for t in "${tools[@]}"; do
  med[$t]=$(echo "${times[$t]}" | median)
  medcpu[$t]=$(echo "${cpus[$t]}" | median)
done
mbs() { echo "$bytes / 1000000 / $1" | bc -l; }
peer=${med[restic]}
peer_name=restic
if (($(echo "${med[casync]} < $peer" | bc -l))); then peer=${med[casync]}; peer_name=casync; fi

echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $SIZE of random data in $DIR, median of $RUNS interleaved runs"
echo "| tool | seconds | MB/s | CPU s | all runs (s) |"
echo "| --- | ---: | ---: | ---: | --- |"
for t in "${tools[@]}"; do
  printf "| %s | %.2f | %.0f | %.2f | %s |\n" "$t" "${med[$t]}" "$(mbs "${med[$t]}")" "${medcpu[$t]}" \
    "$(echo "${times[$t]}" | xargs printf '%.2f ')"
done
for t in roamdisk ${BASE_BIN:+base}; do
  printf "\n%s commit = %.2fx the faster peer (%s), %.2fx the durable copy (dd bs=4M), %.2fx dd bs=64K\n" \
    "$t" "$(echo "$peer / ${med[$t]}" | bc -l)" "$peer_name" "$(echo "${med[dd]} / ${med[$t]}" | bc -l)" \
    "$(echo "${med[dd64k]} / ${med[$t]}" | bc -l)"
done
