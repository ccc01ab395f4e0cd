// SPDX-License-Identifier: MIT
// The element reductions of op_math.h on the GPU, bit for bit against the
// same header on the host and against NCCL's own device definition (the
// intrinsics NCCL 2.28 reduces with on sm_80 and later: a + b, a * b,
// fminf and fmaxf for fp32; __hadd2, __hmul2, __hmin2 and __hmax2 for fp16
// and bf16; plain integer arithmetic and comparisons). Every pair of a set
// of special values (NaNs of either sign and with payloads, signed zeros,
// infinities, subnormals, the largest finite values) and 2^20 random pairs
// per dtype and op. Prints the min/max table of the special values.
// Exits 77 without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_math.h"

#define NRAND (1u << 20)

static const uint32_t special32[] = {0x7fc00000u, 0xffc00000u, 0x7fa00001u, 0x7fffffffu, 0xff800000u,
                                     0xbf800000u, 0x80000001u, 0x80000000u, 0x00000000u, 0x00000001u,
                                     0x3f800000u, 0x7f7fffffu, 0x7f800000u, 0x40000000u};
static const uint16_t special16[] = {0x7e00u, 0xfe00u, 0x7c01u, 0x7fffu, 0xfc00u, 0xbc00u, 0x8001u,
                                     0x8000u, 0x0000u, 0x0001u, 0x3c00u, 0x7bffu, 0x7c00u, 0x4000u};
static const uint16_t specialbf[] = {0x7fc0u, 0xffc0u, 0x7f81u, 0x7fffu, 0xff80u, 0xbf80u, 0x8001u,
                                     0x8000u, 0x0000u, 0x0001u, 0x3f80u, 0x7f7fu, 0x7f80u, 0x4000u};
#define NSPECIAL (sizeof(special32) / sizeof(special32[0]))

// NCCL's reduction of one 32-bit word (one fp32/int32/uint32 element or two 16-bit elements).
__device__ uint32_t nccl_reduce(uint32_t dt, uint32_t op, uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    if (dt == MSCX_DT_FP32) {
        float x = __uint_as_float(a), y = __uint_as_float(b), z;
        z = op == MSCX_REDOP_SUM    ? x + y
            : op == MSCX_REDOP_PROD ? x * y
            : op == MSCX_REDOP_MIN  ? fminf(x, y)
                                    : fmaxf(x, y);
        return __float_as_uint(z);
    }
    if (dt == MSCX_DT_FP16) {
        __half2 x, y, z;
        memcpy(&x, &a, 4);
        memcpy(&y, &b, 4);
        z = op == MSCX_REDOP_SUM    ? __hadd2(x, y)
            : op == MSCX_REDOP_PROD ? __hmul2(x, y)
            : op == MSCX_REDOP_MIN  ? __hmin2(x, y)
                                    : __hmax2(x, y);
        memcpy(&r, &z, 4);
        return r;
    }
    if (dt == MSCX_DT_BF16) {
        __nv_bfloat162 x, y, z;
        memcpy(&x, &a, 4);
        memcpy(&y, &b, 4);
        z = op == MSCX_REDOP_SUM    ? __hadd2(x, y)
            : op == MSCX_REDOP_PROD ? __hmul2(x, y)
            : op == MSCX_REDOP_MIN  ? __hmin2(x, y)
                                    : __hmax2(x, y);
        memcpy(&r, &z, 4);
        return r;
    }
    if (dt == MSCX_DT_INT32) {
        int32_t x = (int32_t)a, y = (int32_t)b;
        return op == MSCX_REDOP_SUM    ? a + b
               : op == MSCX_REDOP_PROD ? a * b
               : op == MSCX_REDOP_MIN  ? (uint32_t)(x < y ? x : y)
                                       : (uint32_t)(x > y ? x : y);
    }
    return op == MSCX_REDOP_SUM    ? a + b
           : op == MSCX_REDOP_PROD ? a * b
           : op == MSCX_REDOP_MIN  ? (a < b ? a : b)
                                   : (a > b ? a : b);
}

__global__ void reduce_both(uint32_t dt, uint32_t op, const uint32_t *a, const uint32_t *b, uint32_t *ours,
                            uint32_t *nccl, uint32_t n)
{
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        ours[i] = mscx_reduce_word(dt, op, a[i], b[i]);
        nccl[i] = nccl_reduce(dt, op, a[i], b[i]);
    }
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

