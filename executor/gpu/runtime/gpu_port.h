/* SPDX-License-Identifier: MIT */
/*
 * Node topology and port channels through the CPU proxy, for the GPU
 * executor (finalize.c calls these at add_plan, context.c at destroy and
 * for an asynchronous error; topology.c and ports.c implement them, with
 * the pieces of port_int.h).
 */
#ifndef MSCX_GPU_PORT_H
#define MSCX_GPU_PORT_H

#include <stdint.h>
#include "mscx/exec.h"
#include "mscx/status.h"
#include "plan_model.h"
#include "launch_abi.h"

/* What add_plan knows about each rank of a plan (from the bootstrap allgather). */
struct gpu_peer {
    int64_t pid;
    uint64_t host;  /* host identity: ranks with equal (host, pid) share a process */
    int32_t vnodes; /* MSCX_VIRTUAL_NODES as that rank read it */
    int32_t device;
    uint64_t scratch_bytes;
};

/* Whether ranks @p a and @p b share a process. */
static inline int mscx_gpu_same_proc(const struct gpu_peer *a, const struct gpu_peer *b)
{
    return a->pid == b->pid && a->host == b->host;
}

/**
 * Place every rank of @p plan on a node: ranks of one host share a node,
 * unless MSCX_VIRTUAL_NODES=N (N > 1) splits the host's ranks by rank
 * (node = rank / (nranks / N)). Checks, for every rank (so that all ranks
 * refuse together, before any collective step that could hang): memory
 * channels stay within a node; a buffer of a rank on another node is reached
 * only by port put/pws/pwsf/ppkt/rppkt into its scratch, or put/pws/pwsf
 * into its input or output buffer; a port op's
 * channels are all in-process or all through the proxy; no proxied get
 * (user buffers of other processes of the node are reached through
 * peer_buffers.h). Refusals are logged with plan, rank,
 * thread block and op.
 * @param node receives [nranks] node ids (0..nodes-1 in rank order of first appearance).
 */
mscx_status_t mscx_gpu_topology(const struct mscx_plan *plan, const struct gpu_peer *peers, uint32_t *node);

struct gpu_net;  /* per executor: streams, signal values, TCP endpoint and connections */
struct gpu_port; /* per plan context with a proxied port channel */

struct gpu_port_setup {
    const struct mscx_plan *plan;
    uint32_t rank;
    int device;
    const struct mscx_bootstrap *bs;
    const struct gpu_peer *peers; /* [nranks] */
    const uint32_t *node;         /* [nranks] */
    char *const *peer_scr;        /* [nranks] peer scratch mapped in this process (same node), else NULL */
    void *const *port_tok; /* [nchan port] the paired channel's token on the peer (same node), else NULL */
    char *scratch;         /* this rank's scratch (device) */
    uint64_t scratch_bytes;
    unsigned long long *tok; /* this rank's inbound port tokens (device), [nchan port] */
    uint32_t ntb;
    struct mscx_gpu_host *host; /* the rank's mapped error block */
    uint64_t timeout_ms;
    const struct mscx_gpu_pub *pub; /* this rank's publication in its device context (late-bound puts) */
};

/**
 * Collective over the bootstrap (every rank calls it for the plan, in the
 * same order as add_plan): connects TCP where a port channel crosses nodes,
 * registers this rank's scratch and tokens, builds a link per proxied
 * channel, the FIFO and its device state, and attaches it to the process's
 * proxy. @p port_p and @p dev_p are set to NULL when no channel of this rank
 * goes through the proxy. @p net_p is created on first need.
 */
mscx_status_t mscx_gpu_port_setup(struct gpu_net **net_p, const struct gpu_port_setup *s,
                                  struct gpu_port **port_p, struct mscx_gpu_port **dev_p);
/** Detach from the proxy (no request is served after this returns). NULL accepted. */
void mscx_gpu_port_stop(struct gpu_port *p);
/** Free (after stop and after mscx_gpu_net_destroy). NULL accepted. */
void mscx_gpu_port_free(struct gpu_port *p);
/** Close the TCP endpoint (no more received writes), free streams and staging. NULL accepted. */
void mscx_gpu_net_destroy(struct gpu_net *n);
/**
 * Close the endpoint only (connections closed, no more received writes),
 * with no CUDA call: what an abort may do at once. mscx_gpu_net_destroy()
 * frees the rest later. NULL accepted.
 */
void mscx_gpu_net_close(struct gpu_net *n);
/** Log the proxy queue's state once (WARN), for a launch that failed. NULL accepted. */
void mscx_gpu_port_report(struct gpu_port *p, uint32_t rank, const char *plan_name);

#endif /* MSCX_GPU_PORT_H */
