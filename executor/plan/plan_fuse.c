/* SPDX-License-Identifier: MIT */
/*
 * The fusion pass: the MSCCL++ DSL's instruction fusion (plan format section
 * 3.3), applied to a loaded plan. Per thread block, greedy and left to right,
 * `cur = cur + next` is repeated while a rule applies, so chains fold; pipeline
 * bodies are fused on their own and nothing fuses across a pipeline boundary.
 *
 * Every rule keeps the result bit for bit: the fused op performs the same
 * element operations in the same order as the pair it replaces. Where the
 * DSL's condition is weaker than that, we are stricter:
 *   - reduce + reduce (re, repkt, rre) needs an in-place first op (out[0] ==
 *     in[0]); otherwise the second op would overwrite the first's result, and
 *     the merged op would fold both source lists;
 *   - the concatenating rules (put, get, pws, pwsf, ppkt, rppkt pairs and
 *     reduce + reduce) refuse when one op writes memory that the other op
 *     reads or writes, since the merged op does both at once;
 *   - flush + flush needs disjoint channels, like signal and wait;
 *   - every rule, not only the packet ones, needs equal thread-block-group
 *     slicing, because the slice applies to the whole op.
 * Limits (MSCX_MAX_OPERANDS, MSCX_MAX_CHAN_PER_OP) stop a chain; the pass
 * never produces an op the loader would refuse, and the result is validated
 * again before it is returned.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "mscx/plan.h"
#include "plan_model.h"

struct fuse_ctx {
    const struct mscx_gpu *gpu;
    struct mscx_fuse_stats *stats;
};

static bool opnd_eq(const struct mscx_dev_operand *a, const struct mscx_dev_operand *b)
{
    unsigned fa = a->flags & (MSCX_OPND_REMOTE | MSCX_OPND_SWITCH);
    unsigned fb = b->flags & (MSCX_OPND_REMOTE | MSCX_OPND_SWITCH);
    if (a->type != b->type || a->index != b->index || a->size != b->size || fa != fb)
        return false;
    return fa == 0 || a->rbuf == b->rbuf;
}

static bool opnd_list_eq(const struct mscx_dev_operand *a, unsigned na, const struct mscx_dev_operand *b,
                         unsigned nb)
{
    if (na != nb)
        return false;
    for (unsigned i = 0; i < na; i++)
        if (!opnd_eq(&a[i], &b[i]))
            return false;
    return true;
}

/* True when every operand of @p v equals @p ref. */
static bool all_eq(const struct mscx_dev_operand *v, unsigned n, const struct mscx_dev_operand *ref)
{
    for (unsigned i = 0; i < n; i++)
        if (!opnd_eq(&v[i], ref))
            return false;
    return n > 0;
}

static bool all_remote(const struct mscx_dev_operand *v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (!(v[i].flags & MSCX_OPND_REMOTE) || (v[i].flags & MSCX_OPND_SWITCH))
            return false;
    return true;
}

/* Each destination has the size of its source (pairwise put lists). */
static bool pair_sizes_eq(const struct mscx_dev_op *op)
{
    if (op->nsrc != op->ndst)
        return false;
    for (unsigned i = 0; i < op->nsrc; i++)
        if (op->src[i].size != op->dst[i].size)
            return false;
    return true;
}

static bool tbg_eq(const struct mscx_dev_op *a, const struct mscx_dev_op *b)
{
    return (a->flags & MSCX_OPF_TBG) == (b->flags & MSCX_OPF_TBG) && a->tbg_id == b->tbg_id &&
           a->tbg_size == b->tbg_size;
}

