// SPDX-License-Identifier: MIT
// The hand-written LL16 packet allreduce kernels (see ref.h) and their launch.
// One 8-byte unit of data travels as one 16-byte LL16 line {lo, flag, hi, flag}.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "ref.h"

namespace
{

struct ref_kargs {
    const char *in;
    char *out;
    char *scr[MSCX_REF_MAX_RANKS];
    uint32_t *state;
    uint32_t rank, n;
    uint64_t units;      // 8-byte units of the buffer
    uint64_t cu;         // twophase: units per chunk (the last chunks may be shorter)
    uint64_t half;       // bytes of one scratch half
    uint64_t timeout_ns; // 0: no limit
};

// Sum of two 32-bit words holding one or two elements of T.
template <typename T> struct ref_add;
template <> struct ref_add<float> {
    static __device__ __forceinline__ uint32_t f(uint32_t a, uint32_t b)
    {
        return __float_as_uint(__uint_as_float(a) + __uint_as_float(b));
    }
};
template <> struct ref_add<uint32_t> { // int32 and uint32: two's complement, the same bits
    static __device__ __forceinline__ uint32_t f(uint32_t a, uint32_t b)
    {
        return a + b;
    }
};
template <> struct ref_add<__half> {
    static __device__ __forceinline__ uint32_t f(uint32_t a, uint32_t b)
    {
        __half2 r = __hadd2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b));
        return *reinterpret_cast<const uint32_t *>(&r);
    }
};
template <> struct ref_add<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t f(uint32_t a, uint32_t b)
    {
        __nv_bfloat162 r = __hadd2(*reinterpret_cast<const __nv_bfloat162 *>(&a),
                                   *reinterpret_cast<const __nv_bfloat162 *>(&b));
        return *reinterpret_cast<const uint32_t *>(&r);
    }
};

template <typename T> __device__ __forceinline__ uint2 ref_add2(uint2 a, uint2 b)
{
    return make_uint2(ref_add<T>::f(a.x, b.x), ref_add<T>::f(a.y, b.y));
}

__device__ __forceinline__ void ref_put(char *p, uint2 v, uint32_t f)
{
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(f), "r"(v.y),
                 "r"(f)
                 : "memory");
}

__device__ __forceinline__ uint64_t ref_now(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Wait for the line at p to carry flag f in both halves. After a timeout
// (recorded in the error word) the thread stops waiting for anything.
__device__ __forceinline__ uint2 ref_get(const ref_kargs &a, const char *p, uint32_t f, bool &dead)
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
            uint64_t now = ref_now();
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

// Sum, in rank order, of own (rank a.rank's value) and the line at
// base + p * slot of every other rank p: the lines are loaded REF_BATCH at a
// time before any is waited for, so the waits overlap.
#define REF_BATCH 8
template <typename T>
__device__ __forceinline__ uint2 ref_gather(const ref_kargs &a, const char *base, uint64_t slot, uint2 own,
                                            uint32_t f, bool &dead)
{
    uint2 acc = make_uint2(0, 0);
    for (uint32_t p0 = 0; p0 < a.n; p0 += REF_BATCH) {
        uint4 raw[REF_BATCH];
#pragma unroll
        for (uint32_t q = 0; q < REF_BATCH; q++)
            if (p0 + q < a.n && p0 + q != a.rank)
                asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(raw[q].x), "=r"(raw[q].y), "=r"(raw[q].z), "=r"(raw[q].w)
                             : "l"(base + (p0 + q) * slot)
                             : "memory");
#pragma unroll
        for (uint32_t q = 0; q < REF_BATCH; q++) {
            const uint32_t p = p0 + q;
            if (p >= a.n)
                break;
            uint2 v;
            if (p == a.rank)
                v = own;
            else if (raw[q].y == f && raw[q].w == f)
                v = make_uint2(raw[q].x, raw[q].z);
            else
                v = ref_get(a, base + p * slot, f, dead);
            acc = p == 0 ? v : ref_add2<T>(acc, v);
        }
    }
    return acc;
}

__device__ __forceinline__ uint2 ref_load(const char *p)
{
    return *reinterpret_cast<const uint2 *>(p);
}

__device__ __forceinline__ void ref_store(char *p, uint2 v)
{
    *reinterpret_cast<uint2 *>(p) = v;
}

