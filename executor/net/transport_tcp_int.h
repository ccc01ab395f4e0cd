/* SPDX-License-Identifier: MIT */
/*
 * Private interface between the TCP transport's files: transport_tcp.c (the
 * endpoint, memory registration, the ops table), transport_tcp_connect.c
 * (the handshake: connecting and accepting) and transport_tcp_data.c (the
 * data path: the caller's sends and the receiver thread).
 */
#ifndef MSCX_TRANSPORT_TCP_INT_H
#define MSCX_TRANSPORT_TCP_INT_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define TCP_STAGE_BYTES (1u << 20)
/* After the peer closed our ack stream, how long its data stream may take to
 * bring the bye (orderly close) or its own end (the peer died). */
#define TCP_CLOSE_GRACE_MS 2000

enum tcp_msg_type {
    MSG_PUT = 1,
    MSG_SIGNAL = 2,
    MSG_FLUSH = 3,
    MSG_FLUSH_ACK = 4,
    MSG_BYE = 5,
    MSG_PUT_LATE = 6
};

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
    char *rx_dst;         /* where the payload of the current put goes */
    unsigned rx_mr_flags; /* the target's MSCX_TP_MR_* (for copy_to_target) */
    int rx_stalled;       /* a late put waits for its target (the in socket is not read meanwhile) */
    uint64_t rx_stall_ns; /* since when */
    uint64_t rx_done;     /* payload bytes applied */
    size_t rx_have;       /* payload bytes staged, not yet applied (< 8 between reads for packets) */
    void *stage;
    /* receiver-thread state of the ack stream */
    struct tcp_msg ack;
    size_t ack_got;
    int ack_closed;         /* the peer closed the ack stream; the data stream decides why */
    uint64_t ack_closed_ns; /* when */
};

/*
 * An accepted connection whose hello has not arrived in full: it claims no
 * rank until the hello proves the secret. Receiver thread only.
 */
#define TCP_HANDSHAKE_TIMEOUT_MS 5000 /* a connection silent longer than this is closed */
#define TCP_MAX_PENDING 16            /* handshakes in progress at once; a new one evicts the oldest */
#define TCP_HELLO_BYTES 64

struct tcp_pending {
    int fd;
    uint64_t deadline_ns;
    size_t got;
    unsigned char hello[TCP_HELLO_BYTES];
    char who[64];
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
    uint64_t gen;                /* receiver poll rounds finished */
    struct mscx_tp_conn **conns; /* [nranks] */
    struct mscx_tp_mr **mrs;     /* by id */
    uint32_t nmr, cap;
    struct tcp_pending pend[TCP_MAX_PENDING]; /* receiver thread; closed at destroy */
    unsigned npend;
};

static inline mscx_status_t mscx_tcp_conn_err(struct mscx_tp_conn *c)
{
    return __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
}

/* ---- helpers (transport_tcp.c) ---- */

int mscx_tcp_set_nonblock(int fd);
/* Milliseconds until @p deadline_ns, at most @p cap_ms; 0 once it has passed. */
int mscx_tcp_ms_left(uint64_t deadline_ns, int cap_ms);
/* Mark a connection failed (first error wins, logged once); ep->lock held. */
void mscx_tcp_conn_fail_locked(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err);
void mscx_tcp_conn_fail(struct mscx_tp_conn *c, mscx_status_t st, const char *why, int err);
/* Send all of buf on a non-blocking socket before the deadline (caller thread). */
mscx_status_t mscx_tcp_send_all(struct mscx_tp_conn *c, int fd, const void *buf, size_t len, int more,
                                uint64_t deadline_ns);
/* Wake the receiver thread out of its poll. */
void mscx_tcp_wake(struct mscx_tp_ep *ep);

/* ---- the handshake (transport_tcp_connect.c) ---- */

/* Accept one connection and check its hello; refusals are logged and closed (receiver thread). */
void mscx_tcp_accept(struct mscx_tp_ep *ep);
/* The handshakes in progress into @p pfd (POLLIN); @return how many. Receiver thread. */
nfds_t mscx_tcp_pending_fill(const struct mscx_tp_ep *ep, struct pollfd *pfd);
/* Read what the handshakes in progress sent; finish, refuse or time out each. Receiver thread. */
void mscx_tcp_pending_serve(struct mscx_tp_ep *ep);
/* Close every handshake in progress (destroy, after the receiver thread ended). */
void mscx_tcp_pending_close(struct mscx_tp_ep *ep);
mscx_status_t mscx_tcp_conn_prepare(struct mscx_tp_ep *ep, uint32_t peer, void *blob,
                                    struct mscx_tp_conn **conn_p);
mscx_status_t mscx_tcp_conn_establish(struct mscx_tp_conn *c, const void *peer_blob, uint64_t deadline_ns);

/* ---- the data path (transport_tcp_data.c) ---- */

/* The endpoint's receiver thread (@p arg: the endpoint). */
void *mscx_tcp_rx_thread(void *arg);
mscx_status_t mscx_tcp_put(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                           const struct mscx_tp_rdesc *rd, uint64_t roff, uint64_t len, unsigned flags,
                           uint64_t deadline_ns);
mscx_status_t mscx_tcp_put_late(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                                const struct mscx_tp_rdesc *rd, uint32_t buf, uint32_t launch, uint64_t roff,
                                uint64_t len, unsigned flags, uint64_t deadline_ns);
mscx_status_t mscx_tcp_signal(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                              uint64_t deadline_ns);
mscx_status_t mscx_tcp_flush(struct mscx_tp_conn *c, uint64_t deadline_ns);
mscx_status_t mscx_tcp_progress(struct mscx_tp_ep *ep);

#endif /* MSCX_TRANSPORT_TCP_INT_H */
