#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Regenerate the broken-plan corpus: python3 generate.py (in this directory).

Each case is a valid 2-rank base plan with one mutation. For case X it writes
X.json (pretty-printed) and X.expect: line 1 is a substring the loader's
message must contain (JSON path and reason), line 2 (optional) the
"line:col" the message must carry, computed here independently of the C
locator from the position of the deepest existing node on the error path.
"""
import copy
import json
import re


def local(t, i, s=1):
    return {"type": t, "index": i, "size": s}


def remote(b, i, s=1):
    return {"buffer_id": b, "index": i, "size": s}


def gpu(r):
    o = 1 - r
    return {
        "id": r, "input_chunks": 4, "output_chunks": 4, "scratch_chunks": 4,
        "threadblocks": [
            {"id": 0, "ops": [
                {"name": "nop"},
                {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
                {"name": "wait", "channel_ids": [0], "channel_type": "memory"},
                {"name": "put", "src_buff": [local("i", 0)], "dst_buff": [remote(1, 1)], "channel_type": "memory"},
                {"name": "ppkt", "src_buff": [local("i", 0)], "dst_buff": [remote(0, 0)], "channel_type": "memory"},
                {"name": "pws", "src_buff": [local("s", 1)], "dst_buff": [remote(0, 2)], "channel_ids": [0],
                 "channel_type": "port"},
                {"name": "wait", "channel_ids": [0], "channel_type": "port"},
                {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2},
                {"name": "sem_release", "semaphore_ids": [0]},
             ],
             "channels": [{"channel_type": "memory", "channel_ids": [0]},
                          {"channel_type": "port", "channel_ids": [0]}],
             "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0, 1]},
                                    {"access_channel_type": "port", "remote_buffer_ids": [0]}]},
            {"id": 1, "ops": [
                {"name": "upkt", "src_buff": [local("s", 0)], "dst_buff": [local("o", 0)]},
                {"name": "repkt", "src_buff": [local("i", 2), local("s", 0)], "dst_buff": [local("i", 2)],
                 "reduce_op": "sum"},
                {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2},
                {"name": "sem_acquire", "semaphore_ids": [0]},
                {"name": "pipeline", "iter_context": {"unit_size": 1024, "num_chunks": 1},
                 "ops": [{"name": "copy", "src_buff": [local("i", 3)], "dst_buff": [local("o", 3)]}]},
             ],
             "channels": [], "remote_buffer_refs": []},
        ],
        "channels": [{"channel_type": "memory", "connected_to": [o]},
                     {"channel_type": "port", "connected_to": [o]}],
        "remote_buffers": [{"rank": o, "type": "s", "access_channel_types": ["memory", "port"]},
                           {"rank": o, "type": "i", "access_channel_types": ["memory"]}],
        "semaphores": [{"init_value": 0}],
    }


BASE = {
    "name": "bad_base", "collective": "allreduce", "protocol": "LL", "inplace": False,
    "reuse_resources": False, "gpus": [gpu(0), gpu(1)], "num_threads_per_block": 1024,
    "use_double_scratch_buffer": True, "buffer_alignment": 16, "min_message_size": 0,
    "max_message_size": 1048576,
}


def dump(v, path, pos, out, indent):
    """Pretty-print like json.dumps(indent=2) and record the (line, col) of every value by path."""
    text = "".join(out)
    line = text.count("\n") + 1
    col = len(text) - (text.rfind("\n") + 1) + 1
    pos[path] = (line, col)
    pad = "  " * (indent + 1)
    if isinstance(v, dict):
        if not v:
            out.append("{}")
            return
        out.append("{\n")
        for k, (key, val) in enumerate(v.items()):
            out.append(pad + json.dumps(key) + ": ")
            dump(val, (path + "." if path else "") + key, pos, out, indent + 1)
            out.append(",\n" if k + 1 < len(v) else "\n")
        out.append("  " * indent + "}")
    elif isinstance(v, list):
        if not v:
            out.append("[]")
            return
        out.append("[\n")
        for k, val in enumerate(v):
            out.append(pad)
            dump(val, "%s[%d]" % (path, k), pos, out, indent + 1)
            out.append(",\n" if k + 1 < len(v) else "\n")
        out.append("  " * indent + "]")
    else:
        out.append(json.dumps(v))


def locate(pos, path):
    while path not in pos:
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return pos[path]


def op(p, r, t, i):
    return p["gpus"][r]["threadblocks"][t]["ops"][i]


CASES = []


def case(name, path, expect):
    def deco(fn):
        CASES.append((name, path, expect, fn))
        return fn
    return deco


T0 = "gpus[0].threadblocks[0]"
T1 = "gpus[0].threadblocks[1]"


@case("missing-name", "name", "name: expected a string, got nothing")
def _(p): del p["name"]


@case("name-not-string", "name", "name: expected a string, got 42")
def _(p): p["name"] = 42


@case("missing-gpus", "gpus", "gpus: expected an array, got nothing")
def _(p): del p["gpus"]


@case("empty-gpus", "gpus", "gpus: expected 1 to 1024 ranks, got an array of 0")
def _(p): p["gpus"] = []


@case("gpu-id-mismatch", "gpus[1].id", "gpus[1].id: expected the rank's position in gpus, 1, got 0")
def _(p): p["gpus"][1]["id"] = 0


@case("missing-scratch-chunks", "gpus[0].scratch_chunks",
      "gpus[0].scratch_chunks: expected an unsigned integer, got nothing")
def _(p): del p["gpus"][0]["scratch_chunks"]


@case("negative-chunks", "gpus[1].input_chunks", "gpus[1].input_chunks: expected an unsigned integer, got -1")
def _(p): p["gpus"][1]["input_chunks"] = -1


@case("fractional-index", T0 + ".ops[3].src_buff[0].index",
      T0 + ".ops[3].src_buff[0].index: expected an unsigned integer, got 1.5")
def _(p): op(p, 0, 0, 3)["src_buff"][0]["index"] = 1.5


@case("index-out-of-range", T0 + ".ops[3].src_buff[0].index",
      T0 + ".ops[3].src_buff[0].index: expected a chunk index below 4 (rank 0 input), got 7")
def _(p): op(p, 0, 0, 3)["src_buff"][0]["index"] = 7


@case("size-past-end", T0 + ".ops[3].src_buff[0].size",
      T0 + ".ops[3].src_buff[0].size: expected at most 2 chunks from index 2")
def _(p):
    op(p, 0, 0, 3)["src_buff"][0].update(index=2, size=3)
    op(p, 0, 0, 3)["dst_buff"][0].update(index=0, size=3)


@case("size-zero", T0 + ".ops[3].src_buff[0].size", T0 + ".ops[3].src_buff[0].size: expected at least 1 chunk, got 0")
def _(p): op(p, 0, 0, 3)["src_buff"][0]["size"] = 0


@case("unequal-sizes", T0 + ".ops[3].dst_buff[0].size",
      T0 + ".ops[3].dst_buff[0].size: expected 1 chunks, the size of the op's first operand, got 2")
def _(p): op(p, 0, 0, 3)["dst_buff"][0]["size"] = 2


@case("remote-index-out-of-range", "gpus[1].threadblocks[0].ops[3].dst_buff[0].index",
      "gpus[1].threadblocks[0].ops[3].dst_buff[0].index: expected a chunk index below 3 (rank 0 input), got 3")
def _(p):
    p["gpus"][0]["input_chunks"] = 3
    p["gpus"][0]["output_chunks"] = 3
    op(p, 0, 1, 4)["ops"][0]["src_buff"][0]["index"] = 2
    op(p, 0, 1, 4)["ops"][0]["dst_buff"][0]["index"] = 2
    op(p, 1, 0, 3)["dst_buff"][0]["index"] = 3


@case("op-channel-out-of-table", T0 + ".ops[1].channel_ids[0]",
      T0 + ".ops[1].channel_ids[0]: expected a channel index below 1 (the thread block's memory table), got 3")
def _(p): op(p, 0, 0, 1)["channel_ids"] = [3]


@case("tb-channel-out-of-range", T0 + ".channels[0].channel_ids[0]",
      T0 + ".channels[0].channel_ids[0]: expected a memory channel index below 1, got 5")
def _(p): p["gpus"][0]["threadblocks"][0]["channels"][0]["channel_ids"] = [5]


@case("buffer-id-out-of-range", T0 + ".ops[3].dst_buff[0].buffer_id",
      T0 + ".ops[3].dst_buff[0].buffer_id: expected a remote buffer index below 2 (the thread block's memory table), got 5")
def _(p): op(p, 0, 0, 3)["dst_buff"][0]["buffer_id"] = 5


@case("tb-rbuf-out-of-range", T0 + ".remote_buffer_refs[0].remote_buffer_ids[1]",
      T0 + ".remote_buffer_refs[0].remote_buffer_ids[1]: expected a memory remote buffer index below 2, got 2")
def _(p): p["gpus"][0]["threadblocks"][0]["remote_buffer_refs"][0]["remote_buffer_ids"] = [0, 2]


@case("remote-buffer-self", "gpus[0].remote_buffers[0].rank",
      "gpus[0].remote_buffers[0].rank: expected another rank below 2, got 0")
def _(p): p["gpus"][0]["remote_buffers"][0]["rank"] = 0


@case("remote-buffer-rank-range", "gpus[1].remote_buffers[1].rank",
      "gpus[1].remote_buffers[1].rank: expected another rank below 2, got 9")
def _(p): p["gpus"][1]["remote_buffers"][1]["rank"] = 9


@case("access-type-mismatch", T0 + ".ops[3].dst_buff[0].buffer_id",
      T0 + ".ops[3].dst_buff[0].buffer_id: expected a remote buffer that allows memory access, got remote buffer 1")
def _(p): p["gpus"][0]["remote_buffers"][1]["access_channel_types"] = ["port"]


@case("peer-out-of-range", "gpus[0].channels[0].connected_to[0]",
      "gpus[0].channels[0].connected_to[0]: expected a peer rank below 2 other than this rank (0), got 5")
def _(p): p["gpus"][0]["channels"][0]["connected_to"] = [5]


@case("barrier-id-range", T0 + ".ops[7].barrier_id", T0 + ".ops[7].barrier_id: expected a barrier id below 16, got 16")
def _(p):
    op(p, 0, 0, 7)["barrier_id"] = 16
    op(p, 0, 1, 2)["barrier_id"] = 16


@case("barrier-ntb-range", T0 + ".ops[7].num_threadblocks",
      T0 + ".ops[7].num_threadblocks: expected 1 to 2 thread blocks (the rank's grid), got 3")
def _(p):
    op(p, 0, 0, 7)["num_threadblocks"] = 3
    op(p, 0, 1, 2)["num_threadblocks"] = 3


@case("barrier-count-mismatch", T1 + ".ops[2].num_threadblocks",
      T1 + ".ops[2].num_threadblocks: expected 1 (the blocks that use barrier 0), got 2")
def _(p): op(p, 0, 0, 7)["barrier_id"] = 1


@case("barrier-uses-differ", T1 + ".ops[2].barrier_id",
      T1 + ".ops[2].barrier_id: expected barrier 0 1 times per block as in thread block 0, got 2 times")
def _(p): p["gpus"][0]["threadblocks"][1]["ops"].insert(2, {"name": "barrier", "barrier_id": 0,
                                                             "num_threadblocks": 2})


@case("semaphore-id-range", T0 + ".ops[8].semaphore_ids[0]",
      T0 + ".ops[8].semaphore_ids[0]: expected a semaphore index below 1, got 3")
def _(p): op(p, 0, 0, 8)["semaphore_ids"] = [3]


@case("semaphore-unbalanced", "gpus[1].semaphores[0]",
      "gpus[1].semaphores[0]: expected as many sem_release as sem_acquire per launch (0 acquires), got 2 releases")
def _(p): op(p, 1, 1, 3)["name"] = "sem_release"


@case("unmatched-signal", T0 + ".ops[1].channel_ids",
      T0 + ".ops[1].channel_ids: expected as many waits on rank 1 memory channel 0 as signals on its pair, "
      "rank 0 memory channel 0 (1 per launch), got 0 waits")
def _(p): p["gpus"][1]["threadblocks"][0]["ops"][2] = {"name": "nop"}


@case("unmatched-port-signal", T0 + ".ops[5].channel_ids",
      T0 + ".ops[5].channel_ids: expected as many waits on rank 1 port channel 0 as signals on its pair, "
      "rank 0 port channel 0 (1 per launch), got 0 waits")
def _(p): p["gpus"][1]["threadblocks"][0]["ops"][6] = {"name": "nop"}


@case("too-many-operands", T0 + ".ops[3].src_buff", T0 + ".ops[3].src_buff: expected at most 10 operands, got an array of 11")
def _(p): op(p, 0, 0, 3)["src_buff"] = [local("i", 0)] * 11


@case("too-many-channels", T0 + ".ops[1].channel_ids",
      T0 + ".ops[1].channel_ids: expected at most 8 channels per op, got an array of 9")
def _(p): op(p, 0, 0, 1)["channel_ids"] = [0] * 9


@case("bad-opcode", T0 + ".ops[0].name", T0 + ".ops[0].name: expected an operation name")
def _(p): op(p, 0, 0, 0)["name"] = "frobnicate"


@case("nested-pipeline", T1 + ".ops[4].ops[0].name",
      T1 + ".ops[4].ops[0].name: expected an operation other than pipeline (pipelines do not nest)")
def _(p): op(p, 0, 1, 4)["ops"][0] = {"name": "pipeline", "iter_context": {"unit_size": 1, "num_chunks": 1}, "ops": []}


@case("pipeline-no-context", T1 + ".ops[4].iter_context",
      T1 + ".ops[4].iter_context: expected an object {unit_size, num_chunks}, got nothing")
def _(p): del op(p, 0, 1, 4)["iter_context"]


@case("bad-version", "version", "version: expected plan format version 1, got 2")
def _(p): p["version"] = 2


@case("bad-ext-version", "mscx.version", "mscx.version: expected mscx extension version 1, got 7")
def _(p): p["mscx"] = {"version": 7}


@case("ext-ranks-per-node", "mscx.ranks_per_node",
      "mscx.ranks_per_node: expected a divisor of the 2 ranks, got 3")
def _(p): p["mscx"] = {"version": 1, "ranks_per_node": 3}


@case("ext-root-not-broadcast", "mscx.root",
      "mscx.root: expected no root (only broadcast plans have one; this plan is allreduce), got 1")
def _(p): p["mscx"] = {"version": 1, "root": 1}


@case("ext-root-range", "mscx.root", "mscx.root: expected a rank below the 2 ranks, got 2")
def _(p):
    p["collective"] = "broadcast"
    p["mscx"] = {"version": 1, "root": 2}


@case("ext-root-type", "mscx.root", "mscx.root: expected an unsigned integer, got -1")
def _(p):
    p["collective"] = "broadcast"
    p["mscx"] = {"version": 1, "root": -1}


@case("ext-bad-dtype", "mscx.dtypes[1]", "mscx.dtypes[1]: expected a datatype name")
def _(p): p["mscx"] = {"version": 1, "dtypes": ["fp32", "fp7"]}


@case("upkt-source-not-scratch", T1 + ".ops[0].src_buff[0].type",
      T1 + ".ops[0].src_buff[0].type: expected local scratch (upkt packets live in scratch), got local input")
def _(p): op(p, 0, 1, 0)["src_buff"][0]["type"] = "i"


@case("repkt-source-not-scratch", T1 + ".ops[1].src_buff[1].type",
      T1 + ".ops[1].src_buff[1].type: expected local scratch (repkt packets live in scratch), got local output")
def _(p): op(p, 0, 1, 1)["src_buff"][1]["type"] = "o"


@case("ppkt-dest-not-scratch", T0 + ".ops[4].dst_buff[0].buffer_id",
      T0 + ".ops[4].dst_buff[0].buffer_id: expected remote scratch (ppkt packets live in scratch), got remote input")
def _(p): op(p, 0, 0, 4)["dst_buff"][0]["buffer_id"] = 1


@case("port-ppkt-source-not-scratch", T0 + ".ops[5].src_buff[0].type",
      T0 + ".ops[5].src_buff[0].type: expected local scratch (ppkt packets live in scratch), got local input")
def _(p):
    op(p, 0, 0, 5)["name"] = "ppkt"
    op(p, 0, 0, 5)["src_buff"][0]["type"] = "i"
    p["gpus"][1]["threadblocks"][0]["ops"][6] = {"name": "nop"}


@case("rlxsignal-on-port", T0 + ".ops[1].channel_type",
      T0 + ".ops[1].channel_type: expected a channel type that rlxsignal supports (memory ), got port")
def _(p): op(p, 0, 0, 1).update(name="rlxsignal", channel_type="port")


@case("flush-on-memory", T0 + ".ops[0].channel_type",
      T0 + ".ops[0].channel_type: expected a channel type that flush supports (port), got memory")
def _(p): op(p, 0, 0, 0).update(name="flush", channel_type="memory", channel_ids=[0])


@case("signal-without-channel", T0 + ".ops[0].channel_ids",
      T0 + ".ops[0].channel_ids: expected at least one channel for signal, got none")
def _(p): op(p, 0, 0, 0).update(name="signal", channel_type="memory")


@case("rppkt-two-sources", T0 + ".ops[4].src_buff",
      T0 + ".ops[4].src_buff: expected 1 to 1 source operands for rppkt, got 2")
def _(p): op(p, 0, 0, 4).update(name="rppkt", src_buff=[local("s", 0), local("s", 1)])


@case("recpkt-one-dest", T1 + ".ops[1].dst_buff",
      T1 + ".ops[1].dst_buff: expected 2 to 2 destination operands for recpkt, got 1")
def _(p): op(p, 0, 1, 1)["name"] = "recpkt"


@case("put-unpaired-operands", T0 + ".ops[3].dst_buff",
      T0 + ".ops[3].dst_buff: expected one destination per source (2) for put, got 1")
def _(p): op(p, 0, 0, 3)["src_buff"] = [local("i", 0), local("i", 1)]


@case("remote-without-channel-type", T0 + ".ops[3].dst_buff[0].buffer_id",
      T0 + ".ops[3].dst_buff[0].buffer_id: expected no remote operand on an op whose channel_type is not memory or port")
def _(p): del op(p, 0, 0, 3)["channel_type"]


@case("bad-alignment", "buffer_alignment", "buffer_alignment: expected a power of two, got 24")
def _(p): p["buffer_alignment"] = 24


@case("min-above-max", "min_message_size", "min_message_size: expected at most max_message_size (1048576), got 2097152")
def _(p): p["min_message_size"] = 2097152


@case("too-many-threads", "num_threads_per_block", "num_threads_per_block: expected 1 to 1024 threads, got 2048")
def _(p): p["num_threads_per_block"] = 2048


@case("tbg-slice-range", T0 + ".ops[3].tbg_info.tb_id",
      T0 + ".ops[3].tbg_info.tb_id: expected a slice id below the group size 2, got 2")
def _(p): op(p, 0, 0, 3)["tbg_info"] = {"tb_id": 2, "tbg_size": 2}


@case("bad-buffer-type", T0 + ".ops[3].src_buff[0].type",
      T0 + ".ops[3].src_buff[0].type: expected a buffer type (\"i\", \"o\" or \"s\"), got \"x\"")
def _(p): op(p, 0, 0, 3)["src_buff"][0]["type"] = "x"


@case("bad-channel-type", "gpus[1].channels[0].channel_type",
      "gpus[1].channels[0].channel_type: expected a channel type (memory, port, switch), got \"carrier-pigeon\"")
def _(p): p["gpus"][1]["channels"][0]["channel_type"] = "carrier-pigeon"


@case("bool-wrong-type", "inplace", "inplace: expected true or false, got \"yes\"")
def _(p): p["inplace"] = "yes"


@case("unknown-collective", "collective",
      "collective: expected a collective (allreduce, allgather, reducescatter, alltoall, broadcast, "
      "sendrecv or test), got \"allsmash\"")
def _(p): p["collective"] = "allsmash"


@case("peer-write-unordered", "gpus[0].threadblocks[0].ops[8].dst_buff[0]",
      "gpus[0].threadblocks[0].ops[8].dst_buff[0]: expected the write of rank 1's input chunk 1 by put "
      "(rank 0 thread block 0) to be ordered before the end of rank 1's launch")
def _(p):
    ops = p["gpus"][0]["threadblocks"][0]["ops"]
    ops.append(ops.pop(3))


@case("peer-write-tbg-slice", "gpus[0].threadblocks[1].ops[0].dst_buff[0]",
      "gpus[0].threadblocks[1].ops[0].dst_buff[0]: expected the write of rank 1's input chunk 1 by put "
      "(rank 0 thread block 1) to be ordered before the end of rank 1's launch")
def _(p):
    tbs = p["gpus"][0]["threadblocks"]
    put = tbs[0]["ops"][3]
    put["tbg_info"] = {"tb_id": 0, "tbg_size": 2}
    tbs[1]["ops"].insert(0, dict(copy.deepcopy(put), tbg_info={"tb_id": 1, "tbg_size": 2}))
    tbs[1]["remote_buffer_refs"] = [{"access_channel_type": "memory", "remote_buffer_ids": [0, 1]}]


@case("bad-protocol", "protocol", "protocol: expected a protocol (\"Simple\" or \"LL\"), got \"LL128\"")
def _(p): p["protocol"] = "LL128"


@case("bad-reduce-op", T1 + ".ops[1].reduce_op",
      T1 + ".ops[1].reduce_op: expected a reduction (sum, prod, min, max), got \"avg\"")
def _(p): op(p, 0, 1, 1)["reduce_op"] = "avg"


@case("tb-id-mismatch", T1 + ".id", T1 + ".id: expected the block's position in threadblocks, 1, got 3")
def _(p): p["gpus"][0]["threadblocks"][1]["id"] = 3


@case("too-many-ops", T1 + ".ops[1023]",
      T1 + ".ops[1023]: expected at most 1024 ops per thread block, pipeline bodies included")
def _(p): p["gpus"][0]["threadblocks"][1]["ops"] += [{"name": "nop"}] * 1030


@case("op-not-object", T1 + ".ops[1]", T1 + ".ops[1]: expected an object, got \"nop\"")
def _(p): p["gpus"][0]["threadblocks"][1]["ops"][1] = "nop"


@case("top-not-object", "", "expected a plan object, got an array of 1")
def _(p):
    p.clear()
    p["__list__"] = True


@case("semaphore-init-type", "gpus[0].semaphores[0].init_value",
      "gpus[0].semaphores[0].init_value: expected a 32-bit integer, got 4294967296")
def _(p): p["gpus"][0]["semaphores"][0]["init_value"] = 4294967296


def main():
    for name, path, expect, fn in CASES:
        p = copy.deepcopy(BASE)
        fn(p)
        if p.get("__list__"):
            p = [1]
        pos, out = {}, []
        dump(p, "", pos, out, 0)
        with open(name + ".json", "w") as f:
            f.write("".join(out) + "\n")
        line, col = locate(pos, path)
        with open(name + ".expect", "w") as f:
            f.write(expect + "\n%d:%d\n" % (line, col))
    # Syntax errors: jansson reports the position; only the reason is fixed here.
    text = json.dumps(BASE, indent=2)
    raw = {
        "truncated": (text[: len(text) // 2], "expected valid JSON"),
        "trailing-comma": (text.replace('"nop"\n', '"nop",\n', 1), "expected valid JSON"),
        "duplicate-key": (text.replace('"name": "bad_base",', '"name": "bad_base", "name": "again",', 1),
                          "duplicate object key"),
        "empty": ("", "expected valid JSON"),
        "not-json": ("mscx plan v1\n", "expected valid JSON"),
    }
    for name, (body, expect) in raw.items():
        with open(name + ".json", "w") as f:
            f.write(body)
        with open(name + ".expect", "w") as f:
            f.write(expect + "\n")
    print(len(CASES) + len(raw), "cases")


if __name__ == "__main__":
    main()
