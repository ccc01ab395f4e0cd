/* SPDX-License-Identifier: MIT */
/*
 * One-rank plans whose program is the identity. The GPU executor runs their
 * launches without a kernel: nothing at all when the call is in place, one
 * device copy of the input to the output when it is out of place (as NCCL
 * does at one rank). The decision reads the plan's structure, never its name.
 * Plain C: the unit suite checks it against the host reference executor.
 */
#ifndef MSCX_GPU_ONERANK_H
#define MSCX_GPU_ONERANK_H

#include <stdbool.h>
#include <stdint.h>
#include "plan_model.h"

/* Copy pairs a plan may have and still be looked at (the coverage scan is quadratic in them). */
#define MSCX_ONERANK_MAX_PAIRS 4096u

/*
 * Whether the reduction of a single value by @p op is that value, bit for
 * bit: the executors fold from the first operand, so one operand is never
 * touched. A scaled sum (NCCL's PreMulSum, or an average computed as one)
 * multiplies even a single value, and any op not named here is not assumed
 * to be the identity.
 */
static inline bool mscx_redop_keeps_one_value(enum mscx_redop op)
{
    switch (op) {
    case MSCX_REDOP_SUM:
    case MSCX_REDOP_PROD:
    case MSCX_REDOP_MIN:
    case MSCX_REDOP_MAX:
        return true;
    default:
        return false;
    }
}

/* Whether @p op is a plain local copy of input chunks onto the same output chunks, whole (no slice). */
static inline bool mscx_onerank_same_chunk_copy(const struct mscx_dev_op *op)
{
    if (op->opcode != MSCX_OP_COPY || op->nsrc == 0 || op->nsrc != op->ndst || op->nchan || op->nsem ||
        (op->flags & MSCX_OPF_IN_PIPELINE) || op->tbg_size > 1)
        return false;
    for (uint32_t k = 0; k < op->nsrc; k++) {
        const struct mscx_dev_operand *s = &op->src[k], *d = &op->dst[k];
        if (s->type != MSCX_BUF_INPUT || d->type != MSCX_BUF_OUTPUT || s->flags || d->flags ||
            s->index != d->index || s->size != d->size || s->size == 0)
            return false;
    }
    return true;
}

/* Whether the copy pairs of @p gpu (all same-chunk copies) write every one of its output chunks. */
static inline bool mscx_onerank_covers_output(const struct mscx_gpu *gpu)
{
    uint64_t pos = 0, end = gpu->output_chunks;
    while (pos < end) {
        uint64_t reach = pos; /* the furthest end of a pair that holds chunk pos */
        for (uint32_t i = 0; i < gpu->nops; i++) {
            const struct mscx_dev_op *op = &gpu->ops[i];
            for (uint32_t k = 0; op->opcode == MSCX_OP_COPY && k < op->ndst; k++) {
                uint64_t a = op->dst[k].index, b = a + op->dst[k].size;
                if (a <= pos && pos < b && b > reach)
                    reach = b;
            }
        }
        if (reach == pos)
            return false;
        pos = reach;
    }
    return true;
}

/*
 * Whether a launch of rank @p rank of @p plan leaves the output equal to the
 * input, bit for bit, at every message size and dtype, with either
 * placement of the call: the plan has one rank; that rank has no channels,
 * remote buffers or semaphores; every op is a nop or a same-chunk copy
 * (above); and either the plan is in place (its output is its input) or it
 * copies every output chunk from an input of the same chunk count, whose
 * chunks then have the same bytes as the output's (input and output sizes
 * are equal at one rank, which the launch checks).
 * An in-place call of such a plan needs nothing done: every copy would move
 * bytes onto themselves.
 */
static inline bool mscx_gpu_onerank_identity(const struct mscx_plan *plan, uint32_t rank)
{
    if (plan->nranks != 1 || rank != 0 || plan->has_multicast)
        return false;
    const struct mscx_gpu *gpu = &plan->gpus[0];
    if (gpu->nchan[MSCX_CHAN_MEMORY] || gpu->nchan[MSCX_CHAN_PORT] || gpu->nswitch || gpu->nrbuf || gpu->nsem)
        return false;
    uint32_t pairs = 0;
    for (uint32_t i = 0; i < gpu->nops; i++) {
        const struct mscx_dev_op *op = &gpu->ops[i];
        if (op->opcode == MSCX_OP_NOP)
            continue;
        if (!mscx_onerank_same_chunk_copy(op))
            return false;
        pairs += op->nsrc;
        if (pairs > MSCX_ONERANK_MAX_PAIRS)
            return false;
    }
    if (pairs && gpu->input_chunks != gpu->output_chunks)
        return false;
    if (plan->inplace)
        return true;
    return gpu->output_chunks > 0 && mscx_onerank_covers_output(gpu);
}

#endif /* MSCX_GPU_ONERANK_H */
