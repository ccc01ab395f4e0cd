/* SPDX-License-Identifier: MIT */
/*
 * The plan validator's ordering check: accesses to a peer's user buffers
 * happen within its launch (see plan_validate.c).
 *
 * A rank's launch ends when its last block finishes; from then on its caller
 * may read or refill its input and output. An op of another rank that reads
 * or writes those user buffers must therefore happen before some op of the
 * owner, or what the owner's caller sees depends on the ranks' timing: the
 * host executor collects and refills each rank at its own launch boundaries,
 * and a GPU run that waits for every rank before looking hides the race.
 * (The other end needs no plan support: both executors touch a peer's user
 * buffers only once that peer has started the same launch.) The
 * happens-before chains follow program order within a block; signals to
 * waits (the k-th signal of a channel to the k-th wait of its pair when
 * each side sits in one block; with the signals in one block, the first to
 * every wait; with the waits in one block, every signal to the last); the
 * k-th use of a barrier in all the blocks that use it; semaphore releases
 * to acquires, as for channels (an acquire needs as many releases as it
 * outnumbers the initial value). Nothing else counts (packet flags, for
 * one), so a plan that relies on anything else is refused: the check errs
 * towards refusing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_model.h"
#include "plan_validate_int.h"

/* The happens-before graph over every op of the plan (and one node per barrier meeting). */
struct hb {
    const struct mscx_plan *plan;
    uint32_t *base;  /* [nranks]: the node of rank r's op i is base[r] + i */
    uint32_t *owner; /* [nnode]: the rank of every node (ops, then barrier meetings) */
    uint32_t nnode;
    uint32_t (*edge)[2];
    size_t nedge, cap;
    uint32_t *first, *adj; /* edges into node n come from adj[first[n] .. first[n + 1]) */
    uint8_t *seen;         /* [nnode] */
    uint32_t *queue;       /* [nnode] */
};

/* Ops of one rank on one channel or semaphore, in block order. */
struct hb_list {
    uint32_t *node;
    uint32_t n, cap;
    uint32_t tb;    /* block of the first */
    bool one_block; /* all in that block, so in program order */
};

/* A read or write of a peer's user buffer: operand k of list lst ("src_buff", "dst_buff") of op i. */
struct hb_access {
    uint32_t r, t, i, k, owner;
    const char *lst;
    bool judged, ordered; /* ordered: happens before some op of the owner */
};

static int hb_edge(struct hb *h, uint32_t from, uint32_t to)
{
    if (h->nedge == h->cap) {
        size_t ncap = h->cap ? h->cap * 2 : 256;
        void *n = realloc(h->edge, ncap * sizeof(*h->edge));
        if (n == NULL)
            return -1;
        h->edge = n;
        h->cap = ncap;
    }
    h->edge[h->nedge][0] = from;
    h->edge[h->nedge][1] = to;
    h->nedge++;
    return 0;
}

static int hb_push(struct hb_list *l, uint32_t node, uint32_t tb)
{
    if (l->n == l->cap) {
        uint32_t ncap = l->cap ? l->cap * 2 : 8;
        uint32_t *n = realloc(l->node, ncap * sizeof(*n));
        if (n == NULL)
            return -1;
        l->node = n;
        l->cap = ncap;
    }
    if (l->n == 0) {
        l->tb = tb;
        l->one_block = true;
    } else if (tb != l->tb) {
        l->one_block = false;
    }
    l->node[l->n++] = node;
    return 0;
}

/* Signals (@p produce) or waits of one op on channel @p c of type @p ty. */
static uint32_t chan_uses(const struct mscx_dev_op *op, int ty, uint32_t c, bool produce)
{
    uint32_t n = 0;
    if (op->chan_type != ty || !(produce ? mscx_pv_is_signal(op) : mscx_pv_is_wait(op)))
        return 0;
    for (uint32_t k = 0; k < op->nchan; k++)
        n += op->chan[k] == c;
    return n;
}

/* Releases (@p produce) or acquires of semaphore @p s by one op. */
static uint32_t sem_uses(const struct mscx_dev_op *op, uint32_t s, bool produce)
{
    uint32_t n = 0;
    if (op->opcode != (produce ? MSCX_OP_SEM_RELEASE : MSCX_OP_SEM_ACQUIRE))
        return 0;
    for (uint32_t k = 0; k < op->nsem; k++)
        n += op->sem[k] == s;
    return n;
}

