#!/usr/bin/env bash
# The seed's LBS-vs-flat experiment (section 5.2, Figure 12) on the flashsim
# card model: each Android workload's writable partitions replayed against
# a flat image and an LBS image on the same simulated card.
# Usage: bench/workload-lbs-vs-flat.sh [CARD...]   (default class6 class4)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p roamdisk-workload --example lbs_vs_flat
for card in "${@:-class6 class4}"; do
  for c in $card; do
    target/release/examples/lbs_vs_flat "$c" 1
  done
done
