/* SPDX-License-Identifier: MIT */
/*
 * Port channels served by the CPU proxy: the kernel side. A port op whose
 * channel goes to another process does not move data itself; one thread of
 * the block writes requests into the context's FIFO in mapped host memory
 * (port_fifo.h) and the process's proxy thread executes them (proxy.c,
 * runtime/ports.c). Ports to ranks of the same process keep the in-kernel path
 * (exec_ops.cuh). add_plan decides per channel (struct mscx_gpu_port.proxied)
 * and refuses ops that mix the two kinds.
 *
 * Ordering: requests of one block are pushed by thread 0 in op order (a
 * signal op pushes from threads t < nchan after the block synchronised), so
 * FIFO positions follow the plan's order; the proxy executes a FIFO in
 * position order. Release: the block synchronises and thread 0 fences at
 * system scope before the first push of an op, so the copy engine (or the
 * staging copy) reads what the block wrote. Acquire on the receiving side is
 * the existing wait (system-scope fence: add_plan sets sys_scope).
 *
 * Completion: a flush op (and pwsf) waits until the proxy reports the FIFO
 * flushed past its request; at the end of a launch every block that pushed
 * something drains with a local flush, so the launch is complete only when
 * every source it handed to the proxy has been read (docs/design.md).
 */
#ifndef MSCX_EXEC_PORT_CUH
#define MSCX_EXEC_PORT_CUH

#include "exec_dev.cuh"
#include "port_fifo.h"

#define MSCX_DPORT_GIVE_UP (~0ull)
/* op index recorded when the end-of-launch drain fails */
#define MSCX_DPORT_DRAIN_OP 0xffffu

/* Is port channel @p c served by the proxy? */
__device__ __forceinline__ bool mscx_dport_chan(const struct mscx_dstate *s, uint32_t c)
{
    return s->a->port && s->ctx->port->proxied[c];
}

/* Does port op @p op go through the proxy? (Its channels are all proxied or none: add_plan checks.) */
__device__ __forceinline__ bool mscx_dport_op(const struct mscx_dstate *s, const struct mscx_dev_op *op)
{
    return s->a->port && op->nchan > 0 && s->ctx->port->proxied[op->chan[0]];
}

/*
 * Push one request (one thread): reserve a position, wait for room, write the
 * slot, fence, publish seq. @return the position, or MSCX_DPORT_GIVE_UP after
 * a timeout or an abort (recorded by the spin).
 */
static __device__ MSCX_DCOLD unsigned long long mscx_dport_push(const struct mscx_dstate *s, uint32_t kind,
                                                                uint32_t chan, const void *src,
                                                                uint64_t dst_off, uint64_t len,
                                                                uint32_t flags, uint64_t ext = 0)
{
    struct mscx_gpu_port *p = s->ctx->port;
    struct mscx_pfifo *f = p->fifo;
    unsigned long long pos = atomicAdd(&p->head, 1ull);
    struct mscx_spin sp = {0, 0};
    while (pos - *(volatile uint64_t *)&f->tail >= MSCX_PFIFO_CAP) {
        if (mscx_spin_step(s, &sp))
            return MSCX_DPORT_GIVE_UP;
    }
    volatile struct mscx_preq *q = &f->slot[pos & (MSCX_PFIFO_CAP - 1u)];
    q->src = (uint64_t)(uintptr_t)src;
    q->dst_off = dst_off;
    q->len = len;
    q->kind = kind;
    q->chan = chan;
    q->flags = flags;
    q->block = blockIdx.x;
    q->op = s->op_index;
    q->launch = s->flag;
    q->reserved = ext;
    __threadfence_system(); /* the fields before seq, as the proxy reads them */
    q->seq = pos + 1ull;
    if (kind != MSCX_PREQ_FLUSH)
        *(volatile uint32_t *)&p->dirty[blockIdx.x] = 1u;
    return pos;
}

