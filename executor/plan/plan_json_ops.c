/* SPDX-License-Identifier: MIT */
/*
 * The plan loader, second half: thread blocks and their ops. The block's
 * channel and remote-buffer tables are resolved into the ops here, so every
 * struct mscx_dev_op names rank-level channels and remote buffers; pipeline
 * bodies are flattened right after their pipeline op.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "plan_model.h"
#include "plan_json_int.h"

#define push_key mscx_pj_push_key
#define push_idx mscx_pj_push_idx
#define pop mscx_pj_pop
#define fail mscx_pj_fail

static const char *const ctype_names[MSCX_CHAN_COUNT] = {"none", "memory", "port", "switch"};

/* Append ids from a {<type_key>, <ids_key>} list into per-type tables. */
static int parse_tb_table(struct pctx *c, const json_t *tbj, const char *key, const char *type_key,
                          const char *ids_key, const uint32_t limit[MSCX_CHAN_COUNT], uint16_t max_per_type,
                          uint16_t n_p[MSCX_CHAN_COUNT], uint16_t *v_p[MSCX_CHAN_COUNT])
{
    bool aerr;
    const json_t *list = mscx_pj_array(c, tbj, key, false, &aerr);
    char what[128];
    if (aerr)
        return -1;
    push_key(c, key);
    for (size_t i = 0; list && i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        uint8_t t;
        push_idx(c, i);
        if (mscx_pj_object(c, e) || mscx_pj_chan_type(c, json_object_get(e, type_key), type_key, false, &t))
            return -1;
        const json_t *ids = mscx_pj_array(c, e, ids_key, true, &aerr);
        if (aerr)
            return -1;
        size_t n = json_array_size(ids);
        if (n_p[t] + n > max_per_type) {
            snprintf(what, sizeof(what), "at most %u %s entries per thread block", max_per_type,
                     ctype_names[t]);
            return fail(c, ids_key, ids, what);
        }
        if (n == 0) {
            pop(c);
            continue;
        }
        uint16_t *nv = realloc(v_p[t], (n_p[t] + n) * sizeof(uint16_t));
        if (nv == NULL)
            return mscx_pj_nomem(c);
        v_p[t] = nv;
        push_key(c, ids_key);
        for (size_t k = 0; k < n; k++) {
            uint32_t id;
            push_idx(c, k);
            if (limit[t] == 0) {
                snprintf(what, sizeof(what), "no %s entry: the rank declares none", ctype_names[t]);
                return fail(c, NULL, json_array_get(ids, k), what);
            }
            snprintf(what, sizeof(what), "a %s %s index below %u", ctype_names[t],
                     strcmp(key, "channels") == 0 ? "channel" : "remote buffer", limit[t]);
            if (mscx_pj_u32_v(c, json_array_get(ids, k), UINT32_MAX, &id))
                return -1;
            if (id >= limit[t])
                return fail(c, NULL, json_array_get(ids, k), what);
            nv[n_p[t]++] = (uint16_t)id;
            pop(c);
        }
        pop(c);
        pop(c);
    }
    pop(c);
    return 0;
}