/* Rank @p r's signals or waits on channel (ty, c); with @p ty MSCX_CHAN_NONE, its uses of semaphore c. */
static int hb_gather(const struct hb *h, uint32_t r, int ty, uint32_t c, bool produce, struct hb_list *l)
{
    const struct mscx_gpu *g = &h->plan->gpus[r];
    l->n = 0;
    for (uint32_t t = 0; t < g->ntb; t++)
        for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            uint32_t n = ty == MSCX_CHAN_NONE ? sem_uses(op, c, produce) : chan_uses(op, ty, c, produce);
            for (uint32_t k = 0; k < n; k++)
                if (hb_push(l, h->base[r] + i, t))
                    return -1;
        }
    return 0;
}

/*
 * Edges from producers @p p (signals, releases) to consumers @p q (waits,
 * acquires), where a consumer completes only after as many producers as its
 * turn among the consumers, less @p skip (a semaphore's initial value).
 * Consumers in one block take their turns in program order; otherwise each
 * takes at least the first turn, and one of them the last.
 */
static int hb_pair(struct hb *h, const struct hb_list *p, const struct hb_list *q, int64_t skip)
{
    if (p->n == 0 || q->n == 0)
        return 0;
    if (p->one_block && q->one_block) {
        for (uint32_t k = 0; k < q->n; k++) {
            int64_t need = (int64_t)k + 1 - skip;
            if (need >= 1 && need <= (int64_t)p->n && hb_edge(h, p->node[need - 1], q->node[k]))
                return -1;
        }
        return 0;
    }
    if (p->one_block) { /* the consumers' turns are not known: each needs the first producer */
        if (skip >= 1)
            return 0;
        for (uint32_t k = 0; k < q->n; k++)
            if (hb_edge(h, p->node[0], q->node[k]))
                return -1;
        return 0;
    }
    if (!q->one_block || (int64_t)q->n - skip != (int64_t)p->n)
        return 0;                       /* no consumer is known to need a given producer */
    for (uint32_t j = 0; j < p->n; j++) /* the last consumer needs every producer */
        if (hb_edge(h, p->node[j], q->node[q->n - 1]))
            return -1;
    return 0;
}

static int hb_sync_edges(struct hb *h)
{
    const struct mscx_plan *p = h->plan;
    struct hb_list a = {0}, b = {0};
    int rc = 0;
    for (uint32_t r = 0; r < p->nranks && rc == 0; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT && rc == 0; ty++)
            for (uint32_t c = 0; c < g->nchan[ty] && rc == 0; c++) {
                const struct mscx_chan *ch = &g->chan[ty][c];
                if (!ch->paired)
                    continue;
                rc = hb_gather(h, r, ty, c, true, &a);
                if (rc == 0)
                    rc = hb_gather(h, ch->peer, ty, ch->pair, false, &b);
                if (rc == 0)
                    rc = hb_pair(h, &a, &b, 0);
            }
        for (uint32_t s = 0; s < g->nsem && rc == 0; s++) {
            rc = hb_gather(h, r, MSCX_CHAN_NONE, s, true, &a);
            if (rc == 0)
                rc = hb_gather(h, r, MSCX_CHAN_NONE, s, false, &b);
            if (rc == 0)
                rc = hb_pair(h, &a, &b, g->sem_init[s]);
        }
    }
    free(a.node);
    free(b.node);
    return rc;
}

/* The most uses of each barrier id in one block of @p g, into @p per; @return their sum. */
static uint32_t barrier_uses(const struct mscx_gpu *g, uint32_t per[MSCX_MAX_BARRIERS])
{
    uint32_t n = 0;
    memset(per, 0, MSCX_MAX_BARRIERS * sizeof(per[0]));
    for (uint32_t t = 0; t < g->ntb; t++) {
        uint32_t uses[MSCX_MAX_BARRIERS] = {0};
        for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
            uint32_t b = g->ops[i].barrier_id;
            if (g->ops[i].opcode == MSCX_OP_BARRIER && ++uses[b] > per[b])
                per[b] = uses[b];
        }
    }
    for (uint32_t b = 0; b < MSCX_MAX_BARRIERS; b++)
        n += per[b];
    return n;
}

