#!/bin/bash
# A cold session read at loopback speed, two builds side by side: a 512 MiB
# random disk behind `store serve` on 127.0.0.1, a new session per pass, read
# whole with nbdcopy through `serve cas[shared-cache=NEW DIR]`; prints the
# time and how many of the 8192 chunks each shared cache kept (issue 24: a
# host keeps every chunk it fetched). Each pass uses a fresh cache folder
# and keeps it until the end (ext4 slows file creation next to many just
# deleted inodes, which would bias later passes).
#
# Usage: OLD=/path/to/old/roamdisk NEW=target/release/roamdisk bench/cas-keep-all.sh
# Needs: nbdcopy (libnbd-bin).
set -euo pipefail
: "${OLD:?set OLD to the build to compare with}"
NEW=${NEW:-target/release/roamdisk}
OLD=$(realpath "$OLD"); NEW=$(realpath "$NEW")
W=$(mktemp -d /tmp/cas-keep-all.XXXXXX)
trap 'kill $SP 2>/dev/null || true; rm -rf "$W"' EXIT
cd "$W"
"$NEW" store init st -q
head -c 512M /dev/urandom > d.raw
"$NEW" commit raw:d.raw --to u/v --store st -q
"$NEW" store serve st --listen 127.0.0.1:8711 2>srv.log & SP=$!
sleep 1
for pass in 1 2 3; do
  for b in "$OLD" "$NEW"; do
    rm -rf sess nbd.sock
    sh="$W/shared-$pass-$(basename "$(dirname "$b")")-$(basename "$b")"
    "$b" checkout u/v --store http://127.0.0.1:8711 --session sess -q
    "$b" serve "cas[shared-cache=$sh]:$W/sess" --socket nbd.sock 2>/dev/null & P=$!
    for _ in $(seq 100); do [ -S nbd.sock ] && break; sleep 0.05; done
    s=$(date +%s.%N); nbdcopy "nbd+unix:///?socket=$W/nbd.sock" null:; e=$(date +%s.%N)
    kill $P; wait $P 2>/dev/null || true
    echo "pass $pass $b: $(echo "$e - $s" | bc) s, $(find "$sh/chunks" -type f | wc -l) of 8192 chunks kept"
  done
done
