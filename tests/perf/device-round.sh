#!/usr/bin/env bash
# On the GPU machine, one call: build everything, the executor bench (and an
# MSCX_TRACE summary of one configuration), then gpu tests.
#   TESTS="..." SUITE_S=N BENCH_MAX=N TRACE_N=N tests/perf/device-round.sh
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; grep -E "error|FAILED" $OUT/build.log | head; tail -1 $OUT/build.log
if [ "${BENCH_MAX:-0}" != 0 ]; then
  timeout 150 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans $BENCH_MAX 2>&1 | grep -v "^$" | tee $OUT/bench.txt
fi
if [ "${TRACE_N:-0}" != 0 ]; then
  MSCX_BENCH_PLANS=gen MSCX_BENCH_RANKS=$TRACE_N MSCX_TRACE=$OUT/trace.json timeout 60 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 1024 2>&1 | grep "gen oneshot"
  python3 tools/trace-summary.py $OUT/trace.json | grep -E "rank (0|1) "
fi
t=$(date +%s)
timeout ${SUITE_S:-300} meson test -C bd --no-rebuild --print-errorlogs ${TESTS:-gpu-plans gpu-stress gpu-graph gpu-hang gpu-wrap gpu-perf-baseline} >$OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(($(date +%s)-t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|^plans:|^stress:|^graph:|^hang:|^wrap:|passed|latency|MISMATCH|FAIL" $OUT/gpu.log | head -60
cp bd/meson-logs/testlog.txt $OUT/gpu-testlog.txt 2>/dev/null
