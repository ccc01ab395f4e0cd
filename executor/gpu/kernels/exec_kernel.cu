/* SPDX-License-Identifier: MIT */
/*
 * Kernel dispatch: picks the instantiation of the executor kernel for a
 * launch (packet format, dtype, reducing or copy-only) and checks residency.
 * The kernels themselves are in exec_ops.cuh, instantiated one per
 * translation unit from exec_k.cu.in (see meson.build).
 */
#include <cuda_runtime.h>
#include "launch_abi.h"

typedef void (*mscx_kfn)(const struct mscx_gpu_args);

/*
 * Per packet format, MSCX_KV_COUNT variants (enum mscx_kvariant, launch_abi.h)
 * of MSCX_KV_WIDTH instantiations each: the five dtypes of reducing plans,
 * then copy-only.
 */
#define MSCX_KV_WIDTH 6
#define MSCX_KV_COPY 5 /* index in a variant of the copy-only kernel */
#define MSCX_KFN_COUNT (MSCX_KV_COUNT * MSCX_KV_WIDTH)

/* exec_k_<format>_<i>.cu, generated from exec_k.cu.in (i = 6 * variant + dtype, or + 5 for copy-only) */
/* clang-format off */
#ifdef MSCX_KSUBSET_FP32 /* meson -Dkernel_subset=fp32 (benchmark builds): fp32 and copy-only kernels only */
#define MSCX_KFN_EACH(X, f)                                                          \
    X(f, 0) X(f, 5) X(f, 6) X(f, 11) X(f, 12) X(f, 17) X(f, 18) X(f, 23) X(f, 24)    \
    X(f, 29)
#else
#define MSCX_KFN_EACH(X, f)                                                          \
    X(f, 0) X(f, 1) X(f, 2) X(f, 3) X(f, 4) X(f, 5) X(f, 6) X(f, 7) X(f, 8)          \
    X(f, 9) X(f, 10) X(f, 11) X(f, 12) X(f, 13) X(f, 14) X(f, 15) X(f, 16) X(f, 17)  \
    X(f, 18) X(f, 19) X(f, 20) X(f, 21) X(f, 22) X(f, 23) X(f, 24) X(f, 25) X(f, 26) \
    X(f, 27) X(f, 28) X(f, 29)
#endif
/* clang-format on */
#define MSCX_KFN_DECL(f, i) mscx_kfn mscx_gpu_kfn_##f##_##i(void);
#define MSCX_KFN_SET(f, i) t[i] = mscx_gpu_kfn_##f##_##i();

extern "C" {
MSCX_KFN_EACH(MSCX_KFN_DECL, ll16)
MSCX_KFN_EACH(MSCX_KFN_DECL, ll8)
}

/* the table of one format; an instantiation this build does not have (kernel_subset) is NULL */
static void mscx_gpu_kfns_ll16(mscx_kfn *t)
{
    for (int i = 0; i < MSCX_KFN_COUNT; i++)
        t[i] = NULL;
    MSCX_KFN_EACH(MSCX_KFN_SET, ll16)
}

static void mscx_gpu_kfns_ll8(mscx_kfn *t)
{
    for (int i = 0; i < MSCX_KFN_COUNT; i++)
        t[i] = NULL;
    MSCX_KFN_EACH(MSCX_KFN_SET, ll8)
}

/* Both formats' tables, built once (the getters are called on the first launch only). */
struct mscx_kfn_tables {
    mscx_kfn ll16[MSCX_KFN_COUNT], ll8[MSCX_KFN_COUNT];
};

static struct mscx_kfn_tables mscx_kfn_tables_make(void)
{
    struct mscx_kfn_tables t;
    mscx_gpu_kfns_ll16(t.ll16);
    mscx_gpu_kfns_ll8(t.ll8);
    return t;
}

static const struct mscx_kfn_tables *mscx_kfn_tables(void)
{
    static const struct mscx_kfn_tables t = mscx_kfn_tables_make(); /* initialised once, thread-safe (C++11) */
    return &t;
}

/* whether instantiation @p i (of one format) can run blocks of @p nthreads */
static bool mscx_kfn_fits(int i, uint32_t nthreads)
{
    return mscx_gpu_kvariant_fits((enum mscx_kvariant)(i / MSCX_KV_WIDTH), nthreads) != 0;
}

/* The instantiation of the launch's variant (mscx_gpu_kvariant), packet format and dtype. */
static mscx_kfn mscx_pick(const struct mscx_gpu_args *a, uint32_t nthreads)
{
    const mscx_kfn *tab = a->pkt == MSCX_PKT_LL8 ? mscx_kfn_tables()->ll8 : mscx_kfn_tables()->ll16;
    uint32_t base = (uint32_t)mscx_gpu_kvariant(a, nthreads) * MSCX_KV_WIDTH;
    if (!a->reduce)
        return tab[base + MSCX_KV_COPY];
    return tab[base + (a->dtype <= MSCX_DT_UINT32 ? a->dtype : (uint32_t)MSCX_DT_FP32)];
}

extern "C" int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads,
                                      int pdl, void *stream)
{
    mscx_kfn fn = mscx_pick(args, nthreads);
    if (!fn)
        return (int)cudaErrorInvalidDeviceFunction; /* not in this build (kernel_subset) */
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
    /* take the least occupancy of every instantiation that may run blocks of this size */
    const struct mscx_kfn_tables *t = mscx_kfn_tables();
    int best = -1;
    for (int i = 0; i < 2 * MSCX_KFN_COUNT; i++) {
        int n = 0;
        const mscx_kfn fn = i < MSCX_KFN_COUNT ? t->ll16[i] : t->ll8[i - MSCX_KFN_COUNT];
        if (!fn || !mscx_kfn_fits(i % MSCX_KFN_COUNT, nthreads))
            continue;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, (int)nthreads, smem_bytes) !=
            cudaSuccess)
            return -1;
        if (best < 0 || n < best)
            best = n;
    }
    return best;
}
