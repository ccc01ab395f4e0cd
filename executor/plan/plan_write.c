/* SPDX-License-Identifier: MIT */
/*
 * The plan writer: a struct mscx_plan back to MSCCL++ JSON, keys in the
 * DSL's order, plus our optional "mscx" extension object.
 *
 * The model stores rank-level channel and remote-buffer indices; the JSON
 * wants thread-block-local ones, so every index is turned back through the
 * thread block's tables (tb.chan[type], tb.rbuf[type]). Pipeline bodies,
 * flattened after their pipeline op in the model, are nested again.
 *
 * The output is a fixed point: writing a plan loaded from our own output
 * gives the same bytes, because every field is written from the model in a
 * fixed order and nothing depends on how the input was spelled.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "mscx/log.h"
#include "mscx/plan.h"
#include "plan_model.h"

static const char *const buf_names[MSCX_BUF_COUNT] = {"i", "o", "s"};
static const char *const chan_names[MSCX_CHAN_COUNT] = {"none", "memory", "port", "switch"};

/* Build context: the rank and thread block being written, for messages. */
struct wctx {
    const struct mscx_plan *plan;
    const struct mscx_gpu *gpu;
    const struct mscx_tb *tb;
    uint32_t rank;
    uint32_t tbi;
};

static int set_new(json_t *obj, const char *key, json_t *val)
{
    if (val == NULL)
        return -1;
    return json_object_set_new(obj, key, val);
}

static json_t *jint(uint64_t v)
{
    return json_integer((json_int_t)v);
}

static const char *buf_name(unsigned type)
{
    return type < MSCX_BUF_COUNT ? buf_names[type] : "?";
}

static const char *chan_name(unsigned type)
{
    return type < MSCX_CHAN_COUNT ? chan_names[type] : "?";
}

/* Local index of rank-level @p value in @p table, -1 when absent. */
static int local_index(const uint16_t *table, uint16_t n, uint32_t value)
{
    for (uint16_t k = 0; k < n; k++)
        if (table[k] == value)
            return k;
    return -1;
}

static json_t *write_operand(const struct wctx *w, const struct mscx_dev_op *op,
                             const struct mscx_dev_operand *o)
{
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    if (o->flags & MSCX_OPND_SWITCH) {
        int k = local_index(w->tb->chan[MSCX_CHAN_SWITCH], w->tb->nchan[MSCX_CHAN_SWITCH], o->rbuf);
        if (k < 0) {
            MSCX_WARN(
                "internal bug: plan %s: gpus[%u].threadblocks[%u]: switch channel %u is not in the thread "
                "block's switch table",
                w->plan->name, w->rank, w->tbi, o->rbuf);
            goto err;
        }
        if (set_new(obj, "switch_channel_id", jint((uint64_t)k)))
            goto err;
    } else if (o->flags & MSCX_OPND_REMOTE) {
        unsigned ct = op->chan_type < MSCX_CHAN_COUNT ? op->chan_type : MSCX_CHAN_NONE;
        int k = local_index(w->tb->rbuf[ct], w->tb->nrbuf[ct], o->rbuf);
        if (k < 0) {
            MSCX_WARN("internal bug: plan %s: gpus[%u].threadblocks[%u]: remote buffer %u is not in the %s "
                      "remote_buffer_refs of the thread block",
                      w->plan->name, w->rank, w->tbi, o->rbuf, chan_name(ct));
            goto err;
        }
        if (set_new(obj, "buffer_id", jint((uint64_t)k)))
            goto err;
    } else {
        if (set_new(obj, "type", json_string(buf_name(o->type))))
            goto err;
    }
    if (set_new(obj, "index", jint(o->index)) || set_new(obj, "size", jint(o->size)))
        goto err;
    return obj;
err:
    json_decref(obj);
    return NULL;
}

