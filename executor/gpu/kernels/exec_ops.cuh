/* SPDX-License-Identifier: MIT */
/*
 * The executor kernel template: one launch runs one rank's plan. Block b runs
 * thread block b's ops in order. The kernel is templated on the packet format
 * and the element type (the operator is a uniform runtime branch inside the
 * reduction), on whether the plan reduces at all (a copy-only instance for
 * plans without reductions), on what it holds (enum mscx_kernel_body: the
 * interpreter, or compiled programs only) and on its block size bound. Each
 * instance has its own translation unit (exec_k.cu.in) so that the build
 * compiles them in parallel. A block stages its ops in shared memory when
 * they fit. __syncthreads() runs only before ops that the upload marked
 * (MSCX_GPU_OPF_SYNC: a data hazard between threads of the block, signals,
 * waits, barriers), so results do not depend on the thread count. Each block
 * keeps its own launch flag in the context and advances it, so graph replays
 * stay correct without any cross-block atomics.
 *
 * Every data op resolves its operands once per op, not per element: when all
 * the bytes an op touches are real data (the common case: no clipping at a
 * chunk's or the buffer's real end, see mscx_dflat) the inner loop is plain
 * pointer arithmetic and wide loads and stores; otherwise the op takes the
 * general path that maps each unit logical->real and clips it.
 *
 * This file holds the kernel bodies, the sync ops, the op dispatcher
 * (mscx_dop_run) and the interpreter; the data ops are in exec_ops_data.cuh,
 * the compiled program's device side in exec_program.cuh.
 */
#ifndef MSCX_EXEC_OPS_CUH
#define MSCX_EXEC_OPS_CUH

#include <cuda_runtime.h>
#include "exec_dev.cuh"
#include "exec_port.cuh"

typedef void (*mscx_kernel_fn)(const struct mscx_gpu_args);

/*
 * What a kernel instance holds (its BODY). The whole-program kernels
 * (MSCX_BODY_WHOLE, and MSCX_BODY_PACKET, the packet kernels) hold only
 * the program entries, not the interpreter, so they are a fraction of the
 * code, registers and stack of the interpreter kernel, and have no stack
 * frame (MSCX_COLD_INLINE); launch and completion cost less with them.
 * mscx_gpu_kernel_variant (launch_abi.h) picks one per launch.
 */
enum mscx_kernel_body {
    /* the interpreter, and the compiled program of every block the launch does not interpret */
    MSCX_BODY_INTERPRETER,
    /* programs compiled whole only (args.whole): every entry kind and operator, the trace */
    MSCX_BODY_WHOLE,
    /*
     * programs compiled whole of the packet entry kinds only (PACK, UNPACK,
     * FWD, REDPKT, SKIP; args.packet), summing, untraced: the packet
     * programs of the shipped AllReduce, AllGather and ReduceScatter plans
     * with the usual operator, without the operator's branch in the
     * reduction loop
     */
    MSCX_BODY_PACKET,
};

/*
 * Packet lines of different sources one thread loads before it waits for
 * any (compiled REDPKT entries): eight, or two in the whole-program kernels for
 * blocks of more than MSCX_KERNEL_SMALL_THREADS threads, which have 64
 * registers a thread and no stack frame to hold more.
 */
template <enum mscx_kernel_body BODY, uint32_t MAX_THREADS>
constexpr uint32_t
    mscx_line_batch = (BODY != MSCX_BODY_INTERPRETER && MAX_THREADS > MSCX_KERNEL_SMALL_THREADS) ? 2u : 8u;

#include "exec_ops_data.cuh"

/* Release: the block synchronised before this op (MSCX_GPU_OPF_SYNC), so the fence covers its writes. */
static __device__ void mscx_dop_signal(const struct mscx_dstate *s, const struct mscx_dev_op *op)
{
    uint32_t t = threadIdx.x;
    if (t < op->nchan) {
        if (op->chan_type == MSCX_CHAN_PORT && mscx_dport_chan(s, op->chan[t])) {
            mscx_dport_signal(s, op->chan[t]);
            return;
        }
        unsigned long long *tok = s->ctx->peer_inbound[op->chan_type][op->chan[t]];
        if (s->ctx->sys_scope)
            __threadfence_system();
        else
            __threadfence();
        if (tok)
            atomicAdd(tok, 1ull);
    }
}

