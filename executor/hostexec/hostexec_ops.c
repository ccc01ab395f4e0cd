/* SPDX-License-Identifier: MIT */
/*
 * Host reference executor: the semantics of every non-multicast operation
 * (format spec section 3, with the section 7 pitfalls fixed). Reductions,
 * packet halves, flags, slicing and the raw mapping come from op_math.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "hostexec_int.h"
#include "op_math.h"

#define SLICE_UNIT 16u

/* Pipeline sub-range applied to every operand of a body op. */
struct pipe_ctx {
    bool on;
    uint64_t off, unit;
};

static const struct pipe_ctx no_pipe = {false, 0, 0};

static uint32_t fmt_of(struct hx_tb *t)
{
    return (uint32_t)t->run->cfg->pkt;
}

/* Resolve an operand to (owner rank, type, logical range). */
static void opnd_loc(struct hx_tb *t, const struct pipe_ctx *pc, const struct mscx_dev_operand *o,
                     struct hx_loc *l)
{
    uint32_t owner = t->rk->rank;
    uint8_t type = o->type;
    uint64_t off, len;
    if (o->flags & MSCX_OPND_REMOTE) {
        const struct mscx_rbuf *rb = &t->rk->gpu->rbuf[o->rbuf];
        owner = rb->rank;
        type = rb->type;
    }
    mscx_operand_range(t->op, o, t->run->ranks[owner].geom.slot, SLICE_UNIT, &off, &len);
    if (pc->on) {
        if (pc->off >= len) {
            len = 0;
        } else {
            len -= pc->off;
            if (len > pc->unit)
                len = pc->unit;
        }
        off += pc->off;
    }
    l->rank = owner;
    l->type = type;
    l->off = off;
    l->len = len;
}

static struct hx_loc sub(const struct hx_loc *l, uint64_t at, uint64_t n)
{
    struct hx_loc s = *l;
    s.off += at;
    s.len = at >= l->len ? 0 : (l->len - at < n ? l->len - at : n);
    return s;
}

/* ---- packets ---- */

static void line_write(uint8_t *line, uint32_t fmt, const uint8_t *payload, uint32_t flag)
{
    uint32_t d0, d1;
    memcpy(&d0, payload, 4);
    atomic_store_explicit((_Atomic uint64_t *)(void *)line, mscx_pkt_half(d0, flag), memory_order_release);
    if (fmt == MSCX_PKT_LL16) {
        memcpy(&d1, payload + 4, 4);
        atomic_store_explicit((_Atomic uint64_t *)(void *)(line + 8), mscx_pkt_half(d1, flag),
                              memory_order_release);
    }
}

static bool line_read(const uint8_t *line, uint32_t fmt, uint32_t flag, uint8_t *payload)
{
    uint64_t h0 = atomic_load_explicit((_Atomic uint64_t *)(void *)line, memory_order_acquire);
    if (!mscx_pkt_half_valid(h0, flag))
        return false;
    uint32_t d0 = mscx_pkt_half_data(h0);
    if (fmt == MSCX_PKT_LL16) {
        uint64_t h1 = atomic_load_explicit((_Atomic uint64_t *)(void *)(line + 8), memory_order_acquire);
        if (!mscx_pkt_half_valid(h1, flag))
            return false;
        uint32_t d1 = mscx_pkt_half_data(h1);
        memcpy(payload + 4, &d1, 4);
    }
    memcpy(payload, &d0, 4);
    return true;
}

struct line_wait {
    const uint8_t *line;
    uint32_t fmt, flag, rank;
    uint64_t index, off;
    uint8_t *payload;
};

static bool line_ready(void *arg)
{
    struct line_wait *w = arg;
    return line_read(w->line, w->fmt, w->flag, w->payload);
}

static void line_describe(void *arg, char *buf, size_t len)
{
    struct line_wait *w = arg;
    snprintf(buf, len, "packet line %" PRIu64 " of scratch offset 0x%" PRIx64 " on rank %u with flag %u",
             w->index, w->off, w->rank, w->flag);
}

