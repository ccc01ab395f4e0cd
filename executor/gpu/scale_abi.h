/* SPDX-License-Identifier: MIT */
/*
 * The scale kernel of a scaled sum (mscx_exec_launch_scaled): the host side
 * (runtime/launch.c) and the kernel (kernels/scale_kernel.cu) meet here.
 */
#ifndef MSCX_GPU_SCALE_ABI_H
#define MSCX_GPU_SCALE_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Enqueue dst[i] = src[i] * s for the @p bytes of fp32, fp16 or bf16 @p dtype
 * (mscx_scale_bytes(), element by element; dst may be src) on @p stream,
 * legal under graph capture. The scalar s is @p bits, or, when @p dev_scalar
 * is not NULL, the element it points to, read by the kernel when it runs.
 * @return 0 (cudaSuccess) or the CUDA error of the launch
 */
int mscx_gpu_scale_launch(unsigned dtype, void *dst, const void *src, uint64_t bytes, uint64_t bits,
                          const void *dev_scalar, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_GPU_SCALE_ABI_H */
