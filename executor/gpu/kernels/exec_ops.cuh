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
 */
#ifndef MSCX_EXEC_OPS_CUH
#define MSCX_EXEC_OPS_CUH

#include <cuda_runtime.h>
#include "exec_dev.cuh"
#include "exec_port.cuh"

typedef void (*mscx_kernel_fn)(const struct mscx_gpu_args);

/*
 * What a kernel instance holds (its BODY). The compiled kernels hold only
 * the compiled entries, not the interpreter, so they are a fraction of the
 * code, registers and stack of the interpreter kernel, and have no stack
 * frame (MSCX_COLD_INLINE); launch and completion cost less with them.
 * mscx_gpu_kernel_variant (launch_abi.h) picks one per launch.
 */
enum mscx_kernel_body {
    /* the interpreter, and the compiled program of every block the launch does not interpret */
    MSCX_BODY_INTERPRETER,
    /* programs compiled whole only (args.compiled): every entry kind and operator, the trace */
    MSCX_BODY_COMPILED,
    /*
     * programs compiled whole of the packet entry kinds only (PACK, UNPACK,
     * FWD, REDPKT, SKIP; args.packet_only), summing, untraced: the packet
     * programs of the shipped AllReduce, AllGather and ReduceScatter plans
     * with the usual operator, without the operator's branch in the
     * reduction loop
     */
    MSCX_BODY_PACKET_ONLY,
};

/*
 * Packet lines of different sources one thread loads before it waits for
 * any (compiled REDPKT entries): eight, or two in the compiled kernels for
 * blocks of more than MSCX_KERNEL_SMALL_THREADS threads, which have 64
 * registers a thread and no stack frame to hold more.
 */
template <enum mscx_kernel_body BODY, uint32_t MAX_THREADS>
constexpr uint32_t
    mscx_line_batch = (BODY != MSCX_BODY_INTERPRETER && MAX_THREADS > MSCX_KERNEL_SMALL_THREADS) ? 2u : 8u;

/* Slice of operands of @p size chunks with slot @p slot, computed once per op. */
struct mscx_dref {
    uint32_t size;
    uint64_t slot, soff, len;
};

__device__ __forceinline__ void mscx_dref_make(const struct mscx_dev_op *op, uint32_t size, uint64_t slot,
                                               const struct mscx_dpipe *pp, struct mscx_dref *r)
{
    struct mscx_dev_operand o;
    o.index = 0;
    o.size = size;
    uint64_t off, len;
    mscx_drange(op, &o, slot, pp, &off, &len);
    r->size = size;
    r->slot = slot;
    r->soff = off;
    r->len = len;
}

/* Resolve operand @p o and its logical range, reusing @p ref when the shape matches. */
__device__ __forceinline__ struct mscx_resolved_opnd
mscx_dat(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dev_operand *o,
         const struct mscx_dpipe *pp, const struct mscx_dref *ref, uint64_t *off_p, uint64_t *len_p)
{
    struct mscx_resolved_opnd r = mscx_dresolve(s, o);
    if (o->size == ref->size && r.slot == ref->slot) {
        *off_p = (uint64_t)o->index * r.slot + ref->soff;
        *len_p = ref->len;
    } else {
        mscx_drange(op, o, r.slot, pp, off_p, len_p);
    }
    return r;
}

/* put, get, copy, pws, pwsf: pair i copies src[i] to dst[i]. */
static __device__ void mscx_dop_copy(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                     const struct mscx_dpipe *pp)
{
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        struct mscx_dref ref;
        uint64_t soff, slen, doff, dlen;
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        mscx_dref_make(op, op->src[i].size, src.slot, pp, &ref);
        soff = (uint64_t)op->src[i].index * src.slot + ref.soff;
        slen = ref.len;
        struct mscx_resolved_opnd dst = mscx_dat(s, op, &op->dst[i], pp, &ref, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / 16u;
        if (units == 0)
            continue;
        const char *ps = mscx_dflat(&src, soff, units * 16u, 16u);
        char *pd = mscx_dflat(&dst, doff, units * 16u, 16u);
        if (ps && pd && units < 0x80000000ull) {
            uint32_t n = (uint32_t)units;
            for (uint32_t u = threadIdx.x; u < n; u += blockDim.x)
                *(uint4 *)(pd + (uint64_t)u * 16u) = *(const uint4 *)(ps + (uint64_t)u * 16u);
        } else {
            for (uint64_t u = threadIdx.x; u < units; u += blockDim.x)
                mscx_dstore<16>(&dst, doff + u * 16u, mscx_dload<16>(&src, soff + u * 16u));
        }
    }
}

