/* SPDX-License-Identifier: MIT */
/*
 * Host reference executor: threads, memory, waiting and the port proxy.
 * Operation semantics live in hostexec_ops.c.
 *
 * Threads: per rank one controller (fill, flag, launch, collect), one thread
 * per thread block and, when the rank has port channels, one proxy thread.
 * Waiters spin briefly, then block on their rank's wake point, which every
 * producer bumps after each op; every wait has a deadline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostexec_int.h"
#include "mscx/env.h"
#include "mscx/log.h"
#include "op_math.h"

#define HX_STACK (256u * 1024u)
#define HX_SPINS 16
#define HX_SLICE_MS 20

uint64_t hx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void wake_init(struct hx_wake *w)
{
    pthread_condattr_t ca;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&w->epoch, 0);
    atomic_init(&w->waiters, 0);
}

void hx_bump(struct hx_run *run, uint32_t rank)
{
    struct hx_wake *w = &run->ranks[rank].wake;
    atomic_fetch_add(&w->epoch, 1);
    if (atomic_load(&w->waiters) > 0) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

static void bump_all(struct hx_run *run)
{
    for (uint32_t r = 0; r < run->plan->nranks; r++)
        hx_bump(run, r);
}

void hx_fail(struct hx_run *run, mscx_status_t st, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&run->err_mu);
    if (run->status == MSCX_OK) {
        run->status = st;
        va_start(ap, fmt);
        vsnprintf(run->errmsg, sizeof(run->errmsg), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&run->err_mu);
    atomic_store(&run->abort, 1);
    bump_all(run);
}

static void op_prefix(struct hx_tb *t, char *buf, size_t len)
{
    snprintf(buf, len, "rank %u tb %u op %u (%s)", t->rk->rank, t->tb, t->op_idx,
             t->op ? mscx_opcode_name((enum mscx_opcode)t->op->opcode) : "launch");
}

void hx_op_fail(struct hx_tb *t, mscx_status_t st, const char *fmt, ...)
{
    char pre[96], msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    op_prefix(t, pre, sizeof(pre));
    hx_fail(t->run, st, "%s: %s", pre, msg);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

void hx_sched_point(struct hx_tb *t)
{
    if (t->run->cfg->sched_seed == 0)
        return;
    uint64_t r = rng_next(&t->rng);
    if ((r & 7) == 0) {
        sched_yield();
    } else if ((r & 63) == 1) {
        struct timespec ts = {0, (long)(20000 + (r >> 20) % 80000)};
        nanosleep(&ts, NULL);
    }
}

bool hx_wait(struct hx_tb *t, uint32_t rank, hx_cond_fn cond, hx_describe_fn describe, void *arg)
{
    struct hx_run *run = t->run;
    struct hx_wake *w = &run->ranks[rank].wake;
    for (int i = 0; i < HX_SPINS; i++) {
        if (cond(arg))
            return true;
        if (atomic_load(&run->abort))
            return false;
        sched_yield();
    }
    uint64_t deadline = t->no_deadline ? UINT64_MAX : hx_now_ms() + run->timeout_ms;
    atomic_fetch_add(&w->waiters, 1);
    bool ok = false;
    for (;;) {
        uint64_t e = atomic_load(&w->epoch);
        if (cond(arg)) {
            ok = true;
            break;
        }
        if (atomic_load(&run->abort))
            break;
        uint64_t now = hx_now_ms();
        if (now >= deadline) {
            char what[320], pre[96];
            describe(arg, what, sizeof(what));
            op_prefix(t, pre, sizeof(pre));
            hx_fail(run, MSCX_ERR_TIMEOUT, "%s: waiting for %s", pre, what);
            break;
        }
        uint64_t slice = deadline - now < HX_SLICE_MS ? deadline - now : HX_SLICE_MS;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)(slice * 1000000u);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&w->mu);
        if (atomic_load(&w->epoch) == e && !atomic_load(&run->abort))
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        pthread_mutex_unlock(&w->mu);
    }
    atomic_fetch_sub(&w->waiters, 1);
    return ok;
}

/* ---- memory ---- */

