/* SPDX-License-Identifier: MIT */
/*
 * The CPU proxy of port channels: the net module's interface to the GPU
 * runtime, which attaches request queues and links to it. One thread per
 * process serves every attached request queue (one per GPU plan context with
 * a port channel to another process), in position order per queue, and
 * executes requests through a link per channel:
 *  - a "cuda" link (gpu/runtime/cuda_link.c): same host, copies on a proxy-owned stream
 *    into IPC-mapped peer memory;
 *  - a network link (proxy_tcp.c): the TCP or RDMA transport of transport.h to a
 *    peer on another node, with a staging hook that copies the GPU source
 *    into a registered host bounce buffer.
 * Pure C without CUDA, so the unit suite runs it on host memory.
 */
#ifndef MSCX_PROXY_H
#define MSCX_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include "mscx/status.h"
#include "port_fifo.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The destination of a put into a peer's input or output buffer (port_fifo.h, MSCX_PREQ_F_USER_*). */
struct mscx_puser {
    uint32_t buf;    /* enum mscx_buf_type: MSCX_BUF_INPUT or MSCX_BUF_OUTPUT */
    uint32_t launch; /* the launch flag whose buffer it is */
    uint64_t off;    /* byte offset in that buffer */
    uint64_t addr;   /* non-zero: the address of that byte, the peer's buffer mapped in this process */
};

/**
 * How a link moves data for one port channel. Every call returns MSCX_OK or
 * an error it has logged. Calls come from the proxy thread only.
 */
struct mscx_plink_ops {
    const char *name;
    /** Issue a put of @p len bytes from @p src to the peer's scratch + @p dst_off (in issue order). */
    mscx_status_t (*put)(void *link, const void *src, uint64_t dst_off, uint64_t len, unsigned tp_flags,
                         uint64_t deadline_ns);
    /** +1 on the peer's inbound token of the paired channel, after every earlier put of the link landed. */
    mscx_status_t (*signal)(void *link, uint64_t deadline_ns);
    /** Block until everything issued is complete: at the peer, or with @p local only every source read. */
    mscx_status_t (*flush)(void *link, int local, uint64_t deadline_ns);
    /** Non-blocking health check (a dead peer); NULL when the link cannot tell. */
    mscx_status_t (*check)(void *link);
    /**
     * Issue a put of @p len bytes from @p src into the peer's user buffer @p dst (in issue order with
     * the other calls). NULL: the link cannot (the request fails as an internal bug: add_plan refuses).
     */
    mscx_status_t (*put_user)(void *link, const void *src, const struct mscx_puser *dst, uint64_t len,
                              uint64_t deadline_ns);
};

/** One port channel of a queue. */
struct mscx_pchan {
    const struct mscx_plink_ops *ops; /* NULL: the channel is not served by the proxy */
    void *link;
    uint32_t peer;      /* for messages */
    uint64_t dst_bytes; /* the peer's scratch bytes: puts beyond are refused */
};

/** What a queue is attached with. Copied (the channel table too). */
struct mscx_pqueue_desc {
    struct mscx_pfifo *fifo; /* host view */
    uint32_t nchan;
    const struct mscx_pchan *chan;
    uint32_t rank;
    const char *name;    /* plan name, for messages (copied) */
    uint64_t timeout_ms; /* per blocking call; 0: never */
    /* Record @p st as the owner's error and make its kernel give up (mapped abort word). */
    void (*fail)(void *ctx, mscx_status_t st);
    void *ctx;
};

struct mscx_pqueue;

/** Attach a queue; starts the process's proxy thread on the first one. */
mscx_status_t mscx_proxy_attach(const struct mscx_pqueue_desc *d, struct mscx_pqueue **q_p);
/** Detach (the proxy no longer touches the FIFO or the links after this returns); stops the thread after the
 * last. */
void mscx_proxy_detach(struct mscx_pqueue *q);
/** First error of the queue (MSCX_OK while healthy). */
mscx_status_t mscx_pqueue_status(const struct mscx_pqueue *q);
/** Describe the queue's state (positions, last request) into @p buf, for failure reports. */
void mscx_pqueue_describe(const struct mscx_pqueue *q, char *buf, size_t len);

/**
 * Push a request from the host (tests, and the reference for the kernel's
 * push in exec_port.cuh): reserve @p *head, wait for room until
 * @p deadline_ns, write the fields, then seq. @return the position, or
 * UINT64_MAX when the FIFO stayed full.
 */
uint64_t mscx_pfifo_push_host(struct mscx_pfifo *f, uint64_t *head, const struct mscx_preq *req,
                              uint64_t deadline_ns);

/* ---- puts into a receiver's user buffers, resolved by the receiver (TCP late-bound region) ---- */

/** What the receiving rank's kernel published for the launches of one flag parity (launch_abi.h,
 * mscx_gpu_pub). */
struct mscx_late_pub {
    uint32_t flag; /* the launch that published them; 0: none yet */
    void *ptr[2];  /* [0: input, 1: output] */
    uint64_t bytes[2];
};

/**
 * Decide where a late put goes: into buffer @p buf (MSCX_BUF_INPUT or
 * MSCX_BUF_OUTPUT) of launch @p launch, bytes [@p off, @p off + @p len),
 * given @p pub, the publication of @p launch's parity. @return MSCX_OK with
 * @p dst_p; MSCX_INPROGRESS when that launch has not published yet (an
 * older flag, or none); MSCX_ERR_INTERNAL when a newer launch has replaced
 * it; MSCX_ERR_REMOTE for a bad buffer, flag or range (peer bug). Errors are
 * logged naming @p rank and @p plan.
 */
mscx_status_t mscx_late_pick(const struct mscx_late_pub *pub, uint32_t rank, const char *plan, uint32_t buf,
                             uint32_t launch, uint64_t off, uint64_t len, void **dst_p);

/* ---- the network link: TCP or RDMA, through the transport.h ops table ---- */

/** Copy @p len bytes of GPU (or host) memory at @p src to host memory @p dst; must be complete on return. */
typedef mscx_status_t (*mscx_plink_stage_fn)(void *ctx, void *dst, const void *src, size_t len);

struct mscx_ptcp_link_params {
    const struct mscx_transport_ops *tp;
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn *conn;
    struct mscx_tp_rdesc dst;     /* the peer's scratch */
    struct mscx_tp_rdesc tok;     /* the peer's inbound port tokens */
    struct mscx_tp_rdesc user;    /* the peer's late-bound region for its user buffers (tp 0: none) */
    uint64_t tok_off;             /* the paired channel's token in tok */
    struct mscx_tp_mr *bounce_mr; /* host staging buffer, registered on ep */
    void *bounce;
    size_t bounce_bytes; /* a multiple of 8 */
    mscx_plink_stage_fn stage;
    void *stage_ctx;
    uint32_t peer;
    /* The transport reads the bounce buffer after put returns (RDMA): use it as a ring and flush the
     * connection before it wraps. 0 for TCP (put returns with the bytes sent). One link per bounce buffer. */
    int async_src;
};

/* The same link code under two names (for messages): tcp (mscx_tp_tcp) and ib (mscx_tp_ib, async_src = 1). */
extern const struct mscx_plink_ops mscx_plink_tcp;
extern const struct mscx_plink_ops mscx_plink_ib;
/** Create a network link (either ops table; freed with mscx_plink_tcp_destroy). */
mscx_status_t mscx_plink_tcp_create(const struct mscx_ptcp_link_params *p, void **link_p);
void mscx_plink_tcp_destroy(void *link);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_PROXY_H */
