/* SPDX-License-Identifier: MIT */
/*
 * Semantic validation of a parsed (or fused) plan, and the derived fields:
 * channel pairing, has_* flags, dtype/op masks, ranks per node. Nothing is
 * asserted: every violation is reported with the JSON path of the offending
 * node and "expected <what>, got <value>".
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "plan_int.h"

struct vctx {
    struct mscx_plan *plan;
    char *path;
    size_t plen;
    char *msg;
    size_t mlen;
};

static const char *const ctype_names[MSCX_CHAN_COUNT] = {"none", "memory", "port", "switch"};
static const char *const btype_names[MSCX_BUF_COUNT] = {"input", "output", "scratch"};

static int vfail(struct vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int vfail(struct vctx *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, v->mlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void vpath(struct vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void vpath(struct vctx *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->path, v->plen, fmt, ap);
    va_end(ap);
}

/* Path of op @p i (gpu-level index) of block @p t: pipeline bodies are ops[j].ops[k] in the JSON. */
static void op_path(struct vctx *v, uint32_t r, uint32_t t, uint32_t i, const char *leaf)
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
        vpath(v, "gpus[%u].threadblocks[%u].ops[%u].ops[%u]%s%s", r, t, top ? top - 1 : 0, body, leaf ? "." : "",
              leaf ? leaf : "");
    else
        vpath(v, "gpus[%u].threadblocks[%u].ops[%u]%s%s", r, t, top, leaf ? "." : "", leaf ? leaf : "");
}

/* ---- derived fields ---- */

