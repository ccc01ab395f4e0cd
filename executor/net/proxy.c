/* SPDX-License-Identifier: MIT */
/*
 * The process's port-channel proxy thread (see proxy.h and port_fifo.h
 * for the FIFO protocol). The network link it serves TCP and RDMA channels
 * through is in proxy_tcp.c.
 *
 * Ordering: requests of one queue are executed one after the other, in
 * position order, and every link keeps issue order at the target (the cuda
 * link: one stream; TCP: one stream per connection), so a signal is applied
 * after every earlier put of its channel has landed.
 *
 * Failure: the first failing request (or a link's health check failing
 * while the queue is mid-launch) logs one WARN naming rank, plan, position,
 * request, channel, peer, thread block and op, records the status through
 * the owner's fail hook (which also makes the kernel give up) and stops
 * serving the queue.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mscx/dev_types.h"
#include "mscx/log.h"
#include "proxy.h"

#define PROXY_BATCH 64          /* requests of one queue served before looking at the next */
#define PROXY_CHECK_NS 10000000 /* health checks of an active queue, at most this often */

struct mscx_pqueue {
    struct mscx_pqueue_desc d;
    struct mscx_pchan *chan;
    uint8_t *used; /* [nchan] channels with requests since the last full flush */
    char name[128];
    uint64_t tail;       /* next position to take (proxy thread) */
    _Atomic int err;     /* mscx_status_t, first error */
    int active;          /* a put or signal was served since the last flush */
    uint64_t last_check; /* ns */
    struct mscx_preq last;
    _Atomic uint64_t taken; /* copy of tail for describe() */
    struct mscx_pqueue *next;
};

static struct {
    pthread_mutex_t mu;
    pthread_t thr;
    int running;
    uint64_t gen; /* a thread runs while the generation it was started with is current */
    struct mscx_pqueue *head;
} g_proxy = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, NULL};

static const char *kind_name(uint32_t k)
{
    switch (k) {
    case MSCX_PREQ_PUT:
        return "put";
    case MSCX_PREQ_PUT_PKT:
        return "packet put";
    case MSCX_PREQ_SIGNAL:
        return "signal";
    case MSCX_PREQ_FLUSH:
        return "flush";
    default:
        return "unknown";
    }
}

static void queue_fail(struct mscx_pqueue *q, mscx_status_t st, const struct mscx_preq *r, uint64_t pos,
                       const char *why)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&q->err, &expected, (int)st))
        return;
    uint32_t peer = r && r->chan < q->d.nchan ? q->chan[r->chan].peer : UINT32_MAX;
    if (r)
        MSCX_WARN("proxy: rank %u plan %s: %s request at fifo position %" PRIu64
                  " (port channel %u to rank %d, "
                  "thread block %u op %u, launch flag %u, %" PRIu64 " bytes at peer %s offset %" PRIu64
                  ") failed: %s: %s",
                  q->d.rank, q->name, kind_name(r->kind), pos, r->chan, peer == UINT32_MAX ? -1 : (int)peer,
                  r->block, r->op, r->launch, r->len,
                  r->kind != MSCX_PREQ_PUT            ? "scratch"
                  : (r->flags & MSCX_PREQ_F_USER_IN)  ? "input buffer"
                  : (r->flags & MSCX_PREQ_F_USER_OUT) ? "output buffer"
                                                      : "scratch",
                  r->dst_off, why, mscx_status_str(st));
    else
        MSCX_WARN("proxy: rank %u plan %s: %s: %s", q->d.rank, q->name, why, mscx_status_str(st));
    if (q->d.fail)
        q->d.fail(q->d.ctx, st);
}

static uint64_t deadline(const struct mscx_pqueue *q)
{
    return mscx_tp_deadline(q->d.timeout_ms);
}

/* The last request taken, field by field: describe() reads it from another thread without the lock. */
static void last_store(struct mscx_pqueue *q, const struct mscx_preq *r)
{
    __atomic_store_n(&q->last.kind, r->kind, __ATOMIC_RELAXED);
    __atomic_store_n(&q->last.chan, r->chan, __ATOMIC_RELAXED);
    __atomic_store_n(&q->last.block, r->block, __ATOMIC_RELAXED);
    __atomic_store_n(&q->last.op, r->op, __ATOMIC_RELAXED);
    __atomic_store_n(&q->last.launch, r->launch, __ATOMIC_RELAXED);
    __atomic_store_n(&q->last.len, r->len, __ATOMIC_RELAXED);
}

