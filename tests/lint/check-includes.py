#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The modules' includes point one way, and every header has an owner.

    check-includes.py SOURCE_ROOT

MODULES below is the one place where each module's dependencies and
interface are named. A module is a folder (or, for an exception, one file).
A file may include:
  - any header of its own module;
  - a public header (mscx/NAME.h) whose owner (PUBLIC_OWNER) is its own
    module or one it depends on; the shim, the tools and the tests may
    include every public header;
  - a header another module exports (its "exports"), where it depends on
    that module.
Everything else of the tree is private to its module. Tests are white-box:
they may include any header, but every header they name must exist.
Headers of no module (the system's, generated ones) are not checked.
A public header may include those of its owner and of its owner's
dependencies. Exits 1 naming each include that breaks a rule, and each
public header without an owner.
"""
import os
import re
import sys

PUBLIC = "executor/include/mscx"

# module: (the modules it depends on, the headers it exports to them)
MODULES = {
    "executor/common": ([], ["op_math.h"]),
    "executor/plan": (["executor/common"], ["plan_model.h"]),
    "executor/hostexec": (["executor/common", "executor/plan"], []),
    "executor/net": (["executor/common"], ["transport.h", "proxy.h", "port_fifo.h", "shm_slots.h"]),
    "executor/gpu": (["executor/common", "executor/plan"],
                     ["launch_abi.h", "copy_abi.h", "scale_abi.h", "device_caps.h", "launch_order.h",
                      "onerank.h"]),
    "executor/gpu/runtime": (["executor/common", "executor/plan", "executor/net", "executor/gpu"], []),
    "executor/gpu/kernels": (["executor/common", "executor/net", "executor/gpu"], []),
    "shim": (["executor"], []),
    "tools": (["executor"], []),
    # a developer benchmark that times the kernel's launch record directly
    "tools/bench/mscx_bench_launch.cu": (["executor", "executor/gpu"], []),
    "tests": (["*"], []),
}

# public header: the module that implements it
PUBLIC_OWNER = {
    "status.h": "executor/common",
    "log.h": "executor/common",
    "env.h": "executor/common",
    "fork.h": "executor/common",
    "nccl_find.h": "executor/common",
    "dev_types.h": "executor/common",
    "scale.h": "executor/common",
    "plan.h": "executor/plan",
    "trace.h": "executor/plan",
    "hostexec.h": "executor/hostexec",
    "sim.h": "executor/hostexec",
    "exec.h": "executor/gpu",
}

SOURCES = (".c", ".h", ".cu", ".cuh", ".in")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TOPS = ("executor", "shim", "tools", "tests")


def module_of(path):
    """The deepest module whose folder (or file) holds path."""
    best = None
    for m in MODULES:
        if path == m or path.startswith(m + "/"):
            if best is None or len(m) > len(best):
                best = m
    return best


def header_modules(root):
    """bare header name -> the modules holding it"""
    where = {}
    for top in TOPS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".h", ".cuh")):
                    rel = os.path.relpath(os.path.join(d, f), root)
                    m = module_of(rel)
                    if m and not rel.startswith(PUBLIC + "/"):
                        where.setdefault(f, set()).add(m)
    return where


def deps_of(mod, rel):
    deps = set(MODULES[mod][0])
    if mod.endswith((".c", ".cu")):  # a file with rules of its own also has its folder's
        folder = module_of(os.path.dirname(rel))
        deps |= {folder} | set(MODULES[folder][0])
    return deps


def allowed(mod, deps, inc, where):
    """None when @p inc may be included from @p mod, else why not."""
    if "*" in deps:
        return None
    if inc.startswith("mscx/"):
        owner = PUBLIC_OWNER.get(inc[5:])
        if owner is None:
            return "a public header without an owner in PUBLIC_OWNER"
        if owner == mod or owner in deps or "executor" in deps:
            return None
        return "public header of %s" % owner
    for t in where.get(os.path.basename(inc), set()):
        if t == mod or (mod.endswith((".c", ".cu")) and t in deps and t == module_of(os.path.dirname(mod))):
            continue
        if t in deps and os.path.basename(inc) in MODULES[t][1]:
            continue
        return "private header of %s" % t if t in deps else "header of %s, not a dependency" % t
    return None


def check_file(root, rel, where, bad):
    mod = module_of(rel)
    if mod is None:
        return
    deps = deps_of(mod, rel)
    with open(os.path.join(root, rel), errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if mod == "tests":
                named = inc[5:] if inc.startswith("mscx/") else os.path.basename(inc)
                if inc.startswith("mscx/") and not os.path.exists(os.path.join(root, PUBLIC, named)):
                    bad.append(f"{rel}:{n}: includes {inc}, which does not exist")
                continue
            why = allowed(mod, deps, inc, where)
            if why:
                bad.append(f"{rel}:{n}: {mod} includes {inc}: {why}")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    where = header_modules(root)
    bad = []
    for h in sorted(os.listdir(os.path.join(root, PUBLIC))):
        if h.endswith(".h") and h not in PUBLIC_OWNER:
            bad.append(f"{PUBLIC}/{h}: no owner in PUBLIC_OWNER")
    nfiles = 0
    for h, owner in sorted(PUBLIC_OWNER.items()):  # a public header includes its owner's and its deps'
        with open(os.path.join(root, PUBLIC, h), errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                other = PUBLIC_OWNER.get(m.group(1)[5:]) if m and m.group(1).startswith("mscx/") else None
                if other and other != owner and other not in MODULES[owner][0]:
                    bad.append(f"{PUBLIC}/{h}:{n}: {owner} includes {m.group(1)} of {other}")
        nfiles += 1
    for top in TOPS:
        for d, _, files in os.walk(os.path.join(root, top)):
            if "/data" in d or os.path.basename(d).startswith("."):
                continue
            for f in sorted(files):
                if f.endswith(SOURCES):
                    check_file(root, os.path.relpath(os.path.join(d, f), root), where, bad)
                    nfiles += 1
    if bad:
        print("includes that break the module rules:")
        print("\n".join(bad))
        return 1
    print(f"ok: {nfiles} files, every include as the modules allow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
