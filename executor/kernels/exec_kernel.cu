/* SPDX-License-Identifier: MIT */
/*
 * The executor kernel: one launch runs one rank's plan. Block b runs thread
 * block b's ops in order, with a __syncthreads() between ops, so results do
 * not depend on the thread count. The launch flag lives in the context and is
 * advanced by the last block to finish, so graph replays stay correct.
 */
#include <cuda_runtime.h>
#include "exec_dev.cuh"

#define MSCX_SLICE_UNIT 16u

struct mscx_dpipe {
    uint64_t off, unit; /* unit 0: not in a pipeline iteration */
};

__device__ __forceinline__ void mscx_drange(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                            const struct mscx_dev_operand *o, const struct mscx_dpipe *pp,
                                            uint64_t *off_p, uint64_t *len_p)
{
    uint64_t off, len;
    mscx_operand_range(op, o, s->a->slot, MSCX_SLICE_UNIT, &off, &len);
    if (pp->unit) {
        uint64_t b = pp->off < len ? pp->off : len;
        uint64_t e = pp->off + pp->unit < len ? pp->off + pp->unit : len;
        off += b;
        len = e - b;
    }
    *off_p = off;
    *len_p = len;
}

/* put, get, copy, pws, pwsf: pair i copies src[i] (src[0] when fewer) to dst[i]. */
__device__ void mscx_dop_copy(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp)
{
    uint64_t slot = s->a->slot;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        const struct mscx_dev_operand *so = &op->src[i];
        struct mscx_dopnd src = mscx_dresolve(s, so), dst = mscx_dresolve(s, &op->dst[i]);
        uint64_t soff, slen, doff, dlen;
        mscx_drange(s, op, so, pp, &soff, &slen);
        mscx_drange(s, op, &op->dst[i], pp, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / 16u;
        for (uint64_t u = threadIdx.x; u < units; u += blockDim.x)
            mscx_dstore(&dst, doff + u * 16u, 16, slot, mscx_dload(&src, soff + u * 16u, 16, slot));
    }
}

/* re, res, rre, rres: every dst gets src[0] folded with src[1..] in order. */
__device__ void mscx_dop_reduce(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp)
{
    uint64_t slot = s->a->slot;
    uint32_t dt = s->a->dtype, rop = s->a->op;
    struct mscx_dopnd src[MSCX_MAX_OPERANDS], dst[MSCX_MAX_OPERANDS];
    uint64_t soff[MSCX_MAX_OPERANDS], doff[MSCX_MAX_OPERANDS], len, l;
    for (uint32_t k = 0; k < op->nsrc; k++) {
        src[k] = mscx_dresolve(s, &op->src[k]);
        mscx_drange(s, op, &op->src[k], pp, &soff[k], k ? &l : &len);
    }
    for (uint32_t k = 0; k < op->ndst; k++) {
        dst[k] = mscx_dresolve(s, &op->dst[k]);
        mscx_drange(s, op, &op->dst[k], pp, &doff[k], &l);
    }
    uint64_t units = len / 16u;
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
        uint4 acc = mscx_dload(&src[0], soff[0] + u * 16u, 16, slot);
        for (uint32_t k = 1; k < op->nsrc; k++)
            acc = mscx_dreduce(dt, rop, acc, mscx_dload(&src[k], soff[k] + u * 16u, 16, slot));
        for (uint32_t k = 0; k < op->ndst; k++)
            mscx_dstore(&dst[k], doff[k] + u * 16u, 16, slot, acc);
    }
}

/* cpkt and memory ppkt: pack src[i] into lines at dst[i]. */
__device__ void mscx_dop_pack(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp)
{
    uint64_t slot = s->a->slot;
    uint32_t pkt = s->a->pkt, pl = mscx_pkt_payload(pkt);
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        const struct mscx_dev_operand *so = &op->src[i];
        struct mscx_dopnd src = mscx_dresolve(s, so), dst = mscx_dresolve(s, &op->dst[i]);
        uint64_t soff, slen, doff, dlen;
        mscx_drange(s, op, so, pp, &soff, &slen);
        mscx_drange(s, op, &op->dst[i], pp, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / pl;
        for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
            uint4 v = mscx_dload(&src, soff + u * pl, pl, slot);
            mscx_dline_store(dst.base + 2u * (doff + u * pl), pkt, v, s->flag);
        }
    }
}