static uint64_t scratch_limit(const struct hx_rank *rk)
{
    return rk->size[MSCX_BUF_SCRATCH];
}

void hx_raw_read(struct hx_run *run, const struct hx_loc *l, uint64_t so, uint8_t *dst)
{
    const struct hx_rank *rk = &run->ranks[l->rank];
    if (l->type == MSCX_BUF_SCRATCH) {
        uint64_t lim = scratch_limit(rk), s = so + l->off, n = l->len;
        if (s >= lim) {
            memset(dst, 0, n);
            return;
        }
        uint64_t have = lim - s < n ? lim - s : n;
        memcpy(dst, rk->mem[MSCX_BUF_SCRATCH] + s, have);
        memset(dst + have, 0, n - have);
        return;
    }
    uint64_t slot = rk->geom.slot, pos = l->off, end = l->off + l->len;
    while (pos < end) {
        uint64_t avail, real = mscx_raw_map(pos, slot, rk->chunk[l->type], rk->size[l->type], &avail);
        uint64_t to_slot = slot - pos % slot, n = end - pos;
        if (avail == 0) {
            n = n < to_slot ? n : to_slot;
            memset(dst, 0, n);
        } else {
            n = n < avail ? n : avail;
            memcpy(dst, rk->mem[l->type] + real, n);
        }
        dst += n;
        pos += n;
    }
}

void hx_raw_write(struct hx_run *run, const struct hx_loc *l, uint64_t so, const uint8_t *src)
{
    struct hx_rank *rk = &run->ranks[l->rank];
    if (l->type == MSCX_BUF_SCRATCH) {
        uint64_t lim = scratch_limit(rk), s = so + l->off, n = l->len;
        if (s >= lim)
            return;
        memcpy(rk->mem[MSCX_BUF_SCRATCH] + s, src, lim - s < n ? lim - s : n);
        return;
    }
    uint64_t slot = rk->geom.slot, pos = l->off, end = l->off + l->len;
    while (pos < end) {
        uint64_t avail, real = mscx_raw_map(pos, slot, rk->chunk[l->type], rk->size[l->type], &avail);
        uint64_t to_slot = slot - pos % slot, n = end - pos;
        if (avail == 0) {
            n = n < to_slot ? n : to_slot;
        } else {
            n = n < avail ? n : avail;
            memcpy(rk->mem[l->type] + real, src, n);
        }
        src += n;
        pos += n;
    }
}

uint8_t *hx_pkt_ptr(struct hx_run *run, uint32_t rank, uint8_t type, uint64_t off, uint64_t len, uint64_t so)
{
    struct hx_rank *rk = &run->ranks[rank];
    uint64_t base = type == MSCX_BUF_SCRATCH ? so + off : off;
    if (type >= MSCX_BUF_COUNT || rk->mem[type] == NULL || base + len > rk->size[type] || (base & 7))
        return NULL;
    return rk->mem[type] + base;
}

void hx_copy_pkt_atomic(uint8_t *dst, const uint8_t *src, uint64_t len)
{
    for (uint64_t i = 0; i + 8 <= len; i += 8) {
        uint64_t v = atomic_load_explicit((_Atomic uint64_t *)(void *)(src + i), memory_order_acquire);
        atomic_store_explicit((_Atomic uint64_t *)(void *)(dst + i), v, memory_order_release);
    }
}

/* ---- port proxy ---- */

bool hx_fifo_push(struct hx_tb *t, const struct hx_req *req, uint64_t *pos_p)
{
    struct hx_fifo *f = &t->rk->fifo;
    pthread_mutex_lock(&f->mu);
    uint64_t head = atomic_load(&f->head);
    if (head - atomic_load(&f->done) >= f->cap) {
        /* grow: the proxy reads entries under the lock, so this is safe */
        uint64_t ncap = f->cap * 2;
        struct hx_req *n = malloc(ncap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&f->mu);
            hx_op_fail(t, MSCX_ERR_NO_MEMORY, "out of memory growing the port request queue");
            return false;
        }
        for (uint64_t i = atomic_load(&f->done); i < head; i++)
            n[i % ncap] = f->req[i % f->cap];
        free(f->req);
        f->req = n;
        f->cap = ncap;
    }
    f->req[head % f->cap] = *req;
    atomic_store(&f->head, head + 1);
    pthread_mutex_unlock(&f->mu);
    if (pos_p)
        *pos_p = head + 1;
    hx_bump(t->run, t->rk->rank);
    return true;
}