static int compute_pairing(struct vctx *v)
{
    struct mscx_plan *p = v->plan;
    uint32_t *count = calloc(p->nranks, sizeof(uint32_t));
    if (count == NULL)
        return vfail(v, "out of memory");
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
        return vfail(v, "out of memory");
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

static int check_header(struct vctx *v)
{
    struct mscx_plan *p = v->plan;
    if (p->nthreads < 1 || p->nthreads > MSCX_MAX_THREADS_PER_BLOCK) {
        vpath(v, "num_threads_per_block");
        return vfail(v, "expected 1 to %d threads, got %u", MSCX_MAX_THREADS_PER_BLOCK, p->nthreads);
    }
    if (p->alignment == 0 || (p->alignment & (p->alignment - 1))) {
        vpath(v, "buffer_alignment");
        return vfail(v, "expected a power of two, got %u", p->alignment);
    }
    if (p->min_size > p->max_size) {
        vpath(v, "min_message_size");
        return vfail(v, "expected at most max_message_size (%" PRIu64 "), got %" PRIu64, p->max_size, p->min_size);
    }
    if (p->nranks == 0 || p->nranks > MSCX_MAX_RANKS) {
        vpath(v, "gpus");
        return vfail(v, "expected 1 to %d ranks, got %u", MSCX_MAX_RANKS, p->nranks);
    }
    if (p->ranks_per_node_given && (p->ranks_per_node == 0 || p->nranks % p->ranks_per_node)) {
        vpath(v, "mscx.ranks_per_node");
        return vfail(v, "expected a divisor of the %u ranks, got %u", p->nranks, p->ranks_per_node);
    }
    return 0;
}

static int check_gpu_decls(struct vctx *v, uint32_t r)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    if (g->id != r) {
        vpath(v, "gpus[%u].id", r);
        return vfail(v, "expected %u, got %u", r, g->id);
    }
    for (int t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
        for (uint32_t c = 0; c < g->nchan[t]; c++) {
            uint32_t peer = g->chan[t][c].peer;
            if (peer >= p->nranks || peer == r) {
                vpath(v, "gpus[%u].channels", r);
                return vfail(v, "expected %s channel %u to connect to another rank below %u, got %u", ctype_names[t],
                             c, p->nranks, peer);
            }
        }
    }
    for (uint32_t s = 0; s < g->nswitch; s++) {
        const struct mscx_switch_chan *sc = &g->switch_chan[s];
        for (uint32_t k = 0; k < sc->ngroups; k++)
            for (uint32_t j = 0; j < sc->group_size[k]; j++)
                if (sc->group_ranks[k][j] >= p->nranks) {
                    vpath(v, "gpus[%u].channels", r);
                    return vfail(v, "expected switch channel %u group ranks below %u, got %u", s, p->nranks,
                                 sc->group_ranks[k][j]);
                }
    }
    for (uint32_t b = 0; b < g->nrbuf; b++) {
        const struct mscx_rbuf *rb = &g->rbuf[b];
        if (rb->rank >= p->nranks || rb->rank == r) {
            vpath(v, "gpus[%u].remote_buffers[%u].rank", r, b);
            return vfail(v, "expected another rank below %u, got %u", p->nranks, rb->rank);
        }
        if (rb->type >= MSCX_BUF_COUNT) {
            vpath(v, "gpus[%u].remote_buffers[%u].type", r, b);
            return vfail(v, "expected a buffer type, got %u", rb->type);
        }
        if (rb->access_mask == 0 || (rb->access_mask & 1u)) {
            vpath(v, "gpus[%u].remote_buffers[%u].access_channel_types", r, b);
            return vfail(v, "expected at least one of memory, port, got none");
        }
        if (p->reuse_resources && rb->type != MSCX_BUF_SCRATCH) {
            vpath(v, "gpus[%u].remote_buffers[%u].type", r, b);
            return vfail(v, "expected \"s\" (reuse_resources plans may reach only remote scratch), got \"%c\"",
                         "ios"[rb->type]);
        }
    }
    if (g->ntb > MSCX_MAX_TB) {
        vpath(v, "gpus[%u].threadblocks", r);
        return vfail(v, "expected at most %d thread blocks, got %u", MSCX_MAX_TB, g->ntb);
    }
    for (uint32_t t = 0; t < g->ntb; t++) {
        const struct mscx_tb *tb = &g->tb[t];
        if (tb->nops > MSCX_MAX_OPS_PER_TB || tb->op_begin + tb->nops > g->nops) {
            vpath(v, "gpus[%u].threadblocks[%u].ops", r, t);
            return vfail(v, "expected at most %d ops per thread block, got %u", MSCX_MAX_OPS_PER_TB, tb->nops);
        }
        for (int c = MSCX_CHAN_MEMORY; c < MSCX_CHAN_COUNT; c++) {
            uint32_t lim = c == MSCX_CHAN_SWITCH ? g->nswitch : g->nchan[c];
            if (tb->nchan[c] > MSCX_MAX_CHAN_PER_TB) {
                vpath(v, "gpus[%u].threadblocks[%u].channels", r, t);
                return vfail(v, "expected at most %d %s channels, got %u", MSCX_MAX_CHAN_PER_TB, ctype_names[c],
                             tb->nchan[c]);
            }
            for (uint32_t k = 0; k < tb->nchan[c]; k++)
                if (tb->chan[c][k] >= lim) {
                    vpath(v, "gpus[%u].threadblocks[%u].channels", r, t);
                    return vfail(v, "expected %s channel indices below %u, got %u", ctype_names[c], lim,
                                 tb->chan[c][k]);
                }
            for (uint32_t k = 0; k < tb->nrbuf[c]; k++)
                if (tb->rbuf[c][k] >= g->nrbuf) {
                    vpath(v, "gpus[%u].threadblocks[%u].remote_buffer_refs", r, t);
                    return vfail(v, "expected remote buffer indices below %u, got %u", g->nrbuf, tb->rbuf[c][k]);
                }
        }
    }
    return 0;
}

/* ---- ops ---- */