/* Could two operands name overlapping memory? Remote ones are compared by owner and type. */
static bool may_alias(const struct fuse_ctx *c, const struct mscx_dev_operand *a,
                      const struct mscx_dev_operand *b)
{
    bool ra = (a->flags & MSCX_OPND_REMOTE) != 0, rb = (b->flags & MSCX_OPND_REMOTE) != 0;
    if ((a->flags | b->flags) & MSCX_OPND_SWITCH)
        return true; /* never executed; be conservative */
    if (ra != rb)
        return false;
    if (ra) {
        if (a->rbuf >= c->gpu->nrbuf || b->rbuf >= c->gpu->nrbuf)
            return true;
        const struct mscx_rbuf *x = &c->gpu->rbuf[a->rbuf], *y = &c->gpu->rbuf[b->rbuf];
        if (x->rank != y->rank || x->type != y->type)
            return false;
    } else if (a->type != b->type) {
        return false;
    }
    return a->index < b->index + b->size && b->index < a->index + a->size;
}

static bool any_alias(const struct fuse_ctx *c, const struct mscx_dev_operand *a, unsigned na,
                      const struct mscx_dev_operand *b, unsigned nb)
{
    for (unsigned i = 0; i < na; i++)
        for (unsigned j = 0; j < nb; j++)
            if (may_alias(c, &a[i], &b[j]))
                return true;
    return false;
}

/*
 * Merging two independent ops into one that does both at once is safe when
 * neither writes what the other touches.
 */
static bool independent(const struct fuse_ctx *c, const struct mscx_dev_op *a, const struct mscx_dev_op *b)
{
    return !any_alias(c, a->dst, a->ndst, b->src, b->nsrc) &&
           !any_alias(c, a->dst, a->ndst, b->dst, b->ndst) && !any_alias(c, b->dst, b->ndst, a->src, a->nsrc);
}

static bool append_opnds(struct mscx_dev_operand *v, uint8_t *n_p, const struct mscx_dev_operand *add,
                         unsigned nadd)
{
    if (*n_p + nadd > MSCX_MAX_OPERANDS)
        return false;
    memcpy(&v[*n_p], add, nadd * sizeof(*add));
    *n_p = (uint8_t)(*n_p + nadd);
    return true;
}

/* Channel lists concatenate; both ops must either list channels or not. */
static bool append_chans(struct mscx_dev_op *out, const struct mscx_dev_op *b)
{
    if ((out->nchan == 0) != (b->nchan == 0))
        return false;
    if (out->nchan + b->nchan > MSCX_MAX_CHAN_PER_OP)
        return false;
    memcpy(&out->chan[out->nchan], b->chan, b->nchan * sizeof(b->chan[0]));
    out->nchan = (uint8_t)(out->nchan + b->nchan);
    return true;
}

static bool chans_disjoint(const struct mscx_dev_op *a, const struct mscx_dev_op *b)
{
    for (unsigned i = 0; i < a->nchan; i++)
        for (unsigned j = 0; j < b->nchan; j++)
            if (a->chan[i] == b->chan[j])
                return false;
    return true;
}

/* reduce (packet or raw) whose raw result feeds a memory put of the same kind: append its destinations. */
static bool fuse_reduce_put(const struct mscx_dev_op *a, const struct mscx_dev_op *b, unsigned new_opcode,
                            struct mscx_dev_op *out)
{
    if (b->chan_type != MSCX_CHAN_MEMORY || b->nchan != 0 || !pair_sizes_eq(b) ||
        !all_remote(b->dst, b->ndst))
        return false;
    if (a->chan_type != MSCX_CHAN_NONE && a->chan_type != MSCX_CHAN_MEMORY)
        return false;
    if (!all_eq(b->src, b->nsrc, &a->dst[0]))
        return false;
    *out = *a;
    if (!append_opnds(out->dst, &out->ndst, b->dst, b->ndst))
        return false;
    out->opcode = (uint8_t)new_opcode;
    out->chan_type = MSCX_CHAN_MEMORY;
    return true;
}

