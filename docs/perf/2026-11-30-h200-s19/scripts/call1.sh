#!/bin/bash
# s19 call 1: exp/s19-kinl-uniform measured against the same tree built with -DMSCX_KINL=0
mkdir -p /tmp/o
eval "$(tools/device-deps.sh --unpack)" >/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > /tmp/o/a-env.txt
git log --oneline -1 >> /tmp/o/a-env.txt
T0=$(date +%s)
( meson setup bd -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/setup1.txt 2>&1 && ninja -C bd >/tmp/o/b1.txt 2>&1; echo "bd rc $?" >>/tmp/o/a-env.txt ) &
( meson setup bd0 -Dkernel_subset=fp32 -Dtests=disabled -Dcuda_args=-DMSCX_KINL=0 >/tmp/o/setup0.txt 2>&1 && ninja -C bd0 >/tmp/o/b0.txt 2>&1; echo "bd0 rc $?" >>/tmp/o/a-env.txt ) &
wait
echo "build s $(( $(date +%s) - T0 ))" >> /tmp/o/a-env.txt
tail -3 /tmp/o/b1.txt /tmp/o/b0.txt >> /tmp/o/a-env.txt
timeout 120 bd/tools/mscx-bench-launch > /tmp/o/c-launch.txt 2>&1; echo "launch rc $?" >> /tmp/o/a-env.txt
for rep in 1 2; do
for pdl in 0 1; do for n in 2 4 8; do for b in bd bd0; do
  echo "## $b PDL=$pdl ranks=$n rep=$rep" >> /tmp/o/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> /tmp/o/d-bench.txt
done; done; done; done
echo "bench done s $(( $(date +%s) - T0 ))" >> /tmp/o/a-env.txt
for n in 2 4 8; do for b in bd bd0; do
  echo "## $b ranks=$n exec" >> /tmp/o/e-perf.txt
  MSCX_PLAN_DIR=plans timeout 60 $b/tools/perf/mscx-perf --executor $n -b 1K -e 16K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | tail -5 >> /tmp/o/e-perf.txt
  echo "## $b ranks=$n baseline" >> /tmp/o/e-perf.txt
  MSCX_PLAN_DIR=plans timeout 60 $b/tools/perf/mscx-perf --executor $n --baseline -b 1K -e 16K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | tail -5 >> /tmp/o/e-perf.txt
done; done
echo "all s $(( $(date +%s) - T0 ))" >> /tmp/o/a-env.txt
cp /tmp/o/a-env.txt /tmp/o/c-launch.txt /tmp/o/d-bench.txt /tmp/o/e-perf.txt $OUT/
