/* SPDX-License-Identifier: MIT */
/*
 * Semantic validation of a parsed (or fused) plan, and the derived fields:
 * channel pairing, has_* flags, dtype/op masks, ranks per node. Nothing is
 * asserted: every violation is reported with the JSON path of the offending
 * node and "expected <what>, got <value>".
 *
 * This file: the entry point and the order of the checks, the derived
 * fields, and the structural checks (header, declarations, each op's
 * fields, operands and layout). The synchronisation checks are in
 * plan_validate_sync.c, the ordering of peer user-buffer accesses in
 * plan_validate_order.c, the ranks' reduction orders in
 * plan_validate_redorder.c.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_model.h"
#include "plan_validate_int.h"

const char *const mscx_pv_ctype_names[MSCX_CHAN_COUNT] = {"none", "memory", "port", "switch"};
const char *const mscx_pv_btype_names[MSCX_BUF_COUNT] = {"input", "output", "scratch"};

int mscx_pv_fail(struct vctx *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, v->mlen, fmt, ap);
    va_end(ap);
    return -1;
}

void mscx_pv_path(struct vctx *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->path, v->plen, fmt, ap);
    va_end(ap);
}

/* Path of op @p i (gpu-level index) of block @p t: pipeline bodies are ops[j].ops[k] in the JSON. */
void mscx_pv_op_path(struct vctx *v, uint32_t r, uint32_t t, uint32_t i, const char *leaf)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    const struct mscx_tb *tb = &g->tb[t];
    uint32_t top = 0, body = 0, k;
    int in_body = 0;
    for (k = tb->op_begin; k < i; k++) {
        const struct mscx_dev_op *op = &g->ops[k];
        if (op->opcode == MSCX_OP_PIPELINE) {
            top++;
            body = 0;
        } else if (op->flags & MSCX_OPF_IN_PIPELINE) {
            body++;
        } else {
            top++;
        }
    }
    in_body = (g->ops[i].flags & MSCX_OPF_IN_PIPELINE) != 0;
    if (in_body)
        mscx_pv_path(v, "gpus[%u].threadblocks[%u].ops[%u].ops[%u]%s%s", r, t, top ? top - 1 : 0, body,
                     leaf ? "." : "", leaf ? leaf : "");
    else
        mscx_pv_path(v, "gpus[%u].threadblocks[%u].ops[%u]%s%s", r, t, top, leaf ? "." : "",
                     leaf ? leaf : "");
}

/* ---- derived fields ---- */

static int compute_pairing(struct vctx *v)
{
    struct mscx_plan *p = v->plan;
    uint32_t *count = calloc(p->nranks, sizeof(uint32_t));
    if (count == NULL)
        return mscx_pv_fail(v, "out of memory");
    for (uint32_t a = 0; a < p->nranks; a++) {
        struct mscx_gpu *ga = &p->gpus[a];
        for (int t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
            memset(count, 0, p->nranks * sizeof(uint32_t));
            for (uint32_t c = 0; c < ga->nchan[t]; c++) {
                struct mscx_chan *ch = &ga->chan[t][c];
                ch->occurrence = count[ch->peer]++;
                ch->paired = false;
                ch->pair = 0;
                const struct mscx_gpu *gb = &p->gpus[ch->peer];
                uint32_t seen = 0;
                for (uint32_t d = 0; d < gb->nchan[t]; d++) {
                    if (gb->chan[t][d].peer != a)
                        continue;
                    if (seen++ == ch->occurrence) {
                        ch->pair = d;
                        ch->paired = true;
                        break;
                    }
                }
            }
        }
    }
    free(count);
    return 0;
}

