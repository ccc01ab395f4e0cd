/* SPDX-License-Identifier: MIT */
/*
 * Device helpers of the executor kernel: operand resolution, raw and packet
 * loads and stores, spin loops with timeout and abort.
 */
#ifndef MSCX_EXEC_DEV_CUH
#define MSCX_EXEC_DEV_CUH

#include <stdint.h>
#include "op_sem.h"
#include "gpu_int.h"
#include "mscx/status.h"

/* A resolved operand: flat (scratch, packet lines) or raw (input/output). */
struct mscx_dopnd {
    char *base;
    uint64_t chunk, size; /* raw only */
    int raw;
};

struct mscx_dstate {
    const struct mscx_gpu_args *a;
    struct mscx_gpu_ctx *ctx;
    uint64_t so;      /* own scratch half offset of this launch */
    uint32_t flag;
    uint32_t parity;
    uint32_t op_index;
    uint32_t opcode;
};

__device__ __forceinline__ uint64_t mscx_dtime(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Record an error once and make every spinning thread of this rank give up. */
__device__ __noinline__ void mscx_dfail(const struct mscx_dstate *s, int32_t code)
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

__device__ __forceinline__ int mscx_spin_step(const struct mscx_dstate *s, struct mscx_spin *sp)
{
    if ((++sp->n & 255u) != 0)
        return 0;
    if (s->ctx->host->abort) {
        return 1;
    }
    uint64_t now = mscx_dtime();
    if (sp->t0 == 0) {
        sp->t0 = now;
        return 0;
    }
    if (s->a->timeout_ns && now - sp->t0 > s->a->timeout_ns) {
        mscx_dfail(s, MSCX_ERR_TIMEOUT);
        return 1;
    }
    return 0;
}

/* ---- operands ---- */

__device__ __forceinline__ struct mscx_dopnd mscx_dresolve(const struct mscx_dstate *s, const struct mscx_dev_operand *o)
{
    struct mscx_dopnd r;
    const struct mscx_gpu_args *a = s->a;
    r.chunk = 0;
    r.size = 0;
    if (o->flags & MSCX_OPND_REMOTE) {
        const struct mscx_gpu_rbuf *rb = &s->ctx->rbuf[o->rbuf];
        if (rb->kind == MSCX_GPU_RBUF_SCRATCH) {
            uint64_t half = a->half_per_chunk * rb->owner_scratch_chunks;
            r.base = (char *)rb->ptr + mscx_scratch_offset(s->flag, half);
            r.raw = 0;
        } else {
            int t = rb->type == MSCX_BUF_OUTPUT;
            r.base = (char *)*(void *const volatile *)&rb->pub->ptr[s->parity][t];
            r.raw = 1;
            r.chunk = t ? a->out_chunk : a->in_chunk;
            r.size = t ? a->out_bytes : a->in_bytes;
        }
        return r;
    }
    switch (o->type) {
    case MSCX_BUF_INPUT:
        r.base = (char *)a->in;
        r.raw = 1;
        r.chunk = a->in_chunk;
        r.size = a->in_bytes;
        break;
    case MSCX_BUF_OUTPUT:
        r.base = (char *)a->out;
        r.raw = 1;
        r.chunk = a->out_chunk;
        r.size = a->out_bytes;
        break;
    default:
        r.base = s->ctx->scratch + s->so;
        r.raw = 0;
        break;
    }
    return r;
}

/*
 * Load @p n (4, 8 or 16) payload bytes at logical offset @p x; bytes past a
 * raw chunk's real end read as zero.
 */
__device__ __forceinline__ uint4 mscx_dload(const struct mscx_dopnd *r, uint64_t x, uint32_t n, uint64_t slot)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    const char *p;
    uint64_t avail = n;
    if (r->raw) {
        uint64_t real = mscx_raw_map(x, slot, r->chunk, r->size, &avail);
        if (avail == 0)
            return v;
        p = r->base + real;
    } else {
        p = r->base + x;
    }
    if (avail >= n && ((uintptr_t)p & (n - 1)) == 0) {
        if (n == 16)
            return *(const uint4 *)p;
        if (n == 8) {
            uint2 w = *(const uint2 *)p;
            v.x = w.x;
            v.y = w.y;
            return v;
        }
        v.x = *(const uint32_t *)p;
        return v;
    }
    uint32_t w[4] = {0, 0, 0, 0};
    uint32_t m = avail < n ? (uint32_t)avail : n;
    for (uint32_t i = 0; i < m; i++)
        w[i >> 2] |= (uint32_t)(uint8_t)p[i] << ((i & 3u) * 8u);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Store @p n payload bytes at logical @p x; bytes past a raw chunk's real end are dropped. */
__device__ __forceinline__ void mscx_dstore(const struct mscx_dopnd *r, uint64_t x, uint32_t n, uint64_t slot, uint4 v)
{
    char *p;
    uint64_t avail = n;
    if (r->raw) {
        uint64_t real = mscx_raw_map(x, slot, r->chunk, r->size, &avail);
        if (avail == 0)
            return;
        p = r->base + real;
    } else {
        p = r->base + x;
    }
    if (avail >= n && ((uintptr_t)p & (n - 1)) == 0) {
        if (n == 16)
            *(uint4 *)p = v;
        else if (n == 8)
            *(uint2 *)p = make_uint2(v.x, v.y);
        else
            *(uint32_t *)p = v.x;
        return;
    }
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = avail < n ? (uint32_t)avail : n;
    for (uint32_t i = 0; i < m; i++)
        p[i] = (char)(w[i >> 2] >> ((i & 3u) * 8u));
}

__device__ __forceinline__ uint4 mscx_dreduce(uint32_t dtype, uint32_t op, uint4 a, uint4 b)
{
    a.x = mscx_reduce_word(dtype, op, a.x, b.x);
    a.y = mscx_reduce_word(dtype, op, a.y, b.y);
    a.z = mscx_reduce_word(dtype, op, a.z, b.z);
    a.w = mscx_reduce_word(dtype, op, a.w, b.w);
    return a;
}

/* ---- packet lines ---- */

/* Write the line holding payload unit @p v (LL16: v.x, v.y; LL8: v.x) at @p line. */
__device__ __forceinline__ void mscx_dline_store(char *line, uint32_t pkt, uint4 v, uint32_t flag)
{
    if (pkt == MSCX_PKT_LL8) {
        asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(line), "r"(v.x), "r"(flag) : "memory");
    } else {
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(v.x), "r"(flag),
                     "r"(v.y), "r"(flag)
                     : "memory");
    }
}

/* Blocking read of a line with @p flag. @return 0, or non-zero when giving up. */
__device__ __forceinline__ int mscx_dline_read(const struct mscx_dstate *s, const char *line, uint32_t pkt, uint4 *v_p)
{
    struct mscx_spin sp = {0, 0};
    uint32_t flag = s->flag;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pkt == MSCX_PKT_LL8) {
        uint32_t d, f;
        for (;;) {
            asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(d), "=r"(f) : "l"(line) : "memory");
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

#endif /* MSCX_EXEC_DEV_CUH */
