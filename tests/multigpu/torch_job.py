#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A multi-rank PyTorch job for the shim A/B, and its comparer.

  torchrun --standalone --nproc-per-node N tests/multigpu/torch_job.py run --out DIR
      every rank runs the collectives below and 50 DDP steps, and writes
      DIR/rank<R>.json (index, hashes, losses) and DIR/rank<R>.bin (raw bytes)
  torch_job.py compare BASE_DIR MSCX_DIR [--summary FILE] [--require-routed]
      the shim run against the stock-NCCL run; exit 1 on any difference
  torch_job.py failtest --nproc N --out DIR [--timeout S]
      starts N ranks itself (no torchrun agent, which would kill the
      survivors), SIGKILLs the last rank mid-job and requires every other
      rank to end with an error within the timeout, never hang

Compare rules: data movement (gather, broadcast, all-to-all, p2p) and
reductions of integer-valued inputs (or max) must be bit-identical to NCCL;
float reductions may use another summation order, so they must be close
(per-dtype tolerance) AND every rank's copy of an all-reduced result must be
bit-identical (a replica that drifts breaks DDP). DDP: the per-step losses
within a tolerance (bitwise equality is reported), the final parameters
identical on every rank. 'compare' needs only python3's standard library.
"""
import argparse
import array
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time

# ---------------------------------------------------------------- the job (needs torch)


class Recorder:
    def __init__(self, out, rank):
        self.out, self.rank = out, rank
        self.index, self.losses, self.skipped = {}, [], {}
        self.bin = open(os.path.join(out, "rank%d.bin" % rank), "wb")

    def put(self, name, t, exact, same_on_ranks, group=None):
        import torch
        c = t.detach().contiguous().cpu()
        raw = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
        self.put_raw(name, raw, str(c.dtype).replace("torch.", ""), list(c.shape), exact, same_on_ranks, group)

    def put_raw(self, name, raw, dtype, shape, exact, same_on_ranks, group=None):
        """The bytes of one tensor (no torch needed: the comparer's unit test writes runs with it)."""
        off = self.bin.tell()
        self.bin.write(raw)
        self.index[name] = {"dtype": dtype, "shape": shape, "offset": off, "nbytes": len(raw),
                            "sha256": hashlib.sha256(raw).hexdigest(), "exact": bool(exact),
                            "same_on_ranks": bool(same_on_ranks), "group": group}

    def close(self, world, extra):
        self.bin.close()
        with open(os.path.join(self.out, "rank%d.json" % self.rank), "w") as fh:
            json.dump(dict({"rank": self.rank, "world": world, "tensors": self.index, "losses": self.losses,
                            "skipped": self.skipped}, **extra), fh, indent=1, sort_keys=True)


def wait_gone(reached, limit):
    """Wait until the process that wrote @reached (step and pid) has ended, at most @limit seconds."""
    end = time.time() + limit
    while time.time() < end:
        try:
            with open(reached) as fh:
                pid = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            pid = None  # not written yet
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return  # gone, and reaped by the launcher
        time.sleep(0.01)


def job(args):
    import datetime
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout), device_id=dev)
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args.out, rank)

    def gen(seed):
        return torch.Generator().manual_seed(args.seed * 1000003 + seed * 1009 + rank)

    def ints(n, seed, dtype, hi=16):
        return torch.randint(-hi, hi, (n,), generator=gen(seed)).to(dtype).to(dev)

    def rnd(n, seed, dtype):
        return torch.randn(n, generator=gen(seed)).to(dtype).to(dev)

    sizes = [256, 16384, 65536]  # elements: 1K, 64K, 256K bytes in fp32 (shipped plan ranges)
    k = 0
    for n in sizes:
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            nm = "%s_%d" % (str(dt).replace("torch.", ""), n)
            k += 1
            x = ints(n, k, dt, 8)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            rec.put("allreduce_sum_int_" + nm, x, True, True)
            x = rnd(n, k + 100, dt)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            rec.put("allreduce_sum_rand_" + nm, x, False, True)
            x = rnd(n, k + 200, dt)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            rec.put("allreduce_max_" + nm, x, True, True)
        x = ints(n, k + 300, torch.float32, 8) * world  # sum / world stays an integer: exact
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        rec.put("allreduce_avg_int_float32_%d" % n, x, True, True)
        x = rnd(n, k + 400, torch.float32)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        rec.put("allreduce_avg_rand_float32_%d" % n, x, False, True)
        x = ints(n, k + 500, torch.int32, 1000)
        dist.all_reduce(x)
        rec.put("allreduce_sum_int32_%d" % n, x, True, True)
        if hasattr(dist, "_make_nccl_premul_sum"):
            x = ints(n, k + 600, torch.float32, 8)
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
            rec.put("allreduce_premul_sum_float32_%d" % n, x, True, True)
        else:
            rec.skipped["allreduce_premul_sum"] = "torch.distributed has no _make_nccl_premul_sum"

        per = max(1, n // world)
        x = rnd(per, k + 700, torch.float32)
        y = torch.empty(per * world, dtype=torch.float32, device=dev)
        dist.all_gather_into_tensor(y, x)
        rec.put("allgather_float32_%d" % n, y, True, True)
        x = ints(per * world, k + 800, torch.float32, 8)
        y = torch.empty(per, dtype=torch.float32, device=dev)
        dist.reduce_scatter_tensor(y, x)
        rec.put("reducescatter_sum_int_float32_%d" % n, y, True, False)
        x = rnd(per * world, k + 900, torch.bfloat16)
        y = torch.empty(per, dtype=torch.bfloat16, device=dev)
        dist.reduce_scatter_tensor(y, x)
        rec.put("reducescatter_sum_rand_bfloat16_%d" % n, y, False, False)
        x = rnd(n, k + 1000, torch.float16)
        dist.broadcast(x, src=(world - 1))
        rec.put("broadcast_float16_%d" % n, x, True, True)
        x = rnd(per * world, k + 1100, torch.float32)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x)
        rec.put("alltoall_float32_%d" % n, y, True, False)
        if world > 1:
            x = rnd(n, k + 1200, torch.float32)
            y = torch.empty_like(x)
            ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, y, (rank - 1) % world)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            rec.put("p2p_ring_float32_%d" % n, y, True, False)
        else:
            rec.skipped["batch_isend_irecv"] = "world size 1"

    # new_group: the first half of the ranks (rank 0 alone at world size 1)
    members = list(range(max(1, world // 2)))
    g = dist.new_group(members)
    if rank in members:
        x = rnd(16384, 2000, torch.float32)
        dist.all_reduce(x, group=g)
        rec.put("newgroup_allreduce_rand_float32", x, False, True, members)
        x = ints(16384, 2001, torch.float32, 8)
        dist.all_reduce(x, group=g)
        rec.put("newgroup_allreduce_int_float32", x, True, True, members)
    dist.barrier()

    # CUDA graph: capture one all_reduce, replay it on new inputs
    static = torch.zeros(16384, dtype=torch.float32, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    for i in range(3):
        static.copy_(ints(16384, 3000 + i, torch.float32, 8))
        graph.replay()
        torch.cuda.synchronize()
        rec.put("graph_replay%d_allreduce_int_float32" % i, static, True, True)
        static.copy_(rnd(16384, 3100 + i, torch.float32))
        graph.replay()
        torch.cuda.synchronize()
        rec.put("graph_replay%d_allreduce_rand_float32" % i, static, False, True)
    del graph

    # DDP: a small MLP, same initial weights everywhere, per-rank data
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = gen(4000)
    for step in range(args.steps):
        xb = torch.randn(32, 64, generator=data).to(dev)
        yb = torch.randint(0, 16, (32,), generator=data).to(dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        rec.losses.append(struct.unpack("<I", struct.pack("<f", float(loss.item())))[0])  # exact fp32 bits
        if args.kill_at_step is not None and step == args.kill_at_step:
            with open(os.path.join(args.out, "reached%d" % rank), "w") as fh:
                fh.write("%d %d\n" % (step, os.getpid()))
            if rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            wait_gone(os.path.join(args.out, "reached%d" % args.kill_rank), args.kill_wait)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rec.put("ddp_final_params", flat, False, True)
    torch.cuda.synchronize()
    rec.close(world, {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- compare (stdlib only)

TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}


def decode(raw, dtype):
    if dtype == "float32":
        return array.array("f", raw).tolist()
    if dtype == "float64":
        return array.array("d", raw).tolist()
    if dtype == "float16":
        return [v[0] for v in struct.iter_unpack("<e", raw)]
    if dtype == "bfloat16":
        return [struct.unpack("<f", struct.pack("<I", v[0] << 16))[0] for v in struct.iter_unpack("<H", raw)]
    return None


def load_run(d):
    ranks = {}
    for f in sorted(os.listdir(d)):
        if f.startswith("rank") and f.endswith(".json"):
            with open(os.path.join(d, f)) as fh:
                j = json.load(fh)
            with open(os.path.join(d, "rank%d.bin" % j["rank"]), "rb") as fh:
                j["_bin"] = fh.read()
            ranks[j["rank"]] = j
    if not ranks:
        raise ValueError("%s has no rank*.json (did the job run?)" % d)
    world = ranks[min(ranks)]["world"]
    if sorted(ranks) != list(range(world)):
        raise ValueError("%s: ranks %s present, world size %d" % (d, sorted(ranks), world))
    return ranks


def tensor_bytes(r, name):
    e = r["tensors"][name]
    return r["_bin"][e["offset"]:e["offset"] + e["nbytes"]]


def close_enough(a, b, dtype):
    va, vb = decode(a, dtype), decode(b, dtype)
    if va is None or len(va) != len(vb):
        return False, "not comparable"
    scale = max([abs(v) for v in vb] + [1.0])
    tol = TOL.get(dtype, 0.0)
    worst = 0.0
    for x, y in zip(va, vb):
        if x != x or y != y:
            return False, "NaN"
        worst = max(worst, abs(x - y) / scale)
    return worst <= tol, "max error %.3g of scale (tolerance %.3g)" % (worst, tol)


def read_summary(path):
    """Total routed and fallback calls over PATH and PATH.<rank> (the shim's summary)."""
    files = []
    d, base = os.path.split(path)
    for f in sorted(os.listdir(d or ".")):
        if f == base or (f.startswith(base + ".") and f[len(base) + 1:].isdigit()):
            files.append(os.path.join(d, f))
    routed = fallback = 0
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        for c in data if isinstance(data, list) else [data]:
            routed += int(c.get("routed", 0))
            fb = c.get("fallback", 0)
            fallback += sum(fb.values()) if isinstance(fb, dict) else int(fb)
    return files, routed, fallback


def compare(base_dir, mscx_dir, summary=None, require_routed=False, loss_rtol=1e-4, out=sys.stdout):
    """Return the list of problems (empty: equal)."""
    probs = []
    try:
        base, new = load_run(base_dir), load_run(mscx_dir)
    except (OSError, ValueError) as e:
        return ["cannot load the runs: %s" % e]
    if sorted(base) != sorted(new):
        return ["world sizes differ: %d vs %d ranks" % (len(base), len(new))]
    names = sorted(base[0]["tensors"])
    checked = exact = 0
    for name in names:
        for r in sorted(base):
            b, n = base[r]["tensors"].get(name), new[r]["tensors"].get(name)
            if b is None and n is None:
                continue
            if b is None or n is None:
                probs.append("%s: present on rank %d in one run only" % (name, r))
                continue
            if (b["dtype"], b["shape"]) != (n["dtype"], n["shape"]):
                probs.append("%s rank %d: dtype/shape %s%s vs %s%s" % (name, r, b["dtype"], b["shape"],
                                                                       n["dtype"], n["shape"]))
                continue
            checked += 1
            if b["sha256"] == n["sha256"]:
                exact += 1
                continue
            if b["exact"]:
                probs.append("%s rank %d: not bit-identical to NCCL (exact case)" % (name, r))
                continue
            ok, why = close_enough(tensor_bytes(new[r], name), tensor_bytes(base[r], name), b["dtype"])
            if not ok:
                probs.append("%s rank %d: differs from NCCL: %s" % (name, r, why))
        # every rank's copy of an all-reduced tensor identical, in both runs
        for label, run in (("NCCL", base), ("mscx", new)):
            holders = [r for r in sorted(run) if name in run[r]["tensors"] and run[r]["tensors"][name]["same_on_ranks"]]
            hashes = {run[r]["tensors"][name]["sha256"] for r in holders}
            if len(hashes) > 1:
                probs.append("%s (%s run): ranks hold different bytes (%d distinct copies)" % (name, label, len(hashes)))
    for r in sorted(base):
        lb, ln = base[r]["losses"], new[r]["losses"]
        if len(lb) != len(ln):
            probs.append("rank %d: %d DDP steps vs %d" % (r, len(lb), len(ln)))
            continue
        fb = [struct.unpack("<f", struct.pack("<I", v))[0] for v in lb]
        fn = [struct.unpack("<f", struct.pack("<I", v))[0] for v in ln]
        bad = [i for i, (x, y) in enumerate(zip(fb, fn)) if abs(x - y) > loss_rtol * max(abs(x), 1e-6)]
        if bad:
            i = bad[0]
            probs.append("rank %d: DDP loss differs from step %d: %r vs %r" % (r, i, fb[i], fn[i]))
        if r == 0:
            out.write("DDP: %d steps, losses %s (first %.6f, last %.6f)\n" % (
                len(lb), "bit-identical" if lb == ln else "within rtol %.0e" % loss_rtol if not bad else "DIFFER",
                fb[0] if fb else 0.0, fb[-1] if fb else 0.0))
        skipped = set(base[r].get("skipped", {})) ^ set(new[r].get("skipped", {}))
        if skipped:
            probs.append("rank %d: skipped in one run only: %s" % (r, sorted(skipped)))
    out.write("tensors: %d rank-copies checked, %d bit-identical to NCCL\n" % (checked, exact))
    if summary:
        try:
            files, routed, fallback = read_summary(summary)
        except (OSError, ValueError) as e:
            files, routed, fallback = [], 0, 0
            probs.append("cannot read the shim summary %s: %s" % (summary, e))
        out.write("shim summary: %d file(s), %d routed, %d fallback\n" % (len(files), routed, fallback))
        if require_routed and routed == 0:
            probs.append("the shim summary (%s) shows no routed call" % summary)
    elif require_routed:
        probs.append("--require-routed needs --summary")
    return probs


# ---------------------------------------------------------------- failure test

def failtest(args):
    import socket
    os.makedirs(args.out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    victim = args.nproc - 1
    procs = []
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.nproc),
               LOCAL_WORLD_SIZE=str(args.nproc), TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
               TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=str(args.timeout * 2), NCCL_NVLS_ENABLE="0")
    for r in range(args.nproc):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        cmd = [sys.executable, os.path.abspath(__file__), "run", "--out", os.path.join(args.out, "job"),
               "--timeout", str(args.timeout), "--kill-at-step", "10", "--kill-rank", str(victim)]
        log = open(os.path.join(args.out, "rank%d.log" % r), "w")
        procs.append((subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.time() + args.startup + args.timeout + args.grace
    start_kill = None
    while time.time() < deadline and any(p.poll() is None for p, _ in procs):
        if start_kill is None and procs[victim][0].poll() is not None:
            start_kill = time.time()
        time.sleep(0.2)
    probs = []
    vcode = procs[victim][0].poll()
    if vcode != -signal.SIGKILL:
        probs.append("rank %d (the victim) ended with %r, not SIGKILL (did it reach step 10?)" % (victim, vcode))
    for r, (p, log) in enumerate(procs):
        code = p.poll()
        if r == victim:
            pass
        elif code is None:
            p.kill()
            p.wait()
            probs.append("rank %d HUNG: still running %.0f s after the kill (timeout %d s)" % (
                r, time.time() - (start_kill or time.time()), args.timeout))
        elif code == 0:
            probs.append("rank %d exited 0: it finished without the killed rank" % r)
        else:
            with open(os.path.join(args.out, "rank%d.log" % r)) as fh:
                tail = [ln.strip() for ln in fh.read().splitlines() if "rror" in ln][-1:]
            how = "signal %d" % -code if code < 0 else "exit %d" % code
            sys.stdout.write("rank %d: ended with %s %.1f s after the kill: %s\n" % (
                r, how, time.time() - (start_kill or time.time()), tail[0][:200] if tail else "(no error line)"))
        log.close()
    for p in probs:
        sys.stdout.write("failtest: FAILED: %s\n" % p)
    sys.stdout.write("failtest: %s (%d ranks, rank %d killed at DDP step 10, timeout %d s)\n" % (
        "PASS" if not probs else "FAIL", args.nproc, victim, args.timeout))
    return 1 if probs else 0


def main(argv):
    ap = argparse.ArgumentParser(prog="torch_job.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one rank of the job (under torchrun)")
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=50)
    r.add_argument("--seed", type=int, default=1234)
    r.add_argument("--timeout", type=int, default=60, help="process group timeout, seconds")
    r.add_argument("--kill-at-step", type=int)
    r.add_argument("--kill-rank", type=int, default=-1)
    r.add_argument("--kill-wait", type=float, default=10.0,
                   help="longest wait, seconds, for the killed rank to be gone before the next step")
    c = sub.add_parser("compare", help="shim run against the NCCL run")
    c.add_argument("base_dir")
    c.add_argument("mscx_dir")
    c.add_argument("--summary", help="MSCX_SUMMARY_FILE of the shim run")
    c.add_argument("--require-routed", action="store_true")
    c.add_argument("--loss-rtol", type=float, default=1e-4)
    f = sub.add_parser("failtest", help="kill one rank, the others must fail within the timeout")
    f.add_argument("--nproc", type=int, required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--timeout", type=int, default=30)
    f.add_argument("--startup", type=int, default=120, help="seconds allowed to reach the kill")
    f.add_argument("--grace", type=int, default=30)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return job(args)
    if args.cmd == "failtest":
        if args.nproc < 2:
            print("failtest: SKIP (needs at least 2 ranks)")
            return 77
        return failtest(args)
    probs = compare(args.base_dir, args.mscx_dir, args.summary, args.require_routed, args.loss_rtol)
    for p in probs:
        print("compare: FAILED: %s" % p)
    print("compare: %s (%s vs %s)" % ("PASS" if not probs else "FAIL", args.base_dir, args.mscx_dir))
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