static uint32_t uf_find(uint32_t *parent, uint32_t x)
{
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

static int infer_ranks_per_node(struct vctx *v)
{
    struct mscx_plan *p = v->plan;
    uint32_t *parent, *size;
    if (p->ranks_per_node_given)
        return 0;
    if (!p->has_port) {
        p->ranks_per_node = p->nranks;
        return 0;
    }
    parent = calloc(p->nranks, sizeof(uint32_t));
    size = calloc(p->nranks, sizeof(uint32_t));
    if (parent == NULL || size == NULL) {
        free(parent);
        free(size);
        return mscx_pv_fail(v, "out of memory");
    }
    for (uint32_t r = 0; r < p->nranks; r++)
        parent[r] = r;
    for (uint32_t r = 0; r < p->nranks; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (uint32_t c = 0; c < g->nchan[MSCX_CHAN_MEMORY]; c++) {
            uint32_t x = uf_find(parent, r), y = uf_find(parent, g->chan[MSCX_CHAN_MEMORY][c].peer);
            if (x != y)
                parent[x] = y;
        }
    }
    for (uint32_t r = 0; r < p->nranks; r++)
        size[uf_find(parent, r)]++;
    p->ranks_per_node = size[uf_find(parent, 0)];
    for (uint32_t r = 0; r < p->nranks; r++)
        if (size[uf_find(parent, r)] != p->ranks_per_node)
            p->ranks_per_node = 0;
    free(parent);
    free(size);
    return 0;
}

static void derive_flags(struct mscx_plan *p)
{
    bool reduces = false;
    p->has_packet_ops = p->has_multicast = p->has_port = false;
    for (uint32_t r = 0; r < p->nranks; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        if (g->nchan[MSCX_CHAN_PORT])
            p->has_port = true;
        if (g->nswitch)
            p->has_multicast = true;
        for (uint32_t i = 0; i < g->nops; i++) {
            unsigned op = g->ops[i].opcode;
            if (mscx_opcode_is_packet(op))
                p->has_packet_ops = true;
            if (mscx_opcode_is_multicast(op) || g->ops[i].chan_type == MSCX_CHAN_SWITCH)
                p->has_multicast = true;
            if (mscx_opcode_reduces(op))
                reduces = true;
        }
    }
    if (!p->masks_given) {
        p->dtype_mask = reduces ? MSCX_DT_REDUCIBLE_MASK : (1u << MSCX_DT_COUNT) - 1;
        p->redop_mask = (1u << MSCX_REDOP_COUNT) - 1;
    }
}

/* ---- header and declarations ---- */

/* The extension's root: a rank of the plan, on broadcast plans only. */
static int check_root(struct vctx *v)
{
    const struct mscx_plan *p = v->plan;
    if (!p->root_given)
        return 0;
    if (p->coll != MSCX_COLL_BROADCAST) {
        mscx_pv_path(v, "mscx.root");
        return mscx_pv_fail(v, "expected no root (only broadcast plans have one; this plan is %s), got %u",
                            p->collective_name, p->root);
    }
    if (p->root >= p->nranks) {
        mscx_pv_path(v, "mscx.root");
        return mscx_pv_fail(v, "expected a rank below the %u ranks, got %u", p->nranks, p->root);
    }
    return 0;
}

static int check_header(struct vctx *v)
{
    struct mscx_plan *p = v->plan;
    if (p->nthreads < 1 || p->nthreads > MSCX_MAX_THREADS_PER_BLOCK) {
        mscx_pv_path(v, "num_threads_per_block");
        return mscx_pv_fail(v, "expected 1 to %d threads, got %u", MSCX_MAX_THREADS_PER_BLOCK, p->nthreads);
    }
    if (p->alignment == 0 || (p->alignment & (p->alignment - 1))) {
        mscx_pv_path(v, "buffer_alignment");
        return mscx_pv_fail(v, "expected a power of two, got %u", p->alignment);
    }
    if (p->min_size > p->max_size) {
        mscx_pv_path(v, "min_message_size");
        return mscx_pv_fail(v, "expected at most max_message_size (%" PRIu64 "), got %" PRIu64, p->max_size,
                            p->min_size);
    }
    if (p->nranks == 0 || p->nranks > MSCX_MAX_RANKS) {
        mscx_pv_path(v, "gpus");
        return mscx_pv_fail(v, "expected 1 to %d ranks, got %u", MSCX_MAX_RANKS, p->nranks);
    }
    if (p->ranks_per_node_given && (p->ranks_per_node == 0 || p->nranks % p->ranks_per_node)) {
        mscx_pv_path(v, "mscx.ranks_per_node");
        return mscx_pv_fail(v, "expected a divisor of the %u ranks, got %u", p->nranks, p->ranks_per_node);
    }
    return check_root(v);
}

/* Channels of rank @p r reach other ranks; switch channel groups name ranks. */
static int check_gpu_chans(struct vctx *v, uint32_t r)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    for (int t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
        for (uint32_t c = 0; c < g->nchan[t]; c++) {
            uint32_t peer = g->chan[t][c].peer;
            if (peer >= p->nranks || peer == r) {
                mscx_pv_path(v, "gpus[%u].channels", r);
                return mscx_pv_fail(v, "expected %s channel %u to connect to another rank below %u, got %u",
                                    mscx_pv_ctype_names[t], c, p->nranks, peer);
            }
        }
    }
    for (uint32_t s = 0; s < g->nswitch; s++) {
        const struct mscx_switch_chan *sc = &g->switch_chan[s];
        for (uint32_t k = 0; k < sc->ngroups; k++)
            for (uint32_t j = 0; j < sc->group_size[k]; j++)
                if (sc->group_ranks[k][j] >= p->nranks) {
                    mscx_pv_path(v, "gpus[%u].channels", r);
                    return mscx_pv_fail(v, "expected switch channel %u group ranks below %u, got %u", s,
                                        p->nranks, sc->group_ranks[k][j]);
                }
    }
    return 0;
}