static json_t *write_operands(const struct wctx *w, const struct mscx_dev_op *op,
                              const struct mscx_dev_operand *v, unsigned n)
{
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (unsigned i = 0; i < n; i++) {
        json_t *o = write_operand(w, op, &v[i]);
        if (o == NULL || json_array_append_new(arr, o)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *write_channel_ids(const struct wctx *w, const struct mscx_dev_op *op)
{
    unsigned ct = op->chan_type < MSCX_CHAN_COUNT ? op->chan_type : MSCX_CHAN_NONE;
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (unsigned i = 0; i < op->nchan; i++) {
        int k = local_index(w->tb->chan[ct], w->tb->nchan[ct], op->chan[i]);
        if (k < 0) {
            MSCX_WARN("internal bug: plan %s: gpus[%u].threadblocks[%u]: %s channel %u is not in the thread "
                      "block's channel table",
                      w->plan->name, w->rank, w->tbi, chan_name(ct), op->chan[i]);
            json_decref(arr);
            return NULL;
        }
        if (json_array_append_new(arr, jint((uint64_t)k))) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *write_ops(const struct wctx *w, const struct mscx_dev_op *ops, uint32_t n);

static json_t *write_op(const struct wctx *w, const struct mscx_dev_op *ops, uint32_t n, uint32_t *used_p)
{
    const struct mscx_dev_op *op = &ops[0];
    const char *name = mscx_opcode_name((enum mscx_opcode)op->opcode);
    json_t *obj = json_object();
    *used_p = 1;
    if (obj == NULL)
        return NULL;
    if (set_new(obj, "name", json_string(name ? name : "?")))
        goto err;

    switch (op->opcode) {
    case MSCX_OP_NOP:
        return obj;
    case MSCX_OP_BARRIER:
        if (set_new(obj, "barrier_id", jint(op->barrier_id)) ||
            set_new(obj, "num_threadblocks", jint(op->barrier_ntb)))
            goto err;
        return obj;
    case MSCX_OP_SEM_ACQUIRE:
    case MSCX_OP_SEM_RELEASE: {
        json_t *arr = json_array();
        if (set_new(obj, "semaphore_ids", arr))
            goto err;
        for (unsigned i = 0; i < op->nsem; i++)
            if (json_array_append_new(arr, jint(op->sem[i])))
                goto err;
        return obj;
    }
    case MSCX_OP_PIPELINE: {
        json_t *ic = json_object();
        if (set_new(obj, "iter_context", ic) || set_new(ic, "unit_size", jint(op->pipe_unit)) ||
            set_new(ic, "num_chunks", jint(op->pipe_nchunks)))
            goto err;
        if (1u + op->pipe_nops > n) {
            MSCX_WARN(
                "internal bug: plan %s: gpus[%u].threadblocks[%u]: pipeline body of %u ops runs past the "
                "thread block",
                w->plan->name, w->rank, w->tbi, op->pipe_nops);
            goto err;
        }
        if (set_new(obj, "ops", write_ops(w, ops + 1, op->pipe_nops)))
            goto err;
        *used_p = 1u + op->pipe_nops;
        return obj;
    }
    default:
        break;
    }

    if (op->nsrc > 0 || op->ndst > 0) {
        if (set_new(obj, "src_buff", write_operands(w, op, op->src, op->nsrc)) ||
            set_new(obj, "dst_buff", write_operands(w, op, op->dst, op->ndst)))
            goto err;
    }
    if (op->nchan > 0 && set_new(obj, "channel_ids", write_channel_ids(w, op)))
        goto err;
    if (op->chan_type != MSCX_CHAN_NONE &&
        set_new(obj, "channel_type", json_string(chan_name(op->chan_type))))
        goto err;
    if (mscx_opcode_reduces(op->opcode)) {
        const char *rn = mscx_redop_name((enum mscx_redop)op->reduce_op);
        if (set_new(obj, "reduce_op", json_string(rn ? rn : "sum")))
            goto err;
    }
    if (op->flags & MSCX_OPF_TBG) {
        json_t *tbg = json_object();
        if (set_new(obj, "tbg_info", tbg) || set_new(tbg, "tb_id", jint(op->tbg_id)) ||
            set_new(tbg, "tbg_size", jint(op->tbg_size)))
            goto err;
    }
    return obj;
err:
    json_decref(obj);
    return NULL;
}

static json_t *write_ops(const struct wctx *w, const struct mscx_dev_op *ops, uint32_t n)
{
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (uint32_t i = 0; i < n;) {
        uint32_t used = 1;
        json_t *o = write_op(w, ops + i, n - i, &used);
        if (o == NULL || json_array_append_new(arr, o)) {
            json_decref(arr);
            return NULL;
        }
        i += used;
    }
    return arr;
}

static json_t *write_u16_list(const uint16_t *v, unsigned n)
{
    json_t *arr = json_array();
    if (arr == NULL)
        return NULL;
    for (unsigned i = 0; i < n; i++) {
        if (json_array_append_new(arr, jint(v[i]))) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *write_tb(struct wctx *w)
{
    const struct mscx_tb *tb = w->tb;
    json_t *obj = json_object(), *chans = NULL, *refs = NULL;
    if (obj == NULL)
        return NULL;
    if (set_new(obj, "id", jint(w->tbi)) ||
        set_new(obj, "ops", write_ops(w, w->gpu->ops + tb->op_begin, tb->nops)))
        goto err;
    chans = json_array();
    if (set_new(obj, "channels", chans))
        goto err;
    for (unsigned t = MSCX_CHAN_MEMORY; t < MSCX_CHAN_COUNT; t++) {
        json_t *c;
        if (tb->nchan[t] == 0)
            continue;
        c = json_object();
        if (json_array_append_new(chans, c) || set_new(c, "channel_type", json_string(chan_name(t))) ||
            set_new(c, "channel_ids", write_u16_list(tb->chan[t], tb->nchan[t])))
            goto err;
    }
    refs = json_array();
    if (set_new(obj, "remote_buffer_refs", refs))
        goto err;
    for (unsigned t = MSCX_CHAN_MEMORY; t < MSCX_CHAN_COUNT; t++) {
        json_t *r;
        if (tb->nrbuf[t] == 0)
            continue;
        r = json_object();
        if (json_array_append_new(refs, r) || set_new(r, "access_channel_type", json_string(chan_name(t))) ||
            set_new(r, "remote_buffer_ids", write_u16_list(tb->rbuf[t], tb->nrbuf[t])))
            goto err;
    }
    return obj;
err:
    json_decref(obj);
    return NULL;
}

static int write_gpu_channels(const struct mscx_gpu *gpu, json_t *arr)
{
    for (unsigned t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
        json_t *c, *peers;
        if (gpu->nchan[t] == 0)
            continue;
        c = json_object();
        peers = json_array();
        if (json_array_append_new(arr, c) || set_new(c, "channel_type", json_string(chan_name(t))) ||
            set_new(c, "connected_to", peers))
            return -1;
        for (uint32_t k = 0; k < gpu->nchan[t]; k++)
            if (json_array_append_new(peers, jint(gpu->chan[t][k].peer)))
                return -1;
    }
    for (uint32_t s = 0; s < gpu->nswitch; s++) {
        const struct mscx_switch_chan *sc = &gpu->switch_chan[s];
        json_t *c = json_object(), *groups = json_array();
        if (json_array_append_new(arr, c) || set_new(c, "channel_type", json_string("switch")) ||
            set_new(c, "buffer_type", json_string(buf_name(sc->buf_type))) ||
            set_new(c, "rank_groups", groups))
            return -1;
        for (uint32_t g = 0; g < sc->ngroups; g++) {
            json_t *go = json_object(), *ranks = json_array();
            if (json_array_append_new(groups, go) || set_new(go, "size", jint(sc->group_size[g])) ||
                set_new(go, "ranks", ranks))
                return -1;
            for (uint32_t i = 0; i < sc->group_size[g]; i++)
                if (json_array_append_new(ranks, jint(sc->group_ranks[g][i])))
                    return -1;
        }
    }
    return 0;
}

static json_t *write_gpu(const struct mscx_plan *plan, uint32_t rank)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct wctx w = {.plan = plan, .gpu = gpu, .rank = rank};
    json_t *obj = json_object(), *tbs, *chans, *rbufs, *sems;
    if (obj == NULL)
        return NULL;
    if (set_new(obj, "id", jint(gpu->id)) || set_new(obj, "input_chunks", jint(gpu->input_chunks)) ||
        set_new(obj, "output_chunks", jint(gpu->output_chunks)) ||
        set_new(obj, "scratch_chunks", jint(gpu->scratch_chunks)))
        goto err;
    tbs = json_array();
    if (set_new(obj, "threadblocks", tbs))
        goto err;
    for (uint32_t t = 0; t < gpu->ntb; t++) {
        w.tb = &gpu->tb[t];
        w.tbi = t;
        json_t *tb = write_tb(&w);
        if (tb == NULL || json_array_append_new(tbs, tb))
            goto err;
    }
    chans = json_array();
    if (set_new(obj, "channels", chans) || write_gpu_channels(gpu, chans))
        goto err;
    rbufs = json_array();
    if (set_new(obj, "remote_buffers", rbufs))
        goto err;
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        const struct mscx_rbuf *rb = &gpu->rbuf[i];
        json_t *r = json_object(), *acc = json_array();
        if (json_array_append_new(rbufs, r) || set_new(r, "rank", jint(rb->rank)) ||
            set_new(r, "type", json_string(buf_name(rb->type))) || set_new(r, "access_channel_types", acc))
            goto err;
        for (unsigned t = MSCX_CHAN_MEMORY; t < MSCX_CHAN_COUNT; t++)
            if ((rb->access_mask & (1u << t)) && json_array_append_new(acc, json_string(chan_name(t))))
                goto err;
    }
    sems = json_array();
    if (set_new(obj, "semaphores", sems))
        goto err;
    for (uint32_t i = 0; i < gpu->nsem; i++) {
        json_t *s = json_object();
        if (json_array_append_new(sems, s) || set_new(s, "init_value", json_integer(gpu->sem_init[i])))
            goto err;
    }
    return obj;
err:
    json_decref(obj);
    return NULL;
}

static bool plan_has_extension(const struct mscx_plan *plan)
{
    return plan->ranks_per_node_given || plan->root_given || plan->masks_given || plan->fused ||
           plan->beats_nccl_window;
}

static json_t *write_extension(const struct mscx_plan *plan)
{
    json_t *ext = json_object();
    if (ext == NULL)
        return NULL;
    if (set_new(ext, "version", jint(1)))
        goto err;
    if (plan->ranks_per_node_given && set_new(ext, "ranks_per_node", jint(plan->ranks_per_node)))
        goto err;
    if (plan->root_given && set_new(ext, "root", jint(plan->root)))
        goto err;
    if (plan->beats_nccl_window && set_new(ext, "beats_nccl_window", json_true()))
        goto err;
    if (plan->masks_given) {
        json_t *dt = json_array(), *ro = json_array();
        if (set_new(ext, "dtypes", dt) || set_new(ext, "reduce_ops", ro))
            goto err;
        for (unsigned d = 0; d < MSCX_DT_COUNT; d++)
            if ((plan->dtype_mask & (1u << d)) &&
                json_array_append_new(dt, json_string(mscx_dtype_name((enum mscx_dtype)d))))
                goto err;
        for (unsigned o = 0; o < MSCX_REDOP_COUNT; o++)
            if ((plan->redop_mask & (1u << o)) &&
                json_array_append_new(ro, json_string(mscx_redop_name((enum mscx_redop)o))))
                goto err;
    }
    if (plan->fused) {
        json_t *fu = json_object();
        if (set_new(ext, "fusion", fu) || set_new(fu, "ops_before", jint(plan->fuse.ops_before)) ||
            set_new(fu, "ops_after", jint(plan->fuse.ops_after)))
            goto err;
        json_t *hits = json_array();
        if (set_new(fu, "rule_hits", hits))
            goto err;
        for (unsigned r = 0; r < MSCX_FUSE_RULE_COUNT; r++)
            if (json_array_append_new(hits, jint(plan->fuse.rule_hits[r])))
                goto err;
    }
    return ext;
err:
    json_decref(ext);
    return NULL;
}

static json_t *write_plan(const struct mscx_plan *plan)
{
    json_t *root = json_object(), *gpus;
    if (root == NULL)
        return NULL;
    if (set_new(root, "name", json_string(plan->name ? plan->name : "")) ||
        set_new(root, "collective",
                json_string(plan->collective_name ? plan->collective_name : mscx_coll_name(plan->coll))) ||
        set_new(root, "protocol", json_string(plan->protocol == MSCX_PROTO_LL ? "LL" : "Simple")) ||
        set_new(root, "inplace", json_boolean(plan->inplace)) ||
        set_new(root, "reuse_resources", json_boolean(plan->reuse_resources)))
        goto err;
    if (plan->ranks_may_differ && set_new(root, "ranks_may_differ", json_true()))
        goto err;
    gpus = json_array();
    if (set_new(root, "gpus", gpus))
        goto err;
    for (uint32_t r = 0; r < plan->nranks; r++) {
        json_t *g = write_gpu(plan, r);
        if (g == NULL || json_array_append_new(gpus, g))
            goto err;
    }
    if (set_new(root, "num_threads_per_block", jint(plan->nthreads)) ||
        set_new(root, "use_double_scratch_buffer", json_boolean(plan->double_scratch)) ||
        set_new(root, "buffer_alignment", jint(plan->alignment)) ||
        set_new(root, "min_message_size", jint(plan->min_size)))
        goto err;
    /* Absent means unbounded (2^64 - 1), which a JSON integer of jansson cannot hold. */
    if (plan->max_size <= (uint64_t)INT64_MAX && set_new(root, "max_message_size", jint(plan->max_size)))
        goto err;
    if (plan->version != 0 && set_new(root, "version", jint(plan->version)))
        goto err;
    if (plan_has_extension(plan) && set_new(root, "mscx", write_extension(plan)))
        goto err;
    return root;
err:
    json_decref(root);
    return NULL;
}

mscx_status_t mscx_plan_to_json(const struct mscx_plan *plan, char **json_p)
{
    json_t *root;
    char *text;
    size_t len;
    if (plan == NULL || json_p == NULL) {
        MSCX_WARN("caller bug: mscx_plan_to_json: NULL argument");
        return MSCX_ERR_INVALID_ARG;
    }
    root = write_plan(plan);
    if (root == NULL) {
        MSCX_WARN("plan %s: cannot serialise the plan (out of memory or inconsistent tables)",
                  plan->name ? plan->name : "?");
        return MSCX_ERR_INTERNAL;
    }
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (text == NULL) {
        MSCX_WARN("plan %s: out of memory while serialising", plan->name ? plan->name : "?");
        return MSCX_ERR_NO_MEMORY;
    }
    /* Add a trailing newline so that files end like text files. */
    len = strlen(text);
    char *out = realloc(text, len + 2);
    if (out == NULL) {
        free(text);
        MSCX_WARN("plan %s: out of memory while serialising", plan->name ? plan->name : "?");
        return MSCX_ERR_NO_MEMORY;
    }
    out[len] = '\n';
    out[len + 1] = '\0';
    *json_p = out;
    return MSCX_OK;
}

mscx_status_t mscx_plan_save(const struct mscx_plan *plan, const char *path)
{
    char *text = NULL;
    mscx_status_t st;
    FILE *f;
    size_t len;
    if (path == NULL) {
        MSCX_WARN("caller bug: mscx_plan_save: NULL path");
        return MSCX_ERR_INVALID_ARG;
    }
    MSCX_CHECK(mscx_plan_to_json(plan, &text));
    f = fopen(path, "w");
    if (f == NULL) {
        MSCX_WARN("cannot open %s for writing: %s", path, strerror(errno));
        st = MSCX_ERR_SYSTEM;
        goto err_free_text;
    }
    len = strlen(text);
    if (fwrite(text, 1, len, f) != len) {
        MSCX_WARN("cannot write %s: %s", path, strerror(errno));
        fclose(f);
        st = MSCX_ERR_SYSTEM;
        goto err_free_text;
    }
    if (fclose(f) != 0) {
        MSCX_WARN("cannot write %s: %s", path, strerror(errno));
        st = MSCX_ERR_SYSTEM;
        goto err_free_text;
    }
    st = MSCX_OK;
err_free_text:
    free(text);
    return st;
}
