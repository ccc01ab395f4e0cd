// SPDX-License-Identifier: MIT
// mscx-bench-launch: what the launch of a kernel costs on this GPU, apart
// from any collective, so that the executor's own overhead can be told from
// the hardware's. Each row: ITERS launches per stream captured back to back
// in one CUDA graph (streams forked and joined inside the capture), the
// graph replayed REPS times, median replay / ITERS (us per launch round).
//   - empty kernels in the executor's shape (7 blocks of 512 threads) with
//     16-byte or 520-byte parameters, with dynamic shared memory, with
//     programmatic dependent launch (PDL: the next kernel of the stream may
//     start before this one ends; it waits in griddepcontrol.wait);
//   - a flag exchange among N streams of one GPU (each block of each rank
//     writes its launch count to every peer and waits for every peer's):
//     the floor of a one-shot packet AllReduce's launch plus one round trip,
//     with and without PDL (waiting first, then allowing the next launch,
//     as the executor does).
//   - the executor's own whole-program kernel (mscx_gpu_kernel_launch) running a
//     hand-made compiled program: no entries (launch, prologue and epilogue
//     only), and one COPY entry per block, against a plain kernel copying
//     the same bytes; the packet kernel on an empty program and on one
//     PACK entry per block;
//   - a two-rank 1 KB one-shot AllReduce on the executor's packet
//     kernel (a hand-made program: one PACK and one REDPKT per block) beside
//     a hand-written kernel of the same exchange (k_hand), and k_hand with
//     cold code jumped over between its phases, with programmatic dependent
//     launch and without it (each launch then starts after the one ahead
//     has ended, as after a join of streams).
// Prints a markdown table. Exits 77 without a GPU.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch_abi.h" /* the executor kernel's launch and program record (mscx_gpu_kernel_launch) */

#define ITERS 100
#define REPS 7
#define MAXN 8
#define MAXB 8
#define COPY_BYTES 1024u /* copy rows: bytes per block */

struct small_args {
    uint32_t *state;
    uint32_t pdl; // see pdl_enter
    uint32_t sel; // k_code: the case that runs
};

struct big_args {
    uint32_t *state;
    uint32_t pdl;
    uint32_t pad[126]; // 520 bytes in all, about the executor's argument block
};

struct exec_args {
    uint32_t *state;
    const uint4 *table; // [blocks][words]: a block's record, 16-byte words
    uint32_t pdl, words;
    uint32_t pad[228]; // 944 bytes in all, as the executor's argument block
};

struct xchg_args {
    uint32_t *state;     // [MAXB]: launch count per block
    uint32_t *box[MAXN]; // box[p]: rank p's mailbox, [MAXN ranks][MAXB blocks]
    uint32_t rank, n, pdl, pad;
};

// pdl 1: wait only; 2: wait, then let the next launch start (the executor's
// order); 3: let the next launch start, then wait
// code built for devices before 9.0 has no griddepcontrol: there pdl is
// never set (the launch attribute is not offered) and this is empty
__device__ __forceinline__ void pdl_enter(uint32_t pdl)
{
#if __CUDA_ARCH__ >= 900
    if (pdl == 3)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (pdl)
        asm volatile("griddepcontrol.wait;" ::: "memory");
    if (pdl == 2)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)pdl;
#endif
}

__device__ __forceinline__ void count_up(uint32_t *state)
{
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&state[blockIdx.x] = *(volatile uint32_t *)&state[blockIdx.x] + 1u;
}

__global__ void k_small(const __grid_constant__ small_args a)
{
    pdl_enter(a.pdl);
    count_up(a.state);
}

__global__ void k_big(const __grid_constant__ big_args a)
{
    pdl_enter(a.pdl);
    count_up(a.state);
}

