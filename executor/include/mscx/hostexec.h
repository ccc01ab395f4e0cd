/* SPDX-License-Identifier: MIT */
/**
 * @file hostexec.h
 * The host reference executor: runs every rank of a plan on CPU threads (one
 * per thread block), in host memory, with the real LL8/LL16 line layouts and
 * flag rules, real semaphores and barriers, and port channels served by a
 * proxy thread per rank that copies asynchronously. It is the oracle that
 * GPU results are compared with, bit for bit.
 *
 * Each rank advances through its launches on its own (as a GPU stream
 * would): a rank may start launch k+1 while a peer is still in launch k.
 */
#ifndef MSCX_HOSTEXEC_H
#define MSCX_HOSTEXEC_H

#include <stddef.h>
#include <stdint.h>
#include "mscx/status.h"
#include "mscx/dev_types.h"
#include "mscx/plan.h"
#include "mscx/scale.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Called on the rank's launching thread before launch @p iter of @p rank,
 * when no block of that rank runs: fill the input (and the output, which may
 * alias the input for in-place plans).
 */
typedef void (*mscx_hostexec_fill_fn)(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes,
                                      void *out, uint64_t out_bytes);
/** Called after launch @p iter of @p rank has finished on every block of that rank. */
typedef void (*mscx_hostexec_collect_fn)(void *ctx, uint32_t rank, uint32_t iter, const void *in,
                                         uint64_t in_bytes, const void *out, uint64_t out_bytes);

struct mscx_hostexec_cfg {
    uint64_t in_bytes; /* per rank, as the collective defines them (mscx_coll_sizes) */
    uint64_t out_bytes;
    enum mscx_dtype dtype;
    enum mscx_redop op;
    enum mscx_pkt_format pkt;
    uint32_t iters;      /* launches per rank, >= 1 */
    uint32_t sched_seed; /* 0: plain schedule; else random yields and delays to vary interleavings */
    uint64_t timeout_ms; /* 0: MSCX_SIM_TIMEOUT_MS */
    mscx_hostexec_fill_fn fill;
    mscx_hostexec_collect_fn collect;
    void *ctx;
};

/**
 * Run a plan for all its ranks.
 *
 * In-place plans alias the buffers as the collective defines: allreduce and
 * others out == in; allgather in == out + rank * in_bytes; reducescatter
 * out == in + rank * out_bytes.
 *
 * @param err receives the reason on failure. A plan that cannot finish stops
 *        within the timeout with MSCX_ERR_TIMEOUT and a message naming the
 *        rank, thread block, op index and opcode, and what it waits for.
 */
mscx_status_t mscx_hostexec_run(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg, char *err,
                                size_t errlen);

/**
 * mscx_hostexec_run() of a scaled sum (cfg->op must be MSCX_REDOP_SUM, the
 * dtype fp32, fp16 or bf16, the plan an AllReduce or ReduceScatter): each
 * launch multiplies every rank's input by the scalar (mscx_scale_bytes();
 * MSCX_SCALE_DEVICE: the element at dev_ptr, host memory here, read when the
 * launch starts) into a copy, as the GPU executor does, and runs the plan on
 * the copy. The input of an out-of-place plan keeps its bytes; that of an
 * in-place plan is its output, and its bytes outside the output are working
 * memory, as in any in-place launch.
 * @param scale NULL or MSCX_SCALE_NONE: exactly mscx_hostexec_run()
 */
mscx_status_t mscx_hostexec_run_scaled(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                       const struct mscx_scale *scale, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_HOSTEXEC_H */
