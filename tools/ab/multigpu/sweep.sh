#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The multi-GPU A/B sweep, in one command on one host:
#   build, GPU topology, NCCL version and whether NCCL's symmetric kernels ran,
#   then tools/ab/mscx-ab (stock NCCL vs the LD_PRELOAD shim) for every
#   collective x ranks x dtype x mode, 1K..64M, and finally
#   tools/ab/multigpu/crossover.py (crossovers, suggested plan bounds, targets).
# NVLink multicast is never used: NCCL_NVLS_ENABLE=0 is exported for every step.
#
#   tools/ab/multigpu/sweep.sh                  # 8 GPUs: ranks 2 4 8, everything
#   tools/ab/multigpu/sweep.sh --ranks 1        # smoke test on one GPU
#   tools/ab/multigpu/sweep.sh --dry-run        # print every command, run nothing
#
# Every failed step is printed at once as "sweep: FAILED: ..." and listed in
# DIR/failures.txt; the sweep goes on with the next configuration and exits 1
# at the end when anything failed (a failed build stops it at once).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
MG_NAME=sweep
. tools/ab/multigpu/common.sh

DRY=0
RANKS="2 4 8"
COLLS="allreduce allgather reducescatter"
DTYPES="half bfloat16 float"
MODES="eager graph"
RUNS=3
ITERS=50
WARMUP=10
GRAPH_LAUNCHES=10
MIN_SIZE=1K
MAX_SIZE=64M
BUILD=${MSCX_BUILD_DIR:-build}
PLAN_DIR=plans
RESULTS=""
SKIP_BUILD=0
TOL=0

usage() {
    cat <<EOF
usage: tools/ab/multigpu/sweep.sh [options]
  --dry-run            print every command without running anything
  --ranks "LIST"       rank counts (default "$RANKS"); "1" is a one-GPU smoke test
  --colls "LIST"       collectives (default "$COLLS")
  --dtypes "LIST"      mscx-perf datatypes (default "$DTYPES")
  --modes "LIST"       eager and/or graph (default "$MODES")
  --runs N             alternated A/B pairs per configuration (default $RUNS)
  --iters N            timed iterations (default $ITERS); --warmup N (default $WARMUP)
  --graph-launches N   graph mode: mscx-perf -G N (default $GRAPH_LAUNCHES)
  --min S --max S      size range (default $MIN_SIZE .. $MAX_SIZE, factor 2)
  --build DIR          build directory (default \$MSCX_BUILD_DIR or build)
  --plan-dir DIR       plans for the shim (default plans)
  --out DIR            results (default ab-out/<date>-<N>x<GPU>)
  --tol F              crossover tolerance, fraction (default 0)
  --skip-build         use the build directory as it is
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --ranks) RANKS=$2; shift ;;
    --colls) COLLS=$2; shift ;;
    --dtypes) DTYPES=$2; shift ;;
    --modes) MODES=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --graph-launches) GRAPH_LAUNCHES=$2; shift ;;
    --min) MIN_SIZE=$2; shift ;;
    --max) MAX_SIZE=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --plan-dir) PLAN_DIR=$2; shift ;;
    --out) RESULTS=$2; shift ;;
    --tol) TOL=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "sweep: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

mg_need_uints $RANKS $RUNS $ITERS $WARMUP $GRAPH_LAUNCHES
for m in $MODES; do
    case "$m" in eager | graph) ;; *) die "unknown mode '$m' (eager, graph)" ;; esac
done
for c in $COLLS; do
    case "$c" in allreduce | allgather | reducescatter) ;; *) die "unknown collective '$c'" ;; esac
done

NGPU=$(mg_nvidia_gpus)
GPU_NAME=unknown
if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
        sed -e 's/^NVIDIA //' -e 's/[^A-Za-z0-9_.-]/-/g')
    [ -n "$GPU_NAME" ] || GPU_NAME=unknown
fi
MAXR=0
for r in $RANKS; do [ "$r" -gt "$MAXR" ] && MAXR=$r; done
[ "$MAXR" -ge 1 ] || die "--ranks needs at least one rank count"
if [ "$DRY" = 0 ] && [ "$NGPU" -lt "$MAXR" ]; then
    die "--ranks '$RANKS' needs $MAXR GPUs, nvidia-smi -L lists $NGPU"
fi
DATE=$(date +%Y-%m-%d)
[ -n "$RESULTS" ] || RESULTS="ab-out/$DATE-${NGPU}x$GPU_NAME"
PERF=$BUILD/tools/perf/mscx-perf
SHIM=$BUILD/shim/libmscx_nccl.so
FAILS=$RESULTS/failures.txt

log "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE (multicast off); results in $RESULTS"
run mkdir -p "$RESULTS"
[ "$DRY" = 1 ] || : >"$FAILS"

# ---- 1. build
mg_build
if [ "$DRY" = 0 ]; then
    [ -x "$PERF" ] || die "$PERF was not built (needs CUDA, libnccl and nccl.h: meson -Dnccl_include=DIR)"
    [ -f "$SHIM" ] || die "$SHIM was not built"
    command -v python3 >/dev/null || die "python3 not found"
    if ! command -v gnuplot >/dev/null; then
        log "warning: gnuplot not found; mscx-ab writes the tables but no PNG plots"
    fi
