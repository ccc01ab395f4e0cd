/* SPDX-License-Identifier: MIT */
/*
 * TCP transport between two processes on loopback (fork), host-memory
 * buffers behind the transport ops table.
 */
#define _GNU_SOURCE /* getifaddrs */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mscx/env.h"
#include "mscx/log.h"
#include "net_pair.h"
#include "test_common.h"
#include "test_tcp_int.h"
#include "transport.h"
#include "transport_tcp_int.h"

#define BIG (64u << 20)
#define SIG_OFF 0 /* signal word in the child's sig region */
#define REAP_S 60 /* seconds the parent waits for its peer to end */

struct side {
    struct net_pair np;
    const struct mscx_transport_ops *ops;
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn *conn;
    uint8_t *buf; /* data region, BIG bytes */
    uint64_t *sig;
    struct mscx_tp_mr *mr, *sig_mr;
    struct mscx_tp_rdesc peer_buf, peer_sig;
};

/* Both ranks: endpoint, regions, descriptor exchange, connection. */
static mscx_status_t side_setup(struct side *s, uint32_t rank, int fd, size_t buf_bytes)
{
    struct mscx_tp_params p = {.rank = rank, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_rdesc mine[2], all[4];
    struct mscx_tp_conn *conns[2] = {NULL, NULL};
    uint8_t want[2] = {1, 1};

    s->np.fd = fd;
    s->np.rank = rank;
    s->ops = &mscx_tp_tcp;
    s->buf = mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    s->sig = calloc(8, sizeof(uint64_t));
    if (s->buf == MAP_FAILED || !s->sig)
        return MSCX_ERR_NO_MEMORY;
    MSCX_CHECK(s->ops->ep_create(&p, &s->ep));
    MSCX_CHECK(s->ops->mr_register(s->ep, s->buf, buf_bytes, MSCX_TP_MR_REMOTE_WRITE, -1, &s->mr, &mine[0]));
    MSCX_CHECK(s->ops->mr_register(s->ep, s->sig, 64, MSCX_TP_MR_REMOTE_WRITE, -1, &s->sig_mr, &mine[1]));
    MSCX_CHECK(net_pair_allgather(&s->np, mine, all, sizeof(mine)));
    s->peer_buf = all[2 * (1 - rank)];
    s->peer_sig = all[2 * (1 - rank) + 1];
    MSCX_CHECK(mscx_tp_connect_all(s->ops, s->ep, rank, 2, want, net_pair_allgather, &s->np,
                                   mscx_tp_deadline(10000), conns));
    s->conn = conns[1 - rank];
    return MSCX_OK;
}

static void side_teardown(struct side *s, size_t buf_bytes)
{
    s->ops->ep_destroy(s->ep);
    munmap(s->buf, buf_bytes);
    free(s->sig);
}

static const uint64_t sizes[] = {1, 7, 8, 4096, 65537, (1u << 20) + 3, BIG - 8, BIG};

/* Child of the puts test: verify each put after its signal, report one byte. */
static int child_puts(int fd)
{
    struct side s;
    if (side_setup(&s, 1, fd, BIG) != MSCX_OK)
        return 10;
    for (uint32_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t off = k & 1 ? 3 : 0, len = sizes[k] - (k & 1 ? off : 0);
        if (wait_word(s.sig, k + 1, 10000))
            return 11;
        uint8_t ok = 1;
        for (uint64_t i = 0; i < len && ok; i++)
            ok = s.buf[off + i] == pattern(i, k);
        if (net_pair_write(fd, &ok, 1) < 0)
            return 12;
    }
    /* Packet lines: {data, flag} pairs; a line with the new flag must hold its data. */
    uint32_t *lines = (uint32_t *)s.buf;
    uint64_t nlines = (4u << 20) / 8, seen = 0;
    uint64_t dl = mscx_tp_deadline(10000);
    while (seen < nlines && mscx_tp_now_ns() < dl) {
        seen = 0;
        for (uint64_t i = 0; i < nlines; i++) {
            uint64_t line = __atomic_load_n((uint64_t *)&lines[2 * i], __ATOMIC_ACQUIRE);
            uint32_t data = (uint32_t)line, flag = (uint32_t)(line >> 32);
            if (flag == 77) {
                if (data != (uint32_t)(i * 3 + 1))
                    return 13; /* torn line */
                seen++;
            }
        }
    }
    if (seen < nlines)
        return 14;
    uint8_t done = 1;
    net_pair_write(fd, &done, 1);
    net_pair_read(fd, &done, 1);
    side_teardown(&s, BIG);
    return 0;
}

START_TEST(tcp_puts_signals_flush)
{
    int fd = -1;
    pid_t pid = net_pair_fork(&fd);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_puts(fd));

    struct side s;
    ck_assert_int_eq(side_setup(&s, 0, fd, BIG), MSCX_OK);
    for (uint32_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t off = k & 1 ? 3 : 0, len = sizes[k] - (k & 1 ? off : 0);
        uint64_t loff = len + 5 <= BIG ? 5 : 0;
        for (uint64_t i = 0; i < len; i++)
            s.buf[i + loff] = pattern(i, k);
        uint64_t t0 = mscx_tp_now_ns();
        ck_assert_int_eq(s.ops->put(s.conn, s.mr, loff, &s.peer_buf, off, len, 0, mscx_tp_deadline(10000)),
                         MSCX_OK);
        ck_assert_int_eq(s.ops->signal(s.conn, &s.peer_sig, SIG_OFF, mscx_tp_deadline(10000)), MSCX_OK);
        ck_assert_int_eq(s.ops->flush(s.conn, mscx_tp_deadline(10000)), MSCX_OK);
        uint64_t t1 = mscx_tp_now_ns();
        if (len >= BIG - 8)
            fprintf(stderr, "tcp loopback: %llu bytes put+signal+flush %.1f ms, %.2f GB/s\n",
                    (unsigned long long)len, (t1 - t0) / 1e6, len / (double)(t1 - t0));
        uint8_t ok = 0;
        ck_assert_int_eq(net_pair_read(fd, &ok, 1), 0);
        ck_assert_msg(ok == 1, "child saw wrong data for size %llu", (unsigned long long)len);
    }
    ck_assert_msg(mscx_tp_tcp_short_sends(s.conn) > 0, "64 MiB puts should have needed partial sends");
    fprintf(stderr, "tcp loopback: %llu short sends\n", (unsigned long long)mscx_tp_tcp_short_sends(s.conn));

    /* Packet put of 4 MiB of LL8-style lines, reader polls concurrently. */
    uint32_t *lines = (uint32_t *)s.buf;
    for (uint64_t i = 0; i < (4u << 20) / 8; i++) {
        lines[2 * i] = (uint32_t)(i * 3 + 1);
        lines[2 * i + 1] = 77;
    }
    ck_assert_int_eq(
        s.ops->put(s.conn, s.mr, 0, &s.peer_buf, 0, 4u << 20, MSCX_TP_PUT_PACKET, mscx_tp_deadline(10000)),
        MSCX_OK);
    ck_assert_int_eq(s.ops->flush(s.conn, mscx_tp_deadline(10000)), MSCX_OK);
    uint8_t done = 0;
    ck_assert_int_eq(net_pair_read(fd, &done, 1), 0);

    /* Latency: 8-byte put + flush round trips. */
    uint64_t t0 = mscx_tp_now_ns();
    for (int i = 0; i < 2000; i++) {
        ck_assert_int_eq(s.ops->put(s.conn, s.mr, 0, &s.peer_buf, 8, 8, 0, mscx_tp_deadline(10000)), MSCX_OK);
        ck_assert_int_eq(s.ops->flush(s.conn, mscx_tp_deadline(10000)), MSCX_OK);
    }
    fprintf(stderr, "tcp loopback: 8-byte put+flush round trip %.1f us\n",
            (mscx_tp_now_ns() - t0) / 2000 / 1e3);

    /* Caller bugs are refused, not sent. */
    mscx_test_allow_warn("caller bug");
    ck_assert_int_eq(
        s.ops->put(s.conn, s.mr, 0, &s.peer_buf, 4, 16, MSCX_TP_PUT_PACKET, mscx_tp_deadline(1000)),
        MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(s.ops->put(s.conn, s.mr, 0, &s.peer_buf, BIG - 8, 16, 0, mscx_tp_deadline(1000)),
                     MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(s.ops->signal(s.conn, &s.peer_sig, 4, mscx_tp_deadline(1000)), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(s.ops->flush(s.conn, mscx_tp_deadline(10000)), MSCX_OK);

    net_pair_write(fd, &done, 1);
    ck_assert_int_eq(net_pair_reap(pid, REAP_S), 0);
    side_teardown(&s, BIG);
    close(fd);
}
END_TEST

/* Child: receive until the middle of the first big put has landed, then die. */
static int child_die_mid_transfer(int fd)
{
    struct side s;
    if (side_setup(&s, 1, fd, BIG) != MSCX_OK)
        return 10;
    volatile uint8_t *mid = s.buf + BIG / 2;
    while (*mid == 0)
        ;
    raise(SIGKILL);
    return 0;
}

START_TEST(tcp_peer_killed_mid_transfer)
{
    int fd = -1;
    pid_t pid = net_pair_fork(&fd);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_die_mid_transfer(fd));

    struct side s;
    ck_assert_int_eq(side_setup(&s, 0, fd, BIG), MSCX_OK);
    memset(s.buf, 0xab, BIG);
    mscx_test_allow_warn("failed");
    mscx_status_t st = MSCX_OK;
    uint64_t t0 = mscx_tp_now_ns(), deadline = mscx_tp_deadline(5000);
    for (int i = 0; i < 64 && st == MSCX_OK; i++) {
        st = s.ops->put(s.conn, s.mr, 0, &s.peer_buf, 0, BIG, 0, deadline);
        if (st == MSCX_OK)
            st = s.ops->flush(s.conn, deadline);
    }
    double ms = (mscx_tp_now_ns() - t0) / 1e6;
    fprintf(stderr, "tcp: peer killed mid-transfer, survivor got \"%s\" after %.1f ms\n", mscx_status_str(st),
            ms);
    ck_assert_int_eq(st, MSCX_ERR_REMOTE);
    ck_assert(ms < 5000);
    ck_assert_int_eq(s.ops->progress(s.ep), MSCX_ERR_REMOTE);
    ck_assert_int_eq(s.ops->flush(s.conn, mscx_tp_deadline(1000)), MSCX_ERR_REMOTE);
    ck_assert_int_eq(net_pair_reap(pid, REAP_S), 128 + SIGKILL);
    side_teardown(&s, BIG);
    close(fd);
}
END_TEST

/* Child: connect, then die while the parent only waits (receiver side). */
START_TEST(tcp_peer_killed_while_idle)
{
    int fd = -1;
    pid_t pid = net_pair_fork(&fd);
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct side s;
        if (side_setup(&s, 1, fd, 1 << 16) != MSCX_OK)
            _exit(10);
        raise(SIGKILL);
    }
    struct side s;
    mscx_test_allow_warn("peer closed"); /* the child may die before setup returns here */
    ck_assert_int_eq(side_setup(&s, 0, fd, 1 << 16), MSCX_OK);
    uint64_t dl = mscx_tp_deadline(5000);
    mscx_status_t st;
    while ((st = s.ops->progress(s.ep)) == MSCX_OK && mscx_tp_now_ns() < dl)
        usleep(1000);
    ck_assert_int_eq(st, MSCX_ERR_REMOTE);
    ck_assert_int_eq(net_pair_reap(pid, REAP_S), 128 + SIGKILL);
    side_teardown(&s, 1 << 16);
    close(fd);
}
END_TEST

/* The TCP hello (transport_tcp_connect.c): the label (magic .. comm) and the secret. */
struct raw_hello_msg {
    uint64_t magic;
    uint32_t version, src, dst, reserved;
    uint64_t comm;
    uint8_t secret[MSCX_TP_SECRET_BYTES];
};
#define HELLO_LABEL_BYTES 32 /* the hello without its secret */

static const uint8_t secret_a[MSCX_TP_SECRET_BYTES] = {0x5c, 1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                                       11,   12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                                       22,   23, 24, 25, 26, 27, 28, 29, 30, 31};

/* A connection to the listener of the tcp blob @p blob (magic, comm_id, version, rank, addr, port). */
static int dial_blob(const uint8_t *blob)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    memcpy(&sa.sin_addr.s_addr, blob + 24, 4);
    memcpy(&sa.sin_port, blob + 28, 2);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void write_hello(int fd, uint64_t magic, uint64_t comm, uint32_t src, uint32_t dst,
                        const uint8_t *secret, size_t bytes)
{
    struct raw_hello_msg h = {magic, MSCX_TP_PROTO_VERSION, src, dst, 0, comm, {0}};
    memcpy(h.secret, secret, sizeof(h.secret));
    ck_assert_int_eq(write(fd, &h, bytes), (ssize_t)bytes);
}

/* Send a raw hello to an endpoint's listener; returns the ack status (-1: closed without one). */
static int raw_hello(const uint8_t *blob, uint64_t magic, uint64_t comm, uint32_t src, uint32_t dst,
                     size_t bytes)
{
    int fd = dial_blob(blob);
    write_hello(fd, magic, comm, src, dst, secret_a, bytes);
    if (bytes < sizeof(struct raw_hello_msg))
        shutdown(fd, SHUT_WR);
    struct {
        uint64_t magic;
        uint32_t status, reserved;
    } ack;
    int r = net_pair_read(fd, &ack, sizeof(ack)) == 0 ? (int)ack.status : -1;
    char c;
    if (r != 0)
        ck_assert_int_eq(read(fd, &c, 1), 0); /* refused: the endpoint closed it */
    close(fd);
    return r;
}

START_TEST(tcp_bad_handshake)
{
    struct mscx_tp_params p1 = {.rank = 1, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_params p0 = {.rank = 0, .nranks = 2, .comm_id = COMM_ID + 1};
    memcpy(p1.secret, secret_a, sizeof(p1.secret));
    memcpy(p0.secret, secret_a, sizeof(p0.secret));
    struct mscx_tp_ep *ep1, *ep0;
    struct mscx_tp_conn *c1, *c0;
    uint8_t blob1[MSCX_TP_BLOB_BYTES], blob0[MSCX_TP_BLOB_BYTES];

    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p1, &ep1), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep1, 0, blob1, &c1), MSCX_OK);

    /* every refusal is logged with its reason; one address is one stranger: at most one WARN for it */
    mscx_test_allow_warn("refused connection");
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG", "INFO"), MSCX_OK);
    ck_assert_int_eq(raw_hello(blob1, 0xdeadbeefull, COMM_ID, 0, 1, 64), 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "bad magic 0xdeadbeef"), "got: %s", mscx_test_last_log());
    ck_assert_int_eq(raw_hello(blob1, MSCX_TP_MAGIC, COMM_ID + 1, 0, 1, 64), 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "communicator id"), "got: %s", mscx_test_last_log());
    ck_assert_int_eq(raw_hello(blob1, MSCX_TP_MAGIC, COMM_ID, 0, 0, 64), 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "not expected"), "got: %s", mscx_test_last_log());
    ck_assert_int_eq(raw_hello(blob1, MSCX_TP_MAGIC, COMM_ID, 0, 1, 5), 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "no handshake"), "got: %s", mscx_test_last_log());
    ck_assert_int_le(mscx_test_warn_count(), 1);
    mscx_config_reset();

    /* A peer of another communicator: its blob is refused before connecting. */
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p0, &ep0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep0, 1, blob0, &c0), MSCX_OK);
    mscx_test_allow_warn("refused peer");
    ck_assert_int_eq(mscx_tp_tcp.conn_establish(c1, blob0, mscx_tp_deadline(2000)), MSCX_ERR_REMOTE);
    ck_assert_int_eq(mscx_tp_tcp.conn_establish(c0, blob1, mscx_tp_deadline(2000)), MSCX_ERR_REMOTE);

    /* After the refusals a correct hello is still accepted (then dropped without a bye). */
    mscx_test_allow_warn("peer closed");
    ck_assert_int_eq(raw_hello(blob1, MSCX_TP_MAGIC, COMM_ID, 0, 1, 64), 0);
    mscx_tp_tcp.ep_destroy(ep0);
    mscx_tp_tcp.ep_destroy(ep1);
}
END_TEST