/* Packet-space pointer of a packet operand covering @p lines lines from line @p first. */
static uint8_t *pkt_at(struct hx_tb *t, const struct hx_loc *l, uint64_t first, uint64_t lines)
{
    uint32_t fmt = fmt_of(t), P = mscx_pkt_line(fmt), L = mscx_pkt_payload(fmt);
    uint64_t off = 2 * l->off + first * P;
    uint8_t *p = hx_pkt_ptr(t->run, l->rank, l->type, off, lines * P, t->rk->so);
    if (p == NULL)
        hx_op_fail(t, MSCX_ERR_INTERNAL,
                   "packet range of %" PRIu64 " bytes at 0x%" PRIx64
                   " of buffer type %u on rank %u is out of bounds (payload 0x%" PRIx64 " + %" PRIu64
                   " lines of %u)",
                   lines * P, off, l->type, l->rank, l->off, first, L);
    return p;
}

/* Blocking read of @p lines lines of @p l starting at line @p first into @p out. */
static bool pkt_read(struct hx_tb *t, const struct hx_loc *l, uint64_t first, uint64_t lines, uint8_t *out)
{
    uint32_t fmt = fmt_of(t), P = mscx_pkt_line(fmt), L = mscx_pkt_payload(fmt);
    uint8_t *base = pkt_at(t, l, first, lines);
    if (base == NULL)
        return false;
    for (uint64_t j = 0; j < lines; j++) {
        if (line_read(base + j * P, fmt, t->rk->flag, out + j * L))
            continue;
        struct line_wait w = {base + j * P, fmt, t->rk->flag, l->rank, first + j, 2 * l->off, out + j * L};
        if (!hx_wait(t, t->rk->rank, line_ready, line_describe, &w))
            return false;
    }
    return true;
}

static bool pkt_write(struct hx_tb *t, const struct hx_loc *l, uint64_t first, uint64_t lines,
                      const uint8_t *in)
{
    uint32_t fmt = fmt_of(t), P = mscx_pkt_line(fmt), L = mscx_pkt_payload(fmt);
    uint8_t *base = pkt_at(t, l, first, lines);
    if (base == NULL)
        return false;
    for (uint64_t j = 0; j < lines; j++)
        line_write(base + j * P, fmt, in + j * L, t->rk->flag);
    return true;
}

/* ---- reductions ---- */

static void fold(struct hx_tb *t, uint8_t *acc, const uint8_t *b, uint64_t n)
{
    mscx_reduce_bytes(t->run->cfg->dtype, t->run->cfg->op, acc, b, n);
}

/*
 * The reduce family. Raw sources are src[0..nraw), packet sources
 * src[nraw..nsrc); raw results go to dst[0..nrawdst), packet results to
 * dst[nrawdst..ndst).
 */
static bool do_reduce(struct hx_tb *t, const struct pipe_ctx *pc, uint32_t nraw, uint32_t nrawdst)
{
    const struct mscx_dev_op *op = t->op;
    struct hx_loc src[MSCX_MAX_OPERANDS], dst[MSCX_MAX_OPERANDS];
    for (uint32_t i = 0; i < op->nsrc; i++)
        opnd_loc(t, pc, &op->src[i], &src[i]);
    for (uint32_t i = 0; i < op->ndst; i++)
        opnd_loc(t, pc, &op->dst[i], &dst[i]);
    uint32_t L = mscx_pkt_payload(fmt_of(t));
    bool pkt = nraw < op->nsrc || nrawdst < op->ndst;
    uint64_t total = src[0].len;
    if (pkt)
        total = total / L * L;
    for (uint64_t at = 0; at < total; at += HX_PIECE) {
        uint64_t n = total - at < HX_PIECE ? total - at : HX_PIECE;
        struct hx_loc s0 = sub(&src[0], at, n);
        hx_raw_read(t->run, &s0, t->rk->so, t->buf_a);
        for (uint32_t k = 1; k < op->nsrc; k++) {
            if (k < nraw) {
                struct hx_loc sk = sub(&src[k], at, n);
                memset(t->buf_b, 0, n);
                hx_raw_read(t->run, &sk, t->rk->so, t->buf_b);
            } else if (!pkt_read(t, &src[k], at / L, n / L, t->buf_b)) {
                return false;
            }
            fold(t, t->buf_a, t->buf_b, n);
        }
        for (uint32_t k = 0; k < op->ndst; k++) {
            if (k < nrawdst) {
                struct hx_loc dk = sub(&dst[k], at, n);
                hx_raw_write(t->run, &dk, t->rk->so, t->buf_a);
            } else if (!pkt_write(t, &dst[k], at / L, n / L, t->buf_a)) {
                return false;
            }
        }
        hx_sched_point(t);
    }
    for (uint32_t k = 0; k < op->ndst; k++)
        if (dst[k].rank != t->rk->rank)
            hx_bump(t->run, dst[k].rank);
    return true;
}

