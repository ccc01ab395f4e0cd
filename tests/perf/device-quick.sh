#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, briefly: build, the gpu suite, and a world-size-1 A/B.
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
timeout 100 meson test -C bd --no-rebuild --suite gpu --print-errorlogs >"$OUT/gpu.log" 2>&1
echo "gpu suite rc=$? $(($(date +%s) - t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|compared|shim summary|^plans:" "$OUT/gpu.log" | head -20
t=$(date +%s)
timeout 45 tools/mscx-ab --build bd --plan-dir plans --out "$OUT/ab" --runs 3 -- -b 1K -e 1M -f 4 -d float -o sum -n 40 -w 10 >"$OUT/ab.txt" 2>&1
echo "ab rc=$? $(($(date +%s) - t))s"
head -12 "$OUT/ab.txt"
