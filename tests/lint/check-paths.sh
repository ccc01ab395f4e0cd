#!/bin/sh
# SPDX-License-Identifier: MIT
# The build, the tests, the tools and the scripts read nothing outside the
# source tree: a user's clone has nothing beside it. Fails on a reference to
# a sibling folder of the tree (a shared reference folder beside the clone,
# say) or to an absolute path of a developer's machine.
root=${1:-.}
up='\.\.'
pat="(^|[^.])$up/shared|shared/reference|MSCX_SOURCE_ROOT \"/$up|source_root\(\) / '$up'|source_root / '$up'|/work/"
hits=$(cd "$root" && grep -rnE "$pat" \
    --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.in' \
    --include='*.py' --include='*.sh' --include='meson.build' --include='meson_options.txt' \
    executor shim plans tools tests .ci setup.sh meson.build meson_options.txt 2>/dev/null |
    grep -v '^tests/lint/check-paths\.sh:' | grep -v '^tests/data/')
# scripts without an extension (tools/ab/mscx-ab, .ci/run and the like)
for f in $(cd "$root" && find tools .ci -type f ! -name '*.*' 2>/dev/null); do
    h=$(cd "$root" && grep -nE "$pat" "$f" | sed "s|^|$f:|")
    [ -n "$h" ] && hits="$hits
$h"
done
hits=$(printf '%s\n' "$hits" | sed '/^$/d')
if [ -n "$hits" ]; then
    echo "paths outside the source tree:"
    echo "$hits"
    exit 1
fi
echo "ok: no path outside the source tree"
