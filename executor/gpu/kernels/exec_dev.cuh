/* SPDX-License-Identifier: MIT */
/*
 * Device helpers of the executor kernel: operand resolution, raw and packet
 * loads and stores, spin loops with timeout and abort. Everything that is
 * hot is templated on the packet format and nothing indexes a local array.
 * The cold helpers (MSCX_DCOLD) are called in the interpreter kernel and
 * inlined in the whole-program kernels (MSCX_COLD_INLINE), which have no stack
 * frame.
 */
#ifndef MSCX_EXEC_DEV_CUH
#define MSCX_EXEC_DEV_CUH

#include <stdint.h>
#include "op_math.h"
#include "launch_abi.h"
#include "mscx/status.h"
#include "mscx/dev_types.h"

#define MSCX_SLICE_UNIT 16u

/*
 * MSCX_COLD_INLINE, set by each kernel instance (exec_k.cu.in): 1 in the
 * whole-program kernels, whose cold helpers are inlined so that no state is passed
 * by address and needs a stack frame; 0 in the interpreter kernel, which
 * calls them.
 */
#ifndef MSCX_COLD_INLINE
#error "MSCX_COLD_INLINE: set by the kernel instance (exec_k.cu.in)"
#endif
#if MSCX_COLD_INLINE
#define MSCX_DCOLD __forceinline__
#else
#define MSCX_DCOLD __noinline__
#endif

/* A resolved operand: flat (scratch, packet lines) or raw (input/output). */
struct mscx_resolved_opnd {
    char *base;
    uint64_t chunk, size; /* raw only */
    uint64_t slot;        /* the owner's logical chunk size */
    int raw;
};

struct mscx_dstate {
    const struct mscx_gpu_args *a;
    struct mscx_gpu_ctx *ctx;
    uint64_t so; /* own scratch half offset of this launch */
    uint32_t flag;
    uint32_t parity;
    uint32_t op_index;
    uint32_t opcode;
    uint32_t rop; /* reduction operator of the launch */
};

struct mscx_dpipe {
    uint64_t off, unit; /* unit 0: not in a pipeline iteration */
};

