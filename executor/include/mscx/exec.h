/* SPDX-License-Identifier: MIT */
/**
 * @file exec.h
 * The GPU executor: runs loaded plans as one CUDA kernel per launch.
 *
 * One struct mscx_exec is one rank's executor state (one per communicator
 * rank). Plans are added collectively (every rank adds the same plans in the
 * same order); adding a plan allocates the rank's scratch, exchanges CUDA IPC
 * handles through the bootstrap and uploads the plan's compact device
 * encoding once. A launch only enqueues a kernel: the launch flag and scratch
 * half live in device memory and are advanced by the kernel itself, so
 * launches may be captured in CUDA graphs and replayed any number of times.
 *
 * Without CUDA every function returns MSCX_ERR_UNSUPPORTED.
 */
#ifndef MSCX_EXEC_H
#define MSCX_EXEC_H

#include <stddef.h>
#include <stdint.h>
#include "mscx/status.h"
#include "mscx/dev_types.h"
#include "mscx/plan.h"
#include "mscx/scale.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mscx_exec;

/** Out-of-band exchange among the ranks of a communicator. */
struct mscx_bootstrap {
    uint32_t rank, nranks;
    void *ctx;
    /** all[r * bytes ...] receives rank r's @p mine; collective over all ranks. */
    mscx_status_t (*allgather)(void *ctx, const void *mine, void *all, size_t bytes);
    /**
     * NULL, or 32 random bytes the same on every rank, shared privately (the
     * shim's first exchange): every TCP connection's handshake must carry
     * them. NULL: zeros. Must stay valid until the executor is destroyed.
     */
    const uint8_t *secret;
};

/**
 * Create one rank's executor on @p cuda_device.
 * @param bs bootstrap; copied, its ctx must stay valid until destroy
 * @return MSCX_OK, MSCX_ERR_CUDA, MSCX_ERR_NO_MEMORY, MSCX_ERR_UNSUPPORTED (no CUDA)
 */
mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p);

/**
 * Collective: every rank adds the same plans in the same order. Allocates
 * scratch sized for @p max_msg_bytes, exchanges CUDA IPC handles and uploads
 * the plan once. The plan must outlive the executor.
 * @param plan_id_p receives the id to pass to mscx_exec_launch()
 * @return MSCX_OK, MSCX_ERR_UNSUPPORTED (multicast ops, more blocks than can be
 *         resident), MSCX_ERR_INVALID_ARG, MSCX_ERR_CUDA, MSCX_ERR_NO_MEMORY
 */
mscx_status_t mscx_exec_add_plan(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p);

/**
 * Enqueue one launch on @p stream (a cudaStream_t, NULL for the legacy
 * stream); legal inside CUDA graph capture. A one-rank plan whose program
 * leaves the output equal to the input enqueues no kernel: one device copy
 * when the call is out of place, nothing when it is in place.
 * @param msg_bytes as in mscx_coll_sizes()
 * @param pkt packet format used by the packet ops of this launch
 */
mscx_status_t mscx_exec_launch(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                               uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                               enum mscx_pkt_format pkt, void *stream);

/**
 * A scaled sum (NCCL's PreMulSum; ncclAvg on floating types): every rank's
 * input is first multiplied by its scalar (mscx_scale_bytes(), one small
 * kernel that reads a device scalar when it runs) into staging the plan
 * allocated when it was added, then the plan runs as a sum on that copy.
 * The send buffer is never written. A one-rank identity plan writes the
 * scaled input straight to the output. Legal inside CUDA graph capture;
 * allocates nothing.
 * @param scale NULL or MSCX_SCALE_NONE: exactly mscx_exec_launch()
 * @return as mscx_exec_launch(); MSCX_ERR_INVALID_ARG when a scaled launch is
 *         not a sum of fp32, fp16 or bf16 on an AllReduce or ReduceScatter
 *         plan, or its device scalar is NULL
 */
mscx_status_t mscx_exec_launch_scaled(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf,
                                      void *recvbuf, uint64_t msg_bytes, enum mscx_dtype dtype,
                                      enum mscx_redop op, const struct mscx_scale *scale,
                                      enum mscx_pkt_format pkt, void *stream);

/**
 * @return MSCX_OK, or MSCX_ERR_TIMEOUT after a kernel of this rank waited
 *         longer than MSCX_TIMEOUT_MS, or MSCX_ERR_REMOTE after an abort.
 *         Reads device memory written by finished kernels; does not sync.
 */
mscx_status_t mscx_exec_async_error(struct mscx_exec *ex);

/**
 * The word mscx_exec_async_error() reads: 0 while no kernel of @p ex has
 * failed. A caller that checks on every call reads it and calls
 * mscx_exec_async_error() only once it is non-zero. NULL when @p ex has no
 * such word: then call mscx_exec_async_error() itself.
 */
const volatile int32_t *mscx_exec_error_word(struct mscx_exec *ex);

/** Make spinning kernels of this rank give up (they record MSCX_ERR_REMOTE). */
void mscx_exec_abort(struct mscx_exec *ex);

/**
 * Free everything; the caller must have synchronised its streams. Also frees
 * the executors that mscx_exec_destroy_deferred() kept. NULL is accepted.
 */
void mscx_exec_destroy(struct mscx_exec *ex);

/**
 * The release of an aborted executor, which never waits on the device: its
 * kernels are told to stop (mscx_exec_abort()), its proxy and network stop
 * at once, an event is recorded (never waited for) after its launches on
 * each stream they went to, and its device and pinned memory, which those
 * kernels may still touch, is kept on a process-wide list. A CUDA free waits
 * for every kernel on the device, a foreign one too (an NCCL kernel that
 * only the real ncclCommAbort ends), so the list is freed by the next
 * mscx_exec_destroy(), which frees device memory anyway, or entry by entry
 * by a later mscx_exec_create() (at most two each) once every event of the
 * entry says done; an entry whose launches went to more than four streams,
 * to the per-thread stream, or to a stream being captured waits for a
 * destroy. Takes no CUDA call that can block. NULL is accepted.
 */
void mscx_exec_destroy_deferred(struct mscx_exec *ex);

/**
 * Tests and benchmarks: @p nranks ranks in this process on one device with
 * plain-pointer memory channels. Destroy each with mscx_exec_destroy().
 * @param execs receives [nranks] executors
 */
mscx_status_t mscx_exec_create_local_group(uint32_t nranks, int cuda_device, struct mscx_exec **execs);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_EXEC_H */