/*
 * rppkt, port ppkt and upkt: read the lines of src[i] (src[0] for rppkt) and
 * forward them as lines (or, for upkt, store the payload raw) to dst.
 */
__device__ int mscx_dop_forward(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp,
                                int single_src, int unpack)
{
    uint64_t slot = s->a->slot;
    uint32_t pkt = s->a->pkt, pl = mscx_pkt_payload(pkt);
    uint32_t npass = single_src ? 1u : (op->nsrc < op->ndst ? op->nsrc : op->ndst);
    for (uint32_t i = 0; i < npass; i++) {
        const struct mscx_dev_operand *so = &op->src[i < op->nsrc ? i : 0];
        struct mscx_dopnd src = mscx_dresolve(s, so);
        uint64_t soff, slen;
        mscx_drange(s, op, so, pp, &soff, &slen);
        uint32_t d0 = single_src ? 0 : i, d1 = single_src ? op->ndst : i + 1;
        struct mscx_dopnd dst[MSCX_MAX_OPERANDS];
        uint64_t doff[MSCX_MAX_OPERANDS], dlen;
        for (uint32_t k = d0; k < d1; k++) {
            dst[k] = mscx_dresolve(s, &op->dst[k]);
            mscx_drange(s, op, &op->dst[k], pp, &doff[k], &dlen);
        }
        uint64_t units = slen / pl;
        for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
            uint4 v;
            if (mscx_dline_read(s, src.base + 2u * (soff + u * pl), pkt, &v))
                return 1;
            for (uint32_t k = d0; k < d1; k++) {
                if (unpack)
                    mscx_dstore(&dst[k], doff[k] + u * pl, pl, slot, v);
                else
                    mscx_dline_store(dst[k].base + 2u * (doff[k] + u * pl), pkt, v, s->flag);
            }
        }
    }
    return 0;
}

/* repkt, respkt, recpkt, recspkt: dst[0] raw = src[0] raw folded with src[1..] lines; dst[1..] lines. */
__device__ int mscx_dop_reduce_pkt(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp)
{
    uint64_t slot = s->a->slot;
    uint32_t pkt = s->a->pkt, pl = mscx_pkt_payload(pkt);
    uint32_t dt = s->a->dtype, rop = s->a->op;
    struct mscx_dopnd src[MSCX_MAX_OPERANDS], dst[MSCX_MAX_OPERANDS];
    uint64_t soff[MSCX_MAX_OPERANDS], doff[MSCX_MAX_OPERANDS], len, l;
    for (uint32_t k = 0; k < op->nsrc; k++) {
        src[k] = mscx_dresolve(s, &op->src[k]);
        mscx_drange(s, op, &op->src[k], pp, &soff[k], k ? &l : &len);
    }
    for (uint32_t k = 0; k < op->ndst; k++) {
        dst[k] = mscx_dresolve(s, &op->dst[k]);
        mscx_drange(s, op, &op->dst[k], pp, &doff[k], &l);
    }
    uint64_t units = len / pl;
    for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
        uint4 acc = mscx_dload(&src[0], soff[0] + u * pl, pl, slot);
        for (uint32_t k = 1; k < op->nsrc; k++) {
            uint4 v;
            if (mscx_dline_read(s, src[k].base + 2u * (soff[k] + u * pl), pkt, &v))
                return 1;
            acc = mscx_dreduce(dt, rop, acc, v);
        }
        if (op->ndst > 0)
            mscx_dstore(&dst[0], doff[0] + u * pl, pl, slot, acc);
        for (uint32_t k = 1; k < op->ndst; k++)
            mscx_dline_store(dst[k].base + 2u * (doff[k] + u * pl), pkt, acc, s->flag);
    }
    return 0;
}

__device__ void mscx_dop_signal(const struct mscx_dstate *s, const struct mscx_dev_op *op)
{
    uint32_t t = threadIdx.x;
    if (t < op->nchan) {
        unsigned long long *tok = s->ctx->peer_inbound[op->chan_type][op->chan[t]];
        __threadfence_system();
        if (tok)
            atomicAdd(tok, 1ull);
    }
}

__device__ void mscx_dop_wait(const struct mscx_dstate *s, const struct mscx_dev_op *op)
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
        __threadfence_system();
    }
}

__device__ void mscx_dop_barrier(const struct mscx_dstate *s, const struct mscx_dev_op *op)
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
}

