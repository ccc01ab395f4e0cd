#!/bin/bash
# s20 call 3: the shape of mscx-bench-gpu's graphs (MSCX_BENCH_EDGES: nodes, edges, programmatic edges),
# plain and joined, with MSCX_KEDGE (exp/s20-kedge) and without (-DMSCX_KEDGE=0); fp32 kernels only.
mkdir -p /tmp/o; eval "$(tools/device-deps.sh --unpack)" >/dev/null; E=$OUT/a-env.txt; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0
( meson setup bs -Dkernel_subset=fp32 -Dtests=disabled >/tmp/o/sf 2>&1 && ninja -C bs >/tmp/o/bf 2>&1; echo "bs rc $?" >>$E ) &
( meson setup bk0 -Dkernel_subset=fp32 -Dtests=disabled -Dc_args=-DMSCX_KEDGE=0 -Dcuda_args=-DMSCX_KEDGE=0 >/tmp/o/s0 2>&1 && ninja -C bk0 >/tmp/o/b0 2>&1; echo "bk0 rc $?" >>$E ) &
wait; echo "build s $(( $(date +%s) - T0 ))" >> $E
for pdl in 1 0; do for n in 2 8; do for b in bs bk0; do
  [ $pdl = 0 ] && [ $b = bk0 ] && continue
  echo "## $b PDL=$pdl ranks=$n" >> $OUT/d-bench.txt
  MSCX_BENCH_EDGES=1 MSCX_PDL=$pdl MSCX_BENCH_RANKS=$n MSCX_BENCH_PLANS=gen timeout 60 $b/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 4096 2>&1 | grep -E "^\| gen|rror|^graph" >> $OUT/d-bench.txt
done; done; done
echo "all s $(( $(date +%s) - T0 ))" >> $E
