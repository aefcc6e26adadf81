# Sourced by the cachesim benchmarks (bench/cachesim-*.sh): ROOT (the
# checkout), R (its release roamdisk), WORK (generated traces, kept between
# runs; $WORK overrides), OUT (bench/results/cachesim), and
#   build [EXAMPLE...]   build roamdisk and these roamdisk-cachesim
#                        examples in release mode, unless NO_BUILD is set.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
R=$ROOT/target/release/roamdisk
WORK=${WORK:-/tmp/roamdisk-cachesim-bench}
OUT=$ROOT/bench/results/cachesim
mkdir -p "$WORK" "$OUT"
build() {
  if [ -n "${NO_BUILD:-}" ]; then return 0; fi
  (cd "$ROOT" && cargo build --release -q -p roamdisk) || exit 1
  for ex in "$@"; do
    (cd "$ROOT" && cargo build --release -q -p roamdisk-cachesim --example "$ex") || exit 1
  done
}
