#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Fail when the source files of a library call each other in a circle.

  check-call-cycles.py OBJDIR

Reads the object files in OBJDIR (a library's private build folder) with
nm: a file that uses a symbol another file defines depends on that file.
The dependencies must form layers, with no circle; the circles found are
printed with the symbols that close them.
"""
import collections
import glob
import os
import subprocess
import sys


def graph(objdir):
    defined, used = {}, collections.defaultdict(set)
    objs = sorted(glob.glob(os.path.join(objdir, '*.o')))
    if not objs:
        sys.exit(f'check-call-cycles: no object files in {objdir}')
    for o in objs:
        name = os.path.basename(o).removesuffix('.o').replace('meson-generated_.._', '')
        out = subprocess.run(['nm', o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in 'TDBRV':
                defined[f[2]] = name
            elif len(f) == 2 and f[0] == 'U':
                used[name].add(f[1])
    edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for name, syms in used.items():
        for s in syms:
            owner = defined.get(s)
            if owner and owner != name:
                edges[name][owner].add(s)
    return edges


def circles(edges):
    """The strongly connected components of more than one file (Tarjan, iterative)."""
    nodes = sorted(set(edges) | {b for a in edges for b in edges[a]})
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    edges = graph(sys.argv[1])
    found = circles(edges)
    for comp in found:
        print('files that call each other in a circle: ' + ', '.join(comp))
        for a in comp:
            for b in sorted(edges[a]):
                if b in comp:
                    print(f'  {a} -> {b}: ' + ', '.join(sorted(edges[a][b])[:4]))
    if found:
        return 1
    print(f'ok: the {len(set(edges) | {b for a in edges for b in edges[a]})} files form layers')
    return 0


if __name__ == '__main__':
    sys.exit(main())
