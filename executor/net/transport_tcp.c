/* SPDX-License-Identifier: MIT */
/*
 * TCP transport for port channels (see transport.h).
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
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <stdio.h>
#include <unistd.h>

#include "mscx/log.h"
#include "transport.h"

#define TCP_STAGE_BYTES (1u << 20)
#define TCP_HELLO_TIMEOUT_MS 2000
/* After the peer closed our ack stream, how long its data stream may take to
 * bring the bye (orderly close) or its own end (the peer died). */
#define TCP_CLOSE_GRACE_MS 2000

enum tcp_msg_type { MSG_PUT = 1, MSG_SIGNAL = 2, MSG_FLUSH = 3, MSG_FLUSH_ACK = 4, MSG_BYE = 5, MSG_PUT_LATE = 6 };

/* PUT_LATE: the receiver's buffer id sits in flags above the put flags */
#define MSG_LATE_BUF_SHIFT 16

struct tcp_msg {
    uint32_t type;
    uint32_t flags;
    uint32_t key;
    uint32_t launch; /* PUT_LATE: the launch whose buffer is the target */
    uint64_t off;    /* FLUSH / FLUSH_ACK: sequence number */
    uint64_t len;
};
_Static_assert(sizeof(struct tcp_msg) == 32, "wire format");

struct tcp_hello {
    uint64_t magic;
    uint32_t version;
    uint32_t src; /* connecting rank */
    uint32_t dst; /* rank it wants */
    uint32_t reserved;
    uint64_t comm_id;
};
_Static_assert(sizeof(struct tcp_hello) == 32, "wire format");

struct tcp_hello_ack {
    uint64_t magic;
    uint32_t status; /* 0 accepted, else refused */
    uint32_t reserved;
};

/* Connection blob: where this rank listens. */
struct tcp_blob {
    uint64_t magic;
    uint64_t comm_id;
    uint32_t version;
    uint32_t rank;
    uint32_t addr; /* IPv4, network order */
    uint16_t port; /* network order */
    uint16_t reserved;
};
_Static_assert(sizeof(struct tcp_blob) <= MSCX_TP_BLOB_BYTES, "blob too big");

struct mscx_tp_mr {
    uint32_t id;
    unsigned flags;
    void *base;
    size_t len;
    mscx_tp_resolve_fn resolve; /* MSCX_TP_MR_LATE */
    void *rctx;
};

struct mscx_tp_conn {
    struct mscx_tp_ep *ep;
    uint32_t peer;
    int out_fd;         /* we connected: caller sends, receiver reads acks */
    int in_fd;          /* peer connected: receiver reads data, writes acks */
    mscx_status_t err;  /* first error; atomic / under ep->lock */
    int bye;            /* the peer closed in order: its EOF is not an error worth a WARN */
    uint64_t flush_seq; /* written by the caller thread, read by the receiver: atomic */
    uint64_t acked_seq; /* under ep->lock */
    uint64_t short_sends;
    /* receiver-thread state of the in stream */
    struct tcp_msg rx_hdr;
    size_t rx_hdr_got;
    int rx_in_payload;
    char *rx_dst;          /* where the payload of the current put goes */
    unsigned rx_mr_flags;  /* the target's MSCX_TP_MR_* (for copy_to_target) */
    int rx_stalled;        /* a late put waits for its target (the in socket is not read meanwhile) */
    uint64_t rx_stall_ns;  /* since when */
    uint64_t rx_done; /* payload bytes applied */
    size_t rx_have;   /* payload bytes staged, not yet applied (< 8 between reads for packets) */
    void *stage;
    /* receiver-thread state of the ack stream */
    struct tcp_msg ack;
    size_t ack_got;
    int ack_closed;         /* the peer closed the ack stream; the data stream decides why */
    uint64_t ack_closed_ns; /* when */
};

struct mscx_tp_ep {
    struct mscx_tp_params p;
    mscx_tp_copy_fn copy;
    mscx_tp_add_fn add;
    uint64_t ack_timeout_ms;
    int listen_fd;
    uint32_t addr;
    uint16_t port;
    int wake[2];
    pthread_t thr;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    uint64_t gen; /* receiver poll rounds finished */
    struct mscx_tp_conn **conns; /* [nranks] */
    struct mscx_tp_mr **mrs;     /* by id */
    uint32_t nmr, cap;
};

