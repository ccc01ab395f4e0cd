#!/bin/sh
# SPDX-License-Identifier: MIT
# Symbol audit: the dynamic symbols defined by the shim are exactly the
# functions declared in nccl.h (nccl* and pnccl*), nothing more, nothing less.
# The header's list is extracted here independently of the shim's generator.
# usage: check-exports.sh LIB NCCL_H CUDA_INCLUDE_DIR CC...
set -eu
lib=$1; hdr=$2; cudainc=$3; shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$@" -E -P -I "$(dirname "$hdr")" -I "$cudainc" -x c "$hdr" | tr '\n' ' ' | tr ';' '\n' |
    sed -E 's/__attribute__ *\(\(([^()]|\([^()]*\))*\)\)//g' |
    grep -oE '(ncclResult_t|char *\*|void) +p?nccl[A-Za-z0-9_]+ *\(' |
    sed -E 's/.*[ *](p?nccl[A-Za-z0-9_]+) *\(/\1/' | sort -u > "$tmp/header"
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u > "$tmp/lib"
nh=$(wc -l < "$tmp/header"); nl=$(wc -l < "$tmp/lib")
if [ "$nh" -lt 40 ]; then
    echo "only $nh functions parsed from $hdr"; exit 1
fi
if ! diff -u "$tmp/header" "$tmp/lib"; then
    echo "FAIL: exports of $lib differ from the functions of $hdr (- header only, + library only)"
    exit 1
fi
echo "ok: $nl exports equal the $nh functions of $hdr"