static void proxy_serve(struct hx_run *run, struct hx_rank *rk, const struct hx_req *q, uint8_t *tmp)
{
    if (q->kind == HX_REQ_SIGNAL) {
        atomic_fetch_add_explicit(&run->ranks[q->sig_rank].inbound[MSCX_CHAN_PORT][q->sig_chan], 1,
                                  memory_order_release);
        hx_bump(run, q->sig_rank);
        return;
    }
    if (q->kind == HX_REQ_PKT_COPY) {
        uint8_t *s = hx_pkt_ptr(run, q->src.rank, q->src.type, q->src.off, q->src.len, q->so);
        uint8_t *d = hx_pkt_ptr(run, q->dst.rank, q->dst.type, q->dst.off, q->src.len, q->so);
        if (s == NULL || d == NULL) {
            hx_fail(run, MSCX_ERR_INTERNAL, "rank %u proxy: packet copy of %" PRIu64 " bytes out of range",
                    rk->rank, q->src.len);
            return;
        }
        hx_copy_pkt_atomic(d, s, q->src.len);
        hx_bump(run, q->dst.rank);
        return;
    }
    for (uint64_t done = 0; done < q->src.len; done += HX_PIECE) {
        uint64_t n = q->src.len - done < HX_PIECE ? q->src.len - done : HX_PIECE;
        struct hx_loc s = q->src, d = q->dst;
        s.off += done;
        s.len = n;
        d.off += done;
        d.len = n;
        hx_raw_read(run, &s, q->so, tmp);
        hx_raw_write(run, &d, q->so, tmp);
    }
    hx_bump(run, q->dst.rank);
}

struct proxy_arg {
    struct hx_run *run;
    struct hx_rank *rk;
};

static void *proxy_thread(void *arg)
{
    struct proxy_arg *pa = arg;
    struct hx_run *run = pa->run;
    struct hx_rank *rk = pa->rk;
    struct hx_fifo *f = &rk->fifo;
    struct hx_wake *w = &rk->wake;
    uint8_t *tmp = malloc(HX_PIECE);
    free(pa);
    if (tmp == NULL) {
        hx_fail(run, MSCX_ERR_NO_MEMORY, "rank %u proxy: out of memory", rk->rank);
        return NULL;
    }
    for (;;) {
        if (atomic_load(&run->abort))
            break;
        uint64_t e = atomic_load(&w->epoch);
        uint64_t done = atomic_load(&f->done);
        if (done < atomic_load(&f->head)) {
            struct hx_req q;
            pthread_mutex_lock(&f->mu);
            q = f->req[done % f->cap];
            pthread_mutex_unlock(&f->mu);
            proxy_serve(run, rk, &q, tmp);
            atomic_store(&f->done, done + 1);
            hx_bump(run, rk->rank);
            continue;
        }
        if (atomic_load(&f->stop))
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += HX_SLICE_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        atomic_fetch_add(&w->waiters, 1);
        pthread_mutex_lock(&w->mu);
        if (atomic_load(&w->epoch) == e)
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        pthread_mutex_unlock(&w->mu);
        atomic_fetch_sub(&w->waiters, 1);
    }
    free(tmp);
    return NULL;
}

/* ---- thread blocks and launches ---- */

struct tb_arg {
    struct hx_run *run;
    struct hx_rank *rk;
    uint32_t tb;
};

struct gen_wait {
    struct hx_rank *rk;
    uint32_t gen;
    uint32_t ntb;
};

static bool gen_changed(void *arg)
{
    struct gen_wait *g = arg;
    return atomic_load(&g->rk->launch_gen) != g->gen;
}

static void gen_describe(void *arg, char *buf, size_t len)
{
    struct gen_wait *g = arg;
    snprintf(buf, len, "the start of the next launch of rank %u", g->rk->rank);
}