static int parse_operand(struct pctx *c, const struct mscx_gpu *g, const struct mscx_tb *tb, uint8_t ct,
                         const json_t *oj, struct mscx_dev_operand *o)
{
    const json_t *v;
    char what[128];
    memset(o, 0, sizeof(*o));
    if (mscx_pj_object(c, oj))
        return -1;
    if ((v = json_object_get(oj, "buffer_id")) != NULL) {
        uint32_t id;
        if (mscx_pj_u32_v(c, v, UINT32_MAX, &id))
            return -1;
        if (ct != MSCX_CHAN_MEMORY && ct != MSCX_CHAN_PORT)
            return fail(c, "buffer_id", v,
                        "no remote operand on an op whose channel_type is not memory or port");
        if (id >= tb->nrbuf[ct]) {
            snprintf(what, sizeof(what), "a remote buffer index below %u (the thread block's %s table)",
                     tb->nrbuf[ct], ctype_names[ct]);
            return fail(c, "buffer_id", v, what);
        }
        o->rbuf = tb->rbuf[ct][id];
        o->type = g->rbuf[o->rbuf].type;
        o->flags = MSCX_OPND_REMOTE;
    } else if ((v = json_object_get(oj, "switch_channel_id")) != NULL) {
        uint32_t id;
        if (mscx_pj_u32_v(c, v, UINT32_MAX, &id))
            return -1;
        if (id >= tb->nchan[MSCX_CHAN_SWITCH]) {
            snprintf(what, sizeof(what), "a switch channel index below %u (the thread block's switch table)",
                     tb->nchan[MSCX_CHAN_SWITCH]);
            return fail(c, "switch_channel_id", v, what);
        }
        o->rbuf = tb->chan[MSCX_CHAN_SWITCH][id];
        o->type = g->switch_chan[o->rbuf].buf_type;
        o->flags = MSCX_OPND_SWITCH;
    } else {
        if (mscx_pj_buf_type(c, oj, "type", &o->type))
            return -1;
        if ((v = json_object_get(oj, "rank")) != NULL) {
            uint32_t r;
            if (mscx_pj_u32_v(c, v, UINT32_MAX, &r))
                return -1;
            if (r != g->id) {
                snprintf(what, sizeof(what), "this rank (%u) for a local operand", g->id);
                return fail(c, "rank", v, what);
            }
        }
    }
    if (mscx_pj_u32(c, oj, "index", false, 0, UINT32_MAX, &o->index) ||
        mscx_pj_u32(c, oj, "size", false, 0, UINT32_MAX, &o->size))
        return -1;
    return 0;
}

/* A slice [first, first + count) of a JSON array; the whole array when count is SIZE_MAX. */
static size_t slice_len(const json_t *a, size_t first, size_t count)
{
    size_t n = json_array_size(a);
    if (count == SIZE_MAX)
        return n;
    return first >= n ? 0 : (n - first < count ? n - first : count);
}

static int parse_operands(struct pctx *c, const struct mscx_gpu *g, const struct mscx_tb *tb,
                          const json_t *opj, const char *key, uint8_t ct, size_t first, size_t count,
                          struct mscx_dev_operand *v, uint8_t *n_p)
{
    bool aerr;
    const json_t *a = mscx_pj_array(c, opj, key, false, &aerr);
    char what[64];
    if (aerr)
        return -1;
    *n_p = 0;
    if (a == NULL)
        return 0;
    size_t n = slice_len(a, first, count);
    if (count == SIZE_MAX)
        first = 0;
    if (n > MSCX_MAX_OPERANDS) {
        snprintf(what, sizeof(what), "at most %d operands", MSCX_MAX_OPERANDS);
        return fail(c, key, a, what);
    }
    push_key(c, key);
    for (size_t i = 0; i < n; i++) {
        push_idx(c, first + i);
        if (parse_operand(c, g, tb, ct, json_array_get(a, first + i), &v[i]))
            return -1;
        pop(c);
    }
    pop(c);
    *n_p = (uint8_t)n;
    return 0;
}

/*
 * The DSL's fusion pass concatenates puts (and gets) without a bound: a rank
 * that sends 2 chunks to each of 7 peers gets one ppkt of 14 pairs, past the
 * 10 operands (8 channels) an op holds here and in MSCCL++ (whose parser does
 * not check, so its arrays overflow). Such an op is a list of independent
 * pairs src[i] -> dst[i] (on channel_ids[i] for port ops), so it is loaded as
 * consecutive ops of at most that many pairs each.
 * @return the number of pairs per piece when @p opj must be split, else 0
 */
