/* SPDX-License-Identifier: MIT */
/*
 * The plan validator's synchronisation checks (see plan_validate.c): every
 * launch uses each barrier consistently, leaves every semaphore at its
 * initial value, and consumes every signal with a wait on the paired
 * channel, so no wait hangs and no semaphore drifts from launch to launch.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "plan_model.h"
#include "plan_validate_int.h"

/* Every block using barrier b uses it equally often; their count is num_threadblocks. */
int mscx_pv_check_barriers(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    uint32_t *uses;
    int rc = 0;
    if (g->ntb == 0)
        return 0;
    uses = calloc((size_t)g->ntb * MSCX_MAX_BARRIERS, sizeof(uint32_t));
    if (uses == NULL)
        return mscx_pv_fail(v, "out of memory");
    for (uint32_t t = 0; t < g->ntb; t++)
        for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++)
            if (g->ops[i].opcode == MSCX_OP_BARRIER)
                uses[t * MSCX_MAX_BARRIERS + g->ops[i].barrier_id]++;
    for (uint32_t b = 0; b < MSCX_MAX_BARRIERS && rc == 0; b++) {
        uint32_t nblocks = 0, per = 0, first = 0;
        for (uint32_t t = 0; t < g->ntb; t++) {
            uint32_t u = uses[t * MSCX_MAX_BARRIERS + b];
            if (u == 0)
                continue;
            if (nblocks++ == 0) {
                per = u;
                first = t;
            }
        }
        for (uint32_t t = 0; t < g->ntb && rc == 0; t++) {
            uint32_t u = uses[t * MSCX_MAX_BARRIERS + b];
            for (uint32_t i = g->tb[t].op_begin; u && i < g->tb[t].op_begin + g->tb[t].nops; i++) {
                const struct mscx_dev_op *op = &g->ops[i];
                if (op->opcode != MSCX_OP_BARRIER || op->barrier_id != b)
                    continue;
                if (u != per) {
                    mscx_pv_op_path(v, r, t, i, "barrier_id");
                    rc = mscx_pv_fail(
                        v, "expected barrier %u %u times per block as in thread block %u, got %u times", b,
                        per, first, u);
                } else if (op->barrier_ntb != nblocks) {
                    mscx_pv_op_path(v, r, t, i, "num_threadblocks");
                    rc = mscx_pv_fail(v, "expected %u (the blocks that use barrier %u), got %u", nblocks, b,
                                      op->barrier_ntb);
                }
                break;
            }
        }
    }
    free(uses);
    return rc;
}

/* Releases equal acquires per semaphore and launch, so each launch leaves the initial values. */
int mscx_pv_check_semaphores(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    int64_t *bal;
    int rc = 0;
    if (g->nsem == 0)
        return 0;
    bal = calloc(g->nsem * 2, sizeof(int64_t));
    if (bal == NULL)
        return mscx_pv_fail(v, "out of memory");
    for (uint32_t i = 0; i < g->nops; i++) {
        const struct mscx_dev_op *op = &g->ops[i];
        if (op->opcode != MSCX_OP_SEM_ACQUIRE && op->opcode != MSCX_OP_SEM_RELEASE)
            continue;
        for (uint32_t k = 0; k < op->nsem; k++)
            bal[op->sem[k] * 2 + (op->opcode == MSCX_OP_SEM_RELEASE)]++;
    }
    for (uint32_t s = 0; s < g->nsem; s++) {
        if (bal[s * 2] != bal[s * 2 + 1]) {
            mscx_pv_path(v, "gpus[%u].semaphores[%u]", r, s);
            rc = mscx_pv_fail(v,
                              "expected as many sem_release as sem_acquire per launch (%" PRId64
                              " acquires), got %" PRId64 " releases",
                              bal[s * 2], bal[s * 2 + 1]);
            break;
        }
    }
    free(bal);
    return rc;
}

/* The signals and waits of one channel per launch. */
struct sigcount {
    uint32_t sig, wait;
    uint32_t sig_t, sig_i, wait_t, wait_i; /* first signalling / waiting op */
};

