#!/bin/sh
# Requests per second of every policy on one core (release build): the
# server key stream of the 15-client desktop trace at a cache of 1/16 of
# its working set, replayed by crates/cachesim/examples/policy_speed.rs
# with u64 keys in a hash index (a server's memory cache) and with the
# simulator's dense ids; plus the whole `roamdisk sim` pass (trace decoding,
# block split, sharing model, six policies and the exact LRU curve).
# NO_BUILD=1 uses target/release as it is. See docs/BENCHMARKS.md,
# "Cache policies, simulator and models (issue 7)".
set -eu
. "$(dirname "$0")/cachesim-env.sh"
build policy_speed
T=$WORK/desktop-1.rdtrace
[ -f "$T" ] || "$R" trace synth desktop --clients 15 --seed 1 -o "$T" -q
"$R" sim "$T" --policy lru --size 1/16 --no-lru-curve --export-keys "$WORK/desktop-1.keys" -q >/dev/null
N=$(wc -l < "$WORK/desktop-1.keys")
WS=$(sort -n "$WORK/desktop-1.keys" | tail -1)
CAP=$(( (WS + 1) / 16 ))
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$ROOT/target/release/examples/policy_speed" "$WORK/desktop-1.keys" "$CAP" 5
START=$(date +%s.%N)
"$R" sim "$T" --size 1/16 -q >/dev/null
END=$(date +%s.%N)
echo "roamdisk sim, whole pass (6 policies + exact LRU curve, both passes): $N block accesses in $(echo "$END - $START" | bc) s"
