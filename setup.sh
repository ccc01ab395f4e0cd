#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One entry point for a fresh machine.
#   ./setup.sh run    install dependencies, build, run the main job
#                     (no GPU: verify every shipped plan on the host executor;
#                      GPU: the A/B benchmark)
#   ./setup.sh test   install dependencies, build, run the tests
#   ./setup.sh deps   install dependencies only
#   ./setup.sh build  install dependencies and build only
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
BUILD=${MSCX_BUILD_DIR:-build}
# The nccl.h fetched from NCCL's pip wheel where the machine has none, and the
# oldest and newest ones the shim's tests also build against (./setup.sh test).
NCCL_H_DEFAULT=2.28.9
NCCL_H_RANGE="2.19.3 2.32.6"
APT_PACKAGES="meson ninja-build pkg-config gcc g++ check libjansson-dev libibverbs-dev gnuplot-nox python3 clang clang-format"

log() { printf '[setup] %s\n' "$*" >&2; }

have_deps() {
    command -v meson >/dev/null && command -v ninja >/dev/null && command -v pkg-config >/dev/null &&
        pkg-config --exists jansson check
}

# Hosts without a package registry (the GPU machine) use Debian packages
# downloaded beforehand by tools/dev/device-deps.sh into .deps/ and unpacked here.
use_local_deps() {
    if [ -x tools/dev/device-deps.sh ] && [ -d .deps/debs ]; then
        eval "$(tools/dev/device-deps.sh --unpack --print-env)"
    fi
}

install_deps() {
    if have_deps; then
        return 0
    fi
    use_local_deps
    if have_deps; then
        return 0
    fi
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        log "installing: $APT_PACKAGES"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $APT_PACKAGES >/dev/null
    elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then
        sudo apt-get update -qq
        # shellcheck disable=SC2086
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $APT_PACKAGES >/dev/null
    fi
    have_deps || { log "missing build dependencies (meson, ninja, pkg-config, jansson, check)"; exit 1; }
}

# NCCL's wheel's include directory of one version, cached outside the tree
# (tools/dev/fetch-nccl-h.py); nothing and a log line when it cannot be had.
fetch_nccl_h() {
    local dir
    if dir=$(tools/dev/fetch-nccl-h.py "$1" 2> >(sed 's/^/[setup] /' >&2)); then
        echo "$dir"
    fi
}

# -Dnccl_include for a new build dir where the shim's own search
# (shim/find_nccl_h.py) finds no nccl.h and the arguments name none.
nccl_h_args() {
    local a dir
    for a in "$@"; do
        case "$a" in -Dshim=disabled | -Dnccl_include=*) return 0 ;; esac
    done
    if python3 shim/find_nccl_h.py >/dev/null; then
        return 0
    fi
    log "no nccl.h on this machine: fetching NCCL $NCCL_H_DEFAULT's from its pip wheel"
    dir=$(fetch_nccl_h "$NCCL_H_DEFAULT")
    if [ -n "$dir" ]; then
        echo "-Dnccl_include=$dir"
    fi
}

build() {
    if [ ! -f "$BUILD/build.ninja" ]; then
        local extra out
        extra=$(nccl_h_args "$@")
        # shellcheck disable=SC2086
        if ! out=$(meson setup "$BUILD" $extra "$@" 2>&1); then
            printf '%s\n' "$out" | tail -n 20 >&2
            exit 1
        fi
    fi
    ninja -C "$BUILD" >/dev/null
    log "built in $BUILD"
}

has_gpu() {
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU
}

cmd=${1:-run}
shift || true
case "$cmd" in
deps) install_deps ;;
build) install_deps; build "$@" ;;
test)
    install_deps
    build
    range=()
    for v in $NCCL_H_RANGE; do
        range+=("--nccl-h=$v:$(fetch_nccl_h "$v")")
    done
    exec tools/dev/run-tests.sh "$BUILD" "${range[@]}" "$@"
    ;;
run)
    install_deps
    build
    if has_gpu; then
        exec tools/ab/mscx-main "$BUILD" --gpu "$@"
    fi
    exec tools/ab/mscx-main "$BUILD" --host "$@"
    ;;
*)
    echo "usage: ./setup.sh run|test|deps|build" >&2
    exit 2
    ;;
esac