static size_t split_width(const json_t *opj)
{
    static const char *const pairwise[] = {"put", "ppkt", "rppkt", "get", "pws", "pwsf"};
    const char *name = json_string_value(json_object_get(opj, "name"));
    const json_t *src = json_object_get(opj, "src_buff"), *dst = json_object_get(opj, "dst_buff");
    const json_t *ids = json_object_get(opj, "channel_ids");
    bool known = false;
    if (name == NULL || !json_is_array(src) || !json_is_array(dst) ||
        json_array_size(src) != json_array_size(dst))
        return 0;
    for (size_t k = 0; k < sizeof(pairwise) / sizeof(pairwise[0]); k++)
        known = known || strcmp(name, pairwise[k]) == 0;
    if (!known)
        return 0;
    size_t n = json_array_size(src), width = MSCX_MAX_OPERANDS;
    if (ids != NULL) {
        if (!json_is_array(ids) || (json_array_size(ids) != 0 && json_array_size(ids) != n))
            return 0; /* not the pairwise form: parse_op reports what is wrong */
        if (json_array_size(ids) != 0)
            width = MSCX_MAX_CHAN_PER_OP;
    }
    return n > width ? width : 0;
}

/* Ops that @p opj loads as (1, or the pieces of a split pairwise op). */
static size_t op_pieces(const json_t *opj)
{
    size_t w = split_width(opj);
    return w ? (json_array_size(json_object_get(opj, "src_buff")) + w - 1) / w : 1;
}

/* The DSL's glre form: {buffer_type, buffer_offset, size, dst_chunk{rank, type, index, size}}. */
static int parse_glre_form(struct pctx *c, const struct mscx_gpu *g, const struct mscx_tb *tb,
                           const json_t *opj, struct mscx_dev_op *op)
{
    const json_t *dc = json_object_get(opj, "dst_chunk");
    struct mscx_dev_operand *s = &op->src[0];
    if (json_object_get(opj, "buffer_type") == NULL)
        return 0;
    memset(s, 0, sizeof(*s));
    if (mscx_pj_buf_type(c, opj, "buffer_type", &s->type) ||
        mscx_pj_u32(c, opj, "buffer_offset", false, 0, UINT32_MAX, &s->index) ||
        mscx_pj_u32(c, opj, "size", false, 0, UINT32_MAX, &s->size))
        return -1;
    s->flags = MSCX_OPND_SWITCH;
    s->rbuf = op->nchan ? op->chan[0] : 0;
    op->nsrc = 1;
    if (dc) {
        push_key(c, "dst_chunk");
        if (parse_operand(c, g, tb, MSCX_CHAN_NONE, dc, &op->dst[0]))
            return -1;
        pop(c);
        op->ndst = 1;
    }
    return 0;
}

/* channel_ids (the pairs [first, first + count) of a split op), resolved through the block's table. */
static int parse_op_channels(struct pctx *c, const struct mscx_tb *tb, const json_t *opj, size_t first,
                             size_t count, struct mscx_dev_op *op)
{
    bool aerr;
    char what[128];
    const json_t *ids = mscx_pj_array(c, opj, "channel_ids", false, &aerr);
    if (aerr)
        return -1;
    if (!ids || !json_array_size(ids))
        return 0;
    uint8_t ct = op->chan_type;
    size_t n = slice_len(ids, first, count), k0 = count == SIZE_MAX ? 0 : first;
    if (n > MSCX_MAX_CHAN_PER_OP) {
        snprintf(what, sizeof(what), "at most %d channels per op", MSCX_MAX_CHAN_PER_OP);
        return fail(c, "channel_ids", ids, what);
    }
    if (ct == MSCX_CHAN_NONE)
        return fail(c, "channel_type", json_object_get(opj, "channel_type"),
                    "memory, port or switch for an op with channel_ids");
    push_key(c, "channel_ids");
    for (size_t k = 0; k < n; k++) {
        uint32_t id;
        push_idx(c, k0 + k);
        if (mscx_pj_u32_v(c, json_array_get(ids, k0 + k), UINT32_MAX, &id))
            return -1;
        if (id >= tb->nchan[ct]) {
            snprintf(what, sizeof(what), "a channel index below %u (the thread block's %s table)",
                     tb->nchan[ct], ctype_names[ct]);
            return fail(c, NULL, json_array_get(ids, k0 + k), what);
        }
        op->chan[k] = tb->chan[ct][id];
        pop(c);
    }
    pop(c);
    op->nchan = (uint8_t)n;
    return 0;
}