fi

# ---- 2. machine, topology, NCCL version, symmetric kernels
run_log "$RESULTS/topology.txt" nvidia-smi topo -m || fail "nvidia-smi topo -m failed"
run_log "$RESULTS/nvidia-smi.txt" nvidia-smi || fail "nvidia-smi failed"
INFO_LOG=$RESULTS/nccl-info.log
printf '+ NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV %s --coll allreduce --nproc %s -b 1K -e 64K -f 2 -d float -n 5 -w 2 > %s\n' \
    "$PERF" "$MAXR" "$INFO_LOG"
if [ "$DRY" = 0 ]; then
    if ! NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV "$PERF" --coll allreduce --nproc "$MAXR" \
        -b 1K -e 64K -f 2 -d float -n 5 -w 2 >"$INFO_LOG" 2>&1; then
        tail -n 20 "$INFO_LOG" >&2
        die "the NCCL probe run failed (log: $INFO_LOG)"
    fi
    NCCL_VERSION=$(grep -m1 -o 'NCCL version [0-9][^ ]*' "$INFO_LOG" || true)
    [ -n "$NCCL_VERSION" ] || NCCL_VERSION=$(grep -m1 'NCCL version code' "$INFO_LOG" || true)
    [ -n "$NCCL_VERSION" ] || die "no NCCL version in $INFO_LOG"
    if grep -qiE '\[Symmetric\]|symk|symmetric kernel' "$INFO_LOG"; then
        SYMK="yes: $(grep -m1 -iE '\[Symmetric\]|symk|symmetric kernel' "$INFO_LOG")"
    else
        SYMK="no (no [Symmetric]/symk line in NCCL_DEBUG=INFO TUNING output; mscx-perf does not window-register its buffers)"
    fi
    log "$NCCL_VERSION"
    log "NCCL symmetric kernels ran: $SYMK"
    {
        echo "date: $DATE"
        echo "host: $(hostname)"
        echo "gpus: $NGPU x $GPU_NAME"
        echo "nccl: $NCCL_VERSION"
        echo "nccl symmetric kernels: $SYMK"
        echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
        echo "mscx commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
        echo "ranks: $RANKS; collectives: $COLLS; dtypes: $DTYPES; modes: $MODES; runs: $RUNS; iters: $ITERS; sizes: $MIN_SIZE..$MAX_SIZE"
    } >"$RESULTS/machine.txt"
    cat "$RESULTS/machine.txt"
fi

# ---- 3. the A/B sweep
START=$SECONDS
for coll in $COLLS; do
    for n in $RANKS; do
        for dt in $DTYPES; do
            for mode in $MODES; do
                name=$coll-n$n-$dt-$mode
                dir=$RESULTS/ab/$name
                extra=()
                [ "$mode" = graph ] && extra=(-G "$GRAPH_LAUNCHES")
                log "$name ($((SECONDS - START)) s into the sweep)"
                cmd=(python3 tools/ab/mscx-ab --build "$BUILD" --plan-dir "$PLAN_DIR" --runs "$RUNS" --out "$dir" --
                    --coll "$coll" --nproc "$n" -b "$MIN_SIZE" -e "$MAX_SIZE" -f 2 -d "$dt"
                    -n "$ITERS" -w "$WARMUP" -c 1 "${extra[@]}")
                [ "$DRY" = 1 ] || mkdir -p "$dir"
                if ! run_log "$dir/mscx-ab.log" "${cmd[@]}"; then
                    if [ -f "$dir/ab.md" ] && grep -q 'gnuplot not found' "$dir/mscx-ab.log"; then
                        log "warning: $name: no plot (gnuplot missing); table in $dir/ab.md"
                    else
                        fail "$name: mscx-ab failed (log: $dir/mscx-ab.log)"
                    fi
                fi
            done
        done
    done
done

# ---- 4. index of the tables
if [ "$DRY" = 0 ]; then
    {
        echo "<!-- SPDX-License-Identifier: MIT -->"
        echo "# mscx vs NCCL, $DATE, $NGPU x $GPU_NAME"
        echo
        echo '```'
        cat "$RESULTS/machine.txt"
        echo '```'
        for d in "$RESULTS"/ab/*/; do
            [ -f "$d/ab.md" ] || continue
            echo
            echo "## $(basename "$d")"
            echo
            cat "$d/ab.md"
            [ -f "$d/ab.png" ] && echo && echo "![$(basename "$d")](ab/$(basename "$d")/ab.png)"
        done
    } >"$RESULTS/README.md"
fi

# ---- 5. crossovers, suggested plan bounds, targets
req=()
case " $RANKS " in *" 8 "*) req=(--require-targets) ;; esac
if ! run_log "$RESULTS/crossovers.txt" python3 tools/ab/multigpu/crossover.py "$RESULTS" --plan-dir "$PLAN_DIR" \
    --build "$BUILD" --json "$RESULTS/crossovers.json" --tol "$TOL" --failures "$FAILS" "${req[@]}"; then
    fail "crossover.py: targets failed or results unreadable (see $RESULTS/crossovers.txt)"
fi

mg_finish "all steps passed; results in $RESULTS" "results (partial) in $RESULTS"