struct layout {
    uint8_t nsrc_min, nsrc_max, ndst_min, ndst_max;
    const char *src, *dst; /* role per position, last repeats: L local, S local scratch, R remote, X remote scratch */
    uint8_t ct_mask;       /* allowed channel types */
    bool paired;           /* nsrc == ndst */
    bool need_chan;        /* at least one channel */
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
    return type == MSCX_BUF_INPUT ? g->input_chunks : type == MSCX_BUF_OUTPUT ? g->output_chunks : g->scratch_chunks;
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
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected at least 1 chunk, got 0");
    }
    if (o->size != size0) {
        snprintf(leaf, sizeof(leaf), "%s[%u].size", list, k);
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected %u chunks, the size of the op's first operand, got %u", size0, o->size);
    }
    if (o->flags & MSCX_OPND_SWITCH)
        return 0;
    if (o->flags & MSCX_OPND_REMOTE) {
        snprintf(leaf, sizeof(leaf), "%s[%u].buffer_id", list, k);
        if (o->rbuf >= g->nrbuf) {
            op_path(v, r, t, i, leaf);
            return vfail(v, "expected a remote buffer below %u, got %u", g->nrbuf, o->rbuf);
        }
        const struct mscx_rbuf *rb = &g->rbuf[o->rbuf];
        if (op->chan_type >= MSCX_CHAN_COUNT || !(rb->access_mask & (1u << op->chan_type))) {
            op_path(v, r, t, i, leaf);
            return vfail(v, "expected a remote buffer that allows %s access, got remote buffer %u (rank %u %s)",
                         op->chan_type < MSCX_CHAN_COUNT ? ctype_names[op->chan_type] : "?", o->rbuf, rb->rank,
                         btype_names[rb->type]);
        }
        if (o->type != rb->type) {
            op_path(v, r, t, i, leaf);
            return vfail(v, "expected buffer type %s of remote buffer %u, got %u", btype_names[rb->type], o->rbuf,
                         o->type);
        }
        owner = rb->rank;
    } else if (o->type >= MSCX_BUF_COUNT) {
        snprintf(leaf, sizeof(leaf), "%s[%u].type", list, k);
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected a buffer type, got %u", o->type);
    }
    uint32_t n = buf_chunks(&p->gpus[owner], o->type);
    if (o->index >= n) {
        snprintf(leaf, sizeof(leaf), "%s[%u].index", list, k);
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected a chunk index below %u (rank %u %s), got %u", n, owner, btype_names[o->type],
                     o->index);
    }
    if (o->size > n - o->index) {
        snprintf(leaf, sizeof(leaf), "%s[%u].size", list, k);
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected at most %u chunks from index %u (rank %u %s has %u), got %u", n - o->index,
                     o->index, owner, btype_names[o->type], n, o->size);
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
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected a %s operand, got a switch operand", want_remote ? "remote" : "local");
    }
    if (remote != want_remote) {
        snprintf(leaf, sizeof(leaf), "%s[%u]", list, k);
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected a %s operand for %s, got a %s one",
                     want_remote ? "remote {buffer_id, index, size}" : "local {type, index, size}",
                     mscx_opcode_name((enum mscx_opcode)op->opcode), remote ? "remote" : "local");
    }
    if (want_scratch && o->type != MSCX_BUF_SCRATCH) {
        snprintf(leaf, sizeof(leaf), "%s[%u].%s", list, k, remote ? "buffer_id" : "type");
        op_path(v, r, t, i, leaf);
        return vfail(v, "expected %s scratch (%s packets live in scratch), got %s %s", remote ? "remote" : "local",
                     mscx_opcode_name((enum mscx_opcode)op->opcode), remote ? "remote" : "local",
                     o->type < MSCX_BUF_COUNT ? btype_names[o->type] : "?");
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
        op_path(v, r, t, i, "channel_type");
        return vfail(v, "expected a channel type that %s supports (%s%s%s), got %s", name,
                     l->ct_mask & CT(MSCX_CHAN_NONE) ? "none " : "", l->ct_mask & CT(MSCX_CHAN_MEMORY) ? "memory " : "",
                     l->ct_mask & CT(MSCX_CHAN_PORT) ? "port" : "", ctype_names[op->chan_type]);
    }
    if (op->nsrc < l->nsrc_min || op->nsrc > l->nsrc_max) {
        op_path(v, r, t, i, "src_buff");
        return vfail(v, "expected %u to %u source operands for %s, got %u", l->nsrc_min, l->nsrc_max, name, op->nsrc);
    }
    if (op->ndst < l->ndst_min || op->ndst > l->ndst_max) {
        op_path(v, r, t, i, "dst_buff");
        return vfail(v, "expected %u to %u destination operands for %s, got %u", l->ndst_min, l->ndst_max, name,
                     op->ndst);
    }
    if (l->paired && op->nsrc != op->ndst) {
        op_path(v, r, t, i, "dst_buff");
        return vfail(v, "expected one destination per source (%u) for %s, got %u", op->nsrc, name, op->ndst);
    }
    if (l->need_chan && op->nchan == 0) {
        op_path(v, r, t, i, "channel_ids");
        return vfail(v, "expected at least one channel for %s, got none", name);
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
            op_path(v, r, t, i, "channel_ids");
            return vfail(v, "expected one port channel per destination (%u) for %s, got %u", op->ndst, name,
                         op->nchan);
        }
        for (uint32_t k = 0; k < op->ndst; k++) {
            uint32_t peer = g->chan[MSCX_CHAN_PORT][op->chan[k]].peer;
            uint32_t owner = g->rbuf[op->dst[k].rbuf].rank;
            if (peer != owner) {
                char leaf[32];
                snprintf(leaf, sizeof(leaf), "channel_ids[%u]", k);
                op_path(v, r, t, i, leaf);
                return vfail(v, "expected a port channel to rank %u (the owner of dst_buff[%u]), got a channel to "
                             "rank %u", owner, k, peer);
            }
        }
    }
    return 0;
}

