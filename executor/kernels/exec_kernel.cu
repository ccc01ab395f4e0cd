/* SPDX-License-Identifier: MIT */
/*
 * Kernel dispatch: picks the instantiation of the executor kernel for a
 * launch (packet format, dtype, reducing or copy-only) and checks residency.
 * The kernels themselves are in exec_ops.cuh, instantiated one per
 * translation unit from exec_k.cu.in (see meson.build).
 */
#include <cuda_runtime.h>
#include "gpu_int.h"

typedef void (*mscx_kfn)(const struct mscx_gpu_args);

#define MSCX_KFN_COUNT 12 /* per packet format: 6 full, 6 fast */

/* exec_k_<format>_<i>.cu, generated from exec_k.cu.in (i = 6 * fast + dtype, or + 5 for copy-only) */
extern "C" {
mscx_kfn mscx_gpu_kfn_ll16_0(void);
mscx_kfn mscx_gpu_kfn_ll16_1(void);
mscx_kfn mscx_gpu_kfn_ll16_2(void);
mscx_kfn mscx_gpu_kfn_ll16_3(void);
mscx_kfn mscx_gpu_kfn_ll16_4(void);
mscx_kfn mscx_gpu_kfn_ll16_5(void);
mscx_kfn mscx_gpu_kfn_ll16_6(void);
mscx_kfn mscx_gpu_kfn_ll16_7(void);
mscx_kfn mscx_gpu_kfn_ll16_8(void);
mscx_kfn mscx_gpu_kfn_ll16_9(void);
mscx_kfn mscx_gpu_kfn_ll16_10(void);
mscx_kfn mscx_gpu_kfn_ll16_11(void);
mscx_kfn mscx_gpu_kfn_ll8_0(void);
mscx_kfn mscx_gpu_kfn_ll8_1(void);
mscx_kfn mscx_gpu_kfn_ll8_2(void);
mscx_kfn mscx_gpu_kfn_ll8_3(void);
mscx_kfn mscx_gpu_kfn_ll8_4(void);
mscx_kfn mscx_gpu_kfn_ll8_5(void);
mscx_kfn mscx_gpu_kfn_ll8_6(void);
mscx_kfn mscx_gpu_kfn_ll8_7(void);
mscx_kfn mscx_gpu_kfn_ll8_8(void);
mscx_kfn mscx_gpu_kfn_ll8_9(void);
mscx_kfn mscx_gpu_kfn_ll8_10(void);
mscx_kfn mscx_gpu_kfn_ll8_11(void);
}

static void mscx_gpu_kfns_ll16(mscx_kfn *t)
{
    t[0] = mscx_gpu_kfn_ll16_0();
    t[1] = mscx_gpu_kfn_ll16_1();
    t[2] = mscx_gpu_kfn_ll16_2();
    t[3] = mscx_gpu_kfn_ll16_3();
    t[4] = mscx_gpu_kfn_ll16_4();
    t[5] = mscx_gpu_kfn_ll16_5();
    t[6] = mscx_gpu_kfn_ll16_6();
    t[7] = mscx_gpu_kfn_ll16_7();
    t[8] = mscx_gpu_kfn_ll16_8();
    t[9] = mscx_gpu_kfn_ll16_9();
    t[10] = mscx_gpu_kfn_ll16_10();
    t[11] = mscx_gpu_kfn_ll16_11();
}

static void mscx_gpu_kfns_ll8(mscx_kfn *t)
{
    t[0] = mscx_gpu_kfn_ll8_0();
    t[1] = mscx_gpu_kfn_ll8_1();
    t[2] = mscx_gpu_kfn_ll8_2();
    t[3] = mscx_gpu_kfn_ll8_3();
    t[4] = mscx_gpu_kfn_ll8_4();
    t[5] = mscx_gpu_kfn_ll8_5();
    t[6] = mscx_gpu_kfn_ll8_6();
    t[7] = mscx_gpu_kfn_ll8_7();
    t[8] = mscx_gpu_kfn_ll8_8();
    t[9] = mscx_gpu_kfn_ll8_9();
    t[10] = mscx_gpu_kfn_ll8_10();
    t[11] = mscx_gpu_kfn_ll8_11();
}

static mscx_kfn mscx_pick(const struct mscx_gpu_args *a)
{
    mscx_kfn tab[MSCX_KFN_COUNT];
    if (a->pkt == MSCX_PKT_LL8)
        mscx_gpu_kfns_ll8(tab);
    else
        mscx_gpu_kfns_ll16(tab);
    uint32_t base = a->fast ? 6u : 0u;
    if (!a->reduce)
        return tab[base + 5];
    return tab[base + (a->dtype <= MSCX_DT_UINT32 ? a->dtype : (uint32_t)MSCX_DT_FP32)];
}

extern "C" int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads,
                                      int pdl, void *stream)
{
    mscx_kfn fn = mscx_pick(args);
    void *params[1] = {(void *)args};
    /* the interpreter's op staging: none when every block runs the compiled program */
    int interp = !args->kprog || args->interp_mask != 0;
    size_t smem = interp ? (size_t)args->smem_ops * sizeof(struct mscx_dev_op) : 0;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(nblocks);
    cfg.blockDim = dim3(nthreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    if (pdl) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t rc = cudaLaunchKernelExC(&cfg, (const void *)fn, params);
    return rc == cudaSuccess ? 0 : (int)rc;
}

extern "C" int mscx_gpu_kernel_occupancy(uint32_t nthreads, uint32_t smem_bytes)
{
    /* take the least occupancy of every instantiation */
    mscx_kfn fns[2 * MSCX_KFN_COUNT];
    mscx_gpu_kfns_ll16(fns);
    mscx_gpu_kfns_ll8(fns + MSCX_KFN_COUNT);
    int best = -1;
    for (int i = 0; i < 2 * MSCX_KFN_COUNT; i++) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fns[i], (int)nthreads, smem_bytes) != cudaSuccess)
            return -1;
        if (best < 0 || n < best)
            best = n;
    }
    return best;
}
