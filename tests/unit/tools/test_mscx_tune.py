#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mscx-tune on the CPU: the decision (tools/tune/tune_decide.py) against the
vendored timings of tests/data/tune/ (tune.json of 2 ranks against NCCL, and of
8 ranks in one process, mscx-tune --executor 8; see its README), the plan
folder it writes (checked with mscx-plan), and the whole tool against a fake
mscx-perf, with and without --executor.

usage: test_mscx_tune.py MSCX_TUNE MSCX_PLAN MSCX_PLANGEN SOURCE_ROOT
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import pycheck  # noqa: E402

TUNE, PLAN_TOOL, PLANGEN, ROOT = sys.argv[1:5]
sys.path.insert(0, os.path.join(ROOT, "tools", "tune"))
import tune_decide as td  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "tune", "tune-2rank.json")
EXEC_DATA = os.path.join(ROOT, "tests", "data", "tune", "tune-exec8.json")
X_ONE, X_TWO = "allreduce_n8_rpn8_oneshot_1K_32K", "allreduce_n8_rpn8_twophase_32K_1M"
X_T8, X_WRONG = "gen-allreduce-n8-rpn8-twophase-t8", "gen-allreduce-n8-rpn8-oneshot-b1"
X_AP, X_AP2 = "allgather_n8_rpn8_allpairs_1K_1M", "gen-allgather-n8-rpn8-allpairs-t2"
ONESHOT, TWOPHASE = "allreduce_n2_rpn2_oneshot_1K_16K", "allreduce_n2_rpn2_twophase_16K_256K"
GEN_B4, ALLPAIRS = "gen-allreduce-n2-rpn2-oneshot-b4", "allgather_n2_rpn2_allpairs_1K_32K"

# A fake mscx-perf: mscx-perf's JSON with times from fixed formulas per side (the candidate is the one plan
# in MSCX_PLAN_DIR), rank 0's shim summary, and a log line per run in FAKE_LOG.
FAKE = r'''#!/usr/bin/env python3
import glob, json, os, sys
args = sys.argv[1:]
if "--help" in args:
    print("  -o, --op OP             sum prod max min avg all; or a collective name (as --coll)")
    print("      --coll C            allreduce allgather reducescatter (or run as all_reduce_perf ...)")
    sys.exit(0)
def opt(k):
    return args[args.index(k) + 1]
coll, lo, hi, out = opt("--coll"), int(opt("-b")), int(opt("-e")), opt("--json")
graph = "-G" in args
side = "nccl"
if "--nccl-window" in args and not os.environ.get("FAKE_NO_WINDOW"):
    side = "nccl-window"
inproc = "--executor" in args
if inproc:
    # all ranks in this process, the plan named: no NCCL, no shim, no forked ranks
    if "--nproc" in args or "--nccl-window" in args or os.environ.get("LD_PRELOAD") or "--plan" not in args:
        print("fake: bad --executor command: %s" % args)
        sys.exit(2)
    side = os.path.basename(opt("--plan"))[:-5]
elif os.environ.get("LD_PRELOAD"):
    plans = glob.glob(os.path.join(os.environ["MSCX_PLAN_DIR"], "*.json"))
    assert len(plans) == 1, plans
    side = os.path.basename(plans[0])[:-5]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write("%s %s %s%s\n" % (coll, "graph" if graph else "eager", side,
                                " executor" + opt("--executor") if inproc else ""))
if side == os.environ.get("FAKE_FAIL"):
    print("fake: setup failed")
    sys.exit(1)
if side == os.environ.get("FAKE_HANG"):
    import time
    time.sleep(120)
def ratio(s):
    if side == "nccl":
        return 1.0
    if side == "nccl-window":
        return 0.97
    if "oneshot_1K_16K" in side:
        return 0.4 * (1 + s / 65536.0)
    if "twophase_16K_256K" in side:
        return 0.5 if 32768 <= s <= 262144 else 1.3
    if "allpairs_1K_32K" in side:
        return 0.6 if s <= 16384 else 1.2
    if "allpairs_32K_" in side:
        return 0.5 if 32768 <= s <= 262144 else 1.1
    return 1.05
rows, s = [], lo
wrong = 3 if side == os.environ.get("FAKE_WRONG") else 0
while s <= hi:
    for t in opt("-d").split(","):
        us = (6.0 if graph else 8.0) + s / 20000.0
        body = {"time_us": us * ratio(s), "algbw": 1.0, "busbw": 1.0, "wrong": wrong if s == lo else 0}
        if t == "half" and side == os.environ.get("FAKE_NO_HALF"):
            body = {"time_us": None, "algbw": None, "busbw": None, "wrong": None, "na": True}
        rows.append({"size": s, "count": s // 4, "type": t, "redop": "sum", "root": -1,
                     "out_of_place": body, "in_place": dict(body)})
    s *= 2
print("# NCCL version code 22809 (library), 22809 (headers)")
print("#  Rank  0 Group  0 Pid  1 on fakehost device  0 [0000:00:00] Fake H200")
backend = "executor" if inproc else "nccl-window" if side == "nccl-window" else "nccl"
json.dump({"tool": "mscx-perf", "version": 1, "backend": backend,
           "results": rows, "wrong": wrong}, open(out, "w"))
summ = os.environ.get("MSCX_SUMMARY_FILE")
if summ and os.environ.get("LD_PRELOAD"):
    bad = side == os.environ.get("FAKE_UNROUTED")
    buckets = [{"coll": coll, "bucket": "<=%d" % lim, "max_bytes": lim, "routed": 0 if bad else 10,
                "fallback": {"size": 10} if bad else {}} for lim in (1024, 8192, 65536, 524288, 4194304)]
    json.dump([{"rank": 0, "routed": 50, "fallback": {}, "buckets": buckets}], open(summ + ".0", "w"))
sys.exit(1 if wrong else 0)
'''

