#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The shim loaded as the NCCL library by path, as vLLM's and SGLang's
pynccl load NCCL with ctypes (VLLM_NCCL_SO_PATH): no LD_PRELOAD. The shim
finds the real NCCL itself. World size 1, one GPU: fp32 ncclAllReduce (sum
and avg), ncclAllGather and ncclReduceScatter from 1 KB to 1 MB give their
input, and the shim's summary counts every one of them routed.

  shim_as_nccl.py --shim LIB --plans DIR --workdir DIR

Exits 77 without torch or without a GPU.
"""
import argparse
import ctypes
import glob
import json
import os
import sys

NCCL_FLOAT32, NCCL_SUM, NCCL_AVG = 7, 0, 4


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def summary_counts(path):
    """(routed, {reason: count}) over every communicator of the summary files at PATH(.N)."""
    routed, fallback = 0, {}
    for f in [path] + sorted(glob.glob(path + ".*")):
        if not os.path.isfile(f):
            continue
        with open(f) as fh:
            for comm in json.load(fh):
                routed += comm["routed"]
                for k, v in comm["fallback"].items():
                    fallback[k] = fallback.get(k, 0) + v
    return routed, fallback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--plans", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    summary = os.path.join(os.path.abspath(a.workdir), "summary.json")
    for f in glob.glob(summary + "*"):
        os.unlink(f)
    os.environ.pop("LD_PRELOAD", None)
    os.environ["MSCX_PLAN_DIR"] = os.path.abspath(a.plans)
    os.environ["MSCX_SUMMARY_FILE"] = summary
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
        import torch
    except ImportError as e:
        print("no torch (%s): skipped" % e)
        return 77
    if not torch.cuda.is_available():
        print("no GPU: skipped")
        return 77
    torch.cuda.set_device(0)
    nccl = ctypes.CDLL(os.path.abspath(a.shim))
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    nccl.ncclGetLastError.restype = ctypes.c_char_p

    def ck(res, what):
        if res != 0:
            raise RuntimeError("%s: %d %s" % (what, res, nccl.ncclGetLastError(None)))

    ver = ctypes.c_int()
    ck(nccl.ncclGetVersion(ctypes.byref(ver)), "ncclGetVersion")
    uid = UniqueId()
    ck(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    comm = ctypes.c_void_p()
    ck(nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), "ncclCommInitRank")
    stream = torch.cuda.current_stream().cuda_stream
    bad = calls = 0
    n = 256
    while n * 4 <= (1 << 20):
        x = torch.arange(n, dtype=torch.float32, device="cuda") * 0.25 - 3
        for name, fn, op in (("allreduce sum", "ncclAllReduce", NCCL_SUM), ("allreduce avg", "ncclAllReduce", NCCL_AVG),
                             ("allgather", "ncclAllGather", None), ("reducescatter", "ncclReduceScatter", NCCL_SUM)):
            out = torch.full_like(x, 7.0)
            args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(n),
                    NCCL_FLOAT32]
            if op is not None:
                args.append(op)
            ck(getattr(nccl, fn)(*args, comm, ctypes.c_void_p(stream)), fn)
            torch.cuda.synchronize()
            calls += 1
            if not torch.equal(out, x):
                print("WRONG: %s of %d bytes" % (name, n * 4))
                bad += 1
        n *= 2
    ck(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    routed, fallback = summary_counts(summary)
    print("real NCCL version %d; %d calls, %d wrong; shim summary: routed %d, fallback %s"
          % (ver.value, calls, bad, routed, fallback))
    if routed != calls:
        print("FAIL: %d of %d calls routed" % (routed, calls))
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
