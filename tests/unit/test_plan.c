/* SPDX-License-Identifier: MIT */
/*
 * The plan loader and model: every MSCCL++ fixture loads, accessors, table
 * resolution and channel pairing, ranks-per-node inference, geometry at odd
 * sizes, historical names, clone and re-validation, the summary.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/env.h"
#include "mscx/log.h"
#include "mscx/plan.h"
#include "plan_model.h"
#include "test_common.h"

static struct mscx_plan *load_ref(const char *rel)
{
    struct mscx_plan *p = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    mscx_status_t st = mscx_plan_load(mscx_test_ref(rel), &p, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s: %s", rel, err);
    return p;
}

static struct mscx_plan *load_str(const char *json)
{
    struct mscx_plan *p = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    mscx_status_t st = mscx_plan_load_buffer(json, strlen(json), "inline.json", &p, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s", err);
    return p;
}

START_TEST(test_all_fixtures_load)
{
    static const char *const dirs[] = {"mscclpp-op-plans", "mscclpp-algo-plans"};
    int total = 0;
    for (size_t d = 0; d < 2; d++) {
        DIR *dir = opendir(mscx_test_ref(dirs[d]));
        struct dirent *e;
        ck_assert_ptr_nonnull(dir);
        while ((e = readdir(dir)) != NULL) {
            char rel[512], err[512];
            size_t n = strlen(e->d_name);
            if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
                continue;
            snprintf(rel, sizeof(rel), "%s/%s", dirs[d], e->d_name);
            if (strstr(e->d_name, "signal_wait_fuse_test") != NULL) {
                /*
                 * DSL demonstrations that signal channels 0,1 and wait on 2,3:
                 * with declaration-order pairing nothing signals 2,3, so they
                 * could never finish. Refused at load, naming the channel.
                 */
                struct mscx_plan *bad = NULL;
                char why[MSCX_PLAN_ERR_LEN];
                ck_assert_int_eq(mscx_plan_load(mscx_test_ref(rel), &bad, why, sizeof(why)), MSCX_ERR_PLAN);
                ck_assert_ptr_null(bad);
                ck_assert_msg(strstr(why, "rank 1 memory channel 0") != NULL, "%s", why);
                total++;
                continue;
            }
            struct mscx_plan *p = load_ref(rel);
            mscx_status_t st = mscx_plan_executable(p, err, sizeof(err));
            if (strncmp(e->d_name, "switch_", 7) == 0) {
                ck_assert_int_eq(st, MSCX_ERR_UNSUPPORTED);
                ck_assert_msg(strstr(err, "multicast") != NULL, "%s: %s", rel, err);
                ck_assert(p->has_multicast);
            } else {
                ck_assert_msg(st == MSCX_OK, "%s: %s", rel, err);
            }
            ck_assert_str_eq(mscx_plan_origin(p), mscx_test_ref(rel));
            mscx_plan_destroy(p);
            total++;
        }
        closedir(dir);
    }
    ck_assert_int_ge(total, 34);
}
END_TEST

START_TEST(test_accessors)
{
    struct mscx_plan *p = load_ref("mscclpp-algo-plans/allreduce_pkt_n4.json");
    uint64_t lo, hi;
    ck_assert_str_eq(mscx_plan_name(p), "allreduce_pkt_n4");
    ck_assert_int_eq(mscx_plan_collective(p), MSCX_COLL_ALLREDUCE);
    ck_assert_uint_eq(mscx_plan_nranks(p), 4);
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 4);
    ck_assert_int_eq(mscx_plan_inplace(p), 1);
    mscx_plan_size_range(p, &lo, &hi);
    ck_assert_uint_eq(lo, 0);
    ck_assert_uint_eq(hi, UINT64_MAX); /* written as 18446744073709551615 */
    ck_assert_int_eq(p->protocol, MSCX_PROTO_LL);
    ck_assert(p->double_scratch);
    ck_assert(p->has_packet_ops);
    ck_assert(!p->has_port);
    ck_assert(!p->has_multicast);
    ck_assert_uint_eq(p->nthreads, 1024);
    ck_assert_uint_eq(p->alignment, 16);
    ck_assert_uint_eq(p->gpus[2].input_chunks, 16);
    ck_assert_uint_eq(p->gpus[2].scratch_chunks, 24);
    ck_assert_uint_eq(p->gpus[0].ntb, 4);
    /* A reduction plan without the extension: reducible types, every operator. */
    ck_assert(mscx_plan_supports(p, MSCX_DT_FP32, MSCX_REDOP_SUM));
    ck_assert(mscx_plan_supports(p, MSCX_DT_BF16, MSCX_REDOP_MAX));
    ck_assert(!mscx_plan_supports(p, MSCX_DT_INT8, MSCX_REDOP_SUM));
    ck_assert(!mscx_plan_supports(p, MSCX_DT_FP64, MSCX_REDOP_SUM));
    /* respkt of rank 0 block 0: src [i0, s0, s4, s8], dst [i0, remote x3] */
    const struct mscx_dev_op *op = &p->gpus[0].ops[p->gpus[0].tb[0].op_begin + 1];
    ck_assert_int_eq(op->opcode, MSCX_OP_REDUCE_SEND_PACKETS);
    ck_assert_uint_eq(op->nsrc, 4);
    ck_assert_uint_eq(op->ndst, 4);
    ck_assert_uint_eq(op->src[2].index, 4);
    ck_assert_uint_eq(op->src[2].type, MSCX_BUF_SCRATCH);
    ck_assert_uint_eq(op->dst[1].flags, MSCX_OPND_REMOTE);
    ck_assert_uint_eq(op->dst[1].type, MSCX_BUF_SCRATCH);
    ck_assert_uint_eq(op->reduce_op, MSCX_REDOP_SUM);
    mscx_plan_destroy(p);

    p = load_ref("mscclpp-op-plans/copy_test.json");
    ck_assert_int_eq(mscx_plan_collective(p), MSCX_COLL_TEST);
    ck_assert(mscx_plan_supports(p, MSCX_DT_INT8, MSCX_REDOP_SUM)); /* data movement: any type */
    ck_assert(mscx_plan_supports(p, MSCX_DT_FP64, MSCX_REDOP_PROD));
    mscx_plan_destroy(p);
}
END_TEST