/* ---- data movement ---- */

static void copy_raw(struct hx_tb *t, const struct hx_loc *s, const struct hx_loc *d)
{
    uint64_t total = s->len < d->len ? s->len : d->len;
    for (uint64_t at = 0; at < total; at += HX_PIECE) {
        uint64_t n = total - at < HX_PIECE ? total - at : HX_PIECE;
        struct hx_loc sp = sub(s, at, n), dp = sub(d, at, n);
        hx_raw_read(t->run, &sp, t->rk->so, t->buf_a);
        hx_raw_write(t->run, &dp, t->rk->so, t->buf_a);
        hx_sched_point(t);
    }
    if (d->rank != t->rk->rank)
        hx_bump(t->run, d->rank);
}

/* Memory-channel / local pairwise raw copies: put, pws, pwsf (memory), get, copy. */
static bool do_copy_pairs(struct hx_tb *t, const struct pipe_ctx *pc)
{
    const struct mscx_dev_op *op = t->op;
    uint32_t n = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < n; i++) {
        struct hx_loc s, d;
        opnd_loc(t, pc, &op->src[i], &s);
        opnd_loc(t, pc, &op->dst[i], &d);
        copy_raw(t, &s, &d);
    }
    return true;
}

/* Pack raw @p s into packet lines at each of @p d[0..nd). */
static bool pack(struct hx_tb *t, const struct hx_loc *s, const struct hx_loc *d, uint32_t nd)
{
    uint32_t L = mscx_pkt_payload(fmt_of(t));
    uint64_t total = s->len / L * L;
    for (uint64_t at = 0; at < total; at += HX_PIECE) {
        uint64_t n = total - at < HX_PIECE ? total - at : HX_PIECE;
        struct hx_loc sp = sub(s, at, n);
        hx_raw_read(t->run, &sp, t->rk->so, t->buf_a);
        for (uint32_t k = 0; k < nd; k++)
            if (!pkt_write(t, &d[k], at / L, n / L, t->buf_a))
                return false;
        hx_sched_point(t);
    }
    for (uint32_t k = 0; k < nd; k++)
        if (d[k].rank != t->rk->rank)
            hx_bump(t->run, d[k].rank);
    return true;
}

static bool port_chan(struct hx_tb *t, uint32_t i, uint32_t *peer_p, uint32_t *pair_p)
{
    const struct mscx_dev_op *op = t->op;
    if (op->nchan == 0) {
        hx_op_fail(t, MSCX_ERR_INTERNAL, "port operation without a channel");
        return false;
    }
    uint32_t c = op->chan[i < op->nchan ? i : (uint32_t)op->nchan - 1u];
    const struct mscx_chan *ch = &t->rk->gpu->chan[MSCX_CHAN_PORT][c];
    if (!ch->paired) {
        hx_op_fail(t, MSCX_ERR_INTERNAL, "port channel %u to rank %u has no matching channel on the peer", c,
                   ch->peer);
        return false;
    }
    *peer_p = ch->peer;
    *pair_p = ch->pair;
    return true;
}

struct flush_wait {
    struct hx_rank *rk;
    uint64_t pos;
};

