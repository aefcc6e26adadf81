#!/bin/sh
# TransCom's queueing model: MVA with Table 1's demands (4 KB and 32 KB),
# curves against N and against the server hit ratio, each population
# checked against the discrete-event simulation (--simulate), including
# the crossover hit ratio where disk and network demands are equal.
# Output in bench/results/cachesim/.
set -eu
. "$(dirname "$0")/cachesim-env.sh"
build
"$R" model mva --demands 4k --hit 0,0.5,0.8,0.9,0.95,1 --clients 50 --simulate \
  --plot "$OUT/mva-4k" | tee "$OUT/mva-4k.txt"
"$R" model mva --demands 32k --hit 0.5,0.9,0.931,1 --clients 50 --simulate --step 1 \
  --plot "$OUT/mva-32k" | tee "$OUT/mva-32k.txt"
