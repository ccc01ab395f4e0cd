#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every backticked repository path in the project's Markdown files exists.

  check-doc-paths.py SOURCE_ROOT

A backticked word is taken for a path when it starts with one of the
tree's top-level folders (or names a top-level file) and holds no
wildcard, placeholder or option: `shim/comm.c`, `tests/lint/`,
`meson_options.txt`. It must exist relative to the tree's root, or to the
folder of the Markdown file that names it. Build outputs (`build/...`) and
paths under folders the tree ignores are not the tree's and are skipped.
Prints each stale path with its file and line; exits 1 if there is one.

The README's layout table also names every module folder: each tracked
folder directly under executor/, tools/ and tests/ (but tests/data/'s
fixtures) has a row of its own, or is named in its parent's row.
"""
import os
import re
import subprocess
import sys

TICKED = re.compile(r"`([^`\s]+)`")
NOT_A_PATH = re.compile(r"[*?{}<>$|=,;:()\[\]]|\.\.\.|^-|^[A-Z]+$")


def tracked_markdown(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "*.md"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    return [p for p in out.splitlines() if p]


def top_level(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    return {p.split("/", 1)[0] for p in out.splitlines() if p}


def candidate(word, tops):
    if NOT_A_PATH.search(word):
        return False
    head = word.rstrip("/").split("/", 1)[0]
    return head in tops and (word in tops or "/" in word)


def exists(root, md, word):
    for base in (root, os.path.join(root, os.path.dirname(md))):
        if os.path.exists(os.path.join(base, word)):
            return True
    return False


LAYOUT_PARENTS = ("executor", "tools", "tests")


def module_folders(root):
    out = subprocess.run(["git", "-C", root, "ls-files"] + list(LAYOUT_PARENTS), stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    return sorted({"/".join(p.split("/")[:2]) for p in out.splitlines() if p.count("/") >= 2})


def layout_rows(root):
    rows = []
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\| `([^`]+)/` \|(.*)\|\s*$", line)
            if m:
                rows.append((m.group(1).rstrip("/"), m.group(2)))
    return rows


def layout_missing(root):
    rows = layout_rows(root)
    missing = []
    for folder in module_folders(root):
        parent, name = folder.split("/", 1)
        if any(r == folder or r.startswith(folder + "/") for r, _ in rows):
            continue
        if any(r == parent and "`%s/`" % name in text for r, text in rows):
            continue
        missing.append(folder)
    return missing


def main():
    root = os.path.abspath(sys.argv[1])
    tops = top_level(root)
    stale = 0
    for md in tracked_markdown(root):
        with open(os.path.join(root, md), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for word in TICKED.findall(line):
                    if candidate(word, tops) and not exists(root, md, word):
                        print("%s:%d: `%s` does not exist" % (md, n, word))
                        stale += 1
    print("%d stale path%s" % (stale, "" if stale == 1 else "s"))
    missing = layout_missing(root)
    for folder in missing:
        print("README.md: the layout table has no row for `%s/`" % folder)
    return 1 if stale or missing else 0


if __name__ == "__main__":
    sys.exit(main())