/* Remote buffers of rank @p r: another rank's buffer, a type, some access. */
static int check_gpu_rbufs(struct vctx *v, uint32_t r)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    for (uint32_t b = 0; b < g->nrbuf; b++) {
        const struct mscx_rbuf *rb = &g->rbuf[b];
        if (rb->rank >= p->nranks || rb->rank == r) {
            mscx_pv_path(v, "gpus[%u].remote_buffers[%u].rank", r, b);
            return mscx_pv_fail(v, "expected another rank below %u, got %u", p->nranks, rb->rank);
        }
        if (rb->type >= MSCX_BUF_COUNT) {
            mscx_pv_path(v, "gpus[%u].remote_buffers[%u].type", r, b);
            return mscx_pv_fail(v, "expected a buffer type, got %u", rb->type);
        }
        if (rb->access_mask == 0 || (rb->access_mask & 1u)) {
            mscx_pv_path(v, "gpus[%u].remote_buffers[%u].access_channel_types", r, b);
            return mscx_pv_fail(v, "expected at least one of memory, port, got none");
        }
        if (p->reuse_resources && rb->type != MSCX_BUF_SCRATCH) {
            mscx_pv_path(v, "gpus[%u].remote_buffers[%u].type", r, b);
            return mscx_pv_fail(
                v, "expected \"s\" (reuse_resources plans may reach only remote scratch), got \"%c\"",
                "ios"[rb->type]);
        }
    }
    return 0;
}

/* Thread blocks of rank @p r: their count, ops, and channel and remote-buffer tables. */
static int check_gpu_tbs(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    if (g->ntb > MSCX_MAX_TB) {
        mscx_pv_path(v, "gpus[%u].threadblocks", r);
        return mscx_pv_fail(v, "expected at most %d thread blocks, got %u", MSCX_MAX_TB, g->ntb);
    }
    for (uint32_t t = 0; t < g->ntb; t++) {
        const struct mscx_tb *tb = &g->tb[t];
        if (tb->nops > MSCX_MAX_OPS_PER_TB || tb->op_begin + tb->nops > g->nops) {
            mscx_pv_path(v, "gpus[%u].threadblocks[%u].ops", r, t);
            return mscx_pv_fail(v, "expected at most %d ops per thread block, got %u", MSCX_MAX_OPS_PER_TB,
                                tb->nops);
        }
        for (int c = MSCX_CHAN_MEMORY; c < MSCX_CHAN_COUNT; c++) {
            uint32_t lim = c == MSCX_CHAN_SWITCH ? g->nswitch : g->nchan[c];
            if (tb->nchan[c] > MSCX_MAX_CHAN_PER_TB) {
                mscx_pv_path(v, "gpus[%u].threadblocks[%u].channels", r, t);
                return mscx_pv_fail(v, "expected at most %d %s channels, got %u", MSCX_MAX_CHAN_PER_TB,
                                    mscx_pv_ctype_names[c], tb->nchan[c]);
            }
            for (uint32_t k = 0; k < tb->nchan[c]; k++)
                if (tb->chan[c][k] >= lim) {
                    mscx_pv_path(v, "gpus[%u].threadblocks[%u].channels", r, t);
                    return mscx_pv_fail(v, "expected %s channel indices below %u, got %u",
                                        mscx_pv_ctype_names[c], lim, tb->chan[c][k]);
                }
            for (uint32_t k = 0; k < tb->nrbuf[c]; k++)
                if (tb->rbuf[c][k] >= g->nrbuf) {
                    mscx_pv_path(v, "gpus[%u].threadblocks[%u].remote_buffer_refs", r, t);
                    return mscx_pv_fail(v, "expected remote buffer indices below %u, got %u", g->nrbuf,
                                        tb->rbuf[c][k]);
                }
        }
    }
    return 0;
}