/* A put or signal was issued on channel @p k: the next flush waits for it, the health check watches it. */
static void mark_used(struct mscx_pqueue *q, uint32_t k)
{
    q->used[k] = 1;
    q->active = 1;
}

/* A put into the peer's input or output buffer. */
static mscx_status_t exec_put_user(struct mscx_pqueue *q, const struct mscx_pchan *c,
                                   const struct mscx_preq *r, const char **why)
{
    unsigned user = r->flags & (MSCX_PREQ_F_USER_IN | MSCX_PREQ_F_USER_OUT);
    /* the peer's input or output buffer: its size is known where it is resolved, not here */
    if (r->kind == MSCX_PREQ_PUT_PKT || user == (MSCX_PREQ_F_USER_IN | MSCX_PREQ_F_USER_OUT)) {
        *why = "internal bug: a put into a user buffer that is a packet put or names both buffers";
        return MSCX_ERR_INTERNAL;
    }
    if (!c->ops->put_user) {
        *why = "internal bug: this link cannot put into a peer's input or output buffer";
        return MSCX_ERR_INTERNAL;
    }
    if (r->len == 0)
        return MSCX_OK;
    struct mscx_puser d = {.buf = user == MSCX_PREQ_F_USER_IN ? MSCX_BUF_INPUT : MSCX_BUF_OUTPUT,
                           .launch = r->launch,
                           .off = r->dst_off,
                           .addr = r->reserved};
    mscx_status_t st = c->ops->put_user(c->link, (const void *)(uintptr_t)r->src, &d, r->len, deadline(q));
    *why = "the link's put into the peer's user buffer failed";
    mark_used(q, r->chan);
    return st;
}

/* A put (or packet put) into the peer's scratch, or into its user buffers when the request says so. */
static mscx_status_t exec_put(struct mscx_pqueue *q, const struct mscx_pchan *c, const struct mscx_preq *r,
                              const char **why)
{
    int pkt = r->kind == MSCX_PREQ_PUT_PKT;
    if (r->flags & (MSCX_PREQ_F_USER_IN | MSCX_PREQ_F_USER_OUT))
        return exec_put_user(q, c, r, why);
    if (r->dst_off > c->dst_bytes || r->len > c->dst_bytes - r->dst_off) {
        *why = "internal bug: the put reaches past the peer's scratch";
        return MSCX_ERR_INTERNAL;
    }
    if (pkt && (r->dst_off % 8 != 0 || r->len % 8 != 0 || r->src % 8 != 0)) {
        *why = "internal bug: a packet put that is not whole aligned 8-byte units";
        return MSCX_ERR_INTERNAL;
    }
    if (r->len == 0)
        return MSCX_OK;
    mscx_status_t st = c->ops->put(c->link, (const void *)(uintptr_t)r->src, r->dst_off, r->len,
                                   pkt ? MSCX_TP_PUT_PACKET : 0u, deadline(q));
    *why = "the link's put failed";
    mark_used(q, r->chan);
    return st;
}

/* Flush every channel used since the last full flush; a full flush then publishes @p pos as done. */
static mscx_status_t exec_flush(struct mscx_pqueue *q, const struct mscx_preq *r, uint64_t pos,
                                const char **why)
{
    mscx_status_t st = MSCX_OK;
    int local = (r->flags & MSCX_PREQ_F_LOCAL) != 0;
    for (uint32_t k = 0; k < q->d.nchan && st == MSCX_OK; k++) {
        if (!q->used[k])
            continue;
        st = q->chan[k].ops->flush(q->chan[k].link, local, deadline(q));
        if (!local)
            q->used[k] = 0;
    }
    if (st != MSCX_OK) {
        *why = "the link's flush failed";
        return st;
    }
    q->active = 0;
    __atomic_store_n(&q->d.fifo->done, pos + 1, __ATOMIC_RELEASE);
    return MSCX_OK;
}