/* re, res, rre, rres: every dst gets src[0] folded with src[1..] in order. */
template <uint32_t DT>
static __device__ void mscx_dop_reduce(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                       const struct mscx_dpipe *pp)
{
    struct mscx_dref ref;
    struct mscx_resolved_opnd s0 = mscx_dresolve(s, &op->src[0]);
    mscx_dref_make(op, op->src[0].size, s0.slot, pp, &ref);
    uint64_t off0 = (uint64_t)op->src[0].index * s0.slot + ref.soff;
    uint64_t units = ref.len / 16u;
    uint32_t nsrc = op->nsrc, ndst = op->ndst, rop = s->rop;
    if (units == 0)
        return;
    {
        const char *sp[MSCX_MAX_OPERANDS];
        char *dp[MSCX_MAX_OPERANDS];
        uint64_t bytes = units * 16u, off, len;
        int ok = units < 0x80000000ull;
        sp[0] = mscx_dflat(&s0, off0, bytes, 16u);
        ok &= sp[0] != NULL;
        for (uint32_t k = 1; k < nsrc && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->src[k], pp, &ref, &off, &len);
            sp[k] = mscx_dflat(&r, off, bytes, 16u);
            ok &= sp[k] != NULL;
        }
        for (uint32_t k = 0; k < ndst && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
            dp[k] = mscx_dflat(&r, off, bytes, 16u);
            ok &= dp[k] != NULL;
        }
        if (ok) {
            uint32_t n = (uint32_t)units;
            for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
                uint64_t x = (uint64_t)u * 16u;
                uint4 acc = *(const uint4 *)(sp[0] + x);
                for (uint32_t k = 1; k < nsrc; k++)
                    acc = mscx_dreduce<DT, 4>(rop, acc, *(const uint4 *)(sp[k] + x));
                for (uint32_t k = 0; k < ndst; k++)
                    *(uint4 *)(dp[k] + x) = acc;
            }
            return;
        }
    }
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
        uint64_t x = u * 16u, off, len;
        uint4 acc = mscx_dload<16>(&s0, off0 + x);
        for (uint32_t k = 1; k < nsrc; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->src[k], pp, &ref, &off, &len);
            acc = mscx_dreduce<DT, 4>(rop, acc, mscx_dload<16>(&r, off + x));
        }
        for (uint32_t k = 0; k < ndst; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
            mscx_dstore<16>(&r, off + x, acc);
        }
    }
}

/* cpkt and memory ppkt: pack src[i] into lines at dst[i]. */
template <uint32_t PKT>
static __device__ void mscx_dop_pack(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                     const struct mscx_dpipe *pp)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    uint32_t flag = s->flag;
    struct mscx_dref ref;
    ref.size = 0xffffffffu;
    ref.slot = 0;
    for (uint32_t i = 0; i < npair; i++) {
        uint64_t soff, slen, doff, dlen;
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        if (op->src[i].size != ref.size || src.slot != ref.slot)
            mscx_dref_make(op, op->src[i].size, src.slot, pp, &ref);
        soff = (uint64_t)op->src[i].index * src.slot + ref.soff;
        slen = ref.len;
        struct mscx_resolved_opnd dst = mscx_dat(s, op, &op->dst[i], pp, &ref, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / pl;
        if (units == 0)
            continue;
        char *lines = dst.base + 2u * doff;
        const char *ps = mscx_dflat(&src, soff, units * pl, pl);
        if (ps && units < 0x80000000ull) {
            uint32_t n = (uint32_t)units;
            for (uint32_t u = threadIdx.x; u < n; u += blockDim.x)
                mscx_dline_store<PKT>(lines + 2u * pl * (uint64_t)u, mscx_dvload<pl>(ps + (uint64_t)u * pl),
                                      flag);
        } else {
            for (uint64_t u = threadIdx.x; u < units; u += blockDim.x)
                mscx_dline_store<PKT>(lines + 2u * pl * u, mscx_dload<pl>(&src, soff + u * pl), flag);
        }
    }
}

/*
 * rppkt, port ppkt and upkt: read the lines of src[i] (src[0] for rppkt) and
 * forward them as lines (or, for upkt, store the payload raw) to dst.
 */