static int check_gpu_decls(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    if (g->id != r) {
        mscx_pv_path(v, "gpus[%u].id", r);
        return mscx_pv_fail(v, "expected %u, got %u", r, g->id);
    }
    if (check_gpu_chans(v, r) || check_gpu_rbufs(v, r) || check_gpu_tbs(v, r))
        return -1;
    return 0;
}

/* ---- ops ---- */

struct layout {
    uint8_t nsrc_min, nsrc_max, ndst_min, ndst_max;
    const char *src,
        *dst; /* role per position, last repeats: L local, S local scratch, R remote, X remote scratch */
    uint8_t ct_mask; /* allowed channel types */
    bool paired;     /* nsrc == ndst */
    bool need_chan;  /* at least one channel */
};

#define CT(t) (1u << (t))
#define CT_ANY (CT(MSCX_CHAN_NONE) | CT(MSCX_CHAN_MEMORY) | CT(MSCX_CHAN_PORT))
#define CT_MP (CT(MSCX_CHAN_MEMORY) | CT(MSCX_CHAN_PORT))
#define MAXO MSCX_MAX_OPERANDS

static const struct layout layouts[MSCX_OP_COUNT] = {
    [MSCX_OP_NOP] = {0, 0, 0, 0, "", "", CT_ANY, false, false},
    [MSCX_OP_BARRIER] = {0, 0, 0, 0, "", "", CT_ANY, false, false},
    [MSCX_OP_PUT] = {1, MAXO, 1, MAXO, "L", "R", CT_MP, true, false},
    [MSCX_OP_PUT_WITH_SIGNAL] = {1, MAXO, 1, MAXO, "L", "R", CT_MP, true, false},
    [MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH] = {1, MAXO, 1, MAXO, "L", "R", CT_MP, true, false},
    [MSCX_OP_GET] = {1, MAXO, 1, MAXO, "R", "L", CT(MSCX_CHAN_MEMORY), true, false},
    [MSCX_OP_COPY] = {1, MAXO, 1, MAXO, "L", "L", CT_ANY, true, false},
    [MSCX_OP_PUT_PACKETS] = {1, MAXO, 1, MAXO, "L", "X", CT_MP, true, false},
    [MSCX_OP_READ_PUT_PACKETS] = {1, 1, 1, MAXO, "S", "X", CT_MP, false, false},
    [MSCX_OP_COPY_PACKETS] = {1, 1, 1, 1, "L", "S", CT_ANY, false, false},
    [MSCX_OP_UNPACK_PACKETS] = {1, 1, 1, 1, "S", "L", CT_ANY, false, false},
    [MSCX_OP_SIGNAL] = {0, 0, 0, 0, "", "", CT_MP, false, true},
    [MSCX_OP_WAIT] = {0, 0, 0, 0, "", "", CT_MP, false, true},
    [MSCX_OP_RELAXED_SIGNAL] = {0, 0, 0, 0, "", "", CT(MSCX_CHAN_MEMORY), false, true},
    [MSCX_OP_RELAXED_WAIT] = {0, 0, 0, 0, "", "", CT(MSCX_CHAN_MEMORY), false, true},
    [MSCX_OP_FLUSH] = {0, 0, 0, 0, "", "", CT(MSCX_CHAN_PORT), false, true},
    [MSCX_OP_REDUCE] = {1, MAXO, 1, 1, "L", "L", CT_ANY, false, false},
    [MSCX_OP_REDUCE_SEND] = {1, MAXO, 2, MAXO, "L", "LR", CT(MSCX_CHAN_MEMORY), false, false},
    [MSCX_OP_READ_REDUCE] = {2, MAXO, 1, 1, "LR", "L", CT(MSCX_CHAN_MEMORY), false, false},
    [MSCX_OP_READ_REDUCE_SEND] = {2, MAXO, 2, MAXO, "LR", "LR", CT(MSCX_CHAN_MEMORY), false, false},
    [MSCX_OP_REDUCE_PACKETS] = {1, MAXO, 1, 1, "LS", "L", CT_ANY, false, false},
    [MSCX_OP_REDUCE_SEND_PACKETS] = {1, MAXO, 2, MAXO, "LS", "LX", CT(MSCX_CHAN_MEMORY), false, false},
    [MSCX_OP_REDUCE_COPY_PACKETS] = {1, MAXO, 2, 2, "LS", "LS", CT_ANY, false, false},
    [MSCX_OP_REDUCE_COPY_SEND_PACKETS] = {1, MAXO, 3, MAXO, "LS", "LSX", CT(MSCX_CHAN_MEMORY), false, false},
    [MSCX_OP_PIPELINE] = {0, 0, 0, 0, "", "", CT_ANY, false, false},
    [MSCX_OP_SEM_RELEASE] = {0, 0, 0, 0, "", "", CT_ANY, false, false},
    [MSCX_OP_SEM_ACQUIRE] = {0, 0, 0, 0, "", "", CT_ANY, false, false},
};

