#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mscx-ab against a fake mscx-perf: the happy path and the failure paths."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import pycheck  # noqa: E402

FAKE = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if "--help" in args:
    print("usage: fake mscx-perf --executor N %s--json FILE" % ("" if os.environ.get("FAKE_NOBASELINE") else "--baseline "))
    sys.exit(0)
out = args[args.index("--json") + 1]
shim = "LD_PRELOAD" in os.environ or ("--executor" in args and "--baseline" not in args)
wrong_side = os.environ.get("FAKE_WRONG", "")
wrong = 2 if (wrong_side == "b" and shim) or (wrong_side == "a" and not shim) else 0
na_side = os.environ.get("FAKE_NA", "")
na_sizes = {"a": (8,), "b": (8, 262144), "all": tuple(8 << (3 * k) for k in range(6))}
na = na_sizes.get(na_side, ()) if (na_side == "b" and shim) or (na_side == "a" and not shim) or na_side == "all" else ()
rows = []
for k in range(6):
    size = 8 << (3 * k)
    # the mscx side wins below 64K and loses above: one crossover
    t = 10.0 + size / 1000.0
    if shim:
        t = t * (0.5 if size < 65536 else 1.5)
    body = {"time_us": t, "algbw": 0.0, "busbw": 0.0, "wrong": wrong if k == 2 else 0}
    if size in na:
        body = {"time_us": None, "algbw": None, "busbw": None, "wrong": None, "na": True}
    rows.append({"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
                 "out_of_place": body, "in_place": dict(body)})
json.dump({"tool": "mscx-perf", "version": 1, "results": rows, "wrong": wrong}, open(out, "w"))
summ = os.environ.get("MSCX_SUMMARY_FILE")
mode = os.environ.get("FAKE_SUMMARY", "ok")
if shim and summ and mode != "none":
    if mode == "ok":
        s = {"routed": 40, "fallback": {"size": 8},
             "buckets": [{"bucket": "<=1K", "routed": 16, "fallback": 0},
                         {"bucket": "<=64K", "routed": 24, "fallback": 0},
                         {"bucket": "<=4M", "routed": 0, "fallback": {"size": 8}}]}
    else:
        s = {"routed": 0, "fallback": {"no_plan": 48}}
    json.dump(s, open(summ, "w"))