START_TEST(test_pipeline_flattened)
{
    struct mscx_plan *p = load_ref("mscclpp-op-plans/pipeline_test.json");
    const struct mscx_gpu *g = &p->gpus[0];
    ck_assert_uint_eq(g->tb[0].nops, 2);
    ck_assert_int_eq(g->ops[0].opcode, MSCX_OP_PIPELINE);
    ck_assert_uint_eq(g->ops[0].pipe_nops, 1);
    ck_assert_uint_eq(g->ops[0].pipe_unit, 1048576);
    ck_assert_uint_eq(g->ops[0].pipe_nchunks, 1);
    ck_assert_int_eq(g->ops[1].opcode, MSCX_OP_COPY);
    ck_assert(g->ops[1].flags & MSCX_OPF_IN_PIPELINE);
    ck_assert(!(g->ops[0].flags & MSCX_OPF_IN_PIPELINE));
    mscx_plan_destroy(p);
}
END_TEST

/*
 * Rank 0: memory channels to [1, 2, 1]; its block's table is [2, 0, 1] and its remote-buffer table [1, 0].
 * Its last op tells rank 2 that the put into rank 2's output has landed.
 */
static const char tiny_plan[] =
    "{\"name\": \"tiny\", \"collective\": \"test\", \"protocol\": \"Simple\", \"inplace\": false,\n"
    " \"gpus\": [\n"
    "  {\"id\": 0, \"input_chunks\": 2, \"output_chunks\": 2, \"scratch_chunks\": 4,\n"
    "   \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [1, 2, 1]}],\n"
    "   \"remote_buffers\": [{\"rank\": 2, \"type\": \"o\", \"access_channel_types\": [\"memory\"]},\n"
    "                        {\"rank\": 1, \"type\": \"s\", \"access_channel_types\": [\"memory\"]}],\n"
    "   \"semaphores\": [],\n"
    "   \"threadblocks\": [{\"id\": 0,\n"
    "     \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [2, 0, 1]}],\n"
    "     \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [1, 0]}],\n"
    "     \"ops\": [\n"
    "      {\"name\": \"put\", \"src_buff\": [{\"type\": \"i\", \"index\": 1, \"size\": 1}],\n"
    "       \"dst_buff\": [{\"buffer_id\": 0, \"index\": 3, \"size\": 1}], \"channel_type\": \"memory\"},\n"
    "      {\"name\": \"signal\", \"channel_ids\": [0], \"channel_type\": \"memory\"},\n"
    "      {\"name\": \"signal\", \"channel_ids\": [1], \"channel_type\": \"memory\"},\n"
    "      {\"name\": \"put\", \"src_buff\": [{\"type\": \"o\", \"index\": 0, \"size\": 2}],\n"
    "       \"dst_buff\": [{\"buffer_id\": 1, \"index\": 0, \"size\": 2}], \"channel_type\": \"memory\",\n"
    "       \"tbg_info\": {\"tb_id\": 1, \"tbg_size\": 3}},\n"
    "      {\"name\": \"signal\", \"channel_ids\": [2], \"channel_type\": \"memory\"}]}]},\n"
    "  {\"id\": 1, \"input_chunks\": 2, \"output_chunks\": 2, \"scratch_chunks\": 4,\n"
    "   \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [0, 0]}],\n"
    "   \"threadblocks\": [{\"id\": 0, \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [0, "
    "1]}],\n"
    "     \"ops\": [{\"name\": \"wait\", \"channel_ids\": [0, 1], \"channel_type\": \"memory\"}]}]},\n"
    "  {\"id\": 2, \"input_chunks\": 2, \"output_chunks\": 2, \"scratch_chunks\": 0,\n"
    "   \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [0]}],\n"
    "   \"threadblocks\": [{\"id\": 0,\n"
    "     \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [0]}],\n"
    "     \"ops\": [{\"name\": \"wait\", \"channel_ids\": [0], \"channel_type\": \"memory\"}]}]}\n"
    " ]}\n";

