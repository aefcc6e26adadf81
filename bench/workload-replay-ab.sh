#!/usr/bin/env bash
# Before/after comparison of bench/workload-replay.sh's rows: a copy of the
# binary from before a change (BASE) against the one after (NEW), the two
# alternating in every repetition (ABBA order) so both see the same load on
# a shared machine. NBD rows use NEW as the replay client for both servers,
# so only the server differs. Prints one line per run: ROW base|new REQ/S;
# compare medians, or the median of the per-pair ratios.
# Usage: bench/workload-replay-ab.sh BASE NEW [REQUESTS] [REPS]
#        ROWS="nbd-mem-1 nbd-mem-50" bench/workload-replay-ab.sh ...   (a subset)
# Rows: nbd-mem-1 nbd-mem-50 nbd-trace-1 nbd-trace-50 inproc-mem-1
#       inproc-mem-4 inproc-trace-1
set -euo pipefail
BASE=$1; NEW=$2; N=${3:-1000000}; REPS=${4:-3}
. "$(dirname "$0")/workload-replay-env.sh"
desktop_traces "$NEW" "$N"
row() { # ROW base|new BINARY
  local label=$1 who=$2 bin=$3 v
  case $label in
    inproc-mem-1) v=$(rps "$bin" "$T/desk.rdtrace" mem:64G) ;;
    inproc-mem-4) v=$(rps "$bin" "$T/desk.rdtrace" mem:64G --clients 4) ;;
    inproc-trace-1) v=$(rps "$bin" "$T/desk.rdtrace" "trace:$T/rec.rdtrace:mem:64G") ;;
    nbd-mem-1) serve "$bin" mem:64G; v=$(rps "$NEW" "$T/desk.rdtrace" "$U"); stop ;;
    nbd-mem-50) serve "$bin" mem:64G; v=$(rps "$NEW" "$T/desk50.rdtrace" "$U" --clients 50); stop ;;
    nbd-trace-1) serve "$bin" "trace:$T/srv.rdtrace:mem:64G"; v=$(rps "$NEW" "$T/desk.rdtrace" "$U"); stop ;;
    nbd-trace-50) serve "$bin" "trace:$T/srv.rdtrace:mem:64G"; v=$(rps "$NEW" "$T/desk50.rdtrace" "$U" --clients 50); stop ;;
    *) echo "unknown row $label" >&2; exit 2 ;;
  esac
  echo "$label $who $v"
}
for rep in $(seq "$REPS"); do
  for label in ${ROWS:-nbd-mem-1 nbd-mem-50 nbd-trace-1 nbd-trace-50 inproc-mem-1 inproc-mem-4 inproc-trace-1}; do
    if [ $((rep % 2)) = 1 ]; then row "$label" base "$BASE"; row "$label" new "$NEW"
    else row "$label" new "$NEW"; row "$label" base "$BASE"; fi
  done
done
