/* SPDX-License-Identifier: MIT */
/**
 * @file transport.h
 * Port-channel transports between hosts (private to the executor).
 *
 * The proxy thread of a process drives one endpoint per transport. It
 * registers its memory once, exchanges the serialisable remote descriptors
 * (struct mscx_tp_rdesc) through the bootstrap, connects to its peers with
 * mscx_tp_connect_all() and then turns GPU requests into put / signal /
 * flush calls on a connection.
 *
 * Guarantees every transport gives, per connection:
 *  - operations are applied at the target in the order they were issued;
 *  - a signal is applied only after every earlier put of the connection has
 *    landed ("flag after data"), so a GPU that sees the semaphore move may
 *    read the data;
 *  - a put with MSCX_TP_PUT_PACKET lands as whole, aligned 8-byte units (an
 *    LL8 line, or one flagged half of an LL16 line, is never torn);
 *  - flush returns only once every earlier put and signal is complete at the
 *    target;
 *  - every blocking call takes an absolute deadline (mscx_tp_deadline()); a
 *    dead peer or a refused handshake is an error (MSCX_ERR_REMOTE,
 *    MSCX_ERR_TIMEOUT, MSCX_ERR_IBV), never a hang.
 *
 * Calls on one connection must come from one thread at a time (the proxy).
 * Implementations: mscx_tp_tcp (transport_tcp*.c), mscx_tp_ib (transport_ib.c).
 */
#ifndef MSCX_TRANSPORT_H
#define MSCX_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "mscx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mscx_tp_ep;   /* one process's endpoint of a transport */
struct mscx_tp_conn; /* a connection from this endpoint to one peer rank */
struct mscx_tp_mr;   /* a locally registered memory region */

/** Bytes of the per-peer connection blob exchanged through the bootstrap. */
#define MSCX_TP_BLOB_BYTES 128
/** Magic at the start of every handshake / blob: "MSCXTP01". */
#define MSCX_TP_MAGIC 0x313050545843534dull
#define MSCX_TP_PROTO_VERSION 3u /* 2: late-bound puts (put_late); 3: the secret in the TCP hello */
/** Bytes of a communicator's connection secret (struct mscx_tp_params). */
#define MSCX_TP_SECRET_BYTES 32

/** Register flags. */
enum mscx_tp_mr_flags {
    MSCX_TP_MR_GPU = 1u << 0,          /* base is device memory (TCP: writes go through copy_to_target) */
    MSCX_TP_MR_REMOTE_WRITE = 1u << 1, /* peers may put / signal into it */
    MSCX_TP_MR_LATE = 1u << 2,         /* late-bound target (mr_register_late): no memory, a resolver */
};

/** Put flags. */
enum mscx_tp_put_flags {
    MSCX_TP_PUT_PACKET = 1u << 0, /* LL lines: offsets and len multiples of 8, land in whole 8-byte units */
};

/**
 * Serialisable description of a registered region, sent to peers (through the
 * bootstrap) so they can target it. Fixed 64-byte layout, the same on all
 * hosts.
 */
struct mscx_tp_rdesc {
    uint64_t addr;  /* base address in the owner's address space */
    uint64_t len;   /* bytes */
    uint32_t key;   /* TCP: region id at the owner; IB: rkey */
    uint32_t owner; /* owner's rank */
    uint32_t flags; /* enum mscx_tp_mr_flags */
    uint32_t tp;    /* transport tag: 'T' (tcp), 'I' (ib) */
    uint8_t reserved[32];
};
_Static_assert(sizeof(struct mscx_tp_rdesc) == 64, "rdesc is a wire format");

/** Copy hook for received data (TCP). Must not return before the bytes are visible at @p dst. */
typedef mscx_status_t (*mscx_tp_copy_fn)(void *ctx, void *dst, const void *src, size_t len,
                                         unsigned put_flags, unsigned mr_flags);
/** Signal hook for received signals (TCP): add 1 to the 64-bit word at @p dst. */
typedef mscx_status_t (*mscx_tp_add_fn)(void *ctx, uint64_t *dst, unsigned mr_flags);