__device__ __forceinline__ uint64_t mscx_dtime(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/*
 * MSCX_TRACE: thread 0 of a block appends one record per op to the block's
 * ring of records (args.trace, trace_cap per block); the position persists
 * in args.trace_n across launches. Off (recs NULL) unless the host enabled it.
 */
struct mscx_dtrace {
    struct mscx_trace_rec *recs; /* this block's ring, NULL: off */
    uint32_t cap, n;
    uint64_t t0; /* block start */
};

__device__ __forceinline__ void mscx_dtrace_begin(const struct mscx_gpu_args *a, struct mscx_dtrace *t)
{
    t->recs = NULL;
    t->cap = a->trace_cap;
    t->n = 0;
    t->t0 = 0;
    if (a->trace_cap) {
        t->t0 = mscx_dtime();
        t->recs = a->trace + (uint64_t)blockIdx.x * a->trace_cap;
        t->n = *(volatile uint32_t *)&a->trace_n[blockIdx.x];
    }
}

static __device__ MSCX_DCOLD void mscx_dtrace_rec(struct mscx_dtrace *t, uint32_t op_index, uint32_t opcode,
                                                  uint64_t start)
{
    uint64_t end = mscx_dtime();
    if (threadIdx.x == 0) {
        struct mscx_trace_rec *r = &t->recs[t->n % t->cap];
        r->op_index = op_index;
        r->opcode = opcode;
        r->start_ns = start;
        r->end_ns = end;
    }
    t->n++;
}

/* Record an error once and make every spinning thread of this rank give up. */
static __device__ MSCX_DCOLD void mscx_dfail(const struct mscx_dstate *s, int32_t code)
{
    struct mscx_gpu_host *h = s->ctx->host;
    if (atomicCAS(&s->ctx->err_claim, 0u, 1u) == 0u) {
        h->err.block = blockIdx.x;
        h->err.op = s->op_index;
        h->err.opcode = s->opcode;
        __threadfence_system();
        h->err.code = code;
    }
    h->abort = 1;
    __threadfence_system();
}

/* One step of a spin loop. @return non-zero when the caller must give up. */
struct mscx_spin {
    uint64_t t0;
    uint32_t n;
};

/*
 * The clock is read every 256 polls; the abort word lives in mapped host
 * memory (a PCIe read), so it is read only once a wait has lasted 1 ms.
 */
static __device__ MSCX_DCOLD int mscx_spin_slow(const struct mscx_dstate *s, struct mscx_spin *sp)
{
    uint64_t now = mscx_dtime();
    if (sp->t0 == 0) {
        sp->t0 = now;
        return 0;
    }
    if (now - sp->t0 < 1000000u)
        return 0;
    if (s->ctx->host->abort)
        return 1;
    if (s->a->timeout_ns && now - sp->t0 > s->a->timeout_ns) {
        mscx_dfail(s, MSCX_ERR_TIMEOUT);
        return 1;
    }
    return 0;
}

__device__ __forceinline__ int mscx_spin_step(const struct mscx_dstate *s, struct mscx_spin *sp)
{
    if ((++sp->n & 255u) != 0)
        return 0;
    return mscx_spin_slow(s, sp);
}

/* ---- operands ---- */

/*
 * A peer's user pointers of this launch: the peer publishes them (and then
 * the flag, release) at the start of its launch with the same flag; wait for
 * that, so a stale pointer of an earlier launch is never used, and so the
 * peer's stream has reached this launch before its buffers are touched. A
 * peer in another process publishes through its IPC-mapped context the same
 * way, but its pointers mean nothing here: the host mapped the buffers of this
 * launch and passes them in args.uptr (MSCX_GPU_RBUF_MAPPED).
 */
static __device__ MSCX_DCOLD char *mscx_dpeer_user(const struct mscx_dstate *s,
                                                   const struct mscx_gpu_rbuf *rb, int t)
{
    struct mscx_spin sp = {0, 0};
    volatile uint32_t *f = &rb->pub->flag[s->parity];
    while (*f != s->flag) {
        if (mscx_spin_step(s, &sp))
            return NULL;
    }
    __threadfence();
    if (rb->kind == MSCX_GPU_RBUF_MAPPED)
        return (char *)s->a->uptr[rb->uslot];
    return (char *)*(void *const volatile *)&rb->pub->ptr[s->parity][t];
}

__device__ __forceinline__ struct mscx_resolved_opnd mscx_dresolve(const struct mscx_dstate *s,
                                                                   const struct mscx_dev_operand *o)
{
    struct mscx_resolved_opnd r;
    const struct mscx_gpu_args *a = s->a;
    r.chunk = 0;
    r.size = 0;
    if (o->flags & MSCX_OPND_REMOTE) {
        const struct mscx_gpu_rbuf *rb = &s->ctx->rbuf[o->rbuf];
        const struct mscx_gpu_geom *g = &a->geom[rb->geom];
        r.slot = g->slot;
        if (rb->kind == MSCX_GPU_RBUF_SCRATCH) {
            r.base = (char *)rb->ptr + mscx_scratch_offset(s->flag, rb->half);
            r.raw = 0;
        } else {
            int t = rb->type == MSCX_BUF_OUTPUT;
            r.base = mscx_dpeer_user(s, rb, t);
            r.raw = 1;
            r.chunk = t ? g->out_chunk : g->in_chunk;
            r.size = r.base ? (t ? a->out_bytes : a->in_bytes) : 0;
        }
        return r;
    }
    r.slot = a->geom[0].slot;
    switch (o->type) {
    case MSCX_BUF_INPUT:
        r.base = (char *)a->in;
        r.raw = 1;
        r.chunk = a->geom[0].in_chunk;
        r.size = a->in_bytes;
        break;
    case MSCX_BUF_OUTPUT:
        r.base = (char *)a->out;
        r.raw = 1;
        r.chunk = a->geom[0].out_chunk;
        r.size = a->out_bytes;
        break;
    default:
        r.base = a->scratch + s->so;
        r.raw = 0;
        break;
    }
    return r;
}

/*
 * Logical range of operand @p o (slot of its owner) after tbg slicing and the
 * pipeline window: off0/len0 is the slice of a @p ref_size-chunk operand with
 * slot @p ref_slot, reused when the operand has that size and slot.
 */
__device__ __forceinline__ void mscx_drange(const struct mscx_dev_op *op, const struct mscx_dev_operand *o,
                                            uint64_t slot, const struct mscx_dpipe *pp, uint64_t *off_p,
                                            uint64_t *len_p)
{
    uint64_t off, len;
    mscx_operand_range(op, o, slot, MSCX_SLICE_UNIT, &off, &len);
    if (pp->unit) {
        uint64_t b = pp->off < len ? pp->off : len;
        uint64_t e = pp->off + pp->unit < len ? pp->off + pp->unit : len;
        off += b;
        len = e - b;
    }
    *off_p = off;
    *len_p = len;
}

/* Cold path of a raw load: partial or unaligned. */
static __device__ MSCX_DCOLD uint4 mscx_dload_slow(const char *p, uint64_t avail, uint32_t n)
{
    uint32_t w[4] = {0, 0, 0, 0};
    uint32_t m = avail < n ? (uint32_t)avail : n;
    for (uint32_t i = 0; i < m; i++)
        w[i >> 2] |= (uint32_t)(uint8_t)p[i] << ((i & 3u) * 8u);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

static __device__ MSCX_DCOLD void mscx_dstore_slow(char *p, uint64_t avail, uint32_t n, uint4 v)
{
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = avail < n ? (uint32_t)avail : n;
    for (uint32_t i = 0; i < m; i++)
        p[i] = (char)(w[i >> 2] >> ((i & 3u) * 8u));
}

/* mscx_raw_map with a 32-bit division when the values allow it. */
__device__ __forceinline__ uint64_t mscx_draw_map(const struct mscx_resolved_opnd *r, uint64_t x,
                                                  uint64_t *avail_p)
{
    uint64_t c, w;
    if (((x | r->slot) >> 32) == 0) {
        uint32_t c32 = (uint32_t)x / (uint32_t)r->slot;
        c = c32;
        w = (uint32_t)x - c32 * (uint32_t)r->slot;
    } else {
        c = x / r->slot;
        w = x - c * r->slot;
    }
    uint64_t real = c * r->chunk + w;
    uint64_t avail = 0;
    if (w < r->chunk && real < r->size) {
        avail = r->chunk - w;
        if (avail > r->size - real)
            avail = r->size - real;
    }
    *avail_p = avail;
    return real;
}

template <uint32_t N> __device__ __forceinline__ uint4 mscx_dvload(const char *p)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    if (N == 16) {
        v = *(const uint4 *)p;
    } else if (N == 8) {
        uint2 w = *(const uint2 *)p;
        v.x = w.x;
        v.y = w.y;
    } else {
        v.x = *(const uint32_t *)p;
    }
    return v;
}

template <uint32_t N> __device__ __forceinline__ void mscx_dvstore(char *p, uint4 v)
{
    if (N == 16)
        *(uint4 *)p = v;
    else if (N == 8)
        *(uint2 *)p = make_uint2(v.x, v.y);
    else
        *(uint32_t *)p = v.x;
}

/* Load N (4, 8 or 16) payload bytes at logical offset @p x; bytes past a raw chunk's real end read as zero.
 */
template <uint32_t N>
__device__ __forceinline__ uint4 mscx_dload(const struct mscx_resolved_opnd *r, uint64_t x)
{
    if (!r->raw)
        return mscx_dvload<N>(r->base + x);
    uint64_t avail;
    uint64_t real = mscx_draw_map(r, x, &avail);
    const char *p = r->base + real;
    if (avail >= N && ((uintptr_t)p & (N - 1)) == 0)
        return mscx_dvload<N>(p);
    if (avail == 0)
        return make_uint4(0, 0, 0, 0);
    return mscx_dload_slow(p, avail, N);
}

/* Store N payload bytes at logical @p x; bytes past a raw chunk's real end are dropped. */
template <uint32_t N>
__device__ __forceinline__ void mscx_dstore(const struct mscx_resolved_opnd *r, uint64_t x, uint4 v)
{
    if (!r->raw) {
        mscx_dvstore<N>(r->base + x, v);
        return;
    }
    uint64_t avail;
    uint64_t real = mscx_draw_map(r, x, &avail);
    char *p = r->base + real;
    if (avail >= N && ((uintptr_t)p & (N - 1)) == 0) {
        mscx_dvstore<N>(p, v);
        return;
    }
    if (avail == 0)
        return;
    mscx_dstore_slow(p, avail, N, v);
}

/*
 * Flat view of @p len bytes of operand @p r from logical offset @p off: a
 * pointer p such that logical byte off + x lies at p + x for every x below
 * len, or NULL when the range needs the logical->real remapping (it crosses a
 * raw chunk's real end, or chunks that are not contiguous) or p is not
 * aligned to @p align. Scratch operands are always flat. Where this returns
 * non-NULL, plain vector accesses give exactly what mscx_dload/mscx_dstore
 * give, because every byte touched is real data.
 */
__device__ __forceinline__ char *mscx_dflat(const struct mscx_resolved_opnd *r, uint64_t off, uint64_t len,
                                            uint32_t align)
{
    if (!r->raw)
        return r->base + off;
    if (r->base == NULL)
        return NULL;
    uint64_t real;
    if (r->chunk == r->slot) {
        real = off; /* chunks are contiguous: the identity */
    } else {
        uint64_t c0 = off / r->slot, w0 = off - c0 * r->slot;
        if (w0 + len > r->chunk)
            return NULL;
        real = c0 * r->chunk + w0;
    }
    if (real + len > r->size)
        return NULL;
    char *p = r->base + real;
    if (((uintptr_t)p & (align - 1u)) != 0)
        return NULL;
    return p;
}

/* Reduce the first NW words of two payload vectors (DT, OP fixed at compile time). */
template <uint32_t DT, uint32_t OP, uint32_t NW>
__device__ __forceinline__ uint4 mscx_dreduce_t(uint4 a, uint4 b)
{
    a.x = mscx_reduce_word(DT, OP, a.x, b.x);
    if (NW > 1)
        a.y = mscx_reduce_word(DT, OP, a.y, b.y);
    if (NW > 2) {
        a.z = mscx_reduce_word(DT, OP, a.z, b.z);
        a.w = mscx_reduce_word(DT, OP, a.w, b.w);
    }
    return a;
}

/* The operator is uniform across the launch, so this switch is a uniform branch (one instantiation per
 * dtype). */
template <uint32_t DT, uint32_t NW>
__device__ __forceinline__ uint4 mscx_dreduce(uint32_t op, uint4 a, uint4 b)
{
    switch (op) {
    case MSCX_REDOP_PROD:
        return mscx_dreduce_t<DT, MSCX_REDOP_PROD, NW>(a, b);
    case MSCX_REDOP_MIN:
        return mscx_dreduce_t<DT, MSCX_REDOP_MIN, NW>(a, b);
    case MSCX_REDOP_MAX:
        return mscx_dreduce_t<DT, MSCX_REDOP_MAX, NW>(a, b);
    default:
        return mscx_dreduce_t<DT, MSCX_REDOP_SUM, NW>(a, b);
    }
}

/* ---- packet lines (same-GPU and peer memory alike: no fence, the flag travels with the data) ---- */

/* Write the line holding payload unit @p v (LL16: v.x, v.y; LL8: v.x) at @p line. */
template <uint32_t PKT> __device__ __forceinline__ void mscx_dline_store(char *line, uint4 v, uint32_t flag)
{
    if (PKT == MSCX_PKT_LL8) {
        asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(line), "r"(v.x), "r"(flag) : "memory");
    } else {
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(v.x), "r"(flag),
                     "r"(v.y), "r"(flag)
                     : "memory");
    }
}