// Programmatic dependent launch (a no-op without it): wait for the kernel
// ahead on the stream, then let the next one start.
__device__ __forceinline__ void ref_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// This launch's flag (after ref_wait): one more than the last; all of a
// rank's flags are equal between launches (block 0 advances those of blocks
// this launch does not run), so every block of every rank agrees on it
// whatever the grid. The kernels load their first unit of input between
// ref_wait and this, so that the two loads overlap. The executor's
// packet kernel does the same (mscx_first_unit_src, exec_ops.cuh).
__device__ __forceinline__ uint32_t ref_flag(const ref_kargs &a)
{
    __shared__ uint32_t s_f;
    if (threadIdx.x == 0) {
        uint32_t f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
        s_f = f == 0 ? 1u : f; // 0 is the zeroed scratch
    }
    __syncthreads();
    return s_f;
}

__device__ __forceinline__ void ref_end(const ref_kargs &a, uint32_t f)
{
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
    if (blockIdx.x == 0)
        for (uint32_t i = gridDim.x + threadIdx.x; i < MSCX_REF_MAX_BLOCKS; i += blockDim.x)
            *(volatile uint32_t *)&a.state[i] = f;
}

// Every rank sends its whole buffer to slot `rank` of every peer, then sums
// the n slots (its own data in its place) in rank order. Unit u is read and
// written by the same thread throughout, so in place is safe.
template <typename T> __global__ void __launch_bounds__(1024, 1) ref_oneshot(const ref_kargs a)
{
    const uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x,
                   nt = gridDim.x * (uint64_t)blockDim.x;
    ref_wait();
    const uint2 v0 = tid < a.units ? ref_load(a.in + tid * 8) : make_uint2(0, 0);
    const uint32_t f = ref_flag(a);
    const uint64_t so = (f & 1u) ? 0 : a.half, slot = 16 * a.units;
    bool dead = false;
    for (uint64_t u = tid; u < a.units; u += nt) {
        uint2 v = u == tid ? v0 : ref_load(a.in + u * 8);
        for (uint32_t p = 0; p < a.n; p++)
            if (p != a.rank)
                ref_put(a.scr[p] + so + a.rank * slot + u * 16, v, f);
    }
    const char *mine = a.scr[a.rank] + so;
    for (uint64_t u = tid; u < a.units; u += nt)
        ref_store(a.out + u * 8, ref_gather<T>(a, mine + u * 16, slot, ref_load(a.in + u * 8), f, dead));
    ref_end(a, f);
}

// Rank g owns chunk g. (1) send chunk p to slot g of peer p's contribution
// region; (2) sum chunk g over the n ranks in rank order, store it and send
// it to slot g of every peer's result region; (3) copy each peer's result
// into its chunk. Unit k of chunk p is handled by the same thread in every
// phase, so in place is safe.
template <typename T> __global__ void __launch_bounds__(1024, 1) ref_twophase(const ref_kargs a)
{
    const uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x,
                   nt = gridDim.x * (uint64_t)blockDim.x;
#define REF_LEN(p) ((uint64_t)(p)*a.cu >= a.units ? 0 : min(a.cu, a.units - (uint64_t)(p)*a.cu))
    ref_wait();
    const uint32_t p0 =
        a.rank == 0 ? 1u : 0u; // the first peer sent to: its first unit loaded beside the flag
    const uint2 v0 = tid < REF_LEN(p0) ? ref_load(a.in + (p0 * a.cu + tid) * 8) : make_uint2(0, 0);
    const uint32_t f = ref_flag(a);
    const uint64_t so = (f & 1u) ? 0 : a.half, slot = 16 * a.cu, regb = (uint64_t)a.n * slot;
    bool dead = false;
    for (uint32_t p = 0; p < a.n; p++) {
        if (p == a.rank)
            continue;
        const uint64_t len = REF_LEN(p);
        char *dst = a.scr[p] + so + a.rank * slot;
        for (uint64_t k = tid; k < len; k += nt)
            ref_put(dst + k * 16, p == p0 && k == tid ? v0 : ref_load(a.in + (p * a.cu + k) * 8), f);
    }
    const char *mine = a.scr[a.rank] + so;
    const uint64_t mylen = REF_LEN(a.rank);
    for (uint64_t k = tid; k < mylen; k += nt) {
        const uint2 acc =
            ref_gather<T>(a, mine + k * 16, slot, ref_load(a.in + (a.rank * a.cu + k) * 8), f, dead);
        ref_store(a.out + (a.rank * a.cu + k) * 8, acc);
        for (uint32_t p = 0; p < a.n; p++)
            if (p != a.rank)
                ref_put(a.scr[p] + so + regb + a.rank * slot + k * 16, acc, f);
    }
    for (uint32_t p = 0; p < a.n; p++) {
        if (p == a.rank)
            continue;
        const uint64_t len = REF_LEN(p);
        for (uint64_t k = tid; k < len; k += nt)
            ref_store(a.out + (p * a.cu + k) * 8, ref_get(a, mine + regb + p * slot + k * 16, f, dead));
    }
#undef REF_LEN
    ref_end(a, f);
}