static uint32_t buf_chunks(const struct mscx_gpu *g, unsigned type)
{
    return type == MSCX_BUF_INPUT    ? g->input_chunks
           : type == MSCX_BUF_OUTPUT ? g->output_chunks
                                     : g->scratch_chunks;
}

/* Bounds and access of one operand. */
static int check_operand(struct vctx *v, uint32_t r, uint32_t t, uint32_t i, const char *list, uint32_t k,
                         const struct mscx_dev_operand *o, uint32_t size0)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];
    char leaf[64];
    uint32_t owner = r;

    if (o->size == 0) {
        snprintf(leaf, sizeof(leaf), "%s[%u].size", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected at least 1 chunk, got 0");
    }
    if (o->size != size0) {
        snprintf(leaf, sizeof(leaf), "%s[%u].size", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected %u chunks, the size of the op's first operand, got %u", size0,
                            o->size);
    }
    if (o->flags & MSCX_OPND_SWITCH)
        return 0;
    if (o->flags & MSCX_OPND_REMOTE) {
        snprintf(leaf, sizeof(leaf), "%s[%u].buffer_id", list, k);
        if (o->rbuf >= g->nrbuf) {
            mscx_pv_op_path(v, r, t, i, leaf);
            return mscx_pv_fail(v, "expected a remote buffer below %u, got %u", g->nrbuf, o->rbuf);
        }
        const struct mscx_rbuf *rb = &g->rbuf[o->rbuf];
        if (op->chan_type >= MSCX_CHAN_COUNT || !(rb->access_mask & (1u << op->chan_type))) {
            mscx_pv_op_path(v, r, t, i, leaf);
            return mscx_pv_fail(
                v, "expected a remote buffer that allows %s access, got remote buffer %u (rank %u %s)",
                op->chan_type < MSCX_CHAN_COUNT ? mscx_pv_ctype_names[op->chan_type] : "?", o->rbuf, rb->rank,
                mscx_pv_btype_names[rb->type]);
        }
        if (o->type != rb->type) {
            mscx_pv_op_path(v, r, t, i, leaf);
            return mscx_pv_fail(v, "expected buffer type %s of remote buffer %u, got %u",
                                mscx_pv_btype_names[rb->type], o->rbuf, o->type);
        }
        owner = rb->rank;
    } else if (o->type >= MSCX_BUF_COUNT) {
        snprintf(leaf, sizeof(leaf), "%s[%u].type", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected a buffer type, got %u", o->type);
    }
    uint32_t n = buf_chunks(&p->gpus[owner], o->type);
    if (o->index >= n) {
        snprintf(leaf, sizeof(leaf), "%s[%u].index", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected a chunk index below %u (rank %u %s), got %u", n, owner,
                            mscx_pv_btype_names[o->type], o->index);
    }
    if (o->size > n - o->index) {
        snprintf(leaf, sizeof(leaf), "%s[%u].size", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected at most %u chunks from index %u (rank %u %s has %u), got %u",
                            n - o->index, o->index, owner, mscx_pv_btype_names[o->type], n, o->size);
    }
    return 0;
}

/* Role of an operand: L local, S local scratch, R remote, X remote scratch. */
static int check_role(struct vctx *v, uint32_t r, uint32_t t, uint32_t i, const char *list, uint32_t k,
                      const struct mscx_dev_operand *o, char role)
{
    bool remote = (o->flags & MSCX_OPND_REMOTE) != 0;
    bool want_remote = role == 'R' || role == 'X';
    bool want_scratch = role == 'S' || role == 'X';
    char leaf[64];
    const struct mscx_dev_op *op = &v->plan->gpus[r].ops[i];
    if (o->flags & MSCX_OPND_SWITCH) {
        snprintf(leaf, sizeof(leaf), "%s[%u]", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected a %s operand, got a switch operand",
                            want_remote ? "remote" : "local");
    }
    if (remote != want_remote) {
        snprintf(leaf, sizeof(leaf), "%s[%u]", list, k);
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected a %s operand for %s, got a %s one",
                            want_remote ? "remote {buffer_id, index, size}" : "local {type, index, size}",
                            mscx_opcode_name((enum mscx_opcode)op->opcode), remote ? "remote" : "local");
    }
    if (want_scratch && o->type != MSCX_BUF_SCRATCH) {
        snprintf(leaf, sizeof(leaf), "%s[%u].%s", list, k, remote ? "buffer_id" : "type");
        mscx_pv_op_path(v, r, t, i, leaf);
        return mscx_pv_fail(v, "expected %s scratch (%s packets live in scratch), got %s %s",
                            remote ? "remote" : "local", mscx_opcode_name((enum mscx_opcode)op->opcode),
                            remote ? "remote" : "local",
                            o->type < MSCX_BUF_COUNT ? mscx_pv_btype_names[o->type] : "?");
    }
    return 0;
}