/* ---------------------------------------------------------------- helpers */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int ms_left(uint64_t deadline_ns, int cap_ms)
{
    uint64_t now = mscx_tp_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

static mscx_status_t conn_err(struct mscx_tp_conn *c)
{
    return __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
}

/* Mark a connection failed (first error wins, logged once); ep->lock held. */
static void conn_fail_locked(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err)
{
    struct mscx_tp_ep *ep = c->ep;
    if (c->err == MSCX_OK && c->bye) {
        MSCX_INFO(MSCX_SUB_NET, "tcp: peer %u closed the connection", c->peer);
        __atomic_store_n(&c->err, st, __ATOMIC_RELEASE);
    } else if (c->err == MSCX_OK) {
        MSCX_WARN("tcp: connection rank %u -> peer %u failed: %s%s%s", ep->p.rank, c->peer, why, err ? ": " : "",
                  err ? strerror(err) : "");
        __atomic_store_n(&c->err, st, __ATOMIC_RELEASE);
    }
    pthread_cond_broadcast(&ep->cond);
}

static void conn_fail(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err)
{
    pthread_mutex_lock(&c->ep->lock);
    conn_fail_locked(c, st, why, err);
    pthread_mutex_unlock(&c->ep->lock);
}

/* Send all of buf on a non-blocking socket before the deadline (caller thread). */
static mscx_status_t send_all(struct mscx_tp_conn *c, int fd, const void *buf, size_t len, int more,
                              uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        mscx_status_t st = conn_err(c);
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
            int ms = ms_left(deadline_ns, 100);
            if (ms == 0) {
                /* The stream may now end mid-message: the connection is unusable. */
                conn_fail(c, MSCX_ERR_TIMEOUT, "send timed out", 0);
                return MSCX_ERR_TIMEOUT;
            }
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, ms);
            continue;
        }
        conn_fail(c, MSCX_ERR_REMOTE, "send failed", n < 0 ? errno : EPIPE);
        return MSCX_ERR_REMOTE;
    }
    return MSCX_OK;
}

/* Blocking exact read with a deadline, for handshakes. 0 ok, else errno (0 read -> ECONNRESET). */
static int recv_exact(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int ms = ms_left(deadline_ns, 100);
        if (ms == 0)
            return ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        poll(&pfd, 1, ms);
    }
    return 0;
}

static void wake_thread(struct mscx_tp_ep *ep)
{
    char b = 1;
    ssize_t r = write(ep->wake[1], &b, 1);
    (void)r;
}

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

/* ---------------------------------------------------------------- receiver */

static struct mscx_tp_mr *mr_lookup(struct mscx_tp_ep *ep, uint32_t key)
{
    struct mscx_tp_mr *mr = NULL;
    pthread_mutex_lock(&ep->lock);
    if (key < ep->nmr)
        mr = ep->mrs[key];
    pthread_mutex_unlock(&ep->lock);
    return mr;
}

static void rx_header(struct mscx_tp_conn *c);

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
        conn_fail(c, MSCX_ERR_REMOTE, "late put: its target region was deregistered", 0);
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
            conn_fail(c, MSCX_ERR_TIMEOUT, why, 0);
        }
        return;
    }
    if (st != MSCX_OK) {
        conn_fail(c, st, "late put: the target could not be resolved", 0);
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
        conn_fail(c, MSCX_ERR_REMOTE, "peer bug: target region not registered for remote writes", 0);
        return NULL;
    }
    if ((m->type == MSG_PUT_LATE) != ((mr->flags & MSCX_TP_MR_LATE) != 0)) {
        conn_fail(c, MSCX_ERR_REMOTE, "peer bug: a late put to a plain region or a plain access to a late one", 0);
        return NULL;
    }
    if (m->type == MSG_PUT_LATE)
        return mr; /* the resolver checks the range in the buffer it finds */
    if (m->off > mr->len || len > mr->len - m->off) {
        conn_fail(c, MSCX_ERR_REMOTE, "peer bug: access outside the target region", 0);
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
            conn_fail(c, st, "applying a signal failed", 0);
        return;
    }
    case MSG_FLUSH: {
        struct tcp_msg ack = {.type = MSG_FLUSH_ACK, .off = m->off};
        /* Everything before the flush has been applied: acknowledge. */
        if (send_all(c, c->in_fd, &ack, sizeof(ack), 0, mscx_tp_deadline(ep->ack_timeout_ms)) != MSCX_OK)
            conn_fail(c, MSCX_ERR_REMOTE, "sending a flush ack failed", 0);
        return;
    }
    case MSG_BYE:
        c->bye = 1;
        conn_fail(c, MSCX_ERR_REMOTE, "peer closed", 0);
        return;
    default:
        conn_fail(c, MSCX_ERR_REMOTE, "peer bug: unknown message type", 0);
    }
}

