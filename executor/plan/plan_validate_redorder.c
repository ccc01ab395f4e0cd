/* SPDX-License-Identifier: MIT */
/*
 * The plan validator's reduction-order check: every rank of an AllReduce
 * ends up with the same bits (see plan_validate.c).
 *
 * Floating-point addition is commutative but not associative, so two ranks
 * that combine the same inputs in another association get results that may
 * differ in the last bit, and data-parallel replicas drift apart. The check
 * evaluates the plan symbolically, once, at load: every cell of every buffer
 * (a chunk, or a thread-block-group slice of one) holds an expression over
 * the ranks' input cells, interned so that equal expressions have one id.
 * Copies, puts and packets move ids; a reduce folds its sources left to
 * right into (a + b) nodes, a + b and b + a being one node (both executors
 * add commutatively and exactly so). The ops run in a fixed schedule that
 * honours every wait, barrier, semaphore and packet the plan has; a plan
 * whose waits never complete in it is left to the other checks. At the
 * end, each rank's output cell must hold the same expression as rank 0's.
 *
 * Only float sums and products can differ; plans limited to other types or
 * operations, and plans that declare "ranks_may_differ", are not checked.
 * Multicast plans are not executed and not checked, nor are plans beyond
 * RO_MAX_CELLS cells or RO_MAX_WORK cell moves (16 and over 100 times
 * MSCCL++'s largest default plan) and in-place plans whose output is not
 * their whole input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_math.h"
#include "plan_model.h"
#include "plan_validate_int.h"

#define RO_MAX_CELLS_PER_CHUNK 64u
#define RO_MAX_CELLS (1u << 21)  /* all ranks and buffers together: 11 bytes each */
#define RO_MAX_WORK (1ull << 26) /* cells read or written by all ops together */
#define RO_RENDER_DEPTH 12
#define RO_TEXT_LEN 96 /* an expression in a message */

/* Node 0 is "unknown" (a buffer never written); leaves are an input cell of a rank. */
struct ro_node {
    uint32_t a, b; /* sum: the operands' ids, a < b; leaf: rank, cell */
    bool leaf;
};

/* The interned expressions. */
struct ro_pool {
    struct ro_node *node;
    uint32_t n, cap;
    uint32_t *slot; /* open addressing over node ids, 0 empty */
    uint32_t nslot;
    bool oom;
};

/* One buffer of one rank: the expression of each cell, whether a packet landed there, its last writer. */
struct ro_buf {
    uint32_t *val;
    uint8_t *ready;
    uint32_t *writer; /* op index + 1 of the writing rank, whose number is in wrank */
    uint16_t *wrank;
    uint32_t ncell;
};

struct ro_tb {
    uint32_t pc;
    bool arrived;
    uint32_t bar_gen;
};

struct ro_rank {
    struct ro_buf buf[MSCX_BUF_COUNT];
    struct ro_tb *tb;
    uint32_t *inbound[MSCX_CHAN_COUNT], *expected[MSCX_CHAN_COUNT];
    int32_t *sem;
    uint32_t bar_count[MSCX_MAX_BARRIERS], bar_gen[MSCX_MAX_BARRIERS];
};

struct ro {
    const struct mscx_plan *plan;
    struct ro_pool pool;
    struct ro_rank *rk;
    uint32_t cells; /* per chunk */
    uint64_t work;  /* cells moved so far */
    bool alias_out; /* in-place: the output is the input */
};