static int parse_op_sems(struct pctx *c, const json_t *opj, struct mscx_dev_op *op)
{
    bool aerr;
    char what[128];
    const json_t *sems = mscx_pj_array(c, opj, "semaphore_ids", false, &aerr);
    if (aerr)
        return -1;
    if (!sems)
        return 0;
    if (json_array_size(sems) > MSCX_MAX_SEM_PER_OP) {
        snprintf(what, sizeof(what), "at most %d semaphores per op", MSCX_MAX_SEM_PER_OP);
        return fail(c, "semaphore_ids", sems, what);
    }
    push_key(c, "semaphore_ids");
    for (size_t k = 0; k < json_array_size(sems); k++) {
        uint32_t id;
        push_idx(c, k);
        if (mscx_pj_u32_v(c, json_array_get(sems, k), UINT16_MAX, &id))
            return -1;
        op->sem[k] = (uint16_t)id;
        pop(c);
    }
    pop(c);
    op->nsem = (uint8_t)json_array_size(sems);
    return 0;
}

static int parse_op_reduce(struct pctx *c, const json_t *opj, struct mscx_dev_op *op)
{
    const char *rop = mscx_pj_str(c, opj, "reduce_op", false);
    if (rop) {
        enum mscx_redop r;
        if (mscx_redop_parse(rop, &r))
            return fail(c, "reduce_op", json_object_get(opj, "reduce_op"),
                        "a reduction (sum, prod, min, max)");
        op->reduce_op = (uint8_t)r;
    } else if (json_object_get(opj, "reduce_op")) {
        return -1;
    }
    return 0;
}

/* tbg_info {tbg_size, tb_id}: the op is one slice of a group of thread blocks. */
static int parse_op_tbg(struct pctx *c, const json_t *opj, struct mscx_dev_op *op)
{
    const json_t *v = json_object_get(opj, "tbg_info");
    char what[128];
    uint32_t id, size;
    if (v == NULL)
        return 0;
    push_key(c, "tbg_info");
    if (mscx_pj_object(c, v) || mscx_pj_u32(c, v, "tbg_size", false, 0, UINT16_MAX, &size) ||
        mscx_pj_u32(c, v, "tb_id", false, 0, UINT16_MAX, &id))
        return -1;
    if (size == 0)
        return fail(c, "tbg_size", json_object_get(v, "tbg_size"), "a group size of at least 1");
    if (id >= size) {
        snprintf(what, sizeof(what), "a slice id below the group size %u", size);
        return fail(c, "tb_id", json_object_get(v, "tb_id"), what);
    }
    pop(c);
    op->tbg_id = (uint16_t)id;
    op->tbg_size = (uint16_t)size;
    op->flags |= MSCX_OPF_TBG;
    return 0;
}

/* A pipeline op's iter_context {unit_size, num_chunks}. */
static int parse_op_pipeline(struct pctx *c, const json_t *opj, struct mscx_dev_op *op)
{
    const json_t *ic = json_object_get(opj, "iter_context");
    if (ic == NULL)
        return fail(c, "iter_context", NULL, "an object {unit_size, num_chunks}");
    push_key(c, "iter_context");
    if (mscx_pj_object(c, ic) || mscx_pj_u32(c, ic, "unit_size", false, 0, UINT32_MAX, &op->pipe_unit) ||
        mscx_pj_u32(c, ic, "num_chunks", false, 0, UINT32_MAX, &op->pipe_nchunks))
        return -1;
    if (op->pipe_unit == 0)
        return fail(c, "unit_size", json_object_get(ic, "unit_size"), "a unit size of at least 1 byte");
    if (op->pipe_nchunks == 0)
        return fail(c, "num_chunks", json_object_get(ic, "num_chunks"), "at least 1 chunk");
    pop(c);
    return 0;
}

/* Parse @p opj into @p op; for a split pairwise op, only pairs [first, first + count) (count SIZE_MAX: all).
 */
