#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/ab/nccl-tests-ab against fake nccl-tests binaries: a shim run as fast
as NCCL passes, a slower one or a #wrong fails, a median over the limit that
the runs' noise explains passes marked as noise, the summary's routed counts
are printed. Prints 'N passed, M failed'; exit 1 on any failure."""
import os
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import pycheck  # noqa: E402

FAKE = r'''#!/bin/sh
# a fake nccl-tests binary: FAKE_SLOW (us added with the shim), FAKE_WRONG (#wrong with the shim),
# FAKE_RUNS_nccl and FAKE_RUNS_mscx (the base time of each run in turn, counted in $FAKE_COUNT.<side>)
add=0; wrong=0; base=5.00
side=nccl; [ -n "$LD_PRELOAD" ] && side=mscx
eval "runs=\${FAKE_RUNS_$side:-}"
if [ -n "$runs" ]; then
    n=$(cat "$FAKE_COUNT.$side" 2>/dev/null || echo 0)
    echo $((n + 1)) > "$FAKE_COUNT.$side"
    base=$(echo $runs | cut -d' ' -f$((n + 1)))
fi
[ -n "$FAKE_ORDER" ] && echo "$side $(grep Cpus_allowed_list /proc/$$/status | cut -f2)" >> "$FAKE_ORDER"
if [ -n "$LD_PRELOAD" ]; then
    add=${FAKE_SLOW:-0}; wrong=${FAKE_WRONG:-0}
    [ -n "$MSCX_SUMMARY_FILE" ] && printf '[{"buckets": [{"coll": "allreduce", "bucket": "<=8K", "routed": 44, "fallback": {}}]}]' > "$MSCX_SUMMARY_FILE.0"
fi
echo "# nccl-tests version 2.19.6"
echo "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong"
for s in 1024 2048 4096; do
    t=$(awk -v a=$add -v b=$base 'BEGIN { printf "%.2f", b + a }')
    echo "        $s           256     float     sum      -1     $t    0.15    0.00       $wrong     0.30    3.30    0.00       0"
done
'''


def run(tool, bindir, extra_env, *args):
    env = dict(os.environ, **extra_env)
    p = subprocess.run([sys.executable, tool, "--bin", bindir, "--shim", "/nonexistent/libmscx_nccl.so",
                        "--runs", "2", "--tests", "all_reduce", "--modes", "eager", *args],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


def main():
    tool = sys.argv[1]
    check = pycheck.Checks(tail=2000)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "all_reduce_perf")
        with open(path, "w") as f:
            f.write(FAKE)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        rc, out = run(tool, d, {})
        check("equal times pass", rc == 0, out)
        check("the table row of 1K", "| 1K | 5.00 | 5.00 | 1.00 |" in out, out)
        check("the summary's routed count", "allreduce <=8K routed 44" in out, out)
        rc, out = run(tool, d, {"FAKE_SLOW": "1.0"})
        check("a slower shim fails", rc == 1 and "FAIL: all_reduce eager size 1024 oop" in out, out)
        check("two runs a side cannot tell noise", "too few runs (2 and 2)" in out, out)
        rc, out = run(tool, d, {"FAKE_SLOW": "1.0"}, "--runs", "4")
        check("a shim slower in every run fails beyond noise",
              rc == 1 and "| 1K | 5.00 | 6.00 | 1.20! |" in out and "beyond noise (p=0.014)" in out, out)
        rc, out = run(tool, d, {"FAKE_SLOW": "0.2"}, "--limit", "1.05")
        check("within the limit (1.04x) passes", rc == 0, out)
        count = os.path.join(d, "count")
        noisy = {"FAKE_RUNS_nccl": "5.00 5.10 5.20 7.00", "FAKE_RUNS_mscx": "5.00 7.00 7.10 5.10",
                 "FAKE_COUNT": count}
        rc, out = run(tool, d, noisy, "--runs", "4")
        check("a median over the limit that the runs' spread explains passes as noise",
              rc == 0 and "| 1K | 5.15 | 6.05 | 1.17~ |" in out and "NOISE: all_reduce eager size 1024 oop" in out
              and "over the limit within noise: 3" in out, out)
        for side in ("nccl", "mscx"):
            os.unlink(f"{count}.{side}")
        noisy["FAKE_RUNS_mscx"] = "6.00 7.40 7.50 7.60"
        rc, out = run(tool, d, noisy, "--runs", "4")
        check("a shim slower in all but one pair of runs fails", rc == 1 and "beyond noise" in out, out)
        order = os.path.join(d, "order.txt")
        rc, out = run(tool, d, {"FAKE_ORDER": order}, "--runs", "4")
        sides = [ln.split()[0] for ln in open(order)]
        check("the order alternates: NCCL first in even runs, the shim first in odd ones",
              rc == 0 and sides == ["nccl", "mscx", "mscx", "nccl"] * 2, sides)
        os.unlink(order)
        rc, out = run(tool, d, {"FAKE_ORDER": order}, "--cpus", "0")
        cpus = [ln.split()[1] for ln in open(order)]
        check("--cpus pins both sides", rc == 0 and cpus == ["0"] * 4, (cpus, out))
        rc, out = run(tool, d, {"FAKE_WRONG": "3"})
        check("#wrong fails", rc == 1 and "#wrong 3" in out and "wrong results: 6" in out, out)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
