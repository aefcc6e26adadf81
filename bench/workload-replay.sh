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
T=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT

"$R" -q trace synth desktop --requests "$N" -o "$T/desk.rdtrace"
"$R" -q trace synth desktop --requests $((N / 50)) -o "$T/desk50.rdtrace"

# requests/s of one replay (the "replayed ... requests/s" line).
rps() { "$R" -q replay "$@" | sed -n 's/.* s, \([0-9]*\) requests\/s.*/\1/p'; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
measure() {
  local label=$1; shift
  local v
  v=$(for _ in $(seq "$REPS"); do rps "$@"; done | median)
  printf '%-58s %12s requests/s\n' "$label" "$v"
}
serve() {
  rm -f "$T/s.sock"
  "$R" -q serve "$1" --socket "$T/s.sock" & SERVER=$!
  for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.05; done
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=; }

echo "desktop mix, $N requests (8 KiB mean, 75% writes); median of $REPS"
measure "in process: mem, 1 client" "$T/desk.rdtrace" mem:64G
measure "in process: mem, 4 clients" "$T/desk.rdtrace" mem:64G --clients 4
measure "in process: trace:FILE:mem, 1 client" "$T/desk.rdtrace" "trace:$T/rec.rdtrace:mem:64G"
measure "in process: trace[data=on]:FILE:mem, 1 client" "$T/desk.rdtrace" "trace[data=on]:$T/rec.rdtrace:mem:64G"
serve mem:64G
measure "NBD (roamdisk serve mem), 1 client" "$T/desk.rdtrace" "nbd+unix:///?socket=$T/s.sock"
measure "NBD (roamdisk serve mem), 50 clients x $((N / 50))" "$T/desk50.rdtrace" "nbd+unix:///?socket=$T/s.sock" --clients 50
stop
serve "trace:$T/srv.rdtrace:mem:64G"
measure "NBD (roamdisk serve trace:FILE:mem), 1 client" "$T/desk.rdtrace" "nbd+unix:///?socket=$T/s.sock"
measure "NBD (roamdisk serve trace:FILE:mem), 50 clients" "$T/desk50.rdtrace" "nbd+unix:///?socket=$T/s.sock" --clients 50
stop
