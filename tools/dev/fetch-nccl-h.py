#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Fetch the nccl.h of one NCCL version from NCCL's pip wheel, once.

Prints the include directory that holds nccl.h (the wheel's own layout,
CACHE/VERSION/nvidia/nccl/include) and exits 0; or prints one line on
stderr saying why it could not (no pip, no network, no such version) and
exits 1. Only the wheel's nvidia/nccl/include is kept; nothing is installed.

  CACHE defaults to $XDG_CACHE_HOME/mscx/nccl-headers (~/.cache/mscx/nccl-headers).
  Versions from 2.27.7 come from nvidia-nccl-cu13, older ones from nvidia-nccl-cu12.

Usage: fetch-nccl-h.py VERSION [--cache DIR]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

INCLUDE = 'nvidia/nccl/include/'


def default_cache():
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'mscx', 'nccl-headers')


def wheel_name(version):
    parts = tuple(int(x) for x in version.split('.'))
    return 'nvidia-nccl-cu13' if parts >= (2, 27, 7) else 'nvidia-nccl-cu12'


def header_version(path):
    text = open(path, encoding='utf-8', errors='replace').read()
    found = [re.search(r'#define NCCL_' + k + r' +(\d+)', text) for k in ('MAJOR', 'MINOR', 'PATCH')]
    return '.'.join(m.group(1) for m in found) if all(found) else None


def download(spec, dest):
    """pip download of one wheel into dest; returns None or the reason it failed."""
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '--no-cache-dir',
           '--disable-pip-version-check', '--retries', '1', '--timeout', '30', '--dest', dest, spec]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f'pip download {spec}: {e}'
    if r.returncode != 0:
        last = [l for l in r.stdout.strip().splitlines() if l.strip()]
        return f'pip download {spec} failed: {last[-1] if last else "exit " + str(r.returncode)}'
    return None


def unpack_include(wheel, dest):
    """Extracts the wheel's nvidia/nccl/include/ into dest (wheel layout); returns the file count."""
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if not member.startswith(INCLUDE) or member.endswith('/') or '..' in member.split('/'):
                continue
            z.extract(member, dest)
            n += 1
    return n


def fetch(version, cache):
    final = os.path.join(cache, version)
    include = os.path.join(final, INCLUDE)
    if os.path.isfile(os.path.join(include, 'nccl.h')):
        return include, None
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f'.{version}-', dir=cache)
    try:
        spec = f'{wheel_name(version)}=={version}'
        why = download(spec, work)
        if why:
            return None, why
        wheels = glob.glob(os.path.join(work, '*.whl'))
        if len(wheels) != 1:
            return None, f'pip download {spec} left {len(wheels)} wheels'
        unpacked = os.path.join(work, 'unpacked')
        try:
            unpack_include(wheels[0], unpacked)
        except (zipfile.BadZipFile, OSError) as e:
            return None, f'{os.path.basename(wheels[0])}: {e}'
        got = os.path.join(unpacked, INCLUDE, 'nccl.h')
        if not os.path.isfile(got):
            return None, f'{os.path.basename(wheels[0])} holds no {INCLUDE}nccl.h'
        if header_version(got) != version:
            return None, f'{os.path.basename(wheels[0])}: nccl.h says NCCL {header_version(got)}, not {version}'
        if not os.path.isfile(os.path.join(include, 'nccl.h')):
            shutil.rmtree(final, ignore_errors=True)  # a directory without nccl.h
        try:
            os.rename(unpacked, final)
        except OSError as e:
            if not os.path.isfile(os.path.join(include, 'nccl.h')):  # not another fetch that won
                return None, f'{final}: {e}'
        return include, None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('version', help='NCCL version, e.g. 2.28.9')
    ap.add_argument('--cache', default=default_cache(), help='cache directory (default: %(default)s)')
    args = ap.parse_args()
    if not re.fullmatch(r'\d+\.\d+\.\d+', args.version):
        print(f'fetch-nccl-h: {args.version!r} is not a version like 2.28.9', file=sys.stderr)
        return 2
    include, why = fetch(args.version, args.cache)
    if why:
        print(f'fetch-nccl-h: no nccl.h {args.version}: {why}', file=sys.stderr)
        return 1
    print(os.path.abspath(include).rstrip('/'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