/* Acquire; the next op synchronises the block (MSCX_GPU_OPF_SYNC). */
static __device__ void mscx_dop_wait(const struct mscx_dstate *s, const struct mscx_dev_op *op)
{
    uint32_t t = threadIdx.x;
    if (t < op->nchan) {
        uint32_t c = op->chan[t];
        unsigned long long target = atomicAdd(&s->ctx->expected[op->chan_type][c], 1ull) + 1ull;
        volatile unsigned long long *in = s->ctx->inbound[op->chan_type] + c;
        struct mscx_spin sp = {0, 0};
        while (*in < target) {
            if (mscx_spin_step(s, &sp))
                break;
        }
        if (s->ctx->sys_scope)
            __threadfence_system();
        else
            __threadfence();
    }
}

static __device__ void mscx_dop_barrier(const struct mscx_dstate *s, const struct mscx_dev_op *op)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long n = op->barrier_ntb ? op->barrier_ntb : 1u;
        __threadfence();
        unsigned long long old = atomicAdd(&s->ctx->barrier[op->barrier_id], 1ull);
        unsigned long long target = (old / n + 1ull) * n;
        volatile unsigned long long *b = &s->ctx->barrier[op->barrier_id];
        struct mscx_spin sp = {0, 0};
        while (*b < target) {
            if (mscx_spin_step(s, &sp))
                break;
        }
        __threadfence();
    }
    __syncthreads();
}

static __device__ void mscx_dop_sem(const struct mscx_dstate *s, const struct mscx_dev_op *op, int acquire)
{
    uint32_t t = threadIdx.x;
    if (t >= op->nsem)
        return;
    int *sem = (int *)&s->ctx->sem[op->sem[t]];
    if (!acquire) {
        __threadfence();
        atomicAdd(sem, 1);
        return;
    }
    struct mscx_spin sp = {0, 0};
    for (;;) {
        int v = *(volatile int *)sem;
        if (v > 0 && atomicCAS(sem, v, v - 1) == v)
            break;
        if (mscx_spin_step(s, &sp))
            break;
    }
    __threadfence();
}

/* Run one op; @return non-zero after giving up (error recorded). RED: the reducing ops exist. */
template <uint32_t PKT, uint32_t DT, bool RED>
__device__ __forceinline__ int mscx_dop_run(struct mscx_dstate *s, const struct mscx_dev_op *op,
                                            const struct mscx_dpipe *pp)
{
    int port = op->chan_type == MSCX_CHAN_PORT;
    switch (op->opcode) {
    case MSCX_OP_PUT:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        if (port && mscx_dport_op(s, op))
            return mscx_dport_put(s, op, pp); /* add_plan refuses a proxied get */
        mscx_dop_copy(s, op, pp);
        return 0;
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
        if (port && mscx_dport_op(s, op))
            return mscx_dport_put(s, op, pp);
        mscx_dop_copy(s, op, pp);
        if (port) {
            __syncthreads();
            mscx_dop_signal(s, op);
        }
        return 0;
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
        if (RED)
            mscx_dop_reduce<DT>(s, op, pp);
        return 0;
    case MSCX_OP_COPY_PACKETS:
        mscx_dop_pack<PKT>(s, op, pp);
        return 0;
    case MSCX_OP_PUT_PACKETS:
        if (port && mscx_dport_op(s, op))
            return mscx_dport_put_pkt<PKT>(s, op, pp, 0);
        if (port)
            return mscx_dop_forward<PKT>(s, op, pp, 0, 0);
        mscx_dop_pack<PKT>(s, op, pp);
        return 0;
    case MSCX_OP_READ_PUT_PACKETS:
        if (port && mscx_dport_op(s, op))
            return mscx_dport_put_pkt<PKT>(s, op, pp, 1);
        return mscx_dop_forward<PKT>(s, op, pp, 1, 0);
    case MSCX_OP_UNPACK_PACKETS:
        return mscx_dop_forward<PKT>(s, op, pp, 0, 1);
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        if (RED)
            return mscx_dop_reduce_pkt<PKT, DT>(s, op, pp);
        return 0;
    case MSCX_OP_SIGNAL:
    case MSCX_OP_RELAXED_SIGNAL:
        mscx_dop_signal(s, op);
        return 0;
    case MSCX_OP_WAIT:
    case MSCX_OP_RELAXED_WAIT:
        mscx_dop_wait(s, op);
        return 0;
    case MSCX_OP_FLUSH:
        if (port && s->a->port)
            return mscx_dport_flush_op(s);
        if (s->ctx->sys_scope)
            __threadfence_system();
        else
            __threadfence();
        return 0;
    case MSCX_OP_BARRIER:
        mscx_dop_barrier(s, op);
        return 0;
    case MSCX_OP_SEM_ACQUIRE:
        mscx_dop_sem(s, op, 1);
        return 0;
    case MSCX_OP_SEM_RELEASE:
        mscx_dop_sem(s, op, 0);
        return 0;
    default: /* nop (synchronised by its flag); multicast ops are refused before launch */
        return 0;
    }
}