static bool flushed(void *arg)
{
    struct flush_wait *w = arg;
    return atomic_load(&w->rk->fifo.done) >= w->pos;
}

static void flush_describe(void *arg, char *buf, size_t len)
{
    struct flush_wait *w = arg;
    snprintf(buf, len, "the proxy of rank %u to complete request %" PRIu64 " (%" PRIu64 " done)", w->rk->rank,
             w->pos, atomic_load(&w->rk->fifo.done));
}

bool hx_wait_flush(struct hx_tb *t, uint64_t pos)
{
    struct flush_wait w = {t->rk, pos};
    return hx_wait(t, t->rk->rank, flushed, flush_describe, &w);
}

static bool push_signal(struct hx_tb *t, uint32_t i)
{
    struct hx_req q;
    memset(&q, 0, sizeof(q));
    q.kind = HX_REQ_SIGNAL;
    return port_chan(t, i, &q.sig_rank, &q.sig_chan) && hx_fifo_push(t, &q, NULL);
}

/* Port put, pws, pwsf. */
static bool do_port_put(struct hx_tb *t, const struct pipe_ctx *pc)
{
    const struct mscx_dev_op *op = t->op;
    uint32_t n = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    uint64_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct hx_req q;
        memset(&q, 0, sizeof(q));
        q.kind = HX_REQ_COPY;
        q.so = t->rk->so;
        opnd_loc(t, pc, &op->src[i], &q.src);
        opnd_loc(t, pc, &op->dst[i], &q.dst);
        if (q.dst.len < q.src.len)
            q.src.len = q.dst.len;
        if (!hx_fifo_push(t, &q, &pos))
            return false;
        if (op->opcode != MSCX_OP_PUT && !push_signal(t, i))
            return false;
    }
    if (op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH)
        return hx_wait_flush(t, atomic_load(&t->rk->fifo.head));
    return true;
}

/* Port ppkt (and the push half of port rppkt): copy packet lines through the proxy. */
static bool push_pkt_copy(struct hx_tb *t, const struct hx_loc *s, const struct hx_loc *d)
{
    uint32_t L = mscx_pkt_payload(fmt_of(t)), P = mscx_pkt_line(fmt_of(t));
    struct hx_req q;
    memset(&q, 0, sizeof(q));
    q.kind = HX_REQ_PKT_COPY;
    q.so = t->rk->so;
    q.src = *s;
    q.dst = *d;
    q.src.off = 2 * s->off;
    q.dst.off = 2 * d->off;
    q.src.len = s->len / L * P;
    if (pkt_at(t, s, 0, s->len / L) == NULL)
        return false;
    return hx_fifo_push(t, &q, NULL);
}

/* ---- signals, barriers, semaphores ---- */

struct sig_wait {
    _Atomic uint64_t *ctr;
    uint64_t expect;
    const char *kind;
    uint32_t chan, peer;
};

static bool sig_ready(void *arg)
{
    struct sig_wait *w = arg;
    return atomic_load_explicit(w->ctr, memory_order_acquire) >= w->expect;
}

static void sig_describe(void *arg, char *buf, size_t len)
{
    struct sig_wait *w = arg;
    snprintf(buf, len, "signal on %s channel %u from rank %u (%" PRIu64 " of %" PRIu64 " arrived)", w->kind,
             w->chan, w->peer, atomic_load(w->ctr), w->expect);
}

static bool do_signal(struct hx_tb *t)
{
    const struct mscx_dev_op *op = t->op;
    if (op->chan_type == MSCX_CHAN_PORT) {
        for (uint32_t i = 0; i < op->nchan; i++)
            if (!push_signal(t, i))
                return false;
        return true;
    }
    memory_order mo = op->opcode == MSCX_OP_RELAXED_SIGNAL ? memory_order_relaxed : memory_order_release;
    for (uint32_t i = 0; i < op->nchan; i++) {
        const struct mscx_chan *ch = &t->rk->gpu->chan[MSCX_CHAN_MEMORY][op->chan[i]];
        if (!ch->paired) {
            hx_op_fail(t, MSCX_ERR_INTERNAL,
                       "memory channel %u to rank %u has no matching channel on the peer", op->chan[i],
                       ch->peer);
            return false;
        }
        atomic_fetch_add_explicit(&t->run->ranks[ch->peer].inbound[MSCX_CHAN_MEMORY][ch->pair], 1, mo);
        hx_bump(t->run, ch->peer);
    }
    return true;
}

