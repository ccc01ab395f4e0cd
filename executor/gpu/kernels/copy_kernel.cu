/* SPDX-License-Identifier: MIT */
/*
 * A plain device copy, for a one-rank identity launch outside graph
 * capture: launching this kernel costs the host less than a
 * cudaMemcpyAsync of the same bytes (see runtime/launch.c).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "copy_abi.h"

#define COPY_THREADS 512
#define COPY_MAX_BLOCKS 528 /* four blocks per SM of the largest GPUs served; the loop strides past it */

/* Bytes [0, head) and [head + 16 * nwords, bytes) one by one; the 16-byte words between. */
__global__ void __launch_bounds__(COPY_THREADS)
    mscx_copy_kernel(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src, uint64_t bytes,
                     uint64_t head, uint64_t nwords)
{
    uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint4 *s = (const uint4 *)(src + head);
    uint4 *d = (uint4 *)(dst + head);
    for (uint64_t i = tid; i < nwords; i += stride)
        d[i] = s[i];
    uint64_t tail = head + 16 * nwords;
    for (uint64_t i = tid; i < head + (bytes - tail); i += stride) {
        uint64_t b = i < head ? i : tail + (i - head);
        dst[b] = src[b];
    }
}

extern "C" int mscx_gpu_copy_launch(void *dst, const void *src, uint64_t bytes, void *stream)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    uint64_t head = 0, nwords = 0;
    if ((d & 15) == (s & 15)) {
        head = (16 - (d & 15)) & 15;
        if (head > bytes)
            head = bytes;
        nwords = (bytes - head) / 16;
    }
    uint64_t work = nwords ? nwords : bytes; /* the words, or every byte when there are none */
    uint64_t blocks = (work + COPY_THREADS - 1) / COPY_THREADS;
    if (blocks > COPY_MAX_BLOCKS)
        blocks = COPY_MAX_BLOCKS;
    if (blocks == 0)
        return 0;
    mscx_copy_kernel<<<(unsigned)blocks, COPY_THREADS, 0, (cudaStream_t)stream>>>(
        (uint8_t *)dst, (const uint8_t *)src, bytes, head, nwords);
    return (int)cudaGetLastError();
}
