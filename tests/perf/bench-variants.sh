#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, after a build (tests/perf/device-run.sh build): the
# one-shot AllReduce with 1, 2 and 4 blocks per rank (mscx-plangen --blocks)
# beside the shipped one-node AllReduce plans, in one mscx-bench-gpu run
# (each against the hand-written kernel in the same shape, and the DSL's
# allreduce_pkt), and the 8-rank two-phase plan with 1 and 4 blocks per peer.
# Results under OUT (default out): variants/ and bench.txt.
#   tests/perf/bench-variants.sh [MAX_BYTES]     (default 16384)
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-bd}
OUT=${OUT:-out}
V=$OUT/variants
mkdir -p "$V"
for n in 2 4 8; do
    for b in 1 2 4; do
        name=allreduce_n${n}_rpn${n}_oneshot_b${b}_1K_16K
        "$BUILD/tools/mscx-plangen" --coll allreduce --algo oneshot --ranks "$n" --blocks "$b" --min-size 1K \
            --max-size 16K --name "$name" -o "$V/$name.json" --quiet || exit 1
    done
    cp plans/allreduce_n${n}_rpn${n}_*.json "$V/" || exit 1
done
# the two-phase 8-rank plan above 64 KB with 1 and 4 blocks per peer (shipped: 2), 1024 threads per block as
# shipped (the first run of this script used mscx-plangen's default of 512 for these: not comparable)
for t in 1 4; do
    name=allreduce_n8_rpn8_twophase_t${t}_64K_1M
    "$BUILD/tools/mscx-plangen" --coll allreduce --algo twophase --ranks 8 --tbs-per-peer "$t" \
        --threads-per-block 1024 --min-size 64K --max-size 1M --name "$name" -o "$V/$name.json" --quiet || exit 1
done
BENCH_PLANS=$V BENCH_MAX=${1:-16384} exec tests/perf/device-run.sh bench
