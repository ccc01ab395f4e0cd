/* SPDX-License-Identifier: MIT */
/*
 * The TCP transport's data path (see transport_tcp.c for the connection
 * model). The caller thread sends put, signal and flush messages on a
 * connection's out socket and waits for flush acks; the endpoint's receiver
 * thread reads the in sockets, applies each message to registered memory in
 * arrival order, answers flushes, reads the acks of the out sockets and
 * accepts new connections.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mscx/log.h"
#include "transport_tcp_int.h"

/* ---------------------------------------------------------------- sending (caller thread) */

static mscx_status_t check_remote(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                                  uint64_t len)
{
    return mscx_tp_check_remote(rd, 'T', c->peer, roff, len);
}

mscx_status_t mscx_tcp_put(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                           const struct mscx_tp_rdesc *rd, uint64_t roff, uint64_t len, unsigned flags,
                           uint64_t deadline_ns)
{
    MSCX_CHECK(mscx_tcp_conn_err(c));
    MSCX_CHECK(check_remote(c, rd, roff, len));
    if (!lmr || loff > lmr->len || len > lmr->len - loff) {
        MSCX_WARN("caller bug: tcp put outside the local region");
        return MSCX_ERR_INVALID_ARG;
    }
    if ((flags & MSCX_TP_PUT_PACKET) && ((rd->addr + roff) % 8 || len % 8)) {
        MSCX_WARN("caller bug: packet put to peer %u not in whole aligned 8-byte units", c->peer);
        return MSCX_ERR_INVALID_ARG;
    }
    if (lmr->flags & MSCX_TP_MR_GPU) {
        MSCX_WARN("caller bug: tcp put source must be host memory (stage GPU data first)");
        return MSCX_ERR_INVALID_ARG;
    }
    struct tcp_msg m = {.type = MSG_PUT, .flags = flags, .key = rd->key, .off = roff, .len = len};
    MSCX_CHECK(mscx_tcp_send_all(c, c->out_fd, &m, sizeof(m), len > 0, deadline_ns));
    return mscx_tcp_send_all(c, c->out_fd, (const char *)lmr->base + loff, (size_t)len, 0, deadline_ns);
}

mscx_status_t mscx_tcp_put_late(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                                const struct mscx_tp_rdesc *rd, uint32_t buf, uint32_t launch, uint64_t roff,
                                uint64_t len, unsigned flags, uint64_t deadline_ns)
{
    MSCX_CHECK(mscx_tcp_conn_err(c));
    if (!rd || rd->tp != 'T' || rd->owner != c->peer || !(rd->flags & MSCX_TP_MR_LATE)) {
        MSCX_WARN("caller bug: tcp late put to peer %u names no late-bound region of that peer", c->peer);
        return MSCX_ERR_INVALID_ARG;
    }
    if (!lmr || loff > lmr->len || len > lmr->len - loff ||
        (lmr->flags & (MSCX_TP_MR_GPU | MSCX_TP_MR_LATE))) {
        MSCX_WARN("caller bug: tcp late put source outside the local host region");
        return MSCX_ERR_INVALID_ARG;
    }
    if (buf > 0xffffu || (flags & ~(unsigned)MSCX_TP_PUT_PACKET)) {
        MSCX_WARN("caller bug: tcp late put to peer %u: buffer id %u or flags %#x out of range", c->peer, buf,
                  flags);
        return MSCX_ERR_INVALID_ARG;
    }
    if ((flags & MSCX_TP_PUT_PACKET) && (roff % 8 || len % 8)) {
        MSCX_WARN("caller bug: packet put to peer %u not in whole aligned 8-byte units", c->peer);
        return MSCX_ERR_INVALID_ARG;
    }
    struct tcp_msg m = {.type = MSG_PUT_LATE,
                        .flags = flags | (buf << MSG_LATE_BUF_SHIFT),
                        .key = rd->key,
                        .launch = launch,
                        .off = roff,
                        .len = len};
    MSCX_CHECK(mscx_tcp_send_all(c, c->out_fd, &m, sizeof(m), len > 0, deadline_ns));
    return mscx_tcp_send_all(c, c->out_fd, (const char *)lmr->base + loff, (size_t)len, 0, deadline_ns);
}

