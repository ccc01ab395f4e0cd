# SPDX-License-Identifier: MIT
"""Shared by the Python tests (standard library only).

Checks: named checks counted as they go, "ok: NAME" or "FAIL: NAME" plus the
detail; Tests: a registry of test functions run one after the other, each
"ok   NAME" or "FAIL NAME" plus its traceback. Both end in the line
"N passed, M failed" and return the exit status (1 on any failure).
load_script: a Python script without the .py ending (tools/ab/mscx-ab) as a
module.

  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
  import pycheck  # noqa: E402
"""
import importlib.machinery
import importlib.util
import traceback


class Checks:
    """check = Checks(); check(name, cond, detail); ...; return check.done()"""

    def __init__(self, tail=None):
        self.passed = self.failed = 0
        self.tail = tail  # print only the last TAIL characters of a failure's detail

    def __call__(self, name, cond, detail=""):
        if cond:
            self.passed += 1
            print("ok: " + name)
        else:
            self.failed += 1
            print("FAIL: %s\n%s" % (name, detail if self.tail is None else detail[-self.tail:]))
        return bool(cond)

    def count(self):
        return self.passed + self.failed

    def done(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0


class Tests:
    """test = Tests(); @test def case(): assert ...; sys.exit(test.main())"""

    def __init__(self):
        self.funcs = []

    def __call__(self, f):
        self.funcs.append(f)
        return f

    def main(self):
        passed = failed = 0
        for f in self.funcs:
            try:
                f()
                passed += 1
                print("ok   %s" % f.__name__)
            except Exception:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                print("FAIL %s" % f.__name__)
                traceback.print_exc()
        print("%d passed, %d failed" % (passed, failed))
        return 1 if failed else 0


def load_script(path, name):
    """The Python script at PATH (any file name) imported as module NAME."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
