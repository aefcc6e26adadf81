#!/bin/sh
# roamdisk serve vs qemu-nbd vs nbdkit file; see bench/nbd-servers.py --help
# and docs/BENCHMARKS.md.
exec python3 "$(dirname "$0")/nbd-servers.py" "$@"
