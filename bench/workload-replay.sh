#!/usr/bin/env bash
# Replay overhead (requests/s against RAM, in process and over NBD) and
# the cost of the trace recorder. Medians of REPS runs.
# Usage: bench/workload-replay.sh [REQUESTS] [REPS]   (default 1000000 3)
# Needs: cargo build --release -p roamdisk
set -euo pipefail
cd "$(dirname "$0")/.."
R=${ROAMDISK_BIN:-$PWD/target/release/roamdisk}
N=${1:-1000000}
REPS=${2:-3}
. bench/workload-replay-env.sh
desktop_traces "$R" "$N"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
measure() { # LABEL REPLAY-ARGS...: the median requests/s of REPS replays
  local label=$1; shift
  local v
  v=$(for _ in $(seq "$REPS"); do rps "$R" "$@"; done | median)
  printf '%-58s %12s requests/s\n' "$label" "$v"
}

echo "desktop mix, $N requests (8 KiB mean, 75% writes); median of $REPS"
measure "in process: mem, 1 client" "$T/desk.rdtrace" mem:64G
measure "in process: mem, 4 clients" "$T/desk.rdtrace" mem:64G --clients 4
measure "in process: trace:FILE:mem, 1 client" "$T/desk.rdtrace" "trace:$T/rec.rdtrace:mem:64G"
measure "in process: trace[data=on]:FILE:mem, 1 client" "$T/desk.rdtrace" "trace[data=on]:$T/rec.rdtrace:mem:64G"
serve "$R" mem:64G
measure "NBD (roamdisk serve mem), 1 client" "$T/desk.rdtrace" "$U"
measure "NBD (roamdisk serve mem), 50 clients x $((N / 50))" "$T/desk50.rdtrace" "$U" --clients 50
stop
serve "$R" "trace:$T/srv.rdtrace:mem:64G"
measure "NBD (roamdisk serve trace:FILE:mem), 1 client" "$T/desk.rdtrace" "$U"
measure "NBD (roamdisk serve trace:FILE:mem), 50 clients" "$T/desk50.rdtrace" "$U" --clients 50
stop
