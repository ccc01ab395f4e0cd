#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Per kernel name: how long its launches ran and how long each stream sat
between the end of one kernel and the start of the next, from the CSV of
`nsys stats -r cuda_gpu_trace -f csv` (graph kernel nodes traced with
--cuda-graph-trace=node).
  tools/bench/nsys-gaps.py TRACE.csv [MAX_ROWS]"""
import csv
import statistics
import sys
from collections import defaultdict


def col(row, *names):
    for n in names:
        for k in row:
            if k.strip().lower().startswith(n):
                return row[k]
    raise KeyError(names)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    streams = defaultdict(list)
    for r in rows:
        try:
            start = float(col(r, "start (ns)", "start"))
            dur = float(col(r, "duration (ns)", "duration"))
            name = col(r, "name")
            strm = col(r, "strm", "stream")
        except (KeyError, ValueError):
            continue
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        short = name.split("(")[0].split("<")[0].replace("void ", "").strip()
        streams[strm].append((start, dur, short))
    dur = defaultdict(list)
    gap = defaultdict(list)
    for evs in streams.values():
        evs.sort()
        for i, (s, d, n) in enumerate(evs):
            dur[n].append(d / 1000.0)
            if i + 1 < len(evs) and evs[i + 1][2] == n:
                g = evs[i + 1][0] - (s + d)
                if g < 20000:  # within one graph or batch, not between them
                    gap[n].append(g / 1000.0)
    print("| kernel | launches | median duration us | p10 | p90 | median gap to next on stream us |")
    print("|---|---|---|---|---|---|")
    for n in sorted(dur, key=lambda k: -len(dur[k]))[:limit]:
        v = sorted(dur[n])
        print("| %s | %d | %.2f | %.2f | %.2f | %s |" % (
            n, len(v), statistics.median(v), v[len(v) // 10], v[len(v) * 9 // 10],
            "%.2f" % statistics.median(gap[n]) if gap[n] else "-"))


if __name__ == "__main__":
    main()
