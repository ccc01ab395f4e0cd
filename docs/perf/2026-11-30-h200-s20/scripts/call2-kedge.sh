#!/bin/bash
# s20 call 2: MSCX_KEDGE (branch exp/s20-kedge: launches captured after a join of streams get programmatic
# edges from every kernel they depend on) against -DMSCX_KEDGE=0, with mscx-bench-gpu's new joined-graph
# column and alternated reps; then the gpu suite and the unseen DSL plans with it.
mkdir -p /tmp/o; eval "$(tools/device-deps.sh --unpack)" >/dev/null; E=$OUT/a-env.txt; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0
( meson setup bf >/tmp/o/sf 2>&1 && ninja -C bf >/tmp/o/bf 2>&1; echo "bf rc $?" >>$E ) &
( meson setup bk0 -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KEDGE=0 -Dcuda_args=-DMSCX_KEDGE=0 >/tmp/o/s0 2>&1 && ninja -C bk0 >/tmp/o/b0 2>&1; echo "bk0 rc $?" >>$E ) &
wait; echo "build s $(( $(date +%s) - T0 ))" >> $E
tail -5 /tmp/o/bf /tmp/o/b0 | grep -i error >> $E
for pdl in 1 0; do for n in 2 4 8; do for b in bf bk0; do
  [ $pdl = 0 ] && [ $b = bk0 ] && continue
  echo "## $b PDL=$pdl ranks=$n" >> $OUT/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep -E "^\| gen|rror" >> $OUT/d-bench.txt
done; done; done
echo "bench s $(( $(date +%s) - T0 ))" >> $E
for n in 2 8; do for spec in bf: bk0: bf:--baseline bk0:--baseline; do d=${spec%%:*}; x=${spec#*:}
  echo "## $d $x ranks=$n" >> $OUT/e-perf.txt
  MSCX_PLAN_DIR=plans timeout 30 $d/tools/perf/mscx-perf --executor $n $x -b 1K -e 64K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | grep -v "^$" >> $OUT/e-perf.txt
done; done
echo "perf s $(( $(date +%s) - T0 ))" >> $E
timeout 240 meson test -C bf --suite gpu > /tmp/o/suite.txt 2>&1; echo "suite rc $?" >> $E; tail -16 /tmp/o/suite.txt > $OUT/f-suite.txt
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/dsl.txt 2>&1; echo "dsl rc $?" >> $E; tail -3 /tmp/o/dsl.txt > $OUT/g-dsl.txt
echo "all s $(( $(date +%s) - T0 ))" >> $E