static bool blocks_done(void *arg)
{
    struct gen_wait *g = arg;
    return atomic_load(&g->rk->blocks_done) >= g->ntb;
}

static void blocks_describe(void *arg, char *buf, size_t len)
{
    struct gen_wait *g = arg;
    snprintf(buf, len, "the end of launch %u of rank %u (%u of %u blocks done)",
             atomic_load(&g->rk->cur_iter), g->rk->rank, atomic_load(&g->rk->blocks_done), g->ntb);
}

static bool all_filled(void *arg)
{
    struct gen_wait *g = arg;
    return atomic_load(&g->rk->run->filled0) >= g->ntb;
}

static void all_filled_describe(void *arg, char *buf, size_t len)
{
    (void)arg;
    snprintf(buf, len, "the first fill of every rank");
}

static void *tb_thread(void *arg)
{
    struct tb_arg a = *(struct tb_arg *)arg;
    struct hx_run *run = a.run;
    struct hx_rank *rk = a.rk;
    const struct mscx_tb *tbd = &rk->gpu->tb[a.tb];
    struct hx_tb t;
    free(arg);
    memset(&t, 0, sizeof(t));
    t.run = run;
    t.rk = rk;
    t.tb = a.tb;
    t.rng = ((uint64_t)run->cfg->sched_seed * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)rk->rank << 32) ^
            (a.tb + 1) ^ 0x2545f4914f6cdd1dull;
    t.buf_a = malloc(HX_PIECE);
    t.buf_b = malloc(HX_PIECE);
    if (t.buf_a == NULL || t.buf_b == NULL) {
        hx_fail(run, MSCX_ERR_NO_MEMORY, "rank %u tb %u: out of memory", rk->rank, a.tb);
        goto out;
    }
    uint32_t gen = 0;
    for (uint32_t it = 0; it < run->cfg->iters; it++) {
        struct gen_wait gw = {rk, gen, 0};
        t.op = NULL;
        t.op_idx = 0;
        t.no_deadline = true;
        if (!hx_wait(&t, rk->rank, gen_changed, gen_describe, &gw))
            goto out;
        t.no_deadline = false;
        gen = atomic_load(&rk->launch_gen);
        for (uint32_t i = 0; i < tbd->nops;) {
            if (atomic_load(&run->abort))
                goto out;
            hx_sched_point(&t);
            if (!hx_exec_op(&t, tbd, &i))
                goto out;
        }
        atomic_fetch_add(&rk->blocks_done, 1);
        hx_bump(run, rk->rank);
    }
out:
    free(t.buf_a);
    free(t.buf_b);
    return NULL;
}

/*
 * A scaled launch: the scalar of this launch (a device scalar is read now, as
 * a kernel reads it when it runs), then the input multiplied by it in place;
 * an out-of-place plan's input as filled is kept, for scale_end().
 */
static void scale_begin(const struct hx_run *run, struct hx_rank *rk)
{
    const struct mscx_scale *sc = run->scale;
    uint64_t s = sc->value_bits, in = rk->size[MSCX_BUF_INPUT];
    if (sc->kind == MSCX_SCALE_DEVICE) {
        uint32_t w = 0;
        memcpy(&w, sc->dev_ptr, run->cfg->dtype == MSCX_DT_FP32 ? 4 : 2);
        s = w;
    }
    if (rk->saved_in)
        memcpy(rk->saved_in, rk->mem[MSCX_BUF_INPUT], in);
    mscx_scale_bytes(run->cfg->dtype, s, rk->mem[MSCX_BUF_INPUT], rk->mem[MSCX_BUF_INPUT], in);
}

/* After a scaled launch of an out-of-place plan: the input as the caller filled it. */
static void scale_end(struct hx_rank *rk)
{
    if (rk->saved_in)
        memcpy(rk->mem[MSCX_BUF_INPUT], rk->saved_in, rk->size[MSCX_BUF_INPUT]);
}

