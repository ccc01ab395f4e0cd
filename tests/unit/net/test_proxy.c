/* SPDX-License-Identifier: MIT */
/*
 * The port-channel proxy on host memory: FIFO request encoding and the seq
 * protocol, a producer lapping the FIFO many times, flush completion, bad
 * requests, and the TCP link between two processes (signal after put, packet
 * puts, flush; a peer SIGKILLed mid-launch fails the queue with an error
 * instead of a hang).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mscx/env.h"
#include "mscx/dev_types.h"
#include "mscx/log.h"
#include "net_pair.h"
#include "proxy.h"
#include "test_common.h"
#include "transport.h"

#define DL_MS 10000
#define REAP_S 60 /* seconds the parent waits for its peer to end */

/* ---- a recording link ---- */

struct rec_call {
    char what; /* 'p' put, 's' signal, 'f' flush */
    uint32_t link;
    uint64_t src, dst_off, len;
    unsigned flags;
    int local;
};

struct rec {
    pthread_mutex_t mu;
    struct rec_call call[4096];
    uint32_t n;
    _Atomic int hold_flush; /* flush blocks while set */
    _Atomic int fail_put;   /* put returns this status when non-zero */
};

struct rec_link {
    struct rec *r;
    uint32_t id;
};

static void rec_add(struct rec_link *l, struct rec_call c)
{
    c.link = l->id;
    pthread_mutex_lock(&l->r->mu);
    if (l->r->n < 4096)
        l->r->call[l->r->n++] = c;
    pthread_mutex_unlock(&l->r->mu);
}

static mscx_status_t rl_put(void *link, const void *src, uint64_t dst_off, uint64_t len, unsigned flags,
                            uint64_t dl)
{
    struct rec_link *l = link;
    (void)dl;
    int f = atomic_load(&l->r->fail_put);
    if (f) {
        MSCX_WARN("test link: put fails on purpose");
        return (mscx_status_t)f;
    }
    rec_add(l, (struct rec_call){'p', 0, (uint64_t)(uintptr_t)src, dst_off, len, flags, 0});
    return MSCX_OK;
}

static mscx_status_t rl_signal(void *link, uint64_t dl)
{
    (void)dl;
    rec_add(link, (struct rec_call){'s', 0, 0, 0, 0, 0, 0});
    return MSCX_OK;
}

static mscx_status_t rl_flush(void *link, int local, uint64_t dl)
{
    struct rec_link *l = link;
    while (atomic_load(&l->r->hold_flush))
        if (mscx_tp_now_ns() > dl)
            return MSCX_ERR_TIMEOUT;
    rec_add(l, (struct rec_call){'f', 0, 0, 0, 0, 0, local});
    return MSCX_OK;
}

static const struct mscx_plink_ops rec_ops = {"rec", rl_put, rl_signal, rl_flush, NULL, NULL};

/* put_user records 'u': dst_off = offset, flags = buffer, local = launch, src = the mapped address */
static mscx_status_t rl_put_user(void *link, const void *src, const struct mscx_puser *dst, uint64_t len,
                                 uint64_t dl)
{
    (void)dl;
    (void)src;
    rec_add(link, (struct rec_call){'u', 0, dst->addr, dst->off, len, dst->buf, (int)dst->launch});
    return MSCX_OK;
}

static const struct mscx_plink_ops rec_user_ops = {"rec", rl_put, rl_signal, rl_flush, NULL, rl_put_user};

struct failbox {
    _Atomic int st;
    _Atomic int calls;
};

static void on_fail(void *ctx, mscx_status_t st)
{
    struct failbox *b = ctx;
    atomic_store(&b->st, (int)st);
    atomic_fetch_add(&b->calls, 1);
}

static struct mscx_pfifo *fifo_new(void)
{
    struct mscx_pfifo *f = aligned_alloc(64, sizeof(*f));
    ck_assert_ptr_nonnull(f);
    memset(f, 0, sizeof(*f));
    return f;
}

static int wait_u64(const uint64_t *w, uint64_t v, int ms)
{
    uint64_t dl = mscx_tp_deadline((uint64_t)ms);
    while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < v) {
        if (mscx_tp_now_ns() > dl)
            return -1;
        sched_yield();
    }
    return 0;
}

static int wait_int(_Atomic int *w, int ms)
{
    uint64_t dl = mscx_tp_deadline((uint64_t)ms);
    while (atomic_load(w) == 0) {
        if (mscx_tp_now_ns() > dl)
            return -1;
        sched_yield();
    }
    return 0;
}