/* Drain the in socket; returns when it would block or the connection failed. */
static void rx_data(struct mscx_tp_conn *c)
{
    struct mscx_tp_ep *ep = c->ep;
    for (;;) {
        if (conn_err(c) != MSCX_OK)
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
            conn_fail(c, MSCX_ERR_REMOTE, c->rx_in_payload || c->rx_hdr_got ? "peer closed mid-message" : "peer closed",
                      0);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_fail(c, MSCX_ERR_REMOTE, "receive failed", errno);
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
                conn_fail(c, st, "copy to the target failed", 0);
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
             * with each other: the bye may still be on its way (seen under
             * load). Unless a flush is still owed an ack (then the peer left
             * without answering it), the data stream decides: bye (orderly),
             * end without bye (peer died) or neither within the grace time.
             */
            pthread_mutex_lock(&c->ep->lock);
            if (c->ack_got || c->acked_seq < __atomic_load_n(&c->flush_seq, __ATOMIC_ACQUIRE)) {
                conn_fail_locked(c, MSCX_ERR_REMOTE, "peer closed with a flush unanswered", 0);
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
                conn_fail(c, MSCX_ERR_REMOTE, "receive failed", errno);
            return;
        }
        c->ack_got += (size_t)n;
        if (c->ack_got < sizeof(c->ack))
            continue;
        c->ack_got = 0;
        if (c->ack.type != MSG_FLUSH_ACK) {
            conn_fail(c, MSCX_ERR_REMOTE, "peer bug: unexpected message on the ack stream", 0);
            return;
        }
        pthread_mutex_lock(&c->ep->lock);
        if (c->ack.off > c->acked_seq)
            c->acked_seq = c->ack.off;
        pthread_cond_broadcast(&c->ep->cond);
        pthread_mutex_unlock(&c->ep->lock);
    }
}

