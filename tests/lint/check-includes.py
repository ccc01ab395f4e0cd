#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The modules' includes point one way.

    check-includes.py SOURCE_ROOT

Each module is a folder; a file may include headers of its own module and
of the modules listed for it below, and nothing else of the tree. Headers
are named bare ("plan_int.h") or by the public prefix ("mscx/plan.h"); a
bare name is resolved to the folder that holds it. Headers of no module
(the system's, generated ones) are not checked. Exits 1 naming each
include that points the wrong way.
"""
import os
import re
import sys

PUBLIC = "executor/include"
# module: the modules it may include, besides itself and the public headers
RULES = {
    PUBLIC: [],
    "executor/common": [],
    "executor/plan": ["executor/common"],
    "executor/hostexec": ["executor/common", "executor/plan"],
    "executor/net": ["executor/common"],
    "executor/gpu": ["executor/common", "executor/plan"],
    "executor/gpu/runtime": ["executor/common", "executor/plan", "executor/net", "executor/gpu"],
    "executor/gpu/kernels": ["executor/common", "executor/net", "executor/gpu"],
    "shim": [],
    "tools": [],
    # a developer benchmark that times the kernel's launch record directly
    "tools/bench/mscx_bench_launch.cu": ["executor/gpu"],
}
SOURCES = (".c", ".h", ".cu", ".cuh", ".in")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path):
    """The deepest rule whose folder (or file) holds path."""
    best = None
    for m in RULES:
        if path == m or path.startswith(m + "/"):
            if best is None or len(m) > len(best):
                best = m
    return best


def header_modules(root):
    """bare header name -> the module folders holding it"""
    where = {}
    for top in ("executor", "shim", "tools"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".h", ".cuh")):
                    rel = os.path.relpath(os.path.join(d, f), root)
                    m = module_of(rel)
                    if m:
                        where.setdefault(f, set()).add(m)
    return where


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    where = header_modules(root)
    bad = []
    for top in ("executor", "shim", "tools"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)
                mod = module_of(rel)
                if mod is None:
                    continue
                allowed = {mod, PUBLIC} | set(RULES[mod])
                if mod.endswith((".c", ".cu")):  # a file with rules of its own also has its folder's
                    allowed |= set(RULES[module_of(os.path.dirname(rel))] or [])
                    allowed.add(module_of(os.path.dirname(rel)))
                with open(os.path.join(root, rel), errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if inc.startswith("mscx/"):
                            targets = {PUBLIC}
                        else:
                            targets = where.get(os.path.basename(inc), set())
                        for t in targets:
                            if t not in allowed:
                                bad.append(f"{rel}:{n}: {mod} includes {inc} of {t}")
    if bad:
        print("includes that point the wrong way:")
        print("\n".join(bad))
        return 1
    print("ok: every include points the way the modules allow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
