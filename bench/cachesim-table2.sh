#!/bin/sh
# The TransCom Table 2 experiment and the hit-ratio / two-level curves on
# generated traces: FMPQ, 2Q, FBR, LRU, ARC, S3-FIFO and MQ on the desktop
# mix (15 clients, two seeds) and the 50-client boot storm, server cache
# sizes from 1/64 to 1/2 of the working set (Table 2 form at 1/16), then
# two-level runs behind 1 MiB and 16 MiB client caches; an FMPQ parameter
# sweep at 1/16. Text and plots go to bench/results/cachesim/.
# NO_BUILD=1 uses target/release as it is. See docs/BENCHMARKS.md,
# "Cache policies, simulator and models (issue 7)".
set -eu
. "$(dirname "$0")/cachesim-env.sh"
build
POLICIES=fmpq,2q,fbr,lru,arc,s3fifo,mq

for seed in 1 2; do
  T=$WORK/desktop-$seed.rdtrace
  "$R" trace synth desktop --clients 15 --seed $seed -o "$T" -q
  "$R" sim "$T" --policy $POLICIES --size 1/64,1/32,1/16,1/8,1/4,1/2 \
    --plot "$OUT/desktop-seed$seed" -q | tee "$OUT/desktop-seed$seed.txt"
done

T=$WORK/desktop-1.rdtrace
"$R" sim "$T" --policy fmpq,lru,2q --size 1/32,1/16,1/8 --client-size 1M,16M \
  --plot "$OUT/desktop-two-level" -q | tee "$OUT/desktop-two-level.txt"

"$R" sim "$T" --size 1/16 --no-lru-curve -q --policy \
  'lru,mq,fmpq[duration=1x],fmpq[duration=2x],fmpq,fmpq[duration=8x],fmpq[duration=16x],fmpq[w=4],fmpq[w=16],fmpq[qoff=1x],fmpq[qoff=16x],2q,2q[kout=2],2q[kout=4],fbr,fbr[fold=0.25],fbr[fnew=0.1]' \
  | tee "$OUT/desktop-fmpq-sweep.txt"

B=$WORK/boot.rdtrace
"$R" trace synth boot --seed 1 -o "$B" -q
"$R" sim "$B" --policy $POLICIES --size 1/64,1/32,1/16,1/8,1/4 \
  --plot "$OUT/boot" -q | tee "$OUT/boot.txt"

# The client side (seed Figure 9): client cache hit ratio against block size
# and client cache size.
for b in 4K 8K 16K 32K 64K; do
  echo "block $b:"
  "$R" sim "$T" --block $b --policy fmpq --size 1/16 --client-size 1M,16M --no-lru-curve -q \
    | grep -E "^level|client caches"
done | tee "$OUT/desktop-client-block-size.txt"
