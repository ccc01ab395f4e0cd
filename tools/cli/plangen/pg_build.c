/* SPDX-License-Identifier: MIT */
/*
 * The JSON plan builder of mscx-plangen: per-rank channel and remote-buffer
 * tables, per-thread-block local tables, and the serialisation in the key
 * order the MSCCL++ DSL emits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plangen.h"

static const char *const pg_chan_names[PG_CH_COUNT] = {"memory", "port"};

static const char *const pg_all_dtypes[] = {"fp32", "fp16",  "bf16",  "int32",  "uint32",
                                            "int8", "uint8", "int64", "uint64", "fp64"};
#define PG_NREDUCIBLE 5
static const char *const pg_redops[] = {"sum", "prod", "min", "max"};

int pg_plan_init(struct pg_plan *p, const struct pg_params *par, bool packet, bool inplace)
{
    memset(p, 0, sizeof(*p));
    p->par = par;
    p->packet = packet;
    p->inplace = inplace;
    p->nranks = par->nranks;
    p->gpus = calloc(par->nranks, sizeof(*p->gpus));
    if (!p->gpus) {
        fprintf(stderr, "mscx-plangen: out of memory\n");
        return -1;
    }
    return 0;
}

void pg_plan_fini(struct pg_plan *p)
{
    if (!p->gpus)
        return;
    for (uint32_t r = 0; r < p->nranks; r++)
        for (uint32_t t = 0; t < p->gpus[r].ntb; t++)
            json_decref(p->gpus[r].tb[t].ops);
    free(p->gpus);
    p->gpus = NULL;
}

void pg_plan_chunks(struct pg_plan *p, uint32_t in, uint32_t out, uint32_t scratch)
{
    for (uint32_t r = 0; r < p->nranks; r++) {
        p->gpus[r].input_chunks = in;
        p->gpus[r].output_chunks = out;
        p->gpus[r].scratch_chunks = scratch;
    }
}

static int pg_chan_find(const struct pg_gpu *g, enum pg_chan type, uint32_t peer)
{
    for (uint32_t i = 0; i < g->nch[type]; i++)
        if (g->peer[type][i] == peer)
            return (int)i;
    return -1;
}

int pg_connect(struct pg_plan *p, uint32_t rank, enum pg_chan type, uint32_t peer)
{
    struct pg_gpu *g = &p->gpus[rank];
    int k = pg_chan_find(g, type, peer);
    if (k >= 0)
        return k;
    if (g->nch[type] >= PG_MAX_PEERS) {
        fprintf(stderr, "mscx-plangen: too many %s channels on rank %u\n", pg_chan_names[type], rank);
        return -1;
    }
    g->peer[type][g->nch[type]] = peer;
    return (int)g->nch[type]++;
}

int pg_tb_new(struct pg_plan *p, uint32_t rank)
{
    struct pg_gpu *g = &p->gpus[rank];
    if (g->ntb >= PG_MAX_TB) {
        fprintf(stderr, "mscx-plangen: too many thread blocks on rank %u\n", rank);
        return -1;
    }
    struct pg_tb *tb = &g->tb[g->ntb];
    memset(tb, 0, sizeof(*tb));
    tb->ops = json_array();
    return (int)g->ntb++;
}

json_t *pg_loc(char type, uint32_t index, uint32_t size)
{
    char t[2] = {type, 0};
    return json_pack("{s:s, s:I, s:I}", "type", t, "index", (json_int_t)index, "size", (json_int_t)size);
}

/* Find or append @p v in a thread block table; aborts generation on overflow. */
static uint32_t pg_table_ref(uint32_t *n, uint32_t *tab, uint32_t v)
{
    for (uint32_t i = 0; i < *n; i++)
        if (tab[i] == v)
            return i;
    if (*n >= PG_TB_TABLE) {
        fprintf(stderr, "mscx-plangen: thread block table overflow (more than %d entries)\n", PG_TB_TABLE);
        exit(1);
    }
    tab[*n] = v;
    return (*n)++;
}

int pg_tb_chan(struct pg_plan *p, uint32_t rank, uint32_t tb, enum pg_chan type, uint32_t peer)
{
    struct pg_gpu *g = &p->gpus[rank];
    int k = pg_connect(p, rank, type, peer);
    if (k < 0)
        exit(1);
    struct pg_tb *t = &g->tb[tb];
    return (int)pg_table_ref(&t->nch[type], t->ch[type], (uint32_t)k);
}