LAUNCHER = '''#!/bin/sh
# a launcher that starts "one rank": drops -np N and runs the rest
shift 2
exec "$@"
'''

# The "shipped" plans of the end-to-end runs, made here so the test does not depend on plans/:
# (name, collective, algorithm, min, max, mscx-plangen arguments)
SHIPPED = [
    (ONESHOT, "allreduce", "oneshot", "1K", "16K", ["--tbs-per-peer", "2", "--threads-per-block", "1024"]),
    (TWOPHASE, "allreduce", "twophase", "16K+1", "256K",
     ["--tbs-per-peer", "8", "--threads-per-block", "1024"]),
    (ALLPAIRS, "allgather", "allpairs", "1K", "32K", []),
    ("allgather_n2_rpn2_allpairs_32K_512K", "allgather", "allpairs", "32K+1", "512K",
     ["--tbs-per-peer", "8", "--threads-per-block", "1024"]),
    ("reducescatter_n2_rpn2_allpairs_1K_32K", "reducescatter", "allpairs", "1K", "32K", []),
    ("reducescatter_n2_rpn2_allpairs_32K_256K", "reducescatter", "allpairs", "32K+1", "256K",
     ["--tbs-per-peer", "8", "--threads-per-block", "1024"]),
]

check = pycheck.Checks(tail=4000)


def make_plans(tmp):
    """TMP/plans: the SHIPPED plans, written by mscx-plangen."""
    pdir = os.path.join(tmp, "plans")
    if os.path.isdir(pdir):
        return pdir
    os.makedirs(pdir)
    for name, coll, algo, lo, hi, extra in SHIPPED:
        subprocess.run([PLANGEN, "--coll", coll, "--algo", algo, "--ranks", "2", "--min-size", lo,
                        "--max-size", hi, "--name", name, "-o", os.path.join(pdir, name + ".json"), "--quiet"]
                       + extra, check=True)
    return pdir


def ranges(dec, coll, cls=None):
    """The ranges of @p coll in class @p cls (default: the 32-bit class where it reduces, else its one class)."""
    cls = cls or td.classes_of(coll)[-1][0]
    return [tuple(r) for r in dec["collectives"][coll]["classes"][cls]["ranges"]]


def load():
    return td.load_tune(DATA)


def test_decision_recorded():
    d = load()
    g = td.decide(d, 0.05, "graph")
    check("graph: one-shot to the two-phase crossover, two-phase to 256K (its 7% win over NCCL there counts)",
          ranges(g, "allreduce") == [(ONESHOT, 1024, 32767), (TWOPHASE, 32768, 131072),
                                     (TWOPHASE, 131073, 262144)], ranges(g, "allreduce"))
    win = g["collectives"]["allreduce"]["classes"]["32"]["beats_nccl_window"]
    check("graph: the ranges to 128K beat the NCCL window too; (128K, 256K] does not (256K loses to it)",
          win == [True, True, False], win)
    rows = [ln for ln in td.report_md(d, g).splitlines() if ln.startswith("| 128K ") or ln.startswith("| 256K ")]
    check("the report marks the sizes that beat the window", len(rows) >= 2 and "(beats window)" in rows[0]
          and "(beats window)" not in rows[1], rows)
    check("graph: the 16-bit class decides on its own times, here alike",
          ranges(g, "allreduce", "16") == ranges(g, "allreduce"), ranges(g, "allreduce", "16"))
    check("graph: allgather to 4K; 8K, slower eagerly beyond the margin, and the 16K tie stay on NCCL",
          ranges(g, "allgather") == [(ALLPAIRS, 1024, 4096)], ranges(g, "allgather"))
    p8 = [p for p in g["collectives"]["allgather"]["classes"]["any"]["points"] if p["size"] == 8192][0]
    row8 = [ln for ln in td.report_md(d, g).splitlines() if ln.startswith("| 8K ")][0]
    check("graph: 8K names the eager loss that kept it on NCCL, in the decision and in the report",
          list(p8.get("other_mode_losses", {}).get(ALLPAIRS, [])[:1]) == ["eager"] and "under eager)" in row8
          and row8.count(" / ") >= 2, json.dumps(p8) + "\n" + row8)
    graph_only = copy.deepcopy(d)
    graph_only["runs"] = [r for r in graph_only["runs"] if r["mode"] == "graph"]
    check("graph, no eager runs: the other mode cannot object, allgather to 8K",
          ranges(td.decide(graph_only, 0.05, "graph"), "allgather") == [(ALLPAIRS, 1024, 8192)],
          ranges(td.decide(graph_only, 0.05, "graph"), "allgather"))
    e = td.decide(d, 0.05, "eager")
    check("eager: two-phase wins at 16K, so it takes (8K, 16K] too",
          ranges(e, "allreduce")[:2] == [(ONESHOT, 1024, 8192), (TWOPHASE, 8193, 131072)],
          ranges(e, "allreduce"))
    check("eager: allgather loses at 8K, so (4K, 8K] stays on NCCL",
          ranges(e, "allgather") == [(ALLPAIRS, 1024, 4096)], ranges(e, "allgather"))
    b = td.decide(d, 0.05, "both")
    check("both: a plan must win in both modes", ranges(b, "allgather") == [(ALLPAIRS, 1024, 4096)],
          ranges(b, "allgather"))
    # without the window baseline two-phase's 7% win at 256K counts
    nowin = copy.deepcopy(d)
    nowin["runs"] = [r for r in nowin["runs"] if r["side"] != "nccl-window"]
    n = td.decide(nowin, 0.05, "graph")
    check("no window: two-phase reaches 256K", ranges(n, "allreduce")[-1] == (TWOPHASE, 32768, 262144),
          ranges(n, "allreduce"))
    check("the baselines named", g["collectives"]["allreduce"]["baselines"] == ["nccl", "nccl-window"]
          and g["collectives"]["allgather"]["baselines"] == ["nccl"],
          json.dumps(g["collectives"]["allgather"]))