static bool do_wait(struct hx_tb *t)
{
    const struct mscx_dev_op *op = t->op;
    uint32_t ct = op->chan_type == MSCX_CHAN_PORT ? MSCX_CHAN_PORT : MSCX_CHAN_MEMORY;
    for (uint32_t i = 0; i < op->nchan; i++) {
        uint32_t c = op->chan[i];
        struct sig_wait w;
        w.ctr = &t->rk->inbound[ct][c];
        w.expect = atomic_fetch_add(&t->rk->expected[ct][c], 1) + 1;
        w.kind = ct == MSCX_CHAN_PORT ? "port" : "memory";
        w.chan = c;
        w.peer = t->rk->gpu->chan[ct][c].peer;
        if (!sig_ready(&w) && !hx_wait(t, t->rk->rank, sig_ready, sig_describe, &w))
            return false;
    }
    return true;
}

struct bar_wait {
    struct hx_barrier *b;
    uint32_t gen, id, ntb;
};

static bool bar_ready(void *arg)
{
    struct bar_wait *w = arg;
    return atomic_load(&w->b->gen) != w->gen;
}

static void bar_describe(void *arg, char *buf, size_t len)
{
    struct bar_wait *w = arg;
    snprintf(buf, len, "barrier %u (%u of %u blocks)", w->id, atomic_load(&w->b->count), w->ntb);
}

static bool do_barrier(struct hx_tb *t)
{
    const struct mscx_dev_op *op = t->op;
    struct hx_barrier *b = &t->rk->barrier[op->barrier_id % MSCX_MAX_BARRIERS];
    struct bar_wait w = {b, atomic_load(&b->gen), op->barrier_id, op->barrier_ntb};
    if (atomic_fetch_add(&b->count, 1) + 1 >= op->barrier_ntb) {
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
        hx_bump(t->run, t->rk->rank);
        return true;
    }
    return hx_wait(t, t->rk->rank, bar_ready, bar_describe, &w);
}

struct sem_wait {
    _Atomic int32_t *s;
    uint32_t id;
};

static bool sem_take(void *arg)
{
    struct sem_wait *w = arg;
    int32_t v = atomic_load(w->s);
    while (v > 0)
        if (atomic_compare_exchange_weak(w->s, &v, v - 1))
            return true;
    return false;
}

static void sem_describe(void *arg, char *buf, size_t len)
{
    struct sem_wait *w = arg;
    snprintf(buf, len, "semaphore %u (value %d)", w->id, (int)atomic_load(w->s));
}

static bool do_sem(struct hx_tb *t)
{
    const struct mscx_dev_op *op = t->op;
    for (uint32_t i = 0; i < op->nsem; i++) {
        struct sem_wait w = {&t->rk->sem[op->sem[i]], op->sem[i]};
        if (op->opcode == MSCX_OP_SEM_RELEASE) {
            atomic_fetch_add(w.s, 1);
            hx_bump(t->run, t->rk->rank);
        } else if (!sem_take(&w) && !hx_wait(t, t->rk->rank, sem_take, sem_describe, &w)) {
            return false;
        }
    }
    return true;
}

/* ---- packet movement ---- */

static bool do_ppkt(struct hx_tb *t, const struct pipe_ctx *pc)
{
    const struct mscx_dev_op *op = t->op;
    uint32_t n = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < n; i++) {
        struct hx_loc s, d;
        opnd_loc(t, pc, &op->src[i], &s); /* each source with its own type (pitfall 2) */
        opnd_loc(t, pc, &op->dst[i], &d);
        if (op->chan_type == MSCX_CHAN_PORT) {
            if (!push_pkt_copy(t, &s, &d))
                return false;
        } else if (!pack(t, &s, &d, 1)) {
            return false;
        }
    }
    return true;
}

