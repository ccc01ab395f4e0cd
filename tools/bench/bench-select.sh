#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, after a build (tools/dev/device-run.sh build): the
# candidates for the shipped one-node AllReduce plans beside the shipped ones
# and the MSCCL++ DSL's allreduce_pkt, in one mscx-bench-gpu run (each
# against the hand-written kernel of the same shape), to choose what
# tools/cli/mscx_plangen.c ships (pg_shipped). Candidates, named so that
# mscx-bench-gpu picks them (allreduce_n{N}_rpn{N}_{oneshot,twophase}_*):
#   2 ranks: one-shot with 1024 threads; two-phase (8 blocks per peer,
#            1024 threads) from 4 KB
#   4 ranks: two-phase (4 blocks per peer, 1024 threads) from 4 KB
#   8 ranks: two-phase, rows layout, 8 blocks, 1024 threads from 4 KB
#            (the DSL's structure)
#   4, 8 ranks: one-shot with 4 blocks (512 and 1024 threads), with one
#            block per peer at 1024 threads, and (8 ranks) with 8 blocks;
#            at 4 ranks the DSL's structure (rows, 4 blocks) up to 64 KB
# Results under RESULTS (default out): select/ (the plans) and bench.txt.
#   tools/bench/bench-select.sh [MAX_BYTES]     (default 1048576)
set -u
. "$(dirname "$0")/plan-gen.sh"
plan_dir select
cp plans/allreduce_n[248]_rpn[248]_*.json "$V/" || exit 1
gen allreduce_n2_rpn2_oneshot_b1024_1K_16K --algo oneshot --ranks 2 --tbs-per-peer 2 --threads-per-block 1024 \
    --min-size 1K --max-size 16K
gen allreduce_n2_rpn2_twophase_c1024_4K_256K --algo twophase --ranks 2 --tbs-per-peer 8 --threads-per-block 1024 \
    --min-size 4K --max-size 256K
gen allreduce_n4_rpn4_twophase_c1024_4K_1M --algo twophase --ranks 4 --tbs-per-peer 4 --threads-per-block 1024 \
    --min-size 4K --max-size 1M
gen allreduce_n8_rpn8_twophase_rows8_4K_1M --algo twophase --ranks 8 --blocks 8 --layout rows \
    --threads-per-block 1024 --min-size 4K --max-size 1M
# one-shot with more blocks or threads at 4 and 8 ranks (up to 16 KB), and the DSL's structure at 4 ranks
for n in 4 8; do
    gen allreduce_n${n}_rpn${n}_oneshot_b4_1K_16K --algo oneshot --ranks $n --blocks 4 --threads-per-block 512 \
        --min-size 1K --max-size 16K
    gen allreduce_n${n}_rpn${n}_oneshot_b4t1024_1K_16K --algo oneshot --ranks $n --blocks 4 \
        --threads-per-block 1024 --min-size 1K --max-size 16K
    gen allreduce_n${n}_rpn${n}_oneshot_t1024_1K_16K --algo oneshot --ranks $n --tbs-per-peer 1 \
        --threads-per-block 1024 --min-size 1K --max-size 16K
done
gen allreduce_n8_rpn8_oneshot_b8_1K_16K --algo oneshot --ranks 8 --blocks 8 --threads-per-block 512 \
    --min-size 1K --max-size 16K
gen allreduce_n4_rpn4_twophase_rows4_4K_64K --algo twophase --ranks 4 --blocks 4 --layout rows \
    --threads-per-block 1024 --min-size 4K --max-size 64K
BENCH_PLANS=$V BENCH_MAX=${1:-1048576} exec tools/dev/device-run.sh bench
