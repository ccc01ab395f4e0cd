#!/usr/bin/env bash
# On the GPU machine, one call: build, the README's main job (tools/mscx-main
# --gpu: NCCL vs the shim at world size 1, and the executor vs the
# hand-written kernel for 2, 4, 8 ranks, eager and graph), an MSCX_TRACE of
# an 8-rank allreduce checked as Chrome trace JSON, then the gpu suite.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
eval "$(tools/device-deps.sh --unpack)"
d=$(python3 -c 'import glob,sys; print(next((p for s in sys.path for p in glob.glob(s+"/nvidia/nccl/lib")), ""))' 2>/dev/null)
if ! ldconfig -p | grep -q 'libnccl.so.2 ' && [ -n "$d" ]; then
    export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH MSCX_TEST_NCCL_LIB=$d/libnccl.so.2
fi
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; grep -E "error|FAILED" $OUT/build.log | head -5
t=$(date +%s)
MSCX_AB_OUT=$PWD/ab-out timeout ${MAIN_S:-200} tools/mscx-main bd --gpu --runs 2 >$OUT/main.txt 2>&1
echo "main job rc=$? $(($(date +%s)-t))s"
grep -vE "^\s*$" $OUT/main.txt | grep -E "^\||^#|FAIL|wrong|rc=|==|->|ab.png" | head -120
tar czf $OUT/ab-out.tgz ab-out 2>/dev/null
t=$(date +%s)
MSCX_TRACE=$OUT/trace8.json timeout 30 bd/tools/perf/mscx-perf --executor 8 -b 1K -e 1K -n 3 -w 1 >$OUT/trace-run.txt 2>&1
echo "trace run rc=$? $(($(date +%s)-t))s"
python3 - $OUT/trace8.json <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
x = [e for e in ev if e.get("ph") == "X"]
tracks = {}
for e in x:
    tracks.setdefault((e["pid"], e["tid"]), []).append(e)
mono = all(all(a["ts"] + a["dur"] <= b["ts"] + 1e-9 for a, b in zip(v, v[1:])) for v in (sorted(t, key=lambda e: e["ts"]) for t in tracks.values()))
names = sorted({e["name"] for e in x})
print("trace: valid JSON, %d X events, %d tracks (ranks %d), monotonic per track: %s, ops: %s" % (len(x), len(tracks), len({k[0] for k in tracks}), mono, ",".join(names)))
PY
t=$(date +%s)
timeout ${SUITE_S:-120} meson test -C bd --no-rebuild --print-errorlogs --suite gpu >$OUT/gpu.log 2>&1
echo "gpu suite rc=$? $(($(date +%s)-t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout):|^plans:|^stress:|^graph:|^hang:|^wrap:|compared|shim summary|passed|latency|FAIL" $OUT/gpu.log | head -60
cp bd/meson-logs/testlog.txt $OUT/gpu-testlog.txt 2>/dev/null
