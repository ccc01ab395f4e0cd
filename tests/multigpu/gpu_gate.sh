#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu_gate.sh MIN [--torch] -- CMD...: run CMD only when at least MIN GPUs are
# present (nvidia-smi -L, or torch.cuda.device_count() with --torch, which
# also needs torch importable); otherwise exit 77, meson's "skipped".
set -euo pipefail
min=$1
shift
need_torch=0
if [ "${1:-}" = --torch ]; then
    need_torch=1
    shift
fi
[ "${1:-}" = -- ] && shift
py=${PYTHON:-python3}
if [ "$need_torch" = 1 ]; then
    if ! n=$("$py" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null); then
        echo "SKIP: $py cannot import torch"
        exit 77
    fi
else
    n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    fi
fi
if [ "$n" -lt "$min" ]; then
    echo "SKIP: needs $min GPUs, found $n"
    exit 77
fi
exec "$@"
