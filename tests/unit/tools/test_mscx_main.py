#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/ab/mscx-main BUILD --gpu against the fake mscx-perf of test_mscx_ab.py and
a fake nvidia-smi: on one GPU, the NCCL A/B plus the executor A/Bs for 2, 4
and 8 ranks (eager and graph) under one directory; on two GPUs, the NCCL A/B
alone with --nproc 2; a failing A/B fails the job."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import pycheck  # noqa: E402
from test_mscx_ab import write_fake_perf  # noqa: E402

check = pycheck.Checks()


def main():
    main_sh = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="mscx-main-test-")
    build = os.path.join(tmp, "build")
    os.makedirs(os.path.join(build, "tools", "perf"))
    os.makedirs(os.path.join(build, "shim"))
    write_fake_perf(os.path.join(build, "tools", "perf", "mscx-perf"))
    open(os.path.join(build, "shim", "libmscx_nccl.so"), "w").close()
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    smi = os.path.join(bindir, "nvidia-smi")
    with open(smi, "w") as fh:
        fh.write("#!/bin/sh\ni=0\nwhile [ $i -lt ${FAKE_NGPU:-1} ]; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; "
                 "i=$((i+1)); done\n")
    os.chmod(smi, 0o755)

    def run(ngpu, out, extra_env=None):
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), FAKE_NGPU=str(ngpu),
                   MSCX_AB_OUT=out, **(extra_env or {}))
        env.pop("MSCX_SUMMARY_FILE", None)
        return subprocess.run(["bash", main_sh, build, "--gpu", "--runs", "1"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=600)

    out = os.path.join(tmp, "one")
    p = run(1, out)
    runs = ["nccl-ws1"] + ["exec-n%d-%s" % (n, how) for n in (2, 4, 8) for how in ("eager", "graph")]
    check("one GPU: the job passes", p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:])
    missing = [r for r in runs for f in ("ab.md", "ab.png", "ab.json") if not os.path.exists(os.path.join(out, r, f))]
    check("one GPU: a table, a plot and the medians for each of the 7 A/Bs", not missing, "missing %s" % missing)
    check("one GPU: the tables are printed", p.stdout.count("| size | baseline us | mscx us |") == 6
          and p.stdout.count("| size | NCCL us | mscx us |") == 1, p.stdout[-3000:])
    log = open(os.path.join(out, "exec-n4-graph", "runs.log")).read() if not missing else ""
    check("graph runs pass -G 1 and the 1K..1M sweep to both sides",
          log.count("--executor 4 -b 1K -e 1M -f 2 -d float -o sum -n 50 -w 10 -G 1 --baseline --json") == 1
          and log.count("--executor 4 -b 1K -e 1M -f 2 -d float -o sum -n 50 -w 10 -G 1 --json") == 1, log)
    out = os.path.join(tmp, "two")
    p = run(2, out)
    log = open(os.path.join(out, "nccl-ws2", "runs.log")).read() if os.path.exists(
        os.path.join(out, "nccl-ws2", "runs.log")) else ""
    check("two GPUs: the NCCL A/B alone, one rank per GPU", p.returncode == 0 and "--nproc 2 -b 1K" in log
          and not any(d.startswith("exec-") for d in os.listdir(out)), p.stdout[-2000:] + p.stderr[-2000:])
    out = os.path.join(tmp, "bad")
    p = run(1, out, {"FAKE_WRONG": "a"})
    check("a failing A/B fails the job and is named", p.returncode != 0 and "SOME A/B RUNS FAILED" in p.stderr
          and "exec-n8-graph: FAILED" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:])
    subprocess.run(["rm", "-rf", tmp])
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
