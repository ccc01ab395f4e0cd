/* SPDX-License-Identifier: MIT */
/*
 * The device copy of a one-rank identity launch run eagerly: the host side
 * (runtime/launch.c) and the kernel (kernels/copy_kernel.cu) meet here.
 */
#ifndef MSCX_GPU_COPY_ABI_H
#define MSCX_GPU_COPY_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Enqueue a copy of @p bytes from @p src to @p dst (not overlapping) on
 * @p stream as one kernel: 16-byte words where both pointers share their
 * offset within 16 bytes, single bytes elsewhere.
 * @return 0 (cudaSuccess) or the CUDA error of the launch
 */
int mscx_gpu_copy_launch(void *dst, const void *src, uint64_t bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_GPU_COPY_ABI_H */