static uint64_t push(struct mscx_pfifo *f, uint64_t *head, uint32_t kind, uint32_t chan, uint64_t src,
                     uint64_t off, uint64_t len, uint32_t flags)
{
    struct mscx_preq r;
    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.chan = chan;
    r.src = src;
    r.dst_off = off;
    r.len = len;
    r.flags = flags;
    r.block = 3;
    r.op = 7;
    r.launch = 2;
    uint64_t pos = mscx_pfifo_push_host(f, head, &r, mscx_tp_deadline(DL_MS));
    ck_assert_uint_ne(pos, UINT64_MAX);
    return pos;
}

struct rec_setup {
    struct rec rec;
    struct rec_link links[3];
    struct mscx_pchan chan[3];
    struct failbox fb;
    struct mscx_pfifo *fifo;
    struct mscx_pqueue *q;
    uint64_t head;
};

/* Three channels: 0 and 2 served by recording links, 1 not through the proxy. */
static void rec_setup(struct rec_setup *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->rec.mu, NULL);
    s->fifo = fifo_new();
    for (uint32_t k = 0; k < 3; k++) {
        s->links[k] = (struct rec_link){&s->rec, k};
        if (k != 1)
            s->chan[k] = (struct mscx_pchan){&rec_ops, &s->links[k], 10 + k, 1u << 20};
    }
    struct mscx_pqueue_desc d = {s->fifo, 3, s->chan, 5, "unit-plan", DL_MS, on_fail, &s->fb};
    ck_assert_int_eq(mscx_proxy_attach(&d, &s->q), MSCX_OK);
}

static void rec_teardown(struct rec_setup *s)
{
    mscx_proxy_detach(s->q);
    free(s->fifo);
    pthread_mutex_destroy(&s->rec.mu);
}

START_TEST(proxy_encoding_and_order)
{
    struct rec_setup s;
    rec_setup(&s);
    push(s.fifo, &s.head, MSCX_PREQ_PUT, 0, 0x1000, 64, 128, 0);
    push(s.fifo, &s.head, MSCX_PREQ_PUT_PKT, 2, 0x2000, 8, 16, 0);
    push(s.fifo, &s.head, MSCX_PREQ_SIGNAL, 0, 0, 0, 0, 0);
    uint64_t f = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
    ck_assert_int_eq(wait_u64(&s.fifo->done, f + 1, DL_MS), 0);
    ck_assert_uint_eq(__atomic_load_n(&s.fifo->tail, __ATOMIC_ACQUIRE), 4);
    ck_assert_uint_eq(s.rec.n, 5);
    ck_assert(s.rec.call[0].what == 'p' && s.rec.call[0].link == 0 && s.rec.call[0].src == 0x1000 &&
              s.rec.call[0].dst_off == 64 && s.rec.call[0].len == 128 && s.rec.call[0].flags == 0);
    ck_assert(s.rec.call[1].what == 'p' && s.rec.call[1].link == 2 && s.rec.call[1].src == 0x2000 &&
              s.rec.call[1].dst_off == 8 && s.rec.call[1].len == 16 &&
              s.rec.call[1].flags == MSCX_TP_PUT_PACKET);
    ck_assert(s.rec.call[2].what == 's' && s.rec.call[2].link == 0);
    /* the flush reaches every channel used since the last one, not the local-only kind */
    ck_assert(s.rec.call[3].what == 'f' && s.rec.call[3].link == 0 && !s.rec.call[3].local);
    ck_assert(s.rec.call[4].what == 'f' && s.rec.call[4].link == 2 && !s.rec.call[4].local);

    /* a slot whose seq is not position + 1 is not taken, whatever its fields say */
    struct mscx_preq *slot = &s.fifo->slot[4];
    memset(slot, 0, sizeof(*slot));
    slot->kind = MSCX_PREQ_SIGNAL;
    slot->chan = 0;
    __atomic_store_n(&slot->seq, 4, __ATOMIC_RELEASE); /* an older lap's value */
    struct timespec nap = {0, 50000000};
    nanosleep(&nap, NULL);
    ck_assert_uint_eq(__atomic_load_n(&s.fifo->tail, __ATOMIC_ACQUIRE), 4);
    __atomic_store_n(&slot->seq, 5, __ATOMIC_RELEASE);
    s.head = 5;
    f = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, MSCX_PREQ_F_LOCAL);
    ck_assert_int_eq(wait_u64(&s.fifo->done, f + 1, DL_MS), 0);
    ck_assert_uint_eq(s.rec.n, 7);
    ck_assert(s.rec.call[5].what == 's' && s.rec.call[6].what == 'f' && s.rec.call[6].local);
    ck_assert_int_eq(atomic_load(&s.fb.calls), 0);
    ck_assert_int_eq(mscx_pqueue_status(s.q), MSCX_OK);
    rec_teardown(&s);
}
END_TEST

