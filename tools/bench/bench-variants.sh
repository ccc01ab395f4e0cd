#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, after a build (tools/dev/device-run.sh build): the
# one-shot AllReduce with 1, 2 and 4 blocks per rank (mscx-plangen --blocks)
# beside the shipped one-node AllReduce plans, in one mscx-bench-gpu run
# (each against the hand-written kernel in the same shape, and the DSL's
# allreduce_pkt), the 8-rank two-phase plan with 2 and 4 blocks per peer, and
# the two-phase plans with whole sub-chunks per block (mscx-plangen --blocks G
# --layout rows|cols, docs/perf/tp8-vs-dsl.md) for 8 and 4 ranks, 64 KB-1 MB:
# rows with G = ranks is the DSL's allreduce_pkt written by our generator;
# and the shipped 1024-thread two-phase plans with 512 threads (_b512_).
# Results under RESULTS (default out): variants/ and bench.txt (GEN_ONLY=1:
# only the variants, no bench).
#   tools/bench/bench-variants.sh [MAX_BYTES]     (default 16384)
set -u
. "$(dirname "$0")/plan-gen.sh"
plan_dir variants
for n in 2 4 8; do
    for b in 1 2 4; do
        gen "allreduce_n${n}_rpn${n}_oneshot_b${b}_1K_16K" --algo oneshot --ranks "$n" --blocks "$b" --min-size 1K \
            --max-size 16K
    done
    cp plans/allreduce_n${n}_rpn${n}_*.json "$V/" || exit 1
done
# the two-phase 8-rank plan above 64 KB with 2 and 4 blocks per peer (the shipped plan has 1), 1024
# threads per block as shipped
for t in 2 4; do
    gen "allreduce_n8_rpn8_twophase_t${t}_64K_1M" --algo twophase --ranks 8 --tbs-per-peer "$t" \
        --threads-per-block 1024 --min-size 64K --max-size 1M
done
# whole sub-chunks per block; the names keep the allreduce_n{N}_rpn{N}_twophase_ prefix that
# mscx-bench-gpu picks, so each runs beside the hand-written two-phase kernel with as many blocks
for v in 8:rows:8 8:cols:8 4:rows:4 4:cols:8 4:cols:16; do
    IFS=: read -r n layout g <<<"$v"
    gen "allreduce_n${n}_rpn${n}_twophase_${layout}${g}_64K_1M" --algo twophase --ranks "$n" --blocks "$g" \
        --layout "$layout" --threads-per-block 1024 --min-size 64K --max-size 1M
done
# the shipped 1024-thread two-phase plans with 512 threads per block (the same blocks): the executor runs
# blocks of at most 512 threads on its 512-thread kernels (more registers a thread)
for v in 2:8:16K:256K 4:4:16K:1M 8:1:64K:1M; do
    IFS=: read -r n t lo hi <<<"$v"
    gen "allreduce_n${n}_rpn${n}_twophase_b512_${lo}_${hi}" --algo twophase --ranks "$n" --tbs-per-peer "$t" \
        --threads-per-block 512 --min-size "$lo" --max-size "$hi"
done
# 8 ranks above 64 KB at 512 threads: two blocks per peer, rows and columns
for v in t2 rows8 cols8; do
    case $v in
    t2) a="--tbs-per-peer 2" ;;
    rows8) a="--blocks 8 --layout rows" ;;
    cols8) a="--blocks 8 --layout cols" ;;
    esac
    # shellcheck disable=SC2086
    gen "allreduce_n8_rpn8_twophase_${v}b512_64K_1M" --algo twophase --ranks 8 $a --threads-per-block 512 \
        --min-size 64K --max-size 1M
done
[ "${GEN_ONLY:-0}" = 1 ] && exit 0
BENCH_PLANS=$V BENCH_MAX=${1:-16384} exec tools/dev/device-run.sh bench
