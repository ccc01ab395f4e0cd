#!/bin/bash
# Not run yet (s19 left no device time): MSCX_KJOIN v2 (branch exp/s19-kjoin, the record's load issued
# first, `early` and op in the first bank line) against -DMSCX_KJOIN=0; then the gpu suite and the
# unseen DSL plans with it. Run from the repository root with .deps carried.
mkdir -p /tmp/o; eval "$(tools/device-deps.sh --unpack)" >/dev/null; E=$OUT/a-env.txt; T0=$(date +%s)
( meson setup bf >/tmp/o/sf 2>&1 && ninja -C bf >/tmp/o/bf 2>&1; echo "bf rc $?" >>$E ) &
( meson setup bj0 -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KJOIN=0 -Dcuda_args=-DMSCX_KJOIN=0 >/tmp/o/s0 2>&1 && ninja -C bj0 >/tmp/o/b0 2>&1; echo "bj0 rc $?" >>$E ) &
wait; echo "build s $(( $(date +%s) - T0 ))" >> $E
for rep in 1 2; do for pdl in 0 1; do for n in 2 4 8; do for b in bf bj0; do
  echo "## $b PDL=$pdl ranks=$n rep=$rep" >> $OUT/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 30 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> $OUT/d-bench.txt
done; done; done; done
for n in 2 4 8; do for spec in bf: bj0: bf:--baseline; do d=${spec%%:*}; x=${spec#*:}
  echo "## $d $x ranks=$n" >> $OUT/e-perf.txt
  MSCX_PLAN_DIR=plans timeout 30 $d/tools/perf/mscx-perf --executor $n $x -b 1K -e 64K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | grep -v "^$" >> $OUT/e-perf.txt
done; done
echo "bench s $(( $(date +%s) - T0 ))" >> $E
timeout 240 meson test -C bf --suite gpu > /tmp/o/suite.txt 2>&1; echo "suite rc $?" >> $E; tail -16 /tmp/o/suite.txt > $OUT/f-suite.txt
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/dsl.txt 2>&1; echo "dsl rc $?" >> $E; tail -3 /tmp/o/dsl.txt > $OUT/g-dsl.txt
echo "all s $(( $(date +%s) - T0 ))" >> $E