START_TEST(test_table_resolution)
{
    struct mscx_plan *p = load_str(tiny_plan);
    const struct mscx_gpu *g = &p->gpus[0];
    ck_assert_uint_eq(g->nops, 5);
    /* put: buffer_id 0 of the block's memory table -> rank-level remote buffer 1 (rank 1 scratch) */
    ck_assert_int_eq(g->ops[0].opcode, MSCX_OP_PUT);
    ck_assert_uint_eq(g->ops[0].dst[0].flags, MSCX_OPND_REMOTE);
    ck_assert_uint_eq(g->ops[0].dst[0].rbuf, 1);
    ck_assert_uint_eq(g->ops[0].dst[0].type, MSCX_BUF_SCRATCH);
    ck_assert_uint_eq(g->ops[0].dst[0].index, 3);
    ck_assert_uint_eq(g->ops[0].src[0].flags, 0);
    ck_assert_uint_eq(g->ops[0].src[0].type, MSCX_BUF_INPUT);
    ck_assert_uint_eq(g->ops[0].tbg_size, 1);
    /* signal local 0 -> rank channel 2, local 1 -> rank channel 0 */
    ck_assert_uint_eq(g->ops[1].nchan, 1);
    ck_assert_uint_eq(g->ops[1].chan[0], 2);
    ck_assert_uint_eq(g->ops[2].chan[0], 0);
    ck_assert_uint_eq(g->ops[3].dst[0].rbuf, 0);
    ck_assert_uint_eq(g->ops[3].dst[0].type, MSCX_BUF_OUTPUT);
    ck_assert_uint_eq(g->ops[3].tbg_id, 1);
    ck_assert_uint_eq(g->ops[3].tbg_size, 3);
    ck_assert(g->ops[3].flags & MSCX_OPF_TBG);
    ck_assert_uint_eq(g->ops[4].chan[0], 1); /* local 2 -> rank channel 1, to rank 2 */
    /* pairing: rank 0's k-th channel to rank 1 pairs with rank 1's k-th channel to rank 0 */
    const struct mscx_chan *c = g->chan[MSCX_CHAN_MEMORY];
    ck_assert(c[0].paired && c[0].peer == 1 && c[0].pair == 0 && c[0].occurrence == 0);
    ck_assert(c[1].paired && c[1].peer == 2 && c[1].pair == 0 && c[1].occurrence == 0);
    ck_assert(c[2].paired && c[2].peer == 1 && c[2].pair == 1 && c[2].occurrence == 1);
    ck_assert_uint_eq(p->gpus[1].chan[MSCX_CHAN_MEMORY][1].pair, 2);
    ck_assert_uint_eq(p->gpus[2].chan[MSCX_CHAN_MEMORY][0].pair, 1);
    /* no port channels: one node */
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 3);
    ck_assert(!p->ranks_per_node_given);
    mscx_plan_destroy(p);
}
END_TEST

/*
 * Two ranks: rank 0 has blocks b0 and b1, rank 1 blocks p0 and p1 (ops as JSON, "" for none), two memory
 * channels each way, rank 0's remote buffer 0 is rank 1's output and rank 0 has one semaphore with initial
 * value @p sem.
 */
static mscx_status_t load_order_plan(const char *b0, const char *b1, const char *p0, const char *p1, int sem,
                                     char *err)
{
    static char json[8192];
    static const char blk[] = "{\"id\": %d, \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": "
                              "[0, 1]}], %s \"ops\": [%s]}";
    static const char refs[] =
        "\"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [0]}],";
    char t0[1024], t1[1024], u0[1024], u1[1024];
    snprintf(t0, sizeof(t0), blk, 0, refs, b0);
    snprintf(t1, sizeof(t1), blk, 1, refs, b1);
    snprintf(u0, sizeof(u0), blk, 0, "", p0);
    snprintf(u1, sizeof(u1), blk, 1, "", p1);
    snprintf(json, sizeof(json),
             "{\"name\": \"order\", \"collective\": \"test\", \"protocol\": \"Simple\", \"inplace\": false, "
             "\"gpus\": ["
             "{\"id\": 0, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 0,"
             " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [1, 1]}],"
             " \"remote_buffers\": [{\"rank\": 1, \"type\": \"o\", \"access_channel_types\": [\"memory\"]}],"
             " \"semaphores\": [{\"init_value\": %d}], \"threadblocks\": [%s, %s]},"
             "{\"id\": 1, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 0,"
             " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [0, 0]}], \"threadblocks\": "
             "[%s, %s]}]}",
             sem, t0, t1, u0, u1);
    struct mscx_plan *p = NULL;
    mscx_status_t st = mscx_plan_load_buffer(json, strlen(json), "order.json", &p, err, MSCX_PLAN_ERR_LEN);
    ck_assert_msg((st == MSCX_OK) == (p != NULL), "%s", err);
    mscx_plan_destroy(p);
    return st;
}

#define PUT_O                                                                                                \
    "{\"name\": \"put\", \"channel_type\": \"memory\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, "      \
    "\"size\": 1}], \"dst_buff\": [{\"buffer_id\": 0, \"index\": 0, \"size\": 1}]}"
#define GET_O                                                                                                \
    "{\"name\": \"get\", \"channel_type\": \"memory\", \"src_buff\": [{\"buffer_id\": 0, \"index\": 0, "     \
    "\"size\": 1}], \"dst_buff\": [{\"type\": \"o\", \"index\": 0, \"size\": 1}]}"
#define SIG0 "{\"name\": \"signal\", \"channel_type\": \"memory\", \"channel_ids\": [0]}"
#define WAIT0 "{\"name\": \"wait\", \"channel_type\": \"memory\", \"channel_ids\": [0]}"
#define SIG1 "{\"name\": \"signal\", \"channel_type\": \"memory\", \"channel_ids\": [1]}"
#define WAIT1 "{\"name\": \"wait\", \"channel_type\": \"memory\", \"channel_ids\": [1]}"
#define BAR "{\"name\": \"barrier\", \"barrier_id\": 2, \"num_threadblocks\": 2}"
#define REL "{\"name\": \"sem_release\", \"semaphore_ids\": [0]}"
#define ACQ "{\"name\": \"sem_acquire\", \"semaphore_ids\": [0]}"

/*
 * A rank's reads and writes of a peer's user buffer must happen before some op of the peer (so before the end
 * of its launch), through program order, signal-wait pairs, barriers and semaphores; otherwise the plan is
 * refused, naming the access.
 */