/*
 * Flag wrap only: once every block of the rank is done, clear the whole
 * scratch allocation except the other half of this launch's geometry (the
 * half that a peer one launch ahead may be writing). The two wrap launches
 * (0xfffffffe, 0xffffffff) together clear everything, whatever sizes ran
 * before: the half boundary moves with the message size, so clearing only
 * this launch's half would leave stale lines where a later, larger launch
 * looks. See docs/design.md for what this does not cover.
 */
static __device__ MSCX_DCOLD void mscx_dwrap_clear(const struct mscx_dstate *s)
{
    __shared__ uint32_t last;
    struct mscx_gpu_ctx *ctx = s->ctx;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&ctx->done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    uint64_t half = s->a->scratch_half;
    uint64_t keep_lo = 0, keep_hi = 0; /* the other half: [keep_lo, keep_hi) */
    if (half) {
        keep_lo = s->so ? 0 : half;
        keep_hi = keep_lo + half;
    }
    uint32_t *p = (uint32_t *)s->a->scratch;
    uint64_t words = s->a->scratch_bytes / 4u;
    for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) {
        uint64_t byte = i * 4u;
        if (byte < keep_lo || byte >= keep_hi)
            p[i] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ctx->done = 0;
        __threadfence();
    }
}

/* Publish this rank's user pointers for the launch (peers read them through mscx_dpeer_user). */
static __device__ MSCX_DCOLD void mscx_dpublish(const struct mscx_gpu_args *a, const struct mscx_dstate *s)
{
    struct mscx_gpu_ctx *ctx = a->ctx;
    ctx->pub.ptr[s->parity][0] = (void *)a->in;
    ctx->pub.ptr[s->parity][1] = a->out;
    ctx->pub.bytes[s->parity][0] = a->in_bytes;
    ctx->pub.bytes[s->parity][1] = a->out_bytes;
    if (a->sys_scope)
        __threadfence_system();
    else
        __threadfence();
    *(volatile uint32_t *)&ctx->pub.flag[s->parity] = s->flag;
}

