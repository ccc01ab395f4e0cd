#!/usr/bin/env bash
# On the GPU machine, one call: build everything, the gpu-exec tests (every
# plan bit for bit against the host executor, stress, graph, hang, wrap),
# then the executor bench with the compiled program on and off.
#   tests/perf/device-round.sh [TESTS...]   (default: the gpu-exec modes)
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; grep -E "error|FAILED" $OUT/build.log | head; tail -1 $OUT/build.log
t=$(date +%s)
timeout ${SUITE_S:-300} meson test -C bd --no-rebuild --print-errorlogs ${TESTS:-gpu-plans gpu-stress gpu-graph gpu-hang gpu-wrap gpu-perf-baseline} >$OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(($(date +%s)-t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|^plans:|^stress:|^graph:|^hang:|^wrap:|MISMATCH|FAIL" $OUT/gpu.log | head -30
cp bd/meson-logs/testlog.txt $OUT/gpu-testlog.txt 2>/dev/null
for c in 1 0; do
  echo "== MSCX_EXEC_COMPILE=$c"
  MSCX_EXEC_COMPILE=$c timeout 120 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans ${BENCH_MAX:-65536} 2>&1 | grep -v "^$"
done