struct pair_arg {
    struct mscx_tp_conn *c;
    const uint8_t *blob;
    mscx_status_t st;
};

static void *pair_establish(void *arg)
{
    struct pair_arg *e = arg;
    e->st = mscx_tp_tcp.conn_establish(e->c, e->blob, mscx_tp_deadline(10000));
    return NULL;
}

/*
 * Milliseconds until the endpoint ended the connection @p fd (EOF, after a
 * refusal or without one), or -1 when it was still open after @p ms.
 * *status_p: the refusal's status, -1 without one.
 */
static int ended_within(int fd, int ms, int *status_p)
{
    uint64_t t0 = mscx_tp_now_ns(), dl = mscx_tp_deadline((uint64_t)ms);
    uint8_t buf[16];
    size_t got = 0;
    *status_p = -1;
    while (mscx_tp_now_ns() < dl) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) != 1)
            continue;
        ssize_t n = read(fd, buf + got, sizeof(buf) - got);
        if (n > 0) {
            got += (size_t)n;
            if (got == sizeof(buf)) {
                uint32_t st;
                memcpy(&st, buf + 8, 4);
                *status_p = (int)st;
            }
            continue;
        }
        return (int)((mscx_tp_now_ns() - t0) / 1000000);
    }
    return -1;
}

