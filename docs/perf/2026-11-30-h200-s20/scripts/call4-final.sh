#!/bin/bash
# s20 call 4 (main at aec7d3f): the README's main job, the gpu suite, mscx-bench-gpu up to 4 MiB
# (eager, graph, joined graph; PDL default), then the unseen DSL plans.
export NCCL_NVLS_ENABLE=0; mkdir -p /tmp/o
OUT=/tmp/o/m BUILD=bf PARTS="build main suite bench" BENCH_MAX=4194304 BENCH_S=240 MAIN_S=200 tests/perf/device-run.sh > $OUT/a-run.txt 2>&1
echo "run rc $?" >> $OUT/a-run.txt
eval "$(tools/device-deps.sh --unpack)" >/dev/null
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/dsl.txt 2>&1; echo "dsl rc $?" >> $OUT/a-run.txt
tail -3 /tmp/o/dsl.txt > $OUT/g-dsl.txt
cp /tmp/o/m/main.txt /tmp/o/m/bench.txt /tmp/o/m/machine.txt /tmp/o/m/steps.txt $OUT/; cp /tmp/o/m/gpu.log $OUT/gpu-log.txt
