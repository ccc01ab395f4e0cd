#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine: build, the gpu suite, and the single-GPU executor bench up to MAX bytes.
#   tests/perf/device-gpu-suite.sh [MAX_BYTES]   (results under $OUT)
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}
mkdir -p "$OUT"
eval "$(tools/device-deps.sh --unpack)"
d=$(python3 -c 'import glob,sys; print(next((p for s in sys.path for p in glob.glob(s+"/nvidia/nccl/lib")), ""))' 2>/dev/null)
if ! ldconfig -p | grep -q 'libnccl.so.2 ' && [ -n "$d" ]; then
    export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH MSCX_TEST_NCCL_LIB=$d/libnccl.so.2
fi
t=$(date +%s)
(meson setup bd -Dgpu_arch=sm_90 && ninja -C bd) >"$OUT/build.log" 2>&1
echo "build rc=$? $(($(date +%s) - t))s"
t=$(date +%s)
timeout 240 meson test -C bd --no-rebuild --suite gpu --print-errorlogs >"$OUT/gpu.log" 2>&1
echo "gpu suite rc=$? $(($(date +%s) - t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|compared|shim summary|^plans:|^stress:|^graph:|^hang:|^wrap:|^FAIL" "$OUT/gpu.log" | head -40
cp bd/meson-logs/testlog.txt "$OUT/gpu-testlog.txt"
t=$(date +%s)
timeout 150 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans "${1:-16384}" >"$OUT/bench.txt" 2>&1
echo "bench rc=$? $(($(date +%s) - t))s"
cat "$OUT/bench.txt"