def test_margin_and_ties():
    d = load()
    d["runs"] = [r for r in d["runs"] if r["side"] != "nccl-window"]
    # the b4 variant takes 97% of NCCL's time: inside the 5% margin, outside a 2% one
    r5 = ranges(td.decide(d, 0.05, "graph"), "allreduce")
    r2 = ranges(td.decide(d, 0.02, "graph"), "allreduce")
    check("margin 5%: 3% faster is noise", all(c != GEN_B4 for c, _, _ in r5), r5)
    check("margin 2%: 3% faster at 1M routes; 512K, where it loses in place, does not",
          r2[-1] == (GEN_B4, 1048576, 1048576), r2)
    a0 = ranges(td.decide(d, 0.0, "graph"), "allgather")
    check("margin 0: 8K (slower eagerly) and 16K (within 2% of NCCL) stay on NCCL",
          a0 == [(ALLPAIRS, 1024, 4096)], a0)
    # a candidate whose every time equals NCCL's: a tie never routes, even with no margin
    eq = copy.deepcopy(d)
    eq["runs"] = [r for r in eq["runs"] if r["coll"] == "allgather" and r["side"] != ALLPAIRS]
    eq["runs"] += [dict(copy.deepcopy(r), side=ALLPAIRS) for r in eq["runs"] if r["side"] == "nccl"]
    te = td.decide(eq, 0.0, "graph")
    check("margin 0: exactly NCCL's times stay on NCCL", ranges(te, "allgather") == [] and te["plans"] == [],
          ranges(te, "allgather"))
    # two candidates with identical times: the name decides, every time
    t = copy.deepcopy(d)
    for r in [r for r in t["runs"] if r["side"] == ONESHOT]:
        twin = dict(copy.deepcopy(r), side="aaa-twin")
        t["runs"].append(twin)
    t["candidates"]["aaa-twin"] = dict(t["candidates"][ONESHOT])
    rt = ranges(td.decide(t, 0.05, "graph"), "allreduce")
    check("a tie between candidates goes to the first name", rt[0] == ("aaa-twin", 1024, 32767), rt)


def test_noise():
    d = load()
    base = ranges(td.decide(d, 0.05, "graph"), "allreduce")
    # the recorded data has one run of the one-shot plan at 4K five times slower: the median ignores it
    pts = td.decide(d, 0.05, "graph")["collectives"]["allreduce"]["classes"]["32"]["points"]
    check("one outlier run does not flip 4K", [p["choice"] for p in pts if p["size"] == 4096] == [ONESHOT],
          json.dumps(pts[2]))
    # the same slowness in two of the three runs is no outlier: 4K leaves the one-shot plan
    two = copy.deepcopy(d)
    for r in two["runs"]:
        if r["side"] == ONESHOT and r["mode"] == "graph" and r["rep"] == 2:
            for t in r["times"].values():
                t["4096"] = [x * 5 for x in t["4096"]]
    r2 = ranges(td.decide(two, 0.05, "graph"), "allreduce")
    check("two slow runs of three move 4K", r2 != base and all(not (lo <= 4096 <= hi) or c != ONESHOT
                                                                for c, lo, hi in r2), r2)


def test_ranges_meet(path=DATA):
    d = td.load_tune(path)
    tag = os.path.basename(path)
    for mode in ("graph", "eager", "both"):
        for margin in (0.0, 0.05, 0.2):
            dec = td.decide(d, margin, mode)
            ok, why = True, ""
            for coll in dec["collectives"]:
                for cls, _, dts in td.classes_of(coll):
                    files = sorted((p["min"], p["max"]) for p in dec["plans"] if p["coll"] == coll
                                   and (dts is None or set(dts) & set(p["dtypes"])))
                    for (lo, hi), (lo2, _) in zip(files, files[1:]):
                        if not (lo <= hi < lo2):
                            ok, why = False, "%s %s: [%d, %d] then %d" % (coll, cls, lo, hi, lo2)
                    pts = {p["size"]: p for p in dec["collectives"][coll]["classes"][cls]["points"]}
                    for c, lo, hi in dec["collectives"][coll]["classes"][cls]["ranges"]:
                        for s, p in pts.items():
                            # every measured size in a range is that plan's win
                            if lo <= s <= hi and p["choice"] != c:
                                ok, why = False, "%s %d in %s's range, chosen %s" % (coll, s, c, p["choice"])
            check("%s: ranges meet without overlapping, mode %s margin %g" % (tag, mode, margin), ok, why)
    dec = td.decide(d, 0.05, "graph")
    names = [p["file"] for p in dec["plans"]]
    check("%s: plan files are named in priority order" % tag,
          names == sorted(names) and len(set(names)) == len(names), names)


