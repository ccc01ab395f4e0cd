/* SPDX-License-Identifier: MIT */
/* The executor kernels for LL8 packets (a translation unit of its own so the build compiles formats in parallel). */
#include "exec_ops.cuh"

extern "C" void mscx_gpu_kfns_ll8(mscx_kfn *tab)
{
    static const mscx_kfn k[MSCX_KFN_COUNT] = MSCX_KFN_TABLE(MSCX_PKT_LL8);
    for (int i = 0; i < MSCX_KFN_COUNT; i++)
        tab[i] = k[i];
}