static int check_op(struct vctx *v, uint32_t r, uint32_t t, uint32_t i)
{
    const struct mscx_plan *p = v->plan;
    const struct mscx_gpu *g = &p->gpus[r];
    const struct mscx_tb *tb = &g->tb[t];
    const struct mscx_dev_op *op = &g->ops[i];

    if (op->opcode >= MSCX_OP_COUNT) {
        op_path(v, r, t, i, "name");
        return vfail(v, "expected an operation, got opcode %u", op->opcode);
    }
    if (op->chan_type >= MSCX_CHAN_COUNT) {
        op_path(v, r, t, i, "channel_type");
        return vfail(v, "expected a channel type, got %u", op->chan_type);
    }
    if (op->nsrc > MSCX_MAX_OPERANDS || op->ndst > MSCX_MAX_OPERANDS) {
        op_path(v, r, t, i, op->nsrc > MSCX_MAX_OPERANDS ? "src_buff" : "dst_buff");
        return vfail(v, "expected at most %d operands, got %u", MSCX_MAX_OPERANDS,
                     op->nsrc > op->ndst ? op->nsrc : op->ndst);
    }
    if (op->nchan > MSCX_MAX_CHAN_PER_OP || op->nsem > MSCX_MAX_SEM_PER_OP) {
        op_path(v, r, t, i, op->nchan > MSCX_MAX_CHAN_PER_OP ? "channel_ids" : "semaphore_ids");
        return vfail(v, "expected at most %d entries, got %u", MSCX_MAX_CHAN_PER_OP,
                     op->nchan > MSCX_MAX_CHAN_PER_OP ? op->nchan : op->nsem);
    }
    if (op->tbg_size == 0 || op->tbg_id >= op->tbg_size) {
        op_path(v, r, t, i, "tbg_info.tb_id");
        return vfail(v, "expected a slice below the group size %u, got %u", op->tbg_size, op->tbg_id);
    }
    for (uint32_t k = 0; k < op->nchan; k++) {
        uint32_t lim = op->chan_type == MSCX_CHAN_SWITCH ? g->nswitch : g->nchan[op->chan_type];
        if (op->chan[k] >= lim) {
            char leaf[32];
            snprintf(leaf, sizeof(leaf), "channel_ids[%u]", k);
            op_path(v, r, t, i, leaf);
            return vfail(v, "expected a %s channel below %u, got %u", ctype_names[op->chan_type], lim, op->chan[k]);
        }
    }
    if (op->opcode == MSCX_OP_PIPELINE) {
        if (op->flags & MSCX_OPF_IN_PIPELINE) {
            op_path(v, r, t, i, "name");
            return vfail(v, "expected an operation other than pipeline (pipelines do not nest), got \"pipeline\"");
        }
        if (i + 1 + op->pipe_nops > tb->op_begin + tb->nops) {
            op_path(v, r, t, i, "ops");
            return vfail(v, "expected a body within the thread block, got %u ops", op->pipe_nops);
        }
        for (uint32_t k = i + 1; k <= i + op->pipe_nops; k++)
            if (!(g->ops[k].flags & MSCX_OPF_IN_PIPELINE) || g->ops[k].opcode == MSCX_OP_PIPELINE) {
                op_path(v, r, t, k, "name");
                return vfail(v, "expected a non-pipeline body op, got %s",
                             mscx_opcode_name((enum mscx_opcode)g->ops[k].opcode));
            }
        if (op->pipe_unit == 0 || op->pipe_nchunks == 0) {
            op_path(v, r, t, i, "iter_context");
            return vfail(v, "expected a positive unit_size and num_chunks, got %u and %u", op->pipe_unit,
                         op->pipe_nchunks);
        }
    }
    if (op->opcode == MSCX_OP_BARRIER) {
        if (op->barrier_id >= MSCX_MAX_BARRIERS) {
            op_path(v, r, t, i, "barrier_id");
            return vfail(v, "expected a barrier id below %d, got %u", MSCX_MAX_BARRIERS, op->barrier_id);
        }
        if (op->barrier_ntb < 1 || op->barrier_ntb > g->ntb) {
            op_path(v, r, t, i, "num_threadblocks");
            return vfail(v, "expected 1 to %u thread blocks (the rank's grid), got %u", g->ntb, op->barrier_ntb);
        }
    }
    if (op->opcode == MSCX_OP_SEM_ACQUIRE || op->opcode == MSCX_OP_SEM_RELEASE) {
        if (op->nsem == 0) {
            op_path(v, r, t, i, "semaphore_ids");
            return vfail(v, "expected at least one semaphore, got none");
        }
    }
    for (uint32_t k = 0; k < op->nsem; k++) {
        if (op->sem[k] >= g->nsem) {
            char leaf[32];
            snprintf(leaf, sizeof(leaf), "semaphore_ids[%u]", k);
            op_path(v, r, t, i, leaf);
            return vfail(v, "expected a semaphore index below %u, got %u", g->nsem, op->sem[k]);
        }
    }
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
        op_path(v, r, t, i, "channel_type");
        return vfail(v, "expected memory, port or none for %s, got switch",
                     mscx_opcode_name((enum mscx_opcode)op->opcode));
    }
    return check_layout(v, r, t, i);
}