/* The non-packet and same-kind rules (MSCX_FUSE_OTHER). */
static bool fuse_other(const struct fuse_ctx *c, const struct mscx_dev_op *a, const struct mscx_dev_op *b,
                       struct mscx_dev_op *out)
{
    switch (a->opcode) {
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_READ_REDUCE:
        if (b->opcode == a->opcode) {
            /* Fold b's extra sources into a; a must be in place so that b sees a's result as in[0]. */
            if (a->nsrc < 1 || b->nsrc < 2 || a->ndst != 1 || !opnd_eq(&a->src[0], &b->src[0]) ||
                !opnd_list_eq(a->dst, a->ndst, b->dst, b->ndst) || !opnd_eq(&a->dst[0], &a->src[0]) ||
                a->chan_type != b->chan_type || a->reduce_op != b->reduce_op)
                return false;
            if (any_alias(c, a->dst, a->ndst, b->src + 1, b->nsrc - 1u))
                return false;
            *out = *a;
            return append_opnds(out->src, &out->nsrc, b->src + 1, b->nsrc - 1u) && append_chans(out, b);
        }
        if (a->opcode != MSCX_OP_REDUCE_PACKETS && b->opcode == MSCX_OP_PUT)
            return fuse_reduce_put(
                a, b, a->opcode == MSCX_OP_REDUCE ? MSCX_OP_REDUCE_SEND : MSCX_OP_READ_REDUCE_SEND, out);
        return false;
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE_SEND:
        if (b->opcode == MSCX_OP_PUT && a->chan_type == MSCX_CHAN_MEMORY)
            return fuse_reduce_put(a, b, a->opcode, out);
        return false;
    case MSCX_OP_GET:
    case MSCX_OP_PUT:
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
    case MSCX_OP_PUT_PACKETS:
        if (b->opcode != a->opcode || a->chan_type != b->chan_type || a->nsrc == 0 || b->nsrc == 0 ||
            a->src[0].size != b->src[0].size || !independent(c, a, b))
            return false;
        *out = *a;
        return append_opnds(out->src, &out->nsrc, b->src, b->nsrc) &&
               append_opnds(out->dst, &out->ndst, b->dst, b->ndst) && append_chans(out, b);
    case MSCX_OP_SIGNAL:
    case MSCX_OP_WAIT:
    case MSCX_OP_RELAXED_SIGNAL:
    case MSCX_OP_RELAXED_WAIT:
    case MSCX_OP_FLUSH:
        if (b->opcode != a->opcode || a->chan_type != b->chan_type || a->nchan == 0 || b->nchan == 0 ||
            !chans_disjoint(a, b) || a->nsrc || a->ndst || b->nsrc || b->ndst)
            return false;
        *out = *a;
        return append_chans(out, b);
    default:
        return false;
    }
}

/* @p ok, recording @p rule in @p rule_p when it fired. */
static bool fired(bool ok, enum mscx_fuse_rule rule, enum mscx_fuse_rule *rule_p)
{
    if (ok)
        *rule_p = rule;
    return ok;
}

/* repkt + cpkt -> recpkt: the copy packs the reduce's raw result. */
static bool fuse_repkt_cpkt(const struct mscx_dev_op *a, const struct mscx_dev_op *b, struct mscx_dev_op *out)
{
    if (a->ndst != 1 || a->chan_type != MSCX_CHAN_NONE || b->nsrc != 1 || b->ndst != 1 ||
        !opnd_eq(&a->dst[0], &b->src[0]) || (b->dst[0].flags & MSCX_OPND_REMOTE))
        return false;
    *out = *a;
    out->opcode = MSCX_OP_REDUCE_COPY_PACKETS;
    out->dst[1] = b->dst[0];
    out->ndst = 2;
    return true;
}

