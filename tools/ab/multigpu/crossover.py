#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""crossover.py: read the mscx-ab result directories of a multi-GPU sweep,
print per (collective, ranks) the largest message size up to which mscx is not
slower than NCCL (the crossover), suggest new upper bounds for the shipped
plans, and check the targets for 8 ranks in graph mode.

  tools/ab/multigpu/crossover.py SWEEP_DIR [--plan-dir plans] [--json OUT.json]
                              [--tol 0.0] [--require-targets] [--build BUILD]

SWEEP_DIR is searched recursively for mscx-ab output directories (a-K.json =
NCCL side, b-K.json = mscx side, as tools/ab/mscx-ab writes them). Each run's
JSON names its collective, rank count, dtype and graph mode, so directory
names do not matter. Times are mscx-ab's: the median over runs of the
out-of-place time per size.

Crossover of one (collective, ranks, dtype, mode): the largest swept size S
such that mscx is not slower (mscx <= NCCL * (1 + tol)) at every swept size
from the smallest up to S. The suggested plan bound of a (collective, ranks)
is the smallest crossover over its dtypes and modes, because the shim routes
by size alone. When mscx is not slower up to the largest size a shipped plan
routes, the bound is "limited by the plan range": above it both sides ran
NCCL and nothing was learned.

Nothing under plans/ or tools/ is changed: the suggestion goes to --json and
the command to apply it is printed. Exit status: 0 all checked targets pass,
1 a target failed (or, with --require-targets, was not run), 2 bad input.
"""
import argparse
import glob
import json
import os
import re
import sys

COLLS = ("allreduce", "allgather", "reducescatter")
K = 1024
M = 1024 * 1024


class InputError(Exception):
    pass


def fmt_size(b):
    if b is None:
        return "-"
    for unit, div in (("G", 1 << 30), ("M", M), ("K", K)):
        if b >= div and b % div == 0:
            return "%d%s" % (b // div, unit)
    return str(b)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise InputError("cannot read %s: %s" % (path, e))


def _side(files, key):
    """Per-run {size: time} of one side, the run metadata, and wrong-count facts."""
    runs, meta, wrong, unchecked = [], None, 0, 0
    for f in files:
        d = _load(f)
        if d.get("tool") != "mscx-perf" or "results" not in d:
            raise InputError("%s is not mscx-perf JSON" % f)
        rows = d["results"]
        if not rows:
            raise InputError("%s has no results" % f)
        types = sorted({r.get("type") for r in rows})
        if len(types) != 1:
            raise InputError("%s mixes datatypes %s; run one dtype per mscx-ab call" % (f, types))
        m = {"collective": d.get("collective"), "nranks": int(d.get("nranks", 0)), "dtype": types[0],
             "mode": "graph" if int(d.get("config", {}).get("graph", 0) or 0) > 0 else "eager"}
        if meta is None:
            meta = m
        elif m != meta:
            raise InputError("%s is a different configuration (%s) from its directory's other runs (%s)" % (f, m, meta))
        t = {}
        for r in rows:
            t.setdefault(int(r["size"]), float(r[key]["time_us"]))
            for s in ("out_of_place", "in_place"):
                w = r.get(s, {}).get("wrong")
                if w is None:
                    unchecked += 1
                else:
                    wrong += int(w)
        if d.get("wrong") is None:
            unchecked += 1
        else:
            wrong = max(wrong, int(d["wrong"]))
        runs.append(t)
    return runs, meta, wrong, unchecked


def load_ab_dir(d, key="out_of_place"):
    """One mscx-ab output directory -> a result record."""
    a_files = sorted(glob.glob(os.path.join(d, "a-*.json")))
    b_files = sorted(glob.glob(os.path.join(d, "b-*.json")))
    if not a_files or not b_files:
        raise InputError("%s: needs both a-*.json (NCCL) and b-*.json (mscx)" % d)
    a_runs, a_meta, a_wrong, a_unch = _side(a_files, key)
    b_runs, b_meta, b_wrong, b_unch = _side(b_files, key)
    if a_meta != b_meta:
        raise InputError("%s: NCCL and mscx sides differ: %s vs %s" % (d, a_meta, b_meta))
    if a_meta["collective"] not in COLLS:
        raise InputError("%s: unknown collective %r" % (d, a_meta["collective"]))
    sizes = sorted(set.intersection(*[set(r) for r in a_runs + b_runs]))
    if not sizes:
        raise InputError("%s: no size common to every run" % d)
    rec = dict(a_meta)
    rec.update(dir=d, sizes=sizes,
               nccl={s: median([r[s] for r in a_runs]) for s in sizes},
               mscx={s: median([r[s] for r in b_runs]) for s in sizes},
               wrong=a_wrong + b_wrong, unchecked=a_unch + b_unch, runs=len(b_runs))
    return rec


def find_ab_dirs(root):
    out = []
    for dirpath, _dirs, files in os.walk(root):
        if any(re.fullmatch(r"b-\d+\.json", f) for f in files):
            out.append(dirpath)
    return sorted(out)


PLAN_RE = re.compile(r"^(allreduce|allgather|reducescatter)_n(\d+)_rpn(\d+)_([A-Za-z0-9]+)_(\w+?)_(\w+)\.json$")


def load_plans(plan_dir):
    """Single-node shipped plans: [{file, collective, nranks, algo, min, max}]."""
    plans = []
    if not plan_dir:
        return plans
    if not os.path.isdir(plan_dir):
        raise InputError("plan directory %s does not exist" % plan_dir)
    for f in sorted(os.listdir(plan_dir)):
        m = PLAN_RE.match(f)
        if not m:
            continue
        n, rpn = int(m.group(2)), int(m.group(3))
        if n != rpn:
            continue  # multi-node plans are not what a one-host sweep measures
        d = _load(os.path.join(plan_dir, f))
        try:
            lo, hi = int(d["min_message_size"]), int(d["max_message_size"])
        except (KeyError, TypeError, ValueError):
            raise InputError("%s has no min_message_size/max_message_size" % f)
        plans.append({"file": f, "collective": m.group(1), "nranks": n, "algo": m.group(4), "min": lo, "max": hi})
    return plans


def routed_max(plans, coll, nranks):
    his = [p["max"] for p in plans if p["collective"] == coll and p["nranks"] == nranks]
    return max(his) if his else None


def is_routed(plans, coll, nranks, size):
    return any(p["min"] <= size <= p["max"] for p in plans if p["collective"] == coll and p["nranks"] == nranks)


def crossover(rec, tol):
    """(crossover size or None, first size where mscx is slower or None)."""
    best = None
    for s in rec["sizes"]:
        if rec["mscx"][s] > rec["nccl"][s] * (1.0 + tol):
            return best, s
        best = s
    return best, None


def analyse(recs, plans, tol):
    per_cfg, groups = [], {}
    for r in recs:
        x, slower = crossover(r, tol)
        pmax = routed_max(plans, r["collective"], r["nranks"])
        limited = pmax is not None and slower is None or (pmax is not None and x is not None and x >= pmax)
        item = {"collective": r["collective"], "nranks": r["nranks"], "dtype": r["dtype"], "mode": r["mode"],
                "crossover_bytes": x, "first_slower_bytes": slower,
                "limited_by_plan_range": bool(limited), "dir": r["dir"]}
        per_cfg.append(item)
        groups.setdefault((r["collective"], r["nranks"]), []).append(item)
    suggested = []
    for (coll, n), items in sorted(groups.items()):
        xs = [i["crossover_bytes"] or 0 for i in items]
        bound = min(xs)
        pmax = routed_max(plans, coll, n)
        if pmax is not None and bound >= pmax:
            bound = pmax
        entry = {"collective": coll, "nranks": n, "suggested_max_bytes": bound,
                 "current_max_bytes": pmax, "limited_by_plan_range": all(i["limited_by_plan_range"] for i in items),
                 "configs": len(items), "plans": []}
        for p in plans:
            if p["collective"] != coll or p["nranks"] != n:
                continue
            if p["min"] > bound:
                new = None  # the whole range is where NCCL is faster: do not ship it
            else:
                new = min(p["max"], bound)
            entry["plans"].append({"file": p["file"], "algo": p["algo"], "min": p["min"], "max": p["max"],
                                   "suggested_max": new})
        suggested.append(entry)
    return per_cfg, suggested


# ---------------------------------------------------------------- targets

def _within(rec, lo, hi, per_rank=False):
    out = []
    for s in rec["sizes"]:
        v = s // rec["nranks"] if per_rank else s
        if lo <= v <= hi:
            out.append(s)
    return out


def check_targets(recs, plans, nranks=8):
    """[(name, status, detail)], status PASS, FAIL or NOT RUN. Graph mode, nranks ranks."""
    res = []

    def pick(coll):
        return [r for r in recs if r["collective"] == coll and r["nranks"] == nranks and r["mode"] == "graph"]

    def latency(name, coll, lo, hi, limit, per_rank=False):
        rs = pick(coll)
        bad, seen = [], 0
        for r in rs:
            for s in _within(r, lo, hi, per_rank):
                seen += 1
                if r["mscx"][s] > limit:
                    bad.append("%s %s %.2f us" % (r["dtype"], fmt_size(s), r["mscx"][s]))
        if not seen:
            res.append((name, "NOT RUN", "no %d-rank graph-mode %s result in range" % (nranks, coll)))
        elif bad:
            res.append((name, "FAIL", "; ".join(bad)))
        else:
            worst = max(r["mscx"][s] for r in rs for s in _within(r, lo, hi, per_rank))
            res.append((name, "PASS", "worst %.2f us over %d points" % (worst, seen)))

    latency("AllReduce 1-16 KB <= 5 us", "allreduce", K, 16 * K, 5.0)
    latency("AllReduce 32-64 KB <= 7 us", "allreduce", 32 * K, 64 * K, 7.0)
    latency("AllReduce 256 KB <= 11 us", "allreduce", 256 * K, 256 * K, 11.0)
    latency("AllReduce 1 MB <= 16 us", "allreduce", M, M, 16.0)

    rs = pick("allreduce")
    bad, seen, worst = [], 0, None
    for r in rs:
        for s in _within(r, K, 64 * K):
            seen += 1
            sp = r["nccl"][s] / r["mscx"][s] if r["mscx"][s] > 0 else 0.0
            worst = sp if worst is None else min(worst, sp)
            if sp < 3.0:
                bad.append("%s %s %.2fx" % (r["dtype"], fmt_size(s), sp))
    name = "AllReduce >= 3x faster than NCCL up to 64 KB"
    res.append((name, "NOT RUN", "no 8-rank graph-mode allreduce result") if not seen else
               (name, "FAIL", "; ".join(bad)) if bad else (name, "PASS", "slowest speedup %.2fx" % worst))

    bad, seen = [], 0
    for r in rs:
        for s in r["sizes"]:
            if not is_routed(plans, "allreduce", nranks, s):
                continue
            seen += 1
            if r["mscx"][s] > r["nccl"][s]:
                bad.append("%s %s mscx %.2f > nccl %.2f us" % (r["dtype"], fmt_size(s), r["mscx"][s], r["nccl"][s]))
    name = "AllReduce never slower than NCCL where routed"
    res.append((name, "NOT RUN", "no routed 8-rank graph-mode allreduce size (plans given?)") if not seen else
               (name, "FAIL", "; ".join(bad)) if bad else (name, "PASS", "%d routed points" % seen))

    latency("AllGather 1-64 KB per rank <= 5 us", "allgather", K, 64 * K, 5.0, per_rank=True)
    latency("ReduceScatter 1-64 KB per rank <= 5 us", "reducescatter", K, 64 * K, 5.0, per_rank=True)

    wrong = sum(r["wrong"] for r in recs)
    unchecked = sum(r["unchecked"] for r in recs)
    name = "Zero wrong results in every run"
    if not recs:
        res.append((name, "NOT RUN", "no results"))
    elif wrong or unchecked:
        res.append((name, "FAIL", "%d wrong, %d unchecked result(s)" % (wrong, unchecked)))
    else:
        res.append((name, "PASS", "%d configurations, all checked" % len(recs)))
    return res


def apply_command(build):
    exe = os.path.join(build, "tools", "mscx-plangen")
    return ("edit the pg_shipped table in tools/cli/mscx_plangen.c (set each entry's max to suggested_max; "
            "remove entries whose suggested_max is null), then:\n"
            "  ninja -C %s && %s --all plans && meson test -C %s plans-fresh plans\n"
            "  (plans-fresh also needs plans/meson.build to list exactly the new file names)" % (build, exe, build))


def main(argv):
    ap = argparse.ArgumentParser(prog="crossover.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir")
    ap.add_argument("--plan-dir", default="plans", help="shipped plans, for the routed ranges (default plans)")
    ap.add_argument("--json", help="write crossovers and suggested bounds here")
    ap.add_argument("--tol", type=float, default=0.0, help="mscx may be this fraction slower and still count (default 0)")
    ap.add_argument("--require-targets", action="store_true", help="a target that was not run counts as failed")
    ap.add_argument("--build", default="build", help="build directory named in the printed command")
    ap.add_argument("--failures", help="file listing failed sweep steps (one a line); any line fails 'zero wrong'")
    args = ap.parse_args(argv)
    try:
        dirs = find_ab_dirs(args.sweep_dir)
        if not dirs:
            raise InputError("no mscx-ab result (b-*.json) under %s" % args.sweep_dir)
        recs = [load_ab_dir(d) for d in dirs]
        plans = load_plans(args.plan_dir)
    except InputError as e:
        sys.stderr.write("crossover.py: FAILED: %s\n" % e)
        return 2

    per_cfg, suggested = analyse(recs, plans, args.tol)
    print("## Crossovers (largest size from the smallest up where mscx <= NCCL x %.3g)" % (1 + args.tol))
    print("| collective | ranks | dtype | mode | crossover | first slower | note |")
    print("|---|---:|---|---|---:|---:|---|")
    for i in sorted(per_cfg, key=lambda i: (i["collective"], i["nranks"], i["dtype"], i["mode"])):
        print("| %s | %d | %s | %s | %s | %s | %s |" % (
            i["collective"], i["nranks"], i["dtype"], i["mode"], fmt_size(i["crossover_bytes"]) if
            i["crossover_bytes"] else "none", fmt_size(i["first_slower_bytes"]),
            "limited by plan range" if i["limited_by_plan_range"] else ""))
    print()
    print("## Suggested plan upper bounds (min over dtypes and modes)")
    for s in suggested:
        print("%s n=%d: route up to %s (now %s)%s" % (
            s["collective"], s["nranks"], fmt_size(s["suggested_max_bytes"]) if s["suggested_max_bytes"] else
            "nothing", fmt_size(s["current_max_bytes"]), "; limited by the plan range: extend the plans and "
            "re-measure to learn more" if s["limited_by_plan_range"] else ""))
        for p in s["plans"]:
            if p["suggested_max"] == p["max"]:
                continue
            print("    %s: max %s -> %s" % (p["file"], fmt_size(p["max"]),
                                           fmt_size(p["suggested_max"]) if p["suggested_max"] else "drop"))
    changed = any(p["suggested_max"] != p["max"] for s in suggested for p in s["plans"])
    print()
    print("To apply: " + apply_command(args.build) if changed else "The shipped plan bounds need no change.")

    targets = check_targets(recs, plans)
    if args.failures and os.path.exists(args.failures):
        with open(args.failures) as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
        if lines:
            targets = [t if t[0] != "Zero wrong results in every run" else
                       (t[0], "FAIL", "%d failed step(s), see %s; %s" % (len(lines), args.failures, t[2]))
                       for t in targets]
    print()
    print("## Targets (8 ranks, graph mode)")
    failed = 0
    for name, status, detail in targets:
        print("%-8s %s: %s" % (status, name, detail))
        if status == "FAIL" or (status == "NOT RUN" and args.require_targets):
            failed += 1
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"tool": "crossover.py", "version": 1, "tolerance": args.tol, "plan_dir": args.plan_dir,
                       "crossovers": per_cfg, "suggested": suggested,
                       "targets": [{"name": n, "status": s, "detail": d} for n, s, d in targets],
                       "apply": apply_command(args.build) if changed else None}, fh, indent=1, sort_keys=True)
            fh.write("\n")
        print("wrote %s" % args.json)
    print("targets: %d failed%s" % (failed, " (not run counts as failed)" if args.require_targets else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
