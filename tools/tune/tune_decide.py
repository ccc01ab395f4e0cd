# SPDX-License-Identifier: MIT
"""mscx-tune's decision, its results file and its plan directory (python3 stdlib only).

Everything here is a pure function of OUT/tune.json, so the same measurements
always give the same plans, byte for byte: that is what makes every rank's
plan set identical.

Terms:
- run: one mscx-perf invocation for (collective, mode, side, repetition);
  side is "nccl", "nccl-window" or a candidate plan's name. Its "times" hold,
  per measured dtype ("half", "float") and size, [out-of-place us, in-place
  us], null where the side could not run the size or the shim's summary does
  not prove the route.
- baselines: "nccl" always; "nccl-window" (NCCL on buffers registered with
  ncclCommWindowRegister) where the installed NCCL has it.
- score of a candidate at a size against a baseline: the largest, over the
  decision's modes and both placements, of candidate median / baseline
  median. The median is over the alternated repetitions. A missing median
  scores nothing.
- a candidate qualifies at a size when its score against "nccl" is at most
  1 - margin and below 1 (with the default margin 0.05 it takes at most 95%
  of NCCL's time, in every mode decided on, in place and out of place; a tie
  never qualifies), and, where the mode not decided on was measured there,
  its score against "nccl" in that mode is at most 1 + margin (a size that
  wins eagerly but loses under graphs beyond noise, or the reverse, stays
  on NCCL). A candidate with a failed run or wrong results never qualifies.
- a measured size goes to the qualifying candidate of lowest score (ties: the
  name); the open interval between two neighbouring measured sizes goes to the
  candidate that qualifies at both of them with the lowest larger score of the
  two (ties: the name), else to NCCL. Sizes below the first and above the last
  measured size stay on NCCL.
- beating the window: where "nccl-window" is among a collective's baselines,
  the chosen candidate of a measured size beats it when its score against
  "nccl-window" also qualifies (at most 1 - margin and below 1; a missing
  median does not); an interval beats it when its candidate does at both
  ends. Ranges split where this changes.
- plan files: one per range. A range that beats the window says
  "beats_nccl_window": true in its mscx object (the shim then routes it on
  buffers in registered windows too, where NCCL may take its symmetric
  kernels); the others leave the field out, and the shim sends calls on
  registered buffers in their sizes to NCCL.

In-process mode (config "executor": N, from mscx-tune --executor N) there is no
NCCL run: the sides are the candidates alone, and the reference at a size is
the fastest candidate median there (per mode and placement). Every candidate
measured at a size qualifies (the margin does not apply), so the same rules
give each measured size to the fastest candidate by worst ratio. The plans it
writes are a choice among mscx plans, not against NCCL.
"""
import hashlib
import json
import math
import os
import re

TOOL = "mscx-tune"
VERSION = 1
# dtype class -> (the mscx-perf type that times it, the plan dtypes it decides), for a collective that reduces:
# its time depends on the element type
CLASSES = (("16", "half", ("fp16", "bf16")), ("32", "float", ("fp32", "int32", "uint32")))
CLASS_DTYPES = tuple(t for _, _, dts in CLASSES for t in dts)  # a plan that names no dtypes takes these
# a collective that only moves bytes has one class, timed with float, for every dtype its candidate takes
BYTE_CLASSES = (("any", "float", None),)
REDUCING = ("allreduce", "reducescatter")
MODES = ("eager", "graph")
PLACEMENTS = ("out_of_place", "in_place")
BASELINES = ("nccl", "nccl-window")
INPROC_LABEL = "choice among mscx plans, not against NCCL"
LABEL_FILE = "CHOICE.txt"  # in-process mode: says what the plan folder is (the shim reads *.json only)
RUN_STATUS = ("ok", "failed", "wrong", "unavailable")