/* recpkt / recspkt + rppkt: the rppkt forwards the packet copy out[1]. */
static bool fuse_recpkt_rppkt(const struct mscx_dev_op *a, const struct mscx_dev_op *b,
                              struct mscx_dev_op *out)
{
    if (b->chan_type != MSCX_CHAN_MEMORY || b->nchan != 0 || b->nsrc != 1 ||
        !opnd_eq(&a->dst[1], &b->src[0]) || !all_remote(b->dst, b->ndst))
        return false;
    for (unsigned i = 0; i < b->ndst; i++)
        if (b->dst[i].size != b->src[0].size)
            return false;
    *out = *a;
    if (!append_opnds(out->dst, &out->ndst, b->dst, b->ndst))
        return false;
    out->opcode = MSCX_OP_REDUCE_COPY_SEND_PACKETS;
    out->chan_type = MSCX_CHAN_MEMORY;
    return true;
}

/* recpkt / recspkt + ppkt (the put packs the raw result out[0]) or + rppkt. */
static bool fuse_recpkt(const struct mscx_dev_op *a, const struct mscx_dev_op *b, struct mscx_dev_op *out,
                        enum mscx_fuse_rule *rule_p)
{
    if (a->ndst < 2 || (a->opcode == MSCX_OP_REDUCE_COPY_SEND_PACKETS && a->chan_type != MSCX_CHAN_MEMORY))
        return false;
    if (b->opcode == MSCX_OP_PUT_PACKETS)
        return fired(fuse_reduce_put(a, b, MSCX_OP_REDUCE_COPY_SEND_PACKETS, out), MSCX_FUSE_RECPKT_PPKT,
                     rule_p);
    if (b->opcode == MSCX_OP_READ_PUT_PACKETS)
        return fired(fuse_recpkt_rppkt(a, b, out), MSCX_FUSE_RECPKT_RPPKT, rule_p);
    return false;
}

/* rppkt + rppkt: the same source read once, forwarded to every destination. */
static bool fuse_rppkt_rppkt(const struct fuse_ctx *c, const struct mscx_dev_op *a,
                             const struct mscx_dev_op *b, struct mscx_dev_op *out)
{
    if (a->chan_type != b->chan_type || !opnd_list_eq(a->src, a->nsrc, b->src, b->nsrc) ||
        any_alias(c, a->dst, a->ndst, b->dst, b->ndst))
        return false;
    *out = *a;
    return append_opnds(out->dst, &out->ndst, b->dst, b->ndst) && append_chans(out, b);
}

/*
 * Try `a + b`. On success the fused op is in @p out and the rule that fired in
 * @p rule_p. @p out is scratch space on failure. A packet rule that matches
 * the pair's opcodes decides alone; repkt followed by anything but cpkt or
 * ppkt falls through to the other rules.
 */
static bool try_fuse(const struct fuse_ctx *c, const struct mscx_dev_op *a, const struct mscx_dev_op *b,
                     struct mscx_dev_op *out, enum mscx_fuse_rule *rule_p)
{
    if (!tbg_eq(a, b) || a->opcode == MSCX_OP_PIPELINE || b->opcode == MSCX_OP_PIPELINE)
        return false;

    switch (a->opcode) {
    case MSCX_OP_REDUCE_PACKETS:
        if (b->opcode == MSCX_OP_COPY_PACKETS)
            return fired(fuse_repkt_cpkt(a, b, out), MSCX_FUSE_REPKT_CPKT, rule_p);
        if (b->opcode == MSCX_OP_PUT_PACKETS)
            return fired(a->ndst == 1 && fuse_reduce_put(a, b, MSCX_OP_REDUCE_SEND_PACKETS, out),
                         MSCX_FUSE_REPKT_PPKT, rule_p);
        break;
    case MSCX_OP_REDUCE_SEND_PACKETS:
        if (b->opcode == MSCX_OP_PUT_PACKETS && a->chan_type == MSCX_CHAN_MEMORY)
            return fired(fuse_reduce_put(a, b, MSCX_OP_REDUCE_SEND_PACKETS, out), MSCX_FUSE_REPKT_PPKT,
                         rule_p);
        return false;
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        return fuse_recpkt(a, b, out, rule_p);
    case MSCX_OP_READ_PUT_PACKETS:
        if (b->opcode == MSCX_OP_READ_PUT_PACKETS)
            return fired(fuse_rppkt_rppkt(c, a, b, out), MSCX_FUSE_RPPKT_RPPKT, rule_p);
        return false;
    default:
        break;
    }
    return fired(fuse_other(c, a, b, out), MSCX_FUSE_OTHER, rule_p);
}