/* Execute one request; @return MSCX_OK or the error (not yet reported: the caller reports it). */
static mscx_status_t exec_req(struct mscx_pqueue *q, const struct mscx_preq *r, uint64_t pos,
                              const char **why)
{
    const struct mscx_pchan *c = NULL;
    if (r->kind == MSCX_PREQ_PUT || r->kind == MSCX_PREQ_PUT_PKT || r->kind == MSCX_PREQ_SIGNAL) {
        if (r->chan >= q->d.nchan || !q->chan[r->chan].ops) {
            *why = "internal bug: the request names a port channel the proxy does not serve";
            return MSCX_ERR_INTERNAL;
        }
        c = &q->chan[r->chan];
    }
    switch (r->kind) {
    case MSCX_PREQ_PUT:
    case MSCX_PREQ_PUT_PKT:
        return exec_put(q, c, r, why);
    case MSCX_PREQ_SIGNAL: {
        mscx_status_t st = c->ops->signal(c->link, deadline(q));
        *why = "the link's signal failed";
        mark_used(q, r->chan);
        return st;
    }
    case MSCX_PREQ_FLUSH:
        return exec_flush(q, r, pos, why);
    default:
        *why = "internal bug: unknown request kind";
        return MSCX_ERR_INTERNAL;
    }
}

/* Serve up to PROXY_BATCH requests of @p q; @return how many. */
static int queue_serve(struct mscx_pqueue *q)
{
    struct mscx_pfifo *f = q->d.fifo;
    int n = 0;
    if (atomic_load(&q->err) != MSCX_OK)
        return 0;
    while (n < PROXY_BATCH) {
        struct mscx_preq *s = &f->slot[q->tail % MSCX_PFIFO_CAP];
        if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != q->tail + 1)
            break;
        struct mscx_preq r;
        memcpy(&r, s, sizeof(r));
        uint64_t pos = q->tail++;
        /* the slot was copied out: the producer may reuse it */
        __atomic_store_n(&f->tail, q->tail, __ATOMIC_RELEASE);
        atomic_store(&q->taken, q->tail);
        last_store(q, &r);
        const char *why = "";
        mscx_status_t st = exec_req(q, &r, pos, &why);
        n++;
        if (st != MSCX_OK) {
            queue_fail(q, st, &r, pos, why);
            return n;
        }
    }
    if (n == 0 && q->active) {
        uint64_t now = mscx_tp_now_ns();
        if (now - q->last_check >= PROXY_CHECK_NS) {
            q->last_check = now;
            for (uint32_t k = 0; k < q->d.nchan; k++) {
                const struct mscx_pchan *c = &q->chan[k];
                if (!c->ops || !c->ops->check || !q->used[k])
                    continue;
                mscx_status_t st = c->ops->check(c->link);
                if (st != MSCX_OK) {
                    char why[160];
                    snprintf(why, sizeof(why),
                             "port channel %u to rank %u failed while a launch was in flight", k, c->peer);
                    queue_fail(q, st, NULL, 0, why);
                    break;
                }
            }
        }
    }
    return n;
}

static void *proxy_main(void *arg)
{
    uint64_t gen = (uint64_t)(uintptr_t)arg;
    unsigned idle = 0;
    pthread_mutex_lock(&g_proxy.mu);
    while (g_proxy.gen == gen) {
        int work = 0;
        for (struct mscx_pqueue *q = g_proxy.head; q; q = q->next)
            work += queue_serve(q);
        pthread_mutex_unlock(&g_proxy.mu);
        if (work) {
            idle = 0;
        } else if (++idle < 256) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&g_proxy.mu);
    }
    pthread_mutex_unlock(&g_proxy.mu);
    return NULL;
}