__global__ void k_smem(const __grid_constant__ small_args a)
{
    extern __shared__ uint32_t sm[];
    pdl_enter(a.pdl);
    sm[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (sm[(threadIdx.x + 1) % blockDim.x] == 0xffffffffu)
        a.state[MAXB] = 1; // never: keeps the shared memory in use
    count_up(a.state);
}

__global__ void k_static(const __grid_constant__ small_args a)
{
    __shared__ uint32_t sm[1024];
    pdl_enter(a.pdl);
    sm[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (sm[(threadIdx.x + 1) % blockDim.x] == 0xffffffffu)
        a.state[MAXB] = 1; // never: keeps the shared memory in use
    count_up(a.state);
}

__global__ void k_tiny(const __grid_constant__ small_args a)
{
    __shared__ uint32_t f; // one word, as a kernel that broadcasts a value to its block
    pdl_enter(a.pdl);
    if (threadIdx.x == 0)
        f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
    __syncthreads();
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
}

// The executor's prologue shape: every thread loads one 16-byte word of its
// block's record before the wait (the record never changes), the block's
// flag after it; the words are resolved by the flag's parity and staged in
// 5 KB of static shared memory, one barrier, then read back. A stack frame
// by MODE: 0 none; 1 a 48-word local array indexed at run time; 2 a 36-word
// (144 B) local array written at run-time indices.

template <uint32_t MODE>
__global__ void __launch_bounds__(1024, 1) k_execlike(const __grid_constant__ exec_args a)
{
    __shared__ uint4 srec[320];
    uint4 w = make_uint4(0, 0, 0, 0);
    if (threadIdx.x < a.words)
        w = __ldg(a.table + blockIdx.x * a.words + threadIdx.x);
    pdl_enter(a.pdl);
    const uint32_t f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
    if (threadIdx.x < a.words) {
        w.x ^= f & 1u;
        srec[threadIdx.x] = w;
    }
    __syncthreads();
    uint32_t acc = srec[0].x + srec[1].y + srec[a.words - 1].z;
    if (MODE == 2) {
        uint32_t loc[36];
        for (uint32_t i = 0; i < 36; i++) // stores at run-time indices: the array lives in local memory
            loc[(i + threadIdx.x) % 36u] = acc + i;
        acc = loc[(threadIdx.x + f) % 36u];
    }
    if (MODE == 1) {
        uint32_t loc[48];
        for (int i = 0; i < 48; i++)
            loc[i] = acc + (uint32_t)i;
        for (uint32_t i = 0; i < 8; i++) // stores at run-time indices: the array lives in local memory
            loc[(i * f + threadIdx.x) % 48u] += srec[i].y;
        acc = loc[(threadIdx.x + f) % 48u];
    }
    if (acc == 0xfffffffeu)
        a.state[MAXB] = 1; // never: keeps the work
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
}

// Code size: BIG holds 32 cases of a 64-step chain (more code than the
// executor's interpreter kernel) and runs the last; the small one holds and
// runs only that case. The same instructions execute in both.
template <uint32_t C> __device__ __forceinline__ uint32_t chain(uint32_t x)
{
#pragma unroll
    for (uint32_t i = 0; i < 64; i++)
        x = x * (2654435761u + C) + (x >> (i % 13u + 1u)) + i * C;
    return x;
}

#define CASE(n)                                                                                              \
    case n:                                                                                                  \
        x = chain<n>(x);                                                                                     \
        break;
#define CASE4(n) CASE(n) CASE(n + 1) CASE(n + 2) CASE(n + 3)

template <bool BIG> __global__ void __launch_bounds__(1024, 1) k_code(const __grid_constant__ small_args a)
{
    pdl_enter(a.pdl);
    uint32_t x = threadIdx.x + a.sel;
    if (BIG) {
        switch (a.sel) {
            CASE4(0)
            CASE4(4) CASE4(8) CASE4(12) CASE4(16) CASE4(20) CASE4(24) CASE(28) CASE(29) CASE(30) CASE(31)
        }
    } else if (a.sel == 31) {
        x = chain<31>(x);
    }
    if (x == 0xfffffffeu)
        a.state[MAXB] = 1; // never: keeps the work
    count_up(a.state);
}

// A block copies its COPY_BYTES slice in 16-byte words, as the executor's COPY entry.
__global__ void k_copy(const __grid_constant__ small_args a, const char *in, char *out)
{
    pdl_enter(a.pdl);
    const uint64_t base = (uint64_t)blockIdx.x * COPY_BYTES;
    for (uint32_t u = threadIdx.x; u < COPY_BYTES / 16u; u += blockDim.x)
        *(uint4 *)(out + base + 16u * u) = *(const uint4 *)(in + base + 16u * u);
    count_up(a.state);
}

// Every block of every rank: write this launch's count to each peer's
// mailbox slot [rank][block], then wait until each peer's count reached it.
__global__ void k_xchg(const __grid_constant__ xchg_args a)
{
    pdl_enter(a.pdl);
    __shared__ uint32_t f;
    if (threadIdx.x == 0)
        f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
    __syncthreads();
    const uint32_t p = threadIdx.x;
    if (p < a.n && p != a.rank) {
        *(volatile uint32_t *)&a.box[p][a.rank * MAXB + blockIdx.x] = f;
        const volatile uint32_t *mine = &a.box[a.rank][p * MAXB + blockIdx.x];
        uint64_t t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        for (uint32_t spins = 0; (int32_t)(*mine - f) < 0; spins++) {
            if ((spins & 1023u) == 1023u) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (t - t0 > 2000000000ull) { // 2 s: report, never hang
                    a.state[MAXB] = 1;
                    break;
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
}

// A two-rank one-shot LL16 AllReduce of X_UNITS 8-byte units, written by
// hand as tools/bench/ref does it (units spread over the grid, the first input
// unit loaded beside the flag), beside the executor's packet kernel
// running the same exchange from a hand-made program (K_X_EXEC).
#define X_UNITS 128u // 1 KB of fp32
#define X_SLOT (16u * X_UNITS)
#define X_HALF (2u * X_SLOT)

struct hand_args {
    char *buf;       // in place: input and output
    char *scr[2];    // each rank's scratch: two halves of two slots
    uint32_t *state; // [MAXB] flags, [MAXB] timeout
    uint32_t rank, pdl;
};

// FAR: between the phases (after the flag, after the put, after the gather)
// a branch that is never taken (a.pdl is never 0xdead0000 + i) over about
// 12 KB of code each, so that the path that runs jumps over cold code as the
// executor's does (its cases, unrolled loops and slow paths): whether such
// jumps cost time of their own (instruction fetch), the rest being equal.
#define X_FAR(i)                                                                                             \
    do {                                                                                                     \
        if (FAR && a.pdl == 0xdead0000u + (i)) {                                                             \
            uint32_t x_ = threadIdx.x;                                                                       \
            x_ = chain<4 * (i)>(x_);                                                                         \
            x_ = chain<4 * (i) + 1>(x_);                                                                     \
            x_ = chain<4 * (i) + 2>(x_);                                                                     \
            x_ = chain<4 * (i) + 3>(x_);                                                                     \
            if (x_ == 0xfffffffeu)                                                                           \
                a.state[MAXB] = 2;                                                                           \
        }                                                                                                    \
    } while (0)

// The LL16 line at @p line once it carries flag @p f: its two payload words. Gives up after 2 s
// (state[MAXB]).
__device__ __forceinline__ uint2 hand_line_wait(const hand_args &a, const char *line, uint32_t f)
{
    uint32_t x, fx, y, fy;
    uint64_t w0 = 0, w;
    for (uint32_t spins = 0;; spins++) {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x), "=r"(fx), "=r"(y), "=r"(fy)
                     : "l"(line)
                     : "memory");
        if (fx == f && fy == f)
            break;
        if ((spins & 1023u) == 1023u) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(w));
            if (w0 == 0)
                w0 = w;
            else if (w - w0 > 2000000000ull) { // 2 s: report, never hang
                a.state[MAXB] = 1;
                break;
            }
        }
    }
    return make_uint2(x, y);
}

template <bool FAR> __global__ void __launch_bounds__(1024, 1) k_hand(const __grid_constant__ hand_args a)
{
    __shared__ uint32_t s_f;
    const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, nt = gridDim.x * blockDim.x;
    pdl_enter(a.pdl);
    const uint2 v0 = tid < X_UNITS ? *(const uint2 *)(a.buf + tid * 8u) : make_uint2(0, 0);
    if (threadIdx.x == 0) {
        uint32_t f = *(volatile uint32_t *)&a.state[blockIdx.x] + 1u;
        s_f = f == 0 ? 1u : f;
    }
    __syncthreads();
    const uint32_t f = s_f;
    X_FAR(1);
    const uint32_t so = (f & 1u) ? 0u : X_HALF, peer = a.rank ^ 1u;
    for (uint32_t u = tid; u < X_UNITS; u += nt) { // put: this rank's units as lines into the peer's slot
        const uint2 v = u == tid ? v0 : *(const uint2 *)(a.buf + u * 8u);
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(a.scr[peer] + so +
                                                                               a.rank * X_SLOT + u * 16u),
                     "r"(v.x), "r"(f), "r"(v.y), "r"(f)
                     : "memory");
    }
    X_FAR(2);
    for (uint32_t u = tid; u < X_UNITS; u += nt) { // gather: the peer's lines, summed in rank order
        const uint2 p = hand_line_wait(a, a.scr[a.rank] + so + peer * X_SLOT + u * 16u, f);
        const uint2 own = u == tid ? v0 : *(const uint2 *)(a.buf + u * 8u);
        const float a0 = __uint_as_float(a.rank == 0 ? own.x : p.x),
                    a1 = __uint_as_float(a.rank == 0 ? p.x : own.x);
        const float b0 = __uint_as_float(a.rank == 0 ? own.y : p.y),
                    b1 = __uint_as_float(a.rank == 0 ? p.y : own.y);
        *(uint2 *)(a.buf + u * 8u) = make_uint2(__float_as_uint(a0 + a1), __float_as_uint(b0 + b1));
    }
    X_FAR(3);
    if (threadIdx.x == 0)
        *(volatile uint32_t *)&a.state[blockIdx.x] = f;
}

