/* SPDX-License-Identifier: MIT */
/* The MSCCL++ fixtures load and pass the checked simulation in both packet formats. */
#include <stdio.h>
#include <string.h>

#include "mscx/env.h"
#include "mscx/plan.h"
#include "mscx/sim.h"
#include "plan_model.h"
#include "test_common.h"

static const char *const op_plans[] = {
    "barrier_test",
    "copy_packet_test",
    "copy_test",
    "flush_fuse_test",
    "flush_test",
    "get_fuse_test",
    "get_test",
    "pipeline_test",
    "put_fuse_test",
    "put_packet_test",
    "put_test",
    "put_with_signal_and_flush_test",
    "put_with_signal_test",
    "read_put_packet_test",
    "read_reduce_send_test",
    "read_reduce_test",
    "reduce_copy_packet_test",
    "reduce_copy_send_packet_test",
    "reduce_fuse_test",
    "reduce_packets_test",
    "reduce_send_packet_test",
    "reduce_send_test",
    "reduce_test",
    "relaxed_signal_wait_fuse_test",
    "relaxed_signal_wait_test",
    "semaphore",
    "signal_wait_fuse_test",
    "signal_wait_test",
    "unpack_packet_test",
};
#define N_OP_PLANS (sizeof(op_plans) / sizeof(op_plans[0]))

static struct mscx_plan *load_ref(const char *dir, const char *name)
{
    char rel[256], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    snprintf(rel, sizeof(rel), "%s/%s.json", dir, name);
    mscx_status_t st = mscx_plan_load(mscx_test_ref(rel), &plan, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s: %s", rel, err);
    return plan;
}

static void check_case(const struct mscx_plan *plan, const char *name, uint64_t bytes, enum mscx_dtype dt,
                       enum mscx_redop op, enum mscx_pkt_format pkt, uint32_t iters)
{
    struct mscx_sim_case c = {bytes, dt, op, pkt, iters, 3, 0};
    struct mscx_sim_result res;
    mscx_status_t st = mscx_sim_check(plan, &c, &res);
    ck_assert_msg(st == MSCX_OK, "%s %llu B %s %s %s: status %s: %s", name, (unsigned long long)bytes,
                  mscx_dtype_name(dt), mscx_redop_name(op), pkt ? "ll8" : "ll16", mscx_status_str(st),
                  res.msg);
    ck_assert_msg(res.pass, "%s %llu B %s %s %s: %llu mismatches: %s", name, (unsigned long long)bytes,
                  mscx_dtype_name(dt), mscx_redop_name(op), pkt ? "ll8" : "ll16",
                  (unsigned long long)res.mismatches, res.msg);
}

/*
 * Known fixture problems (reported, not hidden):
 * - put_fuse_test: each rank reads its input chunk 0 while the peer's fused
 *   put writes it, so the result depends on the schedule; it must finish.
 * - signal_wait_fuse_test, relaxed_signal_wait_fuse_test: both ranks signal
 *   channels 0,1 and wait on channels 2,3; with k-th-to-k-th channel pairing
 *   (docs/design.md, as connections are made in declaration order) nothing
 *   ever signals 2,3, so the plans could never finish. The validator refuses
 *   them at load, naming the channel; that is what is checked here.
 */
static int fixture_kind(const char *name)
{
    if (strcmp(name, "put_fuse_test") == 0)
        return 1;
    if (strcmp(name, "signal_wait_fuse_test") == 0 || strcmp(name, "relaxed_signal_wait_fuse_test") == 0)
        return 2;
    return 0;
}

/* Every single-op demonstration: finishes, and two schedules agree bit for bit. */
START_TEST(test_op_plans)
{
    static const uint64_t sizes[] = {1024, 1000};
    int kind = fixture_kind(op_plans[_i]);
    if (kind == 2) {
        char rel[256], err[MSCX_PLAN_ERR_LEN];
        struct mscx_plan *plan = NULL;
        snprintf(rel, sizeof(rel), "mscclpp-op-plans/%s.json", op_plans[_i]);
        ck_assert_int_eq(mscx_plan_load(mscx_test_ref(rel), &plan, err, sizeof(err)), MSCX_ERR_PLAN);
        ck_assert_ptr_null(plan);
        ck_assert_msg(
            strstr(err, "expected as many waits on rank 1 memory channel 0 as signals on its pair") &&
                strstr(err, "gpus[0].threadblocks[0].ops[1].channel_ids"),
            "%s", err);
        return;
    }
    struct mscx_plan *plan = load_ref("mscclpp-op-plans", op_plans[_i]);
    for (int f = 0; f < 2; f++) {
        for (int s = 0; s < 2; s++) {
            if (kind == 0) {
                check_case(plan, op_plans[_i], sizes[s], MSCX_DT_FP32, MSCX_REDOP_SUM,
                           (enum mscx_pkt_format)f, 2);
                continue;
            }
            struct mscx_sim_case c = {sizes[s], MSCX_DT_FP32, MSCX_REDOP_SUM, (enum mscx_pkt_format)f, 2, 3,
                                      0};
            struct mscx_sim_result res;
            ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
            ck_assert_msg(res.pass || strstr(res.msg, "two schedules disagree"), "%s", res.msg);
        }
    }
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_switch_refused)
{
    static const char *const names[2] = {"switch_broadcast_test", "switch_reduce_test"};
    mscx_test_allow_warn("multicast");
    for (int k = 0; k < 2; k++) {
        struct mscx_plan *plan = load_ref("mscclpp-op-plans", names[k]);
        struct mscx_sim_case c = {1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 1, 1, 0};
        struct mscx_sim_result res;
        ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_ERR_UNSUPPORTED);
        ck_assert_int_eq(res.pass, 0);
        mscx_plan_destroy(plan);
    }
}
END_TEST

