/* SPDX-License-Identifier: MIT */
/*
 * User buffers of peers in other processes (peer_buffers.c): ops that read or
 * write a peer's input or output buffer need that buffer mapped here, at
 * every launch, for the buffers of that launch. Exporters publish CUDA IPC
 * handles of the allocations behind their buffers through a shared-memory
 * exchange (shm_slots.h); readers map them once (a process-wide cache keyed by
 * the allocation) and pass the pointers in the kernel arguments. Called by
 * finalize.c at add_plan, launch.c at each launch and context.c at destroy.
 */
#ifndef MSCX_PEER_BUFFERS_H
#define MSCX_PEER_BUFFERS_H

#include <stdint.h>
#include "mscx/exec.h"
#include "mscx/status.h"
#include "plan_model.h"
#include "launch_abi.h"
#include "gpu_port.h"

struct peer_bufs;

struct peer_bufs_setup {
    const struct mscx_plan *plan;
    uint32_t rank;
    int device;
    const struct mscx_bootstrap *bs;
    const struct gpu_peer *peers;  /* [nranks] */
    const uint32_t *node;          /* [nranks] */
    uint64_t timeout_ms;           /* MSCX_TIMEOUT_MS: every host wait (0: none) */
    const volatile int32_t *abort; /* the rank's abort word (mscx_exec_abort) */
};

/**
 * Check, for every rank of the plan (so that all refuse together, before
 * any collective step), that no rank reaches more than MSCX_GPU_MAX_UPTR
 * distinct user buffers of other processes of its node (@p node from
 * mscx_gpu_topology).
 */
mscx_status_t mscx_peer_bufs_check(const struct mscx_plan *plan, const struct gpu_peer *peers,
                                   const uint32_t *node);

/**
 * Collective over the bootstrap when some rank of the plan reaches a user
 * buffer of another process (every rank decides the same from the plan and
 * the peers, and calls it or not): creates this rank's exchange segment,
 * swaps names, attaches to the ranks of the node it exchanges with, agrees
 * on success and unlinks the names. @p uslot receives, per remote buffer of
 * this rank ([nrbuf]), its index into mscx_gpu_args.uptr, or UINT32_MAX when
 * the buffer is not a user buffer of another process. @p u_p is NULL when
 * this rank takes no part.
 */
mscx_status_t mscx_peer_bufs_setup(const struct peer_bufs_setup *s, uint32_t *uslot, struct peer_bufs **u_p);

/**
 * At each launch of a rank that takes part (u not NULL): publish this
 * launch's input and output buffers (when peers read them), map the peers'
 * buffers this rank reaches into @p uptr ([MSCX_GPU_MAX_UPTR]), and agree
 * with every rank of the exchange that all succeeded. Under stream capture
 * no CUDA IPC call is made: buffers met before (cached) work, new ones fail.
 * Every failure is the same on every rank of the exchange.
 * @return MSCX_OK; MSCX_ERR_UNSUPPORTED (a buffer that cannot be mapped, or a
 *         new buffer under capture, on any rank); MSCX_ERR_TIMEOUT, MSCX_ERR_REMOTE,
 *         MSCX_ERR_INTERNAL (the exchange lost step: every later launch fails too);
 *         MSCX_ERR_CUDA
 */
mscx_status_t mscx_peer_bufs_launch(struct peer_bufs *u, const void *in, uint64_t in_bytes, const void *out,
                                    uint64_t out_bytes, void *stream, void **uptr);

/**
 * After the kernel of a launch that mscx_peer_bufs_launch() let through was
 * enqueued on @p stream (or failed to be): mark its end, which a later
 * eviction of a mapping waits for. Nothing under capture. NULL accepted.
 */
void mscx_peer_bufs_launched(struct peer_bufs *u, void *stream);

/** Close this context's mappings (the caller synchronised its streams). NULL accepted. */
void mscx_peer_bufs_destroy(struct peer_bufs *u);

#endif /* MSCX_PEER_BUFFERS_H */