/**
 * Resolver of a late-bound region (mr_register_late), called by the receiver
 * for each late put: the receiver's buffer @p buf (an id the caller chose,
 * e.g. input or output) of its launch @p launch, bytes [@p off, @p off +
 * @p len). @return MSCX_OK with @p dst_p (the address of byte @p off) and
 * @p mr_flags_p (MSCX_TP_MR_GPU for device memory, for copy_to_target);
 * MSCX_INPROGRESS when that launch's buffers are not known yet (asked again
 * later, up to the endpoint's late_timeout_ms); any other status is an error
 * the resolver has logged (the connection fails).
 */
typedef mscx_status_t (*mscx_tp_resolve_fn)(void *ctx, uint32_t buf, uint32_t launch, uint64_t off,
                                            uint64_t len, void **dst_p, unsigned *mr_flags_p);

/** Endpoint parameters. Strings are copied. */
struct mscx_tp_params {
    uint32_t rank, nranks;
    uint64_t comm_id;      /* communicator id; both ends of a connection must agree */
    const char *gpu_pci;   /* IB: "0000:17:00.0" of the GPU for NIC choice, NULL for none */
    const char *bind_addr; /* TCP: IPv4 address to listen on and advertise, NULL for mscx_tp_socket_addr() */
    mscx_tp_copy_fn copy_to_target; /* TCP: NULL for memcpy (host memory only) */
    mscx_tp_add_fn add_to_target;   /* TCP: NULL for a host atomic add */
    void *hook_ctx;
    uint64_t late_timeout_ms; /* TCP: how long a late put may wait for its launch to be known; 0: no bound */
    /*
     * TCP: the communicator's secret, drawn at random by one rank and shared
     * over the bootstrap; every connection's handshake must carry it. comm_id
     * only names the communicator; this proves a connection belongs to it.
     */
    uint8_t secret[MSCX_TP_SECRET_BYTES];
};

/**
 * The transport ops table. Every function returns MSCX_OK or an error that
 * it has already logged. Deadlines are absolute CLOCK_MONOTONIC nanoseconds.
 */
struct mscx_transport_ops {
    const char *name;
    /** Create an endpoint (listening socket / opened device); @p ep_p on success. */
    mscx_status_t (*ep_create)(const struct mscx_tp_params *params, struct mscx_tp_ep **ep_p);
    /** Destroy an endpoint, its connections and regions. NULL accepted. */
    void (*ep_destroy)(struct mscx_tp_ep *ep);
    /**
     * Register [base, base+len) once. @p desc_p receives the descriptor peers
     * need; @p mr_p the local handle. IB: @p dmabuf_fd >= 0 asks for
     * GPUDirect RDMA (ibv_reg_dmabuf_mr at offset 0 of the fd); -1 for host memory.
     */
    mscx_status_t (*mr_register)(struct mscx_tp_ep *ep, void *base, size_t len, unsigned flags, int dmabuf_fd,
                                 struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p);
    /** Deregister; the caller has flushed every connection using it. NULL accepted. */
    void (*mr_deregister)(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr);
    /**
     * Phase 1 of connecting to @p peer: create the connection and write the
     * blob that @p peer needs into @p blob (MSCX_TP_BLOB_BYTES).
     */
    mscx_status_t (*conn_prepare)(struct mscx_tp_ep *ep, uint32_t peer, void *blob,
                                  struct mscx_tp_conn **conn_p);
    /** Phase 2: finish with the blob @p peer wrote for us. Refuses a bad magic / communicator. */
    mscx_status_t (*conn_establish)(struct mscx_tp_conn *conn, const void *peer_blob, uint64_t deadline_ns);
    /** Close a connection (also after an error). NULL accepted. */
    void (*conn_close)(struct mscx_tp_conn *conn);
    /** Write len bytes from local @p lmr + @p loff to @p rdesc + @p roff; ordered, asynchronous. */
    mscx_status_t (*put)(struct mscx_tp_conn *conn, struct mscx_tp_mr *lmr, uint64_t loff,
                         const struct mscx_tp_rdesc *rdesc, uint64_t roff, uint64_t len, unsigned flags,
                         uint64_t deadline_ns);
    /** Add 1 to the 8-byte aligned 64-bit word at @p rdesc + @p roff, after all earlier puts. */
    mscx_status_t (*signal)(struct mscx_tp_conn *conn, const struct mscx_tp_rdesc *rdesc, uint64_t roff,
                            uint64_t deadline_ns);
    /** Block until every earlier put / signal of @p conn is complete at the target. */
    mscx_status_t (*flush)(struct mscx_tp_conn *conn, uint64_t deadline_ns);
    /** Make progress without blocking; returns the first error of any connection. */
    mscx_status_t (*progress)(struct mscx_tp_ep *ep);
    /**
     * Register a late-bound target: puts to it name (buffer, launch, offset)
     * and the receiver asks @p resolve where they go (see mscx_tp_resolve_fn).
     * Puts to it wait at the receiver, in order, until resolved; other
     * connections keep flowing. NULL: the transport cannot do this (ib).
     */
    mscx_status_t (*mr_register_late)(struct mscx_tp_ep *ep, mscx_tp_resolve_fn resolve, void *ctx,
                                      struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p);
    /**
     * put to a late-bound region @p rd: @p len bytes from @p lmr + @p loff to
     * byte @p roff of the receiver's buffer @p buf of launch @p launch. Same
     * ordering as put. NULL where mr_register_late is NULL.
     */
    mscx_status_t (*put_late)(struct mscx_tp_conn *conn, struct mscx_tp_mr *lmr, uint64_t loff,
                              const struct mscx_tp_rdesc *rd, uint32_t buf, uint32_t launch, uint64_t roff,
                              uint64_t len, unsigned flags, uint64_t deadline_ns);
};