mscx_status_t mscx_tcp_signal(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                              uint64_t deadline_ns)
{
    MSCX_CHECK(mscx_tcp_conn_err(c));
    MSCX_CHECK(check_remote(c, rd, roff, 8));
    if ((rd->addr + roff) % 8) {
        MSCX_WARN("caller bug: tcp signal word at offset %llu is not 8-byte aligned",
                  (unsigned long long)roff);
        return MSCX_ERR_INVALID_ARG;
    }
    struct tcp_msg m = {.type = MSG_SIGNAL, .key = rd->key, .off = roff, .len = 8};
    return mscx_tcp_send_all(c, c->out_fd, &m, sizeof(m), 0, deadline_ns);
}

mscx_status_t mscx_tcp_flush(struct mscx_tp_conn *c, uint64_t deadline_ns)
{
    struct mscx_tp_ep *ep = c->ep;
    MSCX_CHECK(mscx_tcp_conn_err(c));
    uint64_t seq = __atomic_add_fetch(&c->flush_seq, 1, __ATOMIC_ACQ_REL);
    struct tcp_msg m = {.type = MSG_FLUSH, .off = seq};
    MSCX_CHECK(mscx_tcp_send_all(c, c->out_fd, &m, sizeof(m), 0, deadline_ns));

    mscx_status_t st = MSCX_OK;
    pthread_mutex_lock(&ep->lock);
    while (c->acked_seq < seq && c->err == MSCX_OK) {
        if (mscx_tp_now_ns() >= deadline_ns) {
            st = MSCX_ERR_TIMEOUT;
            break;
        }
        uint64_t dl = mscx_tp_now_ns() + 100000000ull;
        if (dl > deadline_ns)
            dl = deadline_ns;
        struct timespec ts = {.tv_sec = (time_t)(dl / 1000000000ull), .tv_nsec = (long)(dl % 1000000000ull)};
        pthread_cond_timedwait(&ep->cond, &ep->lock, &ts);
    }
    if (c->acked_seq < seq && c->err != MSCX_OK)
        st = c->err;
    pthread_mutex_unlock(&ep->lock);
    if (st == MSCX_ERR_TIMEOUT)
        MSCX_WARN("tcp: flush to peer %u timed out", c->peer);
    return st;
}

mscx_status_t mscx_tcp_progress(struct mscx_tp_ep *ep)
{
    mscx_status_t st = MSCX_OK;
    pthread_mutex_lock(&ep->lock);
    for (uint32_t r = 0; r < ep->p.nranks && st == MSCX_OK; r++)
        if (ep->conns[r])
            st = ep->conns[r]->err;
    pthread_mutex_unlock(&ep->lock);
    return st;
}

uint64_t mscx_tp_tcp_short_sends(const struct mscx_tp_conn *c)
{
    return c->short_sends;
}

/* ---------------------------------------------------------------- receiving (receiver thread) */

static struct mscx_tp_mr *mr_lookup(struct mscx_tp_ep *ep, uint32_t key)
{
    struct mscx_tp_mr *mr = NULL;
    pthread_mutex_lock(&ep->lock);
    if (key < ep->nmr)
        mr = ep->mrs[key];
    pthread_mutex_unlock(&ep->lock);
    return mr;
}

/*
 * A late put waits (c->rx_stalled) until its region's resolver knows the
 * target: its payload stays in the socket meanwhile (TCP flow control holds
 * the sender back), later messages of this connection wait behind it (they
 * are ordered after it), other connections keep flowing. Bounded by the
 * endpoint's late_timeout_ms.
 */
