set -u; export NCCL_NVLS_ENABLE=0; mkdir -p $OUT; eval "$(tools/device-deps.sh --unpack)"
d=$(python3 -c 'import glob,sys; print(next((p for s in sys.path for p in glob.glob(s+"/nvidia/nccl/lib")), ""))' 2>/dev/null)
ldconfig -p | grep -q 'libnccl.so.2 ' || { [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH MSCX_TEST_NCCL_LIB=$d/libnccl.so.2; }
t=$(date +%s); (meson setup bd -Dgpu_arch=sm_90 && ninja -C bd) > $OUT/build.log 2>&1; echo "build rc=$? $(( $(date +%s)-t ))s"; tail -3 $OUT/build.log
t=$(date +%s); timeout 270 meson test -C bd --no-rebuild --suite gpu --print-errorlogs > $OUT/gpu.log 2>&1; echo "gpu rc=$? $(( $(date +%s)-t ))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|compared|shim summary|plans:|stress:|graph:|hang:|wrap:" $OUT/gpu.log | head -40; cp bd/meson-logs/testlog.txt $OUT/gpu-testlog.txt
t=$(date +%s); timeout 70 tools/mscx-ab --build bd --plan-dir plans --out $OUT/ab --runs 3 -- -b 1K -e 1M -f 4 -d float -o sum -n 40 -w 10 > $OUT/ab.txt 2>&1; echo "ab rc=$? $(( $(date +%s)-t ))s"; tail -15 $OUT/ab.txt
t=$(date +%s); timeout 90 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 65536 > $OUT/bench.txt 2>&1; echo "bench rc=$? $(( $(date +%s)-t ))s"; cat $OUT/bench.txt | head -30
timeout 20 bd/tools/mscx-bench-plan > $OUT/benchplan.txt 2>&1; head -8 $OUT/benchplan.txt
