#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Find the directory of the nccl.h the shim is built against.

Prints two lines: the directory and how it was found, or nothing (exit 1)
when no nccl.h exists in any place searched, in this order:

  NCCL_INCLUDE_DIR, NCCL_HOME/include     the user's NCCL
  CUDA_HOME/include, /usr/local/cuda/include
                                          the CUDA toolkit (where a package put NCCL)
  /usr/include, /usr/local/include        the system
  site-packages/nvidia/nccl/include       the NCCL pip wheel (nvidia-nccl-cu12/13) of the
                                          Python environments the shim's run-time search walks
                                          (executor/include/mscx/nccl_find.h), then python3's own

Usage: find_nccl_h.py
"""
import glob
import os
import sys

WHEEL_INCLUDE = os.path.join('nvidia', 'nccl', 'include')


def site_dirs(prefix):
    """The site-packages directories below a Python prefix (lib/python3.N/{site,dist}-packages)."""
    found = []
    for kind in ('site-packages', 'dist-packages'):
        found += sorted(glob.glob(os.path.join(prefix, 'lib', 'python3*', kind)), reverse=True)
    return found


def wheel_candidates():
    env = os.environ
    out = []
    for var in ('VIRTUAL_ENV', 'CONDA_PREFIX'):
        if env.get(var):
            out += [(d, f'pip wheel ({var})') for d in site_dirs(env[var])]
    for entry in filter(None, env.get('PYTHONPATH', '').split(':')):
        out.append((entry, 'pip wheel (PYTHONPATH)'))
    if env.get('PYTHONHOME'):
        out += [(d, 'pip wheel (PYTHONHOME)') for d in site_dirs(env['PYTHONHOME'])]
    home = os.path.expanduser('~')
    out += [(d, 'pip wheel (user site)') for d in site_dirs(os.path.join(home, '.local'))]
    for prefix in ('/usr/local', '/usr'):
        out += [(d, 'pip wheel (system Python)') for d in site_dirs(prefix)]
    try:
        import site
        out += [(d, 'pip wheel (python3)') for d in site.getsitepackages() + [site.getusersitepackages()]]
    except (ImportError, AttributeError):
        pass
    return [(os.path.join(d, WHEEL_INCLUDE), how) for d, how in out]


def candidates():
    env = os.environ
    out = []
    if env.get('NCCL_INCLUDE_DIR'):
        out.append((env['NCCL_INCLUDE_DIR'], 'NCCL_INCLUDE_DIR'))
    if env.get('NCCL_HOME'):
        out.append((os.path.join(env['NCCL_HOME'], 'include'), 'NCCL_HOME'))
    if env.get('CUDA_HOME'):
        out.append((os.path.join(env['CUDA_HOME'], 'include'), 'CUDA_HOME'))
    out += [('/usr/local/cuda/include', 'CUDA toolkit'), ('/usr/include', 'system'),
            ('/usr/local/include', 'system')]
    return out + wheel_candidates()


def main():
    for d, how in candidates():
        if os.path.isfile(os.path.join(d, 'nccl.h')):
            print(os.path.abspath(d))
            print(how)
            return 0
    return 1


if __name__ == '__main__':
    sys.exit(main())
