/* SPDX-License-Identifier: MIT */
/*
 * Private interface between the plan validator's files: plan_validate.c
 * (the entry point, derived fields, structural checks), plan_validate_sync.c
 * (barriers, semaphores, signals and waits), plan_validate_order.c (peer
 * user-buffer accesses ordered within the owner's launch) and
 * plan_validate_redorder.c (every rank reduces each element in one order).
 */
#ifndef MSCX_PLAN_VALIDATE_INT_H
#define MSCX_PLAN_VALIDATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan_model.h"

/* Where the first violation goes: the JSON path of the offending node and "expected <what>, got <value>". */
struct vctx {
    struct mscx_plan *plan;
    char *path;
    size_t plen;
    char *msg;
    size_t mlen;
};

extern const char *const mscx_pv_ctype_names[MSCX_CHAN_COUNT];
extern const char *const mscx_pv_btype_names[MSCX_BUF_COUNT];

/* Write the message; @return -1. */
int mscx_pv_fail(struct vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Write the path. */
void mscx_pv_path(struct vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Path of op @p i (gpu-level index) of block @p t of rank @p r, plus @p leaf (may be NULL). */
void mscx_pv_op_path(struct vctx *v, uint32_t r, uint32_t t, uint32_t i, const char *leaf);

/* An op that signals its channels (a port put with signal signals too). */
static inline bool mscx_pv_is_signal(const struct mscx_dev_op *op)
{
    return op->opcode == MSCX_OP_SIGNAL || op->opcode == MSCX_OP_RELAXED_SIGNAL ||
           (op->chan_type == MSCX_CHAN_PORT &&
            (op->opcode == MSCX_OP_PUT_WITH_SIGNAL || op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH));
}

/* An op that waits on its channels. */
static inline bool mscx_pv_is_wait(const struct mscx_dev_op *op)
{
    return op->opcode == MSCX_OP_WAIT || op->opcode == MSCX_OP_RELAXED_WAIT;
}

/* The checks of plan_validate_sync.c; each @return 0, or -1 with the violation (or out of memory) written. */
int mscx_pv_check_barriers(struct vctx *v, uint32_t r);
int mscx_pv_check_semaphores(struct vctx *v, uint32_t r);
int mscx_pv_check_signals(struct vctx *v);
/* The check of plan_validate_order.c, the same way. */
int mscx_pv_check_peer_accesses(struct vctx *v);
/* The check of plan_validate_redorder.c (every rank reduces in one order), the same way. */
int mscx_pv_check_reduction_order(struct vctx *v);

#endif /* MSCX_PLAN_VALIDATE_INT_H */
