#!/bin/sh
# SPDX-License-Identifier: MIT
# Exercise the mscx-plan tool: check, show, fuse, sim, --help, and bad input.
# usage: test_tool.sh PATH/TO/mscx-plan SOURCE_ROOT
TOOL=$1
REF=$2/tests/data/mscclpp
OPS=$REF/mscclpp-op-plans
ALGO=$REF/mscclpp-algo-plans
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# expect WANTED_EXIT DESCRIPTION COMMAND...: run, keep stdout/stderr in $TMP/out, $TMP/err
expect() {
    want=$1
    desc=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq "$want" ]; then
        pass=$((pass + 1))
        echo "ok: $desc"
        return 0
    fi
    fail=$((fail + 1))
    echo "FAIL: $desc (exit $rc, wanted $want)"
    cat "$TMP/out" "$TMP/err" | head -20 | sed 's/^/  | /'
    return 1
}

# grep_in FILE PATTERN DESCRIPTION
grep_in() {
    if grep -q -e "$2" "$1"; then
        pass=$((pass + 1))
        echo "ok: $3"
    else
        fail=$((fail + 1))
        echo "FAIL: $3 (no '$2' in output)"
        head -20 "$1" | sed 's/^/  | /'
    fi
}

# --help everywhere
expect 0 "top-level --help" "$TOOL" --help && {
    for c in check show fuse sim; do grep_in "$TMP/out" "  $c " "--help lists $c"; done
}
for c in check show fuse sim; do
    expect 0 "$c --help" "$TOOL" $c --help && grep_in "$TMP/out" "usage: mscx-plan $c" "$c --help prints usage"
done
expect 2 "no command" "$TOOL"
expect 2 "unknown command" "$TOOL" frobnicate && grep_in "$TMP/err" "frobnicate" "unknown command is named"

# check
expect 0 "check good plans" "$TOOL" check "$OPS/reduce_copy_packet_test.json" "$OPS/put_test.json" "$ALGO/allreduce_pkt_n2.json" &&
    grep_in "$TMP/out" "^OK .*allreduce_pkt_n2.json" "check prints OK FILE"
printf '{"name": "broken", "gpus": [\n' >"$TMP/broken.json"
expect 1 "check broken file" "$TOOL" check "$TMP/broken.json" && grep_in "$TMP/out" "broken.json" "check names the broken file"
expect 1 "check good + broken" "$TOOL" check "$OPS/put_test.json" "$TMP/broken.json" &&
    grep_in "$TMP/out" "^OK .*put_test.json" "good file still reported OK"
expect 1 "check missing file" "$TOOL" check "$TMP/does-not-exist.json" && grep_in "$TMP/out" "does-not-exist.json" "missing file named"
expect 1 "check refuses a multicast plan" "$TOOL" check "$OPS/switch_broadcast_test.json" &&
    grep_in "$TMP/out" "switch_broadcast_test.json" "refusal names the file"
expect 2 "check bad option" "$TOOL" check --bogus "$OPS/put_test.json" && grep_in "$TMP/err" "\-\-bogus" "bad option named"
# a plan whose ranks reduce in different orders: refused with the loader's message, accepted with the opt-out
NODES4=$REF/mscclpp-4node-plans/allreduce_multi_nodes_4x2.json
expect 1 "check refuses ranks reducing in different orders" "$TOOL" check "$NODES4" && {
    grep_in "$TMP/out" "^FAIL plan bug: .*allreduce_multi_nodes_4x2.json:1:[0-9]*: gpus\[4\].threadblocks\[1\].ops\[3\]: expected every rank to reduce each output element in the same order, got another order on rank 4 than on rank 0 for its output chunk 0" "refusal names file, op, rank and chunk"
    grep_in "$TMP/out" '"ranks_may_differ": true' "refusal names the opt-out field"
}
sed '1s/^{/{"ranks_may_differ":true,/' "$NODES4" >"$TMP/may-differ.json"
expect 0 "check accepts the opt-out" "$TOOL" check "$TMP/may-differ.json"
expect 0 "fuse keeps the opt-out" "$TOOL" fuse "$TMP/may-differ.json" -o "$TMP/may-differ-fused.json" &&
    grep_in "$TMP/may-differ-fused.json" '"ranks_may_differ": *true' "fused plan carries the opt-out"
expect 0 "check the fused opt-out plan" "$TOOL" check "$TMP/may-differ-fused.json"

# show
expect 0 "show" "$TOOL" show "$ALGO/allreduce_pkt_n4.json" && grep_in "$TMP/out" "fusible:" "show reports what fusion would remove"
expect 0 "show --size" "$TOOL" show "$ALGO/allreduce_pkt_n4.json" --size 64K
expect 2 "show bad --size" "$TOOL" show "$ALGO/allreduce_pkt_n4.json" --size abc && grep_in "$TMP/err" "\-\-size" "bad --size named"
expect 2 "show broken file" "$TOOL" show "$TMP/broken.json" && grep_in "$TMP/err" "broken.json" "show names the broken file"