static char role_at(const char *roles, uint32_t k)
{
    size_t n = strlen(roles);
    return n == 0 ? '*' : roles[k < n ? k : n - 1];
}

static int check_layout(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];
    const struct layout *l = &layouts[op->opcode];
    const char *name = mscx_opcode_name((enum mscx_opcode)op->opcode);

    if (!(l->ct_mask & (1u << op->chan_type))) {
        mscx_pv_op_path(v, r, t, i, "channel_type");
        return mscx_pv_fail(v, "expected a channel type that %s supports (%s%s%s), got %s", name,
                            l->ct_mask & CT(MSCX_CHAN_NONE) ? "none " : "",
                            l->ct_mask & CT(MSCX_CHAN_MEMORY) ? "memory " : "",
                            l->ct_mask & CT(MSCX_CHAN_PORT) ? "port" : "",
                            mscx_pv_ctype_names[op->chan_type]);
    }
    if (op->nsrc < l->nsrc_min || op->nsrc > l->nsrc_max) {
        mscx_pv_op_path(v, r, t, i, "src_buff");
        return mscx_pv_fail(v, "expected %u to %u source operands for %s, got %u", l->nsrc_min, l->nsrc_max,
                            name, op->nsrc);
    }
    if (op->ndst < l->ndst_min || op->ndst > l->ndst_max) {
        mscx_pv_op_path(v, r, t, i, "dst_buff");
        return mscx_pv_fail(v, "expected %u to %u destination operands for %s, got %u", l->ndst_min,
                            l->ndst_max, name, op->ndst);
    }
    if (l->paired && op->nsrc != op->ndst) {
        mscx_pv_op_path(v, r, t, i, "dst_buff");
        return mscx_pv_fail(v, "expected one destination per source (%u) for %s, got %u", op->nsrc, name,
                            op->ndst);
    }
    if (l->need_chan && op->nchan == 0) {
        mscx_pv_op_path(v, r, t, i, "channel_ids");
        return mscx_pv_fail(v, "expected at least one channel for %s, got none", name);
    }
    bool port_ppkt = op->chan_type == MSCX_CHAN_PORT && op->opcode == MSCX_OP_PUT_PACKETS;
    for (uint32_t k = 0; k < op->nsrc; k++)
        if (check_role(v, r, t, i, "src_buff", k, &op->src[k], port_ppkt ? 'S' : role_at(l->src, k)))
            return -1;
    for (uint32_t k = 0; k < op->ndst; k++)
        if (check_role(v, r, t, i, "dst_buff", k, &op->dst[k], role_at(l->dst, k)))
            return -1;
    /* Port data ops: one channel per destination, reaching the destination's owner. */
    if (op->chan_type == MSCX_CHAN_PORT && op->ndst > 0) {
        if (op->nchan != op->ndst) {
            mscx_pv_op_path(v, r, t, i, "channel_ids");
            return mscx_pv_fail(v, "expected one port channel per destination (%u) for %s, got %u", op->ndst,
                                name, op->nchan);
        }
        for (uint32_t k = 0; k < op->ndst; k++) {
            uint32_t peer = g->chan[MSCX_CHAN_PORT][op->chan[k]].peer;
            uint32_t owner = g->rbuf[op->dst[k].rbuf].rank;
            if (peer != owner) {
                char leaf[32];
                snprintf(leaf, sizeof(leaf), "channel_ids[%u]", k);
                mscx_pv_op_path(v, r, t, i, leaf);
                return mscx_pv_fail(
                    v,
                    "expected a port channel to rank %u (the owner of dst_buff[%u]), got a channel to "
                    "rank %u",
                    owner, k, peer);
            }
        }
    }
    return 0;
}