/* Accept one connection and check its hello; refusals are logged and closed. */
static void rx_accept(struct mscx_tp_ep *ep)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    struct tcp_hello h;
    struct tcp_hello_ack ack = {.magic = MSCX_TP_MAGIC, .status = 0};
    char who[64];

    int fd = accept(ep->listen_fd, (struct sockaddr *)&sa, &sl);
    if (fd < 0)
        return;
    snprintf(who, sizeof(who), "%s:%u", inet_ntoa(sa.sin_addr), ntohs(sa.sin_port));
    int e = recv_exact(fd, &h, sizeof(h), mscx_tp_deadline(TCP_HELLO_TIMEOUT_MS));
    if (e) {
        MSCX_WARN("tcp: refused connection from %s: no handshake: %s", who, strerror(e));
        goto refuse;
    }
    if (h.magic != MSCX_TP_MAGIC) {
        MSCX_WARN("tcp: refused connection from %s: bad magic %#llx", who, (unsigned long long)h.magic);
        goto refuse;
    }
    if (h.version != MSCX_TP_PROTO_VERSION) {
        MSCX_WARN("tcp: refused connection from %s: protocol version %u, expected %u", who, h.version,
                  MSCX_TP_PROTO_VERSION);
        goto refuse;
    }
    if (h.comm_id != ep->p.comm_id) {
        MSCX_WARN("tcp: refused connection from %s: communicator id %#llx, expected %#llx", who,
                  (unsigned long long)h.comm_id, (unsigned long long)ep->p.comm_id);
        goto refuse;
    }
    pthread_mutex_lock(&ep->lock);
    struct mscx_tp_conn *c = h.src < ep->p.nranks && h.dst == ep->p.rank ? ep->conns[h.src] : NULL;
    if (!c || c->in_fd >= 0) {
        pthread_mutex_unlock(&ep->lock);
        MSCX_WARN("tcp: refused connection from %s: rank %u -> %u is not expected here", who, h.src, h.dst);
        goto refuse;
    }
    pthread_mutex_unlock(&ep->lock);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (set_nonblock(fd) < 0 || send(fd, &ack, sizeof(ack), MSG_NOSIGNAL) != (ssize_t)sizeof(ack)) {
        MSCX_WARN("tcp: handshake with %s failed: %s", who, strerror(errno));
        close(fd);
        return;
    }
    pthread_mutex_lock(&ep->lock);
    c->in_fd = fd;
    pthread_cond_broadcast(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    return;

refuse:
    ack.status = 1;
    send(fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
}

static void *rx_thread(void *arg)
{
    struct mscx_tp_ep *ep = arg;
    uint32_t n = ep->p.nranks;
    struct pollfd *pfd = calloc(2 + 2 * (size_t)n, sizeof(*pfd));
    struct mscx_tp_conn **who = calloc(2 + 2 * (size_t)n, sizeof(*who));

    if (!pfd || !who) {
        MSCX_WARN("tcp: receiver thread out of memory");
        goto out;
    }
    for (;;) {
        nfds_t k = 0;
        pthread_mutex_lock(&ep->lock);
        if (ep->stop) {
            pthread_mutex_unlock(&ep->lock);
            break;
        }
        pfd[k++] = (struct pollfd){.fd = ep->wake[0], .events = POLLIN};
        pfd[k++] = (struct pollfd){.fd = ep->listen_fd, .events = POLLIN};
        uint64_t now = mscx_tp_now_ns();
        int stalled = 0;
        for (uint32_t r = 0; r < n; r++) {
            struct mscx_tp_conn *c = ep->conns[r];
            if (c && c->err == MSCX_OK && c->ack_closed &&
                now - c->ack_closed_ns > TCP_CLOSE_GRACE_MS * 1000000ull)
                conn_fail_locked(c, MSCX_ERR_REMOTE,
                                 "peer closed the ack stream but neither said bye nor closed the data stream", 0);
            if (!c || c->err != MSCX_OK)
                continue;
            if (c->in_fd >= 0) {
                /* a stalled put's payload stays in the socket: poll for errors only, retry below */
                stalled |= c->rx_stalled;
                who[k] = c;
                pfd[k++] = (struct pollfd){.fd = c->in_fd, .events = c->rx_stalled ? 0 : POLLIN};
            }
            if (c->out_fd >= 0 && !c->ack_closed) {
                who[k] = c;
                pfd[k++] = (struct pollfd){.fd = c->out_fd, .events = POLLIN};
            }
        }
        pthread_mutex_unlock(&ep->lock);

        int rc = poll(pfd, k, stalled ? 1 : 100);
        for (nfds_t i = 2; stalled && i < k; i++) {
            if (pfd[i].fd != who[i]->in_fd || !who[i]->rx_stalled)
                continue;
            if (pfd[i].revents & (POLLERR | POLLHUP))
                conn_fail(who[i], MSCX_ERR_REMOTE, "peer closed while a late put waited for its target", 0);
            else
                rx_data(who[i]);
            pfd[i].revents = 0;
        }
        if (rc > 0) {
            if (pfd[0].revents) {
                char b[64];
                while (read(ep->wake[0], b, sizeof(b)) > 0)
                    ;
            }
            if (pfd[1].revents & POLLIN)
                rx_accept(ep);
            for (nfds_t i = 2; i < k; i++) {
                if (!pfd[i].revents)
                    continue;
                if (pfd[i].fd == who[i]->in_fd)
                    rx_data(who[i]);
                else
                    rx_acks(who[i]);
            }
        }
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

/* ---------------------------------------------------------------- endpoint */

static mscx_status_t tcp_ep_create(const struct mscx_tp_params *params, struct mscx_tp_ep **ep_p)
{
    mscx_status_t st = MSCX_ERR_SYSTEM;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    pthread_condattr_t ca;
    struct mscx_tp_ep *ep;

    if (!params || !ep_p || params->rank >= params->nranks) {
        MSCX_WARN("caller bug: bad tcp endpoint parameters");
        return MSCX_ERR_INVALID_ARG;
    }
    ep = calloc(1, sizeof(*ep));
    if (!ep || !(ep->conns = calloc(params->nranks, sizeof(*ep->conns)))) {
        MSCX_WARN("tcp: out of memory");
        free(ep);
        return MSCX_ERR_NO_MEMORY;
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

    if (pipe(ep->wake) < 0) {
        MSCX_WARN("tcp: pipe failed: %s", strerror(errno));
        goto err_free;
    }
    set_nonblock(ep->wake[0]);
    set_nonblock(ep->wake[1]);
    char pick[MSCX_TP_ADDR_LEN], ifname[MSCX_TP_IFNAME_LEN];
    const char *bind_addr = params->bind_addr;
    if (!bind_addr) {
        if ((st = mscx_tp_socket_addr(pick, ifname)) != MSCX_OK)
            goto err_pipe;
        st = MSCX_ERR_SYSTEM;
        bind_addr = pick;
    }
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        MSCX_WARN("caller bug: tcp bind address %s is not an IPv4 address", bind_addr);
        st = MSCX_ERR_INVALID_ARG;
        goto err_pipe;
    }
    ep->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ep->listen_fd < 0 || bind(ep->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(ep->listen_fd, 128) < 0 || getsockname(ep->listen_fd, (struct sockaddr *)&sa, &sl) < 0 ||
        set_nonblock(ep->listen_fd) < 0) {
        MSCX_WARN("tcp: cannot listen on %s: %s", bind_addr, strerror(errno));
        goto err_sock;
    }
    ep->addr = sa.sin_addr.s_addr;
    ep->port = sa.sin_port;
    if (pthread_create(&ep->thr, NULL, rx_thread, ep) != 0) {
        MSCX_WARN("tcp: cannot start the receiver thread");
        goto err_sock;
    }
    MSCX_INFO(MSCX_SUB_NET, "tcp: rank %u listening on %s:%u", params->rank, bind_addr, ntohs(ep->port));
    *ep_p = ep;
    return MSCX_OK;

err_sock:
    if (ep->listen_fd >= 0)
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
    if (c->out_fd >= 0 && conn_err(c) == MSCX_OK) {
        /* Orderly close: tell the peer, so its receiver does not report a failure. */
        struct tcp_msg m = {.type = MSG_BYE};
        send(c->out_fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    pthread_mutex_lock(&ep->lock);
    if (ep->conns[c->peer] == c)
        ep->conns[c->peer] = NULL;
    /* Wait until the receiver finished the poll round that may still use c. */
    uint64_t g = ep->gen;
    wake_thread(ep);
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
    wake_thread(ep);
    pthread_join(ep->thr, NULL);
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

static mscx_status_t tcp_mr_register(struct mscx_tp_ep *ep, void *base, size_t len, unsigned flags, int dmabuf_fd,
                                     struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p)
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
    wake_thread(ep);
    while (!ep->stop && ep->gen <= g)
        pthread_cond_wait(&ep->cond, &ep->lock);
    pthread_mutex_unlock(&ep->lock);
    free(mr);
}


/* ---------------------------------------------------------------- connect */

static mscx_status_t tcp_conn_prepare(struct mscx_tp_ep *ep, uint32_t peer, void *blob,
                                      struct mscx_tp_conn **conn_p)
{
    if (!ep || peer >= ep->p.nranks || peer == ep->p.rank || !blob || !conn_p) {
        MSCX_WARN("caller bug: bad tcp connection request to peer %u", peer);
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_tp_conn *c = calloc(1, sizeof(*c));
    if (!c || !(c->stage = malloc(TCP_STAGE_BYTES))) {
        free(c);
        MSCX_WARN("tcp: out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    c->ep = ep;
    c->peer = peer;
    c->in_fd = -1;
    c->out_fd = -1;
    pthread_mutex_lock(&ep->lock);
    if (ep->conns[peer]) {
        pthread_mutex_unlock(&ep->lock);
        free(c->stage);
        free(c);
        MSCX_WARN("caller bug: rank %u already has a tcp connection to peer %u", ep->p.rank, peer);
        return MSCX_ERR_INVALID_ARG;
    }
    ep->conns[peer] = c;
    pthread_mutex_unlock(&ep->lock);

    struct tcp_blob b = {.magic = MSCX_TP_MAGIC, .comm_id = ep->p.comm_id, .version = MSCX_TP_PROTO_VERSION,
                         .rank = ep->p.rank, .addr = ep->addr, .port = ep->port};
    memset(blob, 0, MSCX_TP_BLOB_BYTES);
    memcpy(blob, &b, sizeof(b));
    *conn_p = c;
    return MSCX_OK;
}

static mscx_status_t tcp_conn_establish(struct mscx_tp_conn *c, const void *peer_blob, uint64_t deadline_ns)
{
    struct mscx_tp_ep *ep = c->ep;
    struct tcp_blob b;
    struct tcp_hello h = {.magic = MSCX_TP_MAGIC, .version = MSCX_TP_PROTO_VERSION, .src = ep->p.rank,
                          .dst = c->peer, .comm_id = ep->p.comm_id};
    struct tcp_hello_ack ack;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int one = 1, e;

    memcpy(&b, peer_blob, sizeof(b));
    if (b.magic != MSCX_TP_MAGIC || b.version != MSCX_TP_PROTO_VERSION) {
        MSCX_WARN("tcp: refused peer %u: bad blob magic %#llx or version %u", c->peer, (unsigned long long)b.magic,
                  b.version);
        return MSCX_ERR_REMOTE;
    }
    if (b.comm_id != ep->p.comm_id || b.rank != c->peer) {
        MSCX_WARN("tcp: refused peer %u: communicator id %#llx rank %u, expected %#llx rank %u", c->peer,
                  (unsigned long long)b.comm_id, b.rank, (unsigned long long)ep->p.comm_id, c->peer);
        return MSCX_ERR_REMOTE;
    }
    sa.sin_addr.s_addr = b.addr;
    sa.sin_port = b.port;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        MSCX_WARN("tcp: socket failed: %s", strerror(errno));
        return MSCX_ERR_SYSTEM;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
        e = errno;
        goto err_connect;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int ms;
    while ((ms = ms_left(deadline_ns, 100)) > 0 && poll(&pfd, 1, ms) == 0)
        ;
    socklen_t el = sizeof(e);
    if (ms == 0)
        e = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
        e = errno;
    if (e)
        goto err_connect;
    /* The receiver thread sees the socket only after the handshake (it would read the ack). */
    mscx_status_t st = send_all(c, fd, &h, sizeof(h), 0, deadline_ns);
    if (st != MSCX_OK)
        goto err_close;
    e = recv_exact(fd, &ack, sizeof(ack), deadline_ns);
    if (e || ack.magic != MSCX_TP_MAGIC || ack.status != 0) {
        MSCX_WARN("tcp: peer %u refused our handshake%s%s", c->peer, e ? ": " : "", e ? strerror(e) : "");
        st = e == ETIMEDOUT ? MSCX_ERR_TIMEOUT : MSCX_ERR_REMOTE;
        goto err_close;
    }

    /* Hand the out socket to the receiver and wait for the peer's in socket. */
    pthread_mutex_lock(&ep->lock);
    c->out_fd = fd;
    wake_thread(ep);
    while (c->in_fd < 0 && c->err == MSCX_OK) {
        struct timespec ts;
        uint64_t dl = deadline_ns;
        uint64_t step = mscx_tp_now_ns() + 100000000ull;
        if (step < dl)
            dl = step;
        ts.tv_sec = (time_t)(dl / 1000000000ull);
        ts.tv_nsec = (long)(dl % 1000000000ull);
        pthread_cond_timedwait(&ep->cond, &ep->lock, &ts);
        if (mscx_tp_now_ns() >= deadline_ns)
            break;
    }
    int ok = c->in_fd >= 0;
    st = c->err;
    pthread_mutex_unlock(&ep->lock);
    if (st != MSCX_OK)
        return st;
    if (!ok) {
        MSCX_WARN("tcp: peer %u did not connect back before the deadline", c->peer);
        return MSCX_ERR_TIMEOUT;
    }
    MSCX_INFO(MSCX_SUB_NET, "tcp: rank %u connected to peer %u", ep->p.rank, c->peer);
    return MSCX_OK;

err_connect:
    MSCX_WARN("tcp: cannot connect to peer %u at %s:%u: %s", c->peer, inet_ntoa(sa.sin_addr), ntohs(sa.sin_port),
              strerror(e));
    close(fd);
    return e == ETIMEDOUT ? MSCX_ERR_TIMEOUT : MSCX_ERR_REMOTE;
err_close:
    close(fd);
    return st;
}

/* ---------------------------------------------------------------- data path */

static mscx_status_t check_remote(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff, uint64_t len)
{
    return mscx_tp_check_remote(rd, 'T', c->peer, roff, len);
}

static mscx_status_t tcp_put(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                             const struct mscx_tp_rdesc *rd, uint64_t roff, uint64_t len, unsigned flags,
                             uint64_t deadline_ns)
{
    MSCX_CHECK(conn_err(c));
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
    MSCX_CHECK(send_all(c, c->out_fd, &m, sizeof(m), len > 0, deadline_ns));
    return send_all(c, c->out_fd, (const char *)lmr->base + loff, (size_t)len, 0, deadline_ns);
}

static mscx_status_t tcp_put_late(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                                  const struct mscx_tp_rdesc *rd, uint32_t buf, uint32_t launch, uint64_t roff,
                                  uint64_t len, unsigned flags, uint64_t deadline_ns)
{
    MSCX_CHECK(conn_err(c));
    if (!rd || rd->tp != 'T' || rd->owner != c->peer || !(rd->flags & MSCX_TP_MR_LATE)) {
        MSCX_WARN("caller bug: tcp late put to peer %u names no late-bound region of that peer", c->peer);
        return MSCX_ERR_INVALID_ARG;
    }
    if (!lmr || loff > lmr->len || len > lmr->len - loff || (lmr->flags & (MSCX_TP_MR_GPU | MSCX_TP_MR_LATE))) {
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
    MSCX_CHECK(send_all(c, c->out_fd, &m, sizeof(m), len > 0, deadline_ns));
    return send_all(c, c->out_fd, (const char *)lmr->base + loff, (size_t)len, 0, deadline_ns);
}

static mscx_status_t tcp_signal(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                                uint64_t deadline_ns)
{
    MSCX_CHECK(conn_err(c));
    MSCX_CHECK(check_remote(c, rd, roff, 8));
    if ((rd->addr + roff) % 8) {
        MSCX_WARN("caller bug: tcp signal word at offset %llu is not 8-byte aligned", (unsigned long long)roff);
        return MSCX_ERR_INVALID_ARG;
    }
    struct tcp_msg m = {.type = MSG_SIGNAL, .key = rd->key, .off = roff, .len = 8};
    return send_all(c, c->out_fd, &m, sizeof(m), 0, deadline_ns);
}

static mscx_status_t tcp_flush(struct mscx_tp_conn *c, uint64_t deadline_ns)
{
    struct mscx_tp_ep *ep = c->ep;
    MSCX_CHECK(conn_err(c));
    uint64_t seq = __atomic_add_fetch(&c->flush_seq, 1, __ATOMIC_ACQ_REL);
    struct tcp_msg m = {.type = MSG_FLUSH, .off = seq};
    MSCX_CHECK(send_all(c, c->out_fd, &m, sizeof(m), 0, deadline_ns));

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

static mscx_status_t tcp_progress(struct mscx_tp_ep *ep)
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

const struct mscx_transport_ops mscx_tp_tcp = {
    .name = "tcp",
    .ep_create = tcp_ep_create,
    .ep_destroy = tcp_ep_destroy,
    .mr_register = tcp_mr_register,
    .mr_deregister = tcp_mr_deregister,
    .conn_prepare = tcp_conn_prepare,
    .conn_establish = tcp_conn_establish,
    .conn_close = tcp_conn_close,
    .put = tcp_put,
    .signal = tcp_signal,
    .flush = tcp_flush,
    .progress = tcp_progress,
    .mr_register_late = tcp_mr_register_late,
    .put_late = tcp_put_late,
};
