#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a GPU machine, runs the chosen parts, in this order:
#   build    meson setup (when needed) and ninja -k 0 of BUILD
#   main     the README's main job: tools/ab/mscx-main BUILD --gpu (NCCL vs the
#            shim at world size 1, the executor vs the hand-written kernel for
#            2, 4, 8 ranks, eager and graph); its results as RESULTS/ab-out.tgz
#   trace    MSCX_TRACE of an 8-rank allreduce (mscx-perf --executor 8),
#            checked as Chrome trace JSON: X events, monotonic per track
#   compare  the NCCL-vs-shim comparisons (gpu-nccl-api-compare, gpu-torch-compare)
#   ab       tools/ab/mscx-ab at world size 1, 1K..1M
#   suite    meson test --suite gpu
#   bench    BUILD/tools/mscx-bench-gpu over the reference and shipped plans
#   mgpu     with 2+ GPUs: meson test --suite multigpu (sweep, PyTorch
#            correctness A/B), tools/bench/mg-diag.sh (NCCL vs shim per
#            placement, eager and graph, traces) and the PyTorch timing A/B
#            (tests/multigpu/torch_ar_time.py, without and with the shim)
#
#   tools/dev/device-run.sh                       # build main trace suite
#   tools/dev/device-run.sh build compare ab suite
#   tools/dev/device-run.sh all
#   PARTS="build bench" BENCH_MAX=4194304 tools/dev/device-run.sh
#
# Settings (environment): RESULTS (results, default out), BUILD (default bd),
# MGPU_S (600: the multigpu part's limit),
# PARTS (when no part is named), time limits in seconds MAIN_S (200),
# TRACE_S (30), COMPARE_S (200), AB_S (120), SUITE_S (240), BENCH_S (150);
# MAIN_RUNS (A/B pairs of the main job, 2), AB_RUNS (3), BENCH_MAX (largest
# message of the bench, bytes, 1048576), BENCH_PLANS (the generated plans
# benched, default plans; e.g. a folder of variants made with
# BUILD/tools/mscx-plangen --blocks/--tbs-per-peer), BENCH_REF (the reference plans,
# tests/data/mscclpp/mscclpp-algo-plans). Each part prints "PART rc=N Ts" (also in
# RESULTS/steps.txt) and the lines of its log that matter; the script exits 1
# when any part failed. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
RESULTS=${RESULTS:-out}
BUILD=${BUILD:-bd}
ALL="build main trace compare ab suite bench mgpu"
[ $# -gt 0 ] && PARTS="$*"
PARTS=${PARTS:-build main trace suite}
[ "$PARTS" = all ] && PARTS=$ALL
for p in $PARTS; do
    case " $ALL " in *" $p "*) ;; *) echo "usage: $0 [all | PART...], PART one of: $ALL" >&2; exit 2 ;; esac
