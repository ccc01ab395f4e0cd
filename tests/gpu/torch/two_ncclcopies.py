#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two NCCL copies in one process with the mscx shim preloaded: PyTorch on
its wheel's libnccl and a ctypes client on another libnccl.so.2 opened by
path (as vLLM's pynccl does with VLLM_NCCL_SO_PATH). World size 1, one GPU:
the client's fp32 sum ncclAllReduce from 1 KB to 256 KB must give its input,
and so must torch's all_reduce before and after it.

  two_ncclcopies.py --shim LIB --plans DIR [--second PATH]

--second: the client's libnccl.so.2 (default MSCX_TEST_NCCL_SECOND, else
/usr/lib/x86_64-linux-gnu/libnccl.so.2). The script runs itself again with
LD_PRELOAD=LIB. Exits 77 without torch, without a GPU, or without a second
libnccl.so.2 other than torch's.
"""
import argparse
import ctypes
import os
import subprocess
import sys

DEFAULT_SECOND = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
NCCL_FLOAT32, NCCL_SUM = 7, 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def mapped(fragment):
    """Paths of the objects mapped in this process whose name contains FRAGMENT."""
    out = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if fragment in os.path.basename(path):
                out.add(path)
    return sorted(out)


def client(path):
    lib = ctypes.CDLL(path)  # RTLD_LOCAL | RTLD_NOW, as ctypes always opens
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclGetErrorString.argtypes = [ctypes.c_int]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


def child(second):
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print("no torch (%s): skipped" % e)
        return 77
    if not torch.cuda.is_available():
        print("no GPU: skipped")
        return 77
    torch_nccl = mapped("libnccl")
    if not os.path.exists(second):
        print("no second NCCL at %s (set MSCX_TEST_NCCL_SECOND): skipped" % second)
        return 77
    if any(os.path.samefile(second, p) for p in torch_nccl if os.path.exists(p)):
        print("%s is torch's own NCCL, not a second copy: skipped" % second)
        return 77
    bad = []

    def check(name, ok, detail=""):
        print("%s: %s%s" % ("ok" if ok else "FAIL", name, (" (%s)" % detail) if detail and not ok else ""))
        if not ok:
            bad.append(name)

    check("the shim is preloaded", bool(mapped("libmscx_nccl")), "LD_PRELOAD=%s" % os.environ.get("LD_PRELOAD"))
    print("torch's NCCL: %s (version %s); the client's: %s" % (", ".join(torch_nccl) or "?",
                                                               torch.cuda.nccl.version(), second))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method="env://", rank=0, world_size=1, device_id=dev)

    def data(n, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        return (torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32).to(torch.float32) * 0.125).to(dev)

    def torch_all_reduce(tag):
        x = data(4099, 7)
        want = x.clone()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        check("torch all_reduce %s" % tag, torch.equal(x, want))

    torch_all_reduce("before the client")
    lib = client(second)
    ver = ctypes.c_int(0)
    lib.ncclGetVersion(ctypes.byref(ver))
    print("client's NCCL version %d" % ver.value)
    uid, comm = UniqueId(), ctypes.c_void_p()
    r = lib.ncclGetUniqueId(ctypes.byref(uid))
    r = r or lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
    check("client ncclCommInitRank", r == 0, lib.ncclGetErrorString(r))
    if r == 0:
        stream = torch.cuda.current_stream().cuda_stream
        nbytes = 1024
        while nbytes <= 256 * 1024:
            n = nbytes // 4
            send = data(n, nbytes)
            recv = torch.full((n,), float("nan"), device=dev)
            r = lib.ncclAllReduce(send.data_ptr(), recv.data_ptr(), n, NCCL_FLOAT32, NCCL_SUM, comm, stream)
            torch.cuda.synchronize()
            detail = lib.ncclGetErrorString(r) if r else "%d of %d floats differ" % (int((recv != send).sum()), n)
            check("client ncclAllReduce fp32 sum %d bytes" % nbytes, r == 0 and torch.equal(recv, send), detail)
            torch_all_reduce("between client calls (%d bytes)" % nbytes)
            nbytes *= 2
        check("client ncclCommDestroy", lib.ncclCommDestroy(comm) == 0)
    torch_all_reduce("after the client")
    dist.destroy_process_group()
    print("%d checks failed" % len(bad))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--plans", required=True)
    ap.add_argument("--second", default=os.environ.get("MSCX_TEST_NCCL_SECOND", DEFAULT_SECOND))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.second)
    log = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mscx-two-ncclcopies-%d.log" % os.getpid())
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(a.shim), MSCX_PLAN_DIR=os.path.abspath(a.plans),
               MSCX_DEBUG="INFO", MSCX_DEBUG_SUBSYS="SHIM", MSCX_DEBUG_FILE=log, NCCL_NVLS_ENABLE="0")
    for k in ("MSCX_DISABLE", "MSCX_FORCE_FALLBACK", "MSCX_NCCL_LIB"):
        env.pop(k, None)
    rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--second", a.second,
                         "--shim", a.shim, "--plans", a.plans], env=env).returncode
    text = open(log).read() if os.path.exists(log) else ""
    if os.path.exists(log):
        os.unlink(log)
    print("--- shim log\n%s" % text.strip())
    if rc != 0:
        return rc
    # The client's NCCL calls its own ncclCommGetAsyncError in every collective: those calls reach the
    # preloaded shim, which must have sent them back (else this run did not exercise two copies).
    back = "calls from inside %s" % os.path.realpath(a.second)
    if back not in text and ("calls from inside %s" % a.second) not in text:
        print("FAIL: the shim's log does not say that calls from inside %s went back to it" % a.second)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
