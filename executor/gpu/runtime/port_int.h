/* SPDX-License-Identifier: MIT */
/*
 * What the pieces of the port channels through the CPU proxy (gpu_port.h)
 * share:
 *
 *   topology.c   node placement and the plan checks that depend on it
 *   gpu_net.c    per executor: streams, signal ring, the transport between
 *                nodes (choice, endpoint, connections), the receiver's hooks
 *   cuda_link.c  the "cuda" link to peers of the same node in other processes
 *   ib_dmabuf.c  RDMA registration of GPU memory through a dmabuf
 *   late_bound.c puts from other nodes into this rank's user buffers (TCP)
 *   ports.c      per plan context: regions, links, FIFO, proxy attachment
 *
 * cuda link: puts are cudaMemcpyAsync into the peer's IPC-mapped scratch on
 * one non-blocking stream per executor (never the legacy default stream: the
 * executor's kernel may be waiting on the copy). A signal is the channel's
 * running count written as a 64-bit value with an 8-byte host-to-device copy
 * into the peer's inbound token, on the same stream, so it lands after every
 * earlier put (stream order). Only this link writes that token (one sender
 * per paired channel), so an absolute value is an add of one. The values
 * come from a pinned ring of SIG_RING slots; a slot is reused only after the
 * event recorded behind its group of SIG_GROUP copies has completed. (A copy
 * was chosen over cuStreamWriteValue64: it needs no driver entry point and no
 * stream-memory-op support, and it is what the peer's copy engine ordering
 * already covers.)
 *
 * Between nodes: MSCX_TRANSPORT picks the transport once per process (auto:
 * RDMA when libibverbs opens with an active device, GPUDirect registration
 * of GPU memory is possible and every rank agrees; else TCP, INFO line).
 * RDMA: this rank's scratch and tokens are registered through a dmabuf of
 * the GPU memory (cuMemGetHandleForAddressRange), so peers write them
 * directly; the source of a put is staged through a host bounce ring per
 * link (registered once), as for TCP.
 *
 * TCP link: the source is staged to a pinned host buffer with a copy on the
 * same stream; the receiver thread of the TCP endpoint writes received bytes
 * into GPU memory with a copy on its own non-blocking stream (synchronous
 * before the next message is applied, so a signal lands after its data) and
 * applies a signal as read, add one, write of the token.
 */
#ifndef MSCX_PORT_INT_H
#define MSCX_PORT_INT_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "gpu_port.h"
#include "proxy.h"
#include "transport.h"
#include "runtime_int.h"

#define SIG_RING 1024u
#define SIG_GROUP 64u
#define BOUNCE_BYTES (1u << 20)

struct gpu_net {
    int device;
    uint32_t nranks;
    cudaStream_t stream;    /* proxy thread: cuda-link copies and TCP staging */
    cudaStream_t rx_stream; /* TCP receiver thread */
    uint64_t *ring;         /* pinned signal values */
    uint64_t ring_n;
    cudaEvent_t ring_ev[SIG_RING / SIG_GROUP];
    cudaEvent_t flush_ev;
    const struct mscx_transport_ops *tp; /* chosen on the first connection: tcp or ib */
    const struct mscx_plink_ops *plink;  /* mscx_plink_tcp or mscx_plink_ib */
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn **conn; /* [nranks] */
    void *bounce;
    struct mscx_tp_mr *bounce_mr;
};

/* gpu_net.c */

/** The network state of an executor on @p device for @p nranks ranks: streams, events, signal ring. */
mscx_status_t mscx_gpu_net_create(int device, uint32_t nranks, struct gpu_net **net_p);

/**
 * Collective: the endpoint (on first use, after choosing the transport) and
 * connections to every rank this plan reaches by a port channel across
 * nodes.
 */
mscx_status_t mscx_gpu_net_connect(struct gpu_net *n, const struct gpu_port_setup *s);

/* cuda_link.c */

extern const struct mscx_plink_ops mscx_gpu_cuda_link_ops;

/**
 * A cuda link on @p n to a peer of the same node: puts into @p peer_scr
 * (its scratch mapped here), signals into @p peer_tok (the paired channel's
 * inbound token). Freed by mscx_gpu_cuda_link_destroy.
 */
mscx_status_t mscx_gpu_cuda_link_create(struct gpu_net *n, char *peer_scr, unsigned long long *peer_tok,
                                        void **link_p);
void mscx_gpu_cuda_link_destroy(void *link);

/* ib_dmabuf.c */

/** Whether CUDA can export GPU memory as a dmabuf (cuMemGetHandleForAddressRange). */
int mscx_gpu_dmabuf_available(void);

/**
 * Register device memory [base, base+len) on the RDMA endpoint of @p n
 * through a dmabuf of its page-aligned cover; the descriptor names the
 * exact region.
 */
mscx_status_t mscx_gpu_ib_register(struct gpu_net *n, void *base, size_t len, struct mscx_tp_mr **mr_p,
                                   struct mscx_tp_rdesc *desc_p);

/* late_bound.c */

struct late_res;

/** Does a rank on another node reach rank @p rank's input or output buffer (by a proxied port put)? */
int mscx_gpu_late_target(const struct gpu_port_setup *s, uint32_t rank);

/** The late-bound region of rank @p rank's context (publication @p pub) on @p n. @return NULL: no memory */
struct late_res *mscx_gpu_late_create(struct gpu_net *n, const struct mscx_gpu_pub *pub, uint32_t rank,
                                      const char *plan_name);

/** Register @p lr on the TCP endpoint; @p desc_p receives its descriptor for the peers. */
mscx_status_t mscx_gpu_late_register(struct late_res *lr, struct mscx_tp_rdesc *desc_p);

/** Deregister (the receiver thread resolves no more through it once this returns) and free. NULL accepted. */
void mscx_gpu_late_destroy(struct late_res *lr);

#endif /* MSCX_PORT_INT_H */
