/* SPDX-License-Identifier: MIT */
/*
 * Op-test plans (collective "test", the DSL's op demonstrations) that no
 * executor can run alone, shared by the gpu tests: plans that read packets no
 * op sends, and plans whose result depends on an unordered race on a user
 * buffer. Uses the plan model (plan_model.h).
 */
#ifndef MSCX_TEST_OP_PLAN_SKIP_H
#define MSCX_TEST_OP_PLAN_SKIP_H

#include <stdint.h>
#include <stdlib.h>
#include "plan_model.h"

#define OPS_MAXR 64 /* ranks checked by raw_write_race */

/*
 * Op-test plans may read packets that no op of the plan sends (the host
 * simulation seeds them itself); such a plan cannot run alone on either
 * executor. @return non-zero when some scratch chunk is read as packets and
 * no op writes packets to it (chunk granularity, by owner rank).
 */
static inline int pkt_unproduced(const struct mscx_plan *plan)
{
    uint32_t n = plan->nranks;
    int bad = 0;
    uint8_t **m = calloc(n, sizeof(*m));
    for (uint32_t r = 0; r < n; r++)
        m[r] = calloc(plan->gpus[r].scratch_chunks + 1, 1);
    for (uint32_t r = 0; r < n; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            int rd_all = 0, wr_all = 0, rd_from1 = 0, wr_from1 = 0;
            switch (op->opcode) {
            case MSCX_OP_COPY_PACKETS:
                wr_all = 1;
                break;
            case MSCX_OP_PUT_PACKETS:
                wr_all = 1;
                rd_all = op->chan_type == MSCX_CHAN_PORT;
                break;
            case MSCX_OP_READ_PUT_PACKETS:
                rd_all = wr_all = 1;
                break;
            case MSCX_OP_UNPACK_PACKETS:
                rd_all = 1;
                break;
            case MSCX_OP_REDUCE_PACKETS:
            case MSCX_OP_REDUCE_SEND_PACKETS:
            case MSCX_OP_REDUCE_COPY_PACKETS:
            case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
                rd_from1 = wr_from1 = 1;
                break;
            default:
                continue;
            }
            for (int w = 0; w < 2; w++) {
                uint32_t cnt = w ? op->ndst : op->nsrc;
                for (uint32_t k = (w ? wr_from1 : rd_from1); k < cnt; k++) {
                    const struct mscx_dev_operand *o = w ? &op->dst[k] : &op->src[k];
                    uint32_t owner = r, type = o->type;
                    if (!(w ? (wr_all || wr_from1) : (rd_all || rd_from1)))
                        continue;
                    if (o->flags & MSCX_OPND_REMOTE) {
                        owner = g->rbuf[o->rbuf].rank;
                        type = g->rbuf[o->rbuf].type;
                    }
                    if (type != MSCX_BUF_SCRATCH)
                        continue;
                    for (uint32_t c = o->index;
                         c < o->index + o->size && c < plan->gpus[owner].scratch_chunks; c++)
                        m[owner][c] |= (uint8_t)(w ? 2 : 1);
                }
            }
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t c = 0; c < plan->gpus[r].scratch_chunks; c++)
            if (m[r][c] == 1)
                bad = 1;
        free(m[r]);
    }
    free(m);
    return bad;
}

/*
 * Op-test plans may also race on user buffers: rank r reads its own input or
 * output chunk c while a peer's raw write (put, pws, ...) lands in the same
 * chunk, with no wait in between that orders the two (the DSL's
 * put_fuse_test swaps two chunks this way). Such a plan's result depends on
 * the interleaving: the host executor itself gives different answers from
 * run to run, so no comparison is meaningful. Conservative: any chunk that a
 * rank reads raw and a peer writes raw counts, ordered or not; only op-test
 * plans are checked. @return non-zero when such a chunk exists.
 */
static inline int raw_write_race(const struct mscx_plan *plan)
{
    uint32_t n = plan->nranks;
    int bad = 0;
    uint8_t *m[OPS_MAXR][2];
    for (uint32_t r = 0; r < n && r < OPS_MAXR; r++)
        for (int t = 0; t < 2; t++)
            m[r][t] = calloc((t ? plan->gpus[r].output_chunks : plan->gpus[r].input_chunks) + 1u, 1);
    for (uint32_t r = 0; r < n && r < OPS_MAXR; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            for (int w = 0; w < 2; w++) {
                uint32_t cnt = w ? op->ndst : op->nsrc;
                for (uint32_t k = 0; k < cnt; k++) {
                    const struct mscx_dev_operand *o = w ? &op->dst[k] : &op->src[k];
                    uint32_t owner = r, type = o->type;
                    if (o->flags & MSCX_OPND_SWITCH)
                        continue;
                    if (o->flags & MSCX_OPND_REMOTE) {
                        owner = g->rbuf[o->rbuf].rank;
                        type = g->rbuf[o->rbuf].type;
                    }
                    if (type > MSCX_BUF_OUTPUT || owner >= OPS_MAXR)
                        continue;
                    uint32_t nc = type ? plan->gpus[owner].output_chunks : plan->gpus[owner].input_chunks;
                    /* 1: the owner reads it; 2: a peer writes it */
                    uint8_t bit = (!w && owner == r) ? 1 : (w && owner != r) ? 2 : 0;
                    for (uint32_t c = o->index; bit && c < o->index + o->size && c < nc; c++)
                        m[owner][type][c] |= bit;
                }
            }
        }
    }
    for (uint32_t r = 0; r < n && r < OPS_MAXR; r++)
        for (int t = 0; t < 2; t++) {
            uint32_t nc = t ? plan->gpus[r].output_chunks : plan->gpus[r].input_chunks;
            for (uint32_t c = 0; c < nc; c++)
                bad |= m[r][t][c] == 3;
            free(m[r][t]);
        }
    return bad;
}

#endif /* MSCX_TEST_OP_PLAN_SKIP_H */
