#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Time torch.distributed.all_reduce (fp32 sum, in place) per size, eagerly
and under a CUDA graph, one process per GPU: the user's own experiment, run
once with stock NCCL and once with the shim preloaded.

  torchrun --standalone --nproc-per-node N tests/multigpu/torch_ar_time.py [--out FILE.json]

Eager: median over 5 rounds of 200 back-to-back calls (CUDA events).
Graph: 20 calls captured in one graph, replayed 50 times, median of 5 rounds.
Rank 0 prints one line per size, "bytes eager_us graph_us", and checks that
the last result equals N * (the input) on every rank (exact: small integers).
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist


def timed(fn, reps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    rows = []
    bad = 0
    for s in args.sizes.split(","):
        nbytes = int(s[:-1]) * (1024 if s[-1] == "K" else 1024 * 1024) if s[-1] in "KM" else int(s)
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1), device="cuda")
        for _ in range(20):  # warm up, eagerly, at this size
            dist.all_reduce(x)
        torch.cuda.synchronize()
        eager = statistics.median(timed(lambda: dist.all_reduce(x), 200) for _ in range(5))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(g, stream=stream):
                for _ in range(20):
                    dist.all_reduce(x)
        torch.cuda.synchronize()
        graph = statistics.median(timed(g.replay, 50) / 20.0 for _ in range(5))
        # exactness: every element is the same small integer on every rank
        y = torch.full((n,), float(rank + 1), device="cuda")
        dist.all_reduce(y)
        want = float(world * (world + 1) // 2)
        if not torch.equal(y, torch.full_like(y, want)):
            bad += 1
            print("rank %d: %d bytes: wrong result" % (rank, nbytes), file=sys.stderr)
        rows.append({"bytes": nbytes, "eager_us": eager, "graph_us": graph})
        del g
    if rank == 0:
        for r in rows:
            print("%9d %9.2f %9.2f" % (r["bytes"], r["eager_us"], r["graph_us"]))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world": world, "rows": rows}, f)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
