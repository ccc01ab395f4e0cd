#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nccl.h where users have it: tools/dev/fetch-nccl-h.py against a stand-in pip
(a 'pip' package first on PYTHONPATH, so 'python3 -m pip' runs it), then a
build dir whose only nccl.h is that wheel-layout directory builds the shim,
and a build that cannot find nccl.h stops unless -Dshim=disabled.

usage: test_nccl_h_fetch.py SOURCE_ROOT NCCL_H
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FAKE_PIP = r'''
import os, sys, zipfile
args = sys.argv[1:]
spec = args[-1]
dest = args[args.index('--dest') + 1]
with open(os.environ['FAKE_PIP_LOG'], 'a') as f:
    f.write(spec + '\n')
if spec != os.environ.get('FAKE_PIP_HAS', ''):
    print('ERROR: No matching distribution found for ' + spec)
    sys.exit(1)
name, version = spec.split('==')
wheel = os.path.join(dest, name.replace('-', '_') + '-' + version + '-py3-none-manylinux_2_18_x86_64.whl')
with zipfile.ZipFile(wheel, 'w') as z:
    z.write(os.environ['FAKE_PIP_HEADER'], 'nvidia/nccl/include/nccl.h')
    z.writestr('nvidia/nccl/lib/libnccl.so.2', 'not a header')
    z.writestr('nvidia/nccl/include/__init__.py', '')
'''


def header_version(path):
    text = open(path).read()
    return '.'.join(re.search(r'#define NCCL_' + k + r' +(\d+)', text).group(1) for k in ('MAJOR', 'MINOR', 'PATCH'))


def wheel_of(version):
    return ('nvidia-nccl-cu13' if tuple(map(int, version.split('.'))) >= (2, 27, 7) else 'nvidia-nccl-cu12') + \
        '==' + version


def check(cond, what):
    if not cond:
        print('FAIL: ' + what)
        sys.exit(1)


def fetch(src, tmp, version, has):
    env = dict(os.environ, PYTHONPATH=os.path.join(tmp, 'fakepip'), FAKE_PIP_HAS=has,
               FAKE_PIP_LOG=os.path.join(tmp, 'pip.log'), FAKE_PIP_HEADER=os.environ['NCCL_H_UNDER_TEST'])
    return subprocess.run([sys.executable, os.path.join(src, 'tools', 'dev', 'fetch-nccl-h.py'), version,
                           '--cache', os.path.join(tmp, 'cache')],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pip_calls(tmp):
    p = os.path.join(tmp, 'pip.log')
    return open(p).read().split() if os.path.exists(p) else []


def test_fetch(src, tmp, v):
    r = fetch(src, tmp, v, wheel_of(v))
    include = os.path.join(tmp, 'cache', v, 'nvidia', 'nccl', 'include')
    check(r.returncode == 0 and r.stdout.strip() == include, f'fetch {v}: rc {r.returncode}, {r.stdout}{r.stderr}')
    check(os.path.isfile(os.path.join(include, 'nccl.h')), 'no nccl.h in the cache')
    check(not os.path.exists(os.path.join(tmp, 'cache', v, 'nvidia', 'nccl', 'lib')),
          'more than the include directory was unpacked')
    check(os.listdir(os.path.join(tmp, 'cache')) == [v], 'left over: ' + str(os.listdir(tmp + '/cache')))
    # Cached: pip is not asked again, even where it would fail.
    r = fetch(src, tmp, v, '')
    check(r.returncode == 0 and r.stdout.strip() == include, 'the cached header was not used')
    check(pip_calls(tmp) == [wheel_of(v)], 'pip calls: ' + str(pip_calls(tmp)))
    # Not to be had (no network, no such wheel): exit 1 and one line saying why; 2.18 comes from -cu12.
    r = fetch(src, tmp, '2.18.1', '')
    check(r.returncode == 1 and r.stdout == '', f'a failed fetch: rc {r.returncode}, stdout {r.stdout!r}')
    check(r.stderr.count('\n') == 1 and 'no nccl.h 2.18.1' in r.stderr and 'No matching distribution' in r.stderr,
          'stderr: ' + r.stderr)
    check(pip_calls(tmp)[-1] == 'nvidia-nccl-cu12==2.18.1', 'pip calls: ' + str(pip_calls(tmp)))
    check(os.listdir(os.path.join(tmp, 'cache')) == [v], 'a failed fetch left files behind')
    # A wheel whose header is of another version is refused.
    r = fetch(src, tmp, '2.99.0', 'nvidia-nccl-cu13==2.99.0')
    check(r.returncode == 1 and 'not 2.99.0' in r.stderr, 'a wrong version was kept: ' + r.stderr)
    return include


def meson_setup(src, tmp, name, args, env):
    return subprocess.run(['meson', 'setup', os.path.join(tmp, name), src, '-Dcuda=disabled', '-Dtests=disabled',
                           '-Dfuzz=disabled'] + args, env=dict(os.environ, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_build(src, tmp, include, v):
    r = meson_setup(src, tmp, 'b-wheel', [], {'NCCL_INCLUDE_DIR': include})
    want = f'NCCL shim built against {include}/nccl.h (NCCL {v}, NCCL_INCLUDE_DIR)'
    check(r.returncode == 0 and want in r.stdout, 'configure with the wheel header:\n' + r.stdout[-3000:])
    r = subprocess.run(['ninja', '-C', os.path.join(tmp, 'b-wheel'), 'shim/libmscx_nccl.so'],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, 'the shim did not build:\n' + r.stdout[-3000:])
    empty = os.path.join(tmp, 'empty')
    os.mkdir(empty)
    r = meson_setup(src, tmp, 'b-none', ['-Dnccl_include=' + empty], {})
    check(r.returncode != 0 and 'the NCCL shim needs nccl.h' in r.stdout,
          'a build without nccl.h did not stop:\n' + r.stdout[-2000:])
    r = meson_setup(src, tmp, 'b-off', ['-Dnccl_include=' + empty, '-Dshim=disabled'], {})
    check(r.returncode == 0 and 'NCCL shim not built (-Dshim=disabled)' in r.stdout,
          '-Dshim=disabled did not configure:\n' + r.stdout[-2000:])


def main():
    src, nccl_h = sys.argv[1], sys.argv[2]
    if not shutil.which('meson') or not shutil.which('ninja'):
        print('meson or ninja not on PATH')
        return 77
    os.environ['NCCL_H_UNDER_TEST'] = nccl_h
    tmp = tempfile.mkdtemp(prefix='mscx-nccl-h-')
    try:
        os.makedirs(os.path.join(tmp, 'fakepip', 'pip'))
        open(os.path.join(tmp, 'fakepip', 'pip', '__init__.py'), 'w').close()
        with open(os.path.join(tmp, 'fakepip', 'pip', '__main__.py'), 'w') as f:
            f.write(FAKE_PIP)
        v = header_version(nccl_h)
        include = test_fetch(src, tmp, v)
        test_build(src, tmp, include, v)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print('ok: fetched into a wheel layout, the shim built from it, no nccl.h stops the build')
    return 0


if __name__ == '__main__':
    sys.exit(main())
