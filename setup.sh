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
APT_PACKAGES="meson ninja-build pkg-config gcc g++ check libjansson-dev libibverbs-dev gnuplot-nox python3 clang"

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

build() {
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" "$@" >/dev/null
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
    exec tools/dev/run-tests.sh "$BUILD" "$@"
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
