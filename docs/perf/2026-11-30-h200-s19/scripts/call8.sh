#!/bin/bash
# s19 call 8: MSCX_KJOIN (branch exp/s19-kjoin) against the same tree with -DMSCX_KJOIN=0
mkdir -p /tmp/o; eval "$(tools/device-deps.sh --unpack)" >/dev/null; E=$OUT/a-env.txt; T0=$(date +%s)
( meson setup bj -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/s1 2>&1 && ninja -C bj >/tmp/o/b1 2>&1; echo "bj rc $?" >>$E ) &
( meson setup bj0 -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KJOIN=0 -Dcuda_args=-DMSCX_KJOIN=0 >/tmp/o/s0 2>&1 && ninja -C bj0 >/tmp/o/b0 2>&1; echo "bj0 rc $?" >>$E ) &
wait; echo "build s $(( $(date +%s) - T0 ))" >> $E
for pdl in 0 1; do for n in 2 4 8; do for b in bj bj0; do echo "## $b PDL=$pdl ranks=$n" >> $OUT/d-bench.txt; MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 30 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> $OUT/d-bench.txt; done; done; done
echo "bench s $(( $(date +%s) - T0 ))" >> $E
for n in 2 4 8; do for spec in bj: bj0: bj:--baseline; do d=${spec%%:*}; x=${spec#*:}; echo "## $d $x ranks=$n" >> $OUT/e-perf.txt; MSCX_PLAN_DIR=plans timeout 30 $d/tools/perf/mscx-perf --executor $n $x -b 1K -e 64K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | grep -v "^$" >> $OUT/e-perf.txt; done; done
echo "all s $(( $(date +%s) - T0 ))" >> $E