json_t *pg_rem(struct pg_plan *p, uint32_t rank, uint32_t tb, enum pg_chan type, uint32_t owner, char btype,
               uint32_t index, uint32_t size)
{
    struct pg_gpu *g = &p->gpus[rank];
    uint32_t k;
    for (k = 0; k < g->nrbuf; k++)
        if (g->rbuf[k].rank == owner && g->rbuf[k].type == btype && g->rbuf[k].chan == type)
            break;
    if (k == g->nrbuf) {
        if (g->nrbuf >= PG_MAX_RBUF) {
            fprintf(stderr, "mscx-plangen: too many remote buffers on rank %u\n", rank);
            exit(1);
        }
        g->rbuf[k] = (struct pg_rbuf){.rank = owner, .type = btype, .chan = type};
        g->nrbuf++;
    }
    /* The block's channel table follows its remote buffer table, as the DSL's does. */
    (void)pg_tb_chan(p, rank, tb, type, owner);
    struct pg_tb *t = &g->tb[tb];
    uint32_t local = pg_table_ref(&t->nrb[type], t->rb[type], k);
    return json_pack("{s:I, s:I, s:I}", "buffer_id", (json_int_t)local, "index", (json_int_t)index, "size",
                     (json_int_t)size);
}

void pg_op(struct pg_plan *p, uint32_t rank, uint32_t tb, const char *name, json_t *src, json_t *dst,
           const char *chan_type, json_t *chan_ids, bool reduce, struct pg_tbg tbg)
{
    json_t *op = json_object();
    json_object_set_new(op, "name", json_string(name));
    if (src)
        json_object_set_new(op, "src_buff", src);
    if (dst)
        json_object_set_new(op, "dst_buff", dst);
    if (chan_ids)
        json_object_set_new(op, "channel_ids", chan_ids);
    if (chan_type)
        json_object_set_new(op, "channel_type", json_string(chan_type));
    if (reduce)
        json_object_set_new(op, "reduce_op", json_string("sum"));
    if (tbg.size > 1)
        json_object_set_new(
            op, "tbg_info",
            json_pack("{s:I, s:I}", "tb_id", (json_int_t)tbg.id, "tbg_size", (json_int_t)tbg.size));
    json_array_append_new(p->gpus[rank].tb[tb].ops, op);
}

void pg_barrier(struct pg_plan *p, uint32_t rank, uint32_t tb, uint32_t id, uint32_t ntb)
{
    json_t *op = json_pack("{s:s, s:I, s:I}", "name", "barrier", "barrier_id", (json_int_t)id,
                           "num_threadblocks", (json_int_t)ntb);
    json_array_append_new(p->gpus[rank].tb[tb].ops, op);
}

/* Every channel must be declared on both ends so that the pairs match. */
static void pg_plan_symmetrise(struct pg_plan *p)
{
    for (uint32_t r = 0; r < p->nranks; r++)
        for (int t = 0; t < PG_CH_COUNT; t++)
            for (uint32_t i = 0; i < p->gpus[r].nch[t]; i++)
                (void)pg_connect(p, p->gpus[r].peer[t][i], (enum pg_chan)t, r);
}

static json_t *pg_tb_json(const struct pg_tb *t, uint32_t id)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(id));
    json_object_set(o, "ops", t->ops);
    json_t *chans = json_array(), *refs = json_array();
    for (int ty = 0; ty < PG_CH_COUNT; ty++) {
        if (t->nch[ty]) {
            json_t *ids = json_array();
            for (uint32_t i = 0; i < t->nch[ty]; i++)
                json_array_append_new(ids, json_integer(t->ch[ty][i]));
            json_array_append_new(
                chans, json_pack("{s:s, s:o}", "channel_type", pg_chan_names[ty], "channel_ids", ids));
        }
        if (t->nrb[ty]) {
            json_t *ids = json_array();
            for (uint32_t i = 0; i < t->nrb[ty]; i++)
                json_array_append_new(ids, json_integer(t->rb[ty][i]));
            json_array_append_new(refs, json_pack("{s:s, s:o}", "access_channel_type", pg_chan_names[ty],
                                                  "remote_buffer_ids", ids));
        }
    }
    json_object_set_new(o, "channels", chans);
    json_object_set_new(o, "remote_buffer_refs", refs);
    return o;
}

