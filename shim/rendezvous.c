/* SPDX-License-Identifier: MIT */
/*
 * The setup rendezvous keyed by the NCCL unique id (see rendezvous.h).
 *
 * The id. NCCL's ncclUniqueId (128 bytes) begins with its bootstrap handle:
 * a 64-bit magic, the root's socket address (IPv4 or IPv6) and, in newer
 * versions, a rank count: 40 bytes at most. ncclGetUniqueId zeroes the rest,
 * and no NCCL from 2.19 on reads it. Our marker takes the last 64 bytes,
 * little-endian whatever the host:
 *
 *   0  "MSCXRDV"  7 format version   8 family (4 or 6)   9 zero
 *   10 port (big-endian)   12 bound in ms   16 IPv6 scope id
 *   20 address (4 or 16 bytes)   36 nonce (16 random bytes)
 *   52 rank count of the communicator a grow id extends (0: not a grow id)
 *   56 FNV-1a of bytes 0..55   60 zero
 *
 * The exchange. Each rank connects to the listener and sends a hello (the
 * nonce, its rank, the rank count, the record size) and its record. The
 * listener takes the first valid hello's rank count and size as the
 * communicator's, and answers every rank once all records are in (the whole
 * table), or when the bound has passed since the first valid hello (the
 * ranks that never came). A connection with a wrong nonce, a malformed
 * hello, a duplicate rank or a different shape is closed, and the exchange
 * goes on. The listener serves one exchange, then exits; it also exits when
 * no rank came for SHIM_RDV_IDLE_MS.
 *
 * The bound tells "absent" from "late": a rank comes here right after NCCL's
 * own init returned on it, and that init returns only once every rank has
 * joined NCCL's bootstrap. So every rank with the shim arrives within a
 * short time of the first; one that has not after the bound has no shim.
 */
#define _GNU_SOURCE
#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mscx/fork.h"
#include "mscx/log.h"

#define ID_BYTES ((size_t)NCCL_UNIQUE_ID_BYTES)
#define MARK_OFF (ID_BYTES - SHIM_RDV_MARK_BYTES)
#define HANDLE_ADDR_OFF 8 /* the socket address in NCCL's bootstrap handle, after its 64-bit magic */
#define MARK_VERSION 2
#define NONCE_BYTES 16

#define MSG_MAGIC 0x3156524du /* "MRV1" */
#define MSG_VERSION 1
#define KIND_HELLO 1
#define KIND_TABLE 2
#define KIND_FALLBACK 3
#define HELLO_BYTES 40
#define ANSWER_BYTES 24

#define SHIM_RDV_IDLE_MS                                                                                     \
    (60u * 60u * 1000u)   /* a marked id that no rank uses for this long: the listener exits */
#define MAX_LISTENERS 256 /* live listeners of one process; more ids stay unmarked */
#define LISTENER_STACK (256u << 10)
#define MAX_RECORD (1u << 20)
#define MAX_TABLE (256ull << 20)
#define CONN_SLACK 64u      /* connections beyond the rank count accepted at once (strangers, retries) */
#define REJECT_LOG 4        /* rejected connections logged per listener; the rest are counted */
#define ANSWER_MIN_MS 5000u /* the least time given to sending the answer */
#define RETRY_MS 50         /* between connection attempts */

static const char mark_magic[7] = {'M', 'S', 'C', 'X', 'R', 'D', 'V'};
static atomic_int live_listeners;

/* ---- little helpers ---- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t fnv1a(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static int poll_ms(uint64_t deadline)
{
    uint64_t t = now_ms();
    return t >= deadline ? 0 : (int)(deadline - t > 1000 ? 1000 : deadline - t);
}

/*
 * Move all @p n bytes through the non-blocking @p fd by @p deadline.
 * @return 0, -1 (the peer closed or an error) or -2 (time)
 */
