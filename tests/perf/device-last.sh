#!/usr/bin/env bash
# On the GPU machine, one short call: build only what the checks need, the
# gpu-exec and multi-process tests, a checked 8-rank MSCX_TRACE, and the
# executor bench for the generated plans at small sizes.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-out}; mkdir -p $OUT
eval "$(tools/device-deps.sh --unpack)"
t=$(date +%s)
( [ -f bd/build.ninja ] || meson setup bd -Dgpu_arch=sm_90; ninja -C bd tests/gpu/test-gpu-exec tests/gpu/test-gpu-mproc tools/perf/mscx-perf tools/mscx-bench-gpu ) >$OUT/build.log 2>&1
echo "build rc=$? $(($(date +%s)-t))s"; grep -E "error|FAILED" $OUT/build.log | head -5
t=$(date +%s)
timeout 60 meson test -C bd --no-rebuild --print-errorlogs gpu-stress gpu-graph gpu-hang gpu-wrap gpu-plans gpu-mproc-ipc gpu-mproc-twonode gpu-mproc-cudaport gpu-mproc-kill >$OUT/gpu.log 2>&1
echo "gpu tests rc=$? $(($(date +%s)-t))s"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Timeout):|^plans:|^stress:|^graph:|FAIL" $OUT/gpu.log | head -30
cp bd/meson-logs/testlog.txt $OUT/gpu-testlog.txt 2>/dev/null
MSCX_PLAN_DIR=plans MSCX_TRACE=$OUT/trace8.json timeout 20 bd/tools/perf/mscx-perf --executor 8 -b 1K -e 1K -n 3 -w 1 >$OUT/trace-run.txt 2>&1
echo "trace run rc=$?"
python3 - $OUT/trace8.json <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
x = [e for e in ev if e.get("ph") == "X"]
tracks = {}
for e in x:
    tracks.setdefault((e["pid"], e["tid"]), []).append(e)
mono = all(all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in zip(v, v[1:])) for v in (sorted(t, key=lambda e: e["ts"]) for t in tracks.values()))
meta = [e for e in ev if e.get("ph") == "M"]
print("trace: valid JSON, %d X events, %d M events, %d tracks over %d ranks, monotonic per track: %s, names: %s" % (
    len(x), len(meta), len(tracks), len({k[0] for k in tracks}), mono, ",".join(sorted({e["name"] for e in x}))))
PY
MSCX_BENCH_PLANS=gen timeout 60 bd/tools/mscx-bench-gpu .deps/ref/mscclpp-algo-plans plans 4096 2>&1 | grep -E "^\||empty"