enum kind {
    K_SMALL,
    K_BIG,
    K_SMEM,
    K_STATIC,
    K_TINY,
    K_EXEC,
    K_EXEC_STACK,
    K_EXEC_VOL,
    K_CODE_SMALL,
    K_CODE_BIG,
    K_REAL_EMPTY,
    K_REAL_COPY,
    K_REAL_PKT_EMPTY,
    K_REAL_PKT_PACK,
    K_COPY,
    K_XCHG,
    K_X_EXEC,    // the two-rank one-shot (X_UNITS): the executor's packet kernel
    K_X_HAND,    // the same, k_hand
    K_X_HAND_FAR // k_hand<true>: cold code jumped over between its phases
};

struct row {
    const char *what;
    enum kind k;
    uint32_t n, blocks, threads, smem, pdl;
};

static cudaStream_t g_st[MAXN];
static uint32_t *g_state[MAXN], *g_box[MAXN];
static uint4 *g_table; // MAXB blocks x 64 words
/* the executor kernel's context (zeroed), flags, programs (empty; one COPY per block) and buffers */
static char *g_ctx, *g_rec_empty, *g_rec_copy, *g_rec_pack, *g_in, *g_out;
static uint32_t *g_bflag;
/* the two-rank one-shot rows, per rank: buffer, scratch, executor context, flags, program; k_hand's state and
 * scratch */