sys.exit(1 if wrong else 0)
'''

check = pycheck.Checks()


def write_fake_perf(path):
    """FAKE as an executable at PATH, run by this interpreter (no PATH lookup needed)."""
    with open(path, "w") as fh:
        fh.write(FAKE.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    os.chmod(path, 0o755)


def main():
    ab = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="mscx-ab-test-")
    perf = os.path.join(tmp, "mscx-perf")
    write_fake_perf(perf)
    shim = os.path.join(tmp, "libfake.so")
    open(shim, "w").close()

    def run(extra_env, *extra):
        out = os.path.join(tmp, "out-%d" % check.count())
        env = dict(os.environ, **extra_env)
        env.pop("MSCX_SUMMARY_FILE", None)
        p = subprocess.run([sys.executable, ab, "--perf", perf, "--shim", shim, "--runs", "2", "--out", out]
                           + list(extra) + ["--", "-b", "8", "-e", "256M", "-f", "8"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        return p, out

    def read(out, name):
        path = os.path.join(out, name)
        return open(path).read() if os.path.exists(path) else ""

    def is_png(path):
        return os.path.exists(path) and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    p, out = run({})
    check("happy path exits 0", p.returncode == 0, p.stderr)
    md = open(os.path.join(out, "ab.md")).read() if os.path.exists(os.path.join(out, "ab.md")) else ""
    check("table has a row per size", md.count("\n| ") == 6 and "| 8 | 10.01 | 5.00 | 2.00x | mscx |" in md, md)
    check("table names the fallback path", "nccl (size)" in md, md)
    check("crossover found at 256K", "Crossover: 256K" in md, md)
    png = os.path.join(out, "ab.png")
    check("PNG written", os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p.stdout + p.stderr)

    p, out = run({"FAKE_WRONG": "b"})
    check("wrong results on the shim side fail", p.returncode != 0 and "wrong results" in p.stderr, p.stderr)
    p, out = run({"FAKE_WRONG": "a"})
    check("wrong results on the NCCL side fail", p.returncode != 0 and "NCCL run 1 reported wrong" in p.stderr,
          p.stderr)
    p, out = run({"FAKE_SUMMARY": "nothing"})
    check("a summary that routed nothing fails", p.returncode != 0 and "routed nothing" in p.stderr, p.stderr)
    p, out = run({"FAKE_SUMMARY": "none"})
    md = open(os.path.join(out, "ab.md")).read() if os.path.exists(os.path.join(out, "ab.md")) else ""
    check("no summary: path unknown", p.returncode == 0 and "| unknown |" in md, p.stderr + md)
    p, out = run({}, "--mode", "executor", "--nranks", "8")
    md = open(os.path.join(out, "ab.md")).read() if os.path.exists(os.path.join(out, "ab.md")) else ""
    check("executor mode against the baseline", p.returncode == 0 and "| baseline us | mscx us |" in md, p.stderr)
    log = read(out, "runs.log")
    check("executor mode runs --executor N with and without --baseline",
          log.count("--executor 8 -b 8 -e 256M -f 8 --baseline --json") == 2
          and log.count("--executor 8 -b 8 -e 256M -f 8 --json") == 2, log)
    order = [("b" if "--baseline" in ln else "m") for ln in log.splitlines() if ln.startswith("$ ")]
    check("the order swaps in the second pair: A B, B A", order == ["b", "m", "m", "b"], order)
    p, out = run({"FAKE_WRONG": "a"}, "--mode", "executor", "--nranks", "4")
    check("wrong results on the baseline side fail", p.returncode != 0 and "FAILED" in p.stderr
          and "baseline run 1 reported wrong results (#wrong > 0)" in p.stderr, p.stderr)
    p, out = run({"FAKE_WRONG": "b"}, "--mode", "executor", "--nranks", "4")
    check("wrong results on the executor side fail", p.returncode != 0
          and "mscx run 1 reported wrong results (#wrong > 0)" in p.stderr, p.stderr)
    p, out = run({"FAKE_NOBASELINE": "1"}, "--mode", "executor")
    check("an mscx-perf without --baseline is refused", p.returncode != 0 and "no --baseline mode" in p.stderr,
          p.stderr)
    p, out = run({"FAKE_NA": "a"}, "--mode", "executor", "--nranks", "2")
    md = read(out, "ab.md")
    check("n/a sizes: the row says n/a, no numbers", p.returncode == 0
          and "| 8 | n/a | 5.00 | n/a | executor, 2 ranks |" in md
          and "n/a on the baseline side (it cannot run them; see runs.log): 8." in md, p.stderr + md)
    check("n/a sizes: the plot is still drawn", is_png(os.path.join(out, "ab.png")), p.stderr)
    res = json.loads(read(out, "ab.json") or "{}")
    check("n/a sizes: ab.json has null for them", res.get("a_us", [0])[0] is None and abs((res.get("b_us") or [0])[0] - 5.004) < 1e-9,
          str(res))
    p, out = run({"FAKE_NA": "b"}, "--mode", "executor")
    md = read(out, "ab.md")
    check("n/a on the mscx side", p.returncode == 0 and "| 256K | 272.14 | n/a | n/a |" in md
          and "n/a on the mscx side (it cannot run them; see runs.log): 8, 256K." in md, p.stderr + md)
    p, out = run({"FAKE_NA": "all"}, "--mode", "executor")
    check("every size n/a fails", p.returncode != 0 and "no size has times on both sides" in p.stderr, p.stderr)
    # No plotter at all: a PATH without gnuplot and a matplotlib that cannot be imported.
    stub = os.path.join(tmp, "stub")
    os.makedirs(os.path.join(stub, "matplotlib"))
    with open(os.path.join(stub, "matplotlib", "__init__.py"), "w") as fh:
        fh.write("raise ImportError('matplotlib stubbed out by the test')\n")
    os.makedirs(os.path.join(tmp, "emptybin"))
    p, out = run({"PATH": os.path.join(tmp, "emptybin"), "PYTHONPATH": stub})
    check("no gnuplot and no matplotlib fails loudly", p.returncode != 0 and "no plotter" in p.stderr
          and "gnuplot" in p.stderr and "matplotlib" in p.stderr and not os.path.exists(os.path.join(out, "ab.png"))
          and "| 8 |" in p.stdout, p.stderr)
    p, out = run({"PATH": os.path.join(tmp, "emptybin")}, "--plotter", "gnuplot")
    check("--plotter gnuplot without gnuplot fails", p.returncode != 0 and "gnuplot not found" in p.stderr, p.stderr)
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as fh:
        fh.write('{"tool": "mscx-ab", "version": 1, "names": ["a", "b"], "sizes": [8, 16], "a_us": [1.0]}')
    p = subprocess.run([sys.executable, ab, "--replot", bad, "--out", os.path.join(tmp, "replot")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    check("--replot of a malformed ab.json fails", p.returncode != 0 and "bad results" in p.stderr, p.stderr)
    p = subprocess.run([sys.executable, ab, "--perf", os.path.join(tmp, "missing")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    check("missing mscx-perf fails", p.returncode != 0 and "not found" in p.stderr, p.stderr)
    p = subprocess.run([sys.executable, ab, "--help"], stdout=subprocess.PIPE, universal_newlines=True)
    check("--help documents the one-GPU commands", "--mode executor --nranks 8" in p.stdout, p.stdout)
    subprocess.run(["rm", "-rf", tmp])
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
