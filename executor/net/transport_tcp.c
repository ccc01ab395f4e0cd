/* SPDX-License-Identifier: MIT */
/*
 * TCP transport for port channels (see transport.h). This file: the
 * endpoint, memory registration and the ops table; the handshake is in
 * transport_tcp_connect.c, the data path in transport_tcp_data.c.
 *
 * Each connection is two sockets. The "out" socket is the one this side
 * connected: the caller streams (header + payload) messages on it and reads
 * flush acks back. The "in" socket is the one the peer connected and our
 * listener accepted: the receiver thread reads messages from it, applies them
 * to registered memory and writes flush acks on it. Each direction of each
 * socket thus has exactly one writer, so no lock is held across a blocking
 * send and two proxies putting to each other cannot deadlock.
 *
 * Ordering: one stream per direction, applied in arrival order by one thread,
 * so a signal lands after every earlier put, and a flush ack is written only
 * after everything before the flush request has been applied.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mscx/log.h"
#include "transport_tcp_int.h"

/* ---------------------------------------------------------------- helpers */

int mscx_tcp_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int mscx_tcp_ms_left(uint64_t deadline_ns, int cap_ms)
{
    uint64_t now = mscx_tp_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

/* Mark a connection failed (first error wins, logged once); ep->lock held. */
void mscx_tcp_conn_fail_locked(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err)
{
    struct mscx_tp_ep *ep = c->ep;
    if (c->err == MSCX_OK && c->bye) {
        MSCX_INFO(MSCX_SUB_NET, "tcp: peer %u closed the connection", c->peer);
        __atomic_store_n(&c->err, st, __ATOMIC_RELEASE);
    } else if (c->err == MSCX_OK) {
        MSCX_WARN("tcp: connection rank %u -> peer %u failed: %s%s%s", ep->p.rank, c->peer, why,
                  err ? ": " : "", err ? strerror(err) : "");
        __atomic_store_n(&c->err, st, __ATOMIC_RELEASE);
    }
    pthread_cond_broadcast(&ep->cond);
}

void mscx_tcp_conn_fail(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err)
{
    pthread_mutex_lock(&c->ep->lock);
    mscx_tcp_conn_fail_locked(c, st, why, err);
    pthread_mutex_unlock(&c->ep->lock);
}

/* Send all of buf on a non-blocking socket before the deadline (caller thread). */
mscx_status_t mscx_tcp_send_all(struct mscx_tp_conn *c, int fd, const void *buf, size_t len, int more,
                                uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        mscx_status_t st = mscx_tcp_conn_err(c);
        if (st != MSCX_OK)
            return st;
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (n > 0) {
            if ((size_t)n < len)
                c->short_sends++;
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ms = mscx_tcp_ms_left(deadline_ns, 100);
            if (ms == 0) {
                /* The stream may now end mid-message: the connection is unusable. */
                mscx_tcp_conn_fail(c, MSCX_ERR_TIMEOUT, "send timed out", 0);
                return MSCX_ERR_TIMEOUT;
            }
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, ms);
            continue;
        }
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "send failed", n < 0 ? errno : EPIPE);
        return MSCX_ERR_REMOTE;
    }
    return MSCX_OK;
}

void mscx_tcp_wake(struct mscx_tp_ep *ep)
{
    char b = 1;
    ssize_t r = write(ep->wake[1], &b, 1);
    (void)r;
}

/* ---------------------------------------------------------------- endpoint */

static mscx_status_t copy_default(void *ctx, void *dst, const void *src, size_t len, unsigned put_flags,
                                  unsigned mr_flags)
{
    (void)ctx;
    (void)mr_flags;
    if (put_flags & MSCX_TP_PUT_PACKET) {
        /* Whole aligned 8-byte stores: an LL line (or LL16 half) is never torn. */
        volatile uint64_t *d = dst;
        const uint64_t *s = src;
        for (size_t i = 0; i < len / 8; i++)
            d[i] = s[i];
    } else {
        memcpy(dst, src, len);
    }
    return MSCX_OK;
}

static mscx_status_t add_default(void *ctx, uint64_t *dst, unsigned mr_flags)
{
    (void)ctx;
    (void)mr_flags;
    __atomic_fetch_add(dst, 1, __ATOMIC_RELEASE);
    return MSCX_OK;
}

/* A new endpoint, its locks and hooks set up, no socket yet; NULL (logged) without memory. */
static struct mscx_tp_ep *ep_alloc(const struct mscx_tp_params *params)
{
    pthread_condattr_t ca;
    struct mscx_tp_ep *ep = calloc(1, sizeof(*ep));
    if (!ep || !(ep->conns = calloc(params->nranks, sizeof(*ep->conns)))) {
        MSCX_WARN("tcp: out of memory");
        free(ep);
        return NULL;
    }
    ep->p = *params;
    ep->p.gpu_pci = NULL;
    ep->p.bind_addr = NULL;
    ep->copy = params->copy_to_target ? params->copy_to_target : copy_default;
    ep->add = params->add_to_target ? params->add_to_target : add_default;
    ep->ack_timeout_ms = 10000;
    ep->nmr = 1; /* key 0 is never valid */
    pthread_mutex_init(&ep->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ep->cond, &ca);
    pthread_condattr_destroy(&ca);
    return ep;
}