static char *x_buf[2], *x_scr[2], *x_ctx[2], *x_rec[2], *x_hscr[2];
static uint32_t *x_bflag[2], *x_hstate[2];
static struct mscx_gpu_host *x_host[2]; /* mapped */

// The kernels whose only argument is small_args, by kind; NULL for the others.
static void (*small_kernel(enum kind k))(small_args)
{
    switch (k) {
    case K_SMALL:
        return k_small;
    case K_SMEM:
        return k_smem;
    case K_STATIC:
        return k_static;
    case K_TINY:
        return k_tiny;
    case K_CODE_SMALL:
        return k_code<false>;
    case K_CODE_BIG:
        return k_code<true>;
    default:
        return NULL;
    }
}

// The executor's whole-program kernels on the hand-made programs of g_rec_* (K_REAL_*): compiled whole, fp32
// sum.
static cudaError_t launch_real(const struct row *r, uint32_t rank)
{
    struct mscx_gpu_args a;
    memset(&a, 0, sizeof(a));
    a.ctx = (struct mscx_gpu_ctx *)g_ctx;
    a.bflag = g_bflag;
    a.in = g_in;
    a.out = g_out;
    a.in_bytes = a.out_bytes = (uint64_t)MAXB * COPY_BYTES;
    a.dtype = MSCX_DT_FP32;
    a.op = MSCX_REDOP_SUM;
    a.pkt = MSCX_PKT_LL16;
    a.reduce = 1;
    a.program = r->k == K_REAL_COPY ? g_rec_copy : r->k == K_REAL_PKT_PACK ? g_rec_pack : g_rec_empty;
    a.packet = r->k == K_REAL_PKT_EMPTY || r->k == K_REAL_PKT_PACK;
    a.kmax_ops = 1;
    a.kmax_opnd = 2;
    a.kstride = 16u * (1u + a.kmax_ops + a.kmax_opnd);
    a.whole = 1;
    int rc = mscx_gpu_kernel_launch(&a, r->blocks, r->threads, (int)r->pdl, g_st[rank]);
    return rc ? (cudaError_t)rc : cudaSuccess;
}

// The two-rank one-shot on the executor's packet kernel (K_X_EXEC).
static cudaError_t launch_x_exec(const struct row *r, uint32_t rank)
{
    struct mscx_gpu_args a;
    memset(&a, 0, sizeof(a));
    a.ctx = (struct mscx_gpu_ctx *)x_ctx[rank];
    a.bflag = x_bflag[rank];
    a.in = x_buf[rank];
    a.out = x_buf[rank];
    a.in_bytes = a.out_bytes = 8u * X_UNITS;
    a.dtype = MSCX_DT_FP32;
    a.op = MSCX_REDOP_SUM;
    a.pkt = MSCX_PKT_LL16;
    a.reduce = 1;
    a.program = x_rec[rank];
    a.packet = 1;
    a.kmax_ops = 2;
    a.kmax_opnd = 5;
    a.kstride = 16u * (1u + a.kmax_ops + a.kmax_opnd);
    a.whole = 1;
    a.timeout_ns = 2000000000ull;
    int rc = mscx_gpu_kernel_launch(&a, r->blocks, r->threads, (int)r->pdl, g_st[rank]);
    return rc ? (cudaError_t)rc : cudaSuccess;
}

// The kernels launched directly: every kind but the executor's, under launch configuration @p c.
static cudaError_t launch_plain(const struct row *r, uint32_t rank, const cudaLaunchConfig_t *c)
{
    const small_args sa = {g_state[rank], r->pdl, r->k == K_CODE_SMALL || r->k == K_CODE_BIG ? 31u : 0u};
    void (*small)(small_args) = small_kernel(r->k);
    if (small)
        return cudaLaunchKernelEx(c, small, sa);
    switch (r->k) {
    case K_COPY:
        return cudaLaunchKernelEx(c, k_copy, sa, (const char *)g_in, g_out);
    case K_X_HAND:
    case K_X_HAND_FAR: {
        hand_args a = {x_buf[rank], {x_hscr[0], x_hscr[1]}, x_hstate[rank], rank, r->pdl};
        return r->k == K_X_HAND_FAR ? cudaLaunchKernelEx(c, k_hand<true>, a)
                                    : cudaLaunchKernelEx(c, k_hand<false>, a);
    }
    case K_EXEC:
    case K_EXEC_STACK:
    case K_EXEC_VOL: {
        exec_args a = {};
        a.state = g_state[rank];
        a.table = g_table;
        a.pdl = r->pdl;
        a.words = 40; // about a one-shot block's record (head, entries, operands)
        void (*fn)(exec_args) = r->k == K_EXEC         ? k_execlike<0>
                                : r->k == K_EXEC_STACK ? k_execlike<1>
                                                       : k_execlike<2>;
        return cudaLaunchKernelEx(c, fn, a);
    }
    case K_BIG: {
        big_args a = {};
        a.state = g_state[rank];
        a.pdl = r->pdl;
        return cudaLaunchKernelEx(c, k_big, a);
    }
    default: {
        xchg_args a = {};
        a.state = g_state[rank];
        for (uint32_t p = 0; p < r->n; p++)
            a.box[p] = g_box[p];
        a.rank = rank;
        a.n = r->n;
        a.pdl = r->pdl;
        return cudaLaunchKernelEx(c, k_xchg, a);
    }
    }
}

