#!/bin/sh
# SPDX-License-Identifier: MIT
# Run PROGRAM MODE as the two ranks of one communicator: two processes over
# the fake NCCL's FAKE_NCCL_WORLD, each with its own fake log and shim log
# under WORKDIR. Fails when either fails; a rank left waiting in an exchange
# the other skipped is ended by the fake (status 99).
# Usage: two_ranks.sh PROGRAM MODE WORKDIR
prog=$1 mode=$2 work=$3
rm -rf "$work" && mkdir -p "$work/world" || exit 1
for r in 0 1; do
    env FAKE_NCCL_WORLD="$work/world" FAKE_NCCL_RANK=$r FAKE_NCCL_NRANKS=2 FAKE_NCCL_WAIT_MS=10000 \
        FAKE_NCCL_LOG="$work/fake$r.log" MSCX_DEBUG=INFO MSCX_DEBUG_SUBSYS=SHIM \
        MSCX_DEBUG_FILE="$work/shim$r.txt" "$prog" "$mode" >"$work/out$r.txt" 2>&1 &
    eval "pid$r=\$!"
done
fail=0
for r in 0 1; do
    eval "wait \$pid$r"
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "rank $r: exit $rc"; cat "$work/out$r.txt"; fail=1
    fi
done
[ $fail -eq 0 ] && echo ok
exit $fail