struct producer {
    struct rec_setup *s;
    uint64_t n;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (uint64_t i = 0; i < p->n; i++) {
        struct mscx_preq r;
        memset(&r, 0, sizeof(r));
        r.kind = MSCX_PREQ_PUT;
        r.chan = (uint32_t)(i % 2) * 2;
        r.src = i;
        r.len = 8;
        if (mscx_pfifo_push_host(p->s->fifo, &p->s->head, &r, mscx_tp_deadline(DL_MS)) == UINT64_MAX)
            return (void *)1;
    }
    return NULL;
}

START_TEST(proxy_laps_in_order)
{
    struct rec_setup s;
    rec_setup(&s);
    struct producer p = {&s, 3 * MSCX_PFIFO_CAP + 17};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, produce, &p), 0);
    void *ret;
    pthread_join(t, &ret);
    ck_assert_ptr_null(ret);
    uint64_t f = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
    ck_assert_int_eq(wait_u64(&s.fifo->done, f + 1, DL_MS), 0);
    ck_assert_uint_eq(s.rec.n, p.n + 2);
    for (uint64_t i = 0; i < p.n; i++)
        ck_assert_uint_eq(s.rec.call[i].src, i);
    rec_teardown(&s);
}
END_TEST

START_TEST(proxy_flush_waits_for_link)
{
    struct rec_setup s;
    rec_setup(&s);
    atomic_store(&s.rec.hold_flush, 1);
    push(s.fifo, &s.head, MSCX_PREQ_PUT, 0, 0x40, 0, 64, 0);
    uint64_t f = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
    struct timespec nap = {0, 100000000};
    nanosleep(&nap, NULL);
    ck_assert_uint_eq(__atomic_load_n(&s.fifo->done, __ATOMIC_ACQUIRE),
                      0); /* not complete while the link is not */
    atomic_store(&s.rec.hold_flush, 0);
    ck_assert_int_eq(wait_u64(&s.fifo->done, f + 1, DL_MS), 0);
    rec_teardown(&s);
}
END_TEST