extern const struct mscx_transport_ops mscx_tp_tcp;
extern const struct mscx_transport_ops mscx_tp_ib;

/**
 * Check that [roff, roff + len) lies in the remote region @p rd of transport
 * @p tp ('T', 'I') owned by @p peer; logs a "caller bug" and returns
 * MSCX_ERR_INVALID_ARG otherwise.
 */
mscx_status_t mscx_tp_check_remote(const struct mscx_tp_rdesc *rd, uint32_t tp, uint32_t peer, uint64_t roff,
                                   uint64_t len);

/** @return CLOCK_MONOTONIC now in nanoseconds. */
uint64_t mscx_tp_now_ns(void);
/** @return the absolute deadline @p timeout_ms from now; 0 ms means "never" (UINT64_MAX). */
uint64_t mscx_tp_deadline(uint64_t timeout_ms);

/** 1 when the @p n bytes at @p a and @p b are equal, in a time that does not depend on where they differ. */
int mscx_tp_ct_equal(const void *a, const void *b, size_t n);

/**
 * Collective over the bootstrap: connect @p ep to every rank r with
 * want[r] != 0 (want[rank] is ignored). Every rank must call it with a
 * symmetric @p want. One allgather of nranks * nranks * MSCX_TP_BLOB_BYTES.
 * @param conns receives [nranks] connections (NULL where not wanted);
 *        untouched on error (connections made so far are closed).
 */
mscx_status_t mscx_tp_connect_all(const struct mscx_transport_ops *ops, struct mscx_tp_ep *ep, uint32_t rank,
                                  uint32_t nranks, const uint8_t *want,
                                  mscx_status_t (*allgather)(void *ctx, const void *mine, void *all,
                                                             size_t bytes),
                                  void *ag_ctx, uint64_t deadline_ns, struct mscx_tp_conn **conns);

#define MSCX_TP_ADDR_LEN 16   /* INET_ADDRSTRLEN */
#define MSCX_TP_IFNAME_LEN 16 /* IF_NAMESIZE */
/**
 * The IPv4 address TCP listens on and advertises: the interface named by
 * MSCX_SOCKET_IFNAME (no such interface, or none with an IPv4 address:
 * MSCX_ERR_INVALID_ARG, logged naming the variable), else the first
 * non-loopback interface that is up and running with an IPv4 address, else
 * 127.0.0.1 (INFO line). Writes @p addr and @p ifname only on success.
 */
mscx_status_t mscx_tp_socket_addr(char addr[MSCX_TP_ADDR_LEN], char ifname[MSCX_TP_IFNAME_LEN]);

/** Hops between two sysfs device paths through their closest common ancestor (NIC choice). */
int mscx_tp_ib_pci_distance(const char *path_a, const char *path_b);

/** Tests: number of short sends seen on a TCP connection (partial-send coverage). */
uint64_t mscx_tp_tcp_short_sends(const struct mscx_tp_conn *conn);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_TRANSPORT_H */
