# SPDX-License-Identifier: MIT
# Sourced (not run) by tools/ab/multigpu/sweep.sh, tools/ab/multigpu/torch_ab.sh and
# tests/multigpu/gpu_gate.sh: NVLink multicast off for every step, GPU counts,
# messages, dry-run aware command runners, the failure list and the final
# report. The sourcing script sets MG_NAME (its name in messages); the
# runners read DRY (1: print only), fail and mg_finish read FAILS.

export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1

die() {
    printf '%s: FAILED: %s\n' "$MG_NAME" "$*" >&2
    exit 1
}
log() { printf '[%s] %s\n' "$MG_NAME" "$*" >&2; }

# a failed step: printed at once, listed in FAILS, the script goes on
fail() {
    printf '%s: FAILED: %s\n' "$MG_NAME" "$*" >&2
    [ "$DRY" = 1 ] || printf '%s\n' "$*" >>"$FAILS"
}

# die unless every argument is a whole number
mg_need_uints() {
    local v
    for v in "$@"; do
        case "$v" in '' | *[!0-9]*) die "not a positive integer: '$v'" ;; esac
    done
}

# GPUs that nvidia-smi -L lists (0 without nvidia-smi)
mg_nvidia_gpus() {
    local n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    fi
    printf '%s\n' "$n"
}

# torch.cuda.device_count() of python $1; fails when torch cannot be imported
mg_torch_gpus() {
    "$1" -c 'import torch; print(torch.cuda.device_count())'
}

# print (always) and run (unless DRY=1) one command
run() {
    printf '+ %s\n' "$(printf '%q ' "$@")"
    [ "$DRY" = 1 ] && return 0
    "$@"
}

# the same, stdout and stderr also into FILE ($1; its folder is made)
run_log() {
    local file=$1
    shift
    printf '+ %s> %s\n' "$(printf '%q ' "$@")" "$file"
    [ "$DRY" = 1 ] && return 0
    mkdir -p "$(dirname "$file")"
    "$@" 2>&1 | tee "$file"
    return "${PIPESTATUS[0]}"
}

# ./setup.sh build into BUILD unless SKIP_BUILD=1; a failed build stops the script
mg_build() {
    if [ "$SKIP_BUILD" = 0 ]; then
        run env MSCX_BUILD_DIR="$BUILD" ./setup.sh build || die "./setup.sh build failed"
    fi
}

# the end: exit 0 after a dry run; exit 1 listing FAILS when a step failed
# (then $2, when given, is logged); else log $1 and return
mg_finish() {
    if [ "$DRY" = 1 ]; then
        log "dry run: nothing was run"
        exit 0
    fi
    if [ -s "$FAILS" ]; then
        echo "$MG_NAME: FAILED steps ($(wc -l <"$FAILS")):" >&2
        sed 's/^/  /' "$FAILS" >&2
        [ -z "${2:-}" ] || log "$2"
        exit 1
    fi
    log "$1"
}