static void rx_resolve(struct mscx_tp_conn *c)
{
    struct mscx_tp_ep *ep = c->ep;
    const struct tcp_msg *m = &c->rx_hdr;
    struct mscx_tp_mr *mr = mr_lookup(ep, m->key);
    if (!mr || !(mr->flags & MSCX_TP_MR_LATE)) {
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "late put: its target region was deregistered", 0);
        return;
    }
    void *dst = NULL;
    unsigned mf = 0;
    uint32_t buf = m->flags >> MSG_LATE_BUF_SHIFT;
    mscx_status_t st = mr->resolve(mr->rctx, buf, m->launch, m->off, m->len, &dst, &mf);
    if (st == MSCX_INPROGRESS) {
        uint64_t waited = mscx_tp_now_ns() - c->rx_stall_ns;
        if (ep->p.late_timeout_ms && waited >= ep->p.late_timeout_ms * 1000000ull) {
            char why[200];
            snprintf(why, sizeof(why),
                     "a put into buffer %u of launch %u (%llu bytes at offset %llu) waited %llu ms for that "
                     "launch to start here (MSCX_TIMEOUT_MS %llu)",
                     buf, m->launch, (unsigned long long)m->len, (unsigned long long)m->off,
                     (unsigned long long)(waited / 1000000ull), (unsigned long long)ep->p.late_timeout_ms);
            mscx_tcp_conn_fail(c, MSCX_ERR_TIMEOUT, why, 0);
        }
        return;
    }
    if (st != MSCX_OK) {
        mscx_tcp_conn_fail(c, st, "late put: the target could not be resolved", 0);
        return;
    }
    c->rx_stalled = 0;
    c->rx_dst = dst;
    c->rx_mr_flags = mf;
    c->rx_in_payload = m->len > 0;
}

/* Check a received header; returns the target region or NULL after failing the connection. */
static struct mscx_tp_mr *rx_target(struct mscx_tp_conn *c, const struct tcp_msg *m, uint64_t len)
{
    struct mscx_tp_mr *mr = mr_lookup(c->ep, m->key);
    if (!mr || !(mr->flags & MSCX_TP_MR_REMOTE_WRITE)) {
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "peer bug: target region not registered for remote writes", 0);
        return NULL;
    }
    if ((m->type == MSG_PUT_LATE) != ((mr->flags & MSCX_TP_MR_LATE) != 0)) {
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE,
                           "peer bug: a late put to a plain region or a plain access to a late one", 0);
        return NULL;
    }
    if (m->type == MSG_PUT_LATE)
        return mr; /* the resolver checks the range in the buffer it finds */
    if (m->off > mr->len || len > mr->len - m->off) {
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "peer bug: access outside the target region", 0);
        return NULL;
    }
    return mr;
}

static void rx_header(struct mscx_tp_conn *c)
{
    struct tcp_msg *m = &c->rx_hdr;
    struct mscx_tp_ep *ep = c->ep;
    mscx_status_t st;

    c->rx_hdr_got = 0;
    switch (m->type) {
    case MSG_PUT: {
        struct mscx_tp_mr *mr = rx_target(c, m, m->len);
        if (!mr)
            return;
        c->rx_dst = (char *)mr->base + m->off;
        c->rx_mr_flags = mr->flags;
        c->rx_done = 0;
        c->rx_have = 0;
        c->rx_in_payload = m->len > 0;
        return;
    }
    case MSG_PUT_LATE:
        if (!rx_target(c, m, m->len))
            return;
        c->rx_done = 0;
        c->rx_have = 0;
        c->rx_stalled = 1;
        c->rx_stall_ns = mscx_tp_now_ns();
        rx_resolve(c);
        return;
    case MSG_SIGNAL: {
        struct mscx_tp_mr *mr = rx_target(c, m, 8);
        if (!mr)
            return;
        st = ep->add(ep->p.hook_ctx, (uint64_t *)((char *)mr->base + m->off), mr->flags);
        if (st != MSCX_OK)
            mscx_tcp_conn_fail(c, st, "applying a signal failed", 0);
        return;
    }
    case MSG_FLUSH: {
        struct tcp_msg ack = {.type = MSG_FLUSH_ACK, .off = m->off};
        /* Everything before the flush has been applied: acknowledge. */
        if (mscx_tcp_send_all(c, c->in_fd, &ack, sizeof(ack), 0, mscx_tp_deadline(ep->ack_timeout_ms)) !=
            MSCX_OK)
            mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "sending a flush ack failed", 0);
        return;
    }
    case MSG_BYE:
        c->bye = 1;
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "peer closed", 0);
        return;
    default:
        mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "peer bug: unknown message type", 0);
    }
}