// Special pairs first (16-bit types: both lanes, the second lane the pair reversed), then random words.
static uint32_t make_inputs(uint32_t dt, uint32_t *a, uint32_t *b)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < NSPECIAL; i++) {
        for (uint32_t j = 0; j < NSPECIAL; j++, n++) {
            if (dt == MSCX_DT_FP16 || dt == MSCX_DT_BF16) {
                const uint16_t *s = dt == MSCX_DT_FP16 ? special16 : specialbf;
                a[n] = s[i] | ((uint32_t)s[j] << 16);
                b[n] = s[j] | ((uint32_t)s[i] << 16);
            } else {
                a[n] = special32[i];
                b[n] = special32[j];
            }
        }
    }
    for (uint32_t k = 0; k < NRAND; k++, n++) {
        a[n] = next32();
        b[n] = next32();
    }
    return n;
}

static const char *const dt_names[5] = {"fp32", "fp16", "bf16", "int32", "uint32"};
static const char *const op_names[4] = {"sum", "prod", "min", "max"};

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    uint32_t cap = NSPECIAL * NSPECIAL + NRAND;
    size_t bytes = (size_t)cap * 4;
    uint32_t *a = (uint32_t *)malloc(bytes), *b = (uint32_t *)malloc(bytes);
    uint32_t *ours = (uint32_t *)malloc(bytes), *nccl = (uint32_t *)malloc(bytes);
    uint32_t *da, *db, *dours, *dnccl;
    if (!a || !b || !ours || !nccl || cudaMalloc(&da, bytes) != cudaSuccess ||
        cudaMalloc(&db, bytes) != cudaSuccess || cudaMalloc(&dours, bytes) != cudaSuccess ||
        cudaMalloc(&dnccl, bytes) != cudaSuccess) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    unsigned long bad = 0, total = 0;
    for (uint32_t dt = 0; dt < 5; dt++) {
        uint32_t n = make_inputs(dt, a, b);
        cudaMemcpy(da, a, (size_t)n * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b, (size_t)n * 4, cudaMemcpyHostToDevice);
        for (uint32_t op = 0; op < 4; op++) {
            reduce_both<<<256, 256>>>(dt, op, da, db, dours, dnccl, n);
            if (cudaDeviceSynchronize() != cudaSuccess) {
                fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
                return 1;
            }
            cudaMemcpy(ours, dours, (size_t)n * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(nccl, dnccl, (size_t)n * 4, cudaMemcpyDeviceToHost);
            unsigned long bad_gpu = 0, bad_host = 0;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t host = mscx_reduce_word(dt, op, a[i], b[i]);
                if (ours[i] != nccl[i] && bad_gpu++ < 5)
                    printf("  %s %s(0x%08x, 0x%08x): mscx GPU 0x%08x, NCCL 0x%08x\n", dt_names[dt],
                           op_names[op], a[i], b[i], ours[i], nccl[i]);
                if (host != ours[i] && bad_host++ < 5)
                    printf("  %s %s(0x%08x, 0x%08x): mscx host 0x%08x, mscx GPU 0x%08x\n", dt_names[dt],
                           op_names[op], a[i], b[i], host, ours[i]);
            }
            printf("%-6s %-4s %8u pairs: GPU vs NCCL %lu differ, GPU vs host %lu differ\n", dt_names[dt],
                   op_names[op], n, bad_gpu, bad_host);
            bad += bad_gpu + bad_host;
            total += n;
            if (op >= MSCX_REDOP_MIN && dt <= MSCX_DT_BF16) { // the table: rows a, columns b
                printf("  %s table (NCCL's result, low lane):\n          ", op_names[op]);
                for (uint32_t j = 0; j < NSPECIAL; j++)
                    printf(" %8x", a[j * NSPECIAL] & (dt == MSCX_DT_FP32 ? 0xffffffffu : 0xffffu));
                printf("\n");
                for (uint32_t i = 0; i < NSPECIAL; i++) {
                    printf("  %8x", a[i * NSPECIAL] & (dt == MSCX_DT_FP32 ? 0xffffffffu : 0xffffu));
                    for (uint32_t j = 0; j < NSPECIAL; j++)
                        printf(" %8x", nccl[i * NSPECIAL + j] & (dt == MSCX_DT_FP32 ? 0xffffffffu : 0xffffu));
                    printf("\n");
                }
            }
        }
    }
    printf("%lu of %lu results differ\n", bad, total * 1);
    return bad ? 1 : 0;
}
