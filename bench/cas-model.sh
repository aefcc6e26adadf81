#!/usr/bin/env bash
# A long run of the chunk-store fault model test (crates/roam/tests/model.rs,
# docs/formats/cas-store.md "Tested against faults"): many more seeded
# sequences of commits, checkouts, gcs, sessions, crashes and injected faults
# than CI runs, in an optimised build. Prints the run's counts; a failure
# prints its seed, which `ROAMDISK_MODEL_SEED=N` replays step by step.
#
# Usage: bench/cas-model.sh                  (seeds 1..20000)
#        SEEDS=100000 FIRST=20001 bench/cas-model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export ROAMDISK_MODEL_SEEDS=${SEEDS:-20000}
export ROAMDISK_MODEL_FIRST=${FIRST:-1}
# cargo test, not nextest: a long run outlasts nextest's slow-test limit.
exec cargo test --release -p roamdisk-roam --test model \
    commit_checkout_gc_and_sessions_survive_faults -- --nocapture