static void *ctl_thread(void *arg)
{
    struct proxy_arg *pa = arg;
    struct hx_run *run = pa->run;
    struct hx_rank *rk = pa->rk;
    const struct mscx_hostexec_cfg *cfg = run->cfg;
    struct hx_tb t;
    uint32_t ntb = rk->gpu->ntb;
    free(pa);
    memset(&t, 0, sizeof(t));
    t.run = run;
    t.rk = rk;
    t.tb = ntb; /* the controller */
    t.no_deadline = true;
    uint32_t flag = 0;
    for (uint32_t it = 0; it < cfg->iters; it++) {
        if (atomic_load(&run->abort))
            break;
        flag = mscx_flag_next(flag);
        rk->flag = flag;
        rk->so = mscx_scratch_offset(flag, rk->geom.scratch_half);
        atomic_store(&rk->cur_iter, it);
        if (cfg->fill)
            cfg->fill(cfg->ctx, rk->rank, it, rk->mem[MSCX_BUF_INPUT], rk->size[MSCX_BUF_INPUT],
                      rk->mem[MSCX_BUF_OUTPUT], rk->size[MSCX_BUF_OUTPUT]);
        if (run->scale)
            scale_begin(run, rk);
        if (run->hooks && run->hooks->scratch_pre)
            run->hooks->scratch_pre(cfg->ctx, rk->rank, it, flag, rk->mem[MSCX_BUF_SCRATCH],
                                    rk->size[MSCX_BUF_SCRATCH], rk->so);
        if (it == 0) {
            /* like a user who sets up every rank's buffers first: no launch starts before all first fills */
            struct gen_wait gw0 = {rk, 0, run->plan->nranks};
            atomic_fetch_add(&run->filled0, 1);
            bump_all(run);
            if (!hx_wait(&t, rk->rank, all_filled, all_filled_describe, &gw0))
                break;
        }
        atomic_store(&rk->blocks_done, 0);
        atomic_fetch_add(&rk->launch_gen, 1);
        hx_bump(run, rk->rank);
        struct gen_wait gw = {rk, 0, ntb};
        if (!hx_wait(&t, rk->rank, blocks_done, blocks_describe, &gw))
            break;
        /*
         * A launch is complete only when its port requests are: the caller may
         * reuse its buffers right after, as it may after a GPU launch (whose
         * executor drains the proxy before the launch completes).
         */
        if (rk->proxy_started && !hx_wait_flush(&t, atomic_load(&rk->fifo.head)))
            break;
        if (run->scale)
            scale_end(rk);
        if (cfg->collect)
            cfg->collect(cfg->ctx, rk->rank, it, rk->mem[MSCX_BUF_INPUT], rk->size[MSCX_BUF_INPUT],
                         rk->mem[MSCX_BUF_OUTPUT], rk->size[MSCX_BUF_OUTPUT]);
    }
    return NULL;
}

/* ---- setup ---- */