template <uint32_t PKT>
static __device__ int mscx_dop_forward(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                       const struct mscx_dpipe *pp, int single_src, int unpack)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    uint32_t npass = single_src ? 1u : (op->nsrc < op->ndst ? op->nsrc : op->ndst);
    uint32_t flag = s->flag;
    for (uint32_t i = 0; i < npass; i++) {
        struct mscx_dref ref;
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        mscx_dref_make(op, op->src[i].size, src.slot, pp, &ref);
        uint64_t soff = (uint64_t)op->src[i].index * src.slot + ref.soff;
        uint32_t d0 = single_src ? 0 : i, d1 = single_src ? op->ndst : i + 1;
        uint64_t units = ref.len / pl;
        if (units == 0)
            continue;
        {
            char *dp[MSCX_MAX_OPERANDS];
            int ok = units < 0x80000000ull;
            for (uint32_t k = d0; k < d1 && ok; k++) {
                uint64_t off, len;
                struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
                dp[k] = unpack ? mscx_dflat(&r, off, units * pl, pl) : r.base + 2u * off;
                ok &= dp[k] != NULL;
            }
            if (ok) {
                const char *sl = src.base + 2u * soff;
                uint32_t n = (uint32_t)units;
                for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
                    uint4 v;
                    uint64_t x = (uint64_t)u * pl;
                    if (mscx_dline_read<PKT>(s, sl + 2u * x, &v))
                        return 1;
                    for (uint32_t k = d0; k < d1; k++) {
                        if (unpack)
                            mscx_dvstore<pl>(dp[k] + x, v);
                        else
                            mscx_dline_store<PKT>(dp[k] + 2u * x, v, flag);
                    }
                }
                continue;
            }
        }
        for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
            uint4 v;
            if (mscx_dline_read<PKT>(s, src.base + 2u * (soff + u * pl), &v))
                return 1;
            for (uint32_t k = d0; k < d1; k++) {
                uint64_t off, len;
                struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
                if (unpack)
                    mscx_dstore<pl>(&r, off + u * pl, v);
                else
                    mscx_dline_store<PKT>(r.base + 2u * (off + u * pl), v, flag);
            }
        }
    }
    return 0;
}

/* repkt, respkt, recpkt, recspkt: dst[0] raw = src[0] raw folded with src[1..] lines; dst[1..] lines. */
template <uint32_t PKT, uint32_t DT>
static __device__ int mscx_dop_reduce_pkt(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                          const struct mscx_dpipe *pp)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const uint32_t nw = pl / 4u;
    struct mscx_dref ref;
    struct mscx_resolved_opnd s0 = mscx_dresolve(s, &op->src[0]);
    mscx_dref_make(op, op->src[0].size, s0.slot, pp, &ref);
    uint64_t off0 = (uint64_t)op->src[0].index * s0.slot + ref.soff;
    uint64_t units = ref.len / pl;
    uint32_t nsrc = op->nsrc, ndst = op->ndst, rop = s->rop, flag = s->flag;
    if (units == 0)
        return 0;
    {
        const char *sp[MSCX_MAX_OPERANDS];
        char *dp[MSCX_MAX_OPERANDS];
        uint64_t off, len;
        const char *p0 = mscx_dflat(&s0, off0, units * pl, pl);
        int ok = p0 != NULL && units < 0x80000000ull;
        for (uint32_t k = 1; k < nsrc && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->src[k], pp, &ref, &off, &len);
            sp[k] = r.base + 2u * off;
        }
        if (ndst > 0 && ok) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[0], pp, &ref, &off, &len);
            dp[0] = mscx_dflat(&r, off, units * pl, pl);
            ok &= dp[0] != NULL;
        }
        for (uint32_t k = 1; k < ndst && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
            dp[k] = r.base + 2u * off;
        }
        if (ok) {
            uint32_t n = (uint32_t)units;
            for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
                uint64_t x = (uint64_t)u * pl;
                uint4 acc = mscx_dvload<pl>(p0 + x);
                for (uint32_t k = 1; k < nsrc; k++) {
                    uint4 v;
                    if (mscx_dline_read<PKT>(s, sp[k] + 2u * x, &v))
                        return 1;
                    acc = mscx_dreduce<DT, nw>(rop, acc, v);
                }
                if (ndst > 0)
                    mscx_dvstore<pl>(dp[0] + x, acc);
                for (uint32_t k = 1; k < ndst; k++)
                    mscx_dline_store<PKT>(dp[k] + 2u * x, acc, flag);
            }
            return 0;
        }
    }
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
        uint64_t x = u * pl, off, len;
        uint4 acc = mscx_dload<pl>(&s0, off0 + x);
        for (uint32_t k = 1; k < nsrc; k++) {
            uint4 v;
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->src[k], pp, &ref, &off, &len);
            if (mscx_dline_read<PKT>(s, r.base + 2u * (off + x), &v))
                return 1;
            acc = mscx_dreduce<DT, nw>(rop, acc, v);
        }
        if (ndst > 0) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[0], pp, &ref, &off, &len);
            mscx_dstore<pl>(&r, off + x, acc);
        }
        for (uint32_t k = 1; k < ndst; k++) {
            struct mscx_resolved_opnd r = mscx_dat(s, op, &op->dst[k], pp, &ref, &off, &len);
            mscx_dline_store<PKT>(r.base + 2u * (off + x), acc, flag);
        }
    }
    return 0;
}

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

