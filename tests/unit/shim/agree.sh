#!/bin/sh
# SPDX-License-Identifier: MIT
# Two processes as the two ranks of one communicator (the fake NCCL's
# FAKE_NCCL_WORLD), each with its own settings, run the driver's lifecycle.
# Usage: agree.sh DRIVER WORKDIR WANT ENV0 ENV1
#   WANT  "agree": no warning, both ranks log that they agree;
#         otherwise the text the one warning of each rank must hold (both
#         ranks then fall back without agreeing); "TEXT0|TEXT1" gives each
#         rank its own
#   ENVr  space-separated VAR=value settings of rank r ("" for none)
# Fails on a hang (a rank waiting in an exchange the other skipped: the fake
# ends it with status 99), a second warning, or ranks that decide differently.
driver=$1 work=$2 want=$3 env0=$4 env1=$5
rm -rf "$work" && mkdir -p "$work/world" || exit 1
for r in 0 1; do
    eval "extra=\$env$r"
    # shellcheck disable=SC2086 # word splitting of the settings is intended
    env FAKE_NCCL_WORLD="$work/world" FAKE_NCCL_RANK=$r FAKE_NCCL_NRANKS=2 FAKE_NCCL_WAIT_MS=10000 \
        FAKE_NCCL_LOG="$work/fake$r.log" MSCX_DEBUG=INFO MSCX_DEBUG_SUBSYS=SHIM MSCX_DEBUG_FILE="$work/shim$r.txt" \
        $extra "$driver" --expect-shim --lifecycle >"$work/out$r.txt" 2>&1 &
    eval "pid$r=\$!"
done
fail=0
for r in 0 1; do
    eval "wait \$pid$r"
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "rank $r: driver exit $rc"; cat "$work/out$r.txt"; fail=1
    fi
done
for r in 0 1; do
    touch "$work/shim$r.txt"
    warns=$(grep -c 'WARN' "$work/shim$r.txt")
    reached=$(grep -c 'ranks agree on their settings' "$work/shim$r.txt")
    if [ "$want" = agree ]; then
        if [ "$warns" -ne 0 ] || [ "$reached" -ne 1 ]; then
            echo "rank $r: $warns warnings, agreed $reached times; expected 0 and 1"; fail=1
        fi
    else
        case $want in
        *"|"*) [ $r = 0 ] && mine=${want%%|*} || mine=${want#*|} ;;
        *) mine=$want ;;
        esac
        good=$(grep 'WARN' "$work/shim$r.txt" | grep -c -F -- "$mine")
        if [ "$warns" -ne 1 ] || [ "$good" -ne 1 ] || [ "$reached" -ne 0 ]; then
            echo "rank $r: $warns warnings ($good with '$mine'), agreed $reached times;" \
                 "expected one such warning and no agreement"; fail=1
        fi
    fi
    [ $fail -eq 0 ] || { echo "--- rank $r's log:"; cat "$work/shim$r.txt"; }
done
[ $fail -eq 0 ] && echo ok
exit $fail