/* Open the endpoint's listening socket on @p bind_addr; sets listen_fd, addr and port. */
static mscx_status_t ep_listen(struct mscx_tp_ep *ep, const char *bind_addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        MSCX_WARN("caller bug: tcp bind address %s is not an IPv4 address", bind_addr);
        return MSCX_ERR_INVALID_ARG;
    }
    ep->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ep->listen_fd < 0 || bind(ep->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(ep->listen_fd, 128) < 0 || getsockname(ep->listen_fd, (struct sockaddr *)&sa, &sl) < 0 ||
        mscx_tcp_set_nonblock(ep->listen_fd) < 0) {
        MSCX_WARN("tcp: cannot listen on %s: %s", bind_addr, strerror(errno));
        if (ep->listen_fd >= 0)
            close(ep->listen_fd);
        return MSCX_ERR_SYSTEM;
    }
    ep->addr = sa.sin_addr.s_addr;
    ep->port = sa.sin_port;
    return MSCX_OK;
}

static mscx_status_t tcp_ep_create(const struct mscx_tp_params *params, struct mscx_tp_ep **ep_p)
{
    mscx_status_t st = MSCX_ERR_SYSTEM;
    struct mscx_tp_ep *ep;

    if (!params || !ep_p || params->rank >= params->nranks) {
        MSCX_WARN("caller bug: bad tcp endpoint parameters");
        return MSCX_ERR_INVALID_ARG;
    }
    ep = ep_alloc(params);
    if (!ep)
        return MSCX_ERR_NO_MEMORY;
    if (pipe(ep->wake) < 0) {
        MSCX_WARN("tcp: pipe failed: %s", strerror(errno));
        goto err_free;
    }
    mscx_tcp_set_nonblock(ep->wake[0]);
    mscx_tcp_set_nonblock(ep->wake[1]);
    char pick[MSCX_TP_ADDR_LEN], ifname[MSCX_TP_IFNAME_LEN];
    const char *bind_addr = params->bind_addr;
    if (!bind_addr) {
        MSCX_CHECK_GOTO(mscx_tp_socket_addr(pick, ifname), st, err_pipe);
        bind_addr = pick;
    }
    MSCX_CHECK_GOTO(ep_listen(ep, bind_addr), st, err_pipe);
    if (pthread_create(&ep->thr, NULL, mscx_tcp_rx_thread, ep) != 0) {
        MSCX_WARN("tcp: cannot start the receiver thread");
        st = MSCX_ERR_SYSTEM;
        goto err_sock;
    }
    MSCX_INFO(MSCX_SUB_NET, "tcp: rank %u listening on %s:%u", params->rank, bind_addr, ntohs(ep->port));
    *ep_p = ep;
    return MSCX_OK;

err_sock:
    close(ep->listen_fd);
err_pipe:
    close(ep->wake[0]);
    close(ep->wake[1]);
err_free:
    pthread_cond_destroy(&ep->cond);
    pthread_mutex_destroy(&ep->lock);
    free(ep->conns);
    free(ep);
    return st;
}

