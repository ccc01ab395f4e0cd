#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The PyTorch A/B in one command on one host:
#   for N in --nproc: torchrun tests/multigpu/torch_job.py without and with the
#   shim (LD_PRELOAD, MSCX_PLAN_DIR, MSCX_SUMMARY_FILE), compare the two; then
#   (N >= 4) the same job and an mscx-perf AllReduce A/B with the ranks split
#   into two virtual nodes (MSCX_VIRTUAL_NODES=2) per port transport; then
#   (N >= 2) the failure test, without and with the shim.
#
#   tools/ab/multigpu/torch_ab.sh                 # 8 GPUs: N = 2 4 8
#   tools/ab/multigpu/torch_ab.sh --nproc 1       # one-GPU dry run of the job
#   tools/ab/multigpu/torch_ab.sh --dry-run       # print the commands only
#
# Every failure is printed as "torch_ab: FAILED: ..." and listed in
# DIR/failures.txt; the script goes on and exits 1 at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
MG_NAME=torch_ab
. tools/ab/multigpu/common.sh

DRY=0
NPROCS="2 4 8"
BUILD=${MSCX_BUILD_DIR:-build}
PLAN_DIR=plans
RESULTS=""
STEPS=50
TIMEOUT=30
JOB_LIMIT=300
TRANSPORTS="tcp auto"
SKIP_BUILD=0
PY=${PYTHON:-python3}

usage() {
    cat <<EOF
usage: tools/ab/multigpu/torch_ab.sh [options]
  --dry-run            print the commands without running them
  --nproc "LIST"       ranks per job (default "$NPROCS"); 1 runs the job on one GPU
  --build DIR          build directory (default \$MSCX_BUILD_DIR or build)
  --plan-dir DIR       MSCX_PLAN_DIR for the shim (default plans)
  --out DIR            results (default ab-out/<date>-torch)
  --steps N            DDP steps (default $STEPS)
  --timeout S          process-group / NCCL timeout in the failure test (default $TIMEOUT)
  --job-limit S        kill a job that runs longer (default $JOB_LIMIT)
  --transports "LIST"  MSCX_TRANSPORT values for the virtual-node runs (default "$TRANSPORTS")
  --skip-build         use the build directory as it is
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --nproc) NPROCS=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --plan-dir) PLAN_DIR=$2; shift ;;
    --out) RESULTS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --job-limit) JOB_LIMIT=$2; shift ;;
    --transports) TRANSPORTS=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "torch_ab: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

mg_need_uints $NPROCS $STEPS $TIMEOUT $JOB_LIMIT

[ -n "$RESULTS" ] || RESULTS="ab-out/$(date +%Y-%m-%d)-torch"
FAILS=$RESULTS/failures.txt
abspath() {
    case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$ROOT" "$1" ;; esac
}
RESULTS=$(abspath "$RESULTS")
SHIM=$(abspath "$BUILD/shim/libmscx_nccl.so")
PLANS=$(abspath "$PLAN_DIR")

run mkdir -p "$RESULTS"
[ "$DRY" = 1 ] || : >"$FAILS"

mg_build
if [ "$DRY" = 0 ]; then
    [ -f "$SHIM" ] || die "$SHIM was not built"
    "$PY" -c 'import torch' || die "$PY cannot import torch"
    ngpu=$(mg_torch_gpus "$PY") || die "torch cannot count GPUs"
    for n in $NPROCS; do
        [ "$n" -le "$ngpu" ] || die "--nproc $n needs $n GPUs, torch sees $ngpu"
    done
    "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee "$RESULTS/versions.txt"
fi

# torchrun of the job; $1 = output dir, $2 = N, rest = env assignments
job() {
    local dir=$1 n=$2
    shift 2
    run_log "$dir.log" env "$@" timeout -k 10 "$JOB_LIMIT" "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node "$n" tests/multigpu/torch_job.py run --out "$dir" --steps "$STEPS"
}

shim_env() { # $1 = summary file
    printf '%s\n' "LD_PRELOAD=$SHIM" "MSCX_PLAN_DIR=$PLANS" "MSCX_SUMMARY_FILE=$1"
}

compare() { # base dir, mscx dir, summary, label
    run_log "$2.compare.txt" "$PY" tests/multigpu/torch_job.py compare "$1" "$2" --summary "$3" --require-routed ||
        fail "$4: the shim run differs from NCCL (see $2.compare.txt)"
}

for n in $NPROCS; do
    d=$RESULTS/n$n
    log "N=$n: NCCL run"
    job "$d/nccl" "$n" "NCCL_NVLS_ENABLE=0" || fail "n$n: the NCCL job failed (log $d/nccl.log)"
    log "N=$n: shim run"
    mapfile -t senv < <(shim_env "$d/mscx-summary.json")
    if job "$d/mscx" "$n" "${senv[@]}"; then
        compare "$d/nccl" "$d/mscx" "$d/mscx-summary.json" "n$n"
    else
        fail "n$n: the shim job failed (log $d/mscx.log)"
    fi

    if [ "$n" -ge 4 ] && [ $((n % 2)) = 0 ]; then
        for t in $TRANSPORTS; do
            v=$d/vnodes2-$t
            log "N=$n: two virtual nodes of $((n / 2)), MSCX_TRANSPORT=$t"
            mapfile -t senv < <(shim_env "$v-summary.json")
            if job "$v" "$n" "${senv[@]}" MSCX_VIRTUAL_NODES=2 MSCX_TRANSPORT="$t"; then
                compare "$d/nccl" "$v" "$v-summary.json" "n$n vnodes2 $t"
            else
                fail "n$n vnodes2 $t: the shim job failed (log $v.log)"
            fi
            run_log "$v-perf.log" env MSCX_VIRTUAL_NODES=2 MSCX_TRANSPORT="$t" timeout -k 10 "$JOB_LIMIT" \
                "$PY" tools/ab/mscx-ab --build "$BUILD" --plan-dir "$PLAN_DIR" --runs 3 --out "$v-perf" -- \
                --coll allreduce --nproc "$n" -b 1K -e 2M -f 2 -d float -n 50 -w 10 -c 1 -G 10 ||
                grep -qs 'gnuplot not found' "$v-perf.log" ||
                fail "n$n vnodes2 $t: mscx-perf A/B failed (log $v-perf.log)"
        done
    else
        log "N=$n: virtual-node runs skipped (need an even N >= 4)"
    fi

    if [ "$n" -ge 2 ]; then
        run_log "$d/failtest-nccl.txt" env NCCL_NVLS_ENABLE=0 "$PY" tests/multigpu/torch_job.py failtest \
            --nproc "$n" --timeout "$TIMEOUT" --out "$d/failtest-nccl" || fail "n$n: failure test without the shim"
        mapfile -t senv < <(shim_env "$d/failtest-summary.json")
        run_log "$d/failtest-mscx.txt" env "${senv[@]}" "$PY" tests/multigpu/torch_job.py failtest \
            --nproc "$n" --timeout "$TIMEOUT" --out "$d/failtest-mscx" || fail "n$n: failure test with the shim"
    else
        log "N=$n: failure test skipped (needs 2 ranks)"
    fi
done

mg_finish "all passed; results in $RESULTS"