START_TEST(test_peer_access_order)
{
    static const struct {
        const char *b0, *b1, *p0, *p1;
        int sem;
        const char *refused_at; /* NULL: accepted */
    } cases[] = {
        {PUT_O "," SIG0, "", WAIT0, "", 0, NULL},
        {PUT_O, "", "", "", 0, "gpus[0].threadblocks[0].ops[0].dst_buff[0]"},
        {PUT_O "," SIG1, "", WAIT1, "", 0, NULL},
        {SIG0 "," PUT_O, "", WAIT0, "", 0, "gpus[0].threadblocks[0].ops[1].dst_buff[0]"},
        {GET_O, "", "", "", 0, "gpus[0].threadblocks[0].ops[0].src_buff[0]"},
        /* a group slice in a block without the signal: ordered only through a barrier */
        {PUT_O "," SIG0, PUT_O, WAIT0, "", 0, "gpus[0].threadblocks[1].ops[0].dst_buff[0]"},
        {BAR "," PUT_O "," SIG0, PUT_O "," BAR, WAIT0, "", 0, NULL},
        {PUT_O "," SIG0 "," BAR, BAR "," PUT_O, WAIT0, "", 0, "gpus[0].threadblocks[1].ops[1].dst_buff[0]"},
        /* semaphores: the acquire needs the release only when it outnumbers the initial value */
        {ACQ "," SIG0, PUT_O "," REL, WAIT0, "", 0, NULL},
        {ACQ "," SIG0, PUT_O "," REL, WAIT0, "", 1, "gpus[0].threadblocks[1].ops[0].dst_buff[0]"},
        /* signals of two blocks, waits in one: the last wait needs both */
        {PUT_O "," SIG0, SIG0, WAIT0 "," WAIT0, "", 0, NULL},
        /* signals in one block, waits in two: each wait needs the first signal, not the second */
        {PUT_O "," SIG0 "," SIG0, "", WAIT0, WAIT0, 0, NULL},
        {SIG0 "," PUT_O "," SIG0, "", WAIT0, WAIT0, 0, "gpus[0].threadblocks[0].ops[1].dst_buff[0]"},
        /* both spread: no wait is known to need a given signal */
        {PUT_O "," SIG0, SIG0, WAIT0, WAIT0, 0, "gpus[0].threadblocks[0].ops[0].dst_buff[0]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[MSCX_PLAN_ERR_LEN] = "";
        mscx_status_t st =
            load_order_plan(cases[i].b0, cases[i].b1, cases[i].p0, cases[i].p1, cases[i].sem, err);
        if (cases[i].refused_at == NULL) {
            ck_assert_msg(st == MSCX_OK, "case %zu: %s", i, err);
            continue;
        }
        ck_assert_msg(st == MSCX_ERR_PLAN, "case %zu: accepted", i);
        ck_assert_msg(strstr(err, cases[i].refused_at) && strstr(err, "order.json:") &&
                          strstr(err, "to be ordered before the end of rank 1's launch") &&
                          strstr(err, "plan order is order-dependent"),
                      "case %zu: %s", i, err);
        ck_assert_msg(strstr(err, strstr(cases[i].refused_at, "src_buff")
                                      ? "the read of rank 1's output chunk 0 by get"
                                      : "the write of rank 1's output chunk 0 by put"),
                      "case %zu: %s", i, err);
    }
}
END_TEST

/* The regression plan: slices 1 to 3 of a thread-block group write a peer's output unordered. */
START_TEST(test_tbg_peer_write_refused)
{
    struct mscx_plan *p = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    const char *path = mscx_test_src("tests/data/regressions/tbg_reduce_send_test.json");
    ck_assert_int_eq(mscx_plan_load(path, &p, err, sizeof(err)), MSCX_ERR_PLAN);
    ck_assert_ptr_null(p);
    ck_assert_msg(
        strstr(err,
               "gpus[0].threadblocks[1].ops[0].dst_buff[1]: expected the write of rank 1's output "
               "chunk 1 by res (rank 0 thread block 1) to be ordered before the end of rank 1's launch") &&
            strstr(err, "plan reduce_send_test is order-dependent"),
        "%s", err);
    /* the same group, its slices joined by barriers before block 0 signals: accepted */
    path = mscx_test_src("tests/data/regressions/tbg_reduce_send_ordered_test.json");
    ck_assert_msg(mscx_plan_load(path, &p, err, sizeof(err)) == MSCX_OK, "%s", err);
    mscx_plan_destroy(p);
}
END_TEST

/* n ranks, no ops; memory channels between r and r^1 (when mem_pairs), port channels from r to port_peer[r].
 */
static char *make_channel_plan(uint32_t n, const int *mem_peer, const int *port_peer, const char *ext)
{
    char *buf = malloc(65536);
    size_t k = 0;
    k += (size_t)snprintf(buf + k, 65536 - k,
                          "{\"name\": \"chan\", \"collective\": \"allreduce\", %s \"gpus\": [",
                          ext ? ext : "");
    for (uint32_t r = 0; r < n; r++) {
        k += (size_t)snprintf(
            buf + k, 65536 - k,
            "%s{\"id\": %u, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 0, "
            "\"threadblocks\": [], \"channels\": [",
            r ? "," : "", r);
        if (mem_peer[r] >= 0)
            k += (size_t)snprintf(buf + k, 65536 - k,
                                  "{\"channel_type\": \"memory\", \"connected_to\": [%d]}", mem_peer[r]);
        if (port_peer && port_peer[r] >= 0)
            k +=
                (size_t)snprintf(buf + k, 65536 - k, "%s{\"channel_type\": \"port\", \"connected_to\": [%d]}",
                                 mem_peer[r] >= 0 ? "," : "", port_peer[r]);
        k += (size_t)snprintf(buf + k, 65536 - k, "]}");
    }
    snprintf(buf + k, 65536 - k, "]}");
    return buf;
}

START_TEST(test_ranks_per_node)
{
    static const int mem4[] = {1, 0, 3, 2}, port4[] = {2, 3, 0, 1};
    static const int mem3[] = {1, 0, -1}, port3[] = {2, 2, 0};
    char *j = make_channel_plan(4, mem4, port4, NULL);
    struct mscx_plan *p = load_str(j);
    ck_assert(p->has_port);
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 2);
    mscx_plan_destroy(p);
    free(j);

    j = make_channel_plan(4, mem4, NULL, NULL); /* memory only: one node, even if disconnected */
    p = load_str(j);
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 4);
    mscx_plan_destroy(p);
    free(j);

    j = make_channel_plan(3, mem3, port3, NULL); /* components of 2 and 1: unknown */
    p = load_str(j);
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 0);
    mscx_plan_destroy(p);
    free(j);

    j = make_channel_plan(
        4, mem4, port4,
        "\"mscx\": {\"version\": 1, \"ranks_per_node\": 4, \"dtypes\": [\"fp16\", \"bf16\"], "
        "\"reduce_ops\": [\"max\"], \"fusion\": {\"ops_before\": 10, \"ops_after\": 7}},");
    p = load_str(j);
    ck_assert_uint_eq(mscx_plan_ranks_per_node(p), 4);
    ck_assert(p->ranks_per_node_given);
    ck_assert(mscx_plan_supports(p, MSCX_DT_FP16, MSCX_REDOP_MAX));
    ck_assert(mscx_plan_supports(p, MSCX_DT_FP16, MSCX_REDOP_SUM)); /* no reducing op: op ignored */
    ck_assert(!mscx_plan_supports(p, MSCX_DT_FP32, MSCX_REDOP_MAX));
    ck_assert_uint_eq(p->fuse.ops_before, 10);
    ck_assert_uint_eq(p->fuse.ops_after, 7);
    mscx_plan_destroy(p);
    free(j);
}
END_TEST

