/* SPDX-License-Identifier: MIT */
/*
 * The TCP transport's handshake (see transport_tcp.c for the connection
 * model). conn_prepare writes where this rank listens into the blob;
 * conn_establish connects to where the peer listens, sends a hello (magic,
 * protocol version, ranks, communicator) and waits for the peer's accept,
 * then for the peer's own connection to arrive at our listener. The receiver
 * thread accepts that connection and checks its hello the same way.
 */
#define _GNU_SOURCE /* accept4, explicit_bzero */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mscx/log.h"
#include "transport_tcp_int.h"

#define TCP_HELLO_TIMEOUT_MS 2000 /* the connecting side's wait for the accept */

/* ---------------------------------------------------------------- wire formats */

struct tcp_hello {
    uint64_t magic;
    uint32_t version;
    uint32_t src; /* connecting rank */
    uint32_t dst; /* rank it wants */
    uint32_t reserved;
    uint64_t comm_id;
    uint8_t secret[MSCX_TP_SECRET_BYTES];
};
_Static_assert(sizeof(struct tcp_hello) == TCP_HELLO_BYTES, "wire format");

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
        int ms = mscx_tcp_ms_left(deadline_ns, 100);
        if (ms == 0)
            return ETIMEDOUT;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        poll(&pfd, 1, ms);
    }
    return 0;
}

/* ---------------------------------------------------------------- accepting side (receiver thread) */

/*
 * The listener accepts every connection at once and keeps it among the
 * handshakes in progress; the receiver thread reads each hello without
 * blocking, beside its data. A connection claims its rank's slot only once
 * its whole hello arrived and proved the communicator's secret; a second
 * claim of a slot is refused, and one that sends too little, or nothing,
 * for TCP_HANDSHAKE_TIMEOUT_MS is closed. No connection holds up another.
 */

static void pending_drop(struct mscx_tp_ep *ep, unsigned i)
{
    close(ep->pend[i].fd);
    ep->pend[i] = ep->pend[--ep->npend];
}

/*
 * Refused connections are logged once per stranger: the first refusal of an
 * address is a WARN, and so is the next one after STRANGER_QUIET_NS; the
 * others (a retrying or scanning peer) are INFO. A few addresses are
 * remembered process-wide; the least recently warned one is forgotten first.
 */
#define STRANGERS 32
#define STRANGER_QUIET_NS (60ull * 1000000000ull)

static pthread_mutex_t strangers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char addr[48];
    uint64_t warned_ns;
} strangers[STRANGERS];

/* @return 1 when a refusal of @p who ("address:port") is to be a WARN */
static int stranger_news(const char *who)
{
    char addr[48];
    snprintf(addr, sizeof(addr), "%s", who);
    char *colon = strrchr(addr, ':');
    if (colon)
        *colon = '\0';
    uint64_t now = mscx_tp_now_ns();
    int news = 1;
    pthread_mutex_lock(&strangers_lock);
    unsigned slot = 0;
    for (unsigned i = 0; i < STRANGERS; i++) {
        if (strangers[i].addr[0] && strcmp(strangers[i].addr, addr) == 0) {
            slot = i;
            news = now - strangers[i].warned_ns >= STRANGER_QUIET_NS;
            break;
        }
        if (strangers[i].warned_ns < strangers[slot].warned_ns)
            slot = i;
    }
    if (news) {
        snprintf(strangers[slot].addr, sizeof(strangers[slot].addr), "%s", addr);
        strangers[slot].warned_ns = now;
    }
    pthread_mutex_unlock(&strangers_lock);
    return news;
}