static int parse_op(struct pctx *c, const struct mscx_gpu *g, const struct mscx_tb *tb, const json_t *opj,
                    size_t first, size_t count, struct mscx_dev_op *op)
{
    const json_t *v;

    memset(op, 0, sizeof(*op));
    op->tbg_size = 1;
    if (mscx_pj_object(c, opj) || mscx_pj_opcode(c, opj, &op->opcode))
        return -1;
    op->chan_type = MSCX_CHAN_NONE;
    if ((v = json_object_get(opj, "channel_type")) != NULL &&
        mscx_pj_chan_type(c, v, "channel_type", true, &op->chan_type))
        return -1;
    if (parse_op_channels(c, tb, opj, first, count, op))
        return -1;
    if (parse_operands(c, g, tb, opj, "src_buff", op->chan_type, first, count, op->src, &op->nsrc) ||
        parse_operands(c, g, tb, opj, "dst_buff", op->chan_type, first, count, op->dst, &op->ndst))
        return -1;
    if (op->nsrc == 0 && op->ndst == 0 && parse_glre_form(c, g, tb, opj, op))
        return -1;
    if (parse_op_sems(c, opj, op) || parse_op_reduce(c, opj, op) || parse_op_tbg(c, opj, op))
        return -1;
    uint32_t bid, bntb;
    if (mscx_pj_u32(c, opj, "barrier_id", true, 0, UINT16_MAX, &bid) ||
        mscx_pj_u32(c, opj, "num_threadblocks", true, 0, UINT16_MAX, &bntb))
        return -1;
    op->barrier_id = (uint16_t)bid;
    op->barrier_ntb = (uint16_t)bntb;
    if (op->opcode == MSCX_OP_PIPELINE && parse_op_pipeline(c, opj, op))
        return -1;
    return 0;
}

/* Ops of a block including pipeline bodies; -1 on a wrong type (reported later). */
static size_t count_ops(const json_t *tbj)
{
    const json_t *ops = json_object_get(tbj, "ops");
    size_t n;
    if (!json_is_array(ops))
        return 0;
    n = 0;
    for (size_t i = 0; i < json_array_size(ops); i++) {
        const json_t *body = json_object_get(json_array_get(ops, i), "ops");
        n += op_pieces(json_array_get(ops, i));
        if (json_is_array(body))
            for (size_t k = 0; k < json_array_size(body); k++)
                n += op_pieces(json_array_get(body, k));
    }
    return n;
}

/* Load @p opj as one op, or as the pieces of a split pairwise op (split_width), at g->ops[g->nops]. */
static int parse_pieces(struct pctx *c, struct mscx_gpu *g, struct mscx_tb *tb, const json_t *opj)
{
    char what[96];
    size_t w = split_width(opj), n = w ? json_array_size(json_object_get(opj, "src_buff")) : 1;
    for (size_t first = 0; first < n; first += w ? w : 1) {
        if (g->nops - tb->op_begin >= MSCX_MAX_OPS_PER_TB) {
            snprintf(what, sizeof(what), "at most %d ops per thread block, pipeline bodies included",
                     MSCX_MAX_OPS_PER_TB);
            return fail(c, NULL, opj, what);
        }
        if (parse_op(c, g, tb, opj, first, w ? w : SIZE_MAX, &g->ops[g->nops]))
            return -1;
        g->nops++;
    }
    if (w)
        MSCX_INFO(MSCX_SUB_PLAN, "plan: a %s of %zu pairs is loaded as %zu ops of at most %zu pairs",
                  json_string_value(json_object_get(opj, "name")), n, (n + w - 1) / w, w);
    return 0;
}