/* Push a flush and wait until the proxy completed it (one thread). @return non-zero after giving up. */
static __device__ MSCX_DCOLD int mscx_dport_flush(const struct mscx_dstate *s, uint32_t flags)
{
    unsigned long long pos = mscx_dport_push(s, MSCX_PREQ_FLUSH, 0, NULL, 0, 0, flags);
    if (pos == MSCX_DPORT_GIVE_UP)
        return 1;
    volatile uint64_t *done = &s->ctx->port->fifo->done;
    struct mscx_spin sp = {0, 0};
    while (*done < pos + 1ull) {
        if (mscx_spin_step(s, &sp))
            return 1;
    }
    *(volatile uint32_t *)&s->ctx->port->dirty[blockIdx.x] = 0u;
    return 0;
}

/*
 * Remote scratch operand @p o: the owner's scratch half offset of this launch
 * (@p so_p) and the logical range (@p off_p, @p len_p). @return false when
 * the operand is not a remote scratch buffer (add_plan refuses such plans).
 */
__device__ __forceinline__ bool mscx_dport_dst(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                               const struct mscx_dev_operand *o, const struct mscx_dpipe *pp,
                                               uint64_t *so_p, uint64_t *off_p, uint64_t *len_p)
{
    if (!(o->flags & MSCX_OPND_REMOTE))
        return false;
    const struct mscx_gpu_rbuf *rb = &s->ctx->rbuf[o->rbuf];
    if (rb->kind != MSCX_GPU_RBUF_SCRATCH)
        return false;
    const struct mscx_gpu_geom *g = &s->a->geom[rb->geom];
    *so_p = mscx_scratch_offset(s->flag, rb->half);
    mscx_drange(op, o, g->slot, pp, off_p, len_p);
    return true;
}

/* Channel of operand pair @p i (the last channel serves the rest, as in the host executor). */
__device__ __forceinline__ uint32_t mscx_dport_pair_chan(const struct mscx_dev_op *op, uint32_t i)
{
    return op->chan[i < op->nchan ? i : (uint32_t)op->nchan - 1u];
}

/*
 * One pair of a proxied put whose destination is the peer's input or output
 * buffer (@p rb, kind MAPPED: same node, mapped here by peer_buffers.c; kind
 * NET: another node, resolved by the peer's proxy from its own launch with
 * this flag). Requests carry real byte offsets in that buffer: the logical
 * range is cut where a source or destination chunk ends, and only bytes
 * that are real in both are sent (the geometry rule makes the chunks of the
 * two agree, docs/design.md). MAPPED also waits for the owner's flag, so its
 * stream has reached this launch before the copy engine writes there.
 * Thread 0 only. @return non-zero after giving up.
 */
static __device__ MSCX_DCOLD int
mscx_dport_put_user(const struct mscx_dstate *s, const struct mscx_dev_op *op, const struct mscx_dpipe *pp,
                    uint32_t c, const struct mscx_dev_operand *so, const struct mscx_dev_operand *dop,
                    const struct mscx_gpu_rbuf *rb)
{
    const struct mscx_gpu_geom *g = &s->a->geom[rb->geom];
    int t = rb->type == MSCX_BUF_OUTPUT;
    uint64_t dslot = g->slot, dchunk = t ? g->out_chunk : g->in_chunk;
    uint64_t dsize = t ? s->a->out_bytes : s->a->in_bytes;
    uint32_t fl = t ? MSCX_PREQ_F_USER_OUT : MSCX_PREQ_F_USER_IN;
    char *mapped = NULL;
    if (rb->kind == MSCX_GPU_RBUF_MAPPED) {
        if (!(mapped = mscx_dpeer_user(s, rb, t)))
            return 1;
    } else if (rb->kind != MSCX_GPU_RBUF_NET) {
        mscx_dfail(s, MSCX_ERR_INTERNAL);
        return 1;
    }
    struct mscx_resolved_opnd src = mscx_dresolve(s, so);
    uint64_t soff, slen, doff, dlen;
    mscx_drange(op, so, src.slot, pp, &soff, &slen);
    mscx_drange(op, dop, dslot, pp, &doff, &dlen);
    uint64_t len = slen < dlen ? slen : dlen;
    for (uint64_t x = 0; x < len;) {
        uint64_t ld = doff + x, davail, savail;
        uint64_t dreal = mscx_raw_map(ld, dslot, dchunk, dsize, &davail);
        uint64_t step = dslot - ld % dslot;
        const char *sp;
        if (src.raw) {
            uint64_t ls = soff + x;
            uint64_t sreal = mscx_raw_map(ls, src.slot, src.chunk, src.size, &savail);
            uint64_t sstep = src.slot - ls % src.slot;
            if (sstep < step)
                step = sstep;
            sp = src.base + sreal;
        } else {
            savail = step;
            sp = src.base + soff + x;
        }
        if (step > len - x)
            step = len - x;
        uint64_t n = step < savail ? step : savail;
        if (n > davail)
            n = davail;
        if (n && mscx_dport_push(s, MSCX_PREQ_PUT, c, sp, dreal, n, fl,
                                 mapped ? (uint64_t)(uintptr_t)(mapped + dreal) : 0ull) == MSCX_DPORT_GIVE_UP)
            return 1;
        x += step;
    }
    return 0;
}

