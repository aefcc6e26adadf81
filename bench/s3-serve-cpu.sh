#!/usr/bin/env bash
# Two builds side by side on a commit through `store serve s3://` (issue:
# cost at scale): for each round and each build, a direct S3 commit and a
# commit through the chunk server in front of S3, of the same incompressible
# image, on one loopback Swift cluster (made here, stopped at the end).
# Prints the wall times, the ratio direct / through the server (the bar is
# >= 0.8x), and the server's CPU time and page faults (`perf stat`).
# Each round writes about 6 GB into Swift (3 replicas); the cluster is
# made anew every 3 rounds so the disk does not fill.
#
# Usage: bench/s3-serve-cpu.sh OLD_BIN NEW_BIN [ROUNDS] [SIZE_MIB]   (default 3 rounds, 512 MiB)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
old=${1:?usage: bench/s3-serve-cpu.sh OLD_BIN NEW_BIN [ROUNDS] [SIZE_MIB]}
new=${2:?usage: bench/s3-serve-cpu.sh OLD_BIN NEW_BIN [ROUNDS] [SIZE_MIB]}
rounds=${3:-3}
size=${4:-512}
command -v perf >/dev/null || { echo "s3-serve-cpu: perf is needed (apt-get install linux-perf)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/roamdisk-s3-serve-cpu.XXXXXX)
swift=$work/swift
cleanup() {
    "$root/scripts/swift-run" stop "$swift" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
fresh_cluster() {
    "$root/scripts/swift-run" stop "$swift" >/dev/null 2>&1 || true
    rm -rf "$swift"
    "$root/scripts/swift-setup" "$swift" --port 8680 >/dev/null
    "$root/scripts/swift-run" start "$swift" >/dev/null
    eval "$("$root/scripts/swift-run" env "$swift")"
    export AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION
    /opt/roamdisk-swift/bin/python -c "import boto3; boto3.client('s3').create_bucket(Bucket='bench')"
}
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
head -c $((size << 20)) /dev/urandom >"$work/disk.img"
for ((r = 1; r <= rounds; r++)); do
    (((r - 1) % 3 == 0)) && fresh_cluster
    for b in "$old" "$new"; do
        direct=s3://bench/d$r-$RANDOM$RANDOM
        "$b" -q store init "$direct" --compression none
        t=$(date +%s%N)
        "$b" -q commit "$work/disk.img" --to b/vm --store "$direct"
        d=$(ms_since "$t")
        behind=s3://bench/v$r-$RANDOM$RANDOM
        "$b" -q store init "$behind" --compression none
        "$b" store serve "$behind" --listen 127.0.0.1:18666 2>"$work/serve.log" &
        server=$!
        sleep 0.5
        perf stat -x, -e task-clock,page-faults -p "$server" -o "$work/stat" &
        stat=$!
        t=$(date +%s%N)
        "$b" -q commit "$work/disk.img" --to b/vm --store http://127.0.0.1:18666
        v=$(ms_since "$t")
        kill -INT "$stat"
        wait "$stat" || true
        kill "$server"
        wait "$server" 2>/dev/null || true
        cpu=$(awk -F, '/task-clock/ {printf "%.0f", $1}' "$work/stat")
        faults=$(awk -F, '/page-faults/ {print $1}' "$work/stat")
        echo "round $r $b: direct $d ms, through the server $v ms, ratio $(awk -v d="$d" -v v="$v" 'BEGIN {printf "%.2f", d / v}')x, server CPU $cpu ms, page faults $faults"
    done
done