/* Replace the first @p from in @p s (malloc'd result). */
static char *str_subst(const char *s, const char *from, const char *to)
{
    const char *at = strstr(s, from);
    ck_assert_ptr_nonnull(at);
    size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *out = malloc(n);
    ck_assert_ptr_nonnull(out);
    snprintf(out, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return out;
}

/* The extension's broadcast root: parsed, written back, absent means 0 and stays absent. */
START_TEST(test_broadcast_root)
{
    size_t len;
    char *json = mscx_test_read_file(mscx_test_src("tests/data/broadcast/broadcast_n4_root2.json"), &len);
    ck_assert_ptr_nonnull(json);
    struct mscx_plan *p = load_str(json);
    ck_assert_int_eq(mscx_plan_collective(p), MSCX_COLL_BROADCAST);
    ck_assert_uint_eq(mscx_plan_root(p), 2);
    ck_assert(p->root_given);
    char *out = NULL;
    ck_assert_int_eq(mscx_plan_to_json(p, &out), MSCX_OK);
    ck_assert_ptr_nonnull(strstr(out, "\"root\": 2"));
    struct mscx_plan *q = load_str(out);
    ck_assert_uint_eq(mscx_plan_root(q), 2);
    mscx_plan_destroy(q);
    free(out);
    mscx_plan_destroy(p);

    /* every rank may be the root */
    char *r3 = str_subst(json, "\"root\": 2", "\"root\": 3");
    p = load_str(r3);
    ck_assert_uint_eq(mscx_plan_root(p), 3);
    mscx_plan_destroy(p);
    free(r3);

    /* without it: root 0, and the writer adds none */
    char *none = str_subst(json, "\"root\": 2,", "");
    p = load_str(none);
    ck_assert_uint_eq(mscx_plan_root(p), 0);
    ck_assert(!p->root_given);
    ck_assert_int_eq(mscx_plan_to_json(p, &out), MSCX_OK);
    ck_assert_ptr_null(strstr(out, "\"root\""));
    free(out);
    mscx_plan_destroy(p);
    free(none);

    /* a root past the ranks is refused, naming the field and its place */
    char err[MSCX_PLAN_ERR_LEN];
    char *r4 = str_subst(json, "\"root\": 2", "\"root\": 4");
    p = NULL;
    ck_assert_int_eq(mscx_plan_load_buffer(r4, strlen(r4), "r4.json", &p, err, sizeof(err)), MSCX_ERR_PLAN);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(err, "r4.json:"), "%s", err);
    ck_assert_msg(strstr(err, "mscx.root: expected a rank below the 4 ranks, got 4"), "%s", err);
    free(r4);
    free(json);

    /* other collectives have root 0 */
    p = load_ref("mscclpp-algo-plans/allreduce_pkt_n2.json");
    ck_assert_uint_eq(mscx_plan_root(p), 0);
    mscx_plan_destroy(p);
}
END_TEST

