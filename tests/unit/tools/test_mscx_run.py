#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mscx-run: the environment it gives the command, and its refusals.

    test_mscx_run.py MSCX_RUN SHIM_LIB
"""
import os
import subprocess
import sys
import tempfile

RUN, SHIM = sys.argv[1], sys.argv[2]
# A clean environment but for what runs the programs: the path, and a sanitizer build's options
BASE = {k: v for k, v in os.environ.items() if k in ("PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LD_LIBRARY_PATH")}
BASE.setdefault("PATH", "/usr/bin:/bin")


def run(args, extra=None):
    env = dict(BASE)
    env.update(extra or {})
    p = subprocess.run(["sh", RUN] + args, env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def envmap(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


failures = 0


def check(what, cond, detail=""):
    global failures
    print(("ok   " if cond else "FAIL ") + what + ("" if cond else ": " + detail))
    failures += 0 if cond else 1


rc, out, err = run(["--print-env"])
e = envmap(out)
check("plain: rc 0", rc == 0, err)
check("plain: LD_PRELOAD is the shim", e.get("LD_PRELOAD") == SHIM, out)
check("plain: vLLM and SGLang open the shim",
      e.get("VLLM_NCCL_SO_PATH") == SHIM and e.get("SGLANG_NCCL_SO_PATH") == SHIM, out)
check("plain: no real NCCL named", "MSCX_NCCL_LIB" not in e and "MSCX_PLAN_DIR" not in e, out)

rc, out, err = run(["--print-env"], {"LD_PRELOAD": "/opt/x/liba.so"})
check("preload kept behind the shim", envmap(out).get("LD_PRELOAD") == SHIM + ":/opt/x/liba.so", out)
rc, out, err = run(["--print-env"], {"LD_PRELOAD": "/opt/x/liba.so:" + SHIM})
check("shim not preloaded twice", envmap(out).get("LD_PRELOAD") == "/opt/x/liba.so:" + SHIM, out)

rc, out, err = run(["--print-env"], {"VLLM_NCCL_SO_PATH": "/opt/nccl/libnccl.so.2"})
e = envmap(out)
check("a pynccl library becomes the real NCCL",
      e.get("MSCX_NCCL_LIB") == "/opt/nccl/libnccl.so.2" and e.get("VLLM_NCCL_SO_PATH") == SHIM, out)
rc, out, err = run(["--print-env"], {"SGLANG_NCCL_SO_PATH": "/a/libnccl.so.2", "MSCX_NCCL_LIB": "/b/libnccl.so.2"})
check("MSCX_NCCL_LIB set by the user wins", envmap(out).get("MSCX_NCCL_LIB") == "/b/libnccl.so.2", out)

with tempfile.TemporaryDirectory() as d:
    rc, out, err = run(["--plans", d, "--print-env"])
    check("--plans sets MSCX_PLAN_DIR", rc == 0 and envmap(out).get("MSCX_PLAN_DIR") == d, out + err)
    marker = os.path.join(d, "env.txt")
    rc, out, err = run(["--", "sh", "-c", 'printf "%s\\n%s\\n" "$LD_PRELOAD" "$VLLM_NCCL_SO_PATH" > "$0"', marker])
    got = open(marker).read().split() if os.path.exists(marker) else []
    check("the command runs with the shim preloaded", rc == 0 and got == [SHIM, SHIM], "rc %d %r %s" % (rc, got, err))
    rc, out, err = run(["sh", "-c", "exit 7"])
    check("the command's exit status is kept", rc == 7, "rc %d" % rc)

rc, out, err = run(["--plans", "/nonexistent/plans", "true"])
check("a missing --plans folder is refused, naming it", rc == 1 and "/nonexistent/plans" in err, err)
rc, out, err = run(["--bogus", "true"])
check("an unknown option is refused, naming it", rc == 2 and "--bogus" in err, err)
rc, out, err = run([])
check("no command is a usage error", rc == 2 and "usage" in err, err)

print("%d failures" % failures)
sys.exit(1 if failures else 0)
