#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a machine with 2+ GPUs, after a build: where the time of the shim's
# 2-rank collectives goes, one process per GPU (mscx-perf --nproc 2).
#   1. stock NCCL and the shim side by side, eager and graph (-G 10), both
#      placements (mscx-perf prints out-of-place and in-place columns);
#   2. the shim with MSCX_PACKET=ll8 (graph);
#   3. MSCX_TRACE of the shim at 1 KB and 128 KB (per-op device times per rank
#      and block, summarised with tools/bench/trace-summary.py).
# Results in RESULTS (default out/mg-diag). NCCL_NVLS_ENABLE=0 throughout.
#   tools/bench/mg-diag.sh [COLL]     (default allreduce)
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-bd}
RESULTS=${RESULTS:-out}/mg-diag
COLL=${1:-allreduce}
mkdir -p "$RESULTS"
P=$BUILD/tools/perf/mscx-perf
SHIM=$PWD/$BUILD/shim/libmscx_nccl.so
common=(--nproc 2 --coll "$COLL" -d float -o sum -b 1K -e 1M -f 4 -n 100 -w 20)
run() { # NAME ENV... -- ARGS...
    local name=$1
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    echo "== $name"
    env "${envs[@]}" timeout 120 "$P" "${common[@]}" "$@" >"$RESULTS/$name.txt" 2>&1
    echo "rc=$?"
    grep -vE '^#? *$' "$RESULTS/$name.txt" | grep -E '^ +[0-9]|wrong|FAIL|error' | head -12
}
for g in 0 10; do
    run nccl-G$g -- -G "$g"
    run mscx-G$g LD_PRELOAD="$SHIM" MSCX_PLAN_DIR=plans MSCX_SUMMARY_FILE="$RESULTS/sum-G$g.json" -- -G "$g"
done
run mscx-ll8-G10 LD_PRELOAD="$SHIM" MSCX_PLAN_DIR=plans MSCX_PACKET=ll8 -- -G 10
for s in 1K 128K; do
    run mscx-trace-$s LD_PRELOAD="$SHIM" MSCX_PLAN_DIR=plans MSCX_TRACE="$RESULTS/trace-$s-%r.json" -- -b $s -e $s -n 20 -w 5
    for f in "$RESULTS"/trace-$s-*.json; do
        [ -f "$f" ] && { echo "-- $f"; python3 tools/bench/trace-summary.py "$f" | head -40; }
    done
done
