#!/bin/bash
# s19 call 6: main HEAD (bf, full) vs a92a1fe (bA) vs 2109925 (bP, session start); suite, DSL, bench, README main job
mkdir -p /tmp/o/m
eval "$(tools/device-deps.sh --unpack)" >/dev/null
E=/tmp/o/a-env.txt
git log --oneline -1 > $E; git status --short >> $E
for c in a92a1fe 2109925; do rm -rf /tmp/t$c; mkdir -p /tmp/t$c; git archive $c | tar -x -C /tmp/t$c; ln -s $PWD/.deps /tmp/t$c/.deps; done
T0=$(date +%s)
( meson setup bf >/tmp/o/setupf.txt 2>&1 && ninja -C bf >/tmp/o/bf.txt 2>&1; echo "bf rc $?" >>$E ) &
( cd /tmp/ta92a1fe && meson setup bA -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/setupA.txt 2>&1 && ninja -C bA >/tmp/o/bA.txt 2>&1; echo "bA rc $?" >>$E ) &
( cd /tmp/t2109925 && meson setup bP -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/setupP.txt 2>&1 && ninja -C bP >/tmp/o/bP.txt 2>&1; echo "bP rc $?" >>$E ) &
wait
echo "build s $(( $(date +%s) - T0 ))" >> $E
cuobjdump -res-usage bf/shim/libmscx_nccl.so 2>&1 | grep -o "STACK:[0-9]*" | sort | uniq -c >> $E
grep -i "error" /tmp/o/bf.txt /tmp/o/bA.txt /tmp/o/bP.txt | head -5 >> $E
cp $E $OUT/
timeout 240 meson test -C bf --suite gpu > /tmp/o/f-suite.txt 2>&1; echo "suite rc $?" >> $E
tail -16 /tmp/o/f-suite.txt > $OUT/f-suite.txt
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/g-dsl.txt 2>&1; echo "dsl rc $?" >> $E
tail -3 /tmp/o/g-dsl.txt > $OUT/g-dsl.txt
echo "suite+dsl done s $(( $(date +%s) - T0 ))" >> $E; cp $E $OUT/
B="bf /tmp/ta92a1fe/bA /tmp/t2109925/bP"
for rep in 1 2; do
for pdl in 0 1; do for n in 2 4 8; do for b in $B; do
  echo "## $b PDL=$pdl ranks=$n rep=$rep" >> /tmp/o/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> /tmp/o/d-bench.txt
done; done; done; done
echo "ab bench done s $(( $(date +%s) - T0 ))" >> $E; cp $E /tmp/o/d-bench.txt $OUT/
timeout 150 bf/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 4194304 > /tmp/o/h-bench-full.txt 2>&1; echo "full bench rc $?" >> $E
MSCX_PDL=0 timeout 100 bf/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 > /tmp/o/h-bench-pdl0.txt 2>&1; echo "pdl0 bench rc $?" >> $E
cp /tmp/o/h-bench-*.txt $OUT/
echo "bench done s $(( $(date +%s) - T0 ))" >> $E; cp $E $OUT/
BUILD=bf OUT=/tmp/o/m MAIN_S=170 tests/perf/device-run.sh main > /tmp/o/m/run.txt 2>&1; echo "main rc $?" >> $E
tail -5 /tmp/o/m/run.txt >> $E
cp /tmp/o/m/main.txt /tmp/o/m/ab-out.tgz $OUT/
echo "all s $(( $(date +%s) - T0 ))" >> $E
cp $E $OUT/