def make_out(tmp, d):
    """An OUT folder for the recorded tune.json: the candidates are copies of shipped plans."""
    out = os.path.join(tmp, "out")
    pdir = make_plans(tmp)
    src = {ONESHOT: ONESHOT, TWOPHASE: TWOPHASE, GEN_B4: ONESHOT, ALLPAIRS: ALLPAIRS}
    for name, c in d["candidates"].items():
        path = os.path.join(out, c["file"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(os.path.join(pdir, src[name] + ".json"), path)
        c["sha256"] = td.sha256_file(path)
    td.write_atomic(os.path.join(out, "tune.json"), td.dump_json(d))
    return out


def test_plan_dir(tmp):
    d = load()
    out = make_out(tmp, d)
    dec = td.decide(d, 0.05, "graph")
    paths = td.write_plan_dir(out, d, dec)
    p = subprocess.run([PLAN_TOOL, "check"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("the written plans pass mscx-plan check", p.returncode == 0 and len(paths) == 4, p.stdout)
    got = []
    for f in sorted(os.listdir(os.path.join(out, "plans"))):
        j = json.load(open(os.path.join(out, "plans", f)))
        got.append((j["collective"], j["min_message_size"], j["max_message_size"], j["name"] + ".json" == f,
                    j["mscx"]["dtypes"], j["mscx"].get("beats_nccl_window", "absent")))
    # the recording timed NCCL with a registered window for allreduce only
    every = ["fp16", "bf16", "fp32", "int32", "uint32", "fp64", "int64", "int8", "uint64", "uint8"]
    want = [("allgather", 1024, 4096, True, every, "absent"),
            ("allreduce", 1024, 32767, True, ["fp16", "bf16", "fp32", "int32", "uint32"], True),
            ("allreduce", 32768, 131072, True, ["fp16", "bf16", "fp32", "int32", "uint32"], True),
            ("allreduce", 131073, 262144, True, ["fp16", "bf16", "fp32", "int32", "uint32"], "absent")]
    check("each plan carries its range, its name, the measured dtypes only (allgather moves bytes: every dtype "
          "its candidate takes), and beats_nccl_window where the range beat the window baseline too", got == want,
          got)
    pdir = os.path.join(out, "plans")
    before = {f: open(os.path.join(pdir, f), "rb").read() for f in os.listdir(pdir)}
    open(os.path.join(out, "plans", "stale.json"), "w").write("{}")
    td.write_plan_dir(out, d, td.decide(td.load_tune(os.path.join(out, "tune.json")), 0.05, "graph"))
    after = {f: open(os.path.join(pdir, f), "rb").read() for f in os.listdir(pdir)}
    check("deciding twice writes the same bytes (and drops a stale plan)", before == after, sorted(after))
    # without the window baseline no plan says it beats NCCL's window, even one whose source said so
    nowin = copy.deepcopy(d)
    nowin["runs"] = [r for r in nowin["runs"] if r["side"] != "nccl-window"]
    src = os.path.join(out, nowin["candidates"][ONESHOT]["file"])
    marked = json.load(open(src))
    marked["mscx"]["beats_nccl_window"] = True
    td.write_atomic(src, json.dumps(marked, indent=2) + "\n")
    paths = td.write_plan_dir(out, nowin, td.decide(nowin, 0.05, "graph"))
    marks = [json.load(open(f))["mscx"].get("beats_nccl_window", "absent") for f in paths]
    check("no window baseline: beats_nccl_window left out of every plan", paths and
          all(m == "absent" for m in marks), marks)
    p = subprocess.run([PLAN_TOOL, "check"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("... and they load", p.returncode == 0, p.stdout)
    # a collective that reduces: classes that decide differently get plans with disjoint dtypes
    split = copy.deepcopy(d)
    for r in split["runs"]:
        if r["side"] == ONESHOT and r["mode"] == "graph":
            for s in ("4096", "8192", "16384"):
                r["times"]["half"][s] = [x * 3 for x in r["times"]["half"][s]]
        if r["side"] == ALLPAIRS and r["mode"] == "graph":
            for s in ("4096", "8192"):
                r["times"]["half"][s] = [x * 3 for x in r["times"]["half"][s]]
    sdec = td.decide(split, 0.05, "graph")
    ar = sorted((p["min"], p["max"], tuple(p["dtypes"])) for p in sdec["plans"] if p["coll"] == "allreduce")
    check("allreduce: one-shot 16-bit to 2K, 32-bit to 32K: plans of disjoint dtypes",
          (1024, 2048, ("fp16", "bf16")) in ar and (1024, 32767, ("fp32", "int32", "uint32")) in ar, ar)
    # a collective that moves bytes decides once, on float times: slow 16-bit times change nothing
    ag = sorted((p["min"], p["max"], tuple(p["dtypes"])) for p in sdec["plans"] if p["coll"] == "allgather")
    check("allgather: one plan to 4K for every dtype, its 16-bit times unused", ag == [(1024, 4096, tuple(every))],
          ag)
    paths = td.write_plan_dir(out, split, sdec)
    p = subprocess.run([PLAN_TOOL, "check"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("plans restricted to some dtypes load", p.returncode == 0, p.stdout)


def expect_error(name, fn, *needles):
    try:
        fn()
    except td.TuneError as e:
        msg = str(e)
        check(name, all(n in msg for n in needles), "message %r lacks %r" % (msg, needles))
        return
    check(name, False, "no error raised")


def test_corrupt(tmp):
    d = load()
    out = make_out(tmp, d)
    path = os.path.join(out, "tune.json")
    text = open(path).read()
    open(path, "w").write(text[:len(text) // 2])
    expect_error("a truncated tune.json is refused, naming the file", lambda: td.load_tune(path), path,
                 "not valid JSON")
    bad = copy.deepcopy(d)
    del bad["runs"]
    open(path, "w").write(json.dumps(bad))
    expect_error("a tune.json without runs is refused", lambda: td.load_tune(path), path, "field 'runs'")
    bad = copy.deepcopy(d)
    bad["runs"][3]["mode"] = "fast"
    open(path, "w").write(json.dumps(bad))
    expect_error("a bad run is refused with its index and field", lambda: td.load_tune(path), "runs[3]",
                 "field 'mode'")
    bad = copy.deepcopy(d)
    bad["runs"][5]["times"]["float"]["2048"] = [1.0, -2.0]
    open(path, "w").write(json.dumps(bad))
    expect_error("a negative time is refused", lambda: td.load_tune(path), "runs[5].times.float.2048",
                 "positive")
    bad = copy.deepcopy(d)
    bad["tool"] = "mscx-ab"
    open(path, "w").write(json.dumps(bad))
    expect_error("another tool's file is refused", lambda: td.load_tune(path),
                 "not an mscx-tune results file")
    td.write_atomic(path, td.dump_json(d))
    os.unlink(os.path.join(out, d["candidates"][TWOPHASE]["file"]))
    expect_error("a folder missing a candidate is refused", lambda: td.check_candidate_files(out, d),
                 TWOPHASE, "missing (partial folder?)")
    p = subprocess.run([sys.executable, TUNE, "--decide-only", "--out", out], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    check("mscx-tune --decide-only refuses the partial folder",
          p.returncode == 1 and "partial folder" in p.stderr
          and not os.path.isdir(os.path.join(out, "plans")),
          p.stdout + p.stderr)


def write_exe(path, text):
    with open(path, "w") as fh:
        fh.write(text.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
    os.chmod(path, 0o755)


def tune(tmp, out, *extra, env=None, max_size="1M"):
    perf = os.path.join(tmp, "mscx-perf")
    shim = os.path.join(tmp, "libfake.so")
    if not os.path.exists(perf):
        write_exe(perf, FAKE)
        open(shim, "w").close()
    e = dict(os.environ, FAKE_LOG=os.path.join(tmp, "perf.log"))
    e.pop("MSCX_PLAN_DIR", None)
    e.update(env or {})
    if os.path.exists(e["FAKE_LOG"]):
        os.unlink(e["FAKE_LOG"])
    cmd = [sys.executable, TUNE, "--perf", perf, "--shim", shim, "--plan-tool", PLAN_TOOL,
           "--plangen", PLANGEN, "--plans", make_plans(tmp), "--out", out, "--plotter", "gnuplot"]
    cmd += ["--max-size", max_size] if max_size else []
    p = subprocess.run(cmd + list(extra), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    runs = open(e["FAKE_LOG"]).read().splitlines() if os.path.exists(e["FAKE_LOG"]) else []
    return p, runs


def plans_of(out):
    pdir = os.path.join(out, "plans")
    return {f: open(os.path.join(pdir, f)).read() for f in sorted(os.listdir(pdir))}


def test_end_to_end(tmp):
    out = os.path.join(tmp, "e2e")
    p, runs = tune(tmp, out, "--nproc", "2")
    check("mscx-tune runs against the fake mscx-perf", p.returncode == 0, p.stdout + p.stderr)
    if p.returncode != 0:
        return
    d = td.load_tune(os.path.join(out, "tune.json"))
    dec = d["decision"]
    check("allreduce: shipped one-shot, then two-phase (the fake's crossovers)",
          ranges(dec, "allreduce") == [(ONESHOT, 1024, 32767), (TWOPHASE, 32768, 262144)],
          ranges(dec, "allreduce"))
    pl = plans_of(out)
    paths = [os.path.join(out, "plans", f) for f in pl]
    c = subprocess.run([PLAN_TOOL, "check"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("its plans pass mscx-plan check", c.returncode == 0 and len(paths) >= 3, c.stdout)
    marks = [json.loads(t)["mscx"].get("beats_nccl_window") for t in pl.values()]
    check("the window baseline was measured: every plan says it beats NCCL's window",
          marks and all(m is True for m in marks), marks)
    cands = d["candidates"]
    check("generated variants are candidates, duplicates of shipped plans are not",
          any(v["source"] == "generated" for v in cands.values())
          and "gen-allreduce-n2-rpn2-oneshot-t2" not in cands and ONESHOT in cands, sorted(cands))
    check("every candidate is timed over the whole range", all(v["min"] == 1024 and v["max"] == 1 << 20
                                                                for v in cands.values()), json.dumps(cands))
    modes = {r.split()[1] for r in runs}
    reps = sum(1 for r in runs if r == "allreduce graph nccl")
    check("eager and graph, three alternated repetitions, the window baseline",
          modes == {"eager", "graph"} and reps == 3 and "allreduce graph nccl-window" in runs, runs[:20])
    order = [r for r in runs if r.startswith("allreduce graph ")]
    k = len(order) // 3
    first = order[:k]
    check("the sides alternate, rotated by one each repetition: A B C ... B C ... A, C ... A B",
          k > 2 and order[k:2 * k] == first[1:] + first[:1] and order[2 * k:] == first[2:] + first[:2], order)
    md = open(os.path.join(out, "report.md")).read()
    check("report.md: table, crossover, machine",
          "| size |" in md and "(crossover)" in md and "Fake H200" in md and "22809" in md, md[:1500])
    if shutil.which("gnuplot"):
        png = os.path.join(out, "report.png")
        check("report.png drawn", os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              p.stderr)
    check("tune.json records margin, mode and machine",
          d["decision"]["margin"] == 0.05 and d["decision"]["mode"] == "graph" and d["machine"]["nranks"] == 2
          and d["machine"]["gpu"] == "Fake H200", json.dumps(d["machine"]))
    check("progress: a line per collective on stderr",
          all("mscx-tune: %s: " % c in p.stderr for c in ("allreduce", "allgather", "reducescatter")),
          p.stderr)

    # determinism: the same measurements make the same plans
    p2, runs2 = tune(tmp, out, "--nproc", "2", "--resume")
    check("--resume repeats no measurement", p2.returncode == 0 and runs2 == [], p2.stderr + "\n".join(runs2))
    check("--resume decides the same plans, byte for byte", plans_of(out) == pl, sorted(plans_of(out)))
    p2, runs2 = tune(tmp, out, "--nproc", "2", "--resume", "--only", "allreduce")
    check("--resume --only allreduce keeps the other collectives' results", p2.returncode == 0 and runs2 == []
          and plans_of(out) == pl, p2.stderr + "\n".join(runs2) + "\n" + "\n".join(sorted(plans_of(out))))
    out2 = os.path.join(tmp, "e2e-again")
    p3, _ = tune(tmp, out2, "--nproc", "2", "--only", "allreduce")
    check("a second run writes identical plans", p3.returncode == 0 and plans_of(out2) == {
        f: t for f, t in pl.items() if f.startswith("tune_allreduce_")}, sorted(plans_of(out2)))
    p4, _ = tune(tmp, out, "--decide-only", "--margin", "0.55")
    d4 = td.load_tune(os.path.join(out, "tune.json"))
    check("--decide-only with a larger margin keeps only the big wins",
          p4.returncode == 0 and ranges(d4["decision"], "allreduce") == [(ONESHOT, 1024, 4096)],
          p4.stderr + json.dumps(ranges(d4["decision"], "allreduce")))


def test_failures(tmp):
    out = os.path.join(tmp, "wrong")
    hang = "gen-allreduce-n2-rpn2-twophase-t1"
    p, _ = tune(tmp, out, "--nproc", "2", "--only", "allreduce", "--reps", "1", "--run-timeout", "3",
                env={"FAKE_WRONG": ONESHOT, "FAKE_UNROUTED": TWOPHASE,
                     "FAKE_FAIL": "gen-allreduce-n2-rpn2-oneshot-b1", "FAKE_HANG": hang})
    d = td.load_tune(os.path.join(out, "tune.json")) if p.returncode == 0 else None
    check("wrong results, a failed run and an unproven route", d is not None, p.stdout + p.stderr)
    if d is None:
        return
    rs = ranges(d["decision"], "allreduce")
    check("none of them is routed", all(c not in (ONESHOT, TWOPHASE, "gen-allreduce-n2-rpn2-oneshot-b1")
                                        for c, _, _ in rs), rs)
    check("the wrong results are reported",
          "%s eager: wrong" % ONESHOT in p.stderr and "not routed" in p.stderr,
          p.stderr)
    hung = [r for r in d["runs"] if r["side"] == hang]
    check("a run past --run-timeout is ended and its candidate dropped",
          len(hung) == 1 and hung[0]["status"] == "failed" and "timed out" in hung[0].get("note", ""),
          json.dumps(hung))
    check("--only: only allreduce ran", set(d["sizes"]) == {"allreduce"}, sorted(d["sizes"]))
    t = [r for r in d["runs"] if r["side"] == TWOPHASE]
    check("the unrouted candidate's times count as not measured",
          t and all(v is None for r in t for per in r["times"].values() for v in per.values()),
          json.dumps(t)[:500])
    # no window in this NCCL: NCCL alone is the baseline
    out = os.path.join(tmp, "nowin")
    p, runs = tune(tmp, out, "--nproc", "2", "--only", "allreduce", "--reps", "1",
                   env={"FAKE_NO_WINDOW": "1"})
    d = td.load_tune(os.path.join(out, "tune.json"))
    check("no window: said once, NCCL is the baseline", p.returncode == 0 and "nccl-window eager: unavailable"
          in p.stderr and d["decision"]["collectives"]["allreduce"]["baselines"] == ["nccl"]
          and runs.count("allreduce eager nccl") == 2 and runs.count("allreduce graph nccl") == 1,
          p.stderr + "\n".join(runs))
    marks = [json.loads(t)["mscx"].get("beats_nccl_window", "absent") for t in plans_of(out).values()]
    check("no window: its plans leave beats_nccl_window out", marks and all(m == "absent" for m in marks),
          marks)
    # a folder with some runs missing: --resume runs exactly those
    path = os.path.join(out, "tune.json")
    d["runs"] = [r for r in d["runs"] if r["side"] != ONESHOT]
    td.write_atomic(path, td.dump_json(d))
    p, runs = tune(tmp, out, "--nproc", "2", "--only", "allreduce", "--reps", "1", "--resume",
                   env={"FAKE_NO_WINDOW": "1"})
    check("--resume runs only what is missing", p.returncode == 0 and runs == [
        "allreduce eager " + ONESHOT, "allreduce graph " + ONESHOT], p.stderr + "\n".join(runs))
    # the budget (spent before the first run): no run, the decision uses what there is
    out = os.path.join(tmp, "budget")
    p, runs = tune(tmp, out, "--nproc", "2", "--budget", "0.001")
    d = td.load_tune(os.path.join(out, "tune.json")) if os.path.exists(os.path.join(out, "tune.json")) else {}
    check("--budget stops new runs and says so", p.returncode == 0 and runs == [] and "budget" in p.stderr
          and any("budget" in n for n in d.get("notes", [])), p.stderr + "\n".join(runs))
    check("... and routes nothing it could not compare", d.get("decision", {}).get("plans") == [],
          json.dumps(d.get("decision", {}).get("plans")))
    # several GPUs through a launcher: the settings travel through env on the launched command
    launcher = os.path.join(tmp, "fake-mpirun")
    with open(launcher, "w") as fh:
        fh.write(LAUNCHER)
    os.chmod(launcher, 0o755)
    out = os.path.join(tmp, "launcher")
    p, runs = tune(tmp, out, "--launcher", launcher + " -np 2", "--ranks", "2", "--only", "allgather",
                   "--reps", "1")
    d = td.load_tune(os.path.join(out, "tune.json")) if p.returncode == 0 else {}
    check("--launcher: candidates reach the shim side",
          p.returncode == 0 and any("allpairs" in r for r in runs)
          and ranges(d["decision"], "allgather")[:1] == [(ALLPAIRS, 1024, 16384)],
          p.stderr + "\n".join(runs) + json.dumps(d.get("decision", {}).get("collectives", {})))
    p = subprocess.run([sys.executable, TUNE, "--launcher", "mpirun -np 2"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    check("--launcher without --ranks is refused", p.returncode == 2 and "--ranks" in p.stderr, p.stderr)


# ---------------------------------------------------------------- in process (mscx-tune --executor N)

def test_exec_decision():
    d = td.load_tune(EXEC_DATA)
    g = td.decide(d, 0.05, "graph")
    check("executor graph: one-shot to 16K, two-phase to the t8 variant's 256K, t8 to 1M",
          ranges(g, "allreduce") == [(X_ONE, 1024, 16384), (X_TWO, 16385, 262143), (X_T8, 262144, 1048576)],
          ranges(g, "allreduce"))
    check("executor graph: a plan with no 16-bit times is left out of the 16-bit class, not the class",
          ranges(g, "allreduce", "16") == [(X_ONE, 1024, 16384), (X_TWO, 16385, 1048576)],
          ranges(g, "allreduce", "16"))
    check("executor: the reference is the fastest plan, no NCCL baseline",
          g["collectives"]["allreduce"]["baselines"] == [] and "no NCCL" in g["against"], json.dumps(g)[:300])
    e = td.decide(d, 0.05, "eager")
    check("executor eager: two-phase wins 16K, one-shot keeps (8K, 16K)",
          ranges(e, "allreduce")[:2] == [(X_ONE, 1024, 16383), (X_TWO, 16384, 262143)],
          ranges(e, "allreduce"))
    check("executor: allgather's generated variant to 64K and the interval to 128K",
          ranges(g, "allgather") == [(X_AP2, 1024, 131071), (X_AP, 131072, 1048576)], ranges(g, "allgather"))
    check("executor: the margin does not apply (no NCCL to stay on)",
          td.decide(d, 0.5, "graph")["collectives"] == g["collectives"], ranges(td.decide(d, 0.5, "graph"),
                                                                                "allreduce"))
    pts = g["collectives"]["allreduce"]["classes"]["32"]["points"]
    check("executor: one outlier run does not flip 4K",
          [p["choice"] for p in pts if p["size"] == 4096] == [X_ONE], json.dumps(pts[2]))
    used = {p["candidate"] for p in g["plans"]}
    check("executor: the fastest plan, with a run of wrong results, is never routed",
          X_WRONG not in used and g["collectives"]["allreduce"]["disqualified"] == [X_WRONG], sorted(used))
    ok = copy.deepcopy(d)
    ok["runs"] = [r for r in ok["runs"] if r["status"] == "ok"]
    check("... and takes every size once that run is gone",
          ranges(td.decide(ok, 0.05, "graph"), "allreduce") == [(X_WRONG, 1024, 1048576)],
          ranges(td.decide(ok, 0.05, "graph"), "allreduce"))
    check("executor: the plan files say choice, not tune",
          g["plans"] and all(p["file"].startswith("choice_allgather_n8_rpn8_") or
                             p["file"].startswith("choice_allreduce_n8_rpn8_") for p in g["plans"]),
          [p["file"] for p in g["plans"]])
    md = td.report_md(d, g)
    check("executor report: labelled a choice among mscx plans, NCCL not measured",
          md.startswith("# mscx-tune report: " + td.INPROC_LABEL) and "NCCL was not measured" in md
          and "nccl us" not in md and "| NCCL |" not in md, md[:800])
    twin = copy.deepcopy(d)
    twin["runs"] += [dict(copy.deepcopy(r), side="aaa-twin") for r in twin["runs"] if r["side"] == X_AP2]
    twin["candidates"]["aaa-twin"] = dict(twin["candidates"][X_AP2])
    rt = ranges(td.decide(twin, 0.05, "graph"), "allgather")
    check("executor: a tie between plans goes to the first name", rt[:1] == [("aaa-twin", 1024, 131071)],
          rt)
    bad = copy.deepcopy(d)
    bad["runs"][0] = dict(bad["runs"][0], side="nccl")
    expect_error("an in-process tune.json with an NCCL run is refused", lambda: td.check_tune(bad, "x.json"),
                 "runs[0]", "listed candidate")
    bad = copy.deepcopy(d)
    bad["config"]["executor"] = 4
    expect_error("an executor rank count that is not nranks is refused", lambda: td.check_tune(bad, "x.json"),
                 "field 'executor'")


def test_exec_plan_dir(tmp):
    """The in-process decision's plan folder, from 8-rank candidates made by mscx-plangen."""
    d = td.load_tune(EXEC_DATA)
    out = os.path.join(tmp, "out")
    gen = {X_ONE: ("allreduce", "oneshot", []), X_TWO: ("allreduce", "twophase", []),
           X_T8: ("allreduce", "twophase", ["--tbs-per-peer", "8", "--threads-per-block", "1024"]),
           X_WRONG: ("allreduce", "oneshot", ["--blocks", "1"]), X_AP: ("allgather", "allpairs", []),
           X_AP2: ("allgather", "allpairs", ["--tbs-per-peer", "2", "--threads-per-block", "1024"])}
    for name, c in d["candidates"].items():
        path = os.path.join(out, c["file"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        coll, algo, extra = gen[name]
        subprocess.run([PLANGEN, "--coll", coll, "--algo", algo, "--ranks", "8", "--min-size", "1K",
                        "--max-size", "1M", "--name", name, "-o", path, "--quiet"] + extra, check=True)
        c["sha256"] = td.sha256_file(path)
    dec = td.decide(d, 0.05, "graph")
    paths = td.write_plan_dir(out, d, dec)
    p = subprocess.run([PLAN_TOOL, "check"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("executor: the written 8-rank plans pass mscx-plan check", p.returncode == 0 and len(paths) >= 5,
          p.stdout)
    label = os.path.join(out, "plans", td.LABEL_FILE)
    check("executor: the plan folder carries its label",
          os.path.isfile(label) and td.INPROC_LABEL in open(label).read(), sorted(os.listdir(out + "/plans")))
    ar = sorted((j["min_message_size"], j["max_message_size"], j["mscx"]["dtypes"]) for j in
                (json.load(open(f)) for f in paths) if j["collective"] == "allreduce")
    check("executor: no plan says it beats NCCL's window (NCCL was not measured)",
          all("beats_nccl_window" not in json.load(open(f))["mscx"] for f in paths), paths)
    check("executor: allreduce files by range and dtypes", ar == [
        (1024, 16384, ["fp16", "bf16", "fp32", "int32", "uint32"]),
        (16385, 262143, ["fp32", "int32", "uint32"]), (16385, 1048576, ["fp16", "bf16"]),
        (262144, 1048576, ["fp32", "int32", "uint32"])], ar)
    nd = td.load_tune(DATA)
    nd["runs"] = []
    td.write_plan_dir(out, nd, td.decide(nd, 0.05, "graph"))
    check("a decision against NCCL in the same folder drops the label and the in-process plans",
          os.listdir(os.path.join(out, "plans")) == [], sorted(os.listdir(os.path.join(out, "plans"))))


def test_exec_end_to_end(tmp):
    out = os.path.join(tmp, "exec")
    p, runs = tune(tmp, out, "--executor", "2", env={"FAKE_NO_HALF": GEN_B4})
    check("mscx-tune --executor 2 runs against the fake mscx-perf", p.returncode == 0, p.stdout + p.stderr)
    if p.returncode != 0:
        return
    d = td.load_tune(os.path.join(out, "tune.json"))
    ar = ranges(d["decision"], "allreduce")
    check("executor: one-shot, then two-phase, then the fastest generated plan (the fake's times)",
          ar[:2] == [(ONESHOT, 1024, 32767), (TWOPHASE, 32768, 524287)] and len(ar) == 3
          and ar[2][0].startswith("gen-allreduce-n2-rpn2-") and ar[2][1:] == (524288, 1048576), ar)
    check("executor: every run in process, no NCCL side",
          runs and all(r.split()[3:] == ["executor2"] for r in runs) and
          not any(r["side"] in td.BASELINES for r in d["runs"]) and d["config"]["executor"] == 2,
          "\n".join(runs[:10]))
    sides = {r["side"] for r in d["runs"] if r["coll"] == "allreduce"}
    check("executor: shipped and generated candidates are timed",
          ONESHOT in sides and TWOPHASE in sides and GEN_B4 in sides, sorted(sides))
    b4 = [r for r in d["runs"] if r["side"] == GEN_B4]
    check("executor: n/a sizes count as not measured",
          b4 and all(v is None for r in b4 for v in r["times"]["half"].values()), json.dumps(b4)[:300])
    pl = plans_of(out)
    check("executor: the plan folder is labelled and its plans pass mscx-plan check",
          td.INPROC_LABEL in pl.get(td.LABEL_FILE, "") and all(f.startswith("choice_") for f in pl
                                                               if f.endswith(".json"))
          and subprocess.run([PLAN_TOOL, "check"] + [os.path.join(out, "plans", f) for f in pl
                                                     if f.endswith(".json")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0,
          sorted(pl))
    md = open(os.path.join(out, "report.md")).read()
    check("executor: report.md says what it is", td.INPROC_LABEL in md and "(crossover)" in md, md[:600])
    check("executor: stdout says what it is", td.INPROC_LABEL in p.stdout, p.stdout)
    if shutil.which("gnuplot"):
        png = os.path.join(out, "report.png")
        check("executor: report.png drawn",
              os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p.stderr)
    p7, _ = tune(tmp, os.path.join(tmp, "exec-top"), "--executor", "2", "--only", "allgather", "--reps", "1",
                 "--no-generate", max_size=None)
    d7 = td.load_tune(os.path.join(tmp, "exec-top", "tune.json")) if p7.returncode == 0 else {"sizes": {}}
    check("without --max-size the sizes reach the largest a candidate covers (512K)",
          d7["sizes"].get("allgather", [0])[-1] == 512 << 10, (p7.stderr, d7["sizes"]))
    p6, runs6 = tune(tmp, os.path.join(tmp, "exec-noshim"), "--executor", "2", "--only", "allgather",
                     "--reps", "1", "--shim", os.path.join(tmp, "no-such-shim.so"))
    check("executor: the shim is not needed", p6.returncode == 0 and runs6, p6.stderr)
    p2, runs2 = tune(tmp, out, "--executor", "2", "--resume", env={"FAKE_NO_HALF": GEN_B4})
    check("executor: --resume repeats no measurement and decides the same plans",
          p2.returncode == 0 and runs2 == [] and plans_of(out) == pl, p2.stderr + "\n".join(runs2))
    p3, runs3 = tune(tmp, out, "--nproc", "2", "--resume", "--only", "allreduce")
    check("--resume refuses to mix in-process runs with runs against NCCL",
          p3.returncode == 1 and "executor" in p3.stderr and runs3 == [], p3.stderr)
    out2 = os.path.join(tmp, "exec-wrong")
    p4, _ = tune(tmp, out2, "--executor", "2", "--only", "allreduce", "--reps", "1",
                 env={"FAKE_WRONG": ONESHOT})
    d4 = td.load_tune(os.path.join(out2, "tune.json")) if p4.returncode == 0 else {"decision": None}
    check("executor --only: wrong results keep the plan off, other collectives untouched",
          p4.returncode == 0 and set(d4["sizes"]) == {"allreduce"}
          and all(c != ONESHOT for c, _, _ in ranges(d4["decision"], "allreduce")), p4.stderr)
    p5, runs5 = tune(tmp, os.path.join(tmp, "exec-budget"), "--executor", "2", "--budget", "0.001")
    check("executor --budget: no run, said so", p5.returncode == 0 and runs5 == [] and "budget" in p5.stderr,
          p5.stderr)
    for bad in (["--executor", "1"], ["--executor", "8", "--nproc", "2"], ["--executor", "4", "--ranks", "2"],
                ["--executor", "2", "--launcher", "mpirun -np 2"]):
        q = subprocess.run([sys.executable, TUNE] + bad, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        check("refused: %s" % " ".join(bad), q.returncode == 2 and "--executor" in q.stderr, q.stderr)


def main():
    tmp = tempfile.mkdtemp(prefix="mscx-tune-test-")
    try:
        test_decision_recorded()
        test_margin_and_ties()
        test_noise()
        test_ranges_meet()
        test_ranges_meet(EXEC_DATA)
        test_exec_decision()
        for f in (test_plan_dir, test_corrupt, test_end_to_end, test_failures, test_exec_plan_dir,
                  test_exec_end_to_end):
            sub = os.path.join(tmp, f.__name__)
            os.makedirs(sub)
            f(sub)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.done()


if __name__ == "__main__":
    sys.exit(main())