static mscx_status_t rank_setup(struct hx_run *run, struct hx_rank *rk, uint32_t r, char *err, size_t errlen)
{
    const struct mscx_plan *plan = run->plan;
    const struct mscx_hostexec_cfg *cfg = run->cfg;
    mscx_status_t st;
    rk->rank = r;
    rk->run = run;
    rk->gpu = &plan->gpus[r];
    st = mscx_plan_geom(plan, r, cfg->in_bytes, cfg->out_bytes, cfg->dtype, &rk->geom, err, errlen);
    if (st != MSCX_OK)
        return st;
    uint64_t in = cfg->in_bytes, out = cfg->out_bytes, total;
    uint64_t in_at = 0, out_at = 0;
    if (!plan->inplace) {
        total = in + out;
        out_at = in;
    } else if (plan->coll == MSCX_COLL_ALLGATHER) {
        total = out > (uint64_t)r * in + in ? out : (uint64_t)r * in + in;
        in_at = (uint64_t)r * in;
    } else if (plan->coll == MSCX_COLL_REDUCESCATTER) {
        total = in > (uint64_t)r * out + out ? in : (uint64_t)r * out + out;
        out_at = (uint64_t)r * out;
    } else {
        total = in > out ? in : out;
    }
    rk->alloc_io = calloc(1, total ? total : 1);
    rk->mem[MSCX_BUF_SCRATCH] = calloc(1, rk->geom.scratch_bytes ? rk->geom.scratch_bytes : 1);
    if (rk->alloc_io == NULL || rk->mem[MSCX_BUF_SCRATCH] == NULL)
        return MSCX_ERR_NO_MEMORY;
    if (run->scale && !plan->inplace && in && (rk->saved_in = malloc(in)) == NULL)
        return MSCX_ERR_NO_MEMORY;
    rk->mem[MSCX_BUF_INPUT] = rk->alloc_io + in_at;
    rk->mem[MSCX_BUF_OUTPUT] = rk->alloc_io + out_at;
    rk->size[MSCX_BUF_INPUT] = in;
    rk->size[MSCX_BUF_OUTPUT] = out;
    rk->size[MSCX_BUF_SCRATCH] = rk->geom.scratch_bytes;
    rk->chunk[MSCX_BUF_INPUT] = rk->geom.in_chunk;
    rk->chunk[MSCX_BUF_OUTPUT] = rk->geom.out_chunk;
    rk->chunk[MSCX_BUF_SCRATCH] = rk->geom.slot;
    for (int c = MSCX_CHAN_MEMORY; c <= MSCX_CHAN_PORT; c++) {
        uint32_t n = rk->gpu->nchan[c] ? rk->gpu->nchan[c] : 1;
        rk->inbound[c] = calloc(n, sizeof(*rk->inbound[c]));
        rk->expected[c] = calloc(n, sizeof(*rk->expected[c]));
        if (rk->inbound[c] == NULL || rk->expected[c] == NULL)
            return MSCX_ERR_NO_MEMORY;
    }
    rk->sem = calloc(rk->gpu->nsem ? rk->gpu->nsem : 1, sizeof(*rk->sem));
    rk->tb_thread = calloc(rk->gpu->ntb ? rk->gpu->ntb : 1, sizeof(pthread_t));
    rk->fifo.cap = 64;
    rk->fifo.req = calloc(rk->fifo.cap, sizeof(struct hx_req));
    if (rk->sem == NULL || rk->tb_thread == NULL || rk->fifo.req == NULL)
        return MSCX_ERR_NO_MEMORY;
    for (uint32_t s = 0; s < rk->gpu->nsem; s++)
        atomic_init(&rk->sem[s], rk->gpu->sem_init[s]);
    pthread_mutex_init(&rk->fifo.mu, NULL);
    wake_init(&rk->wake);
    return MSCX_OK;
}

static void rank_free(struct hx_rank *rk)
{
    free(rk->alloc_io);
    free(rk->saved_in);
    free(rk->mem[MSCX_BUF_SCRATCH]);
    for (int c = 0; c < MSCX_CHAN_COUNT; c++) {
        free(rk->inbound[c]);
        free(rk->expected[c]);
    }
    free((void *)rk->sem);
    free(rk->tb_thread);
    free(rk->fifo.req);
}

static int spawn(pthread_t *th, void *(*fn)(void *), void *arg)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, HX_STACK);
    int rc = pthread_create(th, &at, fn, arg);
    pthread_attr_destroy(&at);
    return rc;
}

/* Start a per-rank thread (proxy or controller); the thread frees its argument. */
static int spawn_rank(pthread_t *th, void *(*fn)(void *), struct hx_run *run, struct hx_rank *rk)
{
    struct proxy_arg *pa = malloc(sizeof(*pa));
    if (pa == NULL)
        return -1;
    pa->run = run;
    pa->rk = rk;
    if (spawn(th, fn, pa) != 0) {
        free(pa);
        return -1;
    }
    return 0;
}

