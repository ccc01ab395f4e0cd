#!/bin/sh
# SPDX-License-Identifier: MIT
# Configuration is read in exactly one place: executor/common/env.c.
root=${1:-.}
hits=$(grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' -E '\b(secure_)?getenv\s*\(' \
    "$root/executor" "$root/shim" 2>/dev/null | grep -v '^'"$root"'/executor/common/env.c:' | grep -Ev '^[^:]+:[0-9]+:[[:space:]]*(\*|/\*|//)')
if [ -n "$hits" ]; then
    echo "getenv() outside executor/common/env.c:"
    echo "$hits"
    exit 1
fi
echo "ok: getenv only in executor/common/env.c"