static void refused(const char *who, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refused(const char *who, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (stranger_news(who))
        MSCX_WARN(
            "tcp: refused connection from %s: %s (further refusals of this address for a minute at INFO)",
            who, why);
    else
        MSCX_INFO(MSCX_SUB_NET, "tcp: refused connection from %s: %s", who, why);
}

static void refuse(int fd)
{
    struct tcp_hello_ack ack = {.magic = MSCX_TP_MAGIC, .status = 1};
    send(fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Check a whole hello; @return the connection it claims (ep->lock held), or NULL when refused (logged). */
static struct mscx_tp_conn *hello_check(struct mscx_tp_ep *ep, const struct tcp_hello *h, const char *who)
{
    if (h->magic != MSCX_TP_MAGIC) {
        refused(who, "bad magic %#llx", (unsigned long long)h->magic);
        return NULL;
    }
    if (h->version != MSCX_TP_PROTO_VERSION) {
        refused(who, "protocol version %u, expected %u", h->version, MSCX_TP_PROTO_VERSION);
        return NULL;
    }
    if (h->comm_id != ep->p.comm_id) {
        refused(who, "communicator id %#llx, expected %#llx", (unsigned long long)h->comm_id,
                (unsigned long long)ep->p.comm_id);
        return NULL;
    }
    if (!mscx_tp_ct_equal(h->secret, ep->p.secret, sizeof(h->secret))) {
        refused(who, "wrong communicator secret");
        return NULL;
    }
    struct mscx_tp_conn *c = h->src < ep->p.nranks && h->dst == ep->p.rank ? ep->conns[h->src] : NULL;
    if (!c || c->in_fd >= 0) {
        refused(who, "rank %u -> %u is not expected here", h->src, h->dst);
        return NULL;
    }
    return c;
}

/* The whole hello of pending @p i arrived: claim its slot or refuse it. Removes it from the pending set. */
static void pending_finish(struct mscx_tp_ep *ep, unsigned i)
{
    struct tcp_pending *pd = &ep->pend[i];
    struct tcp_hello h;
    struct tcp_hello_ack ack = {.magic = MSCX_TP_MAGIC, .status = 0};
    int fd = pd->fd, one = 1;

    memcpy(&h, pd->hello, sizeof(h));
    pthread_mutex_lock(&ep->lock);
    struct mscx_tp_conn *c = hello_check(ep, &h, pd->who);
    if (c && send(fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(ack)) {
        MSCX_WARN("tcp: handshake with %s failed: %s", pd->who, strerror(errno));
        c = NULL;
    }
    if (c) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->in_fd = fd;
        pthread_cond_broadcast(&ep->cond);
    }
    pthread_mutex_unlock(&ep->lock);
    explicit_bzero(&h, sizeof(h));
    explicit_bzero(pd->hello, sizeof(pd->hello));
    if (c) {
        ep->pend[i] = ep->pend[--ep->npend]; /* the socket is the connection's now */
        return;
    }
    refuse(fd);
    pending_drop(ep, i);
}

void mscx_tcp_accept(struct mscx_tp_ep *ep)
{
    for (int k = 0; k < TCP_MAX_PENDING; k++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(ep->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (ep->npend == TCP_MAX_PENDING) {
            unsigned old = 0;
            for (unsigned i = 1; i < ep->npend; i++)
                if (ep->pend[i].deadline_ns < ep->pend[old].deadline_ns)
                    old = i;
            refused(ep->pend[old].who, "%u handshakes in progress, this one the oldest", TCP_MAX_PENDING);
            pending_drop(ep, old);
        }
        struct tcp_pending *pd = &ep->pend[ep->npend++];
        memset(pd, 0, sizeof(*pd));
        pd->fd = fd;
        pd->deadline_ns = mscx_tp_deadline(TCP_HANDSHAKE_TIMEOUT_MS);
        snprintf(pd->who, sizeof(pd->who), "%s:%u", inet_ntoa(sa.sin_addr), ntohs(sa.sin_port));
    }
}

nfds_t mscx_tcp_pending_fill(const struct mscx_tp_ep *ep, struct pollfd *pfd)
{
    for (unsigned i = 0; i < ep->npend; i++)
        pfd[i] = (struct pollfd){.fd = ep->pend[i].fd, .events = POLLIN};
    return ep->npend;
}

void mscx_tcp_pending_serve(struct mscx_tp_ep *ep)
{
    uint64_t now = mscx_tp_now_ns();
    for (unsigned i = ep->npend; i-- > 0;) {
        struct tcp_pending *pd = &ep->pend[i];
        ssize_t n = recv(pd->fd, pd->hello + pd->got, sizeof(pd->hello) - pd->got, MSG_DONTWAIT);
        if (n > 0)
            pd->got += (size_t)n;
        if (pd->got == sizeof(pd->hello)) {
            pending_finish(ep, i);
        } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            if (n == 0)
                refused(pd->who, "no handshake: closed after %zu of %zu bytes", pd->got, sizeof(pd->hello));
            else
                refused(pd->who, "no handshake: %s", strerror(errno));
            refuse(pd->fd);
            pending_drop(ep, i);
        } else if (now >= pd->deadline_ns) {
            refused(pd->who, "no handshake within %d ms (%zu of %zu bytes)", TCP_HANDSHAKE_TIMEOUT_MS,
                    pd->got, sizeof(pd->hello));
            refuse(pd->fd);
            pending_drop(ep, i);
        }
    }
}

void mscx_tcp_pending_close(struct mscx_tp_ep *ep)
{
    while (ep->npend)
        pending_drop(ep, ep->npend - 1);
}

/* ---------------------------------------------------------------- connecting side (caller) */

mscx_status_t mscx_tcp_conn_prepare(struct mscx_tp_ep *ep, uint32_t peer, void *blob,
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

    struct tcp_blob b = {.magic = MSCX_TP_MAGIC,
                         .comm_id = ep->p.comm_id,
                         .version = MSCX_TP_PROTO_VERSION,
                         .rank = ep->p.rank,
                         .addr = ep->addr,
                         .port = ep->port};
    memset(blob, 0, MSCX_TP_BLOB_BYTES);
    memcpy(blob, &b, sizeof(b));
    *conn_p = c;
    return MSCX_OK;
}

/* Check the blob @p peer_blob that the peer wrote for us into @p b. */
static mscx_status_t blob_check(const struct mscx_tp_conn *c, const void *peer_blob, struct tcp_blob *b)
{
    const struct mscx_tp_ep *ep = c->ep;
    memcpy(b, peer_blob, sizeof(*b));
    if (b->magic != MSCX_TP_MAGIC || b->version != MSCX_TP_PROTO_VERSION) {
        MSCX_WARN("tcp: refused peer %u: bad blob magic %#llx or version %u", c->peer,
                  (unsigned long long)b->magic, b->version);
        return MSCX_ERR_REMOTE;
    }
    if (b->comm_id != ep->p.comm_id || b->rank != c->peer) {
        MSCX_WARN("tcp: refused peer %u: communicator id %#llx rank %u, expected %#llx rank %u", c->peer,
                  (unsigned long long)b->comm_id, b->rank, (unsigned long long)ep->p.comm_id, c->peer);
        return MSCX_ERR_REMOTE;
    }
    return MSCX_OK;
}

/* Connect a non-blocking socket to where @p b says the peer listens; @p fd_p once connected. */
static mscx_status_t dial(const struct mscx_tp_conn *c, const struct tcp_blob *b, uint64_t deadline_ns,
                          int *fd_p)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int one = 1, e;

    sa.sin_addr.s_addr = b->addr;
    sa.sin_port = b->port;
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
    while ((ms = mscx_tcp_ms_left(deadline_ns, 100)) > 0 && poll(&pfd, 1, ms) == 0)
        ;
    socklen_t el = sizeof(e);
    if (ms == 0)
        e = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
        e = errno;
    if (e)
        goto err_connect;
    *fd_p = fd;
    return MSCX_OK;

err_connect:
    MSCX_WARN("tcp: cannot connect to peer %u at %s:%u: %s", c->peer, inet_ntoa(sa.sin_addr),
              ntohs(sa.sin_port), strerror(e));
    close(fd);
    return e == ETIMEDOUT ? MSCX_ERR_TIMEOUT : MSCX_ERR_REMOTE;
}

/* Send our hello on the connected socket @p fd and read the peer's answer. */
static mscx_status_t send_hello(struct mscx_tp_conn *c, int fd, uint64_t deadline_ns)
{
    const struct mscx_tp_ep *ep = c->ep;
    struct tcp_hello h = {.magic = MSCX_TP_MAGIC,
                          .version = MSCX_TP_PROTO_VERSION,
                          .src = ep->p.rank,
                          .dst = c->peer,
                          .comm_id = ep->p.comm_id};
    struct tcp_hello_ack ack;
    memcpy(h.secret, ep->p.secret, sizeof(h.secret));

    /* The receiver thread sees the socket only after the handshake (it would read the ack). */
    mscx_status_t st = mscx_tcp_send_all(c, fd, &h, sizeof(h), 0, deadline_ns);
    explicit_bzero(&h, sizeof(h));
    MSCX_CHECK(st);
    int e = recv_exact(fd, &ack, sizeof(ack), deadline_ns);
    if (e || ack.magic != MSCX_TP_MAGIC || ack.status != 0) {
        MSCX_WARN("tcp: peer %u refused our handshake%s%s", c->peer, e ? ": " : "", e ? strerror(e) : "");
        return e == ETIMEDOUT ? MSCX_ERR_TIMEOUT : MSCX_ERR_REMOTE;
    }
    return MSCX_OK;
}

/* Hand the out socket @p fd to the receiver and wait for the peer's in socket. */
static mscx_status_t await_peer(struct mscx_tp_conn *c, int fd, uint64_t deadline_ns)
{
    struct mscx_tp_ep *ep = c->ep;
    pthread_mutex_lock(&ep->lock);
    c->out_fd = fd;
    mscx_tcp_wake(ep);
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
    mscx_status_t st = c->err;
    pthread_mutex_unlock(&ep->lock);
    if (st != MSCX_OK)
        return st;
    if (!ok) {
        MSCX_WARN("tcp: peer %u did not connect back before the deadline", c->peer);
        return MSCX_ERR_TIMEOUT;
    }
    return MSCX_OK;
}

mscx_status_t mscx_tcp_conn_establish(struct mscx_tp_conn *c, const void *peer_blob, uint64_t deadline_ns)
{
    struct tcp_blob b;
    int fd;

    MSCX_CHECK(blob_check(c, peer_blob, &b));
    MSCX_CHECK(dial(c, &b, deadline_ns, &fd));
    mscx_status_t st = send_hello(c, fd, deadline_ns);
    if (st != MSCX_OK) {
        close(fd);
        return st;
    }
    MSCX_CHECK(await_peer(c, fd, deadline_ns));
    MSCX_INFO(MSCX_SUB_NET, "tcp: rank %u connected to peer %u", c->ep->p.rank, c->peer);
    return MSCX_OK;
}
