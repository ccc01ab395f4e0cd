#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Count the shape of a packet plan at one message size, from its JSON alone:
per rank and thread block, each op's kind, payload bytes, destinations, the
wave count (ceil(lines / threads per block), LL16: 8 payload bytes a line;
a multi-pair ppkt or a multi-chunk op counts each pair or operand on its
own) and which (rank, block) pairs write the scratch lines the op polls.
  tools/bench/plan-shape.py PLAN.json BYTES [RANKS_SHOWN]     (default 1 rank)
Chunks are BYTES / input_chunks (whole chunks: pass a size they divide);
tbg_info slices split a range in 16-byte units, the first ones one unit
larger, as the loader does."""
import collections
import json
import math
import sys

PAYLOAD = 8  # LL16


def rbuf_tables(tb):
    return {ref["access_channel_type"]: ref["remote_buffer_ids"] for ref in tb.get("remote_buffer_refs", [])}


def owner(gpu, tb, op, o):
    """(rank, buffer type) an operand names."""
    if "type" in o:
        return gpu["id"], o["type"]
    rb = gpu["remote_buffers"][rbuf_tables(tb)[op.get("channel_type", "memory")][o["buffer_id"]]]
    return rb["rank"], rb["type"]


def nbytes(chunk, o, tbg):
    b = chunk * o["size"]
    if tbg:
        units, n, i = b // 16, tbg["tbg_size"], tbg["tb_id"]
        return 16 * (units // n + (1 if i < units % n else 0))
    return b


def waves(b, threads):
    return math.ceil(b / PAYLOAD / threads)


REDUCES = ("repkt", "respkt", "recpkt", "recspkt")
POLLS = REDUCES + ("upkt", "rppkt")
PACKET_WRITERS = ("ppkt", "cpkt", "rppkt") + REDUCES


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    plan = json.load(open(sys.argv[1]))
    msg = int(sys.argv[2])
    shown = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    threads = plan.get("num_threads_per_block", 1024)
    gpus = plan["gpus"]
    print(f"{plan['name']}: {len(gpus)} ranks, {len(gpus[0]['threadblocks'])} blocks/rank x {threads} threads, "
          f"{msg} bytes")
    # who writes each scratch chunk (packet lines) of each rank
    writers = collections.defaultdict(set)
    for g in gpus:
        for tb in g["threadblocks"]:
            for op in tb["ops"]:
                if op["name"] not in PACKET_WRITERS:
                    continue
                dst = op.get("dst_buff", [])
                if op["name"] in REDUCES:
                    dst = dst[1:]  # dst[0] is the raw result
                for o in dst:
                    r, t = owner(g, tb, op, o)
                    if t == "s":
                        for i in range(o["index"], o["index"] + o["size"]):
                            writers[(r, i)].add((g["id"], tb["id"]))
    for g in gpus[:shown]:
        chunk = msg // g["input_chunks"]
        print(f"rank {g['id']}: input_chunks {g['input_chunks']}, scratch_chunks {g['scratch_chunks']}, "
              f"chunk {chunk} B")
        total = collections.Counter()
        for tb in g["threadblocks"]:
            parts, nwaves = [], 0
            for op in tb["ops"]:
                name, tbg = op["name"], op.get("tbg_info")
                src, dst = op.get("src_buff", []), op.get("dst_buff", [])
                if name in REDUCES:
                    b = nbytes(chunk, src[0], tbg)
                    w = waves(b, threads)
                    desc = f"{name} {b} B, {len(src) - 1} packet sources, {len(dst) - 1} packet destinations"
                    polled = src[1:]
                elif name in ("ppkt", "upkt", "cpkt", "rppkt"):
                    sizes = [nbytes(chunk, o, tbg) for o in src]
                    b, w = sum(sizes), sum(waves(x, threads) for x in sizes)
                    desc = f"{name} {b} B" + (f", {len(dst)} destinations" if name == "ppkt" else "")
                    polled = src if name in ("upkt", "rppkt") else []
                else:
                    b, w, desc, polled = 0, 0, name, []
                total[name] += b
                nwaves += w
                who = set()
                for o in polled:
                    for i in range(o["index"], o["index"] + o["size"]):
                        who |= writers[(g["id"], i)]
                if who:
                    ranks = sorted({r for r, _ in who})
                    blocks = sorted({x for _, x in who})
                    desc += f", polls lines of ranks {ranks} blocks {blocks}"
                if tbg:
                    desc += f", slice {tbg['tb_id']}/{tbg['tbg_size']}"
                parts.append(f"{desc}, {w} waves")
            print(f"  block {tb['id']} ({nwaves} waves): " + "; ".join(parts))
        print("  payload bytes by op: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))


if __name__ == "__main__":
    main()