static const char *const ar_plans[3] = {"allreduce_pkt_n2", "allreduce_pkt_n4", "allreduce_pkt_n8"};

/* Allreduce at sizes that do and do not divide by the chunk count, 3 launches, both formats. */
START_TEST(test_allreduce_sizes)
{
    static const uint64_t sizes[] = {16, 1000, 4096 + 4, 1u << 20};
    struct mscx_plan *plan = load_ref("mscclpp-algo-plans", ar_plans[_i]);
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            check_case(plan, ar_plans[_i], sizes[s], MSCX_DT_FP32, MSCX_REDOP_SUM, (enum mscx_pkt_format)f,
                       3);
    mscx_plan_destroy(plan);
}
END_TEST

/* Every dtype with every operator. */
START_TEST(test_allreduce_dtypes)
{
    static const enum mscx_dtype dts[5] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16, MSCX_DT_INT32,
                                           MSCX_DT_UINT32};
    struct mscx_plan *plan = load_ref("mscclpp-algo-plans", ar_plans[_i]);
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < 5; d++)
            for (int op = 0; op < 4; op++)
                check_case(plan, ar_plans[_i], _i == 2 ? 1000 : 4100, dts[d], (enum mscx_redop)op,
                           (enum mscx_pkt_format)f, 3);
    mscx_plan_destroy(plan);
}
END_TEST

/* The check is not blind: a plan that unpacks into the wrong chunk fails with the first mismatch. */
/* A 2-rank allgather with 2 chunks per rank section (as the DSL writes for instances = 2): each rank
 * copies its input into its section and puts it into the peer's (after a signal/wait handshake, so that
 * a peer one launch ahead cannot write this launch's output). With 3 fp32 per rank, chunks of 2
 * elements over the whole output would straddle the sections (rank 1's first element landed in rank 0's
 * last chunk and its data went past the end): that size is refused now; sizes the chunks divide pass. */
static const char ag_sect_rank[] =
    "{\"id\": %d, \"input_chunks\": 2, \"output_chunks\": 4, \"scratch_chunks\": 0, \"threadblocks\": "
    "[{\"id\": 0, "
    "\"ops\": [{\"name\": \"signal\", \"channel_ids\": [0], \"channel_type\": \"memory\"}, {\"name\": "
    "\"wait\", "
    "\"channel_ids\": [0], \"channel_type\": \"memory\"}, {\"name\": \"copy\", \"src_buff\": [{\"type\": "
    "\"i\", \"index\": 0, \"size\": 2}], \"dst_buff\": "
    "[{\"type\": \"o\", \"index\": %d, \"size\": 2}]}, {\"name\": \"put\", \"src_buff\": [{\"type\": \"i\", "
    "\"index\": 0, \"size\": 2}], \"dst_buff\": [{\"buffer_id\": 0, \"index\": %d, \"size\": 2}], "
    "\"channel_type\": \"memory\"}, {\"name\": \"signal\", \"channel_ids\": [0], \"channel_type\": "
    "\"memory\"}, "
    "{\"name\": \"wait\", \"channel_ids\": [0], \"channel_type\": \"memory\"}], \"channels\": "
    "[{\"channel_type\": "
    "\"memory\", \"channel_ids\": [0]}], \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", "
    "\"remote_buffer_ids\": [0]}]}], \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [%d]}], "
    "\"remote_buffers\": [{\"rank\": %d, \"type\": \"o\", \"access_channel_types\": [\"memory\"]}], "
    "\"semaphores\": []}";