static int xfer(int fd, void *buf, size_t n, int out, uint64_t deadline)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = out ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0 && !out)
            return -1;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        if (now_ms() >= deadline)
            return -2;
        struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        if (poll(&pfd, 1, poll_ms(deadline)) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

/* ---- the marker ---- */

struct mark {
    union {
        struct sockaddr sa;
        struct sockaddr_in sin;
        struct sockaddr_in6 sin6;
    } addr;
    socklen_t addrlen;
    uint32_t bound_ms;
    uint32_t grow_from;
    uint8_t nonce[NONCE_BYTES];
};

static int mark_read(const ncclUniqueId *id, struct mark *m)
{
    const uint8_t *p = (const uint8_t *)id->internal + MARK_OFF;
    if (memcmp(p, mark_magic, sizeof(mark_magic)) != 0 || p[7] != MARK_VERSION || p[9] != 0 ||
        get32(p + 56) != fnv1a(p, 56))
        return 0;
    memset(m, 0, sizeof(*m));
    uint16_t port;
    memcpy(&port, p + 10, 2);
    if (p[8] == 4) {
        m->addr.sin.sin_family = AF_INET;
        m->addr.sin.sin_port = port;
        memcpy(&m->addr.sin.sin_addr, p + 20, 4);
        m->addrlen = sizeof(m->addr.sin);
    } else if (p[8] == 6) {
        m->addr.sin6.sin6_family = AF_INET6;
        m->addr.sin6.sin6_port = port;
        m->addr.sin6.sin6_scope_id = get32(p + 16);
        memcpy(&m->addr.sin6.sin6_addr, p + 20, 16);
        m->addrlen = sizeof(m->addr.sin6);
    } else {
        return 0;
    }
    m->bound_ms = get32(p + 12);
    memcpy(m->nonce, p + 36, NONCE_BYTES);
    m->grow_from = get32(p + 52);
    return 1;
}

static void mark_write(ncclUniqueId *id, const struct mark *m)
{
    uint8_t p[SHIM_RDV_MARK_BYTES] = {0};
    memcpy(p, mark_magic, sizeof(mark_magic));
    p[7] = MARK_VERSION;
    if (m->addr.sa.sa_family == AF_INET) {
        p[8] = 4;
        memcpy(p + 10, &m->addr.sin.sin_port, 2);
        memcpy(p + 20, &m->addr.sin.sin_addr, 4);
    } else {
        p[8] = 6;
        memcpy(p + 10, &m->addr.sin6.sin6_port, 2);
        put32(p + 16, m->addr.sin6.sin6_scope_id);
        memcpy(p + 20, &m->addr.sin6.sin6_addr, 16);
    }
    put32(p + 12, m->bound_ms);
    memcpy(p + 36, m->nonce, NONCE_BYTES);
    put32(p + 52, m->grow_from);
    put32(p + 56, fnv1a(p, 56));
    memcpy((uint8_t *)id->internal + MARK_OFF, p, sizeof(p));
}

int shim_rdv_marked(const ncclUniqueId *id)
{
    struct mark m;
    return id && mark_read(id, &m);
}

uint32_t shim_rdv_grow_from(const ncclUniqueId *id)
{
    struct mark m;
    return id && mark_read(id, &m) ? m.grow_from : 0;
}

enum shim_rdv_id shim_rdv_id_kind(const ncclUniqueId *id)
{
    if (shim_rdv_marked(id))
        return SHIM_RDV_ID_MARKED;
    const uint8_t *b = (const uint8_t *)id->internal;
    for (size_t i = MARK_OFF; i < ID_BYTES; i++)
        if (b[i])
            return SHIM_RDV_ID_FOREIGN;
    sa_family_t fam;
    memcpy(&fam, b + HANDLE_ADDR_OFF, sizeof(fam));
    return fam == AF_INET || fam == AF_INET6 ? SHIM_RDV_ID_BARE : SHIM_RDV_ID_FOREIGN;
}

uint32_t shim_rdv_bound_ms(const struct mscx_config *cfg)
{
    uint64_t b = SHIM_RDV_DEFAULT_BOUND_MS;
    if (cfg && cfg->timeout_ms > b)
        b = cfg->timeout_ms > UINT32_MAX ? UINT32_MAX : cfg->timeout_ms;
    return (uint32_t)b;
}

/* ---- the listener ---- */

struct conn {
    int fd;
    int state; /* 0: reading the hello, 1: reading the record, 2: the record is in */
    uint32_t rank;
    size_t got;
    uint64_t since;
    uint8_t hello[HELLO_BYTES];
};

struct listener {
    int fd;
    struct mark m;
    char where[64];
    atomic_int released;           /* its id's communicator has one rank: no rank will come */
    struct listener *next_of_proc; /* on the list of this process's listeners */
    /* the exchange */
    uint32_t nranks, bytes;
    uint8_t *table;
    uint8_t *have; /* per rank: 0 not come, 1 its record coming, 2 its record in */
    uint32_t nhave;
    uint64_t first; /* the first valid hello, 0 before */
    struct conn *conns;
    size_t nconns, cap;
    unsigned rejected;
};

static void reject(struct listener *l, size_t i, const char *why)
{
    if (l->rejected++ < REJECT_LOG)
        MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: closed a connection: %s", l->where, why);
    close(l->conns[i].fd);
    l->conns[i] = l->conns[--l->nconns];
}

/* A complete hello on connection @p i: 1 when it is a rank of this exchange. */
static int hello_ok(struct listener *l, size_t i)
{
    struct conn *c = &l->conns[i];
    const uint8_t *h = c->hello;
    uint32_t rank = get32(h + 24), nranks = get32(h + 28), bytes = get32(h + 32);
    if (get32(h) != MSG_MAGIC || get16(h + 4) != MSG_VERSION || get16(h + 6) != KIND_HELLO || get32(h + 36)) {
        reject(l, i, "not a rendezvous hello");
        return 0;
    }
    if (memcmp(h + 8, l->m.nonce, NONCE_BYTES) != 0) {
        reject(l, i, "wrong nonce (another id's rank or a stranger)");
        return 0;
    }
    if (nranks == 0 || rank >= nranks || bytes == 0 || bytes > MAX_RECORD ||
        (uint64_t)nranks * bytes > MAX_TABLE) {
        reject(l, i, "a malformed hello");
        return 0;
    }
    if (l->nranks && (nranks != l->nranks || bytes != l->bytes)) {
        reject(l, i, "a rank count or record size unlike the first rank's");
        return 0;
    }
    if (l->have && l->have[rank]) {
        reject(l, i, "a rank that came already");
        return 0;
    }
    if (!l->nranks) {
        l->table = malloc((size_t)nranks * bytes);
        l->have = calloc(nranks, 1);
        if (!l->table || !l->have) {
            free(l->table);
            free(l->have);
            l->table = l->have = NULL;
            reject(l, i, "out of memory for the table");
            return 0;
        }
        l->nranks = nranks;
        l->bytes = bytes;
        l->first = now_ms();
    }
    c->rank = rank;
    c->state = 1;
    c->got = 0;
    l->have[rank] = 1; /* reserved: a second connection for this rank is turned away */
    return 1;
}

/* Read what connection @p i has; @return 0 when it stays, -1 when it went. */
static int conn_read(struct listener *l, size_t i)
{
    struct conn *c = &l->conns[i];
    for (;;) {
        uint8_t *dst;
        size_t need;
        if (c->state == 0) {
            dst = c->hello + c->got;
            need = HELLO_BYTES - c->got;
        } else if (c->state == 1) {
            dst = l->table + (size_t)c->rank * l->bytes + c->got;
            need = l->bytes - c->got;
        } else {
            return 0;
        }
        ssize_t k = recv(c->fd, dst, need, 0);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        if (k <= 0) {
            if (c->state == 1)
                l->have[c->rank] = 0; /* it may come again */
            reject(l, i, "the peer closed before its record was in");
            return -1;
        }
        c->got += (size_t)k;
        if (c->state == 0 && c->got == HELLO_BYTES) {
            if (!hello_ok(l, i))
                return -1;
        } else if (c->state == 1 && c->got == l->bytes) {
            c->state = 2;
            l->have[c->rank] = 2;
            l->nhave++;
            return 0;
        }
    }
}

static void answer(struct listener *l, int all_in)
{
    uint8_t head[ANSWER_BYTES] = {0};
    uint32_t list[SHIM_RDV_ABSENT_MAX];
    uint32_t count = 0, n = 0;
    if (!all_in)
        for (uint32_t r = 0; r < l->nranks; r++)
            if (l->have[r] != 2) {
                if (n < SHIM_RDV_ABSENT_MAX)
                    list[n++] = r;
                count++;
            }
    put32(head, MSG_MAGIC);
    put16(head + 4, MSG_VERSION);
    put16(head + 6, all_in ? KIND_TABLE : KIND_FALLBACK);
    put32(head + 8, l->nranks);
    put32(head + 12, l->bytes);
    put32(head + 16, count);
    put32(head + 20, n);
    uint8_t tail[SHIM_RDV_ABSENT_MAX * 4];
    for (uint32_t k = 0; k < n; k++)
        put32(tail + 4 * k, list[k]);
    uint64_t deadline = now_ms() + (l->m.bound_ms > ANSWER_MIN_MS ? l->m.bound_ms : ANSWER_MIN_MS);
    for (size_t i = 0; i < l->nconns; i++) {
        struct conn *c = &l->conns[i];
        if (c->state != 2 || c->fd < 0)
            continue;
        if (xfer(c->fd, head, sizeof(head), 1, deadline) == 0)
            (void)(all_in ? xfer(c->fd, l->table, (size_t)l->nranks * l->bytes, 1, deadline)
                          : xfer(c->fd, tail, 4 * (size_t)n, 1, deadline));
    }
    if (all_in)
        MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: all %u ranks in", l->where, l->nranks);
    else
        MSCX_INFO(MSCX_SUB_SHIM,
                  "rendezvous %s: %u of %u ranks never came within %u ms; told the others to fall back",
                  l->where, count, l->nranks, l->m.bound_ms);
}

/* This process's listeners, so that a lone rank can release its id's (shim_rdv_release()). */
static pthread_mutex_t procs_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void procs_fork_init(void)
{
    mscx_fork_protect(&procs_lock, MSCX_FORK_SHIM_WARN);
}
static struct listener *procs;

static void proc_add(struct listener *l)
{
    pthread_mutex_lock(&procs_lock);
    l->next_of_proc = procs;
    procs = l;
    pthread_mutex_unlock(&procs_lock);
}

static void proc_remove(struct listener *l)
{
    pthread_mutex_lock(&procs_lock);
    for (struct listener **p = &procs; *p; p = &(*p)->next_of_proc)
        if (*p == l) {
            *p = l->next_of_proc;
            break;
        }
    pthread_mutex_unlock(&procs_lock);
}

void shim_rdv_release(const ncclUniqueId *id)
{
    struct mark m;
    if (!id || !mark_read(id, &m))
        return;
    pthread_mutex_lock(&procs_lock);
    for (struct listener *l = procs; l; l = l->next_of_proc)
        if (memcmp(l->m.nonce, m.nonce, NONCE_BYTES) == 0)
            atomic_store(&l->released, 1);
    pthread_mutex_unlock(&procs_lock);
}

static void *serve(void *arg)
{
    struct listener *l = arg;
    uint64_t start = now_ms();
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    for (;;) {
        uint64_t t = now_ms();
        if (atomic_load(&l->released) && !l->first) {
            MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: its communicator has one rank; the listener exits",
                      l->where);
            break;
        }
        if (l->nranks && l->nhave == l->nranks) {
            answer(l, 1);
            break;
        }
        if (l->first && t >= l->first + l->m.bound_ms) {
            answer(l, 0);
            break;
        }
        if (!l->first && t >= start + SHIM_RDV_IDLE_MS) {
            MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: no rank came in %u s; the listener exits", l->where,
                      SHIM_RDV_IDLE_MS / 1000u);
            break;
        }
        /* a connection that has not sent its record within the bound is closed */
        for (size_t i = 0; i < l->nconns;) {
            uint32_t lim = l->m.bound_ms > ANSWER_MIN_MS ? l->m.bound_ms : ANSWER_MIN_MS;
            if (l->conns[i].state != 2 && t >= l->conns[i].since + lim) {
                if (l->conns[i].state == 1)
                    l->have[l->conns[i].rank] = 0;
                reject(l, i, "no complete hello and record in time");
            } else {
                i++;
            }
        }
        if (pcap < l->nconns + 1) {
            size_t nc = (l->nconns + 1) * 2;
            struct pollfd *np = realloc(pfds, nc * sizeof(*np));
            if (!np) {
                MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: out of memory; the listener exits", l->where);
                break;
            }
            pfds = np;
            pcap = nc;
        }
        pfds[0] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        for (size_t i = 0; i < l->nconns; i++)
            pfds[i + 1] =
                (struct pollfd){.fd = l->conns[i].fd, .events = l->conns[i].state == 2 ? 0 : POLLIN};
        size_t np = l->nconns + 1;
        uint64_t until = l->first ? l->first + l->m.bound_ms : start + SHIM_RDV_IDLE_MS;
        int r = poll(pfds, np, poll_ms(until < t + 200 ? until : t + 200));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: poll failed: %s; the listener exits", l->where,
                      strerror(errno));
            break;
        }
        /* connections first (from the back: a closed one is replaced by the last) */
        for (size_t i = np - 1; i >= 1; i--) {
            if (!pfds[i].revents || i - 1 >= l->nconns || l->conns[i - 1].fd != pfds[i].fd)
                continue;
            struct conn *c = &l->conns[i - 1];
            if (c->state != 2) {
                conn_read(l, i - 1);
            } else {
                /* a rank whose record is in hung up: its record counts, it gets no answer */
                close(c->fd);
                c->fd = -1;
            }
        }
        if (pfds[0].revents & POLLIN) {
            for (;;) {
                int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
                        struct timespec ts = {.tv_nsec =
                                                  RETRY_MS * 1000000L}; /* out of descriptors: no spin */
                        nanosleep(&ts, NULL);
                    }
                    break;
                }
                size_t lim = (l->nranks > 1024 ? l->nranks : 1024) + CONN_SLACK;
                if (l->nconns >= lim) {
                    close(fd);
                    continue;
                }
                if (l->nconns == l->cap) {
                    size_t nc = l->cap ? l->cap * 2 : 16;
                    struct conn *nconns = realloc(l->conns, nc * sizeof(*nconns));
                    if (!nconns) {
                        close(fd);
                        continue;
                    }
                    l->conns = nconns;
                    l->cap = nc;
                }
                l->conns[l->nconns++] = (struct conn){.fd = fd, .since = now_ms()};
            }
        }
    }
    if (l->rejected > REJECT_LOG)
        MSCX_INFO(MSCX_SUB_SHIM, "rendezvous %s: %u more connections closed", l->where,
                  l->rejected - REJECT_LOG);
    for (size_t i = 0; i < l->nconns; i++)
        if (l->conns[i].fd >= 0)
            close(l->conns[i].fd);
    /* stop listening in every copy of the socket (a forked child's too): a later rank is refused at once */
    shutdown(l->fd, SHUT_RDWR);
    close(l->fd);
    proc_remove(l);
    free(pfds);
    free(l->conns);
    free(l->table);
    free(l->have);
    free(l);
    atomic_fetch_sub(&live_listeners, 1);
    return NULL;
}

