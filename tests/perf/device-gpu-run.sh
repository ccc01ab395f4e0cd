#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine: build, run the gpu suite, the NCCL-vs-shim comparisons
# (C API and PyTorch) and mscx-ab world size 1; logs, table and plot go to OUT.
#   tests/perf/device-gpu-run.sh BUILD OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-dev}
OUT=${2:-${OUT:-out}}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
[ -d .deps/debs ] && eval "$(tools/device-deps.sh --unpack)"
# the real NCCL for programs linked against libnccl: the system's, else torch's wheel
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
    d=$(python3 -c 'import glob,sys; print(next((p for s in sys.path for p in glob.glob(s+"/nvidia/nccl/lib")), ""))' 2>/dev/null)
    [ -n "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MSCX_TEST_NCCL_LIB=$d/libnccl.so.2
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' >> "$OUT/machine.txt" 2>&1
date -u >> "$OUT/machine.txt"
t0=$(date +%s)
{ [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dgpu_arch=sm_90; ninja -C "$BUILD" -k 0; } > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
tail -20 "$OUT/build.log"
t0=$(date +%s)
timeout 200 meson test -C "$BUILD" --no-rebuild --print-errorlogs gpu-nccl-api-compare gpu-torch-compare > "$OUT/compare.log" 2>&1
echo "comparisons rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
grep -E "^ *[0-9]+/[0-9]+ |compared|shim summary|DIFF|FAIL|real NCCL|ncclAllReduce from|torch_collectives" "$OUT/compare.log" | head -40
cp "$BUILD/meson-logs/testlog.txt" "$OUT/compare-testlog.txt" 2>/dev/null
t0=$(date +%s)
timeout "${AB_TIMEOUT:-120}" tools/mscx-ab --build "$BUILD" --plan-dir plans --out "$OUT/ab-nccl" --runs 3 -- \
    -b 1K -e 1M -f 2 -d float -o sum -n 50 -w 10 > "$OUT/ab-nccl.txt" 2>&1
echo "mscx-ab nccl rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
cat "$OUT/ab-nccl.txt" | tail -25
t0=$(date +%s)
timeout "${GPU_SUITE_TIMEOUT:-240}" meson test -C "$BUILD" --no-rebuild --suite gpu --print-errorlogs > "$OUT/gpu-suite.log" 2>&1
echo "gpu suite rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):" "$OUT/gpu-suite.log"
cp "$BUILD/meson-logs/testlog.txt" "$OUT/gpu-testlog.txt" 2>/dev/null
for d in nccl-api torch; do
    cp "$BUILD"/tests/gpu/$d/summary.json* "$OUT/" 2>/dev/null
done