# fuse
expect 0 "fuse -o" "$TOOL" fuse "$ALGO/allreduce_pkt_n8.json" -o "$TMP/fused.json" && grep_in "$TMP/err" "ops ->" "fuse prints stats"
expect 0 "check the fused plan" "$TOOL" check "$TMP/fused.json"
expect 0 "fuse to stdout" "$TOOL" fuse "$TMP/fused.json" && {
    grep_in "$TMP/out" '"name"' "fuse writes JSON to stdout"
    grep_in "$TMP/err" "(0 removed)" "fusing a fused plan removes nothing"
}
expect 0 "fuse a packet test plan" "$TOOL" fuse "$OPS/reduce_packets_test.json" -o "$TMP/rp.json"
expect 2 "fuse broken file" "$TOOL" fuse "$TMP/broken.json" && grep_in "$TMP/err" "broken.json" "fuse names the broken file"
expect 2 "fuse -o without value" "$TOOL" fuse "$ALGO/allreduce_pkt_n2.json" -o && grep_in "$TMP/err" "\-o" "missing -o value named"

# a plan that fusion shrinks: repkt + cpkt -> recpkt on both ranks
gpu() {
    cat <<GPU
{"id": $1, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 4,
 "threadblocks": [{"id": 0, "ops": [
   {"name": "ppkt", "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}], "channel_type": "memory"},
   {"name": "repkt", "src_buff": [{"type": "i", "index": 0, "size": 1}, {"type": "s", "index": 0, "size": 1}], "dst_buff": [{"type": "i", "index": 0, "size": 1}], "reduce_op": "sum"},
   {"name": "cpkt", "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"type": "s", "index": 2, "size": 1}]},
   {"name": "upkt", "src_buff": [{"type": "s", "index": 2, "size": 1}], "dst_buff": [{"type": "o", "index": 0, "size": 1}]}],
  "channels": [{"channel_type": "memory", "channel_ids": [0]}],
  "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}]}],
 "channels": [{"channel_type": "memory", "connected_to": [$2]}],
 "remote_buffers": [{"rank": $2, "type": "s", "access_channel_types": ["memory"]}], "semaphores": []}
GPU
}
{
    echo '{"name": "shrink", "collective": "test", "protocol": "LL", "inplace": false, "gpus": ['
    gpu 0 1
    echo ','
    gpu 1 0
    echo '], "use_double_scratch_buffer": true, "min_message_size": 0, "max_message_size": 65536}'
} >"$TMP/shrink.json"
expect 0 "check the shrinkable plan" "$TOOL" check "$TMP/shrink.json"
expect 0 "fuse removes ops" "$TOOL" fuse "$TMP/shrink.json" -o "$TMP/shrunk.json" &&
    grep_in "$TMP/err" "8 ops -> 6 ops (2 removed), repkt+cpkt 2" "fuse stats name the rule"
grep_in "$TMP/shrunk.json" '"recpkt"' "fused file holds recpkt"
expect 0 "show a fused plan" "$TOOL" show "$TMP/shrunk.json" && grep_in "$TMP/out" "2 removed" "show reports the removed ops"
expect 0 "sim original and fused" "$TOOL" sim "$TMP/shrink.json" --packet all --iters 3 &&
    expect 0 "sim fused" "$TOOL" sim "$TMP/shrunk.json" --packet all --iters 3

# sim
expect 0 "sim both packets" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --size 4K --packet all &&
    grep_in "$TMP/out" "^2 passed, 0 failed" "sim summary line"
grep_in "$TMP/out" "^PASS .* size=4096 dtype=fp32 op=sum packet=ll8 iters=2 " "sim case line format"
expect 0 "sim default sizes" "$TOOL" sim "$ALGO/allreduce_pkt_n4.json"
expect 0 "sim fused plan" "$TOOL" sim "$TMP/fused.json" --size 1K --size 3000 --iters 3
expect 0 "sim all dtypes and ops" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --size 1K --dtype all --op all &&
    grep_in "$TMP/out" "dtype=bf16 op=max" "sim all covers bf16 max"
expect 0 "sim a test plan" "$TOOL" sim "$OPS/reduce_copy_send_packet_test.json" --size 1K --packet ll8
expect 2 "sim bad --packet" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --packet ll32 && grep_in "$TMP/err" "\-\-packet" "bad --packet named"
expect 2 "sim bad --iters" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --iters x && grep_in "$TMP/err" "\-\-iters" "bad --iters named"
expect 2 "sim bad --dtype" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --dtype fp7 && grep_in "$TMP/err" "\-\-dtype" "bad --dtype named"
expect 2 "sim missing --size value" "$TOOL" sim "$ALGO/allreduce_pkt_n2.json" --size && grep_in "$TMP/err" "\-\-size" "missing value named"
expect 1 "sim broken file" "$TOOL" sim "$TMP/broken.json" && grep_in "$TMP/out" "broken.json" "sim names the broken file"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
