#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch collectives on one GPU (world size 1, backend nccl), every result
dumped raw to OUTFILE so that a run on stock NCCL and one with the mscx shim
preloaded can be compared bit for bit (tests/gpu/nccl_compare.py).

  torch_collectives.py OUTFILE

Exits 77 without torch or without a GPU.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from one_rank import OneRank  # noqa: E402


def main(outfile):
    w = OneRank()
    if w.skipped:
        return 77
    torch, dist, dev, dump, data = w.torch, w.dist, w.dev, w.dump, w.data

    sizes = [1, 7, 255, 257, 513, 4099, 65537, 262147, (1 << 20) + 3]
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int32]
    ops = [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
           ("avg", dist.ReduceOp.AVG)]
    premul = hasattr(dist, "_make_nccl_premul_sum")
    seed = 1
    for n in sizes:
        for dt in dtypes:
            for name, op in ops:
                if name == "avg" and not dt.is_floating_point:
                    continue  # NCCL has no integer average
                seed += 1
                t = data(n, dt, seed)
                dist.all_reduce(t, op=op)
                dump("all_reduce %s %s %d" % (name, dt, n), t)
            if premul and dt.is_floating_point:
                seed += 1
                t = data(n, dt, seed)
                # The scalar NCCL's API receives: PyTorch passes a float for bfloat16 too, whose first two
                # bytes (0.5 is 0x3f000000) read as the bfloat16 0. The products are exact: the inputs are
                # multiples of 1/8 below 1000 in magnitude.
                scalar = 0.0 if dt == torch.bfloat16 else 0.5
                want = t * scalar
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
                bad = (t != want).nonzero().flatten().tolist()
                if bad:
                    print("premul_sum %s %d: %d elements are not input * %g, the first at %d"
                          % (dt, n, len(bad), scalar, bad[0]))
                dump("all_reduce premul_sum %s %d" % (dt, n), t)
                dump("expect all_reduce premul_sum %s %d" % (dt, n), want)
            seed += 1
            x = data(n, dt, seed)
            out = torch.full((n,), 7, dtype=dt, device=dev)
            dist.all_gather_into_tensor(out, x)
            dump("all_gather_into_tensor %s %d" % (dt, n), out)
            seed += 1
            x = data(n, dt, seed)
            out = torch.full((n,), 7, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(out, x)
            dump("reduce_scatter_tensor %s %d" % (dt, n), out)
            seed += 1
            x = data(n, dt, seed)
            dist.broadcast(x, src=0)
            dump("broadcast %s %d" % (dt, n), x)
    dist.barrier()
    sub = dist.new_group([0])
    x = data(4099, torch.float32, 4242)
    dist.all_reduce(x, group=sub)
    dump("new_group all_reduce float32 4099", x)
    dist.barrier(group=sub)

    # A captured graph with an all_reduce, replayed with new inputs.
    static = data(4099, torch.float32, 99)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up outside capture, as torch recommends
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(static)
        static.mul_(2)
        dist.all_reduce(static, op=dist.ReduceOp.MAX)
    for rep in range(4):
        static.copy_(data(4099, torch.float32, 500 + rep))
        g.replay()
        dump("graph replay %d" % rep, static)

    nresults = w.finish(outfile)
    print("torch_collectives: %d results, premul_sum %s" % (nresults, "yes" if premul else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