template <typename T> const void *ref_pick(enum mscx_ref_algo algo)
{
    return algo == MSCX_REF_ONESHOT ? (const void *)ref_oneshot<T> : (const void *)ref_twophase<T>;
}

} // namespace

// Programmatic dependent launch needs Hopper or later and CUDA 12.3 (asked once per process)
static bool ref_pdl_ok(void)
{
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0, drv = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
             cudaDriverGetVersion(&drv) == cudaSuccess && major >= 9 && drv >= 12030;
    }
    return ok == 1;
}

// Programmatic dependent launch lets one launch per stream wait on its SMs
// ahead of the running one: only when every rank's blocks fit twice over
// (else a waiting launch could keep a peer's blocks off the GPU: a hang).
static bool ref_pdl_fits(const void *fn, uint32_t threads, uint64_t blocks)
{
    static struct {
        const void *fn;
        uint32_t threads;
        int per_sm;
    } cache[32];
    static int sms = 0;
    int per_sm = -1;
    if (sms == 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return false;
    }
    for (auto &c : cache)
        if (c.fn == fn && c.threads == threads)
            per_sm = c.per_sm;
    if (per_sm < 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, (int)threads, 0) != cudaSuccess)
            return false;
        for (auto &c : cache)
            if (c.fn == NULL) {
                c.fn = fn;
                c.threads = threads;
                c.per_sm = per_sm;
                break;
            }
    }
    return (uint64_t)per_sm * (uint64_t)sms >= 2u * blocks;
}

extern "C" int mscx_ref_launch(const struct mscx_ref_launch *l, void *stream, char *err, size_t errlen)
{
    ref_kargs a;
    const void *fn;
    if (mscx_ref_check_launch(l, err, errlen))
        return -1;
    if (l->algo == MSCX_REF_ALLTOALL)
        return mscx_ref_launch_alltoall(l, stream, err, errlen);
    switch (l->dtype) {
    case MSCX_DT_FP32:
        fn = ref_pick<float>(l->algo);
        break;
    case MSCX_DT_FP16:
        fn = ref_pick<__half>(l->algo);
        break;
    case MSCX_DT_BF16:
        fn = ref_pick<__nv_bfloat16>(l->algo);
        break;
    default:
        fn = ref_pick<uint32_t>(l->algo);
        break; // int32, uint32 (checked above)
    }
    memset(&a, 0, sizeof(a));
    a.in = (const char *)l->send;
    a.out = (char *)l->recv;
    for (uint32_t r = 0; r < l->nranks; r++)
        a.scr[r] = l->scratch[r];
    a.state = l->state;
    a.rank = l->rank;
    a.n = l->nranks;
    a.units = l->bytes / 8;
    a.cu = (a.units + l->nranks - 1) / l->nranks;
    a.half = mscx_ref_scratch_bytes(l->algo, l->nranks, l->bytes) / 2;
    a.timeout_ns = l->timeout_ns;
    void *params[1] = {&a};
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(l->blocks);
    cfg.blockDim = dim3(l->threads);
    cfg.stream = (cudaStream_t)stream;
    if (l->pdl && ref_pdl_ok() && ref_pdl_fits(fn, l->threads, (uint64_t)l->blocks * l->nranks)) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t rc = cudaLaunchKernelExC(&cfg, fn, params);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "baseline %s launch (%u blocks of %u threads): %s", mscx_ref_algo_name(l->algo),
                 l->blocks, l->threads, cudaGetErrorString(rc));
        return (int)rc;
    }
    return 0;
}
