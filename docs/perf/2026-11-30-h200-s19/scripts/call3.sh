#!/bin/bash
# s19 call 3: args hot fields in the first 64 bytes (exp/s19-argline) against main, then gpu suite + unseen DSL with it
mkdir -p /tmp/o
eval "$(tools/device-deps.sh --unpack)" >/dev/null
E=/tmp/o/a-env.txt
git log --oneline -1 > $E; git status --short >> $E
rm -rf /tmp/m0; mkdir -p /tmp/m0; git archive main | tar -x -C /tmp/m0; ln -s $PWD/.deps /tmp/m0/.deps
T0=$(date +%s)
( meson setup bf >/tmp/o/setupf.txt 2>&1 && ninja -C bf >/tmp/o/bf.txt 2>&1; echo "bf rc $?" >>$E ) &
( cd /tmp/m0 && meson setup bd0 -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/setup0.txt 2>&1 && ninja -C bd0 >/tmp/o/b0.txt 2>&1; echo "bd0 rc $?" >>$E ) &
wait
B0=/tmp/m0/bd0
echo "build s $(( $(date +%s) - T0 ))" >> $E
grep -i "error" /tmp/o/bf.txt /tmp/o/b0.txt | head -5 >> $E
for b in bf $B0; do echo "## $b"; timeout 120 $b/tools/mscx-bench-launch 2>&1 | grep "one-shot\|executor\|empty, 7 x 512, 16"; done > /tmp/o/c-launch.txt
for rep in 1 2; do
for pdl in 0 1; do for n in 2 4 8; do for b in bf $B0; do
  echo "## $b PDL=$pdl ranks=$n rep=$rep" >> /tmp/o/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> /tmp/o/d-bench.txt
done; done; done; done
for n in 2 4 8; do for b in bf $B0; do for base in "" --baseline; do
  echo "## $b ranks=$n $base" >> /tmp/o/e-perf.txt
  MSCX_PLAN_DIR=plans timeout 60 $b/tools/perf/mscx-perf --executor $n $base -b 1K -e 64K -f 4 -d float -o sum -n 50 -w 10 -G 1 2>&1 | grep -v "^#" | grep -v "^$" >> /tmp/o/e-perf.txt
done; done; done
echo "bench done s $(( $(date +%s) - T0 ))" >> $E
cp $E /tmp/o/c-launch.txt /tmp/o/d-bench.txt /tmp/o/e-perf.txt $OUT/
for b in bf $B0; do
  src=$(cd $b/executor/kernels && grep -l "LL16, MSCX_DT_FP32, true, true, MSCX_KBOUND, MSCX_KSET_PKT" exec_k_*.cu | head -1)
  root=$PWD; [ "$b" = bf ] || root=/tmp/m0
  (cd $b/executor/kernels && nvcc -O2 -DMSCX_NET_HAS_IB=1 -I$root/executor/src -I$root/executor/include -I$root/executor/kernels -arch=sm_90 -std=c++17 -cubin -o /tmp/o/k.cubin $src && cuobjdump -sass /tmp/o/k.cubin) > /tmp/o/sass-$(basename $b).txt 2>&1
done
cp /tmp/o/sass-*.txt $OUT/
timeout 240 meson test -C bf --suite gpu > /tmp/o/f-suite.txt 2>&1; echo "suite rc $?" >> $E
tail -15 /tmp/o/f-suite.txt > $OUT/f-suite.txt
echo "suite done s $(( $(date +%s) - T0 ))" >> $E
cp $E $OUT/
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/g-dsl.txt 2>&1; echo "dsl rc $?" >> $E
tail -3 /tmp/o/g-dsl.txt > $OUT/g-dsl.txt
echo "all s $(( $(date +%s) - T0 ))" >> $E
cp $E $OUT/
