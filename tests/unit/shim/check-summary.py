#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run the shim driver with MSCX_SUMMARY_FILE set, then read the summary both
raw and through tools/ab/mscx-ab's own parser, so the two sides must agree.

  check-summary.py --ab tools/ab/mscx-ab --summary BASE --rank R --at destroy
      --routed N --fallback REASON=N ... --bucket COLL:BUCKET:ROUTED:REASON=N
      -- DRIVER ARGS...
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
import pycheck  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", required=True)
    ap.add_argument("--summary", required=True, help="MSCX_SUMMARY_FILE to set")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--at", default="destroy")
    ap.add_argument("--routed", type=int, required=True)
    ap.add_argument("--fallback", action="append", default=[], help="REASON=N (all others must be 0)")
    ap.add_argument("--bucket", action="append", default=[], help="COLL:BUCKET:ROUTED[:REASON=N]")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    errors = []

    d = os.path.dirname(a.summary) or "."
    base = os.path.basename(a.summary)
    for f in os.listdir(d):
        if f.startswith(base):
            os.unlink(os.path.join(d, f))
    env = dict(os.environ, MSCX_SUMMARY_FILE=a.summary)
    p = subprocess.run(cmd, env=env)
    if p.returncode != 0:
        print("driver failed with %d" % p.returncode)
        return 1

    path = "%s.%d" % (a.summary, a.rank)
    if not os.path.isfile(path):
        print("no summary file %s (dir has %s)" % (path, sorted(os.listdir(d))))
        return 1
    # the temporary file beside it is PATH.XXXXXX (mkstemp)
    leftovers = [f for f in os.listdir(d) if f.startswith(os.path.basename(path) + ".")]
    if leftovers:
        errors.append("temporary files left: %s" % leftovers)
    with open(path) as fh:
        raw = json.load(fh)
    if not isinstance(raw, list) or len(raw) != 1:
        errors.append("expected a list of one communicator object, got %r" % raw)
    else:
        obj = raw[0]
        if obj.get("at") != a.at:
            errors.append("at = %r, expected %r" % (obj.get("at"), a.at))
        if obj.get("rank") != a.rank:
            errors.append("rank = %r, expected %d" % (obj.get("rank"), a.rank))
        got = {(b["coll"], b["bucket"]): b for b in obj.get("buckets", [])}
        for spec in a.bucket:
            parts = spec.split(":")
            key = (parts[0], parts[1])
            if key not in got:
                errors.append("no bucket %s %s in %s" % (key + (sorted(got),)))
                continue
            b = got.pop(key)
            if b["routed"] != int(parts[2]):
                errors.append("bucket %s routed %d, expected %s" % (key, b["routed"], parts[2]))
            want = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in parts[3:])
            if b["fallback"] != want:
                errors.append("bucket %s fallback %r, expected %r" % (key, b["fallback"], want))
        if a.bucket and got:
            errors.append("unexpected buckets %s" % sorted(got))

    ab = pycheck.load_script(a.ab, "mscx_ab")
    s = ab.read_summary(a.summary)
    if s is None:
        errors.append("mscx-ab found no summary at %s" % a.summary)
    else:
        want = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.fallback)
        if s["routed"] != a.routed:
            errors.append("mscx-ab: routed %d, expected %d" % (s["routed"], a.routed))
        if s["fallback"] != want:
            errors.append("mscx-ab: fallback %r, expected %r" % (s["fallback"], want))
        # mscx-ab's per-size path column: 1 KiB lands in the <=1K bucket
        if a.bucket and "nccl" not in ab.path_for_size(s, 1024) and a.routed == 0:
            errors.append("mscx-ab: path for 1K is %r" % ab.path_for_size(s, 1024))
    for e in errors:
        print("FAIL: " + e)
    if not errors:
        print("ok: %s" % path)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