/*
 * Fuse ops[0, n) into out[], which may be ops itself (out never runs ahead of
 * the read position). @return the number of ops written.
 */
static uint32_t fuse_range(const struct fuse_ctx *c, const struct mscx_dev_op *in, uint32_t n,
                           struct mscx_dev_op *out)
{
    uint32_t i = 0, w = 0;
    struct mscx_dev_op cur, next;
    while (i < n) {
        cur = in[i];
        if (cur.opcode == MSCX_OP_PIPELINE) {
            uint32_t body = cur.pipe_nops <= n - i - 1 ? cur.pipe_nops : n - i - 1;
            uint32_t wb = fuse_range(c, in + i + 1, body, out + w + 1);
            cur.pipe_nops = (uint16_t)wb;
            out[w] = cur;
            w += 1 + wb;
            i += 1 + body;
            continue;
        }
        i++;
        while (i < n) {
            enum mscx_fuse_rule rule = MSCX_FUSE_OTHER;
            if (!try_fuse(c, &cur, &in[i], &next, &rule))
                break;
            cur = next;
            c->stats->rule_hits[rule]++;
            i++;
        }
        out[w++] = cur;
    }
    return w;
}

static uint32_t count_ops(const struct mscx_plan *plan)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < plan->nranks; r++)
        n += plan->gpus[r].nops;
    return n;
}

mscx_status_t mscx_plan_fuse(const struct mscx_plan *plan, struct mscx_plan **fused_p,
                             struct mscx_fuse_stats *stats_p)
{
    struct mscx_plan *copy = NULL;
    struct mscx_fuse_stats stats;
    char path[256], msg[MSCX_PLAN_ERR_LEN];
    mscx_status_t st;

    if (plan == NULL || fused_p == NULL) {
        MSCX_WARN("caller bug: mscx_plan_fuse: NULL argument");
        return MSCX_ERR_INVALID_ARG;
    }
    memset(&stats, 0, sizeof(stats));
    MSCX_CHECK(mscx_plan_clone(plan, &copy));
    stats.ops_before = count_ops(copy);

    for (uint32_t r = 0; r < copy->nranks; r++) {
        struct mscx_gpu *gpu = &copy->gpus[r];
        struct fuse_ctx c = {.gpu = gpu, .stats = &stats};
        uint32_t w = 0;
        /* Thread blocks are stored in order, so compacting in place never overtakes the reader. */
        for (uint32_t t = 0; t < gpu->ntb; t++) {
            struct mscx_tb *tb = &gpu->tb[t];
            uint32_t nw = fuse_range(&c, gpu->ops + tb->op_begin, tb->nops, gpu->ops + w);
            tb->op_begin = w;
            tb->nops = nw;
            w += nw;
        }
        gpu->nops = w;
    }
    stats.ops_after = count_ops(copy);
    copy->fuse = stats;
    copy->fused = true;

    path[0] = msg[0] = '\0';
    st = mscx_plan_validate(copy, path, sizeof(path), msg, sizeof(msg));
    if (st != MSCX_OK) {
        MSCX_WARN("internal bug: plan %s: the fused plan does not validate: %s: %s",
                  plan->name ? plan->name : "?", path, msg);
        st = MSCX_ERR_INTERNAL;
        goto err_free_copy;
    }
    MSCX_INFO(MSCX_SUB_PLAN, "plan %s: fusion %u -> %u ops", plan->name ? plan->name : "?", stats.ops_before,
              stats.ops_after);
    if (stats_p != NULL)
        *stats_p = stats;
    *fused_p = copy;
    return MSCX_OK;

err_free_copy:
    mscx_plan_free(copy);
    return st;
}
