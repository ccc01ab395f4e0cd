#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generate the NCCL API glue of the shim from the nccl.h we build against.

The header is run through the C preprocessor, every function prototype named
nccl* or pnccl* is collected, and these files are written to --outdir:

  shim_api_gen.h   function ids, pointer types, prototypes of our intercepts
  shim_api_gen.c   every exported function: a call from inside an NCCL
                   library goes back to its own definition (caller.c);
                   any other call is forwarded, or goes to our
                   shim_<name>(prof, ...) intercept
  shim_api_names.c the name of each function id and the id of its nccl*
                   name, which the rest of the shim reads
  nccl_api.txt     the exported names, one a line
  rec_gen.h        tests: one formatter per function (name + argument bytes)
  fake_gen.c       tests: the fake libnccl, one recording body per function
  driver_gen.c     tests: one call per function with distinctive arguments

Usage: gen_nccl_api.py --header nccl.h --outdir DIR --cc CC [CFLAGS...]
"""
import argparse
import os
import re
import subprocess
import sys

# Functions with logic of their own; everything else forwards unchanged.
INTERCEPTED = [
    'ncclCommInitRank', 'ncclCommInitRankConfig', 'ncclCommInitRankScalable', 'ncclCommInitAll',
    'ncclCommSplit', 'ncclCommShrink', 'ncclCommRevoke', 'ncclCommFinalize', 'ncclCommDestroy',
    'ncclCommAbort',
    'ncclAllReduce', 'ncclAllGather', 'ncclReduceScatter', 'ncclBroadcast', 'ncclBcast', 'ncclAlltoAll',
    'ncclSend', 'ncclRecv',
    'ncclGroupStart', 'ncclGroupEnd', 'ncclGroupSimulateEnd', 'ncclCommGetAsyncError', 'ncclGetLastError',
    'ncclGetErrorString', 'ncclGetVersion', 'ncclGetUniqueId', 'ncclRedOpCreatePreMulSum', 'ncclRedOpDestroy',
    'ncclCommWindowRegister', 'ncclCommWindowDeregister',
    'ncclAllReduceConfig', 'ncclAllGatherConfig', 'ncclReduceScatterConfig', 'ncclBroadcastConfig',
    'ncclAlltoAllConfig', 'ncclCommGrow', 'ncclCommGetUniqueId', 'ncclCommSuspend', 'ncclCommResume',
]

# The intercepts every header we build against (NCCL 2.19 and later) declares; the others
# are compiled only where the header has them (SHIM_HAVE_<name>).
REQUIRED = [
    'ncclCommInitRank', 'ncclCommInitRankConfig', 'ncclCommInitAll', 'ncclCommSplit', 'ncclCommFinalize',
    'ncclCommDestroy', 'ncclCommAbort', 'ncclAllReduce', 'ncclAllGather', 'ncclReduceScatter', 'ncclBroadcast',
    'ncclBcast', 'ncclSend', 'ncclRecv', 'ncclGroupStart', 'ncclGroupEnd', 'ncclCommGetAsyncError',
    'ncclGetLastError', 'ncclGetErrorString', 'ncclGetVersion', 'ncclRedOpCreatePreMulSum', 'ncclRedOpDestroy',
]

# Fake library: functions that also write their outputs (hook in fake_special.c).
FAKE_HOOKS = [
    'ncclGetVersion', 'ncclCommInitRank', 'ncclCommInitRankConfig', 'ncclCommInitRankScalable',
    'ncclCommInitAll', 'ncclCommSplit', 'ncclCommShrink', 'ncclCommCount', 'ncclCommUserRank',
    'ncclCommCuDevice', 'ncclGetUniqueId', 'ncclMemAlloc', 'ncclCommGetAsyncError', 'ncclAllGather',
    'ncclCommAbort', 'ncclCommRevoke', 'ncclAllReduce', 'ncclRedOpCreatePreMulSum',
    'ncclCommWindowRegister', 'ncclCommGrow', 'ncclCommGetUniqueId',
]

# Functions taking a communicator that leave a collecting group alone: the collectives whose
# intercepts decide themselves (shim_comm_try_route; only while in INTERCEPTED), ncclSend and ncclRecv
# (sendrecv.c keeps or forwards them) and the queries,
# which enqueue nothing. Every other one first tells the group an NCCL-bound call comes
# (shim_p2p_before_forward).
GROUP_ROUTED = {
    'ncclAllReduce', 'ncclAllGather', 'ncclReduceScatter', 'ncclBroadcast', 'ncclBcast', 'ncclAlltoAll',
    'ncclSend', 'ncclRecv',
    'ncclAllReduceConfig', 'ncclAllGatherConfig', 'ncclReduceScatterConfig', 'ncclBroadcastConfig',
    'ncclAlltoAllConfig',
}
GROUP_QUERIES = {
    'ncclCommCount', 'ncclCommCuDevice', 'ncclCommUserRank', 'ncclCommGetAsyncError', 'ncclGetLastError',
}

OPAQUE_PTR_TYPES = {'ncclComm_t', 'cudaStream_t', 'ncclWindow_t'}


class Func:
    def __init__(self, ret, name, params):
        self.ret = ret
        self.name = name
        self.params = params  # list of (type, name)

    @property
    def base(self):
        return self.name[1:] if self.name.startswith('pnccl') else self.name

    def proto(self, name=None, extra=None):
        ps = [f'{t} {n}' for t, n in self.params]
        if extra:
            ps = [extra] + ps
        return f'{self.ret} {name or self.name}({", ".join(ps) if ps else "void"})'

    def args(self):
        return ', '.join(n for _, n in self.params)

    def ptr_type(self):
        ps = ', '.join(t for t, _ in self.params) or 'void'
        return f'{self.ret} (*)({ps})'


def parse_params(text, fname):
    text = text.strip()
    if text in ('', 'void'):
        return []
    out = []
    for i, p in enumerate(text.split(',')):
        p = p.strip()
        m = re.match(r'^(.*?[\s\*])([A-Za-z_]\w*)$', p)
        if not m or m.group(1).strip() in ('', 'const', 'struct', 'enum'):
            raise SystemExit(f'gen_nccl_api: cannot parse parameter "{p}" of {fname}: teach parse_params() '
                             'in shim/gen_nccl_api.py this form (a named parameter "TYPE NAME" is expected)')
        out.append((re.sub(r'\s+', ' ', m.group(1).strip()), m.group(2)))
    return out


def parse_header(pre):
    text = re.sub(r'\s+', ' ', pre)
    text = re.sub(r'__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)', ' ', text)
    funcs = {}
    for stmt in text.split(';'):
        stmt = re.split(r'[{}]', stmt)[-1].strip()
        m = re.match(r'^(?:extern\s+)?((?:const\s+)?[A-Za-z_]\w*(?:\s*\*)*)\s*(p?nccl\w+)\s*\(([^()]*)\)$', stmt)
        if not m:
            continue
        ret = re.sub(r'\s*\*', '*', m.group(1).strip())
        name = m.group(2)
        if name in funcs:
            continue
        funcs[name] = Func(ret, name, parse_params(m.group(3), name))
    return [funcs[k] for k in sorted(funcs)]


def unavailable_return(f):
    """What a forwarder returns when the real function is missing; the reason is in ncclGetLastError."""
    if f.ret == 'ncclResult_t':
        return 'return shim_err_result();'
    if f.ret == 'void':
        return 'return;'
    if f.ret == 'const char*':
        return 'return shim_err_text();'
    if '*' in f.ret:
        return 'return NULL;'
    # any other value type (an enum, an integer, a struct): all zero bytes
    return f'{{ {f.ret} shim_none; __builtin_memset(&shim_none, 0, sizeof(shim_none)); return shim_none; }}'


def caller_check(f):
    """The first lines of an exported function: a call from inside an NCCL library goes back there."""
    own = f'((shim_fn_{f.name}_t)shim_own)({f.args()})'
    lines = [f'    void *shim_own = shim_caller_begin(SHIM_FN_{f.name}, __builtin_return_address(0));',
             '    if (shim_own) {']
    if f.ret == 'void':
        lines += [f'        {own};', '        shim_caller_end();', '        return;']
    else:
        lines += [f'        {f.ret} shim_res = {own};', '        shim_caller_end();', '        return shim_res;']
    return lines + ['    }']


def takes_comm(f):
    return any(t.replace('const ', '').strip() == 'ncclComm_t' for t, _ in f.params)


def group_hook(f):
    """A call that takes a communicator tells a collecting group that an NCCL-bound call comes."""
    routed = f.base in GROUP_ROUTED and f.base in INTERCEPTED
    if not takes_comm(f) or routed or f.base in GROUP_QUERIES:
        return []
    comm = next(n for t, n in f.params if t.replace('const ', '').strip() == 'ncclComm_t')
    return ['    if (__builtin_expect(shim_group_collecting, 0))', f'        shim_p2p_before_forward({comm});']


def gen_shim(funcs, names, outdir):
    h = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py from nccl.h; do not edit. */',
         '#ifndef SHIM_API_GEN_H', '#define SHIM_API_GEN_H', '#include <nccl.h>', '',
         'enum shim_fn {']
    for f in funcs:
        h.append(f'    SHIM_FN_{f.name},')
    h += ['    SHIM_FN_COUNT', '};', '']
    for f in funcs:
        if f.base == f.name and ('p' + f.name) not in names:
            h.append(f'#define SHIM_FN_p{f.name} SHIM_FN_{f.name}')
    h.append('')
    h.append('/** Symbol names, indexed by enum shim_fn. */')
    h.append('extern const char *const shim_fn_names[SHIM_FN_COUNT];')
    h.append('/** The id of the unprefixed name (itself for nccl*). */')
    h.append('extern const unsigned short shim_fn_base[SHIM_FN_COUNT];')
    h.append('')
    for f in funcs:
        ps = ', '.join(t for t, _ in f.params) or 'void'
        h.append(f'typedef {f.ret} (*shim_fn_{f.name}_t)({ps});')
    h.append('')
    h.append('/* Our intercepts; prof is 1 when called through the pnccl* name. */')
    for f in funcs:
        if f.name in INTERCEPTED:
            h.append(f'#define SHIM_HAVE_{f.name} 1')
            h.append(f.proto(name='shim_' + f.name, extra='int prof') + ';')
    h += ['', '/** The real function for a call through nccl* (prof 0) or pnccl* (prof 1). */',
          '#define SHIM_REAL(prof, name) ((shim_fn_##name##_t)shim_real_fn((prof) ? SHIM_FN_p##name : SHIM_FN_##name))',
          '', '#endif', '']
    t = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py from nccl.h; do not edit. */',
         '#include "shim_int.h"', '', 'const char *const shim_fn_names[SHIM_FN_COUNT] = {']
    for f in funcs:
        t.append(f'    "{f.name}",')
    t += ['};', '', 'const unsigned short shim_fn_base[SHIM_FN_COUNT] = {']
    for f in funcs:
        t.append(f'    SHIM_FN_{f.base if f.base in names else f.name},')
    t += ['};', '']
    c = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py from nccl.h; do not edit. */',
         '#include "shim_int.h"', '']
    for f in funcs:
        if not f.params:
            c.append('SHIM_EXPORT ' + f.proto() + ';  /* nccl.h declares it without (void) */')
        hot = 'SHIM_HOT ' if f.base in GROUP_ROUTED or f.base in ('ncclGroupStart', 'ncclGroupEnd') else ''
        c.append('SHIM_EXPORT ' + hot + f.proto())
        c.append('{')
        c += caller_check(f)
        c += group_hook(f)
        if f.base in INTERCEPTED:
            prof = '1' if f.name != f.base else '0'
            a = ', '.join([prof] + [n for _, n in f.params])
            c.append(f'    {"return " if f.ret != "void" else ""}shim_{f.base}({a});')
        else:
            c.append(f'    shim_fn_{f.name}_t fn = (shim_fn_{f.name}_t)shim_real_fn(SHIM_FN_{f.name});')
            c.append('    if (!fn)')
            c.append('        ' + unavailable_return(f))
            c.append('    shim_err_clear();')
            c.append(f'    {"return " if f.ret != "void" else ""}fn({f.args()});')
        c.append('}')
        c.append('')
    with open(os.path.join(outdir, 'shim_api_gen.h'), 'w') as fp:
        fp.write('\n'.join(h))
    with open(os.path.join(outdir, 'shim_api_gen.c'), 'w') as fp:
        fp.write('\n'.join(c))
    with open(os.path.join(outdir, 'shim_api_names.c'), 'w') as fp:
        fp.write('\n'.join(t))
    with open(os.path.join(outdir, 'nccl_api.txt'), 'w') as fp:
        fp.write(''.join(f.name + '\n' for f in funcs))


def gen_tests(funcs, outdir):
    r = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py; do not edit. */',
         '#ifndef REC_GEN_H', '#define REC_GEN_H', '#include <stddef.h>', '#include <stdio.h>', '#include <nccl.h>',
         '',
         '/* Append the bytes of one argument as hex to the record. */',
         'static inline void rec_bytes(char *buf, size_t n, const void *p, size_t len)',
         '{',
         '    size_t at = 0;',
         '    while (at < n && buf[at]) at++;',
         '    if (at + 2 < n) { buf[at++] = \' \'; buf[at] = 0; }',
         '    for (size_t i = 0; i < len && at + 3 < n; i++, at += 2)',
         '        snprintf(buf + at, n - at, "%02x", ((const unsigned char *)p)[i]);',
         '}', '',
         '/* The functions of the nccl.h the tests are built with. */']
    r += [f'#define REC_HAVE_{f.name} 1' for f in funcs]
    r.append('')
    for f in funcs:
        ps = ['char *buf', 'size_t n'] + [f'{t} {nm}' for t, nm in f.params]
        r.append(f'static inline void rec_fmt_{f.name}({", ".join(ps)})')
        r.append('{')
        r.append(f'    snprintf(buf, n, "%s", "{f.name}");')
        for t, nm in f.params:
            r.append(f'    rec_bytes(buf, n, &{nm}, sizeof({nm}));')
        r.append('}')
    r += ['', '#endif', '']
    fk = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py; do not edit. */',
          '#include <string.h>', '#include "fake_nccl.h"', '']
    for f in funcs:
        if not f.params:
            fk.append('FAKE_EXPORT ' + f.proto() + ';')
        fk.append('FAKE_EXPORT ' + f.proto())
        fk.append('{')
        fk.append('    char rec[FAKE_REC_MAX];')
        fk.append(f'    rec_fmt_{f.name}({", ".join(["rec", "sizeof(rec)"] + [n for _, n in f.params])});')
        fk.append('    fake_record(rec);')
        if f.base in FAKE_HOOKS:
            fk.append(f'    fake_hook_{f.base}({f.args()});')
        if f.ret == 'ncclResult_t':
            fk.append('    return fake_result();')
        elif f.ret == 'const char*':
            fk.append(f'    return "fake:{f.name}";')
        elif f.ret != 'void':
            fk.append(f'    {f.ret} none;')
            fk.append('    memset(&none, 0, sizeof(none));')
            fk.append('    return none;')
        fk.append('}')
        fk.append('')
    d = ['/* SPDX-License-Identifier: MIT */', '/* Generated by shim/gen_nccl_api.py; do not edit. */',
         '#include "driver.h"', '']
    for i, f in enumerate(funcs):
        d.append(f'static void call_{f.name}(struct drv *d)')
        d.append('{')
        d.append('    char want[DRV_REC_MAX];')
        for k, (t, nm) in enumerate(f.params):
            bt = t.replace('const ', '').strip()
            if bt in OPAQUE_PTR_TYPES:
                d.append(f'    {t} {nm} = ({t})drv_opaque(d, {k});')
            elif bt == 'ncclDataType_t':
                d.append(f'    {t} {nm} = ncclFloat32;')
            elif bt == 'ncclRedOp_t':
                d.append(f'    {t} {nm} = ncclMax;')
            elif bt == 'ncclScalarResidence_t':
                d.append(f'    {t} {nm} = ncclScalarHostImmediate;')
            elif bt == 'ncclResult_t':
                d.append(f'    {t} {nm} = ncclInvalidUsage;')
            elif '*' in t:
                d.append(f'    {t} {nm} = ({t})drv_mem(d, {k});')
            elif bt in ('int', 'size_t', 'unsigned', 'uint64_t'):
                val = '2' if nm in ('ndev', 'nId') else f'drv_int(d, {k})'
                d.append(f'    {t} {nm} = ({t}){val};')
            else:
                # any other value type (ncclUniqueId, an enum, a typedef'd handle, a struct
                # by value): distinctive bytes, compared byte for byte at the fake
                d.append(f'    {t} {nm};')
                d.append(f'    drv_fill(d, &{nm}, sizeof({nm}), {k});')
        d.append(f'    rec_fmt_{f.name}({", ".join(["want", "sizeof(want)"] + [n for _, n in f.params])});')
        d.append('    drv_before(d);')
        if f.ret == 'ncclResult_t':
            d.append(f'    ncclResult_t got = {f.name}({f.args()});')
            d.append(f'    drv_after_result(d, "{f.name}", want, got);')
        elif f.ret == 'const char*':
            d.append(f'    const char *got = {f.name}({f.args()});')
            d.append(f'    drv_after_text(d, "{f.name}", want, got, "fake:{f.name}");')
        else:
            d.append(f'    (void){f.name}({f.args()});')
            d.append(f'    drv_after_void(d, "{f.name}", want);')
        d.append('}')
        d.append('')
    d.append('const struct drv_call drv_calls[] = {')
    for f in funcs:
        d.append(f'    {{"{f.name}", call_{f.name}}},')
    d += ['};', f'const int drv_ncalls = {len(funcs)};', '']
    for name, lines in (('rec_gen.h', r), ('fake_gen.c', fk), ('driver_gen.c', d)):
        with open(os.path.join(outdir, name), 'w') as fp:
            fp.write('\n'.join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--header', required=True)
    ap.add_argument('--outdir', required=True)
    ap.add_argument('--cc', nargs=argparse.REMAINDER, required=True)
    a = ap.parse_args()
    cmd = a.cc + ['-E', '-P', '-x', 'c', a.header]
    try:
        pre = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr)
        raise SystemExit(f'gen_nccl_api: preprocessing {a.header} failed: {" ".join(cmd)}')
    funcs = parse_header(pre)
    names = {f.name for f in funcs}
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise SystemExit(f'gen_nccl_api: {a.header} lacks {", ".join(missing)}')
    if len(funcs) < 20:
        raise SystemExit(f'gen_nccl_api: only {len(funcs)} functions found in {a.header}')
    gen_shim(funcs, names, a.outdir)
    gen_tests(funcs, a.outdir)


if __name__ == '__main__':
    main()