/* A resolved operand: cells [off, off + len) of buffer b of rank owner. */
struct ro_span {
    uint32_t owner;
    struct ro_buf *b;
    uint64_t off, len;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t node_hash(uint32_t a, uint32_t b, bool leaf)
{
    return mix(((uint64_t)a << 32 | b) ^ (leaf ? 0x9e3779b97f4a7c15ull : 0));
}

static int pool_grow(struct ro_pool *p)
{
    uint32_t ns = p->nslot ? p->nslot * 2 : 1024;
    uint32_t *slot = calloc(ns, sizeof(*slot));
    if (slot == NULL)
        return -1;
    for (uint32_t id = 1; id < p->n; id++) {
        uint32_t h = (uint32_t)node_hash(p->node[id].a, p->node[id].b, p->node[id].leaf) & (ns - 1);
        while (slot[h])
            h = (h + 1) & (ns - 1);
        slot[h] = id;
    }
    free(p->slot);
    p->slot = slot;
    p->nslot = ns;
    return 0;
}

/* The id of the node (a, b, leaf); @return 0 when out of memory (and p->oom set). */
static uint32_t pool_intern(struct ro_pool *p, uint32_t a, uint32_t b, bool leaf)
{
    if ((uint64_t)(p->n + 1) * 2 > p->nslot && pool_grow(p)) {
        p->oom = true;
        return 0;
    }
    uint32_t h = (uint32_t)node_hash(a, b, leaf) & (p->nslot - 1);
    for (; p->slot[h]; h = (h + 1) & (p->nslot - 1)) {
        const struct ro_node *n = &p->node[p->slot[h]];
        if (n->a == a && n->b == b && n->leaf == leaf)
            return p->slot[h];
    }
    if (p->n == p->cap) {
        uint32_t nc = p->cap * 2;
        struct ro_node *nn = realloc(p->node, nc * sizeof(*nn));
        if (nn == NULL) {
            p->oom = true;
            return 0;
        }
        p->node = nn;
        p->cap = nc;
    }
    p->node[p->n] = (struct ro_node){a, b, leaf};
    p->slot[h] = p->n;
    return p->n++;
}

/* a + b, commutative; unknown stays unknown. */
static uint32_t pool_sum(struct ro_pool *p, uint32_t a, uint32_t b)
{
    if (a == 0 || b == 0)
        return 0;
    return a < b ? pool_intern(p, a, b, false) : pool_intern(p, b, a, false);
}

/* ---- setup ---- */

static uint32_t gcd32(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Cells per chunk: enough for every thread-block-group slicing to fall on cell boundaries. */
static uint32_t cells_per_chunk(const struct mscx_plan *p)
{
    uint32_t u = 1;
    for (uint32_t r = 0; r < p->nranks; r++)
        for (uint32_t i = 0; i < p->gpus[r].nops; i++) {
            uint32_t s = p->gpus[r].ops[i].tbg_size;
            if (s > 1 && u % s) {
                uint64_t l = (uint64_t)u / gcd32(u, s) * s;
                u = l > RO_MAX_CELLS_PER_CHUNK ? RO_MAX_CELLS_PER_CHUNK : (uint32_t)l;
            }
        }
    return u;
}

static int buf_init(struct ro_buf *b, uint32_t ncell)
{
    uint32_t n = ncell ? ncell : 1;
    b->ncell = ncell;
    b->val = calloc(n, sizeof(*b->val));
    b->ready = calloc(n, 1);
    b->writer = calloc(n, sizeof(*b->writer));
    b->wrank = calloc(n, sizeof(*b->wrank));
    return b->val && b->ready && b->writer && b->wrank ? 0 : -1;
}

static int rank_init(struct ro *s, uint32_t r)
{
    const struct mscx_gpu *g = &s->plan->gpus[r];
    struct ro_rank *rk = &s->rk[r];
    uint32_t chunks[MSCX_BUF_COUNT] = {g->input_chunks, g->output_chunks, g->scratch_chunks};
    for (int b = 0; b < MSCX_BUF_COUNT; b++)
        if (!(b == MSCX_BUF_OUTPUT && s->alias_out) && buf_init(&rk->buf[b], chunks[b] * s->cells))
            return -1;
    for (uint32_t c = 0; c < rk->buf[MSCX_BUF_INPUT].ncell; c++)
        rk->buf[MSCX_BUF_INPUT].val[c] = pool_intern(&s->pool, r, c, true);
    if (s->pool.oom)
        return -1;
    rk->tb = calloc(g->ntb ? g->ntb : 1, sizeof(*rk->tb));
    rk->sem = calloc(g->nsem ? g->nsem : 1, sizeof(*rk->sem));
    if (rk->tb == NULL || rk->sem == NULL)
        return -1;
    for (uint32_t k = 0; k < g->nsem; k++)
        rk->sem[k] = g->sem_init[k];
    for (int c = MSCX_CHAN_MEMORY; c <= MSCX_CHAN_PORT; c++) {
        rk->inbound[c] = calloc(g->nchan[c] ? g->nchan[c] : 1, sizeof(uint32_t));
        rk->expected[c] = calloc(g->nchan[c] ? g->nchan[c] : 1, sizeof(uint32_t));
        if (rk->inbound[c] == NULL || rk->expected[c] == NULL)
            return -1;
    }
    return 0;
}

static void ro_free(struct ro *s)
{
    if (s->rk != NULL)
        for (uint32_t r = 0; r < s->plan->nranks; r++) {
            struct ro_rank *rk = &s->rk[r];
            for (int b = 0; b < MSCX_BUF_COUNT; b++) {
                free(rk->buf[b].val);
                free(rk->buf[b].ready);
                free(rk->buf[b].writer);
                free(rk->buf[b].wrank);
            }
            for (int c = 0; c < MSCX_CHAN_COUNT; c++) {
                free(rk->inbound[c]);
                free(rk->expected[c]);
            }
            free(rk->tb);
            free(rk->sem);
        }
    free(s->rk);
    free(s->pool.node);
    free(s->pool.slot);
}

static int ro_init(struct ro *s, const struct mscx_plan *p)
{
    uint64_t total = 0;
    memset(s, 0, sizeof(*s));
    s->plan = p;
    s->cells = cells_per_chunk(p);
    s->alias_out = p->inplace;
    for (uint32_t r = 0; r < p->nranks; r++) {
        const struct mscx_gpu *g = &p->gpus[r];
        if (p->inplace && g->input_chunks != g->output_chunks)
            return 1; /* the output sits elsewhere in the input: not modelled */
        total += ((uint64_t)g->input_chunks + g->output_chunks + g->scratch_chunks) * s->cells;
    }
    if (total > RO_MAX_CELLS)
        return 1;
    s->pool.cap = 1024;
    s->pool.n = 1;
    s->pool.node = calloc(s->pool.cap, sizeof(*s->pool.node));
    s->rk = calloc(p->nranks, sizeof(*s->rk));
    if (s->pool.node == NULL || s->rk == NULL)
        return -1;
    for (uint32_t r = 0; r < p->nranks; r++)
        if (rank_init(s, r))
            return -1;
    return 0;
}

/* ---- the ops ---- */

/* Count @p n cells of work; @return false past the budget. */
static bool spend(struct ro *s, uint64_t n)
{
    s->work += n;
    return s->work <= RO_MAX_WORK;
}

static struct ro_buf *buf_of(struct ro *s, uint32_t rank, uint8_t type)
{
    if (type == MSCX_BUF_OUTPUT && s->alias_out)
        type = MSCX_BUF_INPUT;
    return &s->rk[rank].buf[type < MSCX_BUF_COUNT ? type : MSCX_BUF_SCRATCH];
}

static void span_of(struct ro *s, uint32_t r, const struct mscx_dev_op *op, const struct mscx_dev_operand *o,
                    struct ro_span *sp)
{
    spend(s, 1);
    const struct mscx_gpu *g = &s->plan->gpus[r];
    uint32_t owner = r;
    uint8_t type = o->type;
    if ((o->flags & MSCX_OPND_REMOTE) && o->rbuf < g->nrbuf) {
        owner = g->rbuf[o->rbuf].rank;
        type = g->rbuf[o->rbuf].type;
    }
    sp->owner = owner;
    sp->b = buf_of(s, owner, type);
    mscx_operand_range(op, o, s->cells, 1, &sp->off, &sp->len);
    if (sp->off > sp->b->ncell)
        sp->off = sp->b->ncell;
    if (sp->len > sp->b->ncell - sp->off)
        sp->len = sp->b->ncell - sp->off;
    spend(s, sp->len);
}

static bool span_ready(const struct ro_span *sp)
{
    for (uint64_t j = 0; j < sp->len; j++)
        if (!sp->b->ready[sp->off + j])
            return false;
    return true;
}

static void cell_put(struct ro_buf *b, uint64_t at, uint32_t val, bool packet, uint32_t r, uint32_t i)
{
    b->val[at] = val;
    b->writer[at] = i + 1;
    b->wrank[at] = (uint16_t)r;
    if (packet)
        b->ready[at] = 1;
}

static void copy_span(const struct ro_span *src, const struct ro_span *dst, bool packet, uint32_t r,
                      uint32_t i)
{
    uint64_t n = src->len < dst->len ? src->len : dst->len;
    for (uint64_t j = 0; j < n; j++)
        cell_put(dst->b, dst->off + j, src->b->val[src->off + j], packet, r, i);
}

static void signal_chan(struct ro *s, uint32_t r, uint8_t ct, uint32_t c)
{
    const struct mscx_gpu *g = &s->plan->gpus[r];
    if (ct < MSCX_CHAN_MEMORY || ct > MSCX_CHAN_PORT || c >= g->nchan[ct] || !g->chan[ct][c].paired)
        return;
    s->rk[g->chan[ct][c].peer].inbound[ct][g->chan[ct][c].pair]++;
}

/* Reduce: raw sources src[0..nraw), packet sources after; raw results dst[0..nrawdst), packets after. */
static int do_reduce(struct ro *s, uint32_t r, uint32_t i, uint32_t nraw, uint32_t nrawdst, bool *done)
{
    const struct mscx_dev_op *op = &s->plan->gpus[r].ops[i];
    struct ro_span src[MSCX_MAX_OPERANDS], dst[MSCX_MAX_OPERANDS];
    for (uint32_t k = 0; k < op->nsrc; k++) {
        span_of(s, r, op, &op->src[k], &src[k]);
        if (k >= nraw && !span_ready(&src[k]))
            return 0;
    }
    for (uint32_t k = 0; k < op->ndst; k++)
        span_of(s, r, op, &op->dst[k], &dst[k]);
    *done = true;
    for (uint64_t j = 0; j < src[0].len; j++) {
        uint32_t acc = src[0].b->val[src[0].off + j];
        for (uint32_t k = 1; k < op->nsrc; k++)
            acc = pool_sum(&s->pool, acc, j < src[k].len ? src[k].b->val[src[k].off + j] : 0);
        if (s->pool.oom)
            return -1;
        for (uint32_t k = 0; k < op->ndst; k++)
            if (j < dst[k].len)
                cell_put(dst[k].b, dst[k].off + j, acc, k >= nrawdst, r, i);
    }
    return 0;
}

/* Pairwise copies src[k] -> dst[k]; port puts with a signal signal after each. */
static void do_copies(struct ro *s, uint32_t r, uint32_t i, bool packet)
{
    const struct mscx_dev_op *op = &s->plan->gpus[r].ops[i];
    uint32_t n = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    bool sig = op->chan_type == MSCX_CHAN_PORT &&
               (op->opcode == MSCX_OP_PUT_WITH_SIGNAL || op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH);
    for (uint32_t k = 0; k < n; k++) {
        struct ro_span a, b;
        span_of(s, r, op, &op->src[k], &a);
        span_of(s, r, op, &op->dst[k], &b);
        copy_span(&a, &b, packet, r, i);
        if (sig && op->nchan)
            signal_chan(s, r, MSCX_CHAN_PORT, op->chan[k < op->nchan ? k : op->nchan - 1u]);
    }
}

/* Packets read from src[0], written raw (unpack) or as packets to every destination. */
static bool do_forward(struct ro *s, uint32_t r, uint32_t i, bool packet)
{
    const struct mscx_dev_op *op = &s->plan->gpus[r].ops[i];
    struct ro_span a, b;
    span_of(s, r, op, &op->src[0], &a);
    if (!span_ready(&a))
        return false;
    for (uint32_t k = 0; k < op->ndst; k++) {
        span_of(s, r, op, &op->dst[k], &b);
        copy_span(&a, &b, packet, r, i);
    }
    return true;
}

static bool do_wait(struct ro *s, uint32_t r, const struct mscx_dev_op *op)
{
    struct ro_rank *rk = &s->rk[r];
    uint8_t ct = op->chan_type == MSCX_CHAN_PORT ? MSCX_CHAN_PORT : MSCX_CHAN_MEMORY;
    uint32_t nc = s->plan->gpus[r].nchan[ct];
    for (uint32_t k = 0; k < op->nchan; k++) {
        uint32_t c = op->chan[k], need = 0;
        if (c >= nc)
            return false;
        for (uint32_t m = 0; m < op->nchan; m++)
            need += op->chan[m] == c;
        if (rk->inbound[ct][c] < rk->expected[ct][c] + need)
            return false;
    }
    for (uint32_t k = 0; k < op->nchan; k++)
        rk->expected[ct][op->chan[k]]++;
    return true;
}

static bool do_barrier(struct ro *s, uint32_t r, uint32_t t, const struct mscx_dev_op *op)
{
    struct ro_rank *rk = &s->rk[r];
    struct ro_tb *tb = &rk->tb[t];
    uint32_t id = op->barrier_id % MSCX_MAX_BARRIERS;
    if (!tb->arrived) {
        tb->arrived = true;
        tb->bar_gen = rk->bar_gen[id];
        if (++rk->bar_count[id] >= op->barrier_ntb) {
            rk->bar_count[id] = 0;
            rk->bar_gen[id]++;
        }
    }
    if (rk->bar_gen[id] == tb->bar_gen)
        return false;
    tb->arrived = false;
    return true;
}

static bool do_sem(struct ro *s, uint32_t r, const struct mscx_dev_op *op)
{
    int32_t *sem = s->rk[r].sem;
    if (op->opcode == MSCX_OP_SEM_RELEASE) {
        for (uint32_t k = 0; k < op->nsem; k++)
            sem[op->sem[k]]++;
        return true;
    }
    for (uint32_t k = 0; k < op->nsem; k++) {
        int32_t need = 0;
        for (uint32_t m = 0; m < op->nsem; m++)
            need += op->sem[m] == op->sem[k];
        if (sem[op->sem[k]] < need)
            return false;
    }
    for (uint32_t k = 0; k < op->nsem; k++)
        sem[op->sem[k]]--;
    return true;
}

/* Run op @p i of block @p t of rank @p r if it can complete now; @return -1 out of memory. */
static int step(struct ro *s, uint32_t r, uint32_t t, uint32_t i, bool *done)
{
    const struct mscx_dev_op *op = &s->plan->gpus[r].ops[i];
    bool port = op->chan_type == MSCX_CHAN_PORT;
    *done = true;
    switch (op->opcode) {
    case MSCX_OP_BARRIER:
        *done = do_barrier(s, r, t, op);
        break;
    case MSCX_OP_PUT:
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        do_copies(s, r, i, false);
        break;
    case MSCX_OP_PUT_PACKETS:
    case MSCX_OP_COPY_PACKETS:
        do_copies(s, r, i, true);
        break;
    case MSCX_OP_READ_PUT_PACKETS:
        *done = do_forward(s, r, i, true);
        break;
    case MSCX_OP_UNPACK_PACKETS:
        *done = do_forward(s, r, i, false);
        break;
    case MSCX_OP_SIGNAL:
    case MSCX_OP_RELAXED_SIGNAL:
        for (uint32_t k = 0; k < op->nchan; k++)
            signal_chan(s, r, port ? MSCX_CHAN_PORT : MSCX_CHAN_MEMORY, op->chan[k]);
        break;
    case MSCX_OP_WAIT:
    case MSCX_OP_RELAXED_WAIT:
        *done = do_wait(s, r, op);
        break;
    case MSCX_OP_REDUCE:
        *done = false;
        return do_reduce(s, r, i, op->nsrc, 1, done);
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
        *done = false;
        return do_reduce(s, r, i, op->nsrc, op->ndst, done);
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        *done = false;
        return do_reduce(s, r, i, 1, 1, done);
    case MSCX_OP_SEM_RELEASE:
    case MSCX_OP_SEM_ACQUIRE:
        *done = do_sem(s, r, op);
        break;
    default: /* nop, flush, pipeline (its body runs once, over the whole range) */
        break;
    }
    return 0;
}

/* Every block as far as it goes, until none moves; @return 1 when some block is stuck. */
static int run_all(struct ro *s)
{
    const struct mscx_plan *p = s->plan;
    bool moved = true, left = true;
    while (moved && left) {
        moved = left = false;
        for (uint32_t r = 0; r < p->nranks; r++) {
            const struct mscx_gpu *g = &p->gpus[r];
            for (uint32_t t = 0; t < g->ntb; t++) {
                struct ro_tb *tb = &s->rk[r].tb[t];
                bool done = true;
                while (tb->pc < g->tb[t].nops && done) {
                    if (step(s, r, t, g->tb[t].op_begin + tb->pc, &done))
                        return -1;
                    if (done) {
                        tb->pc++;
                        moved = true;
                    }
                }
                left |= tb->pc < g->tb[t].nops;
            }
        }
        if (!spend(s, 0))
            return 1;
    }
    return left ? 1 : 0;
}

/* ---- the verdict ---- */

/* The smallest rank among the leaves under @p id (for a stable rendering). */
static uint32_t min_rank(const struct ro_pool *p, uint32_t id, int depth)
{
    const struct ro_node *n = &p->node[id];
    if (id != 0 && n->leaf)
        return n->a;
    if (id == 0 || depth > RO_RENDER_DEPTH)
        return UINT32_MAX;
    uint32_t a = min_rank(p, n->a, depth + 1), b = min_rank(p, n->b, depth + 1);
    return a < b ? a : b;
}

/* Append the expression @p id as "(r0+r1)+r2" to @p buf; leaves of another cell than @p cell name it. */
static void render(const struct ro_pool *p, uint32_t id, uint32_t cell, int depth, char *buf, size_t len)
{
    size_t at = strlen(buf);
    const struct ro_node *n = &p->node[id];
    if (at + 16 >= len)
        return; /* the caller cuts the text short */
    if (id == 0) {
        snprintf(buf + at, len - at, "?");
    } else if (n->leaf) {
        if (n->b == cell)
            snprintf(buf + at, len - at, "r%u", n->a);
        else
            snprintf(buf + at, len - at, "r%u.c%u", n->a, n->b);
    } else if (depth > RO_RENDER_DEPTH) {
        snprintf(buf + at, len - at, "...");
    } else {
        bool swap = min_rank(p, n->b, depth + 1) < min_rank(p, n->a, depth + 1);
        snprintf(buf + at, len - at, "%s", depth ? "(" : "");
        render(p, swap ? n->b : n->a, cell, depth + 1, buf, len);
        at = strlen(buf);
        snprintf(buf + at, len - at, "+");
        render(p, swap ? n->a : n->b, cell, depth + 1, buf, len);
        at = strlen(buf);
        snprintf(buf + at, len - at, "%s", depth ? ")" : "");
    }
}

/* The expression @p id in at most RO_TEXT_LEN - 1 characters, cut short with "...". */
static void render_short(const struct ro_pool *p, uint32_t id, uint32_t cell, char out[RO_TEXT_LEN])
{
    char full[1024] = "";
    render(p, id, cell, 0, full, sizeof(full));
    if (strlen(full) >= RO_TEXT_LEN)
        snprintf(full + RO_TEXT_LEN - 4, 4, "...");
    snprintf(out, RO_TEXT_LEN, "%s", full);
}

/* The block of op @p i of rank @p r. */
static uint32_t tb_of(const struct mscx_gpu *g, uint32_t i)
{
    for (uint32_t t = 0; t < g->ntb; t++)
        if (i >= g->tb[t].op_begin && i < g->tb[t].op_begin + g->tb[t].nops)
            return t;
    return 0;
}

static int differ_fail(struct vctx *v, struct ro *s, uint32_t r, uint32_t c)
{
    const struct ro_buf *b = buf_of(s, r, MSCX_BUF_OUTPUT), *b0 = buf_of(s, 0, MSCX_BUF_OUTPUT);
    char mine[RO_TEXT_LEN], first[RO_TEXT_LEN], where[64];
    uint32_t chunk = c / s->cells, part = c % s->cells;
    render_short(&s->pool, b->val[c], c, mine);
    render_short(&s->pool, b0->val[c], c, first);
    if (s->cells == 1)
        snprintf(where, sizeof(where), "output chunk %u", chunk);
    else
        snprintf(where, sizeof(where), "output chunk %u (part %u of %u)", chunk, part + 1, s->cells);
    if (b->writer[c]) {
        uint32_t wr = b->wrank[c], wi = b->writer[c] - 1;
        mscx_pv_op_path(v, wr, tb_of(&s->plan->gpus[wr], wi), wi, NULL);
    } else {
        mscx_pv_path(v, "gpus[%u]", r);
    }
    return mscx_pv_fail(
        v,
        "expected every rank to reduce each output element in the same order, got another "
        "order on rank %u than on rank 0 for its %s: floating-point results differ between "
        "ranks; plan %s is refused (a plan that accepts this sets \"ranks_may_differ\": true); "
        "rank %u: %s, rank 0: %s",
        r, where, v->plan->name, r, mine, first);
}

static bool order_matters(const struct mscx_plan *p)
{
    uint32_t floats = (1u << MSCX_DT_FP32) | (1u << MSCX_DT_FP16) | (1u << MSCX_DT_BF16);
    uint32_t inexact = (1u << MSCX_REDOP_SUM) | (1u << MSCX_REDOP_PROD);
    return p->coll == MSCX_COLL_ALLREDUCE && !p->ranks_may_differ && !p->has_multicast && p->nranks > 1 &&
           (p->dtype_mask & floats) && (p->redop_mask & inexact);
}

/*
 * Every rank's output, cell by cell, holds the expression rank 0's holds
 * (see the top of this file); the first that does not fails.
 */
int mscx_pv_check_reduction_order(struct vctx *v)
{
    struct ro s;
    int rc;
    if (!order_matters(v->plan))
        return 0;
    rc = ro_init(&s, v->plan); /* 1: not modelled */
    if (rc == 0)
        rc = run_all(&s); /* 1: some block never finishes, which the other checks judge */
    if (rc < 0 || s.pool.oom) {
        ro_free(&s);
        return mscx_pv_fail(v, "out of memory");
    }
    for (uint32_t r = 1; r < v->plan->nranks && rc == 0; r++) {
        const struct ro_buf *b = buf_of(&s, r, MSCX_BUF_OUTPUT), *b0 = buf_of(&s, 0, MSCX_BUF_OUTPUT);
        uint32_t n = b->ncell < b0->ncell ? b->ncell : b0->ncell;
        for (uint32_t c = 0; c < n && rc == 0; c++)
            if (b->val[c] && b0->val[c] && b->val[c] != b0->val[c])
                rc = differ_fail(v, &s, r, c);
    }
    ro_free(&s);
    return rc < 0 ? -1 : 0;
}
