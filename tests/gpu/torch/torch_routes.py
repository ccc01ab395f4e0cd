#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The PyTorch calls that must reach the mscx executor, at world size 1:
coalesced all_reduce, all_gather_into_tensor and reduce_scatter_tensor
(ncclGroupStart/End), ReduceOp.AVG in all_reduce and reduce_scatter_tensor,
broadcast(src=0) and all_to_all_single with equal splits; with
--nonblocking the process group's communicator is non-blocking
(TORCH_NCCL_USE_COMM_NONBLOCKING=1). Every result is dumped raw to OUTFILE
for tests/gpu/nccl_compare.py, which compares a stock run and a shim run
bit for bit and checks the shim's routing summary.

  torch_routes.py [--nonblocking] OUTFILE

Exits 77 without torch or without a GPU.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from one_rank import OneRank  # noqa: E402


def main(argv):
    nonblocking = "--nonblocking" in argv
    outfile = [a for a in argv if not a.startswith("--")][0]
    if nonblocking:
        os.environ["TORCH_NCCL_USE_COMM_NONBLOCKING"] = "1"
    w = OneRank()
    if w.skipped:
        return 77
    torch, dist, dev, dump, data = w.torch, w.dist, w.dev, w.dump, w.data

    coalescing = getattr(dist.distributed_c10d, "_coalescing_manager", None)
    sizes = [512, 1000, 4099, 65537, 262143]  # 1 KB and more in every dtype: a plan covers each
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    seed = 1
    for dt in dtypes:
        for n in sizes:
            seed += 1
            t = data(n, dt, seed)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            dump("all_reduce avg %s %d" % (dt, n), t)
            seed += 1
            x = data(n, dt, seed)
            out = torch.full((n,), 7, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
            dump("reduce_scatter_tensor avg %s %d" % (dt, n), out)
            seed += 1
            x = data(n, dt, seed)
            dist.broadcast(x, src=0)
            dump("broadcast %s %d" % (dt, n), x)
            seed += 1
            x = data(n, dt, seed)
            out = torch.full((n,), 7, dtype=dt, device=dev)
            dist.all_to_all_single(out, x)
            dump("all_to_all_single %s %d" % (dt, n), out)
        if coalescing is None:
            continue
        seed += 1
        ts = [data(n, dt, seed + i) for i, n in enumerate(sizes)]
        with coalescing(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        for n, t in zip(sizes, ts):
            dump("coalesced all_reduce %s %d" % (dt, n), t)
        seed += len(sizes)
        xs = [data(n, dt, seed + i) for i, n in enumerate(sizes)]
        outs = [torch.full((n,), 7, dtype=dt, device=dev) for n in sizes]
        with coalescing(async_ops=True) as cm:
            for o, x in zip(outs, xs):
                dist.all_gather_into_tensor(o, x)
        cm.wait()
        for n, o in zip(sizes, outs):
            dump("coalesced all_gather_into_tensor %s %d" % (dt, n), o)
        seed += len(sizes)
        xs = [data(n, dt, seed + i) for i, n in enumerate(sizes)]
        outs = [torch.full((n,), 7, dtype=dt, device=dev) for n in sizes]
        with coalescing(async_ops=True) as cm:
            for o, x in zip(outs, xs):
                dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.AVG)
        cm.wait()
        for n, o in zip(sizes, outs):
            dump("coalesced reduce_scatter_tensor avg %s %d" % (dt, n), o)
        seed += len(sizes)
    nresults = w.finish(outfile)
    print("torch_routes: %d results, coalescing manager %s, %s communicator"
          % (nresults, "yes" if coalescing else "no", "non-blocking" if nonblocking else "blocking"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
