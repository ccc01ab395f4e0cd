#!/bin/sh
# SPDX-License-Identifier: MIT
# Setup never waits for work that is not the library's own: no device-wide
# synchronisation in executor/ or shim/, and no synchronous copy or fill
# (legacy default stream) in the files that create executors, add plans or
# import buffers.
root=${1:-.}
code() { grep -Ev '^[^:]+:[0-9]+:[[:space:]]*(\*|/\*|//)'; }
fail=0
hits=$(grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
    -E '\b(cudaDeviceSynchronize|cudaCtxSynchronize|cuCtxSynchronize|cudaThreadSynchronize)\s*\(' \
    "$root/executor" "$root/shim" 2>/dev/null | code)
if [ -n "$hits" ]; then
    echo "device-wide synchronisation in executor/ or shim/:"
    echo "$hits"
    fail=1
fi
setup="context.c upload.c finalize.c programs.c peer_buffers.c ports.c"
for f in $setup; do
    s=$(grep -Hn -E '\bcuda(Memcpy|Memset|Memcpy2D)\s*\(' "$root/executor/gpu/runtime/$f" | code)
    if [ -n "$s" ]; then
        echo "synchronous copy or fill in executor/gpu/runtime/$f (use the executor's stream):"
        echo "$s"
        fail=1
    fi
done
for f in boot.c devops.c; do
    s=$(grep -Hn -E '\bcuda(Memcpy|Memset)\s*\(' "$root/shim/$f" | code)
    if [ -n "$s" ]; then
        echo "synchronous copy or fill in shim/$f (use the bootstrap's stream):"
        echo "$s"
        fail=1
    fi
done
[ $fail -eq 0 ] && echo "ok: no device-wide synchronisation and no synchronous setup copy"
exit $fail
