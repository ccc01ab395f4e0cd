#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu_gate.sh MIN [--torch] -- CMD...: run CMD only when at least MIN GPUs are
# present (nvidia-smi -L, or torch.cuda.device_count() with --torch, which
# also needs torch importable); otherwise exit 77, meson's "skipped".
# The GPU counts are tools/ab/multigpu/common.sh's, as the sweep scripts count.
set -euo pipefail
MG_NAME=gpu_gate
. "$(dirname "$0")/../../tools/ab/multigpu/common.sh"
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
    if ! n=$(mg_torch_gpus "$py" 2>/dev/null); then
        echo "SKIP: $py cannot import torch"
        exit 77
    fi
else
    n=$(mg_nvidia_gpus)
fi
if [ "$n" -lt "$min" ]; then
    echo "SKIP: needs $min GPUs, found $n"
    exit 77
fi
exec "$@"