static void tcp_conn_close(struct mscx_tp_conn *c)
{
    if (!c)
        return;
    struct mscx_tp_ep *ep = c->ep;
    if (c->out_fd >= 0 && mscx_tcp_conn_err(c) == MSCX_OK) {
        /* Orderly close: tell the peer, so its receiver does not report a failure. */
        struct tcp_msg m = {.type = MSG_BYE};
        send(c->out_fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    pthread_mutex_lock(&ep->lock);
    if (ep->conns[c->peer] == c)
        ep->conns[c->peer] = NULL;
    /* Wait until the receiver finished the poll round that may still use c. */
    uint64_t g = ep->gen;
    mscx_tcp_wake(ep);
    while (!ep->stop && ep->gen <= g)
        pthread_cond_wait(&ep->cond, &ep->lock);
    pthread_mutex_unlock(&ep->lock);
    if (c->in_fd >= 0)
        close(c->in_fd);
    if (c->out_fd >= 0)
        close(c->out_fd);
    free(c->stage);
    free(c);
}

static void tcp_ep_destroy(struct mscx_tp_ep *ep)
{
    if (!ep)
        return;
    for (uint32_t r = 0; r < ep->p.nranks; r++)
        tcp_conn_close(ep->conns[r]);
    pthread_mutex_lock(&ep->lock);
    ep->stop = 1;
    pthread_mutex_unlock(&ep->lock);
    mscx_tcp_wake(ep);
    pthread_join(ep->thr, NULL);
    mscx_tcp_pending_close(ep);
    close(ep->listen_fd);
    close(ep->wake[0]);
    close(ep->wake[1]);
    for (uint32_t i = 0; ep->mrs && i < ep->nmr; i++)
        free(ep->mrs[i]);
    free(ep->mrs);
    free(ep->conns);
    pthread_cond_destroy(&ep->cond);
    pthread_mutex_destroy(&ep->lock);
    free(ep);
}

/* ---------------------------------------------------------------- memory */

static mscx_status_t mr_add(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr, struct mscx_tp_mr **mr_p,
                            struct mscx_tp_rdesc *desc_p);

static mscx_status_t tcp_mr_register(struct mscx_tp_ep *ep, void *base, size_t len, unsigned flags,
                                     int dmabuf_fd, struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p)
{
    (void)dmabuf_fd;
    if (!ep || !base || !len || !mr_p || !desc_p) {
        MSCX_WARN("caller bug: bad tcp memory registration");
        return MSCX_ERR_INVALID_ARG;
    }
    if ((flags & MSCX_TP_MR_GPU) && !ep->p.copy_to_target) {
        MSCX_WARN("caller bug: tcp region on the GPU needs a copy_to_target hook");
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_tp_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        MSCX_WARN("tcp: out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    mr->base = base;
    mr->len = len;
    mr->flags = flags & ~(unsigned)MSCX_TP_MR_LATE;
    return mr_add(ep, mr, mr_p, desc_p);
}

/* Give @p mr an id (its key) and describe it; frees it on failure. */
static mscx_status_t mr_add(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr, struct mscx_tp_mr **mr_p,
                            struct mscx_tp_rdesc *desc_p)
{
    pthread_mutex_lock(&ep->lock);
    if (ep->nmr >= ep->cap) {
        uint32_t cap = ep->cap ? ep->cap * 2 : 16;
        struct mscx_tp_mr **m = realloc(ep->mrs, cap * sizeof(*m));
        if (!m) {
            pthread_mutex_unlock(&ep->lock);
            free(mr);
            MSCX_WARN("tcp: out of memory");
            return MSCX_ERR_NO_MEMORY;
        }
        if (ep->cap == 0)
            m[0] = NULL;
        ep->mrs = m;
        ep->cap = cap;
    }
    mr->id = ep->nmr++;
    ep->mrs[mr->id] = mr;
    pthread_mutex_unlock(&ep->lock);

    memset(desc_p, 0, sizeof(*desc_p));
    desc_p->addr = (uintptr_t)mr->base;
    desc_p->len = mr->len;
    desc_p->key = mr->id;
    desc_p->owner = ep->p.rank;
    desc_p->flags = mr->flags;
    desc_p->tp = 'T';
    *mr_p = mr;
    return MSCX_OK;
}

static mscx_status_t tcp_mr_register_late(struct mscx_tp_ep *ep, mscx_tp_resolve_fn resolve, void *ctx,
                                          struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p)
{
    if (!ep || !resolve || !mr_p || !desc_p) {
        MSCX_WARN("caller bug: bad tcp late-bound registration");
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_tp_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        MSCX_WARN("tcp: out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    mr->flags = MSCX_TP_MR_LATE | MSCX_TP_MR_REMOTE_WRITE;
    mr->resolve = resolve;
    mr->rctx = ctx;
    return mr_add(ep, mr, mr_p, desc_p);
}

static void tcp_mr_deregister(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr)
{
    if (!ep || !mr)
        return;
    pthread_mutex_lock(&ep->lock);
    ep->mrs[mr->id] = NULL;
    /* The receiver may be copying into it: wait for its current round. */
    uint64_t g = ep->gen;
    mscx_tcp_wake(ep);
    while (!ep->stop && ep->gen <= g)
        pthread_cond_wait(&ep->cond, &ep->lock);
    pthread_mutex_unlock(&ep->lock);
    free(mr);
}

/* ---------------------------------------------------------------- ops */

const struct mscx_transport_ops mscx_tp_tcp = {
    .name = "tcp",
    .ep_create = tcp_ep_create,
    .ep_destroy = tcp_ep_destroy,
    .mr_register = tcp_mr_register,
    .mr_deregister = tcp_mr_deregister,
    .conn_prepare = mscx_tcp_conn_prepare,
    .conn_establish = mscx_tcp_conn_establish,
    .conn_close = tcp_conn_close,
    .put = mscx_tcp_put,
    .signal = mscx_tcp_signal,
    .flush = mscx_tcp_flush,
    .progress = mscx_tcp_progress,
    .mr_register_late = tcp_mr_register_late,
    .put_late = mscx_tcp_put_late,
};