/* Every block's k-th use of barrier b on rank @p r meets the others at one node from @p *next_p on. */
static int hb_barrier_edges(struct hb *h, uint32_t r, uint32_t *next_p)
{
    const struct mscx_gpu *g = &h->plan->gpus[r];
    uint32_t per[MSCX_MAX_BARRIERS], meet[MSCX_MAX_BARRIERS];
    barrier_uses(g, per);
    for (uint32_t b = 0; b < MSCX_MAX_BARRIERS; b++) {
        meet[b] = *next_p;
        for (uint32_t k = 0; k < per[b]; k++)
            h->owner[(*next_p)++] = r;
    }
    for (uint32_t t = 0; t < g->ntb; t++) {
        uint32_t uses[MSCX_MAX_BARRIERS] = {0};
        for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            if (op->opcode != MSCX_OP_BARRIER)
                continue;
            uint32_t node = h->base[r] + i, m = meet[op->barrier_id] + uses[op->barrier_id]++;
            if (hb_edge(h, node, m) || hb_edge(h, m, node))
                return -1;
        }
    }
    return 0;
}

/* Nodes, edges and the adjacency of the whole plan. */
static int hb_build(struct hb *h)
{
    const struct mscx_plan *p = h->plan;
    uint32_t nops = 0, nmeet = 0, per[MSCX_MAX_BARRIERS];
    h->base = calloc(p->nranks, sizeof(*h->base));
    if (h->base == NULL)
        return -1;
    for (uint32_t r = 0; r < p->nranks; r++) {
        h->base[r] = nops;
        nops += p->gpus[r].nops;
        nmeet += barrier_uses(&p->gpus[r], per);
    }
    h->nnode = nops + nmeet;
    h->owner = calloc(h->nnode + 1u, sizeof(*h->owner));
    h->first = calloc(h->nnode + 1u, sizeof(*h->first));
    h->seen = calloc(h->nnode + 1u, 1);
    h->queue = calloc(h->nnode + 1u, sizeof(*h->queue));
    if (h->owner == NULL || h->first == NULL || h->seen == NULL || h->queue == NULL)
        return -1;
    uint32_t next = nops;
    for (uint32_t r = 0; r < p->nranks; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++)
            h->owner[h->base[r] + i] = r;
        for (uint32_t t = 0; t < g->ntb; t++)
            for (uint32_t i = g->tb[t].op_begin; i + 1 < g->tb[t].op_begin + g->tb[t].nops; i++)
                if (hb_edge(h, h->base[r] + i, h->base[r] + i + 1))
                    return -1;
        if (hb_barrier_edges(h, r, &next))
            return -1;
    }
    if (hb_sync_edges(h))
        return -1;
    h->adj = malloc((h->nedge + 1u) * sizeof(*h->adj));
    if (h->adj == NULL)
        return -1;
    /* first[n]: the end of n's in-edges, then, filled from the back, their start */
    for (size_t e = 0; e < h->nedge; e++)
        h->first[h->edge[e][1]]++;
    for (uint32_t n = 1; n < h->nnode; n++)
        h->first[n] += h->first[n - 1];
    h->first[h->nnode] = (uint32_t)h->nedge;
    for (size_t e = 0; e < h->nedge; e++)
        h->adj[--h->first[h->edge[e][1]]] = h->edge[e][0];
    return 0;
}

static void hb_free(struct hb *h)
{
    free(h->base);
    free(h->owner);
    free(h->edge);
    free(h->first);
    free(h->adj);
    free(h->seen);
    free(h->queue);
}

/* Mark in h->seen every node from which a chain of edges leads to a node of rank @p rank. */
static void hb_mark_reaching(struct hb *h, uint32_t rank)
{
    uint32_t tail = 0;
    memset(h->seen, 0, h->nnode);
    for (uint32_t n = 0; n < h->nnode; n++)
        if (h->owner[n] == rank) {
            h->seen[n] = 1;
            h->queue[tail++] = n;
        }
    for (uint32_t head = 0; head < tail;) {
        uint32_t n = h->queue[head++];
        for (uint32_t e = h->first[n]; e < h->first[n + 1]; e++) {
            uint32_t m = h->adj[e];
            if (!h->seen[m]) {
                h->seen[m] = 1;
                h->queue[tail++] = m;
            }
        }
    }
}

static bool peer_user(const struct mscx_gpu *g, uint32_t r, const struct mscx_dev_operand *o)
{
    return (o->flags & MSCX_OPND_REMOTE) && !(o->flags & MSCX_OPND_SWITCH) && o->rbuf < g->nrbuf &&
           g->rbuf[o->rbuf].type <= MSCX_BUF_OUTPUT && g->rbuf[o->rbuf].rank != r;
}