START_TEST(test_allgather_sections)
{
    char j[4096], r0[1792], r1[1792], err[MSCX_PLAN_ERR_LEN];
    snprintf(r0, sizeof(r0), ag_sect_rank, 0, 0, 0, 1, 1);
    snprintf(r1, sizeof(r1), ag_sect_rank, 1, 2, 2, 0, 0);
    snprintf(j, sizeof(j),
             "{\"name\": \"ag_sect\", \"collective\": \"allgather\", \"protocol\": \"Simple\", \"inplace\": "
             "false, "
             "\"gpus\": [%s, %s], \"num_threads_per_block\": 1024, \"use_double_scratch_buffer\": false, "
             "\"buffer_alignment\": 16, \"min_message_size\": 0, \"max_message_size\": 1048576}",
             r0, r1);
    struct mscx_plan *plan = NULL;
    ck_assert_msg(mscx_plan_load_buffer(j, strlen(j), "ag_sect.json", &plan, err, sizeof(err)) == MSCX_OK,
                  "%s", err);
    ck_assert_uint_eq(mscx_plan_elem_multiple(plan), 4);
    struct mscx_sim_case c = {24, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2, 3, 0}; /* 3 fp32 per rank */
    struct mscx_sim_result res;
    memset(&res, 0, sizeof(res));
    ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_ERR_INVALID_ARG);
    ck_assert_msg(strstr(res.msg, "does not split into its 4 chunks evenly") != NULL, "%s", res.msg);
    check_case(plan, "ag_sect", 24, MSCX_DT_FP16, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2); /* 6 fp16 per rank */
    check_case(plan, "ag_sect", 32, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2);
    check_case(plan, "ag_sect", 4096 + 64, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL8, 3);
    mscx_plan_destroy(plan);
}
END_TEST

/* A 2-rank allgather, 12 chunks per rank, whose put to the peer is one op of 12 pairs (the DSL's fusion
 * writes such lists without a bound: reducescatter_pkt with 8 GPUs per node has a ppkt of 14). Memory
 * form: 12 operands > 10, loaded as 10 + 2; port form (channel_ids): 12 > 8, loaded as 8 + 4. */
static void ag_wide_plan(char *j, size_t len, int port)
{
    size_t k = (size_t)snprintf(j, len,
                                "{\"name\": \"ag_wide\", \"collective\": \"allgather\", \"protocol\": "
                                "\"Simple\", \"inplace\": false, \"gpus\": [");
    const char *ct = port ? "port" : "memory";
    for (int r = 0; r < 2; r++) {
        k += (size_t)snprintf(
            j + k, len - k,
            "%s{\"id\": %d, \"input_chunks\": 12, \"output_chunks\": 24, \"scratch_chunks\": 0, "
            "\"threadblocks\": [{\"id\": 0, \"ops\": [{\"name\": \"signal\", \"channel_ids\": [0], "
            "\"channel_type\": \"%s\"}, {\"name\": \"wait\", \"channel_ids\": [0], "
            "\"channel_type\": \"%s\"}, {\"name\": \"copy\", \"src_buff\": [{\"type\": \"i\", "
            "\"index\": 0, \"size\": 12}], \"dst_buff\": [{\"type\": \"o\", \"index\": %d, \"size\": "
            "12}]}, {\"name\": \"put\", \"src_buff\": [",
            r ? ", " : "", r, ct, ct, 12 * r);
        for (int i = 0; i < 12; i++)
            k += (size_t)snprintf(j + k, len - k, "%s{\"type\": \"i\", \"index\": %d, \"size\": 1}",
                                  i ? ", " : "", i);
        k += (size_t)snprintf(j + k, len - k, "], \"dst_buff\": [");
        for (int i = 0; i < 12; i++)
            k += (size_t)snprintf(j + k, len - k, "%s{\"buffer_id\": 0, \"index\": %d, \"size\": 1}",
                                  i ? ", " : "", 12 * r + i);
        k += (size_t)snprintf(j + k, len - k, "]");
        if (port)
            k += (size_t)snprintf(j + k, len - k, ", \"channel_ids\": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]");
        k += (size_t)snprintf(
            j + k, len - k,
            ", \"channel_type\": \"%s\"}, {\"name\": \"signal\", \"channel_ids\": [0], "
            "\"channel_type\": \"%s\"}, {\"name\": \"wait\", \"channel_ids\": [0], \"channel_type\": "
            "\"%s\"}], \"channels\": [{\"channel_type\": \"%s\", \"channel_ids\": [0]}], "
            "\"remote_buffer_refs\": [{\"access_channel_type\": \"%s\", \"remote_buffer_ids\": [0]}]}], "
            "\"channels\": [{\"channel_type\": \"%s\", \"connected_to\": [%d]}], \"remote_buffers\": "
            "[{\"rank\": %d, \"type\": \"o\", \"access_channel_types\": [\"%s\"]}], \"semaphores\": []}",
            ct, ct, ct, ct, ct, ct, 1 - r, 1 - r, ct);
    }
    snprintf(j + k, len - k,
             "], \"num_threads_per_block\": 256, \"use_double_scratch_buffer\": false, "
             "\"buffer_alignment\": 16, \"min_message_size\": 0, \"max_message_size\": 1048576}");
}