done
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$RESULTS"
: >"$RESULTS/steps.txt"
[ -d .deps/debs ] && eval "$(tools/dev/device-deps.sh --unpack)"
# programs linked against libnccl: the system's, else the one in torch's wheel
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
    d=$(python3 -c 'import glob,sys; print(next((p for s in sys.path for p in glob.glob(s+"/nvidia/nccl/lib")), ""))' 2>/dev/null)
    [ -n "$d" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MSCX_TEST_NCCL_LIB=$d/libnccl.so.2
fi
FAILED=0
T0=0
begin() { T0=$(date +%s); }
# end PART RC: one line for the part, kept in steps.txt
end() {
    echo "$1 rc=$2 $(($(date +%s) - T0))s" | tee -a "$RESULTS/steps.txt"
    [ "$2" = 0 ] || FAILED=1
}
# the test log of the last meson test, kept as RESULTS/$1
keep_testlog() { cp "$BUILD/meson-logs/testlog.txt" "$RESULTS/$1" 2>/dev/null; }
TESTLINES='^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):'

{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
    date -u
} >"$RESULTS/machine.txt" 2>&1

if want build; then
    begin
    { [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dgpu_arch=sm_90; ninja -C "$BUILD" -k 0; } >"$RESULTS/build.log" 2>&1
    end build $?
    grep -E "error|FAILED" "$RESULTS/build.log" | head -5
fi

if want main; then
    begin
    MSCX_AB_OUT=$PWD/ab-out timeout "${MAIN_S:-200}" tools/ab/mscx-main "$BUILD" --gpu --runs "${MAIN_RUNS:-2}" \
        >"$RESULTS/main.txt" 2>&1
    end main $?
    grep -vE "^\s*$" "$RESULTS/main.txt" | grep -E "^\||^#|FAIL|wrong|rc=|==|->|ab.png" | head -120
    tar czf "$RESULTS/ab-out.tgz" ab-out 2>/dev/null
fi

if want trace; then
    begin
    MSCX_PLAN_DIR=${MSCX_PLAN_DIR:-plans} MSCX_TRACE=$RESULTS/trace8.json timeout "${TRACE_S:-30}" "$BUILD/tools/perf/mscx-perf" --executor 8 -b 1K -e 1K \
        -n 3 -w 1 >"$RESULTS/trace-run.txt" 2>&1
    rc=$?
    python3 - "$RESULTS/trace8.json" <<'PY' || rc=1
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
sys.exit(0 if x and mono else 1)
PY
    end trace $rc
fi

if want compare; then
    begin
    timeout "${COMPARE_S:-200}" meson test -C "$BUILD" --no-rebuild --print-errorlogs gpu-nccl-api-compare \
        gpu-torch-compare >"$RESULTS/compare.log" 2>&1
    end compare $?
    grep -E "^ *[0-9]+/[0-9]+ |compared|shim summary|DIFF|FAIL|real NCCL|ncclAllReduce from|torch_collectives" \
        "$RESULTS/compare.log" | head -40
    keep_testlog compare-testlog.txt
    for d in nccl-api torch; do
        cp "$BUILD"/tests/gpu/$d/summary.json* "$RESULTS/" 2>/dev/null
    done
fi

if want ab; then
    begin
    timeout "${AB_S:-120}" tools/ab/mscx-ab --build "$BUILD" --plan-dir plans --out "$RESULTS/ab-nccl" --runs "${AB_RUNS:-3}" -- \
        -b 1K -e 1M -f 2 -d float -o sum -n 50 -w 10 >"$RESULTS/ab-nccl.txt" 2>&1
    end ab $?
    tail -25 "$RESULTS/ab-nccl.txt"
fi

if want suite; then
    begin
    timeout "${SUITE_S:-240}" meson test -C "$BUILD" --no-rebuild --print-errorlogs --suite gpu >"$RESULTS/gpu.log" 2>&1
    end suite $?
    grep -E "$TESTLINES|^plans:|^stress:|^graph:|^hang:|^wrap:|compared|shim summary|passed|latency|FAIL" \
        "$RESULTS/gpu.log" | head -60
    keep_testlog gpu-testlog.txt
fi

if want bench; then
    begin
    timeout "${BENCH_S:-150}" "$BUILD/tools/mscx-bench-gpu" "${BENCH_REF:-tests/data/mscclpp/mscclpp-algo-plans}" \
        "${BENCH_PLANS:-plans}" \
        "${BENCH_MAX:-1048576}" >"$RESULTS/bench.txt" 2>&1
    end bench $?
    cat "$RESULTS/bench.txt"
fi

if want mgpu; then
    begin
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
    if [ "${ngpu:-0}" -lt 2 ]; then
        echo "mgpu: $ngpu GPU(s), needs 2: skipped"
        rc=0
    else
        rc=0
        timeout "${MGPU_S:-600}" bash -c '
            meson test -C "$1" --no-rebuild --suite multigpu >"$2/mgpu.log" 2>&1 || echo "multigpu suite failed"
            cp "$1"/multigpu-sweep-2/README.md "$2/sweep.md" 2>/dev/null
            cp "$1"/multigpu-sweep-2/crossovers.txt "$2/" 2>/dev/null
            RESULTS=$2 BUILD=$1 tools/bench/mg-diag.sh allreduce >"$2/mg-diag.txt" 2>&1
            for m in nccl mscx; do
                e=()
                [ $m = mscx ] && e=(LD_PRELOAD="$PWD/$1/shim/libmscx_nccl.so" MSCX_PLAN_DIR="$PWD/plans")
                env "${e[@]}" python3 -m torch.distributed.run --standalone --nproc-per-node "$3" \
                    tests/multigpu/torch_ar_time.py --out "$2/torch-$m.json" >"$2/torch-$m.txt" 2>&1 ||
                    echo "torch_ar_time $m failed"
            done' _ "$BUILD" "$RESULTS" "$ngpu" | tee "$RESULTS/mgpu-fail.txt"
        [ -s "$RESULTS/mgpu-fail.txt" ] && rc=1
        grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped):" "$RESULTS/mgpu.log"
        grep -A12 "^## Crossovers" "$RESULTS/crossovers.txt" 2>/dev/null
        for m in nccl mscx; do echo "torch $m (bytes eager_us graph_us):"; grep -E "^ +[0-9]+ " "$RESULTS/torch-$m.txt"; done
    fi
    end mgpu $rc
fi

echo "parts: $PARTS; $(grep -c ' rc=0 ' "$RESULTS/steps.txt") of $(wc -l <"$RESULTS/steps.txt") passed; results in $RESULTS"
exit $FAILED