/* The interpreter: block @p blk runs its ops [b, e) of the uploaded table. */
template <uint32_t PKT, uint32_t DT, bool RED>
__device__ __forceinline__ void mscx_run_interp(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                struct mscx_dtrace *tr, uint32_t b, uint32_t e)
{
    extern __shared__ uint32_t mscx_sops[];
    const struct mscx_dev_op *ops = a->ops + b;
    if (e - b <= a->smem_ops) {
        const uint32_t *g = (const uint32_t *)ops;
        uint32_t words = (e - b) * (uint32_t)(sizeof(struct mscx_dev_op) / 4u);
        for (uint32_t i = threadIdx.x; i < words; i += blockDim.x)
            mscx_sops[i] = __ldg(g + i);
        ops = (const struct mscx_dev_op *)mscx_sops;
    }
    __syncthreads();
    uint32_t n = e - b;
    struct mscx_dpipe none = {0, 0};
    if (tr->recs)
        mscx_dtrace_rec(tr, 0, MSCX_TRACE_OP_PROLOGUE, tr->t0);
    for (uint32_t i = 0; i < n; i++) {
        const struct mscx_dev_op *op = &ops[i];
        s->op_index = i;
        s->opcode = op->opcode;
        if (op->flags & MSCX_GPU_OPF_SYNC)
            __syncthreads();
        if (op->opcode == MSCX_OP_PIPELINE) {
            uint32_t nb = op->pipe_nops;
            uint64_t unit = op->pipe_unit;
            uint64_t total = (uint64_t)op->pipe_nchunks * a->geom[0].slot;
            uint64_t iters = unit ? (total + unit - 1) / unit : 1u;
            for (uint64_t it = 0; it < iters; it++) {
                struct mscx_dpipe pp = {it * unit, unit};
                for (uint32_t k = 1; k <= nb && i + k < n; k++) {
                    const struct mscx_dev_op *bop = &ops[i + k];
                    s->op_index = i + k;
                    s->opcode = bop->opcode;
                    __syncthreads(); /* pipeline bodies: conservative */
                    uint64_t t0 = tr->recs ? mscx_dtime() : 0;
                    mscx_dop_run<PKT, DT, RED>(s, bop, &pp);
                    if (tr->recs) {
                        __syncthreads();
                        mscx_dtrace_rec(tr, i + k, bop->opcode, t0);
                    }
                }
            }
            __syncthreads();
            i += nb;
            continue;
        }
        /* one call site for traced and untraced runs (see mscx_run_entries); traced: the block's start of the
           op to its last thread's end */
        const bool traced = tr->recs != NULL;
        if (traced)
            __syncthreads();
        const uint64_t t0 = traced ? mscx_dtime() : 0;
        mscx_dop_run<PKT, DT, RED>(s, op, &none);
        if (traced) {
            __syncthreads();
            mscx_dtrace_rec(tr, i, op->opcode, t0);
        }
    }
}

#include "exec_program.cuh"

/*
 * The whole-program kernels' launch (args.whole: every block compiled, no
 * GENERIC entry, no proxy, nothing published). The record's first word is
 * loaded before the wait for the kernel ahead on the stream (programmatic
 * dependent launch; a no-op without it), and the whole record staged: the
 * program was uploaded before this launch was made and never changes. So
 * are the kernel arguments used after the wait (the block's flag pointer,
 * the operator), so that their constant-cache lines are fetched while the
 * kernel ahead still runs. Everything the kernel ahead may write (the flag,
 * user buffers, scratch) is read after it.
 */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS>
__device__ __forceinline__ void mscx_kernel_compiled(const struct mscx_gpu_args *a)
{
    struct mscx_dstate s;
    struct mscx_dtrace tr;
    uint4 w0 = make_uint4(0, 0, 0, 0);
    if (a->program && threadIdx.x < a->kstride / 16u)
        w0 = __ldg(reinterpret_cast<const uint4 *>(a->program + (uint64_t)blockIdx.x * a->kstride) +
                   threadIdx.x);
    const struct mscx_staged_record *staged = mscx_stage_record(a, blockIdx.x, w0);
    uint32_t *bfp = a->bflag + blockIdx.x;
    uint32_t rop = a->op;
    asm volatile("" ::"l"(bfp), "r"(rop)); /* loaded here, before the wait */
    const char *first_src = NULL;
    uint4 first = make_uint4(0, 0, 0, 0);
    uint32_t shape = MSCX_SHAPE_ANY;
    if constexpr (BODY == MSCX_BODY_PACKET)
        shape = mscx_block_shape(staged);
    if constexpr (BODY == MSCX_BODY_PACKET)
        first_src = mscx_first_unit_src(staged, PKT == MSCX_PKT_LL8 ? 4u : 8u);
    mscx_pdl_wait();
    mscx_pdl_allow();
    if (first_src)
        first = mscx_first_unit_load<PKT>(first_src);
    if constexpr (BODY != MSCX_BODY_PACKET)
        mscx_dtrace_begin(a, &tr);
    else
        tr.recs = NULL; /* the host does not pick this kernel while tracing */
    const uint32_t prev = *(volatile uint32_t *)bfp;
    mscx_dstate_init(&s, a, prev, rop);
    if (BODY != MSCX_BODY_PACKET && tr.recs)
        mscx_dtrace_rec(&tr, 0, MSCX_TRACE_OP_PROLOGUE, tr.t0);
    mscx_run_entries<PKT, DT, RED, BODY, MAX_THREADS>(&s, a, &tr, staged->head.nk, staged->head.obase,
                                                      staged->entry, staged->ptr[s.parity], first_src != NULL,
                                                      first, shape);
    mscx_block_end(&s, a, &tr);
}

