#!/bin/sh
# SPDX-License-Identifier: MIT
# Processes as the ranks of one communicator (the fake NCCL's
# FAKE_NCCL_WORLD), each with its own settings, run the driver's lifecycle.
# Usage: agree.sh DRIVER WORKDIR WANT ENV0 ENV1 [ENV2 ...]  (one rank per ENV)
#   WANT  "agree": no warning, every rank logs that they agree;
#         otherwise the text the one warning of each rank must hold (the
#         ranks then fall back without agreeing); "TEXT0|TEXT1|..." gives
#         each rank its own, "-" for none (that rank falls back without a
#         warning)
#   ENVr  space-separated VAR=value settings of rank r ("" for none);
#         "LD_PRELOAD=" runs that rank without the shim
# AGREE_ARGS (environment) replaces the driver's arguments (--expect-shim
# --lifecycle, less --expect-shim for a rank without the shim); with WANT
# "agree", AGREE_TIMES (1) is how many exchanges each rank agrees in.
# AGREE_REACHED ("N0|N1|...") sets how many exchanges each rank agrees in,
# whatever WANT says (a rank that agrees in one communicator and falls back
# in another). With AGREE_ID=1 the ranks share the id rank 0 makes
# (DRV_ID_FILE). Every rank's driver exiting 77 is a skip.
# AGREE_WAIT_MS (10000) is how long the fake waits for the other ranks in one
# of its allgathers before it calls the wait a hang.
# Fails on a hang (a rank waiting in an exchange another skipped: the fake
# ends it with status 99), a second warning, or ranks that decide differently.
driver=$1 work=$2 want=$3
shift 3
n=$#
times=${AGREE_TIMES:-1}
rm -rf "$work" && mkdir -p "$work/world" || exit 1
idfile=
[ "${AGREE_ID:-0}" = 1 ] && idfile="$work/id"
r=0
for extra in "$@"; do
    case " $extra " in
    *" LD_PRELOAD= "*) args=${AGREE_ARGS:---lifecycle} args=${args#--expect-shim } ;;
    *) args=${AGREE_ARGS:---expect-shim --lifecycle} ;;
    esac
    # shellcheck disable=SC2086 # word splitting of the settings and arguments is intended
    env FAKE_NCCL_WORLD="$work/world" FAKE_NCCL_RANK=$r FAKE_NCCL_NRANKS=$n FAKE_NCCL_WAIT_MS=${AGREE_WAIT_MS:-10000} \
        FAKE_NCCL_LOG="$work/fake$r.log" MSCX_DEBUG=INFO MSCX_DEBUG_SUBSYS=SHIM MSCX_DEBUG_FILE="$work/shim$r.txt" \
        ${idfile:+DRV_ID_FILE=$idfile FAKE_NCCL_ID_INET=1} $extra "$driver" $args >"$work/out$r.txt" 2>&1 &
    eval "pid$r=\$!"
    r=$((r + 1))
done
fail=0 skipped=0
r=0
while [ $r -lt $n ]; do
    eval "wait \$pid$r"
    rc=$?
    if [ $rc -eq 77 ]; then
        skipped=$((skipped + 1))
    elif [ $rc -ne 0 ]; then
        echo "rank $r: driver exit $rc"; cat "$work/out$r.txt"; fail=1
    fi
    r=$((r + 1))
done
[ $skipped -eq $n ] && { cat "$work/out0.txt"; exit 77; }
[ $skipped -eq 0 ] || { echo "$skipped of $n ranks skipped"; fail=1; }
r=0
while [ $r -lt $n ]; do
    touch "$work/shim$r.txt"
    warns=$(grep -c 'WARN' "$work/shim$r.txt")
    reached=$(grep -c 'ranks agree on their settings' "$work/shim$r.txt")
    expect=0
    [ "$want" = agree ] && expect=$times
    [ -n "${AGREE_REACHED:-}" ] && expect=$(printf '%s\n' "$AGREE_REACHED" | cut -d'|' -f$((r + 1)))
    if [ "$want" = agree ]; then
        if [ "$warns" -ne 0 ] || [ "$reached" -ne "$expect" ]; then
            echo "rank $r: $warns warnings, agreed $reached times; expected 0 and $expect"; fail=1
        fi
    else
        case $want in
        *"|"*) mine=$(printf '%s\n' "$want" | cut -d'|' -f$((r + 1))) ;;
        *) mine=$want ;;
        esac
        good=$(grep 'WARN' "$work/shim$r.txt" | grep -c -F -- "$mine")
        if [ "$mine" = - ]; then
            [ "$warns" -eq 0 ] && [ "$reached" -eq "$expect" ] ||
                { echo "rank $r: $warns warnings, agreed $reached times; expected none and $expect"; fail=1; }
        elif [ "$warns" -ne 1 ] || [ "$good" -ne 1 ] || [ "$reached" -ne "$expect" ]; then
            echo "rank $r: $warns warnings ($good with '$mine'), agreed $reached times;" \
                 "expected one such warning and $expect agreements"; fail=1
        fi
    fi
    [ $fail -eq 0 ] || { echo "--- rank $r's log:"; cat "$work/shim$r.txt"; }
    r=$((r + 1))
done
[ $fail -eq 0 ] && echo ok
exit $fail