static mscx_status_t check_plan(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg, char *err,
                                size_t errlen)
{
    if (plan == NULL || cfg == NULL || cfg->iters == 0) {
        snprintf(err, errlen, "caller bug: hostexec needs a plan, a configuration and at least one launch");
        return MSCX_ERR_INVALID_ARG;
    }
    if (plan->has_multicast) {
        mscx_status_t st = mscx_plan_executable(plan, err, errlen);
        if (st == MSCX_OK) {
            snprintf(err, errlen,
                     "plan %s uses multicast (switch channels), which the host executor does not run",
                     plan->name);
            st = MSCX_ERR_UNSUPPORTED;
        }
        return st;
    }
    if (!mscx_plan_supports(plan, cfg->dtype, cfg->op)) {
        snprintf(err, errlen, "plan %s does not support %s with %s", plan->name, mscx_dtype_name(cfg->dtype),
                 mscx_redop_name(cfg->op));
        return MSCX_ERR_UNSUPPORTED;
    }
    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++) {
            if (mscx_opcode_reduces(g->ops[i].opcode) && !(MSCX_DT_REDUCIBLE_MASK & (1u << cfg->dtype))) {
                snprintf(err, errlen, "plan %s reduces, and %s cannot be reduced", plan->name,
                         mscx_dtype_name(cfg->dtype));
                return MSCX_ERR_UNSUPPORTED;
            }
        }
    }
    return MSCX_OK;
}

/* Start rank @p rk's threads: its proxy (when it has port channels), one per thread block, its controller. */
static mscx_status_t start_rank(struct hx_run *run, struct hx_rank *rk)
{
    if (rk->gpu->nchan[MSCX_CHAN_PORT] > 0) {
        if (spawn_rank(&rk->proxy_thread, proxy_thread, run, rk) != 0)
            return MSCX_ERR_SYSTEM;
        rk->proxy_started = true;
    }
    for (uint32_t b = 0; b < rk->gpu->ntb; b++) {
        struct tb_arg *ta = malloc(sizeof(*ta));
        if (ta) {
            ta->run = run;
            ta->rk = rk;
            ta->tb = b;
        }
        if (ta == NULL || spawn(&rk->tb_thread[b], tb_thread, ta) != 0) {
            free(ta);
            return MSCX_ERR_SYSTEM;
        }
        rk->tb_started++;
    }
    if (spawn_rank(&rk->ctl_thread, ctl_thread, run, rk) != 0)
        return MSCX_ERR_SYSTEM;
    rk->ctl_started = true;
    return MSCX_OK;
}

/* Wait for every thread that started: controllers and thread blocks, then (once told to stop) the proxies. */
static void join_ranks(struct hx_run *run)
{
    uint32_t n = run->plan->nranks;
    for (uint32_t r = 0; r < n; r++) {
        struct hx_rank *rk = &run->ranks[r];
        if (rk->ctl_started)
            pthread_join(rk->ctl_thread, NULL);
        for (uint32_t b = 0; b < rk->tb_started; b++)
            pthread_join(rk->tb_thread[b], NULL);
    }
    for (uint32_t r = 0; r < n; r++) {
        atomic_store(&run->ranks[r].fifo.stop, 1);
        hx_bump(run, r);
    }
    for (uint32_t r = 0; r < n; r++)
        if (run->ranks[r].proxy_started)
            pthread_join(run->ranks[r].proxy_thread, NULL);
}

/* Run the plan on ranks already set up; @return the run's status. */
static mscx_status_t run_ranks(struct hx_run *run)
{
    const struct hx_hooks *hooks = run->hooks;
    uint32_t n = run->plan->nranks;
    mscx_status_t st = MSCX_OK;
    for (uint32_t r = 0; r < n && st == MSCX_OK; r++)
        st = start_rank(run, &run->ranks[r]);
    if (st != MSCX_OK)
        hx_fail(run, st, "cannot start the executor threads (%u ranks, %s)", n, strerror(errno));
    join_ranks(run);
    st = run->status;
    if (st == MSCX_OK && hooks && hooks->final) {
        for (uint32_t r = 0; r < n; r++) {
            struct hx_rank *rk = &run->ranks[r];
            hooks->final(run->cfg->ctx, r, rk->mem[MSCX_BUF_INPUT], rk->size[MSCX_BUF_INPUT],
                         rk->mem[MSCX_BUF_OUTPUT], rk->size[MSCX_BUF_OUTPUT], rk->mem[MSCX_BUF_SCRATCH],
                         rk->size[MSCX_BUF_SCRATCH]);
        }
    }
    return st;
}