/*
 * Strangers at rank 0's listener before the real rank 1 connects, all
 * claiming to be rank 1: one with a wrong secret, one with a zero secret,
 * one with the right label (communicator id, ranks) but no secret, and one
 * that sends nothing. The first two are refused at once, the last two closed
 * after TCP_HANDSHAKE_TIMEOUT_MS; none takes rank 1's place or holds up the
 * real connection, and data then flows between the real ranks. A late claim
 * of the taken slot, with the right secret, is refused.
 */
START_TEST(tcp_strangers_during_setup)
{
    struct mscx_tp_params p0 = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_params p1 = {.rank = 1, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_ep *ep0, *ep1;
    struct mscx_tp_conn *c0, *c1;
    uint8_t blob0[MSCX_TP_BLOB_BYTES], blob1[MSCX_TP_BLOB_BYTES], wrong[MSCX_TP_SECRET_BYTES],
        zero[MSCX_TP_SECRET_BYTES] = {0};
    memcpy(p0.secret, secret_a, sizeof(p0.secret));
    memcpy(p1.secret, secret_a, sizeof(p1.secret));
    memcpy(wrong, secret_a, sizeof(wrong));
    wrong[MSCX_TP_SECRET_BYTES - 1] ^= 1; /* differs in the last byte only */

    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p0, &ep0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p1, &ep1), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep0, 1, blob0, &c0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep1, 0, blob1, &c1), MSCX_OK);
    mscx_test_allow_warn("refused connection");
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG", "INFO"), MSCX_OK); /* repeated refusals are INFO */

    int silent = dial_blob(blob0), label = dial_blob(blob0), bad = dial_blob(blob0), nul = dial_blob(blob0);
    uint64_t t0 = mscx_tp_now_ns();
    write_hello(label, MSCX_TP_MAGIC, COMM_ID, 1, 0, zero, HELLO_LABEL_BYTES);
    write_hello(bad, MSCX_TP_MAGIC, COMM_ID, 1, 0, wrong, sizeof(struct raw_hello_msg));
    write_hello(nul, MSCX_TP_MAGIC, COMM_ID, 1, 0, zero, sizeof(struct raw_hello_msg));
    int st = 0;
    ck_assert_int_ge(ended_within(bad, 2000, &st), 0);
    ck_assert_int_eq(st, 1);
    ck_assert_int_ge(ended_within(nul, 2000, &st), 0);
    ck_assert_int_eq(st, 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "wrong communicator secret"), "got: %s", mscx_test_last_log());

    /* The real ranks connect while the silent strangers still hold their sockets. */
    pthread_t thr;
    struct pair_arg e1 = {c1, blob0, MSCX_ERR_INTERNAL};
    ck_assert_int_eq(pthread_create(&thr, NULL, pair_establish, &e1), 0);
    mscx_status_t st0 = mscx_tp_tcp.conn_establish(c0, blob1, mscx_tp_deadline(10000));
    pthread_join(thr, NULL);
    ck_assert_int_eq(st0, MSCX_OK);
    ck_assert_int_eq(e1.st, MSCX_OK);
    double ms = (mscx_tp_now_ns() - t0) / 1e6;
    ck_assert_msg(ms < 1000, "the real connection took %.0f ms beside the strangers", ms);

    /* Data from rank 0 to rank 1. */
    uint8_t src[4096], dst[4096] = {0};
    uint64_t sig = 0;
    struct mscx_tp_mr *lmr, *dmr, *smr;
    struct mscx_tp_rdesc ld, dd, sd;
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = pattern(i, 9);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(ep0, src, sizeof(src), 0, -1, &lmr, &ld), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(ep1, dst, sizeof(dst), MSCX_TP_MR_REMOTE_WRITE, -1, &dmr, &dd),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(ep1, &sig, 8, MSCX_TP_MR_REMOTE_WRITE, -1, &smr, &sd), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.put(c0, lmr, 0, &dd, 0, sizeof(src), 0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.signal(c0, &sd, 0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.flush(c0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(wait_word(&sig, 1, 5000), 0);
    ck_assert_int_eq(memcmp(src, dst, sizeof(src)), 0);

    /* Rank 1's slot is taken: the right secret does not take it again. */
    ck_assert_int_eq(raw_hello(blob0, MSCX_TP_MAGIC, COMM_ID, 1, 0, sizeof(struct raw_hello_msg)), 1);
    ck_assert_msg(strstr(mscx_test_last_log(), "not expected"), "got: %s", mscx_test_last_log());

    /* The silent and the label-only stranger: closed once their handshake time is up, not before. */
    int waited = ended_within(silent, TCP_HANDSHAKE_TIMEOUT_MS + 2000, &st);
    ms = (mscx_tp_now_ns() - t0) / 1e6;
    ck_assert_int_ge(waited, 0);
    ck_assert_msg(ms >= TCP_HANDSHAKE_TIMEOUT_MS - 100 && ms < TCP_HANDSHAKE_TIMEOUT_MS + 1500,
                  "silent stranger closed after %.0f ms", ms);
    ck_assert_int_ge(ended_within(label, 1500, &st), 0);
    ck_assert_int_eq(mscx_tp_tcp.progress(ep0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.progress(ep1), MSCX_OK);
    close(silent);
    close(label);
    close(bad);
    close(nul);
    mscx_tp_tcp.mr_deregister(ep0, lmr);
    mscx_tp_tcp.mr_deregister(ep1, dmr);
    mscx_tp_tcp.mr_deregister(ep1, smr);
    mscx_tp_tcp.ep_destroy(ep0);
    mscx_tp_tcp.ep_destroy(ep1);
    mscx_config_reset();
}
END_TEST

/*
 * A hand-driven peer 1 for an endpoint of rank 0, to close the two streams in
 * an order a real peer produces only by chance: its data stream (ep's in
 * socket) is a connection we make, its ack stream (ep's out socket) one we
 * accept. The accept side runs in a thread (conn_establish waits for our ack).
 */
struct fake_peer {
    int lfd;       /* our listener, in the blob given to the endpoint */
    int ack_fd;    /* accepted: the endpoint sends on it, we would answer flushes */
    int data_fd;   /* connected to the endpoint: we would send on it */
    int eat_flush; /* thread: after the handshake, read one message, then close ack_fd */
    int ok;
};

static void *fake_peer_accept(void *arg)
{
    struct fake_peer *f = arg;
    struct pollfd pfd = {.fd = f->lfd, .events = POLLIN};
    uint8_t hello[64], msg[32];
    struct {
        uint64_t magic;
        uint32_t status, reserved;
    } ack = {MSCX_TP_MAGIC, 0, 0};
    if (poll(&pfd, 1, 5000) != 1 || (f->ack_fd = accept(f->lfd, NULL, NULL)) < 0)
        return NULL;
    if (proc_mesh_read(f->ack_fd, hello, sizeof(hello), 5000) || net_pair_write(f->ack_fd, &ack, sizeof(ack)))
        return NULL;
    if (f->eat_flush) {
        if (proc_mesh_read(f->ack_fd, msg, sizeof(msg), 5000))
            return NULL;
        close(f->ack_fd);
        f->ack_fd = -1;
    }
    f->ok = 1;
    return NULL;
}

/* Endpoint of rank 0 connected to a fake peer 1; the thread is still running on return. */
static void fake_peer_connect(struct fake_peer *f, struct mscx_tp_ep **ep_p, struct mscx_tp_conn **c_p,
                              pthread_t *thr)
{
    struct mscx_tp_params p = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    uint8_t blob0[MSCX_TP_BLOB_BYTES], blob1[MSCX_TP_BLOB_BYTES] = {0};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);

    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p, ep_p), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(*ep_p, 1, blob0, c_p), MSCX_OK);

    /* Our data stream: hello as rank 1 to the endpoint's listener. */
    memcpy(&sa.sin_addr.s_addr, blob0 + 24, 4);
    memcpy(&sa.sin_port, blob0 + 28, 2);
    f->data_fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(f->data_fd, 0);
    ck_assert_int_eq(connect(f->data_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    struct raw_hello_msg h = {MSCX_TP_MAGIC, MSCX_TP_PROTO_VERSION, 1, 0, 0, COMM_ID, {0}};
    uint8_t ack[16];
    ck_assert_int_eq(net_pair_write(f->data_fd, &h, sizeof(h)), 0);
    ck_assert_int_eq(proc_mesh_read(f->data_fd, ack, sizeof(ack), 5000), 0);

    /* Our listener, in a tcp blob (transport_tcp_connect.c): magic, comm_id, version, rank, addr, port. */
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_port = 0;
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(f->lfd, 4), 0);
    ck_assert_int_eq(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
    uint64_t magic = MSCX_TP_MAGIC, comm = COMM_ID;
    uint32_t version = MSCX_TP_PROTO_VERSION, rank = 1;
    memcpy(blob1, &magic, 8);
    memcpy(blob1 + 8, &comm, 8);
    memcpy(blob1 + 16, &version, 4);
    memcpy(blob1 + 20, &rank, 4);
    memcpy(blob1 + 24, &sa.sin_addr.s_addr, 4);
    memcpy(blob1 + 28, &sa.sin_port, 2);

    f->ack_fd = -1;
    ck_assert_int_eq(pthread_create(thr, NULL, fake_peer_accept, f), 0);
    ck_assert_int_eq(mscx_tp_tcp.conn_establish(*c_p, blob1, mscx_tp_deadline(5000)), MSCX_OK);
}

/* Poll the endpoint until its connection fails (at most 5 s); returns the status, the time in *ms_p. */
static mscx_status_t wait_failed(struct mscx_tp_ep *ep, double *ms_p)
{
    uint64_t t0 = mscx_tp_now_ns(), dl = mscx_tp_deadline(5000);
    mscx_status_t st;
    while ((st = mscx_tp_tcp.progress(ep)) == MSCX_OK && mscx_tp_now_ns() < dl)
        usleep(1000);
    *ms_p = (mscx_tp_now_ns() - t0) / 1e6;
    return st;
}

/*
 * Orderly close whose bye arrives after the end of the other stream (what a
 * busy machine produced now and then at the end of the puts test): no WARN.
 * The same end of the ack stream followed by the end of the data stream
 * without a bye, or by nothing, or while a flush waits for its ack, is a
 * failure and logged.
 */
START_TEST(tcp_close_streams_out_of_order)
{
    enum { BYE_LATE, DATA_EOF, DATA_OPEN, FLUSH_OWED, NCASES };
    static const char *name[] = {"bye after the ack stream's end", "data stream ends without a bye",
                                 "data stream stays open", "flush owed an ack"};
    for (int k = 0; k < NCASES; k++) {
        struct fake_peer f = {.eat_flush = k == FLUSH_OWED};
        struct mscx_tp_ep *ep;
        struct mscx_tp_conn *c;
        pthread_t thr;
        double ms = 0;
        mscx_status_t st;
        int warns = mscx_test_warn_count();

        fake_peer_connect(&f, &ep, &c, &thr);
        if (k == FLUSH_OWED) {
            mscx_test_allow_warn("peer closed with a flush unanswered");
            uint64_t t0 = mscx_tp_now_ns();
            st = mscx_tp_tcp.flush(c, mscx_tp_deadline(5000));
            ms = (mscx_tp_now_ns() - t0) / 1e6;
            ck_assert_int_eq(pthread_join(thr, NULL), 0);
            ck_assert(f.ok);
            ck_assert_int_eq(st, MSCX_ERR_REMOTE);
            ck_assert_msg(ms < 1000, "flush took %.1f ms to fail", ms); /* not after the grace time */
        } else {
            ck_assert_int_eq(pthread_join(thr, NULL), 0);
            ck_assert(f.ok);
            close(f.ack_fd);
            f.ack_fd = -1;
            usleep(300000); /* the receiver has seen the end of the ack stream by now */
            ck_assert_int_eq(mscx_tp_tcp.progress(ep), MSCX_OK);
            if (k == BYE_LATE) {
                uint8_t bye[32] = {5}; /* MSG_BYE, little-endian type word */
                ck_assert_int_eq(net_pair_write(f.data_fd, bye, sizeof(bye)), 0);
                close(f.data_fd);
                f.data_fd = -1;
            } else if (k == DATA_EOF) {
                mscx_test_allow_warn("failed: peer closed");
                close(f.data_fd);
                f.data_fd = -1;
            } else {
                mscx_test_allow_warn("neither said bye nor closed the data stream");
            }
            st = wait_failed(ep, &ms);
            ck_assert_int_eq(st, MSCX_ERR_REMOTE);
            ck_assert_int_eq(mscx_tp_tcp.flush(c, mscx_tp_deadline(1000)), MSCX_ERR_REMOTE);
        }
        fprintf(stderr, "tcp: %s: \"%s\" after %.1f ms, %d warning(s)\n", name[k], mscx_status_str(st), ms,
                mscx_test_warn_count() - warns);
        if (k == BYE_LATE)
            ck_assert_msg(mscx_test_warn_count() == warns, "orderly close logged: %s", mscx_test_last_warn());
        else
            ck_assert_int_eq(mscx_test_warn_count(), warns + 1);
        if (k == DATA_OPEN)
            ck_assert_msg(ms > 1000, "failed after %.1f ms, before the grace time", ms);
        mscx_tp_tcp.ep_destroy(ep);
        if (f.data_fd >= 0)
            close(f.data_fd);
        if (f.ack_fd >= 0)
            close(f.ack_fd);
        close(f.lfd);
    }
}
END_TEST

/* Two endpoints of this process on the chosen address; a put and a flush from ep0 to ep1. */
static void put_over_default_addr(const char *want_addr)
{
    struct mscx_tp_params p0 = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_params p1 = {.rank = 1, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_ep *ep0, *ep1;
    struct mscx_tp_conn *c0, *c1;
    struct mscx_tp_mr *m0, *m1;
    struct mscx_tp_rdesc d0, d1;
    uint8_t b0[MSCX_TP_BLOB_BYTES], b1[MSCX_TP_BLOB_BYTES];
    static uint8_t src[4096], dst[4096];
    struct in_addr want, got;

    ck_assert_int_eq(inet_pton(AF_INET, want_addr, &want), 1);
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p0, &ep0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p1, &ep1), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(ep0, src, sizeof(src), 0, -1, &m0, &d0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(ep1, dst, sizeof(dst), MSCX_TP_MR_REMOTE_WRITE, -1, &m1, &d1),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep0, 1, b0, &c0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(ep1, 0, b1, &c1), MSCX_OK);
    /* tcp blob (transport_tcp_connect.c): magic, comm_id, version, rank, addr (network order), port */
    memcpy(&got.s_addr, b0 + 24, 4);
    ck_assert_msg(got.s_addr == want.s_addr, "blob advertises %s, expected %s", inet_ntoa(got), want_addr);
    struct est_arg e1 = {c1, b0, MSCX_ERR_INTERNAL};
    pthread_t thr;
    ck_assert_int_eq(pthread_create(&thr, NULL, establish_thread, &e1), 0);
    mscx_status_t st0 = mscx_tp_tcp.conn_establish(c0, b1, mscx_tp_deadline(5000));
    pthread_join(thr, NULL);
    ck_assert_int_eq(st0, MSCX_OK);
    ck_assert_int_eq(e1.st, MSCX_OK);
    for (unsigned i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 3 + 1);
    ck_assert_int_eq(mscx_tp_tcp.put(c0, m0, 0, &d1, 0, sizeof(src), 0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.flush(c0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(memcmp(src, dst, sizeof(src)), 0);
    mscx_tp_tcp.ep_destroy(ep0);
    mscx_tp_tcp.ep_destroy(ep1);
}

START_TEST(tcp_socket_ifname)
{
    char addr[MSCX_TP_ADDR_LEN], ifname[MSCX_TP_IFNAME_LEN];
    struct mscx_tp_params p = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_ep *ep;

    /* explicit loopback (what every other test of this file runs on) */
    ck_assert_int_eq(mscx_config_override("MSCX_SOCKET_IFNAME", "lo"), MSCX_OK);
    ck_assert_int_eq(mscx_tp_socket_addr(addr, ifname), MSCX_OK);
    ck_assert_str_eq(addr, "127.0.0.1");
    ck_assert_str_eq(ifname, "lo");
    put_over_default_addr("127.0.0.1");

    /* no such interface: an error naming the variable, from the endpoint too */
    ck_assert_int_eq(mscx_config_override("MSCX_SOCKET_IFNAME", "mscx_bogus0"), MSCX_OK);
    mscx_test_allow_warn("MSCX_SOCKET_IFNAME names mscx_bogus0");
    strcpy(addr, "untouched");
    ck_assert_int_eq(mscx_tp_socket_addr(addr, ifname), MSCX_ERR_INVALID_ARG);
    ck_assert_str_eq(addr, "untouched");
    ck_assert_msg(strstr(mscx_test_last_warn(), "MSCX_SOCKET_IFNAME") &&
                      strstr(mscx_test_last_warn(), "no such interface"),
                  "got: %s", mscx_test_last_warn());
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p, &ep), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_test_warn_count(), 2);

    /* default: the first non-loopback interface that is up with an IPv4 address, when there is one */
    ck_assert_int_eq(mscx_config_override("MSCX_SOCKET_IFNAME", NULL), MSCX_OK);
    ck_assert_int_eq(mscx_tp_socket_addr(addr, ifname), MSCX_OK);
    struct ifaddrs *list = NULL, *a;
    char first[MSCX_TP_ADDR_LEN] = "";
    ck_assert_int_eq(getifaddrs(&list), 0);
    for (a = list; a; a = a->ifa_next)
        if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && (a->ifa_flags & IFF_UP) &&
            (a->ifa_flags & IFF_RUNNING) && !(a->ifa_flags & IFF_LOOPBACK)) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, first, sizeof(first));
            break;
        }
    if (a) {
        ck_assert_str_eq(ifname, a->ifa_name);
        ck_assert_str_eq(addr, first);
        ck_assert_str_ne(addr, "127.0.0.1");
        fprintf(stderr, "default interface %s address %s\n", ifname, addr);
        freeifaddrs(list);
        put_over_default_addr(first);
    } else {
        freeifaddrs(list);
        ck_assert_str_eq(addr, "127.0.0.1");
        fprintf(stderr,
                "SKIP (check only): no non-loopback interface with an IPv4 address is up here, so the "
                "default non-loopback choice was not tested; the loopback fallback was\n");
    }
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("net-tcp");
    TCase *tc = mscx_tcase("tcp");
    /* Every other test listens on loopback, chosen explicitly (the forked tests inherit the override). */
    if (mscx_config_override("MSCX_SOCKET_IFNAME", "lo") != MSCX_OK)
        exit(1);
    tcase_add_test(tc, tcp_socket_ifname);
    tcase_add_test(tc, tcp_puts_signals_flush);
    tcase_add_test(tc, tcp_peer_killed_mid_transfer);
    tcase_add_test(tc, tcp_peer_killed_while_idle);
    tcase_add_test(tc, tcp_bad_handshake);
    tcase_add_test(tc, tcp_strangers_during_setup);
    tcase_add_test(tc, tcp_close_streams_out_of_order);
    tcp_add_late_put_cases(tc);
    suite_add_tcase(s, tc);
    return s;
}