static int launch(const struct row *r, uint32_t rank)
{
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute at[1];
    c.gridDim = dim3(r->blocks);
    c.blockDim = dim3(r->threads);
    c.dynamicSmemBytes = r->smem;
    c.stream = g_st[rank];
    if (r->pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        c.attrs = at;
        c.numAttrs = 1;
    }
    cudaError_t e;
    switch (r->k) {
    case K_REAL_EMPTY:
    case K_REAL_COPY:
    case K_REAL_PKT_EMPTY:
    case K_REAL_PKT_PACK:
        e = launch_real(r, rank);
        break;
    case K_X_EXEC:
        e = launch_x_exec(r, rank);
        break;
    default:
        e = launch_plain(r, rank, &c);
        break;
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "mscx-bench-launch: %s: %s\n", r->what, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

// us per round of r->n launches (one per stream), graph replays
static double time_graph(const struct row *r)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaEvent_t fork, join[MAXN], e0, e1;
    double t[REPS];
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    for (uint32_t i = 0; i < r->n; i++)
        cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaStreamBeginCapture(g_st[0], cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(fork, g_st[0]);
    for (uint32_t i = 1; i < r->n; i++)
        cudaStreamWaitEvent(g_st[i], fork, 0);
    int bad = 0;
    for (int it = 0; it < ITERS && !bad; it++)
        for (uint32_t i = 0; i < r->n && !bad; i++)
            bad = launch(r, i);
    for (uint32_t i = 1; i < r->n; i++) {
        cudaEventRecord(join[i], g_st[i]);
        cudaStreamWaitEvent(g_st[0], join[i], 0);
    }
    if (cudaStreamEndCapture(g_st[0], &g) != cudaSuccess || bad ||
        cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        fprintf(stderr, "mscx-bench-launch: %s: capture failed\n", r->what);
        return -1;
    }
    cudaGraphLaunch(ge, g_st[0]);
    if (cudaStreamSynchronize(g_st[0]) != cudaSuccess)
        return -1;
    for (int k = 0; k < REPS; k++) {
        float ms = 0;
        cudaEventRecord(e0, g_st[0]);
        cudaGraphLaunch(ge, g_st[0]);
        cudaEventRecord(e1, g_st[0]);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        t[k] = ms * 1000.0 / ITERS;
    }
    qsort(t, REPS, sizeof(t[0]), cmp_d);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return t[REPS / 2];
}

// us per round, eager: ITERS rounds launched, then one synchronize
static double time_eager(const struct row *r)
{
    double t[REPS];
    for (int k = 0; k < REPS; k++) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaDeviceSynchronize();
        cudaEventRecord(e0, g_st[0]);
        for (uint32_t i = 1; i < r->n; i++)
            cudaStreamWaitEvent(g_st[i], e0, 0);
        for (int it = 0; it < ITERS; it++)
            for (uint32_t i = 0; i < r->n; i++)
                if (launch(r, i))
                    return -1;
        for (uint32_t i = 1; i < r->n; i++) {
            cudaEvent_t j;
            cudaEventCreateWithFlags(&j, cudaEventDisableTiming);
            cudaEventRecord(j, g_st[i]);
            cudaStreamWaitEvent(g_st[0], j, 0);
            cudaEventDestroy(j);
        }
        cudaEventRecord(e1, g_st[0]);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t[k] = ms * 1000.0 / ITERS;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    qsort(t, REPS, sizeof(t[0]), cmp_d);
    return t[REPS / 2];
}

/*
 * The programs of the K_REAL_* rows, per block a record of a head, one entry
 * slot and two operand slots (struct mscx_record_head): empty; one COPY of
 * the block's COPY_BYTES; one PACK of half of them as LL16 lines over the
 * whole slice.
 */
static void setup_real(void)
{
    const uint32_t words = 4;
    uint4 empty[MAXB * 4], copy[MAXB * 4], pack[MAXB * 4];
    memset(empty, 0, sizeof(empty));
    memset(copy, 0, sizeof(copy));
    memset(pack, 0, sizeof(pack));
    for (uint32_t b = 0; b < MAXB; b++) {
        struct mscx_record_head h = {0, 0, 0, 0};
        memcpy(&empty[b * words], &h, sizeof(h));
        h.nk = 1;
        h.np = 2;
        memcpy(&copy[b * words], &h, sizeof(h));
        struct mscx_entry k;
        memset(&k, 0, sizeof(k));
        k.kind = MSCX_ENTRY_COPY;
        k.nsrc = 1;
        k.ndst = 1;
        k.units = COPY_BYTES / 16u;
        memcpy(&copy[b * words + 1], &k, sizeof(k));
        uint64_t src = MSCX_TAGGED_IN | ((uint64_t)b * COPY_BYTES),
                 dst = MSCX_TAGGED_OUT | ((uint64_t)b * COPY_BYTES);
        copy[b * words + 2] = make_uint4((uint32_t)src, (uint32_t)(src >> 32), 0, 0);
        copy[b * words + 3] = make_uint4((uint32_t)dst, (uint32_t)(dst >> 32), 0, 0);
        memcpy(&pack[b * words], &copy[b * words], 4u * sizeof(uint4));
        k.kind = MSCX_ENTRY_PACK;
        k.units = COPY_BYTES / 16u;
        memcpy(&pack[b * words + 1], &k, sizeof(k));
    }
    cudaMalloc((void **)&g_rec_empty, sizeof(empty));
    cudaMalloc((void **)&g_rec_copy, sizeof(copy));
    cudaMalloc((void **)&g_rec_pack, sizeof(pack));
    cudaMemcpy(g_rec_pack, pack, sizeof(pack), cudaMemcpyHostToDevice);
    cudaMemcpy(g_rec_empty, empty, sizeof(empty), cudaMemcpyHostToDevice);
    cudaMemcpy(g_rec_copy, copy, sizeof(copy), cudaMemcpyHostToDevice);
    cudaMalloc((void **)&g_ctx, sizeof(struct mscx_gpu_ctx));
    cudaMemset(g_ctx, 0, sizeof(struct mscx_gpu_ctx));
    cudaMalloc((void **)&g_bflag, MAXB * sizeof(uint32_t));
    cudaMemset(g_bflag, 0, MAXB * sizeof(uint32_t));
    cudaMalloc((void **)&g_in, (size_t)MAXB * COPY_BYTES);
    cudaMalloc((void **)&g_out, (size_t)MAXB * COPY_BYTES);
    cudaMemset(g_in, 1, (size_t)MAXB * COPY_BYTES);
}

/* The two-rank one-shot's buffers, per rank: its own, two scratches (executor, k_hand), flags, context. */
static void setup_oneshot_buffers(uint32_t r)
{
    cudaMalloc((void **)&x_buf[r], 8u * X_UNITS);
    cudaMemset(x_buf[r], 0, 8u * X_UNITS);
    cudaMalloc((void **)&x_scr[r], 2u * X_HALF);
    cudaMemset(x_scr[r], 0, 2u * X_HALF);
    cudaMalloc((void **)&x_hscr[r], 2u * X_HALF);
    cudaMemset(x_hscr[r], 0, 2u * X_HALF);
    cudaMalloc((void **)&x_bflag[r], MAXB * sizeof(uint32_t));
    cudaMemset(x_bflag[r], 0, MAXB * sizeof(uint32_t));
    cudaMalloc((void **)&x_hstate[r], (MAXB + 1) * sizeof(uint32_t));
    cudaMemset(x_hstate[r], 0, (MAXB + 1) * sizeof(uint32_t));
    cudaHostAlloc((void **)&x_host[r], sizeof(struct mscx_gpu_host), cudaHostAllocMapped);
    memset(x_host[r], 0, sizeof(struct mscx_gpu_host));
    struct mscx_gpu_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    cudaHostGetDevicePointer((void **)&ctx.host, x_host[r], 0);
    cudaMalloc((void **)&x_ctx[r], sizeof(ctx));
    cudaMemcpy(x_ctx[r], &ctx, sizeof(ctx), cudaMemcpyHostToDevice);
}

/*
 * Rank @p r's program of the two-rank one-shot: 2 blocks, X_UNITS / 2 units
 * each, a PACK of its input into the peer's slot and a REDPKT of its input
 * and the peer's lines into its output (the same buffer); scratch half by
 * flag parity: 1 -> 0, 0 -> X_HALF.
 */
static void setup_oneshot_program(uint32_t r)
{
    const uint32_t words = 8, ub_n = X_UNITS / 2u, p = r ^ 1u;
    uint4 rec[2 * 8];
    memset(rec, 0, sizeof(rec));
    for (uint32_t b = 0; b < 2; b++) {
        uint4 *w = &rec[b * words];
        const uint64_t ub = (uint64_t)b * ub_n;
        struct mscx_record_head h = {2, 5, 0, 0};
        memcpy(&w[0], &h, sizeof(h));
        struct mscx_entry k;
        memset(&k, 0, sizeof(k));
        k.kind = MSCX_ENTRY_PACK;
        k.nsrc = 1;
        k.ndst = 1;
        k.opnd = 0;
        k.units = ub_n;
        memcpy(&w[1], &k, sizeof(k));
        k.kind = MSCX_ENTRY_REDPKT;
        k.nsrc = 2;
        k.opnd = 2;
        memcpy(&w[2], &k, sizeof(k));
        const uint64_t in = MSCX_TAGGED_IN | (ub * 8u), out = MSCX_TAGGED_OUT | (ub * 8u);
        const uint64_t put0 = (uint64_t)(uintptr_t)(x_scr[p] + X_HALF + r * X_SLOT + ub * 16u),
                       put1 = (uint64_t)(uintptr_t)(x_scr[p] + r * X_SLOT + ub * 16u);
        const uint64_t get0 = (uint64_t)(uintptr_t)(x_scr[r] + X_HALF + p * X_SLOT + ub * 16u),
                       get1 = (uint64_t)(uintptr_t)(x_scr[r] + p * X_SLOT + ub * 16u);
        w[3] = make_uint4((uint32_t)in, (uint32_t)(in >> 32), 0, 0);
        w[4] = make_uint4((uint32_t)put0, (uint32_t)(put0 >> 32), (uint32_t)put1, (uint32_t)(put1 >> 32));
        w[5] = make_uint4((uint32_t)in, (uint32_t)(in >> 32), 0, 0);
        w[6] = make_uint4((uint32_t)get0, (uint32_t)(get0 >> 32), (uint32_t)get1, (uint32_t)(get1 >> 32));
        w[7] = make_uint4((uint32_t)out, (uint32_t)(out >> 32), 0, 0);
    }
    cudaMalloc((void **)&x_rec[r], sizeof(rec));
    cudaMemcpy(x_rec[r], rec, sizeof(rec), cudaMemcpyHostToDevice);
}

static void setup_streams(void)
{
    cudaMalloc((void **)&g_table, MAXB * 64 * sizeof(uint4));
    cudaMemset(g_table, 0, MAXB * 64 * sizeof(uint4));
    for (uint32_t i = 0; i < MAXN; i++) {
        cudaStreamCreateWithFlags(&g_st[i], cudaStreamNonBlocking);
        cudaMalloc((void **)&g_state[i], (MAXB + 1) * sizeof(uint32_t));
        cudaMemset(g_state[i], 0, (MAXB + 1) * sizeof(uint32_t));
        cudaMalloc((void **)&g_box[i], MAXN * MAXB * sizeof(uint32_t));
        cudaMemset(g_box[i], 0, MAXN * MAXB * sizeof(uint32_t));
    }
}

static const struct row g_rows[] = {
    {"empty, 1 block of 32 threads, 16 B args", K_SMALL, 1, 1, 32, 0, 0},
    {"empty, 7 x 512, 16 B args", K_SMALL, 1, 7, 512, 0, 0},
    {"empty, 7 x 512, 520 B args", K_BIG, 1, 7, 512, 0, 0},
    {"empty, 7 x 512, 4 B static smem (a broadcast word)", K_TINY, 1, 7, 512, 0, 0},
    {"empty, 7 x 512, 4 KB static smem", K_STATIC, 1, 7, 512, 0, 0},
    {"executor-like prologue, 7 x 512 (record + flag, 5 KB smem, 944 B args)", K_EXEC, 1, 7, 512, 0, 0},
    {"executor-like prologue with a stack frame, 7 x 512", K_EXEC_STACK, 1, 7, 512, 0, 0},
    {"executor-like prologue, 144 B local array, 7 x 512", K_EXEC_VOL, 1, 7, 512, 0, 0},
    {"executor-like prologue, 7 x 512, PDL", K_EXEC, 1, 7, 512, 0, 2},
    {"executor whole-program kernel, empty program, 7 x 512", K_REAL_EMPTY, 1, 7, 512, 0, 0},
    {"executor whole-program kernel, empty program, 7 x 512, PDL", K_REAL_EMPTY, 1, 7, 512, 0, 2},
    {"executor whole-program kernel, one 1 KB COPY per block, 7 x 512", K_REAL_COPY, 1, 7, 512, 0, 0},
    {"plain kernel copying 1 KB per block, 7 x 512", K_COPY, 1, 7, 512, 0, 0},
    {"executor whole-program kernel, one 1 KB COPY per block, 7 x 512, PDL", K_REAL_COPY, 1, 7, 512, 0, 2},
    {"plain kernel copying 1 KB per block, 7 x 512, PDL", K_COPY, 1, 7, 512, 0, 2},
    {"executor packet kernel, empty program, 7 x 512, PDL", K_REAL_PKT_EMPTY, 1, 7, 512, 0, 2},
    {"executor packet kernel, one PACK of 512 B per block (1 KB of lines), 7 x 512, PDL", K_REAL_PKT_PACK, 1,
     7, 512, 0, 2},
    {"64-step chain, small kernel", K_CODE_SMALL, 1, 7, 512, 0, 0},
    {"64-step chain, last of 32 cases (big kernel)", K_CODE_BIG, 1, 7, 512, 0, 0},
    {"empty, 7 x 512, 8 KB dynamic smem", K_SMEM, 1, 7, 512, 8192, 0},
    {"empty, 7 x 512, 40 KB dynamic smem", K_SMEM, 1, 7, 512, 40960, 0},
    {"empty, 7 x 512, PDL (wait at entry)", K_SMALL, 1, 7, 512, 0, 1},
    {"empty, 7 x 512, PDL (wait, then allow the next)", K_SMALL, 1, 7, 512, 0, 2},
    {"empty, 7 x 512, PDL (allow the next, then wait)", K_SMALL, 1, 7, 512, 0, 3},
    {"8 streams, empty 7 x 512 each", K_SMALL, 8, 7, 512, 0, 0},
    {"8 streams, empty 7 x 512, PDL (wait, allow)", K_SMALL, 8, 7, 512, 0, 2},
    {"flag exchange, 2 ranks, 7 x 512", K_XCHG, 2, 7, 512, 0, 0},
    {"flag exchange, 2 ranks, 7 x 512, PDL", K_XCHG, 2, 7, 512, 0, 2},
    {"flag exchange, 4 ranks, 7 x 512", K_XCHG, 4, 7, 512, 0, 0},
    {"flag exchange, 4 ranks, 7 x 512, PDL", K_XCHG, 4, 7, 512, 0, 2},
    {"flag exchange, 8 ranks, 7 x 512", K_XCHG, 8, 7, 512, 0, 0},
    {"flag exchange, 8 ranks, 7 x 512, PDL", K_XCHG, 8, 7, 512, 0, 2},
    {"flag exchange, 8 ranks, 1 x 512", K_XCHG, 8, 1, 512, 0, 0},
    {"flag exchange, 8 ranks, 1 x 512, PDL", K_XCHG, 8, 1, 512, 0, 2},
    {"flag exchange, 8 ranks, 1 x 32", K_XCHG, 8, 1, 32, 0, 0},
    {"one-shot 1 KB, 2 ranks, executor packet kernel (hand-made program), 2 x 1024, PDL", K_X_EXEC, 2, 2,
     1024, 0, 2},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 2 x 1024, PDL", K_X_HAND, 2, 2, 1024, 0, 2},
    {"one-shot 1 KB, 2 ranks, executor packet kernel (hand-made program), 2 x 512, PDL", K_X_EXEC, 2, 2, 512,
     0, 2},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 2 x 512, PDL", K_X_HAND, 2, 2, 512, 0, 2},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 12 KB of cold code jumped over between phases, 2 x 512, "
     "PDL",
     K_X_HAND_FAR, 2, 2, 512, 0, 2},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 2 x 512, PDL (again)", K_X_HAND, 2, 2, 512, 0, 2},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 12 KB of cold code jumped over between phases, 2 x 512, "
     "PDL "
     "(again)",
     K_X_HAND_FAR, 2, 2, 512, 0, 2},
    /* without the programmatic overlap: each launch starts after the one ahead has ended */
    {"one-shot 1 KB, 2 ranks, executor packet kernel (hand-made program), 2 x 1024, no PDL", K_X_EXEC, 2, 2,
     1024, 0, 0},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 2 x 1024, no PDL", K_X_HAND, 2, 2, 1024, 0, 0},
    {"one-shot 1 KB, 2 ranks, executor packet kernel (hand-made program), 2 x 512, no PDL", K_X_EXEC, 2, 2,
     512, 0, 0},
    {"one-shot 1 KB, 2 ranks, hand-written kernel, 2 x 512, no PDL", K_X_HAND, 2, 2, 512, 0, 0},
};