START_TEST(test_wide_put_split)
{
    static char j[16384];
    char err[MSCX_PLAN_ERR_LEN];
    for (int port = 0; port < 2; port++) {
        ag_wide_plan(j, sizeof(j), port);
        struct mscx_plan *plan = NULL;
        ck_assert_msg(mscx_plan_load_buffer(j, strlen(j), "ag_wide.json", &plan, err, sizeof(err)) == MSCX_OK,
                      "%s", err);
        const struct mscx_gpu *g = &plan->gpus[0];
        ck_assert_uint_eq(g->tb[0].nops, 7); /* signal, wait, copy, put x2, signal, wait */
        const struct mscx_dev_op *a = &g->ops[g->tb[0].op_begin + 3], *b = a + 1;
        ck_assert_uint_eq(a->opcode, MSCX_OP_PUT);
        ck_assert_uint_eq(b->opcode, MSCX_OP_PUT);
        ck_assert_uint_eq(a->nsrc, port ? 8 : 10);
        ck_assert_uint_eq(b->nsrc, port ? 4 : 2);
        ck_assert_uint_eq(b->ndst, b->nsrc);
        ck_assert_uint_eq(a->nchan, port ? 8 : 0);
        ck_assert_uint_eq(b->nchan, port ? 4 : 0);
        ck_assert_uint_eq(b->src[0].index,
                          port ? 8 : 10); /* the pairs continue where the first piece stopped */
        ck_assert_uint_eq(b->dst[b->ndst - 1].index, 11);
        check_case(plan, port ? "ag_wide port" : "ag_wide", 24 * 4 * 3, MSCX_DT_FP32, MSCX_REDOP_SUM,
                   MSCX_PKT_LL16, 3);
        check_case(plan, port ? "ag_wide port" : "ag_wide", 24 * 2 * 5, MSCX_DT_FP16, MSCX_REDOP_SUM,
                   MSCX_PKT_LL8, 2);
        mscx_plan_destroy(plan);
    }
    /* a pairwise op whose lists differ in length is not split: the limit is reported */
    ag_wide_plan(j, sizeof(j), 0);
    char *put = strstr(j, "\"name\": \"put\", \"src_buff\": [{");
    ck_assert_ptr_nonnull(put);
    char *second = strstr(put, "}, {\"type\": \"i\", \"index\": 1,");
    ck_assert_ptr_nonnull(second);
    memmove(second + 1, strstr(second, "}, {\"type\": \"i\", \"index\": 2,") + 1,
            strlen(strstr(second, "}, {\"type\": \"i\", \"index\": 2,") + 1) + 1); /* drop src pair 1 */
    struct mscx_plan *plan = NULL;
    ck_assert_int_ne(mscx_plan_load_buffer(j, strlen(j), "ag_wide.json", &plan, err, sizeof(err)), MSCX_OK);
    ck_assert_msg(strstr(err, "at most 10 operands") != NULL, "%s", err);
}
END_TEST

START_TEST(test_detects_wrong_plan)
{
    struct mscx_plan *plan = load_ref("mscclpp-algo-plans", "allreduce_pkt_n2");
    struct mscx_gpu *g = &plan->gpus[1];
    uint32_t k = 0;
    while (k < g->nops && g->ops[k].opcode != MSCX_OP_UNPACK_PACKETS)
        k++;
    ck_assert_uint_lt(k, g->nops);
    g->ops[k].dst[0].index ^= 1; /* still in range, now the wrong chunk */
    struct mscx_sim_case c = {1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2, 3, 0};
    struct mscx_sim_result res;
    ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
    ck_assert_int_eq(res.pass, 0);
    ck_assert_uint_gt(res.mismatches, 0);
    ck_assert_msg(strstr(res.msg, "allreduce: rank 1 iter 0 byte offset") != NULL, "%s", res.msg);
    mscx_plan_destroy(plan);
}
END_TEST