mscx_status_t mscx_proxy_attach(const struct mscx_pqueue_desc *d, struct mscx_pqueue **q_p)
{
    if (!d || !d->fifo || !q_p || (d->nchan && !d->chan)) {
        MSCX_WARN("caller bug: bad arguments to mscx_proxy_attach");
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_pqueue *q = calloc(1, sizeof(*q));
    if (!q)
        return MSCX_ERR_NO_MEMORY;
    q->d = *d;
    q->chan = calloc(d->nchan ? d->nchan : 1, sizeof(*q->chan));
    q->used = calloc(d->nchan ? d->nchan : 1, 1);
    if (!q->chan || !q->used) {
        free(q->chan);
        free(q->used);
        free(q);
        return MSCX_ERR_NO_MEMORY;
    }
    if (d->nchan)
        memcpy(q->chan, d->chan, d->nchan * sizeof(*q->chan));
    q->d.chan = q->chan;
    snprintf(q->name, sizeof(q->name), "%s", d->name ? d->name : "?");
    q->d.name = q->name;
    q->tail = __atomic_load_n(&d->fifo->tail, __ATOMIC_ACQUIRE);
    atomic_store(&q->taken, q->tail);
    pthread_mutex_lock(&g_proxy.mu);
    q->next = g_proxy.head;
    g_proxy.head = q;
    if (!g_proxy.running) {
        int rc = pthread_create(&g_proxy.thr, NULL, proxy_main, (void *)(uintptr_t)g_proxy.gen);
        if (rc != 0) {
            g_proxy.head = q->next;
            pthread_mutex_unlock(&g_proxy.mu);
            MSCX_WARN("proxy: cannot start the proxy thread: %s", strerror(rc));
            free(q->chan);
            free(q->used);
            free(q);
            return MSCX_ERR_SYSTEM;
        }
        g_proxy.running = 1;
        MSCX_INFO(MSCX_SUB_PROXY, "proxy thread started");
    }
    pthread_mutex_unlock(&g_proxy.mu);
    MSCX_INFO(MSCX_SUB_PROXY, "rank %u plan %s: %u port channels attached to the proxy", d->rank, q->name,
              d->nchan);
    *q_p = q;
    return MSCX_OK;
}

void mscx_proxy_detach(struct mscx_pqueue *q)
{
    if (!q)
        return;
    pthread_t join = 0;
    int do_join = 0;
    pthread_mutex_lock(&g_proxy.mu);
    for (struct mscx_pqueue **pp = &g_proxy.head; *pp; pp = &(*pp)->next) {
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    }
    if (!g_proxy.head && g_proxy.running) {
        g_proxy.gen++; /* the running thread ends; a later attach starts a new one */
        g_proxy.running = 0;
        join = g_proxy.thr;
        do_join = 1;
    }
    pthread_mutex_unlock(&g_proxy.mu);
    if (do_join)
        pthread_join(join, NULL);
    free(q->chan);
    free(q->used);
    free(q);
}

mscx_status_t mscx_pqueue_status(const struct mscx_pqueue *q)
{
    return q ? (mscx_status_t)atomic_load(&((struct mscx_pqueue *)q)->err) : MSCX_ERR_INVALID_ARG;
}

void mscx_pqueue_describe(const struct mscx_pqueue *q, char *buf, size_t len)
{
    if (!q) {
        snprintf(buf, len, "no proxy queue");
        return;
    }
    struct mscx_pqueue *m = (struct mscx_pqueue *)q;
    struct mscx_preq last;
    memset(&last, 0, sizeof(last));
    last.kind = __atomic_load_n(&m->last.kind, __ATOMIC_RELAXED);
    last.chan = __atomic_load_n(&m->last.chan, __ATOMIC_RELAXED);
    last.block = __atomic_load_n(&m->last.block, __ATOMIC_RELAXED);
    last.op = __atomic_load_n(&m->last.op, __ATOMIC_RELAXED);
    last.launch = __atomic_load_n(&m->last.launch, __ATOMIC_RELAXED);
    last.len = __atomic_load_n(&m->last.len, __ATOMIC_RELAXED);
    uint64_t taken = atomic_load(&m->taken);
    uint64_t done = __atomic_load_n(&q->d.fifo->done, __ATOMIC_ACQUIRE);
    const struct mscx_preq *next = &q->d.fifo->slot[taken % MSCX_PFIFO_CAP];
    uint64_t next_seq = __atomic_load_n(&next->seq, __ATOMIC_ACQUIRE);
    snprintf(buf, len,
             "proxy queue of rank %u plan %s: %" PRIu64 " requests taken, flushed up to %" PRIu64
             ", status %s; last request %s on channel %u (block %u op %u, launch flag %u, %" PRIu64
             " bytes); next slot %s",
             q->d.rank, q->name, taken, done, mscx_status_str((mscx_status_t)atomic_load(&m->err)),
             taken ? kind_name(last.kind) : "none", last.chan, last.block, last.op, last.launch, last.len,
             next_seq == taken + 1 ? "written, not yet taken" : "not yet written by the kernel");
}

uint64_t mscx_pfifo_push_host(struct mscx_pfifo *f, uint64_t *head, const struct mscx_preq *req,
                              uint64_t deadline_ns)
{
    uint64_t pos = __atomic_fetch_add(head, 1, __ATOMIC_RELAXED);
    while (pos - __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE) >= MSCX_PFIFO_CAP) {
        if (mscx_tp_now_ns() >= deadline_ns)
            return UINT64_MAX;
        sched_yield();
    }
    struct mscx_preq *s = &f->slot[pos % MSCX_PFIFO_CAP];
    struct mscx_preq r = *req;
    r.seq = 0;
    memcpy(s, &r, offsetof(struct mscx_preq, seq));
    __atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
    return pos;
}
