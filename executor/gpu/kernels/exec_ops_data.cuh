/* SPDX-License-Identifier: MIT */
/*
 * The interpreter's data ops (kernels/exec_ops.cuh includes this file and
 * dispatches to them in mscx_dop_run): the operand slices (struct mscx_dref),
 * copy and reduction between flat buffers, and the packet ops (pack, forward,
 * reduce from packets).
 */
#ifndef MSCX_EXEC_OPS_DATA_CUH
#define MSCX_EXEC_OPS_DATA_CUH

#include "exec_dev.cuh"
#include "exec_port.cuh"

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
mscx_dresolve_slice(const struct mscx_dstate *s, const struct mscx_dev_op *op,
                    const struct mscx_dev_operand *o, const struct mscx_dpipe *pp,
                    const struct mscx_dref *ref, uint64_t *off_p, uint64_t *len_p)
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
        struct mscx_resolved_opnd dst = mscx_dresolve_slice(s, op, &op->dst[i], pp, &ref, &doff, &dlen);
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
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->src[k], pp, &ref, &off, &len);
            sp[k] = mscx_dflat(&r, off, bytes, 16u);
            ok &= sp[k] != NULL;
        }
        for (uint32_t k = 0; k < ndst && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
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
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->src[k], pp, &ref, &off, &len);
            acc = mscx_dreduce<DT, 4>(rop, acc, mscx_dload<16>(&r, off + x));
        }
        for (uint32_t k = 0; k < ndst; k++) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
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
        struct mscx_resolved_opnd dst = mscx_dresolve_slice(s, op, &op->dst[i], pp, &ref, &doff, &dlen);
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
                struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
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
                struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
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
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->src[k], pp, &ref, &off, &len);
            sp[k] = r.base + 2u * off;
        }
        if (ndst > 0 && ok) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[0], pp, &ref, &off, &len);
            dp[0] = mscx_dflat(&r, off, units * pl, pl);
            ok &= dp[0] != NULL;
        }
        for (uint32_t k = 1; k < ndst && ok; k++) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
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
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->src[k], pp, &ref, &off, &len);
            if (mscx_dline_read<PKT>(s, r.base + 2u * (off + x), &v))
                return 1;
            acc = mscx_dreduce<DT, nw>(rop, acc, v);
        }
        if (ndst > 0) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[0], pp, &ref, &off, &len);
            mscx_dstore<pl>(&r, off + x, acc);
        }
        for (uint32_t k = 1; k < ndst; k++) {
            struct mscx_resolved_opnd r = mscx_dresolve_slice(s, op, &op->dst[k], pp, &ref, &off, &len);
            mscx_dline_store<PKT>(r.base + 2u * (off + x), acc, flag);
        }
    }
    return 0;
}

#endif /* MSCX_EXEC_OPS_DATA_CUH */
