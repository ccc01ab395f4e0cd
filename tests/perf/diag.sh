#!/usr/bin/env bash
# On the GPU machine: build the bench, run it for one rank count with and
# without MSCX_TRACE, summarise the trace. OUT receives logs and the trace.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
N=${N:-2}; MAX=${MAX:-16384}
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd tools/mscx-bench-gpu ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; tail -2 $OUT/build.log
MSCX_BENCH_RANKS=$N timeout 100 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans $MAX
MSCX_BENCH_PLANS=gen MSCX_BENCH_RANKS=$N MSCX_TRACE=$OUT/trace.json timeout 100 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 1024
python3 tools/trace-summary.py $OUT/trace.json