/* The DSL's one-node AlltoAll examples (tests/data/mscclpp/README.md). */
static const char *const a2a_plans[] = {
    "alltoall_n2",          "alltoall_n4",          "alltoall_n8",
    "alltoall_pipeline_n2", "alltoall_pipeline_n4", "alltoall_ring_n2",
    "alltoall_ring_oop_n2", "alltoall_ring_oop_n4", "alltoall_ring_peers_n4",
};
#define N_A2A_PLANS (sizeof(a2a_plans) / sizeof(a2a_plans[0]))

/*
 * Every AlltoAll fixture at element counts its chunks divide: one element group, an odd multiple of it
 * and a larger one whose 4-byte chunks are no multiple of 16; fp32 and fp16, both formats, 3 launches.
 * A count the chunks do not divide (where there is one) is refused, naming the plan.
 */
START_TEST(test_alltoall_fixtures)
{
    struct mscx_plan *plan = load_ref("mscclpp-algo-plans", a2a_plans[_i]);
    uint64_t n = mscx_plan_nranks(plan), m = mscx_plan_elem_multiple(plan);
    ck_assert_uint_eq(m % n, 0);
    static const uint64_t mult[] = {1, 3, 41};
    static const enum mscx_dtype dts[2] = {MSCX_DT_FP32, MSCX_DT_FP16};
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < 2; d++)
            for (size_t k = 0; k < sizeof(mult) / sizeof(mult[0]); k++)
                check_case(plan, a2a_plans[_i], mult[k] * m * mscx_dtype_size(dts[d]), dts[d], MSCX_REDOP_SUM,
                           (enum mscx_pkt_format)f, 3);
    if (m > n) {
        struct mscx_sim_case c = {(m + n) * 4, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 1, 3, 0};
        struct mscx_sim_result res;
        ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_ERR_INVALID_ARG);
        ck_assert_msg(strstr(res.msg, mscx_plan_name(plan)) && strstr(res.msg, "does not split into its"),
                      "%s", res.msg);
    }
    mscx_plan_destroy(plan);
}
END_TEST

/*
 * alltoall_ring_oop for 2 ranks puts 16 chunks in each peer's block. At 64,064 bytes of fp32 (8,008
 * elements per peer) chunks of ceil(16,016 / 32) = 501 elements would carry rank 0's block past its end
 * into rank 1's: the geometry refuses that count, naming the plan. The same bytes as uint8 (2,002-byte
 * chunks, no multiple of 16) and 64,000 or 65,536 bytes of fp32 divide evenly and pass.
 */
START_TEST(test_alltoall_ring_oop_sections)
{
    struct mscx_plan *plan = load_ref("mscclpp-algo-plans", "alltoall_ring_oop_n2");
    ck_assert_uint_eq(mscx_plan_elem_multiple(plan), 32);
    struct mscx_sim_case c = {64064, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2, 3, 0};
    struct mscx_sim_result res;
    ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_ERR_INVALID_ARG);
    ck_assert_msg(strstr(res.msg, "plan alltoall_ring_oop rank 0") &&
                      strstr(res.msg, "(16016 fp32 elements) does not split into its 32 chunks evenly"),
                  "%s", res.msg);
    check_case(plan, "alltoall_ring_oop_n2", 64064, MSCX_DT_UINT8, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2);
    check_case(plan, "alltoall_ring_oop_n2", 64000, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 2);
    check_case(plan, "alltoall_ring_oop_n2", 65536, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL8, 2);
    mscx_plan_destroy(plan);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("sim_fixtures");
    TCase *tc = mscx_tcase("fixtures");
    tcase_add_loop_test(tc, test_op_plans, 0, (int)N_OP_PLANS);
    tcase_add_test(tc, test_switch_refused);
    tcase_add_test(tc, test_detects_wrong_plan);
    tcase_add_test(tc, test_allgather_sections);
    tcase_add_test(tc, test_wide_put_split);
    tcase_add_loop_test(tc, test_allreduce_sizes, 0, 3);
    tcase_add_loop_test(tc, test_allreduce_dtypes, 0, 3);
    tcase_add_loop_test(tc, test_alltoall_fixtures, 0, (int)N_A2A_PLANS);
    tcase_add_test(tc, test_alltoall_ring_oop_sections);
    suite_add_tcase(s, tc);
    return s;
}
