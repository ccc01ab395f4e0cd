#!/usr/bin/env python3
"""Print the ninja targets that the named tests of a meson build directory need.

Usage: test-targets.py BUILD_DIR NAME...
"""
import json
import os
import subprocess
import sys


def main():
    build, names = sys.argv[1], set(sys.argv[2:])
    intro = lambda what: json.loads(subprocess.check_output(['meson', 'introspect', build, what]))
    tests = [t for t in intro('--tests') if t['name'] in names]
    files = {t['id']: t['filename'] for t in intro('--targets')}
    outputs = {f for fs in files.values() for f in fs}
    want = set()
    for t in tests:
        want.update(f for d in t['depends'] for f in files.get(d, []))
        want.update(w for w in t['cmd'] + list(t['env'].values()) if w in outputs)
    root = os.path.abspath(build)
    print(' '.join(sorted(os.path.relpath(f, root) for f in want)))


if __name__ == '__main__':
    main()