class TuneError(Exception):
    pass


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return "%d%s" % (b // div, unit)
    return str(b)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def classes_of(coll):
    """The dtype classes @p coll is decided in: CLASSES where it reduces, else BYTE_CLASSES."""
    return CLASSES if coll in REDUCING else BYTE_CLASSES


def perf_types(coll):
    """The mscx-perf -d list that times the classes of @p coll."""
    return ",".join(p for _, p, _ in classes_of(coll))


def class_label(cls):
    """A class in a line of text: "16-bit", "32-bit", "every dtype"."""
    return "every dtype" if cls == BYTE_CLASSES[0][0] else "%s-bit" % cls


def class_title(cls, dts, ptype):
    """How the report names a class: "16-bit (fp16, bf16, timed with half)" or "every dtype (timed with float)"."""
    if dts is None:
        return "every dtype (timed with %s)" % ptype
    return "%s-bit (%s, timed with %s)" % (cls, ", ".join(dts), ptype)


def decision_modes(mode):
    return MODES if mode == "both" else (mode,)


def run_key(coll, mode, side, rep):
    return "%s/%s/%s/%d" % (coll, mode, side, rep)


# ---------------------------------------------------------------- the results file

def _need(cond, where, what):
    if not cond:
        raise TuneError("%s: %s" % (where, what))


def _check_times(times, where):
    _need(isinstance(times, dict), where, "'times' must be an object dtype -> {size: [oop, ip]}")
    for t, per in times.items():
        _need(isinstance(per, dict), "%s.%s" % (where, t), "expected an object size -> [oop us, in-place us]")
        for s, v in per.items():
            w = "%s.%s.%s" % (where, t, s)
            _need(re.fullmatch(r"[1-9][0-9]*", s) is not None, w, "a size must be a positive whole number")
            _need(v is None or (isinstance(v, list) and len(v) == 2), w,
                  "expected null or [oop us, in-place us]")
            for x in v or ():
                _need(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                                    and math.isfinite(x)), w, "a time must be a positive number or null")


def _check_run(r, where):
    _need(isinstance(r, dict), where, "a run must be an object")
    for k, typ in (("coll", str), ("mode", str), ("side", str), ("rep", int), ("status", str)):
        _need(isinstance(r.get(k), typ) and not isinstance(r.get(k), bool), where,
              "field '%s' missing or not a %s" % (k, typ.__name__))
    _need(r["mode"] in MODES, where, "field 'mode' must be eager or graph, not %r" % r["mode"])
    _need(r["status"] in RUN_STATUS, where, "field 'status' must be one of %s" % ", ".join(RUN_STATUS))
    _need(r["rep"] >= 0, where, "field 'rep' must be >= 0")
    _check_times(r.get("times", {}), where + ".times")


def check_tune(d, path):
    """Raise TuneError naming @p path and the field when @p d is not a complete tune.json."""
    _need(isinstance(d, dict), path, "not a JSON object")
    _need(d.get("tool") == TOOL and d.get("version") == VERSION, path,
          "not an %s results file (\"tool\": \"%s\", \"version\": %d)" % (TOOL, TOOL, VERSION))
    for k, typ in (("config", dict), ("candidates", dict), ("runs", list), ("sizes", dict)):
        _need(isinstance(d.get(k), typ), path, "field '%s' missing or not a%s %s"
              % (k, "n" if typ is list else "", "array" if typ is list else "object"))
    cfg = d["config"]
    for k in ("nranks", "ranks_per_node"):
        _need(isinstance(cfg.get(k), int) and cfg[k] >= 1, path + ": config", "field '%s' must be >= 1" % k)
    if "executor" in cfg:
        _need(isinstance(cfg["executor"], int) and cfg["executor"] >= 2 and cfg["executor"] == cfg["nranks"]
              == cfg["ranks_per_node"], path + ": config",
              "field 'executor' must be the rank count (>= 2, all on one node)")
    for coll, sizes in d["sizes"].items():
        _need(isinstance(sizes, list) and sizes and all(isinstance(s, int) and s > 0 for s in sizes)
              and sizes == sorted(set(sizes)), "%s: sizes.%s" % (path, coll),
              "expected increasing positive sizes")
    for name, c in d["candidates"].items():
        w = "%s: candidates.%s" % (path, name)
        _need(isinstance(c, dict), w, "a candidate must be an object")
        for k, typ in (("coll", str), ("file", str), ("sha256", str), ("min", int), ("max", int)):
            _need(isinstance(c.get(k), typ), w, "field '%s' missing or not a %s" % (k, typ.__name__))
        _need(isinstance(c.get("dtypes", []), list), w, "field 'dtypes' must be an array")
    seen = set()
    for i, r in enumerate(d["runs"]):
        where = "%s: runs[%d]" % (path, i)
        _check_run(r, where)
        key = run_key(r["coll"], r["mode"], r["side"], r["rep"])
        _need(key not in seen, where, "run %s appears twice" % key)
        seen.add(key)
        _need(r["side"] in d["candidates"] or (r["side"] in BASELINES and "executor" not in cfg), where,
              "side '%s' is neither a %slisted candidate" % (r["side"], "" if "executor" in cfg else
                                                             "baseline nor a "))
        _need(r["coll"] in d["sizes"], where, "collective '%s' has no 'sizes' entry" % r["coll"])