/* mscx.beats_nccl_window: false when absent, written back only when true; a non-boolean is refused. */
START_TEST(test_beats_nccl_window)
{
    size_t len;
    char *json = mscx_test_read_file(mscx_test_src("plans/allreduce_n1_rpn1_copy_1K_4M.json"), &len);
    ck_assert_ptr_nonnull(json);
    struct mscx_plan *p = load_str(json);
    ck_assert_int_eq(mscx_plan_beats_nccl_window(p), 0);
    char *out = NULL;
    ck_assert_int_eq(mscx_plan_to_json(p, &out), MSCX_OK);
    ck_assert_ptr_null(strstr(out, "beats_nccl_window"));
    free(out);
    mscx_plan_destroy(p);

    char *yes = str_subst(json, "\"mscx\": {", "\"mscx\": {\"beats_nccl_window\": true,");
    p = load_str(yes);
    ck_assert_int_eq(mscx_plan_beats_nccl_window(p), 1);
    ck_assert_int_eq(mscx_plan_to_json(p, &out), MSCX_OK);
    ck_assert_ptr_nonnull(strstr(out, "\"beats_nccl_window\": true"));
    struct mscx_plan *q = load_str(out);
    ck_assert_int_eq(mscx_plan_beats_nccl_window(q), 1);
    mscx_plan_destroy(q);
    free(out);
    struct mscx_plan *copy = NULL;
    ck_assert_int_eq(mscx_plan_clone(p, &copy), MSCX_OK);
    ck_assert_int_eq(mscx_plan_beats_nccl_window(copy), 1);
    mscx_plan_destroy(copy);
    mscx_plan_destroy(p);
    free(yes);

    char *no = str_subst(json, "\"mscx\": {", "\"mscx\": {\"beats_nccl_window\": false,");
    p = load_str(no);
    ck_assert_int_eq(mscx_plan_beats_nccl_window(p), 0);
    mscx_plan_destroy(p);
    free(no);

    /* not a boolean: refused, naming the file, the field and its place */
    static const char *const bad[] = {"1", "\"true\"", "null", "{}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char to[96], err[MSCX_PLAN_ERR_LEN];
        snprintf(to, sizeof(to), "\"mscx\": {\"beats_nccl_window\": %s,", bad[i]);
        char *b = str_subst(json, "\"mscx\": {", to);
        p = NULL;
        ck_assert_int_eq(mscx_plan_load_buffer(b, strlen(b), "w.json", &p, err, sizeof(err)), MSCX_ERR_PLAN);
        ck_assert_ptr_null(p);
        const char *at = strstr(err, "w.json:");
        unsigned line = 0, col = 0;
        ck_assert_msg(at && sscanf(at, "w.json:%u:%u:", &line, &col) == 2 && line > 1 && col > 1, "%s", err);
        ck_assert_msg(strstr(err, "mscx.beats_nccl_window: expected true or false"), "%s: %s", bad[i], err);
        free(b);
    }
    free(json);
}
END_TEST