/* A scaled sum is a sum, of a floating type, of a collective that reduces, with a scalar to read. */
static mscx_status_t check_scale(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                 const struct mscx_scale *sc, char *err, size_t errlen)
{
    if (sc->kind != MSCX_SCALE_HOST && sc->kind != MSCX_SCALE_DEVICE) {
        snprintf(err, errlen, "caller bug: scale kind %d is not host or device", (int)sc->kind);
        return MSCX_ERR_INVALID_ARG;
    }
    if (sc->kind == MSCX_SCALE_DEVICE && sc->dev_ptr == NULL) {
        snprintf(err, errlen, "caller bug: a device scale without a pointer");
        return MSCX_ERR_INVALID_ARG;
    }
    if (cfg->op != MSCX_REDOP_SUM || !mscx_dtype_scalable(cfg->dtype) ||
        (plan->coll != MSCX_COLL_ALLREDUCE && plan->coll != MSCX_COLL_REDUCESCATTER)) {
        snprintf(err, errlen,
                 "caller bug: a scaled launch must be a sum of fp32, fp16 or bf16 on an allreduce "
                 "or reducescatter plan, not %s %s on %s",
                 mscx_redop_name(cfg->op), mscx_dtype_name(cfg->dtype), plan->name);
        return MSCX_ERR_INVALID_ARG;
    }
    return MSCX_OK;
}

mscx_status_t mscx_hostexec_run_hooks(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                      const struct hx_hooks *hooks, char *err, size_t errlen)
{
    return mscx_hostexec_run_hooks_scaled(plan, cfg, hooks, NULL, err, errlen);
}

mscx_status_t mscx_hostexec_run_hooks_scaled(const struct mscx_plan *plan,
                                             const struct mscx_hostexec_cfg *cfg,
                                             const struct hx_hooks *hooks, const struct mscx_scale *scale,
                                             char *err, size_t errlen)
{
    char dummy[8];
    struct hx_run run;
    mscx_status_t st;
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    err[0] = '\0';
    if (scale && scale->kind == MSCX_SCALE_NONE)
        scale = NULL;
    st = check_plan(plan, cfg, err, errlen);
    if (st == MSCX_OK && scale)
        st = check_scale(plan, cfg, scale, err, errlen);
    if (st != MSCX_OK) {
        MSCX_WARN("hostexec: %s", err);
        return st;
    }
    memset(&run, 0, sizeof(run));
    run.plan = plan;
    run.cfg = cfg;
    run.hooks = hooks;
    run.scale = scale;
    run.timeout_ms = cfg->timeout_ms;
    if (run.timeout_ms == 0) {
        const struct mscx_config *conf;
        run.timeout_ms = mscx_config_get(&conf) == MSCX_OK ? conf->sim_timeout_ms : 20000;
    }
    pthread_mutex_init(&run.err_mu, NULL);
    atomic_init(&run.abort, 0);
    uint32_t n = plan->nranks;
    run.ranks = calloc(n, sizeof(*run.ranks));
    if (run.ranks == NULL) {
        snprintf(err, errlen, "out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    for (uint32_t r = 0; r < n; r++) {
        st = rank_setup(&run, &run.ranks[r], r, err, errlen);
        if (st != MSCX_OK) {
            if (st == MSCX_ERR_NO_MEMORY)
                snprintf(err, errlen, "out of memory for the buffers of rank %u", r);
            MSCX_WARN("hostexec: %s", err);
            goto cleanup;
        }
    }
    st = run_ranks(&run);
    if (st != MSCX_OK) {
        snprintf(err, errlen, "%s", run.errmsg);
        MSCX_WARN("hostexec: plan %s: %s", plan->name, run.errmsg);
    }
cleanup:
    for (uint32_t r = 0; r < n; r++)
        rank_free(&run.ranks[r]);
    free(run.ranks);
    pthread_mutex_destroy(&run.err_mu);
    return st;
}

mscx_status_t mscx_hostexec_run(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg, char *err,
                                size_t errlen)
{
    return mscx_hostexec_run_hooks(plan, cfg, NULL, err, errlen);
}

mscx_status_t mscx_hostexec_run_scaled(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                       const struct mscx_scale *scale, char *err, size_t errlen)
{
    return mscx_hostexec_run_hooks_scaled(plan, cfg, NULL, scale, err, errlen);
}
