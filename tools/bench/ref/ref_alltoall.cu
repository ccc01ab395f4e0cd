// SPDX-License-Identifier: MIT
// The hand-written LL16 packet alltoall kernel (see ref.h) and its launch: the
// algorithm of plans/alltoall_*_oneshot_*.json. One 8-byte unit of data
// travels as one 16-byte LL16 line {lo, flag, hi, flag}; the flags, the
// scratch halves and programmatic dependent launch are as in ref_kernels.cu.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "ref.h"

namespace
{

struct a2a_kargs {
    const char *in;
    char *out;
    char *scr[MSCX_REF_MAX_RANKS];
    uint32_t *state;
    uint32_t rank, n;
    uint64_t bu;         // 8-byte units of one peer's block
    uint64_t half;       // bytes of one scratch half
    uint64_t timeout_ns; // 0: no limit
};

__device__ __forceinline__ void a2a_put(char *p, uint2 v, uint32_t f)
{
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(f), "r"(v.y),
                 "r"(f)
                 : "memory");
}

__device__ __forceinline__ uint64_t a2a_now(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Wait for the line at p to carry flag f in both halves; after a timeout (recorded in the error word)
// the thread stops waiting for anything.
__device__ __forceinline__ uint2 a2a_get(const a2a_kargs &a, const char *p, uint32_t f, bool &dead)
{
    uint32_t x, fx, y, fy;
    uint64_t t0 = 0;
    for (uint32_t spins = 0; !dead; spins++) {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x), "=r"(fx), "=r"(y), "=r"(fy)
                     : "l"(p)
                     : "memory");
        if (fx == f && fy == f)
            return make_uint2(x, y);
        if (a.timeout_ns && (spins & 1023u) == 1023u) {
            uint64_t now = a2a_now();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > a.timeout_ns) {
                *(volatile uint32_t *)&a.state[MSCX_REF_MAX_BLOCKS] = 1u;
                dead = true;
            }
        }
    }
    return make_uint2(0, 0);
}

__device__ __forceinline__ uint2 a2a_load(const char *p)
{
    return *reinterpret_cast<const uint2 *>(p);
}

__device__ __forceinline__ void a2a_store(char *p, uint2 v)
{
    *reinterpret_cast<uint2 *>(p) = v;
}

__device__ __forceinline__ void a2a_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// This launch's flag: one more than the last, equal on all of a rank's blocks (a2a_end).
__device__ __forceinline__ uint32_t a2a_flag(const a2a_kargs &a)
{
    __shared__ uint32_t s_f;
    if (threadIdx.x == 0) {
        uint32_t f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
        s_f = f == 0 ? 1u : f; // 0 is the zeroed scratch
    }
    __syncthreads();
    return s_f;
}

__device__ __forceinline__ void a2a_end(const a2a_kargs &a, uint32_t f)
{
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
    if (blockIdx.x == 0)
        for (uint32_t i = gridDim.x + threadIdx.x; i < MSCX_REF_MAX_BLOCKS; i += blockDim.x)
            *(volatile uint32_t *)&a.state[i] = f;
}

// Block p of the input goes to slot `rank` of peer p's scratch as packets, the own block to the output;
// then slot p of the own scratch is unpacked into block p of the output.
__global__ void __launch_bounds__(1024, 1) ref_alltoall(const a2a_kargs a)
{
    const uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x,
                   nt = gridDim.x * (uint64_t)blockDim.x;
    a2a_wait();
    const uint32_t f = a2a_flag(a);
    const uint64_t so = (f & 1u) ? 0 : a.half, slot = 16 * a.bu;
    bool dead = false;
    for (uint32_t q = 1; q < a.n; q++) {
        const uint32_t p = (a.rank + q) % a.n; // every rank starts with a different peer
        char *dst = a.scr[p] + so + a.rank * slot;
        for (uint64_t u = tid; u < a.bu; u += nt)
            a2a_put(dst + u * 16, a2a_load(a.in + (p * a.bu + u) * 8), f);
    }
    for (uint64_t u = tid; u < a.bu; u += nt)
        a2a_store(a.out + (a.rank * a.bu + u) * 8, a2a_load(a.in + (a.rank * a.bu + u) * 8));
    const char *mine = a.scr[a.rank] + so;
    for (uint32_t q = 1; q < a.n; q++) {
        const uint32_t p = (a.rank + a.n - q) % a.n; // the peer that sent to this rank first
        for (uint64_t u = tid; u < a.bu; u += nt)
            a2a_store(a.out + (p * a.bu + u) * 8, a2a_get(a, mine + p * slot + u * 16, f, dead));
    }
    a2a_end(a, f);
}

// Programmatic dependent launch needs Hopper or later and CUDA 12.3, and every rank's blocks on the GPU
// twice over (else a waiting launch could keep a peer's blocks off the GPU: a hang). The device's answers
// are asked once per block size, so that timed launches make no query.
bool a2a_pdl_ok(uint32_t threads, uint64_t blocks)
{
    static uint32_t s_threads;
    static uint64_t s_fit; // blocks that fit at once; 0: no programmatic dependent launch
    if (s_threads != threads) {
        int dev = 0, major = 0, drv = 0, sms = 0, per_sm = 0;
        bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDriverGetVersion(&drv) == cudaSuccess && major >= 9 && drv >= 12030 &&
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ref_alltoall, (int)threads, 0) ==
                      cudaSuccess;
        s_fit = ok ? (uint64_t)per_sm * (uint64_t)sms : 0;
        s_threads = threads;
    }
    return s_fit >= 2u * blocks;
}

} // namespace

extern "C" int mscx_ref_launch_alltoall(const struct mscx_ref_launch *l, void *stream, char *err,
                                        size_t errlen)
{
    a2a_kargs a;
    memset(&a, 0, sizeof(a));
    a.in = (const char *)l->send;
    a.out = (char *)l->recv;
    for (uint32_t r = 0; r < l->nranks; r++)
        a.scr[r] = l->scratch[r];
    a.state = l->state;
    a.rank = l->rank;
    a.n = l->nranks;
    a.bu = l->bytes / 8 / l->nranks;
    a.half = mscx_ref_scratch_bytes(MSCX_REF_ALLTOALL, l->nranks, l->bytes) / 2;
    a.timeout_ns = l->timeout_ns;
    void *params[1] = {&a};
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(l->blocks);
    cfg.blockDim = dim3(l->threads);
    cfg.stream = (cudaStream_t)stream;
    if (l->pdl && a2a_pdl_ok(l->threads, (uint64_t)l->blocks * l->nranks)) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t rc = cudaLaunchKernelExC(&cfg, (const void *)ref_alltoall, params);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "baseline alltoall launch (%u blocks of %u threads): %s", l->blocks, l->threads,
                 cudaGetErrorString(rc));
        return (int)rc;
    }
    return 0;
}