/* Every block using barrier b uses it equally often; their count is num_threadblocks. */
static int check_barriers(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    uint32_t *uses;
    int rc = 0;
    if (g->ntb == 0)
        return 0;
    uses = calloc((size_t)g->ntb * MSCX_MAX_BARRIERS, sizeof(uint32_t));
    if (uses == NULL)
        return vfail(v, "out of memory");
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
                    op_path(v, r, t, i, "barrier_id");
                    rc = vfail(v, "expected barrier %u %u times per block as in thread block %u, got %u times", b,
                               per, first, u);
                } else if (op->barrier_ntb != nblocks) {
                    op_path(v, r, t, i, "num_threadblocks");
                    rc = vfail(v, "expected %u (the blocks that use barrier %u), got %u", nblocks, b,
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
static int check_semaphores(struct vctx *v, uint32_t r)
{
    const struct mscx_gpu *g = &v->plan->gpus[r];
    int64_t *bal;
    int rc = 0;
    if (g->nsem == 0)
        return 0;
    bal = calloc(g->nsem * 2, sizeof(int64_t));
    if (bal == NULL)
        return vfail(v, "out of memory");
    for (uint32_t i = 0; i < g->nops; i++) {
        const struct mscx_dev_op *op = &g->ops[i];
        if (op->opcode != MSCX_OP_SEM_ACQUIRE && op->opcode != MSCX_OP_SEM_RELEASE)
            continue;
        for (uint32_t k = 0; k < op->nsem; k++)
            bal[op->sem[k] * 2 + (op->opcode == MSCX_OP_SEM_RELEASE)]++;
    }
    for (uint32_t s = 0; s < g->nsem; s++) {
        if (bal[s * 2] != bal[s * 2 + 1]) {
            vpath(v, "gpus[%u].semaphores[%u]", r, s);
            rc = vfail(v, "expected as many sem_release as sem_acquire per launch (%" PRId64 " acquires), got %" PRId64
                       " releases", bal[s * 2], bal[s * 2 + 1]);
            break;
        }
    }
    free(bal);
    return rc;
}

struct sigcount {
    uint32_t sig, wait;
    uint32_t sig_t, sig_i, wait_t, wait_i; /* first signalling / waiting op */
};

static bool is_signal(const struct mscx_dev_op *op)
{
    return op->opcode == MSCX_OP_SIGNAL || op->opcode == MSCX_OP_RELAXED_SIGNAL ||
           (op->chan_type == MSCX_CHAN_PORT &&
            (op->opcode == MSCX_OP_PUT_WITH_SIGNAL || op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH));
}

static bool is_wait(const struct mscx_dev_op *op)
{
    return op->opcode == MSCX_OP_WAIT || op->opcode == MSCX_OP_RELAXED_WAIT;
}

/* Signals sent on rank A's channel k must equal the waits on B's paired channel, per launch. */
static int check_signals(struct vctx *v)
{
    const struct mscx_plan *p = v->plan;
    struct sigcount **cnt = calloc((size_t)p->nranks * MSCX_CHAN_COUNT, sizeof(*cnt));
    int rc = 0;
    if (cnt == NULL)
        return vfail(v, "out of memory");
    for (uint32_t r = 0; r < p->nranks && rc == 0; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT; ty++) {
            cnt[r * MSCX_CHAN_COUNT + ty] = calloc(g->nchan[ty] ? g->nchan[ty] : 1, sizeof(struct sigcount));
            if (cnt[r * MSCX_CHAN_COUNT + ty] == NULL)
                rc = vfail(v, "out of memory");
        }
        for (uint32_t t = 0; t < g->ntb && rc == 0; t++) {
            for (uint32_t i = g->tb[t].op_begin; i < g->tb[t].op_begin + g->tb[t].nops; i++) {
                const struct mscx_dev_op *op = &g->ops[i];
                bool s = is_signal(op), w = is_wait(op);
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
    for (uint32_t a = 0; a < p->nranks && rc == 0; a++) {
        const struct mscx_gpu *g = &p->gpus[a];
        for (int ty = MSCX_CHAN_MEMORY; ty <= MSCX_CHAN_PORT && rc == 0; ty++) {
            for (uint32_t c = 0; c < g->nchan[ty] && rc == 0; c++) {
                const struct mscx_chan *ch = &g->chan[ty][c];
                const struct sigcount *sa = &cnt[a * MSCX_CHAN_COUNT + ty][c];
                if (!ch->paired) {
                    if (sa->sig || sa->wait) {
                        op_path(v, a, sa->sig ? sa->sig_t : sa->wait_t, sa->sig ? sa->sig_i : sa->wait_i,
                                "channel_ids");
                        rc = vfail(v, "expected a %s channel that rank %u pairs with (it declares fewer %s channels "
                                   "to rank %u), got rank %u %s channel %u", ctype_names[ty], ch->peer,
                                   ctype_names[ty], a, a, ctype_names[ty], c);
                    }
                    continue;
                }
            }
        }
    }
    /*
     * Per channel: a signal on rank A's channel c lands on the channel of rank B
     * that pairs with it (the k-th channel of A to B pairs with the k-th of B to
     * A, as connections are made in declaration order), and only a wait there
     * consumes it. Any other count leaves a wait that never finishes or a
     * semaphore that drifts one step per launch.
     */
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
                    op_path(v, a, sa->sig_t, sa->sig_i, "channel_ids");
                else
                    op_path(v, ch->peer, sb->wait_t, sb->wait_i, "channel_ids");
                rc = vfail(v, "expected as many waits on rank %u %s channel %u as signals on its pair, rank %u %s "
                           "channel %u (%u per launch), got %u waits", ch->peer, ctype_names[ty], ch->pair, a,
                           ctype_names[ty], c, sa->sig, sb->wait);
            }
        }
    }
    for (size_t k = 0; k < (size_t)p->nranks * MSCX_CHAN_COUNT; k++)
        free(cnt[k]);
    free(cnt);
    return rc;
}

/* ---- accesses to a peer's user buffers happen within its launch ---- */

/*
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
    if (op->chan_type != ty || !(produce ? is_signal(op) : is_wait(op)))
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
    op_path(v, a->r, a->t, a->i, leaf);
    if (o->size == 1)
        snprintf(chunks, sizeof(chunks), "chunk %u", o->index);
    else
        snprintf(chunks, sizeof(chunks), "chunks %u to %u", o->index, o->index + o->size - 1);
    return vfail(
        v,
        "expected the %s of rank %u's %s %s by %s (rank %u thread block %u) to be ordered before the end "
        "of rank %u's launch (a signal after it that rank %u waits for, directly or through barriers or "
        "semaphores), got none: plan %s is order-dependent",
        dst ? "write" : "read", a->owner, btype_names[g->rbuf[o->rbuf].type], chunks,
        mscx_opcode_name((enum mscx_opcode)op->opcode), a->r, a->t, a->owner, a->owner, v->plan->name);
}

/*
 * Every access to a peer's user buffer happens before the end of the
 * owner's launch (see struct hb). Plans without such accesses (the shipped
 * ones) cost one scan.
 */
static int check_peer_accesses(struct vctx *v)
{
    struct hb h;
    struct hb_access *acc = NULL;
    uint32_t n = 0;
    int rc = 0;
    memset(&h, 0, sizeof(h));
    h.plan = v->plan;
    if (peer_accesses(v->plan, &acc, &n))
        return vfail(v, "out of memory");
    if (n == 0)
        return 0;
    if (hb_build(&h)) {
        rc = vfail(v, "out of memory");
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
        int rc = check_barriers(&v, r);
        if (rc == 0)
            rc = check_semaphores(&v, r);
        if (rc)
            return v.path[0] ? MSCX_ERR_PLAN : MSCX_ERR_NO_MEMORY;
    }
    int rc = check_signals(&v);
    if (rc == 0)
        rc = check_peer_accesses(&v);
    if (rc)
        return v.path[0] ? MSCX_ERR_PLAN : MSCX_ERR_NO_MEMORY;
    if (infer_ranks_per_node(&v))
        return MSCX_ERR_NO_MEMORY;
    return MSCX_OK;
}
