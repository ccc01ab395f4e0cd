#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mscx-info --explain on summaries, good and bad; and every reason name the
shim can write is explained by the tool and listed in docs/routing.md.

    test_mscx_info_explain.py MSCX_INFO SOURCE_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile

INFO, ROOT = sys.argv[1], sys.argv[2]
failures = 0


def check(what, cond, detail=""):
    global failures
    print(("ok   " if cond else "FAIL ") + what + ("" if cond else ": " + detail))
    failures += 0 if cond else 1


def explain(text):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
    try:
        p = subprocess.run([INFO, "--explain", f.name], capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout, p.stderr.replace(f.name, "FILE")
    finally:
        os.unlink(f.name)


summary = [{"comm": "0x1", "rank": 0, "nranks": 2, "at": "destroy", "routed": 12, "fallback": {"size": 3},
            "buckets": [{"coll": "allreduce", "bucket": "<=1K", "max_bytes": 1024, "routed": 12, "fallback": {}},
                        {"coll": "allreduce", "bucket": ">4M", "routed": 0, "fallback": {"size": 3, "group": 2}}]}]
rc, out, err = explain(json.dumps(summary))
check("a summary: rc 0", rc == 0, err)
check("the communicator line", "comm 0x1: rank 0 of 2, at destroy: 12 calls routed" in out, out)
check("a routed bucket", "allreduce <=1K: routed 12" in out, out)
check("each fallback reason in words", "to NCCL 3: size (no plan covers the message size)" in out
      and "to NCCL 2: group (" in out, out)

check("no plans listed in a summary without them", "\n  plan " not in out, out)

summary[0]["plans"] = [{"plan": "allreduce_n2_rpn2_oneshot_1K_16K", "coll": "allreduce", "min_bytes": 1024,
                        "max_bytes": 16384, "calls": 12}]
summary[0]["plans_omitted"] = 2
rc, out, err = explain(json.dumps(summary))
check("the plan that ran the calls, with its range and count",
      rc == 0 and "plan allreduce_n2_rpn2_oneshot_1K_16K (allreduce, 1024-16384 bytes): 12 calls" in out, out + err)
check("plans left out of the summary counted", "and 2 more plans" in out, out)
del summary[0]["plans"], summary[0]["plans_omitted"]

summary[0]["buckets"][1]["fallback"] = {"brand-new": 1}
rc, out, err = explain(json.dumps(summary))
check("an unknown reason is shown, not fatal", rc == 0 and "to NCCL 1: brand-new (a reason" in out, out + err)

rc, out, err = explain('[{"comm": "0x1", "nranks": 2,')
check("broken JSON: rc 1, file, line and column", rc == 1 and re.search(r"FILE:1:\d+: ", err), err)
rc, out, err = explain('{"comm": 1}')
check("not a list: rc 1", rc == 1 and "expected a list" in err, err)
rc, out, err = explain('[{"comm": "0x1"}]')
check("an entry without nranks: rc 1, naming the entry", rc == 1 and "entry 0" in err, err)
rc, out, err = explain("[]")
check("an empty summary says so", rc == 0 and "no communicator" in out, out)
p = subprocess.run([INFO, "--explain", "/nonexistent/summary.json"], capture_output=True, text=True, timeout=30)
check("a missing file: rc 1, naming it", p.returncode == 1 and "/nonexistent/summary.json" in p.stderr, p.stderr)

# The names the shim writes (shim/route.c's shim_reason_name) against the tool and docs/routing.md.
route = open(os.path.join(ROOT, "shim", "route.c")).read()
m = re.search(r"shim_reason_name\(enum shim_reason why\)\s*\{.*?\{(.*?)\}", route, re.S)
names = re.findall(r'"([a-z-]+)"', m.group(1)) if m else []
check("the shim's reason names found", len(names) > 3, route[:0])
tool = open(os.path.join(ROOT, "tools", "cli", "summary_explain.c")).read()
readme = open(os.path.join(ROOT, "docs", "routing.md")).read()
for n in names:
    if n == "routed":
        continue
    check("reason %s explained by mscx-info" % n, re.search(r'\{"%s",\s' % re.escape(n), tool) is not None)
    check("reason %s in the table of docs/routing.md" % n, "| `%s` |" % n in readme)

print("%d failures" % failures)
sys.exit(1 if failures else 0)