__device__ void mscx_dop_sem(const struct mscx_dstate *s, const struct mscx_dev_op *op, int acquire)
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

/* Run one op; @return non-zero after giving up (error recorded). */
__device__ int mscx_dop_run(struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp)
{
    int port = op->chan_type == MSCX_CHAN_PORT;
    switch (op->opcode) {
    case MSCX_OP_PUT:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        mscx_dop_copy(s, op, pp);
        return 0;
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
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
        mscx_dop_reduce(s, op, pp);
        return 0;
    case MSCX_OP_COPY_PACKETS:
        mscx_dop_pack(s, op, pp);
        return 0;
    case MSCX_OP_PUT_PACKETS:
        if (port)
            return mscx_dop_forward(s, op, pp, 0, 0);
        mscx_dop_pack(s, op, pp);
        return 0;
    case MSCX_OP_READ_PUT_PACKETS:
        return mscx_dop_forward(s, op, pp, 1, 0);
    case MSCX_OP_UNPACK_PACKETS:
        return mscx_dop_forward(s, op, pp, 0, 1);
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        return mscx_dop_reduce_pkt(s, op, pp);
    case MSCX_OP_SIGNAL:
    case MSCX_OP_RELAXED_SIGNAL:
        mscx_dop_signal(s, op);
        return 0;
    case MSCX_OP_WAIT:
    case MSCX_OP_RELAXED_WAIT:
        mscx_dop_wait(s, op);
        return 0;
    case MSCX_OP_FLUSH:
        __threadfence_system();
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
    default: /* nop; multicast ops are refused before launch */
        return 0;
    }
}

__global__ void __launch_bounds__(1024, 1) mscx_exec_kernel(const struct mscx_gpu_args args)
{
    struct mscx_gpu_ctx *ctx = args.ctx;
    struct mscx_dstate s;
    s.a = &args;
    s.ctx = ctx;
    s.flag = mscx_flag_next(*(volatile uint32_t *)&ctx->flag);
    s.parity = s.flag & 1u;
    s.so = mscx_scratch_offset(s.flag, args.half_per_chunk * ctx->scratch_chunks);
    s.op_index = 0;
    s.opcode = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ctx->pub.ptr[s.parity][0] = (void *)args.in;
        ctx->pub.ptr[s.parity][1] = args.out;
        __threadfence_system();
    }
    __syncthreads();
    uint32_t b = ctx->tb_begin[blockIdx.x], e = ctx->tb_begin[blockIdx.x + 1];
    struct mscx_dpipe none = {0, 0};
    for (uint32_t i = b; i < e; i++) {
        const struct mscx_dev_op *op = &ctx->ops[i];
        s.op_index = i - b;
        s.opcode = op->opcode;
        if (op->opcode == MSCX_OP_PIPELINE) {
            uint32_t nb = op->pipe_nops;
            uint64_t unit = op->pipe_unit;
            uint64_t total = (uint64_t)op->pipe_nchunks * args.slot;
            uint64_t iters = unit ? (total + unit - 1) / unit : 1u;
            for (uint64_t it = 0; it < iters; it++) {
                struct mscx_dpipe pp = {it * unit, unit};
                for (uint32_t k = 1; k <= nb && i + k < e; k++) {
                    const struct mscx_dev_op *bop = &ctx->ops[i + k];
                    s.op_index = i + k - b;
                    s.opcode = bop->opcode;
                    mscx_dop_run(&s, bop, &pp);
                    __syncthreads();
                }
            }
            i += nb;
            continue;
        }
        mscx_dop_run(&s, op, &none);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        __threadfence_system();
        uint32_t old = atomicAdd(&ctx->done, 1u);
        if (old == gridDim.x - 1) {
            ctx->done = 0;
            __threadfence();
            *(volatile uint32_t *)&ctx->flag = s.flag;
            __threadfence_system();
        }
    }
}

extern "C" int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads,
                                      void *stream)
{
    void *params[1] = {(void *)args};
    cudaError_t rc = cudaLaunchKernel((const void *)mscx_exec_kernel, dim3(nblocks), dim3(nthreads), params, 0,
                                      (cudaStream_t)stream);
    return rc == cudaSuccess ? 0 : (int)rc;
}

extern "C" int mscx_gpu_kernel_occupancy(uint32_t nthreads)
{
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mscx_exec_kernel, (int)nthreads, 0) != cudaSuccess)
        return -1;
    return n;
}