/* ---- the compiled program (block records, struct mscx_record_head): offsets resolved by the host ---- */

/*
 * The entries below run a block's slice of @p n units; @p P are the entry's
 * operands (sources, then destinations) resolved for this launch, @p flag the
 * launch's. Their semantics are the interpreter's fast paths. Loops over a
 * packet entry's line destinations are not unrolled: less code between the
 * hot paths.
 */

/* PACK: src[0] flat -> dst[0..ndst) lines; @p first: this thread's first unit, loaded (if @p has_first) */
template <uint32_t PKT>
__device__ __forceinline__ void mscx_entry_pack(const struct mscx_entry *k, char *const *P, uint32_t n,
                                                uint32_t flag, bool has_first, uint4 first)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *ps = P[0];
    const uint32_t nd = k->ndst;
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        const uint4 v = has_first && u == threadIdx.x ? first : mscx_dvload<pl>(ps + (uint64_t)u * pl);
#pragma unroll 1
        for (uint32_t j = 0; j < nd; j++)
            mscx_dline_store<PKT>(P[1 + j] + 2u * pl * u, v, flag);
    }
}

/* UNPACK: src[0] lines -> dst[0] flat. @return non-zero after giving up. */
template <uint32_t PKT>
__device__ __forceinline__ int mscx_entry_unpack(const struct mscx_dstate *s, char *const *P, uint32_t n)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *sl = P[0];
    char *pd = P[1];
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint4 v;
        if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
            return 1;
        mscx_dvstore<pl>(pd + (uint64_t)u * pl, v);
    }
    return 0;
}

/* FWD: src[0] lines -> dst[0..ndst) lines. @return non-zero after giving up. */
template <uint32_t PKT>
__device__ __forceinline__ int mscx_entry_fwd(const struct mscx_dstate *s, const struct mscx_entry *k,
                                              char *const *P, uint32_t n, uint32_t flag)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *sl = P[0];
    uint32_t nd = k->ndst;
    if (nd == 1) {
        char *dl = P[1];
        for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
            uint4 v;
            if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
                return 1;
            mscx_dline_store<PKT>(dl + 2u * pl * u, v, flag);
        }
        return 0;
    }
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint4 v;
        if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
            return 1;
#pragma unroll 1
        for (uint32_t j = 0; j < nd; j++)
            mscx_dline_store<PKT>(P[1 + j] + 2u * pl * u, v, flag);
    }
    return 0;
}

/* COPY: src[0] flat -> dst[0] flat, 16-byte units */
__device__ __forceinline__ void mscx_entry_copy(char *const *P, uint32_t n)
{
    const char *ps = P[0];
    char *pd = P[1];
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x)
        *(uint4 *)(pd + (uint64_t)u * 16u) = *(const uint4 *)(ps + (uint64_t)u * 16u);
}

/* REDUCE: src[0..] flat folded -> dst[0..] flat, 16-byte units */
template <uint32_t DT>
__device__ __forceinline__ void mscx_entry_reduce(const struct mscx_dstate *s, const struct mscx_entry *k,
                                                  char *const *P, uint32_t n)
{
    const uint32_t ns = k->nsrc, nd = k->ndst, rop = s->rop;
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint64_t x = (uint64_t)u * 16u;
        uint4 acc = *(const uint4 *)(P[0] + x);
        for (uint32_t j = 1; j < ns; j++)
            acc = mscx_dreduce<DT, 4>(rop, acc, *(const uint4 *)(P[j] + x));
        for (uint32_t j = 0; j < nd; j++)
            *(uint4 *)(P[ns + j] + x) = acc;
    }
}

/*
 * Run compiled entry @p k (of kind KIND when KIND >= 0, a compile-time
 * constant); @return non-zero after giving up.
 */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS,
          int KIND = -1>
