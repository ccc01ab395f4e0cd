/* SPDX-License-Identifier: MIT */
/**
 * @file sim.h
 * Checked simulation: run a plan on the host executor with deterministic
 * exact-arithmetic inputs and compare with the collective's definition
 * (allreduce, allgather, reducescatter, alltoall, broadcast: every rank's
 * output is the input of the plan's root, whose input an out-of-place plan
 * must leave unchanged). Floating-point
 * allreduce cases also run once with rounding-sensitive inputs, and every
 * rank's output must be bit-identical (replicas stay in sync). A "test" plan
 * has no definition: it must finish, and two runs with different thread
 * schedules must agree bit for bit.
 */
#ifndef MSCX_SIM_H
#define MSCX_SIM_H

#include <stdint.h>
#include "mscx/status.h"
#include "mscx/dev_types.h"
#include "mscx/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mscx_sim_case {
    uint64_t msg_bytes; /* the size the plan's range refers to (see mscx_coll_sizes) */
    enum mscx_dtype dtype;
    enum mscx_redop op;
    enum mscx_pkt_format pkt;
    uint32_t iters; /* back-to-back launches with advancing flags, each checked */
    uint32_t seed;
    int no_cross_rank; /* 1: skip the allreduce cross-rank run (sampling in long sweeps) */
};

struct mscx_sim_result {
    int pass;
    uint64_t mismatches;
    double seconds;
    char msg[512]; /* first mismatch or the failure reason */
};

/**
 * Deterministic input element values: small integers (or reciprocals of
 * powers of two for prod) so that every reduction order gives the same bits.
 * Writes @p bytes of data for (rank, iter) into @p buf.
 */
void mscx_sim_fill(enum mscx_dtype dtype, enum mscx_redop op, uint32_t nranks, uint32_t rank, uint32_t iter,
                   uint32_t seed, void *buf, uint64_t bytes);

/**
 * Run one case. @return MSCX_OK when the case ran (see res_p->pass), or an
 * error when it could not (bad size for the plan, out of memory).
 */
mscx_status_t mscx_sim_check(const struct mscx_plan *plan, const struct mscx_sim_case *c,
                             struct mscx_sim_result *res_p);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_SIM_H */