static bool do_rppkt(struct hx_tb *t, const struct pipe_ctx *pc)
{
    const struct mscx_dev_op *op = t->op;
    struct hx_loc s, d[MSCX_MAX_OPERANDS];
    uint32_t L = mscx_pkt_payload(fmt_of(t));
    opnd_loc(t, pc, &op->src[0], &s);
    for (uint32_t k = 0; k < op->ndst; k++)
        opnd_loc(t, pc, &op->dst[k], &d[k]);
    uint64_t total = s.len / L * L;
    for (uint64_t at = 0; at < total; at += HX_PIECE) {
        uint64_t n = total - at < HX_PIECE ? total - at : HX_PIECE;
        if (!pkt_read(t, &s, at / L, n / L, t->buf_a))
            return false;
        if (op->chan_type != MSCX_CHAN_PORT)
            for (uint32_t k = 0; k < op->ndst; k++)
                if (!pkt_write(t, &d[k], at / L, n / L, t->buf_a))
                    return false;
        hx_sched_point(t);
    }
    for (uint32_t k = 0; k < op->ndst; k++) {
        if (op->chan_type == MSCX_CHAN_PORT) {
            if (!push_pkt_copy(t, &s, &d[k]))
                return false;
        } else if (d[k].rank != t->rk->rank) {
            hx_bump(t->run, d[k].rank);
        }
    }
    return true;
}

static bool do_cpkt(struct hx_tb *t, const struct pipe_ctx *pc)
{
    struct hx_loc s, d;
    opnd_loc(t, pc, &t->op->src[0], &s);
    opnd_loc(t, pc, &t->op->dst[0], &d);
    return pack(t, &s, &d, 1);
}

static bool do_upkt(struct hx_tb *t, const struct pipe_ctx *pc)
{
    struct hx_loc s, d;
    uint32_t L = mscx_pkt_payload(fmt_of(t));
    opnd_loc(t, pc, &t->op->src[0], &s);
    opnd_loc(t, pc, &t->op->dst[0], &d);
    uint64_t total = s.len / L * L;
    for (uint64_t at = 0; at < total; at += HX_PIECE) {
        uint64_t n = total - at < HX_PIECE ? total - at : HX_PIECE;
        if (!pkt_read(t, &s, at / L, n / L, t->buf_a))
            return false;
        struct hx_loc dp = sub(&d, at, n);
        hx_raw_write(t->run, &dp, t->rk->so, t->buf_a);
        hx_sched_point(t);
    }
    return true;
}

/* ---- a peer's user buffers ---- */

struct start_wait {
    struct hx_rank *peer;
    uint32_t gen; /* launch_gen of the launch running here */
};

static bool peer_started(void *arg)
{
    const struct start_wait *w = arg;
    return atomic_load(&w->peer->launch_gen) >= w->gen;
}

static void peer_started_describe(void *arg, char *buf, size_t len)
{
    const struct start_wait *w = arg;
    snprintf(buf, len, "rank %u to start launch %u, whose input or output this op uses", w->peer->rank,
             w->gen - 1u);
}

/*
 * An op touches a peer's input or output only once that peer has started
 * the same launch, as the GPU executor does (mscx_dpeer_user): before that,
 * the peer's caller may still be reading or refilling those buffers.
 */
static bool wait_peer_buffers(struct hx_tb *t)
{
    const struct mscx_dev_op *op = t->op;
    const struct mscx_gpu *g = t->rk->gpu;
    uint32_t gen = atomic_load(&t->rk->launch_gen);
    for (uint32_t k = 0; k < (uint32_t)op->nsrc + op->ndst; k++) {
        const struct mscx_dev_operand *o = k < op->nsrc ? &op->src[k] : &op->dst[k - op->nsrc];
        if (!(o->flags & MSCX_OPND_REMOTE) || (o->flags & MSCX_OPND_SWITCH) || o->rbuf >= g->nrbuf)
            continue;
        const struct mscx_rbuf *rb = &g->rbuf[o->rbuf];
        if (rb->type > MSCX_BUF_OUTPUT || rb->rank == t->rk->rank)
            continue;
        struct start_wait w = {&t->run->ranks[rb->rank], gen};
        if (!peer_started(&w) && !hx_wait(t, rb->rank, peer_started, peer_started_describe, &w))
            return false;
    }
    return true;
}