/*
 * put, pws, pwsf through the proxy: raw bytes of src[i] to the peer's
 * scratch at dst[i] (or its input or output buffer: mscx_dport_put_user). A raw source is sent chunk by
 * chunk, real bytes only (the destination's bytes past a chunk's real end are left as they are: every reader
 * drops them).
 */
static __device__ MSCX_DCOLD int mscx_dport_put(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                                const struct mscx_dpipe *pp)
{
    int bad = 0;
    __syncthreads();
    if (threadIdx.x != 0)
        return 0;
    __threadfence_system();
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair && !bad; i++) {
        uint32_t c = mscx_dport_pair_chan(op, i);
        const struct mscx_dev_operand *dop = &op->dst[i];
        if ((dop->flags & MSCX_OPND_REMOTE) && s->ctx->rbuf[dop->rbuf].kind != MSCX_GPU_RBUF_SCRATCH) {
            bad = mscx_dport_put_user(s, op, pp, c, &op->src[i], dop, &s->ctx->rbuf[dop->rbuf]);
            if (!bad && op->opcode != MSCX_OP_PUT &&
                mscx_dport_push(s, MSCX_PREQ_SIGNAL, c, NULL, 0, 0, 0) == MSCX_DPORT_GIVE_UP)
                bad = 1;
            continue;
        }
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        uint64_t soff, slen, dso, doff, dlen;
        mscx_drange(op, &op->src[i], src.slot, pp, &soff, &slen);
        if (!mscx_dport_dst(s, op, &op->dst[i], pp, &dso, &doff, &dlen)) {
            mscx_dfail(s, MSCX_ERR_INTERNAL);
            return 1;
        }
        uint64_t len = slen < dlen ? slen : dlen;
        if (!src.raw) {
            if (len && mscx_dport_push(s, MSCX_PREQ_PUT, c, src.base + soff, dso + doff, len, 0) ==
                           MSCX_DPORT_GIVE_UP)
                bad = 1;
        } else {
            for (uint64_t x = 0; x < len && !bad;) {
                uint64_t lx = soff + x, ci = lx / src.slot, w = lx - ci * src.slot;
                uint64_t seg = src.slot - w, real = ci * src.chunk + w, n = 0;
                if (seg > len - x)
                    seg = len - x;
                if (w < src.chunk && real < src.size) {
                    n = src.chunk - w;
                    if (n > src.size - real)
                        n = src.size - real;
                    if (n > seg)
                        n = seg;
                }
                if (n && mscx_dport_push(s, MSCX_PREQ_PUT, c, src.base + real, dso + doff + x, n, 0) ==
                             MSCX_DPORT_GIVE_UP)
                    bad = 1;
                x += seg;
            }
        }
        if (!bad && op->opcode != MSCX_OP_PUT &&
            mscx_dport_push(s, MSCX_PREQ_SIGNAL, c, NULL, 0, 0, 0) == MSCX_DPORT_GIVE_UP)
            bad = 1;
    }
    if (!bad && op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH)
        bad = mscx_dport_flush(s, 0);
    return bad;
}