START_TEST(proxy_bad_requests_fail_the_queue)
{
    static const struct {
        uint32_t kind, chan;
        uint64_t off, len;
        const char *warn;
    } bad[] = {
        {MSCX_PREQ_PUT, 1, 0, 8, "does not serve"},              /* channel not through the proxy */
        {MSCX_PREQ_SIGNAL, 9, 0, 0, "does not serve"},           /* no such channel */
        {MSCX_PREQ_PUT, 0, (1u << 20) - 8, 16, "past the peer"}, /* beyond the peer's scratch */
        {MSCX_PREQ_PUT_PKT, 2, 4, 8, "aligned 8-byte"},
        {77, 0, 0, 0, "unknown request kind"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct rec_setup s;
        rec_setup(&s);
        mscx_test_allow_warn(bad[i].warn);
        uint64_t f0 = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
        ck_assert_int_eq(wait_u64(&s.fifo->done, f0 + 1, DL_MS), 0);
        push(s.fifo, &s.head, bad[i].kind, bad[i].chan, 0x100, bad[i].off, bad[i].len, 0);
        push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
        ck_assert_int_eq(wait_int(&s.fb.calls, DL_MS), 0);
        ck_assert_int_eq(atomic_load(&s.fb.st), MSCX_ERR_INTERNAL);
        ck_assert_int_eq(mscx_pqueue_status(s.q), MSCX_ERR_INTERNAL);
        ck_assert_msg(strstr(mscx_test_last_warn(), "rank 5 plan unit-plan") != NULL, "warn: %s",
                      mscx_test_last_warn());
        ck_assert_msg(strstr(mscx_test_last_warn(), "thread block 3 op 7") != NULL, "warn: %s",
                      mscx_test_last_warn());
        struct timespec nap = {0, 20000000};
        nanosleep(&nap, NULL);
        /* the failed queue is no longer served: the flush behind the bad request never completes */
        ck_assert_uint_eq(__atomic_load_n(&s.fifo->done, __ATOMIC_ACQUIRE), f0 + 1);
        char buf[512];
        mscx_pqueue_describe(s.q, buf, sizeof(buf));
        ck_assert_msg(strstr(buf, "2 requests taken") != NULL, "%s", buf);
        rec_teardown(&s);
    }
    /* a failing link is reported with the link's status */
    struct rec_setup s;
    rec_setup(&s);
    mscx_test_allow_warn("fails on purpose");
    mscx_test_allow_warn("the link's put failed");
    atomic_store(&s.rec.fail_put, MSCX_ERR_REMOTE);
    push(s.fifo, &s.head, MSCX_PREQ_PUT, 0, 0x100, 0, 64, 0);
    ck_assert_int_eq(wait_int(&s.fb.calls, DL_MS), 0);
    ck_assert_int_eq(atomic_load(&s.fb.st), MSCX_ERR_REMOTE);
    rec_teardown(&s);
}
END_TEST

/* ---- the TCP link between two processes ---- */

#define DATA_BYTES (4u << 20)
#define PKT_OFF (DATA_BYTES - (64u << 10))

/* The transport under the network-link tests: TCP, or RDMA against the libibverbs double (set per test). */
static const struct mscx_transport_ops *g_tp = &mscx_tp_tcp;
static const struct mscx_plink_ops *g_plink = &mscx_plink_tcp;
#ifdef FAKE_IBV_PATH
static void *(*fake_alloc)(size_t); /* memory shared with the forked peer, in the double's world */
#endif

static void *t_alloc(size_t n)
{
#ifdef FAKE_IBV_PATH
    if (g_tp == &mscx_tp_ib)
        return fake_alloc(n); /* zeroed */
#endif
    return calloc(1, n);
}

static void t_free(void *p)
{
    if (g_tp == &mscx_tp_tcp)
        free(p); /* the double's heap lives as long as the process */
}

struct tside {
    struct net_pair np;
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn *conn;
    uint8_t *data;   /* scratch stand-in */
    uint64_t *tok;   /* inbound tokens [4] */
    uint8_t *bounce; /* staging */
    struct mscx_tp_mr *mr_data, *mr_tok, *mr_bounce;
    struct mscx_tp_rdesc peer_data, peer_tok;
};

static mscx_status_t stage_memcpy(void *ctx, void *dst, const void *src, size_t len)
{
    (void)ctx;
    memcpy(dst, src, len);
    return MSCX_OK;
}

static mscx_status_t tside_setup(struct tside *s, uint32_t rank, int fd)
{
    struct mscx_tp_params p = {.rank = rank, .nranks = 2, .comm_id = 0xabcdefull};
    struct mscx_tp_rdesc mine[2], all[4], unused;
    struct mscx_tp_conn *conns[2] = {NULL, NULL};
    uint8_t want[2] = {1, 1};
    memset(s, 0, sizeof(*s));
    s->np.fd = fd;
    s->np.rank = rank;
    s->data = t_alloc(DATA_BYTES);
    s->tok = t_alloc(4 * sizeof(uint64_t));
    s->bounce = t_alloc(64u << 10);
    if (!s->data || !s->tok || !s->bounce)
        return MSCX_ERR_NO_MEMORY;
    MSCX_CHECK(g_tp->ep_create(&p, &s->ep));
    MSCX_CHECK(
        g_tp->mr_register(s->ep, s->data, DATA_BYTES, MSCX_TP_MR_REMOTE_WRITE, -1, &s->mr_data, &mine[0]));
    MSCX_CHECK(g_tp->mr_register(s->ep, s->tok, 32, MSCX_TP_MR_REMOTE_WRITE, -1, &s->mr_tok, &mine[1]));
    MSCX_CHECK(g_tp->mr_register(s->ep, s->bounce, 64u << 10, 0, -1, &s->mr_bounce, &unused));
    MSCX_CHECK(net_pair_allgather(&s->np, mine, all, sizeof(mine)));
    s->peer_data = all[2 * (1 - rank)];
    s->peer_tok = all[2 * (1 - rank) + 1];
    MSCX_CHECK(mscx_tp_connect_all(g_tp, s->ep, rank, 2, want, net_pair_allgather, &s->np,
                                   mscx_tp_deadline(DL_MS), conns));
    s->conn = conns[1 - rank];
    return MSCX_OK;
}

static uint8_t pat(uint64_t i)
{
    return (uint8_t)((i * 2654435761u) >> 11);
}

/* Receiver: after token 0 moves, the 4 MiB put must be there; after token 1, the packet lines. */
static int child_receiver(int fd)
{
    struct tside s;
    if (tside_setup(&s, 1, fd) != MSCX_OK)
        return 10;
    if (wait_u64(&s.tok[0], 1, DL_MS))
        return 11;
    for (uint64_t i = 0; i < PKT_OFF; i++)
        if (s.data[i] != pat(i))
            return 12; /* the signal overtook its data */
    if (wait_u64(&s.tok[1], 1, DL_MS))
        return 13;
    const uint32_t *lines = (const uint32_t *)(s.data + PKT_OFF);
    for (uint32_t i = 0; i < (64u << 10) / 8; i++)
        if (lines[2 * i] != i * 5u || lines[2 * i + 1] != 9u)
            return 14;
    uint8_t ok = 1;
    net_pair_write(fd, &ok, 1);
    net_pair_read(fd, &ok, 1); /* the parent is done with us */
    g_tp->ep_destroy(s.ep);
    return 0;
}

struct tcp_queue {
    struct tside s;
    void *links[2];
    struct mscx_pchan chan[2];
    struct failbox fb;
    struct mscx_pfifo *fifo;
    struct mscx_pqueue *q;
    uint64_t head;
};

/* Sender: two port channels to rank 1 (tokens 0 and 1 at the peer), both through TCP links. */
static void tcp_queue_setup(struct tcp_queue *t, int fd)
{
    memset(t, 0, sizeof(*t));
    ck_assert_int_eq(tside_setup(&t->s, 0, fd), MSCX_OK);
    for (uint32_t k = 0; k < 2; k++) {
        struct mscx_ptcp_link_params lp = {.tp = g_tp,
                                           .async_src = g_tp != &mscx_tp_tcp,
                                           .ep = t->s.ep,
                                           .conn = t->s.conn,
                                           .dst = t->s.peer_data,
                                           .tok = t->s.peer_tok,
                                           .tok_off = 8u * k,
                                           .bounce_mr = t->s.mr_bounce,
                                           .bounce = t->s.bounce,
                                           .bounce_bytes = 64u << 10,
                                           .stage = stage_memcpy,
                                           .peer = 1};
        ck_assert_int_eq(mscx_plink_tcp_create(&lp, &t->links[k]), MSCX_OK);
        t->chan[k] = (struct mscx_pchan){g_plink, t->links[k], 1, DATA_BYTES};
    }
    t->fifo = fifo_new();
    struct mscx_pqueue_desc d = {t->fifo, 2,       t->chan, 0, g_tp == &mscx_tp_tcp ? "tcp-plan" : "ib-plan",
                                 DL_MS,   on_fail, &t->fb};
    ck_assert_int_eq(mscx_proxy_attach(&d, &t->q), MSCX_OK);
}

static void tcp_queue_teardown(struct tcp_queue *t)
{
    mscx_proxy_detach(t->q);
    for (uint32_t k = 0; k < 2; k++)
        mscx_plink_tcp_destroy(t->links[k]);
    g_tp->ep_destroy(t->s.ep);
    free(t->fifo);
    t_free(t->s.data);
    t_free(t->s.tok);
    t_free(t->s.bounce);
}

START_TEST(proxy_tcp_signal_after_put)
{
    int fd = -1;
    pid_t pid = net_pair_fork(&fd);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_receiver(fd));
    struct tcp_queue t;
    tcp_queue_setup(&t, fd);
    uint8_t *src = malloc(DATA_BYTES);
    ck_assert_ptr_nonnull(src);
    for (uint64_t i = 0; i < PKT_OFF; i++)
        src[i] = pat(i);
    uint32_t *lines = (uint32_t *)(src + PKT_OFF);
    for (uint32_t i = 0; i < (64u << 10) / 8; i++) {
        lines[2 * i] = i * 5u;
        lines[2 * i + 1] = 9u;
    }
    /* a raw put bigger than the staging buffer, then its signal; packet lines, then theirs */
    push(t.fifo, &t.head, MSCX_PREQ_PUT, 0, (uint64_t)(uintptr_t)src, 0, PKT_OFF, 0);
    push(t.fifo, &t.head, MSCX_PREQ_SIGNAL, 0, 0, 0, 0, 0);
    push(t.fifo, &t.head, MSCX_PREQ_PUT_PKT, 1, (uint64_t)(uintptr_t)(src + PKT_OFF), PKT_OFF, 64u << 10, 0);
    push(t.fifo, &t.head, MSCX_PREQ_SIGNAL, 1, 0, 0, 0, 0);
    uint64_t f = push(t.fifo, &t.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
    ck_assert_int_eq(wait_u64(&t.fifo->done, f + 1, DL_MS), 0);
    uint8_t ok = 0;
    ck_assert_int_eq(net_pair_read(fd, &ok, 1), 0);
    ck_assert_int_eq(ok, 1);
    ck_assert_int_eq(atomic_load(&t.fb.calls), 0);
    net_pair_write(fd, &ok, 1);
    int code = net_pair_reap(pid, REAP_S);
    ck_assert_msg(code == 0, "receiver exit %d", code);
    tcp_queue_teardown(&t);
    free(src);
    close(fd);
}
END_TEST

/* Receiver that only connects, reports ready and waits to be killed. */
static int child_victim(int fd)
{
    struct tside s;
    if (tside_setup(&s, 1, fd) != MSCX_OK)
        return 10;
    uint8_t ok = 1;
    net_pair_write(fd, &ok, 1);
    for (;;)
        pause();
}

START_TEST(proxy_tcp_dead_peer)
{
    /* mid-launch (a put served, no flush yet), the peer dies: the queue fails by itself */
    for (int with_flush = 0; with_flush < 2; with_flush++) {
        int fd = -1;
        pid_t pid = net_pair_fork(&fd);
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
            _exit(child_victim(fd));
        mscx_test_allow_warn("peer closed");
        mscx_test_allow_warn("proxy: rank 0 plan ");
        mscx_test_allow_warn("tcp");
        mscx_test_allow_warn("ib: ");
        mscx_test_allow_warn("plan ib-plan");
        struct tcp_queue t;
        tcp_queue_setup(&t, fd);
        uint8_t ok = 0;
        ck_assert_int_eq(net_pair_read(fd, &ok, 1), 0);
        static uint8_t src[4096];
        push(t.fifo, &t.head, MSCX_PREQ_PUT, 0, (uint64_t)(uintptr_t)src, 0, sizeof(src), 0);
        ck_assert_int_eq(wait_u64(&t.fifo->tail, 1, DL_MS), 0);
        uint64_t t0 = mscx_tp_now_ns();
        kill(pid, SIGKILL);
        ck_assert_int_eq(net_pair_reap(pid, REAP_S), 128 + SIGKILL);
        if (with_flush)
            push(t.fifo, &t.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
        else if (g_tp != &mscx_tp_tcp) /* RDMA learns of a dead peer only from a request to it */
            push(t.fifo, &t.head, MSCX_PREQ_PUT, 0, (uint64_t)(uintptr_t)src, 0, sizeof(src), 0);
        ck_assert_msg(wait_int(&t.fb.calls, DL_MS) == 0, "the proxy did not notice the dead peer");
        double ms = (mscx_tp_now_ns() - t0) / 1e6;
        mscx_status_t st = (mscx_status_t)atomic_load(&t.fb.st);
        ck_assert_msg(st == MSCX_ERR_REMOTE || st == MSCX_ERR_TIMEOUT ||
                          (g_tp != &mscx_tp_tcp && st == MSCX_ERR_IBV),
                      "status %s", mscx_status_str(st));
        fprintf(stderr, "%s dead peer (%s): queue failed with %s after %.1f ms\n", g_tp->name,
                with_flush ? "flush" : "idle", mscx_status_str(st), ms);
        ck_assert_uint_lt(__atomic_load_n(&t.fifo->done, __ATOMIC_ACQUIRE), 1);
        tcp_queue_teardown(&t);
        close(fd);
    }
}
END_TEST

#ifdef FAKE_IBV_PATH
static void use_ib(void)
{
    ck_assert_int_eq(mscx_config_override("MSCX_IBV_SO", FAKE_IBV_PATH), MSCX_OK);
    g_tp = &mscx_tp_ib;
    g_plink = &mscx_plink_ib;
}

/* The same checks over the RDMA transport (the libibverbs double): a 4 MiB put through a 64 KiB bounce ring
 * (it wraps 64 times), its signal, packet lines, flush. */
START_TEST(proxy_ib_signal_after_put)
{
    use_ib();
    proxy_tcp_signal_after_put_fn(_i);
}
END_TEST

START_TEST(proxy_ib_dead_peer)
{
    use_ib();
    proxy_tcp_dead_peer_fn(_i);
}
END_TEST
#endif

/*
 * Puts into a peer's input or output buffer (MSCX_PREQ_F_USER_*): the proxy
 * hands buffer, launch flag, offset and mapped address to the link's
 * put_user, in FIFO order with the other requests, without the scratch
 * bound; a link without put_user, a packet put or both buffers at once fail
 * the queue with a WARN naming the request.
 */
START_TEST(proxy_user_puts)
{
    struct rec_setup s;
    rec_setup(&s);
    s.chan[0].ops = &rec_user_ops;
    mscx_proxy_detach(s.q);
    struct mscx_pqueue_desc d = {s.fifo, 3, s.chan, 5, "unit-plan", DL_MS, on_fail, &s.fb};
    ck_assert_int_eq(mscx_proxy_attach(&d, &s.q), MSCX_OK);
    struct mscx_preq r;
    memset(&r, 0, sizeof(r));
    r.kind = MSCX_PREQ_PUT;
    r.chan = 0;
    r.src = 0x1000;
    r.dst_off = 5u << 20; /* past the peer's scratch (1 MiB): not checked for user buffers */
    r.len = 96;
    r.flags = MSCX_PREQ_F_USER_OUT;
    r.launch = 41;
    r.reserved = 0;
    mscx_pfifo_push_host(s.fifo, &s.head, &r, mscx_tp_deadline(DL_MS));
    r.flags = MSCX_PREQ_F_USER_IN;
    r.reserved = 0xabc000;
    r.dst_off = 8;
    mscx_pfifo_push_host(s.fifo, &s.head, &r, mscx_tp_deadline(DL_MS));
    push(s.fifo, &s.head, MSCX_PREQ_SIGNAL, 0, 0, 0, 0, 0);
    uint64_t f = push(s.fifo, &s.head, MSCX_PREQ_FLUSH, 0, 0, 0, 0, 0);
    ck_assert_int_eq(wait_u64(&s.fifo->done, f + 1, DL_MS), 0);
    ck_assert_uint_eq(s.rec.n, 4);
    ck_assert_int_eq(s.rec.call[0].what, 'u');
    ck_assert_uint_eq(s.rec.call[0].flags, MSCX_BUF_OUTPUT);
    ck_assert_int_eq(s.rec.call[0].local, 41);
    ck_assert_uint_eq(s.rec.call[0].dst_off, 5u << 20);
    ck_assert_uint_eq(s.rec.call[0].len, 96);
    ck_assert_uint_eq(s.rec.call[0].src, 0);
    ck_assert_int_eq(s.rec.call[1].what, 'u');
    ck_assert_uint_eq(s.rec.call[1].flags, MSCX_BUF_INPUT);
    ck_assert_uint_eq(s.rec.call[1].src, 0xabc000);
    ck_assert_int_eq(s.rec.call[2].what, 's');
    ck_assert_int_eq(s.rec.call[3].what, 'f');
    ck_assert_int_eq(atomic_load(&s.fb.calls), 0);
    rec_teardown(&s);

    static const struct {
        uint32_t chan, kind, flags;
        const char *warn;
    } bad[] = {
        {2, MSCX_PREQ_PUT, MSCX_PREQ_F_USER_OUT, "this link cannot put into a peer's input or output buffer"},
        {2, MSCX_PREQ_PUT_PKT, MSCX_PREQ_F_USER_OUT, "is a packet put"},
        {2, MSCX_PREQ_PUT, MSCX_PREQ_F_USER_OUT | MSCX_PREQ_F_USER_IN, "names both buffers"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rec_setup(&s);
        mscx_test_allow_warn(bad[i].warn);
        push(s.fifo, &s.head, bad[i].kind, bad[i].chan, 0x100, 0, 64, bad[i].flags);
        ck_assert_int_eq(wait_int(&s.fb.calls, DL_MS), 0);
        ck_assert_int_eq(atomic_load(&s.fb.st), MSCX_ERR_INTERNAL);
        ck_assert_msg(strstr(mscx_test_last_warn(), "buffer offset 0)") != NULL ||
                          strstr(mscx_test_last_warn(), "scratch offset 0)") != NULL,
                      "warn: %s", mscx_test_last_warn());
        ck_assert_msg(strstr(mscx_test_last_warn(), bad[i].warn) != NULL, "warn: %s", mscx_test_last_warn());
        rec_teardown(&s);
    }
}
END_TEST

/* The receiver's decision for a late put, from the publication of the launch's parity. */
START_TEST(proxy_late_pick)
{
    static char in[64], out[128];
    struct mscx_late_pub pub = {.flag = 7, .ptr = {in, out}, .bytes = {64, 128}};
    void *dst = NULL;
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 7, 100, 28, &dst), MSCX_OK);
    ck_assert_ptr_eq(dst, out + 100);
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_INPUT, 7, 0, 64, &dst), MSCX_OK);
    ck_assert_ptr_eq(dst, in);
    /* not published yet: an older launch of the parity, or none, or one before a wrap */
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 9, 0, 8, &dst), MSCX_INPROGRESS);
    pub.flag = 0;
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 9, 0, 8, &dst), MSCX_INPROGRESS);
    pub.flag = 0xffffffffu;
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 3, 0, 8, &dst), MSCX_INPROGRESS);
    ck_assert_ptr_eq(dst, in); /* untouched */
    /* replaced by a newer launch (across the wrap too) */
    mscx_test_allow_warn("had replaced that launch's buffers");
    pub.flag = 9;
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 7, 0, 8, &dst), MSCX_ERR_INTERNAL);
    ck_assert_msg(strstr(mscx_test_last_warn(), "output buffer of launch 7 arrived after launch 9"), "%s",
                  mscx_test_last_warn());
    pub.flag = 3;
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 0xffffffffu, 0, 8, &dst),
                     MSCX_ERR_INTERNAL);
    /* out of range, bad buffer, launch 0 */
    pub.flag = 7;
    mscx_test_allow_warn("peer bug");
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_OUTPUT, 7, 100, 29, &dst), MSCX_ERR_REMOTE);
    ck_assert_msg(strstr(mscx_test_last_warn(),
                         "rank 1 plan p: a put into this rank's output buffer of launch 7 "
                         "(29 bytes at offset 100) reaches past its 128 bytes"),
                  "%s", mscx_test_last_warn());
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_INPUT, 7, 65, 0, &dst), MSCX_ERR_REMOTE);
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", 2, 7, 0, 8, &dst), MSCX_ERR_REMOTE);
    ck_assert_int_eq(mscx_late_pick(&pub, 1, "p", MSCX_BUF_INPUT, 0, 0, 8, &dst), MSCX_ERR_REMOTE);
    ck_assert_ptr_eq(dst, in);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("proxy");
    /* The TCP links listen on loopback, chosen explicitly (the forked tests inherit the override). */
    if (mscx_config_override("MSCX_SOCKET_IFNAME", "lo") != MSCX_OK)
        exit(1);
    TCase *tc = mscx_tcase("fifo");
    tcase_add_test(tc, proxy_encoding_and_order);
    tcase_add_test(tc, proxy_laps_in_order);
    tcase_add_test(tc, proxy_flush_waits_for_link);
    tcase_add_test(tc, proxy_bad_requests_fail_the_queue);
    tcase_add_test(tc, proxy_user_puts);
    tcase_add_test(tc, proxy_late_pick);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("tcp");
    tcase_add_test(tc, proxy_tcp_signal_after_put);
    tcase_add_test(tc, proxy_tcp_dead_peer);
    suite_add_tcase(s, tc);
#ifdef FAKE_IBV_PATH
    /* The double's shared world must exist before any fork. */
    void *h = dlopen(FAKE_IBV_PATH, RTLD_NOW | RTLD_LOCAL);
    int (*init)(size_t) = h ? (int (*)(size_t))dlsym(h, "fake_ibv_world_init") : NULL;
    if (h)
        *(void **)&fake_alloc = dlsym(h, "fake_ibv_alloc");
    if (!init || !fake_alloc || init(1u << 30) != 0) {
        fprintf(stderr, "cannot load the libibverbs double %s\n", FAKE_IBV_PATH);
        exit(1);
    }
    tc = mscx_tcase("ib");
    tcase_add_test(tc, proxy_ib_signal_after_put);
    tcase_add_test(tc, proxy_ib_dead_peer);
    suite_add_tcase(s, tc);
#endif
    return s;
}
