#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine, after a build (tools/dev/device-run.sh build): where
# the executor's time per launch goes on one GPU, against the hand-written
# kernel. Results under RESULTS (default out):
#   launch.txt        mscx-bench-launch (launch cost by kernel shape, PDL)
#   traces.txt        MSCX_TRACE summaries of N-rank 1 KB AllReduce under a
#                     CUDA graph (mscx-perf --executor N -G), MSCX_PDL 1 and 0
#   perf.txt          mscx-perf --executor N, executor and --baseline
#   nsys.txt          with nsys, MSCX_PDL=0: kernel durations and gaps per stream
#                     (tools/bench/nsys-gaps.py), executor and baseline
#   tools/bench/launch-diag.sh [RANKS...]     (default 2 8)
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-bd}
RESULTS=${RESULTS:-out}
mkdir -p "$RESULTS"
[ -d .deps/debs ] && eval "$(tools/dev/device-deps.sh --unpack)"
RANKS=${*:-2 8}
P="$BUILD/tools/perf/mscx-perf"
timeout 120 "$BUILD/tools/mscx-bench-launch" >"$RESULTS/launch.txt" 2>&1
echo "launch rc=$?"
cat "$RESULTS/launch.txt"
# which kernel the executor runs for these launches (INFO lines of the executor)
MSCX_PLAN_DIR=plans MSCX_DEBUG=INFO MSCX_DEBUG_SUBSYS=EXEC timeout 60 "$P" --executor 2 -b 1K -e 1K -n 5 -w 1 2>&1 |
    grep -E "program for|dependent launch" | sort | uniq -c | head -8
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
for n in $RANKS; do
    for p in 1 0; do
        MSCX_PLAN_DIR=plans MSCX_PDL=$p MSCX_TRACE=$RESULTS/trace-$n-p$p.json timeout 60 "$P" --executor "$n" -b 1K -e 1K -n 100 -w 10 -G 3 \
            >/dev/null 2>&1
        echo "== trace $n ranks, MSCX_PDL=$p" >>"$RESULTS/traces.txt"
        python3 tools/bench/trace-summary.py "$RESULTS/trace-$n-p$p.json" >>"$RESULTS/traces.txt" 2>&1
        rm -f "$RESULTS/trace-$n-p$p.json"
        for b in "" --baseline; do
            echo "== mscx-perf $n ranks, MSCX_PDL=$p ${b:-executor}" >>"$RESULTS/perf.txt"
            MSCX_PLAN_DIR=plans MSCX_PDL=$p timeout 60 "$P" --executor "$n" $b -b 1K -e 4K -f 4 -n 200 -w 20 -G 5 \
                2>&1 | grep -vE "^#( |$)" >>"$RESULTS/perf.txt"
        done
        if [ -n "$NSYS" ] && [ "$p" = 0 ]; then
            for b in exec --baseline; do
                bb=$b; [ "$b" = exec ] && bb=""
                MSCX_PLAN_DIR=plans MSCX_PDL=$p timeout 120 "$NSYS" profile -q --cuda-graph-trace=node -t cuda -f true \
                    -o "/tmp/ns-$n-$p-$b" "$P" --executor "$n" $bb -b 1K -e 1K -n 100 -w 5 -G 3 >/dev/null 2>&1
                timeout 120 "$NSYS" stats -q -r cuda_gpu_trace -f csv -o "/tmp/ns-$n-$p-$b" \
                    "/tmp/ns-$n-$p-$b.nsys-rep" >/dev/null 2>&1
                echo "== nsys $n ranks, MSCX_PDL=$p, $b" | tee -a "$RESULTS/nsys.txt"
                python3 tools/bench/nsys-gaps.py /tmp/ns-$n-$p-$b*cuda_gpu_trace*.csv 4 2>&1 | tee -a "$RESULTS/nsys.txt"
            done
        fi
    done
done
[ -n "$NSYS" ] || echo "no nsys on this machine"
cat "$RESULTS/perf.txt" "$RESULTS/traces.txt"
