/* SPDX-License-Identifier: MIT */
/*
 * Kernel dispatch: picks the instance of the executor kernel for a launch
 * (packet format, variant, dtype, reducing or copy-only) and checks
 * residency. The kernels themselves are in exec_ops.cuh, one instance per
 * translation unit generated from exec_k.cu.in (see meson.build), each
 * named mscx_kernel_<format>_<variant>_<dtype>.
 */
#include <cuda_runtime.h>
#include "launch_abi.h"

typedef void (*mscx_kernel_fn)(const struct mscx_gpu_args);

/* Per packet format and variant: the five reducing dtypes (enum mscx_dtype order), then copy-only. */
#define MSCX_KERNEL_DTYPES 6
#define MSCX_KERNEL_COPY 5 /* the copy-only instance's column */

/* clang-format off */
#define MSCX_KERNEL_EACH_DTYPE(X, f, v, V)                                                                   \
    X(f, v, V, fp32, MSCX_DT_FP32) X(f, v, V, fp16, MSCX_DT_FP16) X(f, v, V, bf16, MSCX_DT_BF16)             \
    X(f, v, V, int32, MSCX_DT_INT32) X(f, v, V, uint32, MSCX_DT_UINT32) X(f, v, V, copy, MSCX_KERNEL_COPY)
#define MSCX_KERNEL_EACH(X, f)                                                                               \
    MSCX_KERNEL_EACH_DTYPE(X, f, interpreter_1024, MSCX_KERNEL_INTERPRETER_1024)                             \
    MSCX_KERNEL_EACH_DTYPE(X, f, whole_1024, MSCX_KERNEL_WHOLE_1024)                                   \
    MSCX_KERNEL_EACH_DTYPE(X, f, whole_512, MSCX_KERNEL_WHOLE_512)                                     \
    MSCX_KERNEL_EACH_DTYPE(X, f, packet_1024, MSCX_KERNEL_PACKET_1024)                             \
    MSCX_KERNEL_EACH_DTYPE(X, f, packet_512, MSCX_KERNEL_PACKET_512)
/* clang-format on */
#define MSCX_KERNEL_DECL(f, v, V, d, D) mscx_kernel_fn mscx_kernel_##f##_##v##_##d(void);
#define MSCX_KERNEL_SET(f, v, V, d, D) t[V][D] = mscx_kernel_##f##_##v##_##d();

extern "C" {
MSCX_KERNEL_EACH(MSCX_KERNEL_DECL, ll16)
MSCX_KERNEL_EACH(MSCX_KERNEL_DECL, ll8)
}

typedef mscx_kernel_fn mscx_kernel_table[MSCX_KERNEL_VARIANTS][MSCX_KERNEL_DTYPES];

static void mscx_kernels_ll16(mscx_kernel_table t)
{
    MSCX_KERNEL_EACH(MSCX_KERNEL_SET, ll16)
}

static void mscx_kernels_ll8(mscx_kernel_table t)
{
    MSCX_KERNEL_EACH(MSCX_KERNEL_SET, ll8)
}

/* Both formats' tables, built once (the getters are called on the first launch only). */
struct mscx_kernel_tables {
    mscx_kernel_table ll16, ll8;
};

static struct mscx_kernel_tables mscx_kernel_tables_make(void)
{
    struct mscx_kernel_tables t;
    mscx_kernels_ll16(t.ll16);
    mscx_kernels_ll8(t.ll8);
    return t;
}

static const struct mscx_kernel_tables *mscx_kernel_tables(void)
{
    static const struct mscx_kernel_tables t =
        mscx_kernel_tables_make(); /* initialised once, thread-safe (C++11) */
    return &t;
}

/* The instance of the launch's variant (mscx_gpu_kernel_variant), packet format and dtype. */
static mscx_kernel_fn mscx_kernel_pick(const struct mscx_gpu_args *a, uint32_t nthreads)
{
    const struct mscx_kernel_tables *t = mscx_kernel_tables();
    const mscx_kernel_fn *row =
        (a->pkt == MSCX_PKT_LL8 ? t->ll8 : t->ll16)[mscx_gpu_kernel_variant(a, nthreads)];
    if (!a->reduce)
        return row[MSCX_KERNEL_COPY];
    return row[a->dtype <= MSCX_DT_UINT32 ? a->dtype : (uint32_t)MSCX_DT_FP32];
}

extern "C" int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads,
                                      int pdl, void *stream)
{
    mscx_kernel_fn fn = mscx_kernel_pick(args, nthreads);
    void *params[1] = {(void *)args};
    /* the interpreter's op staging: none when every block runs the compiled program */
    int interp = !args->program || args->interp_mask != 0;
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
    /* take the least occupancy of every instance that may run blocks of this size */
    const struct mscx_kernel_tables *t = mscx_kernel_tables();
    int best = -1;
    for (int f = 0; f < 2; f++)
        for (int v = 0; v < MSCX_KERNEL_VARIANTS; v++) {
            if (!mscx_gpu_kernel_variant_fits((enum mscx_kernel_variant)v, nthreads))
                continue;
            for (int d = 0; d < MSCX_KERNEL_DTYPES; d++) {
                int n = 0;
                const mscx_kernel_fn fn = (f == 0 ? t->ll16 : t->ll8)[v][d];
                if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, (int)nthreads, smem_bytes) !=
                    cudaSuccess)
                    return -1;
                if (best < 0 || n < best)
                    best = n;
            }
        }
    return best;
}

extern "C" int mscx_gpu_kernels_loadable(void)
{
    /* the attributes of one instance load its module: no image for the device, or PTX the driver cannot
       compile, shows here instead of at the first launch */
    struct cudaFuncAttributes attr;
    return (int)cudaFuncGetAttributes(&attr, (const void *)mscx_kernel_tables()->ll16[0][0]);
}