/* The op's own fields: opcode, channel type, counts, thread-block group, channel indices. */
static int check_op_fields(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];

    if (op->opcode >= MSCX_OP_COUNT) {
        mscx_pv_op_path(v, r, t, i, "name");
        return mscx_pv_fail(v, "expected an operation, got opcode %u", op->opcode);
    }
    if (op->chan_type >= MSCX_CHAN_COUNT) {
        mscx_pv_op_path(v, r, t, i, "channel_type");
        return mscx_pv_fail(v, "expected a channel type, got %u", op->chan_type);
    }
    if (op->nsrc > MSCX_MAX_OPERANDS || op->ndst > MSCX_MAX_OPERANDS) {
        mscx_pv_op_path(v, r, t, i, op->nsrc > MSCX_MAX_OPERANDS ? "src_buff" : "dst_buff");
        return mscx_pv_fail(v, "expected at most %d operands, got %u", MSCX_MAX_OPERANDS,
                            op->nsrc > op->ndst ? op->nsrc : op->ndst);
    }
    if (op->nchan > MSCX_MAX_CHAN_PER_OP || op->nsem > MSCX_MAX_SEM_PER_OP) {
        mscx_pv_op_path(v, r, t, i, op->nchan > MSCX_MAX_CHAN_PER_OP ? "channel_ids" : "semaphore_ids");
        return mscx_pv_fail(v, "expected at most %d entries, got %u", MSCX_MAX_CHAN_PER_OP,
                            op->nchan > MSCX_MAX_CHAN_PER_OP ? op->nchan : op->nsem);
    }
    if (op->tbg_size == 0 || op->tbg_id >= op->tbg_size) {
        mscx_pv_op_path(v, r, t, i, "tbg_info.tb_id");
        return mscx_pv_fail(v, "expected a slice below the group size %u, got %u", op->tbg_size, op->tbg_id);
    }
    for (uint32_t k = 0; k < op->nchan; k++) {
        uint32_t lim = op->chan_type == MSCX_CHAN_SWITCH ? g->nswitch : g->nchan[op->chan_type];
        if (op->chan[k] >= lim) {
            char leaf[32];
            snprintf(leaf, sizeof(leaf), "channel_ids[%u]", k);
            mscx_pv_op_path(v, r, t, i, leaf);
            return mscx_pv_fail(v, "expected a %s channel below %u, got %u",
                                mscx_pv_ctype_names[op->chan_type], lim, op->chan[k]);
        }
    }
    return 0;
}

/* A pipeline op: not nested, its body within the block and of non-pipeline ops, a positive iteration. */
static int check_pipeline(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];
    const struct mscx_tb *tb = &g->tb[t];

    if (op->flags & MSCX_OPF_IN_PIPELINE) {
        mscx_pv_op_path(v, r, t, i, "name");
        return mscx_pv_fail(
            v, "expected an operation other than pipeline (pipelines do not nest), got \"pipeline\"");
    }
    if (i + 1 + op->pipe_nops > tb->op_begin + tb->nops) {
        mscx_pv_op_path(v, r, t, i, "ops");
        return mscx_pv_fail(v, "expected a body within the thread block, got %u ops", op->pipe_nops);
    }
    for (uint32_t k = i + 1; k <= i + op->pipe_nops; k++)
        if (!(g->ops[k].flags & MSCX_OPF_IN_PIPELINE) || g->ops[k].opcode == MSCX_OP_PIPELINE) {
            mscx_pv_op_path(v, r, t, k, "name");
            return mscx_pv_fail(v, "expected a non-pipeline body op, got %s",
                                mscx_opcode_name((enum mscx_opcode)g->ops[k].opcode));
        }
    if (op->pipe_unit == 0 || op->pipe_nchunks == 0) {
        mscx_pv_op_path(v, r, t, i, "iter_context");
        return mscx_pv_fail(v, "expected a positive unit_size and num_chunks, got %u and %u", op->pipe_unit,
                            op->pipe_nchunks);
    }
    return 0;
}