/* Drain the in socket; returns when it would block or the connection failed. */
static void rx_data(struct mscx_tp_conn *c)
{
    struct mscx_tp_ep *ep = c->ep;
    for (;;) {
        if (mscx_tcp_conn_err(c) != MSCX_OK)
            return;
        if (c->rx_stalled) {
            rx_resolve(c);
            if (c->rx_stalled)
                return;
            if (!c->rx_in_payload)
                continue; /* an empty late put */
        }
        char *buf;
        size_t want;
        if (!c->rx_in_payload) {
            buf = (char *)&c->rx_hdr + c->rx_hdr_got;
            want = sizeof(c->rx_hdr) - c->rx_hdr_got;
        } else {
            uint64_t left = c->rx_hdr.len - c->rx_done - c->rx_have;
            buf = (char *)c->stage + c->rx_have;
            want = TCP_STAGE_BYTES - c->rx_have;
            if (want > left)
                want = (size_t)left;
        }
        ssize_t n = recv(c->in_fd, buf, want, MSG_DONTWAIT);
        if (n == 0) {
            mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE,
                               c->rx_in_payload || c->rx_hdr_got ? "peer closed mid-message" : "peer closed",
                               0);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "receive failed", errno);
            return;
        }
        if (!c->rx_in_payload) {
            c->rx_hdr_got += (size_t)n;
            if (c->rx_hdr_got == sizeof(c->rx_hdr))
                rx_header(c);
            continue;
        }
        c->rx_have += (size_t)n;
        int pkt = (c->rx_hdr.flags & MSCX_TP_PUT_PACKET) != 0;
        size_t ready = pkt ? c->rx_have & ~(size_t)7 : c->rx_have;
        if (ready) {
            mscx_status_t st = ep->copy(ep->p.hook_ctx, c->rx_dst + c->rx_done, c->stage, ready,
                                        c->rx_hdr.flags & MSCX_TP_PUT_PACKET, c->rx_mr_flags);
            if (st != MSCX_OK) {
                mscx_tcp_conn_fail(c, st, "copy to the target failed", 0);
                return;
            }
            memmove(c->stage, (char *)c->stage + ready, c->rx_have - ready);
            c->rx_done += ready;
            c->rx_have -= ready;
        }
        if (c->rx_done == c->rx_hdr.len)
            c->rx_in_payload = 0;
    }
}

/* Read flush acks from the out socket. */
static void rx_acks(struct mscx_tp_conn *c)
{
    for (;;) {
        ssize_t n = recv(c->out_fd, (char *)&c->ack + c->ack_got, sizeof(c->ack) - c->ack_got, MSG_DONTWAIT);
        if (n == 0) {
            /*
             * The peer closed its in socket. An orderly close sends the bye on
             * the other stream first, but the two sockets are not ordered
             * with each other: the bye may still be on its way. Unless a
             * flush is still owed an ack (then the peer left without
             * answering it), the data stream decides: bye (orderly), end
             * without bye (peer died) or neither within the grace time.
             */
            pthread_mutex_lock(&c->ep->lock);
            if (c->ack_got || c->acked_seq < __atomic_load_n(&c->flush_seq, __ATOMIC_ACQUIRE)) {
                mscx_tcp_conn_fail_locked(c, MSCX_ERR_REMOTE, "peer closed with a flush unanswered", 0);
            } else {
                c->ack_closed = 1;
                c->ack_closed_ns = mscx_tp_now_ns();
            }
            pthread_mutex_unlock(&c->ep->lock);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "receive failed", errno);
            return;
        }
        c->ack_got += (size_t)n;
        if (c->ack_got < sizeof(c->ack))
            continue;
        c->ack_got = 0;
        if (c->ack.type != MSG_FLUSH_ACK) {
            mscx_tcp_conn_fail(c, MSCX_ERR_REMOTE, "peer bug: unexpected message on the ack stream", 0);
            return;
        }
        pthread_mutex_lock(&c->ep->lock);
        if (c->ack.off > c->acked_seq)
            c->acked_seq = c->ack.off;
        pthread_cond_broadcast(&c->ep->cond);
        pthread_mutex_unlock(&c->ep->lock);
    }
}

/*
 * Fill @p pfd and @p who with the wake pipe, the listener and the sockets of
 * every healthy connection, first failing a connection whose peer closed the
 * ack stream and then brought nothing within the grace time. ep->lock held.
 * @return the number of entries; @p stalled_p: a late put waits for its target.
 */