static void geom_ok(const struct mscx_plan *p, uint64_t in, uint64_t out, enum mscx_dtype dt,
                    struct mscx_geom *g)
{
    char err[256];
    mscx_status_t st = mscx_plan_geom(p, 0, in, out, dt, g, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s", err);
}

START_TEST(test_geometry)
{
    struct mscx_plan *p = load_ref("mscclpp-algo-plans/allreduce_pkt_n2.json"); /* 4/4/4 chunks, LL, double */
    struct mscx_geom g;
    char err[256];

    geom_ok(p, 4, 4, MSCX_DT_FP32, &g); /* one element over 4 chunks */
    ck_assert_uint_eq(g.in_chunk, 4);
    ck_assert_uint_eq(g.out_chunk, 4);
    ck_assert_uint_eq(g.slot, 16);
    ck_assert_uint_eq(g.esize, 4);
    ck_assert_uint_eq(g.scratch_bytes, 4 * 16 * 2 * 2);
    ck_assert_uint_eq(g.scratch_half, 4 * 16 * 2);
    mscx_plan_destroy(p);

    p = load_ref("mscclpp-algo-plans/allreduce_pkt_n4.json"); /* 16/16/24 chunks */
    geom_ok(p, 6, 6, MSCX_DT_FP16, &g);                       /* 3 elements over 16 chunks */
    ck_assert_uint_eq(g.in_chunk, 2);
    ck_assert_uint_eq(g.slot, 16);
    ck_assert_uint_eq(g.scratch_bytes, 24 * 16 * 4);
    geom_ok(p, 1000003, 1000003, MSCX_DT_INT8, &g);
    ck_assert_uint_eq(g.in_chunk, 62501);
    ck_assert_uint_eq(g.slot, 62512);
    ck_assert_uint_eq(g.scratch_bytes, 24ull * 62512 * 4);
    geom_ok(p, 0, 0, MSCX_DT_FP32, &g);
    ck_assert_uint_eq(g.in_chunk, 0);
    ck_assert_uint_ge(g.slot, 16);
    /* refusals */
    ck_assert_int_eq(mscx_plan_geom(p, 0, 6, 6, MSCX_DT_FP32, &g, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "whole") != NULL, "%s", err);
    ck_assert_int_eq(mscx_plan_geom(p, 0, 64, 128, MSCX_DT_FP32, &g, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "disagree") != NULL, "%s", err);
    ck_assert_int_eq(mscx_plan_geom(p, 0, 1ull << 41, 1ull << 41, MSCX_DT_FP32, &g, err, sizeof(err)),
                     MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_plan_geom(p, 4, 64, 64, MSCX_DT_FP32, &g, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_plan_geom(p, 0, 64, 64, MSCX_DT_COUNT, &g, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    mscx_plan_destroy(p);
}
END_TEST

START_TEST(test_geometry_allgather)
{
    /* allgather, 4 ranks: input 1 chunk, output 4 chunks */
    static const char tmpl[] =
        "{\"id\": %u, \"input_chunks\": 1, \"output_chunks\": 4, \"scratch_chunks\": 2}";
    char j[2048], one[256];
    size_t k =
        (size_t)snprintf(j, sizeof(j), "{\"name\": \"ag\", \"collective\": \"allgather\", \"gpus\": [");
    for (uint32_t r = 0; r < 4; r++) {
        snprintf(one, sizeof(one), tmpl, r);
        k += (size_t)snprintf(j + k, sizeof(j) - k, "%s%s", r ? "," : "", one);
    }
    snprintf(j + k, sizeof(j) - k, "]}");
    struct mscx_plan *p = load_str(j);
    uint64_t in, out;
    struct mscx_geom g;
    char err[256];
    mscx_coll_sizes(MSCX_COLL_ALLGATHER, 4, 24, &in, &out);
    ck_assert_uint_eq(in, 6);
    ck_assert_uint_eq(out, 24);
    geom_ok(p, in, out, MSCX_DT_FP16, &g);
    ck_assert_uint_eq(g.in_chunk, 6);
    ck_assert_uint_eq(g.out_chunk, 6);
    ck_assert_uint_eq(g.slot, 16);
    ck_assert_uint_eq(g.scratch_bytes, 2 * 16); /* no packets, single buffer */
    ck_assert_uint_eq(g.scratch_half, 0);
    /* output that is not nranks inputs: chunks disagree */
    ck_assert_int_eq(mscx_plan_geom(p, 1, 6, 32, MSCX_DT_FP16, &g, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    mscx_coll_sizes(MSCX_COLL_REDUCESCATTER, 4, 64, &in, &out);
    ck_assert_uint_eq(in, 64);
    ck_assert_uint_eq(out, 16);
    mscx_coll_sizes(MSCX_COLL_ALLREDUCE, 4, 64, &in, &out);
    ck_assert_uint_eq(in, 64);
    ck_assert_uint_eq(out, 64);
    mscx_plan_destroy(p);
}
END_TEST

/* An allgather or reducescatter buffer of rank sections split into several chunks per section: only
 * element counts that every chunk divides evenly keep the chunks on their sections. */
START_TEST(test_geometry_sections)
{
    static const char *const colls[2] = {"allgather", "reducescatter"};
    for (int c = 0; c < 2; c++) {
        char j[1024];
        int ag = c == 0;
        /* 2 ranks, 2 chunks per rank section */
        snprintf(j, sizeof(j),
                 "{\"name\": \"sect\", \"collective\": \"%s\", \"gpus\": ["
                 "{\"id\": 0, \"input_chunks\": %d, \"output_chunks\": %d, \"scratch_chunks\": 0},"
                 "{\"id\": 1, \"input_chunks\": %d, \"output_chunks\": %d, \"scratch_chunks\": 0}]}",
                 colls[c], ag ? 2 : 4, ag ? 4 : 2, ag ? 2 : 4, ag ? 4 : 2);
        struct mscx_plan *p = load_str(j);
        struct mscx_geom g;
        char err[512];
        uint64_t in, out;
        ck_assert_uint_eq(mscx_plan_elem_multiple(p), 4);
        /* 3 fp32 per rank: chunks of 2 elements would put rank 1's first element in rank 0's section */
        mscx_coll_sizes(ag ? MSCX_COLL_ALLGATHER : MSCX_COLL_REDUCESCATTER, 2, 24, &in, &out);
        ck_assert_int_eq(mscx_plan_geom(p, 1, in, out, MSCX_DT_FP32, &g, err, sizeof(err)),
                         MSCX_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err, "does not split into its 4 chunks evenly") != NULL, "%s", err);
        /* the same 24 bytes as 12 fp16: 3 per chunk, on the sections */
        geom_ok(p, in, out, MSCX_DT_FP16, &g);
        ck_assert_uint_eq(g.in_chunk, 6);
        ck_assert_uint_eq(g.out_chunk, 6);
        mscx_plan_destroy(p);
    }
    /* one chunk per rank section (every shipped plan) and allreduce: no constraint */
    struct mscx_plan *p = load_ref("mscclpp-algo-plans/allreduce_pkt_n2.json");
    ck_assert_uint_eq(mscx_plan_elem_multiple(p), 1);
    mscx_plan_destroy(p);
}
END_TEST

static int historical_infos;
static void count_historical(enum mscx_log_level level, unsigned subsys, const char *file, int line,
                             const char *msg, void *ctx)
{
    (void)file;
    (void)line;
    (void)ctx;
    if (level == MSCX_LOG_INFO && (subsys & MSCX_SUB_PLAN) && strstr(msg, "historical"))
        historical_infos++;
}

START_TEST(test_historical_names)
{
    static const char j[] =
        "{\"name\": \"old\", \"collective\": \"allreduce\", \"gpus\": [{\"id\": 0, \"input_chunks\": 2, "
        "\"output_chunks\": 0, \"scratch_chunks\": 2, \"threadblocks\": [{\"id\": 0, \"ops\": ["
        "{\"name\": \"tpkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}], "
        "\"dst_buff\": [{\"type\": \"s\", \"index\": 1, \"size\": 1}]},"
        "{\"name\": \"rpkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}, "
        "{\"type\": \"s\", \"index\": 0, \"size\": 1}], \"dst_buff\": [{\"type\": \"i\", \"index\": 0, "
        "\"size\": 1}],"
        " \"channel_type\": \"sm\"},"
        "{\"name\": \"rpkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 1, \"size\": 1}, "
        "{\"type\": \"s\", \"index\": 1, \"size\": 1}], \"dst_buff\": [{\"type\": \"i\", \"index\": 1, "
        "\"size\": 1}]}"
        "]}]}]}";
    mscx_log_set_handler(count_historical, NULL);
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG", "INFO"), MSCX_OK);
    historical_infos = 0;
    struct mscx_plan *p = load_str(j);
    ck_assert_int_eq(historical_infos, 1);
    ck_assert_int_eq(p->gpus[0].ops[0].opcode, MSCX_OP_COPY_PACKETS);
    ck_assert_int_eq(p->gpus[0].ops[1].opcode, MSCX_OP_REDUCE_PACKETS);
    ck_assert_int_eq(p->gpus[0].ops[1].chan_type, MSCX_CHAN_MEMORY);
    ck_assert(p->has_packet_ops);
    mscx_plan_destroy(p);
    mscx_config_reset();
}
END_TEST

START_TEST(test_clone_and_revalidate)
{
    struct mscx_plan *p = load_ref("mscclpp-algo-plans/allreduce_pkt_n8.json"), *c = NULL;
    char path[256], msg[512];
    ck_assert_int_eq(mscx_plan_clone(p, &c), MSCX_OK);
    ck_assert_str_eq(c->name, p->name);
    ck_assert_uint_eq(c->nranks, p->nranks);
    for (uint32_t r = 0; r < p->nranks; r++) {
        ck_assert_uint_eq(c->gpus[r].nops, p->gpus[r].nops);
        ck_assert(memcmp(c->gpus[r].ops, p->gpus[r].ops, p->gpus[r].nops * sizeof(struct mscx_dev_op)) == 0);
        ck_assert_ptr_ne(c->gpus[r].ops, p->gpus[r].ops);
    }
    ck_assert_int_eq(mscx_plan_validate(c, path, sizeof(path), msg, sizeof(msg)), MSCX_OK);
    /* corrupt the clone: an index past the input */
    c->gpus[3].ops[c->gpus[3].tb[1].op_begin].src[0].index = 64;
    ck_assert_int_eq(mscx_plan_validate(c, path, sizeof(path), msg, sizeof(msg)), MSCX_ERR_PLAN);
    ck_assert_str_eq(path, "gpus[3].threadblocks[1].ops[0].src_buff[0].index");
    ck_assert_msg(strstr(msg, "expected a chunk index below 64") != NULL, "%s", msg);
    ck_assert_msg(strstr(msg, "got 64") != NULL, "%s", msg);
    mscx_plan_destroy(c);
    /* the original is untouched */
    ck_assert_int_eq(mscx_plan_validate(p, path, sizeof(path), msg, sizeof(msg)), MSCX_OK);
    mscx_plan_destroy(p);
}
END_TEST

START_TEST(test_describe)
{
    struct mscx_plan *p = load_ref("mscclpp-algo-plans/allreduce_pkt_n8.json");
    uint64_t sizes[] = {1024, 1 << 20};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mscx_plan_describe(p, f, sizes, 2);
    fclose(f);
    ck_assert_msg(strstr(buf, "allreduce_pkt_n8") && strstr(buf, "ranks:           8") &&
                      strstr(buf, "respkt") && strstr(buf, "scratch @ 1024 B") &&
                      strstr(buf, "ranks/node:      8") && strstr(buf, "memory 56"),
                  "%s", buf);
    free(buf);
    mscx_plan_destroy(p);
}
END_TEST

START_TEST(test_names)
{
    enum mscx_dtype dt;
    enum mscx_redop op;
    enum mscx_coll coll;
    for (int i = 0; i < MSCX_DT_COUNT; i++) {
        ck_assert_int_eq(mscx_dtype_parse(mscx_dtype_name((enum mscx_dtype)i), &dt), 0);
        ck_assert_int_eq(dt, i);
    }
    for (int i = 0; i < MSCX_REDOP_COUNT; i++) {
        ck_assert_int_eq(mscx_redop_parse(mscx_redop_name((enum mscx_redop)i), &op), 0);
        ck_assert_int_eq(op, i);
    }
    for (int i = 0; i < MSCX_COLL_COUNT; i++) {
        ck_assert_int_eq(mscx_coll_parse(mscx_coll_name((enum mscx_coll)i), &coll), 0);
        ck_assert_int_eq(coll, i);
    }
    for (int i = 0; i < MSCX_OP_COUNT; i++)
        ck_assert_str_ne(mscx_opcode_name((enum mscx_opcode)i), "unknown");
    ck_assert_str_eq(mscx_opcode_name(MSCX_OP_REDUCE_COPY_SEND_PACKETS), "recspkt");
    ck_assert_int_eq(mscx_dtype_parse("fp8", &dt), -1);
    ck_assert_int_eq(mscx_redop_parse("avg", &op), -1);
    ck_assert_uint_eq(mscx_dtype_size(MSCX_DT_BF16), 2);
    ck_assert_uint_eq(mscx_dtype_size(MSCX_DT_FP64), 8);
    ck_assert_uint_eq(mscx_dtype_size(MSCX_DT_INT8), 1);
}
END_TEST

START_TEST(test_unreadable_file)
{
    struct mscx_plan *p = (struct mscx_plan *)0x1;
    char err[512];
    ck_assert_int_eq(mscx_plan_load("/nonexistent/dir/p.json", &p, err, sizeof(err)), MSCX_ERR_SYSTEM);
    ck_assert_ptr_eq(p, (struct mscx_plan *)0x1);
    ck_assert_str_eq(err, "cannot read /nonexistent/dir/p.json: No such file or directory");
    ck_assert_int_eq(mscx_plan_load("/nonexistent/dir/p.json", &p, NULL, 0), MSCX_ERR_SYSTEM);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = mscx_tcase("load");
    tcase_add_test(tc, test_all_fixtures_load);
    tcase_add_test(tc, test_accessors);
    tcase_add_test(tc, test_pipeline_flattened);
    tcase_add_test(tc, test_table_resolution);
    tcase_add_test(tc, test_peer_access_order);
    tcase_add_test(tc, test_tbg_peer_write_refused);
    tcase_add_test(tc, test_ranks_per_node);
    tcase_add_test(tc, test_broadcast_root);
    tcase_add_test(tc, test_beats_nccl_window);
    tcase_add_test(tc, test_historical_names);
    tcase_add_test(tc, test_clone_and_revalidate);
    tcase_add_test(tc, test_describe);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_unreadable_file);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("geometry");
    tcase_add_test(tc, test_geometry);
    tcase_add_test(tc, test_geometry_allgather);
    tcase_add_test(tc, test_geometry_sections);
    suite_add_tcase(s, tc);
    return s;
}