/* Every operand of an executed op that names a peer's input or output, in plan order. */
static int peer_accesses(const struct mscx_plan *p, struct hb_access **acc_p, uint32_t *n_p)
{
    struct hb_access *acc = NULL;
    uint32_t n = 0, cap = 0;
    for (uint32_t r = 0; r < p->nranks; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (uint32_t t = 0; t < g->ntb; t++)
            for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
                const struct mscx_dev_op *op = &g->ops[i];
                if (mscx_opcode_is_multicast(op->opcode))
                    continue; /* parsed, never executed */
                for (uint32_t k = 0; k < (uint32_t)op->nsrc + op->ndst; k++) {
                    bool dst = k >= op->nsrc;
                    const struct mscx_dev_operand *o = dst ? &op->dst[k - op->nsrc] : &op->src[k];
                    if (!peer_user(g, r, o))
                        continue;
                    if (n == cap) {
                        cap = cap ? cap * 2 : 16;
                        struct hb_access *na = realloc(acc, cap * sizeof(*na));
                        if (na == NULL) {
                            free(acc);
                            return -1;
                        }
                        acc = na;
                    }
                    struct hb_access *a = &acc[n++];
                    a->r = r;
                    a->t = t;
                    a->i = i;
                    a->k = dst ? k - op->nsrc : k;
                    a->owner = g->rbuf[o->rbuf].rank;
                    a->lst = dst ? "dst_buff" : "src_buff";
                    a->judged = a->ordered = false;
                }
            }
    }
    *acc_p = acc;
    *n_p = n;
    return 0;
}

static int peer_access_fail(struct vctx *v, const struct hb_access *a)
{
    const struct mscx_gpu *g = &v->plan->gpus[a->r];
    const struct mscx_dev_op *op = &g->ops[a->i];
    const bool dst = a->lst[0] == 'd';
    const struct mscx_dev_operand *o = dst ? &op->dst[a->k] : &op->src[a->k];
    char leaf[32], chunks[48];
    snprintf(leaf, sizeof(leaf), "%s[%u]", a->lst, a->k);
    mscx_pv_op_path(v, a->r, a->t, a->i, leaf);
    if (o->size == 1)
        snprintf(chunks, sizeof(chunks), "chunk %u", o->index);
    else
        snprintf(chunks, sizeof(chunks), "chunks %u to %u", o->index, o->index + o->size - 1);
    return mscx_pv_fail(
        v,
        "expected the %s of rank %u's %s %s by %s (rank %u thread block %u) to be ordered before the end "
        "of rank %u's launch (a signal after it that rank %u waits for, directly or through barriers or "
        "semaphores), got none: plan %s is order-dependent",
        dst ? "write" : "read", a->owner, mscx_pv_btype_names[g->rbuf[o->rbuf].type], chunks,
        mscx_opcode_name((enum mscx_opcode)op->opcode), a->r, a->t, a->owner, a->owner, v->plan->name);
}

/*
 * Every access to a peer's user buffer happens before the end of the
 * owner's launch (see the top of this file). Plans without such accesses
 * (the shipped ones) cost one scan.
 */
int mscx_pv_check_peer_accesses(struct vctx *v)
{
    struct hb h;
    struct hb_access *acc = NULL;
    uint32_t n = 0;
    int rc = 0;
    memset(&h, 0, sizeof(h));
    h.plan = v->plan;
    if (peer_accesses(v->plan, &acc, &n))
        return mscx_pv_fail(v, "out of memory");
    if (n == 0)
        return 0;
    if (hb_build(&h)) {
        rc = mscx_pv_fail(v, "out of memory");
        goto out;
    }
    /* one walk per owner, at its first access; the first access in plan order that is not ordered fails */
    for (uint32_t a = 0; a < n && rc == 0; a++) {
        if (!acc[a].judged) {
            hb_mark_reaching(&h, acc[a].owner);
            for (uint32_t b = a; b < n; b++)
                if (acc[b].owner == acc[a].owner) {
                    acc[b].judged = true;
                    acc[b].ordered = h.seen[h.base[acc[b].r] + acc[b].i] != 0;
                }
        }
        if (!acc[a].ordered)
            rc = peer_access_fail(v, &acc[a]);
    }
out:
    hb_free(&h);
    free(acc);
    return rc;
}