/*
 * One row of the table, eager then graph, from zeroed counts and mailboxes
 * (the ranks of an exchange must agree on them). @return 0, or 1 when a wait
 * of the row timed out.
 */
static int run_row(const struct row *r)
{
    cudaDeviceSynchronize();
    for (uint32_t q = 0; q < MAXN; q++) {
        cudaMemset(g_state[q], 0, (MAXB + 1) * sizeof(uint32_t));
        cudaMemset(g_box[q], 0, MAXN * MAXB * sizeof(uint32_t));
    }
    cudaDeviceSynchronize();
    const bool x = r->k == K_X_EXEC || r->k == K_X_HAND || r->k == K_X_HAND_FAR;
    double e = time_eager(r);
    double g = time_graph(r);
    uint32_t bad = 0;
    if (x) {
        cudaDeviceSynchronize();
        for (uint32_t q = 0; q < 2; q++) {
            uint32_t w = 0;
            cudaMemcpy(&w, x_hstate[q] + MAXB, sizeof(w), cudaMemcpyDeviceToHost);
            bad |= w | (uint32_t)(x_host[q]->err.code != 0);
        }
    }
    for (uint32_t q = 0; q < r->n; q++) {
        uint32_t w = 0;
        cudaMemcpy(&w, g_state[q] + MAXB, sizeof(w), cudaMemcpyDeviceToHost);
        bad |= w;
    }
    if (bad)
        fprintf(stderr, "mscx-bench-launch: %s: a wait timed out\n", r->what);
    printf("| %s | %u | %.2f | %.2f |\n", r->what, r->n, e, g);
    fflush(stdout);
    return bad != 0;
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU\n");
        return 77;
    }
    cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024);
    setup_real();
    for (uint32_t r = 0; r < 2; r++)
        setup_oneshot_buffers(r);
    for (uint32_t r = 0; r < 2; r++)
        setup_oneshot_program(r);
    setup_streams();
    printf("| launch | streams | eager us/round | graph us/round |\n|---|---|---|---|\n");
    int failed = 0;
    for (size_t i = 0; i < sizeof(g_rows) / sizeof(g_rows[0]); i++)
        failed |= run_row(&g_rows[i]);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "mscx-bench-launch: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return failed;
}
