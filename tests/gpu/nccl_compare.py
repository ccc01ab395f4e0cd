#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run one NCCL program twice, on stock NCCL and with the mscx shim
preloaded, compare everything it dumped bit for bit, and require that the
shim's summary (MSCX_SUMMARY_FILE, read with tools/ab/mscx-ab's parser) reports
routed calls.

  nccl_compare.py --shim LIB --plans DIR --ab tools/ab/mscx-ab --workdir DIR
                  [--preload-real] [--only-size-fallbacks] -- PROGRAM ARGS...
                  (OUTFILE is appended)

--preload-real: the program is linked against some libnccl.so.2; the real one
(MSCX_TEST_NCCL_LIB, else ldconfig's, else the one in torch's wheel) is
preloaded in both runs so that it, not whatever the link found, is NCCL.
Without it the program loads NCCL itself (PyTorch).
A case named "expect NAME" holds the exact result of case NAME, which the
program computed itself: where stock NCCL's NAME differs from the shim's and
the shim's is that exact result, NCCL is the one that is wrong, and the
case is reported as such, not as a difference.
Exits 77 when the program does (no GPU, no torch).
"""
import argparse
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pycheck  # noqa: E402


def real_nccl():
    p = os.environ.get("MSCX_TEST_NCCL_LIB")
    if p:
        return p
    try:
        out = subprocess.run(["ldconfig", "-p"], stdout=subprocess.PIPE, universal_newlines=True).stdout
        for line in out.splitlines():
            if "libnccl.so.2 " in line and "=>" in line:
                return line.split("=>")[1].strip()
    except OSError:
        pass
    for d in sys.path:
        hits = glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so.2"))
        if hits:
            return hits[0]
    return None


def split_cases(data):
    """[(header, payload)] of a dump: 'name bytes=N\\n' + N bytes + '\\n'."""
    cases, at = [], 0
    while at < len(data):
        nl = data.index(b"\n", at)
        head = data[at:nl].decode()
        n = int(head.rsplit("bytes=", 1)[1].split()[0])
        cases.append((head, data[nl + 1:nl + 1 + n]))
        at = nl + 1 + n + 1
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--plans", required=True)
    ap.add_argument("--ab", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--preload-real", action="store_true")
    ap.add_argument("--only-size-fallbacks", action="store_true",
                    help="fail when the shim sent a call to NCCL for any reason but its size (no plan covers it)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    os.makedirs(a.workdir, exist_ok=True)
    base_env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    for k in ("LD_PRELOAD", "MSCX_DISABLE", "MSCX_FORCE_FALLBACK", "MSCX_SUMMARY_FILE"):
        base_env.pop(k, None)
    pre = []
    if a.preload_real:
        real = real_nccl()
        if not real:
            print("no real libnccl.so.2 found (set MSCX_TEST_NCCL_LIB): skipped")
            return 77
        pre = [real]
        print("real NCCL: %s" % real)
    summary = os.path.join(os.path.abspath(a.workdir), "summary.json")
    for f in glob.glob(summary + "*"):
        os.unlink(f)
    runs = {
        "nccl": dict(base_env, **({"LD_PRELOAD": ":".join(pre)} if pre else {})),
        "shim": dict(base_env, LD_PRELOAD=":".join([os.path.abspath(a.shim)] + pre),
                     MSCX_PLAN_DIR=os.path.abspath(a.plans), MSCX_SUMMARY_FILE=summary),
    }
    dumps = {}
    for name, env in runs.items():
        path = os.path.join(a.workdir, "out-%s.bin" % name)
        if os.path.exists(path):
            os.unlink(path)
        print("== %s run: LD_PRELOAD=%s" % (name, env.get("LD_PRELOAD", "")), flush=True)
        p = subprocess.run(cmd + [path], env=env)
        if p.returncode == 77:
            return 77
        if p.returncode != 0:
            print("FAIL: the %s run exited with %d" % (name, p.returncode))
            return 1
        with open(path, "rb") as fh:
            dumps[name] = split_cases(fh.read())
    a_cases, b_cases = dumps["nccl"], dumps["shim"]
    bad = 0
    if [h for h, _ in a_cases] != [h for h, _ in b_cases]:
        print("FAIL: the runs dumped different cases (%d vs %d)" % (len(a_cases), len(b_cases)))
        bad += 1
    # "expect NAME": the exact result of case NAME, computed by the program itself (the same in both runs)
    exact = {h.split(" bytes=")[0][len("expect "):]: p for h, p in b_cases if h.startswith("expect ")}
    for (ha, pa), (hb, pb) in zip(a_cases, b_cases):
        if pa != pb:
            first = next((i for i in range(min(len(pa), len(pb))) if pa[i] != pb[i]), min(len(pa), len(pb)))
            if exact.get(ha.split(" bytes=")[0]) == pb:
                print("NCCL WRONG: %s: stock NCCL's result differs from the exact one at byte %d; the shim's "
                      "is exact" % (ha, first))
                continue
            print("DIFF: %s (first differing byte %d)" % (ha, first))
            bad += 1
    print("compared %d cases bit for bit: %d differ" % (len(a_cases), bad))

    s = pycheck.load_script(a.ab, "mscx_ab").read_summary(summary)
    if s is None:
        print("FAIL: the shim wrote no summary at %s" % summary)
        return 1
    print("shim summary: routed %d, fallback %s" % (s["routed"], s["fallback"]))
    for f in sorted(glob.glob(summary + "*")):
        with open(f) as fh:
            print("--- %s\n%s" % (f, fh.read().strip()))
    if s["routed"] == 0:
        print("FAIL: the shim routed nothing")
        bad += 1
    other = {k: v for k, v in s["fallback"].items() if k != "size" and v}
    if a.only_size_fallbacks and other:
        print("FAIL: calls a plan covers went to NCCL: %s" % ", ".join("%s %d" % kv for kv in sorted(other.items())))
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
