#!/bin/bash
# s19 call 5: MSCX_KREC_BYTES 2048 (bf, full) / 1024 (b1k) / 0 (bk0) against main (bd0)
mkdir -p /tmp/o
eval "$(tools/device-deps.sh --unpack)" >/dev/null
E=/tmp/o/a-env.txt
git log --oneline -1 > $E; git status --short >> $E
rm -rf /tmp/m0; mkdir -p /tmp/m0; git archive main | tar -x -C /tmp/m0; ln -s $PWD/.deps /tmp/m0/.deps
T0=$(date +%s)
( meson setup bf >/tmp/o/setupf.txt 2>&1 && ninja -C bf >/tmp/o/bf.txt 2>&1; echo "bf rc $?" >>$E ) &
( meson setup b1k -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KREC_BYTES=1024u -Dcuda_args=-DMSCX_KREC_BYTES=1024u >/tmp/o/setup1.txt 2>&1 && ninja -C b1k >/tmp/o/b1.txt 2>&1; echo "b1k rc $?" >>$E ) &
( meson setup bk0 -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KREC_BYTES=0u -Dcuda_args=-DMSCX_KREC_BYTES=0u >/tmp/o/setupk0.txt 2>&1 && ninja -C bk0 >/tmp/o/bk0.txt 2>&1; echo "bk0 rc $?" >>$E ) &
( cd /tmp/m0 && meson setup bd0 -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/setup0.txt 2>&1 && ninja -C bd0 >/tmp/o/b0.txt 2>&1; echo "bd0 rc $?" >>$E ) &
wait
B0=/tmp/m0/bd0
echo "build s $(( $(date +%s) - T0 ))" >> $E
cuobjdump -res-usage bf/shim/libmscx_nccl.so 2>&1 | grep -o "STACK:[0-9]*" | sort | uniq -c >> $E
grep -i "error" /tmp/o/bf.txt /tmp/o/b1.txt /tmp/o/bk0.txt /tmp/o/b0.txt | head -5 >> $E
for rep in 1 2; do
for pdl in 0 1; do for n in 2 4 8; do for b in bf b1k bk0 $B0; do
  echo "## $b PDL=$pdl ranks=$n rep=$rep" >> /tmp/o/d-bench.txt
  MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 2>&1 | grep "^| gen" >> /tmp/o/d-bench.txt
done; done; done; done
echo "bench done s $(( $(date +%s) - T0 ))" >> $E
cp $E /tmp/o/d-bench.txt $OUT/
timeout 240 meson test -C bf --suite gpu > /tmp/o/f-suite.txt 2>&1; echo "suite rc $?" >> $E
tail -15 /tmp/o/f-suite.txt > $OUT/f-suite.txt
echo "suite done s $(( $(date +%s) - T0 ))" >> $E
cp $E $OUT/
timeout 150 bf/tests/gpu/test-gpu-exec plans .deps/dsl-unseen > /tmp/o/g-dsl.txt 2>&1; echo "dsl rc $?" >> $E
tail -3 /tmp/o/g-dsl.txt > $OUT/g-dsl.txt
echo "all s $(( $(date +%s) - T0 ))" >> $E
cp $E $OUT/
