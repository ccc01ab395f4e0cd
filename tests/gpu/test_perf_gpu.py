#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gpu suite: mscx-perf --executor N with and without --baseline on one GPU.
Every run checks its results (-c 1) and must report #wrong 0; eager and -G;
float, half, bfloat16, int32; odd sizes (uneven twophase chunks, a size that
is not a multiple of 8 bytes: n/a for the baseline only); sizes below every
plan (n/a on both sides); max (n/a for the baseline, checked for the
executor). Exit 77 without a GPU."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pycheck  # noqa: E402

check = pycheck.Checks(tail=4000)


def main():
    perf, plans = sys.argv[1], sys.argv[2]
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        ngpu = smi.stdout.count("GPU ") if smi.returncode == 0 else 0
    except OSError:
        ngpu = 0
    if ngpu == 0:
        print("no GPU: skipped")
        return 77
    tmp = tempfile.mkdtemp(prefix="mscx-perf-gpu-")
    env = dict(os.environ, MSCX_PLAN_DIR=os.path.abspath(plans), MSCX_TIMEOUT_MS="10000")
    k = [0]

    def run(*args):
        k[0] += 1
        js = os.path.join(tmp, "r%d.json" % k[0])
        cmd = [perf] + [str(a) for a in args] + ["--json", js]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                           timeout=300)
        res = None
        if os.path.exists(js):
            with open(js) as fh:
                res = json.load(fh)
        return p, res, " ".join(cmd) + "\n" + p.stdout

    def bodies(res):
        return [(r["size"], r["type"], side, r[side]) for r in res["results"] for side in ("out_of_place", "in_place")]

    def all_checked(res):
        return res is not None and res.get("wrong") == 0 and all(
            not b.get("na") and b.get("wrong") == 0 and b.get("time_us", 0) > 0 for _, _, _, b in bodies(res))

    for n in (2, 4, 8):
        # the shipped plans' range: 2 ranks end at 256 KB (where NCCL wins on 2 GPUs), 4 and 8 at 1 MB
        top, nsizes = ("256K", 5) if n == 2 else ("1M", 6)
        for g in ([], ["-G", "2"]):
            for base in ([], ["--baseline"]):
                p, res, log = run("--executor", n, *base, "-b", "1K", "-e", top, "-f", "4",
                                  "-d", "float,half,bfloat16,int32", "-n", 5, "-w", 1, "-c", 1, *g)
                check("%d ranks %s%s: 1K..%s, 4 types, checked, no wrong" % (n, "baseline" if base else "executor",
                                                                            " -G 2" if g else "", top),
                      p.returncode == 0 and all_checked(res) and len(res["results"]) == 4 * nsizes, log)
    # uneven twophase chunks: 65544 B = 8193 units of 8 over 8 ranks
    for base in ([], ["--baseline"]):
        p, res, log = run("--executor", 8, *base, "-b", 65544, "-e", 65544, "-d", "float,bfloat16", "-n", 3, "-w", 1)
        check("65544 B on 8 ranks %s: checked, no wrong" % ("baseline" if base else "executor"),
              p.returncode == 0 and all_checked(res), log)
    # 1028 B of float: not a multiple of 8 bytes, n/a for the baseline, fine for the executor
    p, res, log = run("--executor", 4, "--baseline", "-b", 1028, "-e", 1028, "-d", "float", "-n", 3, "-w", 1)
    check("1028 B baseline: n/a, no numbers, exit 0", p.returncode == 0 and res is not None and all(
        b.get("na") and b.get("time_us") is None for _, _, _, b in bodies(res)) and " n/a " in p.stdout
        and "multiple of 8" in p.stdout, log)
    p, res, log = run("--executor", 4, "-b", 1028, "-e", 1028, "-d", "float", "-n", 3, "-w", 1)
    check("1028 B executor: checked, no wrong", p.returncode == 0 and all_checked(res), log)
    # below every plan's range: nothing to run, a clear error on both sides
    for base in ([], ["--baseline"]):
        p, res, log = run("--executor", 2, *base, "-b", 512, "-e", 512, "-n", 3, "-w", 1)
        check("512 B %s: no plan, refused" % ("baseline" if base else "executor"), p.returncode != 0
              and "no 2-rank one-node allreduce plan for 512..512 bytes" in log, log)
    # max: the baseline has sum only; the executor's max must be right (perf op -> executor op mapping)
    p, res, log = run("--executor", 4, "--baseline", "-b", "4K", "-e", "4K", "-o", "max", "-n", 3, "-w", 1)
    check("max baseline: n/a", p.returncode == 0 and res is not None and all(b.get("na") for _, _, _, b in bodies(res)),
          log)
    for op in ("max", "min", "prod"):
        p, res, log = run("--executor", 4, "-b", "4K", "-e", "128K", "-f", "32", "-o", op, "-d", "float,int32",
                          "-n", 3, "-w", 1)
        check("%s executor: checked, no wrong" % op, p.returncode == 0 and all_checked(res), log)
    subprocess.run(["rm", "-rf", tmp])
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
