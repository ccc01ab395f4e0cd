#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, after a build (tools/dev/device-run.sh build): the
# shipped one-shot AllReduce plans (1-16 KB) beside one-shot plans with fewer
# blocks per rank (1 or 2), each against the hand-written kernel of the same
# grid, in one mscx-bench-gpu run per rank count (ours only). The
# hand-written kernel spreads units over the whole grid, so that below
# blockDim units it runs in one block whatever the grid: the question is
# whether the executor should do the same for the smallest messages.
# Results under RESULTS (default out): blocks/ (the plans) and blocks.txt.
#   tools/bench/bench-blocks.sh [MAX_BYTES]     (default 16384)
set -u
. "$(dirname "$0")/plan-gen.sh"
plan_dir blocks
cp plans/allreduce_n[248]_rpn[248]_oneshot_*.json "$V/" || exit 1
gen allreduce_n2_rpn2_oneshot_b1_1K_16K --algo oneshot --ranks 2 --blocks 1 --threads-per-block 512 --min-size 1K \
    --max-size 16K
gen allreduce_n2_rpn2_oneshot_b1t1024_1K_16K --algo oneshot --ranks 2 --blocks 1 --threads-per-block 1024 \
    --min-size 1K --max-size 16K
for n in 4 8; do
    for b in 1 2; do
        gen allreduce_n${n}_rpn${n}_oneshot_b${b}_1K_16K --algo oneshot --ranks $n --blocks $b \
            --threads-per-block 512 --min-size 1K --max-size 16K
    done
done
[ -d .deps/debs ] && eval "$(tools/dev/device-deps.sh --unpack)"
export NCCL_NVLS_ENABLE=0
for n in 2 4 8; do
    timeout 150 "$BUILD/tools/mscx-bench-gpu" --ranks "$n" --plans gen tests/data/mscclpp/mscclpp-algo-plans \
        "$V" "${1:-16384}" 2>&1 | grep -E "^\| (plan|[a-z])"
done | tee "$RESULTS/blocks.txt"