static nfds_t rx_poll_set(struct mscx_tp_ep *ep, struct pollfd *pfd, struct mscx_tp_conn **who,
                          int *stalled_p)
{
    nfds_t k = 0;
    pfd[k++] = (struct pollfd){.fd = ep->wake[0], .events = POLLIN};
    pfd[k++] = (struct pollfd){.fd = ep->listen_fd, .events = POLLIN};
    uint64_t now = mscx_tp_now_ns();
    int stalled = 0;
    for (uint32_t r = 0; r < ep->p.nranks; r++) {
        struct mscx_tp_conn *c = ep->conns[r];
        if (c && c->err == MSCX_OK && c->ack_closed &&
            now - c->ack_closed_ns > TCP_CLOSE_GRACE_MS * 1000000ull)
            mscx_tcp_conn_fail_locked(
                c, MSCX_ERR_REMOTE,
                "peer closed the ack stream but neither said bye nor closed the data stream", 0);
        if (!c || c->err != MSCX_OK)
            continue;
        if (c->in_fd >= 0) {
            /* a stalled put's payload stays in the socket: poll for errors only (rx_retry_stalled) */
            stalled |= c->rx_stalled;
            who[k] = c;
            pfd[k++] = (struct pollfd){.fd = c->in_fd, .events = c->rx_stalled ? 0 : POLLIN};
        }
        if (c->out_fd >= 0 && !c->ack_closed) {
            who[k] = c;
            pfd[k++] = (struct pollfd){.fd = c->out_fd, .events = POLLIN};
        }
    }
    /* then the handshakes in progress, with no connection yet */
    nfds_t np = mscx_tcp_pending_fill(ep, pfd + k);
    for (nfds_t i = 0; i < np; i++)
        who[k++] = NULL;
    *stalled_p = stalled;
    return k;
}

/* Ask again where each waiting late put goes (entries 2.. of the poll set); a closed socket fails it. */
static void rx_retry_stalled(struct pollfd *pfd, struct mscx_tp_conn **who, nfds_t k)
{
    for (nfds_t i = 2; i < k; i++) {
        if (!who[i] || pfd[i].fd != who[i]->in_fd || !who[i]->rx_stalled)
            continue;
        if (pfd[i].revents & (POLLERR | POLLHUP))
            mscx_tcp_conn_fail(who[i], MSCX_ERR_REMOTE, "peer closed while a late put waited for its target",
                               0);
        else
            rx_data(who[i]);
        pfd[i].revents = 0;
    }
}

/* Serve what poll reported: drain the wake pipe, accept a connection, read data and acks. */
static void rx_serve(struct mscx_tp_ep *ep, const struct pollfd *pfd, struct mscx_tp_conn **who, nfds_t k)
{
    if (pfd[0].revents) {
        char b[64];
        while (read(ep->wake[0], b, sizeof(b)) > 0)
            ;
    }
    if (pfd[1].revents & POLLIN)
        mscx_tcp_accept(ep);
    mscx_tcp_pending_serve(ep); /* each round: it also closes those past their deadline */
    for (nfds_t i = 2; i < k; i++) {
        if (!pfd[i].revents || !who[i])
            continue;
        if (pfd[i].fd == who[i]->in_fd)
            rx_data(who[i]);
        else
            rx_acks(who[i]);
    }
}

void *mscx_tcp_rx_thread(void *arg)
{
    struct mscx_tp_ep *ep = arg;
    uint32_t n = ep->p.nranks;
    struct pollfd *pfd = calloc(2 + 2 * (size_t)n + TCP_MAX_PENDING, sizeof(*pfd));
    struct mscx_tp_conn **who = calloc(2 + 2 * (size_t)n + TCP_MAX_PENDING, sizeof(*who));

    if (!pfd || !who) {
        MSCX_WARN("tcp: receiver thread out of memory");
        goto out;
    }
    for (;;) {
        int stalled;
        pthread_mutex_lock(&ep->lock);
        if (ep->stop) {
            pthread_mutex_unlock(&ep->lock);
            break;
        }
        nfds_t k = rx_poll_set(ep, pfd, who, &stalled);
        pthread_mutex_unlock(&ep->lock);

        int rc = poll(pfd, k, stalled ? 1 : 100);
        if (stalled)
            rx_retry_stalled(pfd, who, k);
        if (rc >= 0)
            rx_serve(ep, pfd, who, k);
        pthread_mutex_lock(&ep->lock);
        ep->gen++;
        pthread_cond_broadcast(&ep->cond);
        pthread_mutex_unlock(&ep->lock);
    }
out:
    free(who);
    free(pfd);
    return NULL;
}