static json_t *pg_gpu_json(const struct pg_gpu *g, uint32_t id)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "input_chunks", json_integer(g->input_chunks));
    json_object_set_new(o, "output_chunks", json_integer(g->output_chunks));
    json_object_set_new(o, "scratch_chunks", json_integer(g->scratch_chunks));
    json_t *tbs = json_array();
    for (uint32_t t = 0; t < g->ntb; t++)
        json_array_append_new(tbs, pg_tb_json(&g->tb[t], t));
    json_object_set_new(o, "threadblocks", tbs);
    json_t *chans = json_array();
    for (int ty = 0; ty < PG_CH_COUNT; ty++) {
        if (!g->nch[ty])
            continue;
        json_t *peers = json_array();
        for (uint32_t i = 0; i < g->nch[ty]; i++)
            json_array_append_new(peers, json_integer(g->peer[ty][i]));
        json_array_append_new(
            chans, json_pack("{s:s, s:o}", "channel_type", pg_chan_names[ty], "connected_to", peers));
    }
    json_object_set_new(o, "channels", chans);
    json_t *rbufs = json_array();
    for (uint32_t k = 0; k < g->nrbuf; k++) {
        char t[2] = {g->rbuf[k].type, 0};
        json_array_append_new(rbufs,
                              json_pack("{s:I, s:s, s:[s]}", "rank", (json_int_t)g->rbuf[k].rank, "type", t,
                                        "access_channel_types", pg_chan_names[g->rbuf[k].chan]));
    }
    json_object_set_new(o, "remote_buffers", rbufs);
    json_object_set_new(o, "semaphores", json_array());
    return o;
}

char *pg_plan_dump(const struct pg_plan *p)
{
    const struct pg_params *par = p->par;
    pg_plan_symmetrise((struct pg_plan *)p);
    json_t *root = json_object();
    json_object_set_new(root, "name", json_string(p->name));
    json_object_set_new(root, "collective", json_string(mscx_coll_name(par->coll)));
    json_object_set_new(root, "protocol", json_string(p->packet ? "LL" : "Simple"));
    json_object_set_new(root, "inplace", json_boolean(p->inplace));
    json_object_set_new(root, "reuse_resources", json_false());
    json_t *gpus = json_array();
    for (uint32_t r = 0; r < p->nranks; r++)
        json_array_append_new(gpus, pg_gpu_json(&p->gpus[r], r));
    json_object_set_new(root, "gpus", gpus);
    json_object_set_new(root, "num_threads_per_block", json_integer(par->nthreads));
    json_object_set_new(root, "use_double_scratch_buffer", json_boolean(p->packet));
    json_object_set_new(root, "buffer_alignment", json_integer(16));
    json_object_set_new(root, "min_message_size", json_integer((json_int_t)par->min_size));
    json_object_set_new(root, "max_message_size", json_integer((json_int_t)par->max_size));

    bool reduces = par->coll == MSCX_COLL_ALLREDUCE || par->coll == MSCX_COLL_REDUCESCATTER;
    json_t *ext = json_object(), *dts = json_array(), *ops = json_array();
    size_t ndt = reduces ? PG_NREDUCIBLE : sizeof(pg_all_dtypes) / sizeof(pg_all_dtypes[0]);
    for (size_t i = 0; i < ndt; i++)
        json_array_append_new(dts, json_string(pg_all_dtypes[i]));
    json_object_set_new(ext, "version", json_integer(1));
    json_object_set_new(ext, "ranks_per_node", json_integer(par->rpn));
    if (par->coll == MSCX_COLL_BROADCAST)
        json_object_set_new(ext, "root", json_integer(par->root));
    json_object_set_new(ext, "dtypes", dts);
    if (reduces) {
        for (size_t i = 0; i < sizeof(pg_redops) / sizeof(pg_redops[0]); i++)
            json_array_append_new(ops, json_string(pg_redops[i]));
        json_object_set_new(ext, "reduce_ops", ops);
    } else {
        json_decref(ops);
    }
    json_object_set_new(root, "mscx", ext);

    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}

void pg_size_label(uint64_t v, char *buf, size_t len)
{
    if (v && v % (1u << 20) == 0)
        snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
    else if (v && v % 1024 == 0)
        snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
}

int pg_tbs_new(struct pg_plan *p, uint32_t rank, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (pg_tb_new(p, rank) < 0)
            return -1;
    return 0;
}

void pg_connect_node(struct pg_plan *p, uint32_t rank, uint32_t P)
{
    uint32_t base = rank / P * P;
    for (uint32_t i = 0; i < P; i++)
        if (base + i != rank)
            (void)pg_connect(p, rank, PG_CH_MEMORY, base + i);
}

int pg_hier_rank(struct pg_plan *p, uint32_t rank, uint32_t P, uint32_t M, uint32_t nblocks)
{
    uint32_t n = rank / P, l = rank % P;
    pg_connect_node(p, rank, P);
    for (uint32_t m = 0; m < M; m++)
        if (m != n)
            (void)pg_connect(p, rank, PG_CH_PORT, m * P + l);
    return pg_tbs_new(p, rank, nblocks);
}