/* A barrier's id and block count, a semaphore op's semaphores. */
static int check_op_sync(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];

    if (op->opcode == MSCX_OP_BARRIER) {
        if (op->barrier_id >= MSCX_MAX_BARRIERS) {
            mscx_pv_op_path(v, r, t, i, "barrier_id");
            return mscx_pv_fail(v, "expected a barrier id below %d, got %u", MSCX_MAX_BARRIERS,
                                op->barrier_id);
        }
        if (op->barrier_ntb < 1 || op->barrier_ntb > g->ntb) {
            mscx_pv_op_path(v, r, t, i, "num_threadblocks");
            return mscx_pv_fail(v, "expected 1 to %u thread blocks (the rank's grid), got %u", g->ntb,
                                op->barrier_ntb);
        }
    }
    if (op->opcode == MSCX_OP_SEM_ACQUIRE || op->opcode == MSCX_OP_SEM_RELEASE) {
        if (op->nsem == 0) {
            mscx_pv_op_path(v, r, t, i, "semaphore_ids");
            return mscx_pv_fail(v, "expected at least one semaphore, got none");
        }
    }
    for (uint32_t k = 0; k < op->nsem; k++) {
        if (op->sem[k] >= g->nsem) {
            char leaf[32];
            snprintf(leaf, sizeof(leaf), "semaphore_ids[%u]", k);
            mscx_pv_op_path(v, r, t, i, leaf);
            return mscx_pv_fail(v, "expected a semaphore index below %u, got %u", g->nsem, op->sem[k]);
        }
    }
    return 0;
}

static int check_op(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_dev_op *op = &g->ops[i];

    if (check_op_fields(v, r, t, i))
        return -1;
    if (op->opcode == MSCX_OP_PIPELINE && check_pipeline(v, r, t, i))
        return -1;
    if (check_op_sync(v, r, t, i))
        return -1;
    uint32_t size0 = op->nsrc ? op->src[0].size : op->ndst ? op->dst[0].size : 0;
    for (uint32_t k = 0; k < op->nsrc; k++)
        if (check_operand(v, r, t, i, "src_buff", k, &op->src[k], size0))
            return -1;
    for (uint32_t k = 0; k < op->ndst; k++)
        if (check_operand(v, r, t, i, "dst_buff", k, &op->dst[k], size0))
            return -1;
    if (mscx_opcode_is_multicast(op->opcode))
        return 0; /* parsed, never executed: layouts of the switch demonstrations vary */
    if (op->chan_type == MSCX_CHAN_SWITCH) {
        mscx_pv_op_path(v, r, t, i, "channel_type");
        return mscx_pv_fail(v, "expected memory, port or none for %s, got switch",
                            mscx_opcode_name((enum mscx_opcode)op->opcode));
    }
    return check_layout(v, r, t, i);
}

/* ---- entry point ---- */

mscx_status_t mscx_plan_validate(struct mscx_plan *plan, char *path_buf, size_t path_len, char *msg,
                                 size_t msg_len)
{
    char pdummy[8], mdummy[8];
    struct vctx v = {plan, path_buf ? path_buf : pdummy, path_buf ? path_len : sizeof(pdummy),
                     msg ? msg : mdummy, msg ? msg_len : sizeof(mdummy)};
    v.path[0] = '\0';
    v.msg[0] = '\0';
    if (check_header(&v))
        return MSCX_ERR_PLAN;
    for (uint32_t r = 0; r < plan->nranks; r++)
        if (check_gpu_decls(&v, r))
            return MSCX_ERR_PLAN;
    derive_flags(plan);
    if (compute_pairing(&v))
        return MSCX_ERR_NO_MEMORY;
    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t t = 0; t < g->ntb; t++)
            for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++)
                if (check_op(&v, r, t, i))
                    return MSCX_ERR_PLAN;
        int rc = mscx_pv_check_barriers(&v, r);
        if (rc == 0)
            rc = mscx_pv_check_semaphores(&v, r);
        if (rc)
            return v.path[0] ? MSCX_ERR_PLAN : MSCX_ERR_NO_MEMORY;
    }
    int rc = mscx_pv_check_signals(&v);
    if (rc == 0)
        rc = mscx_pv_check_peer_accesses(&v);
    if (rc == 0)
        rc = mscx_pv_check_reduction_order(&v);
    if (rc)
        return v.path[0] ? MSCX_ERR_PLAN : MSCX_ERR_NO_MEMORY;
    if (infer_ranks_per_node(&v))
        return MSCX_ERR_NO_MEMORY;
    return MSCX_OK;
}
