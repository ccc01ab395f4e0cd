#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Unit test of tools/ab/multigpu/crossover.py on small synthetic mscx-ab results.
Prints 'N passed, M failed'; exit 1 on any failure."""
import contextlib
import io
import json
import os
import sys
import tempfile

ROOT = os.environ.get("MSCX_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "ab", "multigpu"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
import crossover as cx  # noqa: E402
import pycheck  # noqa: E402

K, M = 1024, 1024 * 1024
SIZES = [K << i for i in range(11)]  # 1K .. 1M


def perf_json(coll, n, dtype, graph, times, wrong=0):
    rows = [{"size": s, "count": s // 4, "type": dtype, "redop": "sum", "root": -1,
             "out_of_place": {"time_us": t, "algbw": 0.0, "busbw": 0.0, "wrong": wrong if i == 0 else 0},
             "in_place": {"time_us": t, "algbw": 0.0, "busbw": 0.0, "wrong": 0}}
            for i, (s, t) in enumerate(sorted(times.items()))]
    return {"tool": "mscx-perf", "version": 1, "collective": coll, "backend": "nccl", "nranks": n,
            "config": {"graph": 10 if graph else 0}, "results": rows, "wrong": wrong, "avg_busbw": 0.0}


def write_ab(root, name, coll, n, dtype, graph, nccl_runs, mscx_runs, wrong=0):
    d = os.path.join(root, name)
    os.makedirs(d)
    for k, t in enumerate(nccl_runs):
        with open(os.path.join(d, "a-%d.json" % k), "w") as fh:
            json.dump(perf_json(coll, n, dtype, graph, t), fh)
    for k, t in enumerate(mscx_runs):
        with open(os.path.join(d, "b-%d.json" % k), "w") as fh:
            json.dump(perf_json(coll, n, dtype, graph, t, wrong), fh)
    with open(os.path.join(d, "ab.md"), "w") as fh:
        fh.write("| size |\n")
    return d


def write_plans(root):
    d = os.path.join(root, "plans")
    os.makedirs(d)
    for name, lo, hi in (("allreduce_n8_rpn8_oneshot_1K_64K", K, 64 * K),
                         ("allreduce_n8_rpn8_twophase_64K_1M", 64 * K + 1, M),
                         ("allgather_n8_rpn8_allpairs_1K_64K", K, 64 * K),
                         ("allreduce_n8_rpn4_hier2_1K_64K", K, 64 * K)):
        with open(os.path.join(d, name + ".json"), "w") as fh:
            json.dump({"name": name, "min_message_size": lo, "max_message_size": hi}, fh)
    return d


def fast_until(limit, fast=2.0, nccl=10.0, slow=20.0):
    """mscx at 'fast' us up to limit bytes, 'slow' above; NCCL flat at 'nccl'."""
    return {s: nccl for s in SIZES}, {s: (fast if s <= limit else slow) for s in SIZES}


test = pycheck.Tests()


@test
def crossover_is_largest_prefix_size():
    with tempfile.TemporaryDirectory() as t:
        a, b = fast_until(256 * K)
        b[4 * K] = 2.0
        rec = cx.load_ab_dir(write_ab(t, "x", "allreduce", 8, "float", True, [a], [b]))
        assert cx.crossover(rec, 0.0) == (256 * K, 512 * K), cx.crossover(rec, 0.0)
        # slower at the smallest size: no crossover at all
        b2 = dict(b)
        b2[K] = 11.0
        rec2 = cx.load_ab_dir(write_ab(t, "y", "allreduce", 8, "float", True, [a], [b2]))
        assert cx.crossover(rec2, 0.0) == (None, K)
        # a 15% tolerance accepts 11 vs 10
        assert cx.crossover(rec2, 0.15) == (256 * K, 512 * K)


@test
def a_dip_in_the_middle_ends_the_prefix():
    with tempfile.TemporaryDirectory() as t:
        a, b = fast_until(M)
        b[16 * K] = 10.5  # slower at 16K, faster again later: the bound stops at 8K
        rec = cx.load_ab_dir(write_ab(t, "x", "allreduce", 8, "float", True, [a], [b]))
        assert cx.crossover(rec, 0.0) == (8 * K, 16 * K)


@test
def median_over_runs_drops_an_outlier():
    with tempfile.TemporaryDirectory() as t:
        a, b = fast_until(M)
        bad = dict(b)
        bad[2 * K] = 500.0
        rec = cx.load_ab_dir(write_ab(t, "x", "allreduce", 8, "float", True, [a, a, a], [b, bad, b]))
        assert rec["mscx"][2 * K] == 2.0 and rec["runs"] == 3


@test
def suggested_bound_is_min_over_dtypes_and_modes():
    with tempfile.TemporaryDirectory() as t:
        plans = cx.load_plans(write_plans(t))
        assert len(plans) == 3, plans  # the rpn4 (two-node) plan is left out
        recs = []
        a, b = fast_until(256 * K)
        recs.append(cx.load_ab_dir(write_ab(t, "f", "allreduce", 8, "float", True, [a], [b])))
        a, b = fast_until(32 * K)
        recs.append(cx.load_ab_dir(write_ab(t, "h", "allreduce", 8, "half", False, [a], [b])))
        per, sug = cx.analyse(recs, plans, 0.0)
        assert len(per) == 2 and len(sug) == 1
        s = sug[0]
        assert s["suggested_max_bytes"] == 32 * K and s["current_max_bytes"] == M
        got = {p["algo"]: p["suggested_max"] for p in s["plans"]}
        assert got == {"oneshot": 32 * K, "twophase": None}, got  # twophase starts above 64K: dropped


@test
def faster_everywhere_is_limited_by_plan_range():
    with tempfile.TemporaryDirectory() as t:
        plans = cx.load_plans(write_plans(t))
        a, b = fast_until(64 * M)
        rec = cx.load_ab_dir(write_ab(t, "f", "allreduce", 8, "float", True, [a], [b]))
        per, sug = cx.analyse([rec], plans, 0.0)
        assert per[0]["limited_by_plan_range"] and sug[0]["limited_by_plan_range"]
        assert sug[0]["suggested_max_bytes"] == M
        assert all(p["suggested_max"] == p["max"] for p in sug[0]["plans"])


@test
def targets_pass_and_fail():
    with tempfile.TemporaryDirectory() as t:
        plans = cx.load_plans(write_plans(t))
        a = {s: 40.0 for s in SIZES}
        b = {s: (4.0 if s <= 16 * K else 6.0 if s <= 64 * K else 10.0 if s <= 256 * K else 15.0) for s in SIZES}
        recs = [cx.load_ab_dir(write_ab(t, "ar", "allreduce", 8, "float", True, [a], [b]))]
        res = {n: s for n, s, _ in cx.check_targets(recs, plans)}
        assert res["AllReduce 1-16 KB <= 5 us"] == "PASS"
        assert res["AllReduce 32-64 KB <= 7 us"] == "PASS"
        assert res["AllReduce 256 KB <= 11 us"] == "PASS"
        assert res["AllReduce 1 MB <= 16 us"] == "PASS"
        assert res["AllReduce >= 3x faster than NCCL up to 64 KB"] == "PASS"
        assert res["AllReduce never slower than NCCL where routed"] == "PASS"
        assert res["AllGather 1-64 KB per rank <= 5 us"] == "NOT RUN"
        assert res["Zero wrong results in every run"] == "PASS"
        b2 = dict(b)
        b2[8 * K] = 5.5       # over 5 us
        b2[32 * K] = 14.0     # under 3x (40/14)
        a2 = dict(a)
        a2[512 * K] = 12.0    # NCCL faster at a routed size
        recs2 = [cx.load_ab_dir(write_ab(t, "ar2", "allreduce", 8, "float", True, [a2], [b2], wrong=3))]
        res2 = {n: s for n, s, _ in cx.check_targets(recs2, plans)}
        assert res2["AllReduce 1-16 KB <= 5 us"] == "FAIL"
        assert res2["AllReduce 32-64 KB <= 7 us"] == "FAIL"
        assert res2["AllReduce >= 3x faster than NCCL up to 64 KB"] == "FAIL"
        assert res2["AllReduce never slower than NCCL where routed"] == "FAIL"
        assert res2["Zero wrong results in every run"] == "FAIL"
        # eager-mode results do not count for the graph-mode targets
        recs3 = [cx.load_ab_dir(write_ab(t, "ar3", "allreduce", 8, "float", False, [a], [b]))]
        res3 = {n: s for n, s, _ in cx.check_targets(recs3, plans)}
        assert res3["AllReduce 1-16 KB <= 5 us"] == "NOT RUN"


@test
def allgather_target_uses_per_rank_size():
    with tempfile.TemporaryDirectory() as t:
        a = {s: 40.0 for s in SIZES}
        # 8 ranks: per-rank 1K..64K is 8K..512K total; 4K total (512 B per rank) is out of range
        b = {s: (4.0 if 8 * K <= s <= 512 * K else 50.0) for s in SIZES}
        recs = [cx.load_ab_dir(write_ab(t, "ag", "allgather", 8, "float", True, [a], [b]))]
        res = {n: s for n, s, _ in cx.check_targets(recs, [])}
        assert res["AllGather 1-64 KB per rank <= 5 us"] == "PASS", res
        b[512 * K] = 5.1
        recs = [cx.load_ab_dir(write_ab(t, "ag2", "allgather", 8, "float", True, [a], [b]))]
        res = {n: s for n, s, _ in cx.check_targets(recs, [])}
        assert res["AllGather 1-64 KB per rank <= 5 us"] == "FAIL"


@test
def bad_inputs_are_refused():
    with tempfile.TemporaryDirectory() as t:
        a, b = fast_until(M)
        d = write_ab(t, "mix", "allreduce", 8, "float", True, [a], [b])
        j = perf_json("allreduce", 8, "float", True, a)
        j["results"][1]["type"] = "half"
        with open(os.path.join(d, "a-0.json"), "w") as fh:
            json.dump(j, fh)
        try:
            cx.load_ab_dir(d)
            raise AssertionError("mixed dtypes accepted")
        except cx.InputError:
            pass
        d2 = write_ab(t, "diff", "allreduce", 8, "float", True, [a], [b])
        with open(os.path.join(d2, "b-0.json"), "w") as fh:
            json.dump(perf_json("allreduce", 4, "float", True, b), fh)
        try:
            cx.load_ab_dir(d2)
            raise AssertionError("NCCL/mscx sides of different rank counts accepted")
        except cx.InputError:
            pass
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cx.main([os.path.join(t, "nothing-here")]) == 2


@test
def main_writes_json_and_exit_status():
    with tempfile.TemporaryDirectory() as t:
        pdir = write_plans(t)
        sweep = os.path.join(t, "sweep")
        a, b = fast_until(256 * K, fast=3.0)
        write_ab(sweep, "allreduce-n8-float-graph", "allreduce", 8, "float", True, [a], [b])
        out = os.path.join(t, "crossovers.json")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cx.main([sweep, "--plan-dir", pdir, "--json", out, "--build", "BLD"])
        text = buf.getvalue()
        # 1 MB at 20 us fails "<= 16 us" and "never slower" (NCCL 10 us at routed 512K/1M)
        assert rc == 1, text
        assert "FAIL     AllReduce 1 MB <= 16 us" in text, text
        assert "BLD/tools/mscx-plangen --all plans" in text, text
        with open(out) as fh:
            j = json.load(fh)
        assert j["suggested"][0]["suggested_max_bytes"] == 256 * K
        tw = [p for p in j["suggested"][0]["plans"] if p["algo"] == "twophase"][0]
        assert tw["suggested_max"] == 256 * K
        # all-good data and targets not required: exit 0; required: NOT RUN fails
        sweep2 = os.path.join(t, "sweep2")
        a, b = fast_until(64 * M, fast=3.0)
        write_ab(sweep2, "x", "allreduce", 8, "float", True, [a], [b])
        with contextlib.redirect_stdout(io.StringIO()):
            assert cx.main([sweep2, "--plan-dir", pdir]) == 0
            assert cx.main([sweep2, "--plan-dir", pdir, "--require-targets"]) == 1
        fails = os.path.join(t, "failures.txt")
        with open(fails, "w") as fh:
            fh.write("allreduce n8 half graph: mscx-ab failed\n")
        with contextlib.redirect_stdout(io.StringIO()):
            assert cx.main([sweep2, "--plan-dir", pdir, "--failures", fails]) == 1


if __name__ == "__main__":
    sys.exit(test.main())