/*
 * Port ppkt (pairs src[i] -> dst[i]) and port rppkt (@p single_src: src[0]
 * to every dst) through the proxy: every source line must carry this
 * launch's flag first (the same wait as the in-kernel forward), then the
 * lines are copied as they are, flag included, as whole 8-byte units.
 */
template <uint32_t PKT>
static __device__ MSCX_DCOLD int mscx_dport_put_pkt(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                                                    const struct mscx_dpipe *pp, int single_src)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    uint32_t npass = single_src ? 1u : (op->nsrc < op->ndst ? op->nsrc : op->ndst);
    int bad = 0;
    for (uint32_t i = 0; i < npass && !bad; i++) {
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        uint64_t soff, slen;
        mscx_drange(op, &op->src[i], src.slot, pp, &soff, &slen);
        const char *sl = src.base + 2u * soff;
        uint64_t units = slen / pl;
        for (uint64_t u = threadIdx.x; u < units; u += blockDim.x) {
            uint4 v;
            if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v)) {
                bad = 1;
                break;
            }
        }
    }
    if (__syncthreads_or(bad))
        return 1;
    if (threadIdx.x != 0)
        return 0;
    __threadfence_system();
    for (uint32_t i = 0; i < npass && !bad; i++) {
        struct mscx_resolved_opnd src = mscx_dresolve(s, &op->src[i]);
        uint64_t soff, slen;
        mscx_drange(op, &op->src[i], src.slot, pp, &soff, &slen);
        uint64_t units = slen / pl;
        uint32_t d0 = single_src ? 0 : i, d1 = single_src ? op->ndst : i + 1;
        for (uint32_t k = d0; k < d1 && !bad; k++) {
            uint64_t dso, doff, dlen;
            if (!mscx_dport_dst(s, op, &op->dst[k], pp, &dso, &doff, &dlen)) {
                mscx_dfail(s, MSCX_ERR_INTERNAL);
                return 1;
            }
            if (units &&
                mscx_dport_push(s, MSCX_PREQ_PUT_PKT, mscx_dport_pair_chan(op, k), src.base + 2u * soff,
                                dso + 2u * doff, units * 2u * pl, 0) == MSCX_DPORT_GIVE_UP)
                bad = 1;
        }
    }
    return bad;
}

/* Signal on a proxied channel (the calling thread's channel @p c); the block synchronised before the op. */
static __device__ MSCX_DCOLD void mscx_dport_signal(const struct mscx_dstate *s, uint32_t c)
{
    __threadfence_system();
    mscx_dport_push(s, MSCX_PREQ_SIGNAL, c, NULL, 0, 0, 0);
}

/* Flush op on a context with proxied channels: every request pushed before it is complete at the peers. */
static __device__ MSCX_DCOLD int mscx_dport_flush_op(const struct mscx_dstate *s)
{
    __syncthreads(); /* signals pushed by other threads of the block come first */
    if (threadIdx.x != 0)
        return 0;
    return mscx_dport_flush(s, 0);
}

/* End of a launch: a block that pushed requests waits until the proxy has read every source it named. */
static __device__ MSCX_DCOLD void mscx_dport_drain(struct mscx_dstate *s)
{
    __syncthreads();
    if (threadIdx.x == 0 && *(volatile uint32_t *)&s->ctx->port->dirty[blockIdx.x]) {
        s->op_index = MSCX_DPORT_DRAIN_OP;
        s->opcode = MSCX_OP_FLUSH;
        mscx_dport_flush(s, MSCX_PREQ_F_LOCAL);
    }
}

#endif /* MSCX_EXEC_PORT_CUH */