static int parse_tb_ops(struct pctx *c, struct mscx_gpu *g, struct mscx_tb *tb, const json_t *tbj)
{
    bool aerr;
    const json_t *ops = mscx_pj_array(c, tbj, "ops", true, &aerr);
    if (aerr)
        return -1;
    tb->op_begin = g->nops;
    push_key(c, "ops");
    for (size_t i = 0; i < json_array_size(ops); i++) {
        const json_t *opj = json_array_get(ops, i);
        struct mscx_dev_op *op = &g->ops[g->nops];
        push_idx(c, i);
        if (parse_pieces(c, g, tb, opj))
            return -1;
        if (op->opcode == MSCX_OP_PIPELINE) {
            uint32_t body_begin = g->nops;
            const json_t *body = mscx_pj_array(c, opj, "ops", true, &aerr);
            if (aerr)
                return -1;
            if (json_array_size(body) > UINT16_MAX)
                return fail(c, "ops", body, "at most 65535 ops in a pipeline body");
            push_key(c, "ops");
            for (size_t k = 0; k < json_array_size(body); k++) {
                uint32_t piece = g->nops;
                push_idx(c, k);
                if (parse_pieces(c, g, tb, json_array_get(body, k)))
                    return -1;
                if (g->ops[piece].opcode == MSCX_OP_PIPELINE)
                    return fail(c, "name", json_object_get(json_array_get(body, k), "name"),
                                "an operation other than pipeline (pipelines do not nest)");
                for (; piece < g->nops; piece++)
                    g->ops[piece].flags |= MSCX_OPF_IN_PIPELINE;
                pop(c);
            }
            pop(c);
            if (g->nops - body_begin > UINT16_MAX)
                return fail(c, "ops", body, "at most 65535 ops in a pipeline body");
            op->pipe_nops = (uint16_t)(g->nops - body_begin);
        } else if (json_object_get(opj, "ops") != NULL) {
            return fail(c, "ops", json_object_get(opj, "ops"), "nested ops only in a pipeline");
        }
        pop(c);
    }
    pop(c);
    tb->nops = g->nops - tb->op_begin;
    return 0;
}

int mscx_plan_json_tbs(struct pctx *c, struct mscx_gpu *g, const json_t *gj)
{
    bool aerr;
    char what[64];
    const json_t *tbs = mscx_pj_array(c, gj, "threadblocks", false, &aerr);
    uint32_t chan_limit[MSCX_CHAN_COUNT] = {0, g->nchan[MSCX_CHAN_MEMORY], g->nchan[MSCX_CHAN_PORT],
                                            g->nswitch};
    uint32_t rbuf_limit[MSCX_CHAN_COUNT] = {0, g->nrbuf, g->nrbuf, g->nrbuf};
    size_t total = 0, n;

    if (aerr)
        return -1;
    n = tbs ? json_array_size(tbs) : 0;
    if (n > MSCX_MAX_TB) {
        snprintf(what, sizeof(what), "at most %d thread blocks", MSCX_MAX_TB);
        return fail(c, "threadblocks", tbs, what);
    }
    if (n == 0)
        return 0;
    for (size_t t = 0; t < n; t++)
        total += count_ops(json_array_get(tbs, t));
    g->tb = calloc(n, sizeof(*g->tb));
    g->ops = calloc(total ? total : 1, sizeof(*g->ops));
    if (g->tb == NULL || g->ops == NULL)
        return mscx_pj_nomem(c);
    g->ntb = (uint32_t)n;
    push_key(c, "threadblocks");
    for (size_t t = 0; t < n; t++) {
        const json_t *tbj = json_array_get(tbs, t);
        struct mscx_tb *tb = &g->tb[t];
        uint32_t id;
        push_idx(c, t);
        if (mscx_pj_object(c, tbj) || mscx_pj_u32(c, tbj, "id", true, (uint32_t)t, UINT32_MAX, &id))
            return -1;
        if (id != t) {
            snprintf(what, sizeof(what), "the block's position in threadblocks, %zu", t);
            return fail(c, "id", json_object_get(tbj, "id"), what);
        }
        if (parse_tb_table(c, tbj, "channels", "channel_type", "channel_ids", chan_limit,
                           MSCX_MAX_CHAN_PER_TB, tb->nchan, tb->chan) ||
            parse_tb_table(c, tbj, "remote_buffer_refs", "access_channel_type", "remote_buffer_ids",
                           rbuf_limit, UINT16_MAX, tb->nrbuf, tb->rbuf) ||
            parse_tb_ops(c, g, tb, tbj))
            return -1;
        pop(c);
    }
    pop(c);
    return 0;
}
