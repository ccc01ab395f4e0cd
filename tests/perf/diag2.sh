#!/usr/bin/env bash
# On the GPU machine: per-op times of a one-rank probe plan, and ncu warp stall reasons.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd tools/perf/mscx-perf tools/mscx-bench-gpu ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; tail -2 $OUT/build.log
P=tests/data/perf/probe_n1_cpkt_upkt.json
MSCX_TRACE=$OUT/probe.json timeout 60 bd/tools/perf/mscx-perf --executor 1 --plan $P -b 4K -e 4K -n 3000 -w 100 2>&1 | tail -4
python3 tools/trace-summary.py $OUT/probe.json
timeout 120 ncu --cache-control none --clock-control none -k regex:mscx_exec_kernel -s 200 -c 2 --section WarpStateStats --section InstructionStats --section LaunchStats bd/tools/perf/mscx-perf --executor 1 --plan $P -b 4K -e 4K -n 300 -w 10 > $OUT/ncu.txt 2>&1
grep -v "^==PROF==" $OUT/ncu.txt | grep -E "Stall|stall|Warp Cycles|Instructions|Duration|Executed Ipc|Registers|Size" | head -60
