#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mscx-ab's plot from a recorded ab.json with one plotter (gnuplot or matplotlib):
a valid PNG of the expected size appears. Exit 77 (skip) when that plotter is missing."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib


def png_problems(path):
    """'' for a well-formed PNG (signature, IHDR first, every chunk's CRC, IDAT, IEND last), else what is wrong."""
    if not os.path.exists(path):
        return "no %s" % path
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return "bad signature"
    pos, kinds, size = 8, [], None
    while pos < len(data):
        if pos + 12 > len(data):
            return "truncated chunk at %d" % pos
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        crc = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if len(body) != n or zlib.crc32(kind + body) & 0xffffffff != crc:
            return "bad chunk %r at %d" % (kind, pos)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        kinds.append(kind)
        pos += 12 + n
    if not kinds or kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        return "chunks %r" % kinds
    if size is None or size[0] < 600 or size[1] < 400:
        return "image size %r" % (size,)
    return ""


def main():
    ab, fixture, plotter = sys.argv[1], sys.argv[2], sys.argv[3]
    if plotter == "gnuplot" and shutil.which("gnuplot") is None:
        print("gnuplot not installed: skip")
        return 77
    python = sys.executable
    if plotter == "matplotlib":
        # the interpreter meson found, else the system one (where apt installs python3-matplotlib)
        python = None
        for cand in (sys.executable, "/usr/bin/python3"):
            if os.path.exists(cand) and subprocess.run([cand, "-c", "import matplotlib"], stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT).returncode == 0:
                python = cand
                break
        if python is None:
            print("python3 matplotlib not installed: skip")
            return 77
    tmp = tempfile.mkdtemp(prefix="mscx-ab-plot-")
    try:
        out = os.path.join(tmp, "out")
        p = subprocess.run([python, ab, "--replot", fixture, "--out", out, "--plotter", plotter],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        png = os.path.join(out, "ab.png")
        bad = png_problems(png)
        if p.returncode != 0 or bad or ("plot: %s" % png) not in p.stdout:
            print("FAIL: %s plot: exit %d, %s\n%s%s" % (plotter, p.returncode, bad or "ok", p.stdout, p.stderr))
            return 1
        # gnuplot draws from ab.dat: the sizes that have both times (the n/a one is left out)
        if plotter == "gnuplot":
            rows = [l for l in open(os.path.join(out, "ab.dat")) if not l.startswith("#")]
            if len(rows) != 11 or not rows[0].startswith("1024 "):
                print("FAIL: ab.dat has %d rows, first %r" % (len(rows), rows[:1]))
                return 1
        # the checker itself rejects a damaged file
        data = bytearray(open(png, "rb").read())
        data[40] ^= 0xff
        with open(os.path.join(tmp, "bad.png"), "wb") as fh:
            fh.write(data)
        if not png_problems(os.path.join(tmp, "bad.png")):
            print("FAIL: a damaged PNG passed the check")
            return 1
        print("ok: %s drew a valid %d-byte PNG from %s" % (plotter, os.path.getsize(png), os.path.basename(fixture)))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