static void addr_str(const struct mark *m, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (m->addr.sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &m->addr.sin.sin_addr, ip, sizeof(ip));
        snprintf(buf, n, "%s:%u", ip, ntohs(m->addr.sin.sin_port));
    } else {
        inet_ntop(AF_INET6, &m->addr.sin6.sin6_addr, ip, sizeof(ip));
        snprintf(buf, n, "[%s]:%u", ip, ntohs(m->addr.sin6.sin6_port));
    }
}

mscx_status_t shim_rdv_mark(ncclUniqueId *id, uint32_t bound_ms, uint32_t grow_from)
{
    if (!id || bound_ms == 0)
        return MSCX_ERR_INVALID_ARG;
    const uint8_t *b = (const uint8_t *)id->internal;
    for (size_t i = MARK_OFF; i < ID_BYTES; i++)
        if (b[i]) {
            MSCX_INFO(MSCX_SUB_SHIM,
                      "unique id: the id's last %d bytes are in use; it is left unmarked, and "
                      "the ranks of its communicators meet over the communicator (no rendezvous)",
                      SHIM_RDV_MARK_BYTES);
            return MSCX_ERR_UNSUPPORTED;
        }
    struct mark m;
    memset(&m, 0, sizeof(m));
    sa_family_t fam;
    memcpy(&fam, b + HANDLE_ADDR_OFF, sizeof(fam));
    if (fam == AF_INET) {
        memcpy(&m.addr.sin, b + HANDLE_ADDR_OFF, sizeof(m.addr.sin));
        m.addrlen = sizeof(m.addr.sin);
    } else if (fam == AF_INET6) {
        memcpy(&m.addr.sin6, b + HANDLE_ADDR_OFF, sizeof(m.addr.sin6));
        m.addrlen = sizeof(m.addr.sin6);
    } else {
        MSCX_INFO(MSCX_SUB_SHIM,
                  "unique id: the id's address family is %u, neither IPv4 nor IPv6; it is left "
                  "unmarked, and the ranks of its communicators meet over the communicator (no rendezvous)",
                  (unsigned)fam);
        return MSCX_ERR_UNSUPPORTED;
    }
    if (fam == AF_INET)
        m.addr.sin.sin_port = 0;
    else
        m.addr.sin6.sin6_port = 0;
    m.bound_ms = bound_ms;
    m.grow_from = grow_from;
    if (getrandom(m.nonce, sizeof(m.nonce), 0) != (ssize_t)sizeof(m.nonce)) {
        MSCX_INFO(MSCX_SUB_SHIM,
                  "unique id: getrandom failed (%s); the id is left unmarked, and its communicators "
                  "go to NCCL",
                  strerror(errno));
        return MSCX_ERR_SYSTEM;
    }
    if (atomic_fetch_add(&live_listeners, 1) >= MAX_LISTENERS) {
        atomic_fetch_sub(&live_listeners, 1);
        MSCX_INFO(MSCX_SUB_SHIM,
                  "unique id: %d rendezvous listeners wait already; this id is left unmarked, and its "
                  "communicators go to NCCL",
                  MAX_LISTENERS);
        return MSCX_ERR_SYSTEM;
    }
    const char *what = "socket";
    struct listener *l = calloc(1, sizeof(*l));
    int fd = socket(fam, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = m.addrlen;
    if (!l || fd < 0)
        goto fail;
    what = "bind";
    if (bind(fd, &m.addr.sa, m.addrlen) != 0)
        goto fail;
    what = "listen";
    if (listen(fd, 4096) != 0)
        goto fail;
    what = "getsockname";
    if (getsockname(fd, &m.addr.sa, &len) != 0 || len != m.addrlen)
        goto fail;
    l->fd = fd;
    l->m = m;
    addr_str(&m, l->where, sizeof(l->where));
    what = "pthread_create";
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        goto fail;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, LISTENER_STACK); /* a loop over poll: a small stack, many listeners */
    /* the thread takes no signal of the application's */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    proc_add(l);
    int rc = pthread_create(&th, &attr, serve, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        proc_remove(l);
        errno = rc;
        goto fail;
    }
    MSCX_INFO(MSCX_SUB_SHIM, "unique id: rendezvous listener at %s, bound %u ms%s", l->where, bound_ms,
              grow_from ? " (for an ncclCommGrow)" : "");
    mark_write(id, &m);
    return MSCX_OK;
fail:
    MSCX_INFO(MSCX_SUB_SHIM,
              "unique id: no rendezvous listener (%s: %s); the id is left unmarked, and its "
              "communicators go to NCCL",
              what, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(l);
    atomic_fetch_sub(&live_listeners, 1);
    return MSCX_ERR_SYSTEM;
}

/* ---- a rank's side ---- */

/* Connect to the listener by @p deadline, retrying refusals. @return the fd, -1 (error) or -2 (time). */
static int dial(const struct mark *m, uint64_t deadline)
{
    for (;;) {
        int fd = socket(m->addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return -1;
        int err = 0;
        if (connect(fd, &m->addr.sa, m->addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                int r;
                while ((r = poll(&pfd, 1, poll_ms(deadline))) == 0 && now_ms() < deadline)
                    ;
                socklen_t el = sizeof(err);
                if (r <= 0)
                    err = ETIMEDOUT;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
                    err = errno;
            }
        }
        if (err == 0)
            return fd;
        close(fd);
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN && err != ECONNRESET && err != EINTR &&
            err != ENETUNREACH && err != EHOSTUNREACH) {
            errno = err;
            return -1;
        }
        if (now_ms() + RETRY_MS >= deadline)
            return -2;
        struct timespec ts = {.tv_nsec = RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

mscx_status_t shim_rdv_gather(const ncclUniqueId *id, uint32_t rank, uint32_t nranks, const void *mine,
                              size_t bytes, void *all, struct shim_rdv_absent *absent)
{
    if (!id || !mine || nranks == 0 || rank >= nranks || bytes == 0 || bytes > MAX_RECORD ||
        (uint64_t)nranks * bytes > MAX_TABLE)
        return MSCX_ERR_INVALID_ARG;
    struct mark m;
    if (!mark_read(id, &m))
        return MSCX_ERR_UNSUPPORTED;
    uint64_t t0 = now_ms();
    uint64_t slack = m.bound_ms > ANSWER_MIN_MS ? m.bound_ms : ANSWER_MIN_MS;
    int fd = dial(&m, t0 + m.bound_ms);
    if (fd < 0) {
        mscx_status_t st = fd == -2 ? MSCX_ERR_TIMEOUT : MSCX_ERR_SYSTEM;
        char where[64];
        addr_str(&m, where, sizeof(where));
        MSCX_INFO(MSCX_SUB_SHIM, "rendezvous: rank %u/%u could not reach the listener at %s: %s", rank,
                  nranks, where, fd == -2 ? "time" : strerror(errno));
        return st;
    }
    uint8_t hello[HELLO_BYTES] = {0};
    put32(hello, MSG_MAGIC);
    put16(hello + 4, MSG_VERSION);
    put16(hello + 6, KIND_HELLO);
    memcpy(hello + 8, m.nonce, NONCE_BYTES);
    put32(hello + 24, rank);
    put32(hello + 28, nranks);
    put32(hello + 32, (uint32_t)bytes);
    uint64_t sent_by = now_ms() + slack;
    int r = xfer(fd, hello, sizeof(hello), 1, sent_by);
    if (r == 0)
        r = xfer(fd, (void *)mine, bytes, 1, sent_by);
    uint8_t head[ANSWER_BYTES];
    /* the listener answers within the bound of the first rank's arrival, which came before ours */
    uint64_t answer_by = now_ms() + m.bound_ms + slack;
    if (r == 0)
        r = xfer(fd, head, sizeof(head), 0, answer_by);
    mscx_status_t st = MSCX_ERR_SYSTEM;
    if (r == 0) {
        uint16_t kind = get16(head + 6);
        uint32_t count = get32(head + 16), n = get32(head + 20);
        if (get32(head) != MSG_MAGIC || get16(head + 4) != MSG_VERSION || get32(head + 8) != nranks ||
            get32(head + 12) != bytes || (kind != KIND_TABLE && kind != KIND_FALLBACK) ||
            (kind == KIND_FALLBACK && (n > SHIM_RDV_ABSENT_MAX || n > count || count == 0))) {
            r = -1;
        } else if (kind == KIND_TABLE) {
            if (all) {
                r = xfer(fd, all, (size_t)nranks * bytes, 0, answer_by);
            } else {
                /* a rank that does not need the others' records (it votes "fall back") */
                uint8_t sink[4096];
                for (size_t left = (size_t)nranks * bytes; r == 0 && left;) {
                    size_t k = left < sizeof(sink) ? left : sizeof(sink);
                    r = xfer(fd, sink, k, 0, answer_by);
                    left -= k;
                }
            }
            st = MSCX_OK;
        } else {
            uint8_t tail[SHIM_RDV_ABSENT_MAX * 4];
            r = xfer(fd, tail, 4 * (size_t)n, 0, answer_by);
            if (r == 0 && absent) {
                memset(absent, 0, sizeof(*absent));
                absent->count = count;
                absent->n = n;
                for (uint32_t k = 0; k < n; k++)
                    absent->rank[k] = get32(tail + 4 * k);
            }
            st = MSCX_ERR_REMOTE;
        }
    }
    close(fd);
    if (r != 0) {
        MSCX_INFO(MSCX_SUB_SHIM, "rendezvous: rank %u/%u got no valid answer (%s)", rank, nranks,
                  r == -2 ? "time" : "the listener closed or answered wrongly");
        return r == -2 ? MSCX_ERR_TIMEOUT : MSCX_ERR_SYSTEM;
    }
    return st;
}
