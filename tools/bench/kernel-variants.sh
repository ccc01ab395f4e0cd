#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine: the executor kernel as shipped against build-time
# variants of it (exec_dev.cuh: MSCX_KBOUND, MSCX_KSLOW_INLINE; exec_ops.cuh:
# MSCX_KLINE_BATCH, MSCX_KWARM, MSCX_KPRE, MSCX_KCOMPACT, MSCX_KSPEC; measurement builds:
# MSCX_KSTAMP), side by side in one call. Each variant gets its own build directory
# (bd-kv<N>, only the benchmark targets); the shipped build is BUILD (bd).
# For each build: mscx-bench-launch (the real fast kernel rows), then
# mscx-bench-gpu over the plans in PLANS (default plans/; e.g. the folder
# tools/bench/bench-variants.sh writes) up to MAX bytes (default 65536) for
# RANKS (default "2 8"), the DSL's allreduce_pkt too when WHICH is empty
# (default gen: ours only). Results: OUT/kv-<name>.txt. The variant builds
# compile only the fp32 and copy-only kernels (meson -Dkernel_subset=fp32,
# KSUBSET; the benchmarks run fp32): a sixth of the kernel build.
#   tools/bench/kernel-variants.sh "-DMSCX_KBOUND=512 -DMSCX_KSLOW_INLINE" ...
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-bd}
OUT=${OUT:-out}
MAX=${MAX:-65536}
RANKS=${RANKS:-2 8}
PLANS=${PLANS:-plans}
WHICH=${WHICH-gen}
KSUBSET=${KSUBSET:-fp32}
mkdir -p "$OUT"
[ -d .deps/debs ] && eval "$(tools/dev/device-deps.sh --unpack)"
targets="tools/mscx-bench-gpu tools/mscx-bench-launch"
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dgpu_arch=sm_90 >/dev/null
pids=""
ninja -C "$BUILD" $targets >"$OUT/kv-build-0.log" 2>&1 &
pids="$pids $!"
i=0
for v in "$@"; do
    i=$((i + 1))
    d=bd-kv$i
    { [ -f "$d/build.ninja" ] || meson setup "$d" -Dgpu_arch=sm_90 -Dkernel_subset="$KSUBSET" -Dtests=disabled "-Dcuda_args=$v"; ninja -C "$d" $targets; } \
        >"$OUT/kv-build-$i.log" 2>&1 &
    pids="$pids $!"
done
for p in $pids; do wait "$p" || echo "a build failed (see $OUT/kv-build-*.log)"; done
run_one() { # name build-dir
    {
        echo "## $1"
        timeout 120 "$2/tools/mscx-bench-launch" 2>&1 | grep -E "^\| (launch|executor|plain|empty, 7 x 512, 16|one-shot)"
        for n in $RANKS; do
            MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=$WHICH timeout 150 "$2/tools/mscx-bench-gpu" \
                tests/data/mscclpp/mscclpp-algo-plans "$PLANS" "$MAX" 2>&1 | grep -E "^\| (plan|[a-z])"
        done
    } >"$OUT/kv-$1.txt" 2>&1
    cat "$OUT/kv-$1.txt"
}
run_one shipped "$BUILD"
i=0
for v in "$@"; do
    i=$((i + 1))
    echo "variant $i: $v"
    run_one "v$i" "bd-kv$i"
done