/* Blocking read of a line with the launch flag. @return 0, or non-zero when giving up. */
template <uint32_t PKT>
__device__ __forceinline__ int mscx_dline_read(const struct mscx_dstate *s, const char *line, uint4 *v_p)
{
    struct mscx_spin sp = {0, 0};
    uint32_t flag = s->flag;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (PKT == MSCX_PKT_LL8) {
        uint32_t d, f;
        for (;;) {
            asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];"
                         : "=r"(d), "=r"(f)
                         : "l"(line)
                         : "memory");
            if (f == flag)
                break;
            if (mscx_spin_step(s, &sp))
                return 1;
        }
        v.x = d;
    } else {
        uint32_t d1, f1, d2, f2;
        for (;;) {
            asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(d1), "=r"(f1), "=r"(d2), "=r"(f2)
                         : "l"(line)
                         : "memory");
            if (f1 == flag && f2 == flag)
                break;
            if (mscx_spin_step(s, &sp))
                return 1;
        }
        v.x = d1;
        v.y = d2;
    }
    *v_p = v;
    return 0;
}

/*
 * One non-blocking read of a line, as loaded (LL16: {d1, f1, d2, f2}; LL8:
 * {d, f, 0, 0}). Several peeks in a row are independent loads, so a thread
 * that needs lines from several peers waits for them in parallel (one
 * round trip) instead of one after another; mscx_dline_ready then tells which
 * ones carry the launch flag, and a line that does not yet is read again
 * with mscx_dline_read.
 */
