#!/usr/bin/env bash
# LBS Table 5 at its real size (seed section 5.3; issue 15): the Contacts and
# Email traces scaled to Table 5's request counts (219,124 and 216,057 1 KiB
# writes), replayed one partition at a time onto full LBS images of the
# Table 2 partitions they write (/data 1 GiB, /sdcard 2 GiB: the trace
# generator's sizes), 12% spare, the data file on a real file (O_DIRECT) and
# on the flashsim card model; prints Table 5's columns. Deterministic (fixed
# seed, foreground GC); about a minute.
# Usage: bench/lbs-table5.sh [OPTIONS] [TRACE...]  (options: see
#        crates/workload/examples/lbs_table5.rs, e.g. --seed 2, --spare 12,
#        --fill 100, --media file,card, --size /data=512M, --json)
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_INCREMENTAL=0 cargo build --release -q -p roamdisk-workload --example lbs_table5
exec target/release/examples/lbs_table5 "$@"