__device__ __forceinline__ int mscx_entry_run(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                              const struct mscx_entry *k, uint32_t obase, char *const *P,
                                              bool has_first = false, uint4 first = make_uint4(0, 0, 0, 0))
{
    const uint32_t n = k->units, flag = s->flag;
    const uint32_t kind = KIND >= 0 ? (uint32_t)KIND : k->kind;
    if constexpr (BODY == MSCX_BODY_PACKET_ONLY) {
        /* the host runs only packet programs that sum here (mscx_gpu_kernel_variant); anything else is a bug,
           never skipped silently */
        if (!mscx_entry_is_packet(kind) || (RED && s->rop != MSCX_REDOP_SUM)) {
            mscx_dfail(s, MSCX_ERR_INTERNAL);
            return 1;
        }
    }
    switch (kind) {
    case MSCX_ENTRY_PACK:
        mscx_entry_pack<PKT>(k, P, n, flag, has_first, first);
        return 0;
    case MSCX_ENTRY_UNPACK:
        return mscx_entry_unpack<PKT>(s, P, n);
    case MSCX_ENTRY_FWD:
        return mscx_entry_fwd<PKT>(s, k, P, n, flag);
    case MSCX_ENTRY_REDPKT: {
        /*
         * REDPKT: src[0] flat, or lines if lsrc0, (+) src[1..] lines
         * (src[fsrc] flat if fsrc) -> dst[0] flat (if ndst), dst[1..] lines;
         * the packet-only kernel sums. Its code stays in this switch: moved
         * into a function of its own, it is scheduled differently (ptxas).
         */
        if (!RED)
            return 0;
        const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
        const uint32_t nw = pl / 4u;
        constexpr uint32_t BATCH = mscx_line_batch<BODY, MAX_THREADS>;
        const uint32_t ns = k->nsrc, nd = k->ndst, rop = s->rop;
        /* bit i: source i is read flat, not as lines (fsrc: a pack fused in; 0 when none) */
        const uint32_t fmask = k->fsrc ? 1u << k->fsrc : 0u;
        const char *p0 = P[0];
        const bool l0 = k->lsrc0;
        for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
            uint64_t x = (uint64_t)u * pl;
            uint4 acc = make_uint4(0, 0, 0, 0);
            /*
             * The lines of up to BATCH sources are loaded at once, then
             * folded in source order. The flat source (fmask) is loaded where
             * it is folded, its payload being what its packed line would
             * carry: loaded with the lines, it gives the compiled kernels a
             * stack frame; the one-shot's puts have just read the same bytes,
             * so it should mostly hit in cache.
             */
            uint32_t j = l0 ? 0u : 1u;
            if (!l0)
                acc = mscx_dvload<pl>(p0 + x);
            for (; j < ns; j += BATCH) {
                uint4 raw[BATCH];
                const uint32_t fb = fmask >> j;
#pragma unroll
                for (uint32_t q = 0; q < BATCH; q++)
                    if (j + q < ns && !(fb & (1u << q)))
                        raw[q] = mscx_dline_peek<PKT>(P[j + q] + 2u * x);
#pragma unroll
                for (uint32_t q = 0; q < BATCH; q++) {
                    if (j + q >= ns)
                        break;
                    uint4 v;
                    if (fb & (1u << q))
                        v = mscx_dvload<pl>(P[j + q] + x);
                    else if (mscx_dline_ready<PKT>(raw[q], flag))
                        v = mscx_dline_payload<PKT>(raw[q]);
                    else if (mscx_dline_read<PKT>(s, P[j + q] + 2u * x, &v))
                        return 1;
                    if (j + q == 0)
                        acc = v;
                    else if constexpr (BODY == MSCX_BODY_PACKET_ONLY)
                        acc = mscx_dreduce_t<DT, MSCX_REDOP_SUM, nw>(acc, v);
                    else
                        acc = mscx_dreduce<DT, nw>(rop, acc, v);
                }
            }
            if (nd > 0)
                mscx_dvstore<pl>(P[ns] + x, acc);
#pragma unroll 1
            for (uint32_t j = 1; j < nd; j++)
                mscx_dline_store<PKT>(P[ns + j] + 2u * x, acc, flag);
        }
        return 0;
    }
    case MSCX_ENTRY_COPY:
        if constexpr (BODY != MSCX_BODY_PACKET_ONLY)
            mscx_entry_copy(P, n);
        return 0; /* packet-only: not reached (above) */
    case MSCX_ENTRY_REDUCE:
        if (RED && BODY != MSCX_BODY_PACKET_ONLY)
            mscx_entry_reduce<DT>(s, k, P, n);
        return 0; /* not reduced here, or not reached (above) */
    case MSCX_ENTRY_SKIP:
        return 0;
    default: { /* GENERIC: the interpreter runs the op from the uploaded table (never in a compiled kernel) */
        if constexpr (BODY != MSCX_BODY_INTERPRETER) {
            return 0;
        } else {
            struct mscx_dpipe none = {0, 0};
            return mscx_dop_run<PKT, DT, RED>(s, &a->ops[obase + k->op], &none);
        }
    }
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

/* An operand word of a record as pointers for launches of flag parity 0 and 1 (the same for user buffers). */
__device__ __forceinline__ void mscx_tagged_ptr(const struct mscx_gpu_args *a, uint4 w, char **p0, char **p1)
{
    uint64_t v0 = ((uint64_t)w.y << 32) | w.x, v1 = ((uint64_t)w.w << 32) | w.z;
    uint64_t tag = v0 >> MSCX_TAGGED_TAG_SHIFT;
    if (tag == 0) {
        *p0 = (char *)(uintptr_t)v0;
        *p1 = (char *)(uintptr_t)v1;
    } else {
        *p0 = *p1 = (tag == 1 ? (char *)a->in : (char *)a->out) + (v0 & MSCX_TAGGED_OFF_MASK);
    }
}

/*
 * One word (16 bytes) of a block's record (struct mscx_record_head), staged
 * in shared memory: the head, an entry, or an operand resolved to a pointer
 * for this launch (scratch half by flag parity, user buffers against in/out).
 */
__device__ __forceinline__ void mscx_stage_word(const struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                uint32_t t, uint4 w, struct mscx_record_head *head,
                                                struct mscx_entry *entry, char **ptr)
{
    const uint32_t km = a->kmax_ops;
    if (t == 0) {
        *head = *reinterpret_cast<const struct mscx_record_head *>(&w);
    } else if (t <= km) {
        entry[t - 1] = *reinterpret_cast<const struct mscx_entry *>(&w);
    } else {
        char *p0, *p1;
        mscx_tagged_ptr(a, w, &p0, &p1);
        ptr[t - 1 - km] = s->parity ? p1 : p0;
    }
}

/*
 * The block shapes that the packet-only kernel runs straight-line (see
 * mscx_run_entries), told apart before the wait from the staged record.
 */
#define MSCX_SHAPE_ANY 0u                /* the entry loop */
#define MSCX_SHAPE_PACK_REDPKT 1u        /* the one-shot's */
#define MSCX_SHAPE_PACK_REDPKT_UNPACK 2u /* the two-phase's */

/* Straight-line: entry @p k, of kind KIND, as the loop of mscx_run_entries runs it untraced. */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS, int KIND>
__device__ __forceinline__ void mscx_straight_entry(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                    const struct mscx_entry *k, uint32_t obase,
                                                    char *const *sptr, bool has_first = false,
                                                    uint4 first = make_uint4(0, 0, 0, 0))
{
    s->op_index = k->op;
    s->opcode = k->opcode;
    if (k->sync)
        __syncthreads();
    mscx_entry_run<PKT, DT, RED, BODY, MAX_THREADS, KIND>(s, a, k, obase, &sptr[k->opnd], has_first, first);
}

/*
 * Entries [0, @p nk) of a block's staged program; @p sptr its operands
 * resolved for this launch. The packet-only kernel runs a block of a known
 * @p shape through straight-line calls whose entry kinds are compile-time
 * constants, with no entry loop, kind guard or switch on that path; every
 * operand, count, sync and flag still comes from the plan, and the entries'
 * code is the loop's.
 */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS>
__device__ __forceinline__ void
mscx_run_entries(struct mscx_dstate *s, const struct mscx_gpu_args *a, struct mscx_dtrace *tr, uint32_t nk,
                 uint32_t obase, const struct mscx_entry *sentry, char *const *sptr, bool has_first = false,
                 uint4 first = make_uint4(0, 0, 0, 0), uint32_t shape = MSCX_SHAPE_ANY)
{
    if constexpr (BODY == MSCX_BODY_PACKET_ONLY) {
        if (shape != MSCX_SHAPE_ANY) {
            /* as the loop below: the error state ends later entries' waits (mscx_dfail) */
            mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_PACK>(s, a, &sentry[0], obase,
                                                                                  sptr, has_first, first);
            mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_REDPKT>(s, a, &sentry[1], obase,
                                                                                    sptr);
            if (shape == MSCX_SHAPE_PACK_REDPKT_UNPACK)
                mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_UNPACK>(s, a, &sentry[2],
                                                                                        obase, sptr);
            return;
        }
    }
    for (uint32_t i = 0; i < nk; i++) {
        const struct mscx_entry *k = &sentry[i];
        char *const *P = &sptr[k->opnd];
        s->op_index = k->op;
        s->opcode = k->opcode;
        /*
         * One call site for traced and untraced runs: the entry's code is
         * inlined once (two sites would double the kernel's code).
         * Traced: the block's start of the entry to its last thread's end.
         */
        const bool traced = BODY != MSCX_BODY_PACKET_ONLY && tr->recs != NULL;
        if (k->sync || traced)
            __syncthreads();
        const uint64_t t0 = traced ? mscx_dtime() : 0;
        mscx_entry_run<PKT, DT, RED, BODY, MAX_THREADS>(s, a, k, obase, P, has_first && i == 0, first);
        if (traced) {
            __syncthreads();
            mscx_dtrace_rec(tr, k->op, k->opcode, t0);
        }
    }
}

/*
 * The interpreter kernel's compiled block @p blk. The block stages its
 * record in shared memory: every thread loads a different 16-byte word, all
 * loads independent (@p w0, thread t's first word, was loaded at kernel
 * entry beside the block's flag), then one barrier.
 */
template <uint32_t PKT, uint32_t DT, bool RED, uint32_t MAX_THREADS>
__device__ __forceinline__ void mscx_run_compiled(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                  struct mscx_dtrace *tr, uint32_t blk, uint4 w0)
{
    __shared__ struct mscx_record_head shead;
    __shared__ struct mscx_entry sentry[MSCX_KP_MAX_OPS];
    __shared__ char *sptr[MSCX_KP_MAX_OPND];
    const uint4 *rec = reinterpret_cast<const uint4 *>(a->kprog + (uint64_t)blk * a->kstride);
    const uint32_t nwords = a->kstride / 16u;
    if (threadIdx.x < nwords)
        mscx_stage_word(s, a, threadIdx.x, w0, &shead, sentry, sptr);
    for (uint32_t t = threadIdx.x + blockDim.x; t < nwords; t += blockDim.x)
        mscx_stage_word(s, a, t, __ldg(rec + t), &shead, sentry, sptr);
    __syncthreads();
    if (tr->recs)
        mscx_dtrace_rec(tr, 0, MSCX_TRACE_OP_PROLOGUE, tr->t0);
    mscx_run_entries<PKT, DT, RED, MSCX_BODY_INTERPRETER, MAX_THREADS>(s, a, tr, shead.nk, shead.obase,
                                                                       sentry, sptr);
}

/*
 * The compiled kernels stage their record before the programmatic-launch
 * wait, each scratch operand resolved for both flag parities, since nothing
 * in the record depends on the kernel ahead; after the wait only the block's
 * flag is read, and the staging's barrier is off that path.
 */
struct mscx_staged_record {
    struct mscx_record_head head;
    struct mscx_entry entry[MSCX_KP_MAX_OPS];
    char *ptr[2][MSCX_KP_MAX_OPND]; /* [launch flag parity][operand] */
};

__device__ __forceinline__ const struct mscx_staged_record *mscx_stage_record(const struct mscx_gpu_args *a,
                                                                              uint32_t blk, uint4 w0)
{
    __shared__ struct mscx_staged_record st;
    const uint4 *rec = reinterpret_cast<const uint4 *>(a->kprog + (uint64_t)blk * a->kstride);
    const uint32_t nwords = a->kstride / 16u, km = a->kmax_ops;
    for (uint32_t t = threadIdx.x; t < nwords; t += blockDim.x) {
        const uint4 w = t == threadIdx.x ? w0 : __ldg(rec + t);
        if (t == 0)
            st.head = *reinterpret_cast<const struct mscx_record_head *>(&w);
        else if (t <= km)
            st.entry[t - 1] = *reinterpret_cast<const struct mscx_entry *>(&w);
        else
            mscx_tagged_ptr(a, w, &st.ptr[0][t - 1 - km], &st.ptr[1][t - 1 - km]);
    }
    __syncthreads();
    return &st;
}

/*
 * Where a block's program starts with a PACK whose source is the same for
 * both flag parities (a user buffer, not scratch), the address of this
 * thread's first unit of it (NULL: no such start, or no unit here): the
 * packet-only kernel loads that unit right after the wait, beside the
 * block's flag, instead of after it.
 */
__device__ __forceinline__ const char *mscx_first_unit_src(const struct mscx_staged_record *st, uint32_t pl)
{
    if (st->head.nk == 0)
        return NULL;
    const struct mscx_entry *k = &st->entry[0];
    const char *p = st->ptr[0][k->opnd];
    if (k->kind != MSCX_ENTRY_PACK || p != st->ptr[1][k->opnd] || threadIdx.x >= k->units)
        return NULL;
    return p + (uint64_t)threadIdx.x * pl;
}

/* The block's shape (MSCX_SHAPE_*) for the straight-line run of mscx_run_entries. */
__device__ __forceinline__ uint32_t mscx_block_shape(const struct mscx_staged_record *st)
{
    const uint32_t nk = st->head.nk;
    if (nk < 2 || nk > 3 || st->entry[0].kind != MSCX_ENTRY_PACK || st->entry[1].kind != MSCX_ENTRY_REDPKT)
        return MSCX_SHAPE_ANY;
    if (nk == 2)
        return MSCX_SHAPE_PACK_REDPKT;
    return st->entry[2].kind == MSCX_ENTRY_UNPACK ? MSCX_SHAPE_PACK_REDPKT_UNPACK : MSCX_SHAPE_ANY;
}

/* The load of mscx_first_unit_src, kept after the wait and before the flag's load (asm volatile). */
template <uint32_t PKT> __device__ __forceinline__ uint4 mscx_first_unit_load(const char *p)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    if (PKT == MSCX_PKT_LL8)
        asm volatile("ld.global.u32 %0, [%1];" : "=r"(v.x) : "l"(p) : "memory");
    else
        asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

/* The block's state for this launch, once the flag of its last launch @p prev is known. */
__device__ __forceinline__ void mscx_dstate_init(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                 uint32_t prev, uint32_t rop)
{
    s->a = a;
    s->ctx = a->ctx;
    s->flag = mscx_flag_next(prev);
    s->parity = s->flag & 1u;
    s->so = mscx_scratch_offset(s->flag, a->scratch_half);
    s->op_index = 0;
    s->opcode = 0;
    s->rop = rop;
}

/* The end of a block's launch: the wrap's clearing, then the trace position and the block's flag. */
__device__ __forceinline__ void mscx_block_end(const struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                               const struct mscx_dtrace *tr)
{
    if (mscx_gpu_wrap_clear(s->flag) && a->scratch)
        mscx_dwrap_clear(s);
    if (threadIdx.x == 0) {
        if (tr->recs)
            a->trace_n[blockIdx.x] = tr->n;
        *(volatile uint32_t *)&a->bflag[blockIdx.x] = s->flag;
    }
}

/*
 * The compiled kernels' launch (args.compiled: every block compiled, no
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
    if (a->kprog && threadIdx.x < a->kstride / 16u)
        w0 = __ldg(reinterpret_cast<const uint4 *>(a->kprog + (uint64_t)blockIdx.x * a->kstride) +
                   threadIdx.x);
    const struct mscx_staged_record *staged = mscx_stage_record(a, blockIdx.x, w0);
    uint32_t *bfp = a->bflag + blockIdx.x;
    uint32_t rop = a->op;
    asm volatile("" ::"l"(bfp), "r"(rop)); /* loaded here, before the wait */
    const char *first_src = NULL;
    uint4 first = make_uint4(0, 0, 0, 0);
    uint32_t shape = MSCX_SHAPE_ANY;
    if constexpr (BODY == MSCX_BODY_PACKET_ONLY)
        shape = mscx_block_shape(staged);
    if constexpr (BODY == MSCX_BODY_PACKET_ONLY)
        first_src = mscx_first_unit_src(staged, PKT == MSCX_PKT_LL8 ? 4u : 8u);
    mscx_pdl_wait();
    mscx_pdl_allow();
    if (first_src)
        first = mscx_first_unit_load<PKT>(first_src);
    if constexpr (BODY != MSCX_BODY_PACKET_ONLY)
        mscx_dtrace_begin(a, &tr);
    else
        tr.recs = NULL; /* the host does not pick this kernel while tracing */
    const uint32_t prev = *(volatile uint32_t *)bfp;
    mscx_dstate_init(&s, a, prev, rop);
    if (BODY != MSCX_BODY_PACKET_ONLY && tr.recs)
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
    const bool block_compiled = a->kprog && !((a->interp_mask >> blockIdx.x) & 1u);
    uint4 w0 = make_uint4(0, 0, 0, 0);
    if (block_compiled && threadIdx.x < a->kstride / 16u)
        w0 = __ldg(reinterpret_cast<const uint4 *>(a->kprog + (uint64_t)blockIdx.x * a->kstride) +
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
        "a compiled kernel inlines its cold helpers, the interpreter kernel calls them (exec_k.cu.in)");
    if constexpr (BODY == MSCX_BODY_INTERPRETER)
        mscx_kernel_interpreter<PKT, DT, REDUCE, MAX_THREADS>(&args);
    else
        mscx_kernel_compiled<PKT, DT, REDUCE, BODY, MAX_THREADS>(&args);
}

#endif /* MSCX_EXEC_OPS_CUH */