/* ---- dispatch ---- */

static bool exec_one(struct hx_tb *t, const struct pipe_ctx *pc)
{
    const struct mscx_dev_op *op = t->op;
    bool port = op->chan_type == MSCX_CHAN_PORT;
    bool ok = true;
    if (!wait_peer_buffers(t))
        return false;
    switch (op->opcode) {
    case MSCX_OP_NOP:
        break;
    case MSCX_OP_BARRIER:
        ok = do_barrier(t);
        break;
    case MSCX_OP_PUT:
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
        ok = port ? do_port_put(t, pc) : do_copy_pairs(t, pc);
        break;
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        ok = do_copy_pairs(t, pc);
        break;
    case MSCX_OP_SIGNAL:
    case MSCX_OP_RELAXED_SIGNAL:
        ok = do_signal(t);
        break;
    case MSCX_OP_WAIT:
    case MSCX_OP_RELAXED_WAIT:
        ok = do_wait(t);
        break;
    case MSCX_OP_FLUSH: /* every pushed request of this rank, whatever the channel count */
        ok = hx_wait_flush(t, atomic_load(&t->rk->fifo.head));
        break;
    case MSCX_OP_REDUCE:
        ok = do_reduce(t, pc, t->op->nsrc, 1);
        break;
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
        ok = do_reduce(t, pc, t->op->nsrc, t->op->ndst);
        break;
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        ok = do_reduce(t, pc, 1, 1);
        break;
    case MSCX_OP_PUT_PACKETS:
        ok = do_ppkt(t, pc);
        break;
    case MSCX_OP_READ_PUT_PACKETS:
        ok = do_rppkt(t, pc);
        break;
    case MSCX_OP_COPY_PACKETS:
        ok = do_cpkt(t, pc);
        break;
    case MSCX_OP_UNPACK_PACKETS:
        ok = do_upkt(t, pc);
        break;
    case MSCX_OP_SEM_ACQUIRE:
    case MSCX_OP_SEM_RELEASE:
        ok = do_sem(t);
        break;
    default:
        hx_op_fail(t, MSCX_ERR_UNSUPPORTED, "the host executor does not run this operation");
        ok = false;
        break;
    }
    return ok && !atomic_load(&t->run->abort);
}

bool hx_exec_op(struct hx_tb *t, const struct mscx_tb *tbd, uint32_t *idx)
{
    const struct mscx_dev_op *ops = t->rk->gpu->ops + tbd->op_begin;
    uint32_t i = *idx;
    t->op_idx = i;
    t->op = &ops[i];
    if (ops[i].opcode != MSCX_OP_PIPELINE) {
        *idx = i + 1;
        return exec_one(t, &no_pipe);
    }
    const struct mscx_dev_op *pl = &ops[i];
    uint32_t body = pl->pipe_nops;
    if (i + 1 + body > tbd->nops)
        body = tbd->nops - i - 1;
    *idx = i + 1 + body;
    struct pipe_ctx pc = {true, 0, pl->pipe_unit};
    uint64_t iters = 1;
    if (pl->pipe_unit == 0) {
        pc.on = false;
    } else {
        uint64_t span = (uint64_t)pl->pipe_nchunks * t->rk->geom.slot;
        iters = (span + pl->pipe_unit - 1) / pl->pipe_unit;
    }
    for (uint64_t it = 0; it < iters; it++) {
        pc.off = it * pl->pipe_unit;
        for (uint32_t k = 0; k < body; k++) {
            t->op_idx = i + 1 + k;
            t->op = &ops[i + 1 + k];
            if (!exec_one(t, &pc))
                return false;
            hx_sched_point(t);
        }
    }
    return true;
}