def load_tune(path):
    """The tune.json at @p path, checked; TuneError names the file and the problem."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as e:
        raise TuneError("%s: cannot read: %s" % (path, e.strerror))
    try:
        d = json.loads(text)
    except ValueError as e:
        raise TuneError("%s: not valid JSON (truncated or corrupt?): %s" % (path, e))
    check_tune(d, path)
    return d


def dump_json(obj):
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------- medians and scores

def medians(d):
    """{(coll, cls, mode, side): {size: (oop, ip) or None}} over the runs whose status is ok."""
    acc = {}
    for r in d["runs"]:
        if r["status"] != "ok":
            continue
        for cls, ptype, _ in classes_of(r["coll"]):
            for s, v in r.get("times", {}).get(ptype, {}).items():
                key = (r["coll"], cls, r["mode"], r["side"])
                acc.setdefault(key, {}).setdefault(int(s), []).append(v)
    out = {}
    for key, per in acc.items():
        out[key] = {}
        for s, vals in per.items():
            # one run that could not time the size (n/a, route unproven) leaves the size unmeasured
            if any(v is None or v[0] is None or v[1] is None for v in vals):
                out[key][s] = None
            else:
                out[key][s] = (median([v[0] for v in vals]), median([v[1] for v in vals]))
    return out


def disqualified(d, coll):
    """Candidates of @p coll with a failed or wrong run: never routed."""
    return sorted({r["side"] for r in d["runs"] if r["coll"] == coll and r["side"] not in BASELINES
                   and r["status"] in ("failed", "wrong")})


def baselines_of(d, coll):
    """The baselines measured for @p coll: nccl, and nccl-window when some run had a registered window."""
    have = {r["side"] for r in d["runs"] if r["coll"] == coll and r["status"] == "ok"}
    return [b for b in BASELINES if b in have]


def executor_mode(d):
    """The rank count of an in-process tuning (mscx-tune --executor N), else 0."""
    return int(d.get("config", {}).get("executor", 0) or 0)


def score(med, coll, cls, cand, size, modes, bases, need_all=True):
    """The candidate's worst time ratio against the fastest of @p bases; None when the candidate's time or
    (@p need_all) any reference time is missing. Without @p need_all, missing references are left out."""
    worst = None
    for mode in modes:
        c = med.get((coll, cls, mode, cand), {}).get(size)
        bs = [med.get((coll, cls, mode, b), {}).get(size) for b in bases]
        if not need_all:
            bs = [b for b in bs if b is not None]
        if c is None or not bs or any(b is None for b in bs):
            return None
        for k in range(len(PLACEMENTS)):
            r = c[k] / min(b[k] for b in bs)
            worst = r if worst is None else max(worst, r)
    return worst


def _best(scored):
    """The (score, name) pair of lowest score, ties by name; None for an empty list."""
    return min(scored) if scored else None


def beats(sc, margin):
    """Whether a score qualifies: at most 1 - @p margin and below 1 (a tie never does)."""
    return sc is not None and sc <= 1.0 - margin and sc < 1.0


def other_mode_loss(med, coll, cls, cand, size, mode, bases, margin):
    """(mode, score) when @p cand was measured at @p size in the mode not decided on and is slower there than
    the baselines by more than @p margin; else None."""
    for other in (m for m in MODES if m not in decision_modes(mode)):
        sc = score(med, coll, cls, cand, size, (other,), bases)
        if sc is not None and sc > 1.0 + margin:
            return other, sc
    return None


def merge_segments(segs):
    """[(cand, lo, hi, window)] from the segments [(lo, hi, cand, window)] in size order: the routed ones, a
    segment joined to the one before when they touch with the same candidate and window flag."""
    ranges = []
    for lo, hi, c, win in segs:
        if c is None:
            continue
        if ranges and ranges[-1][0] == c and ranges[-1][3] == win and ranges[-1][2] + 1 == lo:
            ranges[-1] = (c, ranges[-1][1], hi, win)
        else:
            ranges.append((c, lo, hi, win))
    return ranges


def decide_class(d, coll, cls, margin, mode):
    """Per measured size of @p coll: {"size", "choice", "scores"} (and "beats_nccl_window" where a candidate
    was chosen and the window baseline measured; "other_mode_losses" {cand: [mode, score]} for candidates
    that won the decision's modes and lost the other beyond the margin); and the ranges
    [(cand, lo, hi, window)],
    window: whether the range beats NCCL with a registered window (None where that was not measured)."""
    med = medians(d)
    modes = decision_modes(mode)
    dq = set(disqualified(d, coll))
    cands = sorted(n for n, c in d["candidates"].items() if c["coll"] == coll and n not in dq)
    sizes = d["sizes"].get(coll, [])
    inproc = executor_mode(d) > 0
    have = baselines_of(d, coll)
    bases = cands if inproc else ["nccl"]  # in process, the reference is the fastest candidate
    window = not inproc and "nccl-window" in have
    points, qual = [], []
    for s in sizes:
        ok = inproc or "nccl" in have
        sc = {c: score(med, coll, cls, c, s, modes, bases, not inproc) if ok else None for c in cands}
        lost = {} if inproc else {c: other_mode_loss(med, coll, cls, c, s, mode, bases, margin)
                                  for c, v in sc.items() if beats(v, margin)}
        lost = {c: x for c, x in lost.items() if x}
        q = {c: v for c, v in sc.items() if v is not None and (inproc or (beats(v, margin) and c not in lost))}
        best = _best([(v, c) for c, v in q.items()])
        points.append({"size": s, "choice": best[1] if best else None,
                       "scores": {c: (None if v is None else round(v, 6)) for c, v in sc.items()}})
        if lost:
            points[-1]["other_mode_losses"] = {c: [m, round(x, 6)] for c, (m, x) in sorted(lost.items())}
        qual.append(q)

    def beats_window(c, s):
        return beats(score(med, coll, cls, c, s, modes, ["nccl-window"]), margin) if window else None

    # segments in size order: the point, then the open interval up to the next point
    segs = []
    for i, s in enumerate(sizes):
        c = points[i]["choice"]
        segs.append((s, s, c, c and beats_window(c, s)))
        if window and c:
            points[i]["beats_nccl_window"] = bool(segs[-1][3])
        if i + 1 < len(sizes) and sizes[i + 1] > s + 1:
            both = [(max(qual[i][c], qual[i + 1][c]), c) for c in qual[i] if c in qual[i + 1]]
            best = _best(both)
            c = best[1] if best else None
            win = c and beats_window(c, s) and beats_window(c, sizes[i + 1])
            segs.append((s + 1, sizes[i + 1] - 1, c, win))
    return points, merge_segments(segs)


def decide(d, margin, mode):
    """The whole decision: per collective and class the points and ranges; the plan files to write."""
    out = {"margin": margin, "mode": mode, "collectives": {},
           "against": "the fastest mscx plan (no NCCL)" if executor_mode(d) else "NCCL"}
    for coll in sorted(d["sizes"]):
        per = {"baselines": baselines_of(d, coll), "disqualified": disqualified(d, coll), "classes": {}}
        for cls, _, _ in classes_of(coll):
            points, ranges = decide_class(d, coll, cls, margin, mode)
            per["classes"][cls] = {"points": points, "ranges": [list(r[:3]) for r in ranges],
                                   "beats_nccl_window": [r[3] for r in ranges]}
        out["collectives"][coll] = per
    out["plans"] = plan_files(d, out)
    return out


def plan_files(d, dec):
    """[{"file", "candidate", "coll", "min", "max", "dtypes", "beats_nccl_window"}]: a file per range (equal
    ones merge)."""
    cfg = d["config"]
    files = []
    for coll in sorted(dec["collectives"]):
        merged = {}
        for cls, _, dts in classes_of(coll):
            per = dec["collectives"][coll]["classes"][cls]
            for (cand, lo, hi), win in zip(per["ranges"], per["beats_nccl_window"]):
                takes = d["candidates"][cand].get("dtypes")
                if dts is None:
                    ok = list(takes or CLASS_DTYPES)
                else:
                    ok = [t for t in dts if t in (takes or dts)]
                if ok:
                    merged.setdefault((lo, hi, cand, bool(win)), []).extend(ok)
        for k, (lo, hi, cand, win) in enumerate(sorted(merged)):
            stem = "%s_%s_n%d_rpn%d_%02d_%s_%s_%s" % ("choice" if executor_mode(d) else "tune", coll,
                                                     cfg["nranks"], cfg["ranks_per_node"], k, cand, lo, hi)
            key = lambda t: (CLASS_DTYPES.index(t) if t in CLASS_DTYPES else len(CLASS_DTYPES), t)  # noqa: E731
            files.append({"file": stem + ".json", "candidate": cand, "coll": coll, "min": lo, "max": hi,
                          "dtypes": sorted(set(merged[(lo, hi, cand, win)]), key=key),
                          "beats_nccl_window": win})
    return files


# ---------------------------------------------------------------- the plan directory

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()


def rewrite_plan(src, stem, lo, hi, dtypes, window=False):
    """The plan text of @p src with its name, size range and dtypes set, and "beats_nccl_window": true in its
    mscx object when @p window (the range beat NCCL with a registered window too; else the field is left
    out); TuneError when it cannot be read."""
    try:
        with open(src) as fh:
            plan = json.load(fh)
    except (OSError, ValueError) as e:
        raise TuneError("%s: cannot read the candidate plan: %s" % (src, e))
    if not isinstance(plan, dict):
        raise TuneError("%s: a plan must be a JSON object" % src)
    plan["name"] = stem
    plan["min_message_size"] = lo
    plan["max_message_size"] = hi
    ext = plan.get("mscx")
    if not isinstance(ext, dict):
        ext = plan["mscx"] = {"version": 1}
    ext["dtypes"] = list(dtypes)
    ext.pop("beats_nccl_window", None)
    if window:
        ext["beats_nccl_window"] = True
    return json.dumps(plan, indent=2) + "\n"


def write_plan_dir(out, d, dec):
    """OUT/plans: exactly the decided plan files (any other *.json there is removed). @return the paths."""
    pdir = os.path.join(out, "plans")
    os.makedirs(pdir, exist_ok=True)
    want = {p["file"] for p in dec["plans"]}
    for f in sorted(os.listdir(pdir)):
        if f.endswith(".json") and f not in want:
            os.unlink(os.path.join(pdir, f))
    label = os.path.join(pdir, LABEL_FILE)
    if executor_mode(d):
        write_atomic(label, "%s: %d ranks in one process on one GPU (mscx-perf --executor %d).\n"
                     "Each size goes to the fastest mscx plan measured there; NCCL was not measured.\n"
                     % (INPROC_LABEL, executor_mode(d), executor_mode(d)))
    elif os.path.exists(label):
        os.unlink(label)
    paths = []
    for p in dec["plans"]:
        src = os.path.join(out, d["candidates"][p["candidate"]]["file"])
        text = rewrite_plan(src, p["file"][:-5], p["min"], p["max"], p["dtypes"], p.get("beats_nccl_window"))
        path = os.path.join(pdir, p["file"])
        write_atomic(path, text)
        paths.append(path)
    return paths


def check_candidate_files(out, d):
    """TuneError when a candidate tune.json names is missing from OUT or differs from its recorded hash."""
    for name in sorted(d["candidates"]):
        c = d["candidates"][name]
        path = os.path.join(out, c["file"])
        if not os.path.isfile(path):
            raise TuneError("%s: candidate '%s' is listed in tune.json but missing (partial folder?)"
                            % (path, name))
        if sha256_file(path) != c["sha256"]:
            raise TuneError("%s: candidate '%s' differs from the copy tune.json recorded (sha256)"
                            % (path, name))


# ---------------------------------------------------------------- the report

def crossover_sizes(points):
    """Measured sizes whose choice differs from the previous size's (the first size of a new route)."""
    return [p["size"] for i, p in enumerate(points) if i > 0 and p["choice"] != points[i - 1]["choice"]]


def _cell(v):
    return "n/a" if v is None else "%.2f" % v


def report_table(d, dec, coll, cls):
    """Markdown: size, each baseline's and candidate's median times (eager / graph), the route."""
    med = medians(d)
    modes = MODES
    per = dec["collectives"][coll]
    points = per["classes"][cls]["points"]
    sides = per["baselines"] + sorted(points[0]["scores"]) if points else per["baselines"]
    cross = set(crossover_sizes(points))
    head = "| size | " + " | ".join("%s us" % s for s in sides) + " | route |"
    lines = [head, "|---:|" + "---:|" * len(sides) + ":---|"]
    for p in points:
        cells = []
        for side in sides:
            v = [med.get((coll, cls, m, side), {}).get(p["size"]) for m in modes]
            cells.append(" / ".join("n/a" if x is None else "%s, %s" % (_cell(x[0]), _cell(x[1])) for x in v))
        route = p["choice"] or ("none measured" if executor_mode(d) else "NCCL")
        for c, (m, x) in sorted(p.get("other_mode_losses", {}).items()):
            route += " (%s: %.2fx under %s)" % (c, x, "graphs" if m == "graph" else m)
        if p.get("beats_nccl_window"):
            route += " (beats window)"
        if p["size"] in cross:
            route += " (crossover)"
        lines.append("| %s | %s | %s |" % (fmt_size(p["size"]), " | ".join(cells), route))
    return "\n".join(lines) + "\n"


def _report_head(d, dec):
    cfg = d["config"]
    m = d.get("machine", {})
    cells = "Each cell is the median of the alternated runs, out-of-place, in-place (us), eager / graph. "
    if executor_mode(d):
        n = executor_mode(d)
        return ["# mscx-tune report: %s" % INPROC_LABEL, "",
                "%d ranks in one process on one GPU (mscx-perf --executor %d); GPU %s, driver %s. Decision "
                "mode %s. NCCL was not measured: these plans are not known to beat NCCL." % (
                    n, n, m.get("gpu", "?"), m.get("driver", "?"), dec["mode"]), "",
                cells + "Each size goes to the fastest plan by its worst ratio to the fastest plan of each "
                "cell (no margin); \"(crossover)\" marks where the route changes.", ""]
    return ["# mscx-tune report", "",
            "%d rank(s), %d per node; GPU %s, driver %s, NCCL %s. Decision mode %s, margin %g%%."
            % (cfg["nranks"], cfg["ranks_per_node"], m.get("gpu", "?"), m.get("driver", "?"),
               m.get("nccl_version", "?"), dec["mode"], dec["margin"] * 100), "",
            cells + "A size goes to a plan only where it takes at most %g%% of NCCL's time in the cells of "
            "the decision mode and at most %g%% in the other mode's (a route names a plan kept off that way); "
            "the route says \"beats window\" where it also takes at most %g%% of NCCL's with a registered "
            "window, and only those plans take calls on registered buffers; \"(crossover)\" marks where the "
            "route changes." % ((1 - dec["margin"]) * 100, (1 + dec["margin"]) * 100, (1 - dec["margin"]) * 100),
            ""]


def report_md(d, dec):
    out = _report_head(d, dec)
    for note in d.get("notes", []):
        out.append("- " + note)
    if d.get("notes"):
        out.append("")
    for coll in sorted(dec["collectives"]):
        per = dec["collectives"][coll]
        for cls, ptype, dts in classes_of(coll):
            out.append("## %s, %s" % (coll, class_title(cls, dts, ptype)))
            out.append("")
            if per["disqualified"]:
                out.append("Not routed (a run failed or had wrong results): %s."
                           % ", ".join(per["disqualified"]))
                out.append("")
            out.append(report_table(d, dec, coll, cls))
            rs = per["classes"][cls]["ranges"]
            out.append("Ranges: %s." % ("; ".join("%s [%d, %d]" % tuple(r) for r in rs) if rs else
                                        "none" if executor_mode(d) else "none: NCCL"))
            out.append("")
    out.append("Plans written: %s." % (", ".join(p["file"] for p in dec["plans"]) or "none"))
    return "\n".join(out) + "\n"


def plot_series(d, dec, coll, cls):
    """(mode, [(name, {size: us}, wide)], [(size, label)]): out-of-place medians of the last decision mode per
    baseline and candidate, the chosen route (wide) and a marker at each crossover."""
    med = medians(d)
    m = decision_modes(dec["mode"])[-1]
    points = dec["collectives"][coll]["classes"][cls]["points"]
    sides = dec["collectives"][coll]["baselines"] + (sorted(points[0]["scores"]) if points else [])
    series = []
    for side in sides:
        v = {s: x[0] for s, x in med.get((coll, cls, m, side), {}).items() if x is not None}
        if v:
            series.append((side, v, False))
    route = {}
    for p in points:
        x = med.get((coll, cls, m, p["choice"] or "nccl"), {}).get(p["size"])
        if x is not None:
            route[p["size"]] = x[0]
    if route:
        series.insert(0, ("chosen route", route, True))
    cross = set(crossover_sizes(points))
    marks = [(p["size"], "-> %s" % (p["choice"] or "NCCL")) for p in points if p["size"] in cross]
    return m, series, marks
