#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine: build, the gpu suite, then optionally a world-size-1
# A/B against NCCL and the single-GPU executor bench. Results go under $OUT.
#   tests/perf/device-gpu-suite.sh [--ab] [--bench MAX_BYTES]
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}
AB=0 BENCH=0
while [ $# -gt 0 ]; do
    case "$1" in
    --ab) AB=1 ;;
    --bench) BENCH=$2; shift ;;
    *) echo "usage: $0 [--ab] [--bench MAX_BYTES]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
eval "$(tools/device-deps.sh --unpack)"
# programs linked against libnccl: the system's, else the one in torch's wheel
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
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|compared|shim summary|^plans:|^stress:|^graph:|^hang:|^wrap:|^FAIL" \
    "$OUT/gpu.log" | head -40
cp bd/meson-logs/testlog.txt "$OUT/gpu-testlog.txt"
if [ "$AB" = 1 ]; then
    t=$(date +%s)
    timeout 60 tools/mscx-ab --build bd --plan-dir plans --out "$OUT/ab" --runs 3 -- \
        -b 1K -e 1M -f 4 -d float -o sum -n 40 -w 10 >"$OUT/ab.txt" 2>&1
    echo "ab rc=$? $(($(date +%s) - t))s"
    head -12 "$OUT/ab.txt"
fi
if [ "$BENCH" != 0 ]; then
    t=$(date +%s)
    timeout 150 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans "$BENCH" >"$OUT/bench.txt" 2>&1
    echo "bench rc=$? $(($(date +%s) - t))s"
    cat "$OUT/bench.txt"
fi