/*
 * The interpreter kernel's launch: a block with a compiled program stages it
 * after the wait (its first word loaded before it), any other interprets its
 * ops; the launch publishes the rank's user pointers and drains its port
 * requests where the plan needs it.
 */
template <uint32_t PKT, uint32_t DT, bool RED, uint32_t MAX_THREADS>
__device__ __forceinline__ void mscx_kernel_interpreter(const struct mscx_gpu_args *a)
{
    struct mscx_dstate s;
    struct mscx_dtrace tr;
    const bool block_compiled = a->program && !((a->interp_mask >> blockIdx.x) & 1u);
    uint4 w0 = make_uint4(0, 0, 0, 0);
    if (block_compiled && threadIdx.x < a->kstride / 16u)
        w0 = __ldg(reinterpret_cast<const uint4 *>(a->program + (uint64_t)blockIdx.x * a->kstride) +
                   threadIdx.x);
    uint32_t *bfp = a->bflag + blockIdx.x;
    uint32_t rop = a->op;
    mscx_pdl_wait();
    mscx_pdl_allow();
    mscx_dtrace_begin(a, &tr);
    const uint32_t prev = *(volatile uint32_t *)bfp;
    mscx_dstate_init(&s, a, prev, rop);
    if (a->publish && blockIdx.x == 0 && threadIdx.x == 0)
        mscx_dpublish(a, &s);
    if (block_compiled) {
        mscx_run_compiled<PKT, DT, RED, MAX_THREADS>(&s, a, &tr, blockIdx.x, w0);
    } else {
        uint32_t b = __ldg(&a->tb_begin[blockIdx.x]), e = __ldg(&a->tb_begin[blockIdx.x + 1]);
        mscx_run_interp<PKT, DT, RED>(&s, a, &tr, b, e);
    }
    if (a->port)
        mscx_dport_drain(&s);
    mscx_block_end(&s, a, &tr);
}

/*
 * The executor kernel: PKT, the packet format; DT, the element type of a
 * reducing plan; REDUCE, whether the plan has reduction ops (else the
 * copy-only instance); BODY, what it holds; MAX_THREADS, its block size
 * bound (a smaller bound gives each thread more registers).
 */
template <enum mscx_pkt_format PKT, enum mscx_dtype DT, bool REDUCE, enum mscx_kernel_body BODY,
          uint32_t MAX_THREADS>
__global__ void __launch_bounds__(MAX_THREADS, 1)
    mscx_exec_kernel(const __grid_constant__ struct mscx_gpu_args args)
{
    static_assert(
        MSCX_COLD_INLINE == (BODY != MSCX_BODY_INTERPRETER),
        "a whole-program kernel inlines its cold helpers, the interpreter kernel calls them (exec_k.cu.in)");
    if constexpr (BODY == MSCX_BODY_INTERPRETER)
        mscx_kernel_interpreter<PKT, DT, REDUCE, MAX_THREADS>(&args);
    else
        mscx_kernel_compiled<PKT, DT, REDUCE, BODY, MAX_THREADS>(&args);
}

#endif /* MSCX_EXEC_OPS_CUH */
