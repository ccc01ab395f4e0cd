#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
which nsys ncu gnuplot; ls /usr/local/cuda/bin | grep -i -E "nsys|ncu|nsight"; python3 -c "import matplotlib; print('mpl', matplotlib.__version__)"; nproc; ls /sys/class/infiniband 2>&1
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
(meson setup bd -Dgpu_arch=sm_90 && ninja -C bd tools/mscx-bench-gpu) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; tail -3 $OUT/build.log
cuobjdump -res-usage bd/tools/mscx-bench-gpu 2>/dev/null | grep -A1 -E "mscx_exec_kernel|ref_oneshot" | head -12
MSCX_BENCH_RANKS=2 timeout 60 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 16384
N=$(which nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$N" ]; then
  MSCX_BENCH_RANKS=2 timeout 120 $N profile -o $OUT/prof --cuda-graph-trace=node -t cuda bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 1024 > $OUT/nsys.log 2>&1
  $N stats -r cuda_gpu_kern_sum $OUT/prof.nsys-rep 2>&1 | head -30
  $N stats -r cuda_gpu_trace -f csv $OUT/prof.nsys-rep > $OUT/trace.csv 2>/dev/null; wc -l $OUT/trace.csv
fi