template <uint32_t PKT> __device__ __forceinline__ uint4 mscx_dline_peek(const char *line)
{
    uint4 r = make_uint4(0, 0, 0, 0);
    if (PKT == MSCX_PKT_LL8)
        asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];"
                     : "=r"(r.x), "=r"(r.y)
                     : "l"(line)
                     : "memory");
    else
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(line)
                     : "memory");
    return r;
}

template <uint32_t PKT> __device__ __forceinline__ bool mscx_dline_ready(uint4 raw, uint32_t flag)
{
    return PKT == MSCX_PKT_LL8 ? raw.y == flag : (raw.y == flag && raw.w == flag);
}

/* The payload of a peeked line that is ready, as mscx_dline_read returns it. */
template <uint32_t PKT> __device__ __forceinline__ uint4 mscx_dline_payload(uint4 raw)
{
    return PKT == MSCX_PKT_LL8 ? make_uint4(raw.x, 0, 0, 0) : make_uint4(raw.x, raw.z, 0, 0);
}

/*
 * Programmatic dependent launch (Hopper and later). A launch made with the
 * programmatic stream serialization attribute may start while the kernel
 * before it on the stream is still running; mscx_pdl_wait() returns once
 * that kernel has completed and its memory is visible, and is a no-op for a
 * launch made without the attribute. mscx_pdl_allow() lets the next launch
 * of the stream start; it runs only after the wait, so that at most one
 * launch per stream waits ahead (the residency check counts it).
 */
__device__ __forceinline__ void mscx_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void mscx_pdl_allow(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif /* MSCX_EXEC_DEV_CUH */