/* Count, per rank and channel, the signals and waits of one launch into @p cnt ([rank][type] tables). */
static int count_signals(struct vctx *v, struct sigcount **cnt)
{
    const struct mscx_plan *p = v->plan;
    int rc = 0;
    for (uint32_t r = 0; r < p->nranks && rc == 0; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT; ty++) {
            cnt[r * MSCX_CHAN_COUNT + ty] = calloc(g->nchan[ty] ? g->nchan[ty] : 1, sizeof(struct sigcount));
            if (cnt[r * MSCX_CHAN_COUNT + ty] == NULL)
                rc = mscx_pv_fail(v, "out of memory");
        }
        for (uint32_t t = 0; t < g->ntb && rc == 0; t++) {
            for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
                const struct mscx_dev_op *op = &g->ops[i];
                bool s = mscx_pv_is_signal(op), w = mscx_pv_is_wait(op);
                if ((!s && !w) || op->chan_type < MSCX_CHAN_MEMORY || op->chan_type > MSCX_CHAN_PORT)
                    continue;
                for (uint32_t k = 0; k < op->nchan; k++) {
                    struct sigcount *sc = &cnt[r * MSCX_CHAN_COUNT + op->chan_type][op->chan[k]];
                    if (s && sc->sig++ == 0) {
                        sc->sig_t = t;
                        sc->sig_i = i;
                    }
                    if (w && sc->wait++ == 0) {
                        sc->wait_t = t;
                        sc->wait_i = i;
                    }
                }
            }
        }
    }
    return rc;
}

/* A channel that signals or waits must have a pair on the peer. */
static int check_unpaired(struct vctx *v, struct sigcount *const *cnt)
{
    const struct mscx_plan *p = v->plan;
    int rc = 0;
    for (uint32_t a = 0; a < p->nranks && rc == 0; a++) {
        const struct mscx_gpu *g = &p->gpus[a];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT && rc == 0; ty++) {
            for (uint32_t c = 0; c < g->nchan[ty] && rc == 0; c++) {
                const struct mscx_chan *ch = &g->chan[ty][c];
                const struct sigcount *sa = &cnt[a * MSCX_CHAN_COUNT + ty][c];
                if (ch->paired || (!sa->sig && !sa->wait))
                    continue;
                mscx_pv_op_path(v, a, sa->sig ? sa->sig_t : sa->wait_t, sa->sig ? sa->sig_i : sa->wait_i,
                                "channel_ids");
                rc = mscx_pv_fail(
                    v,
                    "expected a %s channel that rank %u pairs with (it declares fewer %s channels "
                    "to rank %u), got rank %u %s channel %u",
                    mscx_pv_ctype_names[ty], ch->peer, mscx_pv_ctype_names[ty], a, a, mscx_pv_ctype_names[ty],
                    c);
            }
        }
    }
    return rc;
}

/*
 * Per channel: a signal on rank A's channel c lands on the channel of rank B
 * that pairs with it (the k-th channel of A to B pairs with the k-th of B to
 * A, as connections are made in declaration order), and only a wait there
 * consumes it. Any other count leaves a wait that never finishes or a
 * semaphore that drifts one step per launch.
 */
static int check_pairs(struct vctx *v, struct sigcount *const *cnt)
{
    const struct mscx_plan *p = v->plan;
    int rc = 0;
    for (uint32_t a = 0; a < p->nranks && rc == 0; a++) {
        const struct mscx_gpu *g = &p->gpus[a];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT && rc == 0; ty++) {
            for (uint32_t c = 0; c < g->nchan[ty] && rc == 0; c++) {
                const struct mscx_chan *ch = &g->chan[ty][c];
                if (!ch->paired)
                    continue;
                const struct sigcount *sa = &cnt[a * MSCX_CHAN_COUNT + ty][c];
                const struct sigcount *sb = &cnt[ch->peer * MSCX_CHAN_COUNT + ty][ch->pair];
                if (sa->sig == sb->wait)
                    continue;
                if (sa->sig)
                    mscx_pv_op_path(v, a, sa->sig_t, sa->sig_i, "channel_ids");
                else
                    mscx_pv_op_path(v, ch->peer, sb->wait_t, sb->wait_i, "channel_ids");
                rc = mscx_pv_fail(
                    v,
                    "expected as many waits on rank %u %s channel %u as signals on its pair, rank %u %s "
                    "channel %u (%u per launch), got %u waits",
                    ch->peer, mscx_pv_ctype_names[ty], ch->pair, a, mscx_pv_ctype_names[ty], c, sa->sig,
                    sb->wait);
            }
        }
    }
    return rc;
}

/* Signals sent on rank A's channel k must equal the waits on B's paired channel, per launch. */
int mscx_pv_check_signals(struct vctx *v)
{
    const struct mscx_plan *p = v->plan;
    struct sigcount **cnt = calloc((size_t)p->nranks * MSCX_CHAN_COUNT, sizeof(*cnt));
    int rc;
    if (cnt == NULL)
        return mscx_pv_fail(v, "out of memory");
    rc = count_signals(v, cnt);
    if (rc == 0)
        rc = check_unpaired(v, cnt);
    if (rc == 0)
        rc = check_pairs(v, cnt);
    for (size_t k = 0; k < (size_t)p->nranks * MSCX_CHAN_COUNT; k++)
        free(cnt[k]);
    free(cnt);
    return rc;
}
