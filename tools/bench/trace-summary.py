#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Summarise an MSCX_TRACE Chrome trace: per rank and thread block, the median
duration of each op (by op index and name) and of the gap between one
launch's last op and the next launch's prologue.
  tools/bench/trace-summary.py TRACE.json"""
import json
import statistics
import sys
from collections import defaultdict


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        ev = json.load(f)
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    tracks = defaultdict(list)
    for e in ev:
        if e.get("ph") == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for key in sorted(tracks):
        es = sorted(tracks[key], key=lambda e: e["ts"])
        dur = defaultdict(list)
        gaps, launch = [], []
        prev_end = None
        start = None
        for e in es:
            if e["name"] == "prologue":
                if prev_end is not None:
                    gaps.append(e["ts"] - prev_end)
                if start is not None:
                    launch.append(prev_end - start)
                start = e["ts"]
            dur[(e["args"]["op"] if e["name"] != "prologue" else -1, e["name"])].append(e["dur"])
            prev_end = e["ts"] + e["dur"]
        parts = ["%s#%d %.2f" % (n, i, statistics.median(v)) for (i, n), v in sorted(dur.items())]
        print("rank %d tb %d: launches %d, median us: %s; launch %.2f; gap to next %.2f" % (
            key[0], key[1], len(launch) + 1, ", ".join(parts),
            statistics.median(launch) if launch else 0, statistics.median(gaps) if gaps else 0))


if __name__ == "__main__":
    main()
