/* SPDX-License-Identifier: MIT */
/*
 * The scale kernel (scale_abi.h): each thread multiplies elements of the
 * input by the scalar with op_math.h's mscx_scale_f32 / mscx_scale16, the
 * functions the host reference executor runs, so both give the same bits.
 * A device scalar is read once per block when the kernel runs (a CUDA graph
 * replay sees the value of that moment).
 */
#include <cuda_runtime.h>
#include "op_math.h"
#include "scale_abi.h"

#define MSCX_SCALE_THREADS 256u
#define MSCX_SCALE_MAX_BLOCKS 1024u

template <unsigned DT>
__global__ void __launch_bounds__(MSCX_SCALE_THREADS)
    mscx_scale_kernel(uint8_t *dst, const uint8_t *src, uint64_t n, uint32_t bits, const void *dev_scalar)
{
    uint32_t s = bits;
    if (dev_scalar)
        s = DT == MSCX_DT_FP32 ? *(const uint32_t *)dev_scalar : *(const uint16_t *)dev_scalar;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (DT == MSCX_DT_FP32) {
            ((uint32_t *)dst)[i] = mscx_scale_f32(((const uint32_t *)src)[i], s);
        } else {
            ((uint16_t *)dst)[i] = mscx_scale16(DT, ((const uint16_t *)src)[i], (uint16_t)s);
        }
    }
}

extern "C" int mscx_gpu_scale_launch(unsigned dtype, void *dst, const void *src, uint64_t bytes,
                                     uint64_t bits, const void *dev_scalar, void *stream)
{
    uint64_t esize = dtype == MSCX_DT_FP32 ? 4u : 2u, n = bytes / esize;
    if (n == 0)
        return (int)cudaSuccess;
    uint64_t blocks = (n + MSCX_SCALE_THREADS - 1) / MSCX_SCALE_THREADS;
    dim3 grid((unsigned)(blocks < MSCX_SCALE_MAX_BLOCKS ? blocks : MSCX_SCALE_MAX_BLOCKS));
    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *x = (const uint8_t *)src;
    switch (dtype) {
    case MSCX_DT_FP32:
        mscx_scale_kernel<MSCX_DT_FP32>
            <<<grid, MSCX_SCALE_THREADS, 0, s>>>(d, x, n, (uint32_t)bits, dev_scalar);
        break;
    case MSCX_DT_FP16:
        mscx_scale_kernel<MSCX_DT_FP16>
            <<<grid, MSCX_SCALE_THREADS, 0, s>>>(d, x, n, (uint32_t)bits, dev_scalar);
        break;
    case MSCX_DT_BF16:
        mscx_scale_kernel<MSCX_DT_BF16>
            <<<grid, MSCX_SCALE_THREADS, 0, s>>>(d, x, n, (uint32_t)bits, dev_scalar);
        break;
    default:
        return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
