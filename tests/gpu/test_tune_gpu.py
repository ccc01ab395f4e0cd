#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gpu suite, one GPU: mscx-perf --nccl-window (a registered window where NCCL
has one, results checked), then mscx-tune at world size 1 for allreduce
(one repetition, 1K-64K): every NCCL and candidate run succeeds with #wrong 0,
the candidates' routes are proven by the shim's summary, the plans it writes
pass mscx-plan check, and mscx-perf with MSCX_PLAN_DIR=OUT/plans routes
through them with correct results. Exit 77 without a GPU.

usage: test_tune_gpu.py MSCX_TUNE BUILD_DIR PLANS_DIR"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pycheck  # noqa: E402

check = pycheck.Checks(tail=4000)


def have_gpu():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        return p.returncode == 0 and "GPU " in p.stdout
    except OSError:
        return False


def run(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    return p.returncode, " ".join(cmd) + "\n" + p.stdout


def main():
    tune, build, plans = sys.argv[1:4]
    if not have_gpu():
        print("no GPU: skipped")
        return 77
    perf = os.path.join(build, "tools", "perf", "mscx-perf")
    shim = os.path.join(build, "shim", "libmscx_nccl.so")
    tmp = tempfile.mkdtemp(prefix="mscx-tune-gpu-")
    try:
        js = os.path.join(tmp, "window.json")
        sweep = ["-b", "1K", "-e", "64K", "-f", "2", "-d", "half,float", "-c", "1"]
        rc, out = run([perf] + sweep + ["--nccl-window", "--json", js])
        res = json.load(open(js)) if os.path.exists(js) else {}
        m = re.search(r"# NCCL version code (\d+)", out)
        ver = int(m.group(1)) if m else 0
        want = "nccl-window" if ver >= 22700 else "nccl"
        check("mscx-perf --nccl-window: #wrong 0, backend %s (NCCL %d)" % (want, ver),
              rc == 0 and res.get("wrong") == 0 and res.get("backend") == want, out)

        od = os.path.join(tmp, "out")
        rc, out = run([sys.executable, tune, "--build", build, "--plans", plans, "--out", od, "--only",
                       "allreduce", "--reps", "1", "--max-size", "64K", "--budget", "400"], timeout=590)
        check("mscx-tune at world size 1 runs", rc == 0, out)
        if rc != 0:
            return check.done()
        d = json.load(open(os.path.join(od, "tune.json")))
        bad = [(r["side"], r["mode"], r["status"], r.get("note")) for r in d["runs"]
               if r["status"] != "ok" and not (r["side"] == "nccl-window" and r["status"] == "unavailable")]
        check("every run succeeds with #wrong 0", not bad, json.dumps(bad))
        cands = [n for n in d["candidates"] if d["candidates"][n]["coll"] == "allreduce"]
        proven = {r["side"] for r in d["runs"] if r["side"] in cands and any(
            v is not None for per in r["times"].values() for v in per.values())}
        check("the shim's summary proves every candidate's route", cands and proven == set(cands),
              "candidates %s, proven %s" % (cands, sorted(proven)))
        files = sorted(glob.glob(os.path.join(od, "plans", "*.json")))
        if files:
            rc, cout = run([os.path.join(build, "tools", "mscx-plan"), "check"] + files)
            check("the written plans pass mscx-plan check", rc == 0, cout)
            summ = os.path.join(tmp, "summary")
            js = os.path.join(tmp, "tuned.json")
            rc, pout = run([perf] + sweep + ["--json", js],
                           env={"LD_PRELOAD": shim, "MSCX_PLAN_DIR": os.path.join(od, "plans"),
                                "MSCX_SUMMARY_FILE": summ})
            res = json.load(open(js)) if os.path.exists(js) else {}
            routed = 0
            for f in glob.glob(summ + ".*"):
                routed += sum(int(c.get("routed", 0)) for c in json.load(open(f)))
            check("mscx-perf with MSCX_PLAN_DIR=OUT/plans: routed, #wrong 0",
                  rc == 0 and res.get("wrong") == 0 and routed > 0, pout)
        else:
            print("note: mscx-tune routed nothing on this machine (NCCL as fast); report:\n%s"
                  % open(os.path.join(od, "report.md")).read())
        print(open(os.path.join(od, "report.md")).read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
