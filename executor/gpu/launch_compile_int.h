/* SPDX-License-Identifier: MIT */
/*
 * Private interface between the launch compiler's files: launch_compile.c
 * (each op resolved into entries, the entry point mscx_gpu_compile, the
 * kernel's block records), launch_compile_fuse.c (the peepholes that merge
 * the compiled entries) and launch_compile_user.c (the compiled program's
 * user-buffer accesses, for calls whose placement differs from the plan's).
 */
#ifndef MSCX_GPU_LAUNCH_COMPILE_INT_H
#define MSCX_GPU_LAUNCH_COMPILE_INT_H

#include <stdint.h>
#include "launch_abi.h"
#include "plan_model.h"

/*
 * Operand j of entry k: 1 when it is flat data (a user buffer may hold it),
 * 0 when it is packet lines; *ext_p its extent in bytes. The one place that
 * says so: the peepholes and the user-buffer checks use it.
 */
static inline int mscx_program_opnd_flat(const struct mscx_entry *k, uint32_t j, uint32_t pl, uint64_t *ext_p)
{
    uint64_t flat = (uint64_t)k->units * pl, lines = 2u * flat;
    int flat_op;
    switch (k->kind) {
    case MSCX_ENTRY_PACK:
        flat_op = j == 0;
        break;
    case MSCX_ENTRY_UNPACK:
        flat_op = j == 1;
        break;
    case MSCX_ENTRY_REDPKT:
        flat_op = (j == 0 && !k->lsrc0) || (k->fsrc && j == k->fsrc) || j == k->nsrc;
        break;
    case MSCX_ENTRY_COPY:
    case MSCX_ENTRY_REDUCE:
        *ext_p = (uint64_t)k->units * 16u;
        return 1;
    default: /* FWD */
        flat_op = 0;
        break;
    }
    *ext_p = flat_op ? flat : lines;
    return flat_op;
}

/*
 * The peepholes of launch_compile_fuse.c over rank @p rank's program @p prog
 * (@p ntb blocks, every block's entries in place): in each compiled block an
 * UNPACK fused into the REDPKT after it, then a PACK into the rank's own
 * scratch folded into the REDPKT that reads it back, then PACKs of one
 * source merged, and at last the SKIPs they leave dropped.
 * @param ops the rank's uploaded op image
 * @param slot the rank's chunk slot at this launch
 * @param pl packet payload bytes per line
 */
void mscx_program_fuse(struct mscx_program *prog, uint32_t ntb, const struct mscx_plan *plan, uint32_t rank,
                       const struct mscx_dev_op *ops, uint64_t slot, uint32_t pl);

#endif /* MSCX_GPU_LAUNCH_COMPILE_INT_H */
