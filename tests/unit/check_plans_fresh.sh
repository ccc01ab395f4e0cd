#!/bin/sh
# SPDX-License-Identifier: MIT
# The shipped plans must be exactly what the generator makes today:
# regenerate them all into a temporary directory and compare with plans/.
# Also checks that plans/meson.build lists exactly the generated files.
# usage: check_plans_fresh.sh PATH/TO/mscx-plangen PATH/TO/plans
set -u
LC_ALL=C
export LC_ALL
gen=$1
plans=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mscx-plans.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

if ! "$gen" --all "$tmp/new"; then
    echo "check_plans_fresh: mscx-plangen --all failed" >&2
    exit 1
fi

mkdir "$tmp/old"
for f in "$plans"/*.json; do
    [ -e "$f" ] && cp "$f" "$tmp/old/"
done

status=0
if ! diff -r "$tmp/old" "$tmp/new"; then
    echo "check_plans_fresh: plans/ is stale; regenerate with: mscx-plangen --all $plans" >&2
    status=1
fi

(cd "$tmp/new" && ls -1 ./*.json | sed 's|^\./||') > "$tmp/generated.txt"
sed -n "s/^ *'\([^']*\.json\)',\{0,1\} *$/\1/p" "$plans/meson.build" | sort > "$tmp/listed.txt"
if ! diff "$tmp/generated.txt" "$tmp/listed.txt" > "$tmp/list.diff"; then
    cat "$tmp/list.diff"
    echo "check_plans_fresh: plans/meson.build does not list exactly the generated files" >&2
    status=1
fi
exit $status
