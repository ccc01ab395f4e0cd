/* SPDX-License-Identifier: MIT */
/*
 * The reduction-order check at load: an AllReduce plan whose ranks combine
 * the inputs in different associations is refused with its position and the
 * opt-out field; the shipped plans load; "ranks_may_differ" accepts.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/plan.h"
#include "mscx/sim.h"
#include "plan_model.h"
#include "test_common.h"

#define FOUR_NODE "mscclpp-4node-plans"
#define ONESHOT "plans/allreduce_n4_rpn4_oneshot_1K_4K.json"
#define OPT_OUT "\"ranks_may_differ\": true, "

/* MSCCL++'s default 4-node plans and its allreduce_multi_nodes at 4 x 2, and where each first differs. */
static const struct {
    const char *name, *rank, *path;
} four_node[] = {
    {"allreduce_4nodes_1K_64K", "on rank 16 than on rank 0 for its output chunk 0 (part 1 of 7)",
     "gpus[16].threadblocks[1].ops[3]"},
    {"allreduce_4nodes_128K_2M", "on rank 16 than on rank 0 for its output chunk 0 (part 1 of 28)",
     "gpus[16].threadblocks[1].ops[3]"},
    {"allreduce_multi_nodes_4x2",
     "on rank 4 than on rank 0 for its output chunk 0:", "gpus[4].threadblocks[1].ops[3]"},
};
#define N_FOUR_NODE (sizeof(four_node) / sizeof(four_node[0]))

static mscx_status_t load_text(const char *text, const char *origin, struct mscx_plan **plan_p, char *err)
{
    return mscx_plan_load_buffer(text, strlen(text), origin, plan_p, err, MSCX_PLAN_ERR_LEN);
}

/* @p text with the opt-out field as the first top-level member. */
static char *with_opt_out(const char *text)
{
    const char *brace = strchr(text, '{');
    ck_assert_ptr_nonnull(brace);
    size_t head = (size_t)(brace - text) + 1, n = strlen(text) + sizeof(OPT_OUT);
    char *out = malloc(n);
    ck_assert_ptr_nonnull(out);
    snprintf(out, n, "%.*s" OPT_OUT "%s", (int)head, text, brace + 1);
    return out;
}

/* The shipped one-shot plan with rank 1's reduce folding scratch slots 3 and 2 in swapped order. */
static char *reordered_oneshot(void)
{
    char *text = mscx_test_read_file(mscx_test_src(ONESHOT), NULL);
    ck_assert_ptr_nonnull(text);
    char *op = strstr(text, "\"name\": \"repkt\"");
    ck_assert_ptr_nonnull(op);
    op = strstr(op + 1, "\"name\": \"repkt\""); /* rank 1's */
    ck_assert_ptr_nonnull(op);
    char *two = strstr(op, "\"index\": 2,"), *three = strstr(op, "\"index\": 3,");
    ck_assert_ptr_nonnull(two);
    ck_assert_ptr_nonnull(three);
    two[strlen("\"index\": ")] = '3';
    three[strlen("\"index\": ")] = '2';
    return text;
}

/* Append to @p buf (of @p cap bytes) what the format says. */
static void put(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put(char *buf, size_t cap, const char *fmt, ...)
{
    size_t at = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
    ck_assert(n >= 0 && (size_t)n < cap - at);
}

/*
 * A one-shot LL AllReduce of @p n ranks: each rank sends its input to slot
 * r of every peer's scratch, then folds its own input and the peers' slots
 * in rank order, so rank r computes ((r + p0) + p1) + ...: with two ranks
 * r0 + r1 on rank 0 and r1 + r0 on rank 1, with three (r2 + r0) + r1 on
 * rank 2 against (r0 + r1) + r2 on rank 0. Each rank has @p scratch_chunks
 * (at least n) of scratch.
 */
static void own_first_plan(uint32_t n, uint32_t scratch_chunks, char *buf, size_t cap)
{
    buf[0] = '\0';
    put(buf, cap,
        "{\"name\": \"own_first_n%u\", \"collective\": \"allreduce\", \"protocol\": \"LL\", "
        "\"inplace\": true, \"gpus\": [",
        n);
    for (uint32_t r = 0; r < n; r++) {
        const char *sep;
        put(buf, cap,
            "%s{\"id\": %u, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": %u, "
            "\"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [",
            r ? ", " : "", r, scratch_chunks);
        sep = "";
        for (uint32_t p = 0; p < n; p++)
            if (p != r) {
                put(buf, cap, "%s%u", sep, p);
                sep = ", ";
            }
        put(buf, cap, "]}], \"remote_buffers\": [");
        sep = "";
        for (uint32_t p = 0; p < n; p++)
            if (p != r) {
                put(buf, cap, "%s{\"rank\": %u, \"type\": \"s\", \"access_channel_types\": [\"memory\"]}",
                    sep, p);
                sep = ", ";
            }
        put(buf, cap,
            "], \"semaphores\": [], \"threadblocks\": [{\"id\": 0, \"ops\": [{\"name\": \"ppkt\", "
            "\"src_buff\": [");
        for (uint32_t k = 0; k + 1 < n; k++)
            put(buf, cap, "%s{\"type\": \"i\", \"index\": 0, \"size\": 1}", k ? ", " : "");
        put(buf, cap, "], \"dst_buff\": [");
        for (uint32_t k = 0; k + 1 < n; k++)
            put(buf, cap, "%s{\"buffer_id\": %u, \"index\": %u, \"size\": 1}", k ? ", " : "", k, r);
        put(buf, cap,
            "], \"channel_type\": \"memory\"}, {\"name\": \"repkt\", \"src_buff\": "
            "[{\"type\": \"i\", \"index\": 0, \"size\": 1}");
        for (uint32_t p = 0; p < n; p++)
            if (p != r)
                put(buf, cap, ", {\"type\": \"s\", \"index\": %u, \"size\": 1}", p);
        put(buf, cap,
            "], \"dst_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}], \"reduce_op\": \"sum\"}], "
            "\"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [");
        for (uint32_t k = 0; k + 1 < n; k++)
            put(buf, cap, "%s%u", k ? ", " : "", k);
        put(buf, cap,
            "]}], \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [");
        for (uint32_t k = 0; k + 1 < n; k++)
            put(buf, cap, "%s%u", k ? ", " : "", k);
        put(buf, cap, "]}]}]}");
    }
    put(buf, cap, "]}");
}

/* a + b and b + a are one order: two ranks that each add their own input first agree. */
START_TEST(test_commutative_accepted)
{
    char text[8192], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    own_first_plan(2, 2, text, sizeof(text));
    ck_assert_msg(load_text(text, "own_first_n2.json", &plan, err) == MSCX_OK, "%s", err);
    mscx_plan_destroy(plan);
}
END_TEST

/* (r2 + r0) + r1 against (r0 + r1) + r2: another association, refused at rank 2's reduce. */
START_TEST(test_association_refused)
{
    char text[8192], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    own_first_plan(3, 3, text, sizeof(text));
    ck_assert_int_eq(load_text(text, "own_first_n3.json", &plan, err), MSCX_ERR_PLAN);
    ck_assert_ptr_null(plan);
    ck_assert_msg(strstr(err, "own_first_n3.json") && strstr(err, "gpus[2].threadblocks[0].ops[1]") &&
                      strstr(err, "on rank 2 than on rank 0 for its output chunk 0:") &&
                      strstr(err, "rank 2: (r0+r2)+r1, rank 0: (r0+r1)+r2"),
                  "%s", err);
}
END_TEST

/* A plan too large to model at load (over 2^21 cells) is left unchecked and loads. */
START_TEST(test_too_large_unchecked)
{
    char text[8192], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    own_first_plan(3, 1u << 20, text, sizeof(text));
    ck_assert_msg(load_text(text, "own_first_n3_large.json", &plan, err) == MSCX_OK, "%s", err);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_four_node_refused)
{
    char rel[256], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    snprintf(rel, sizeof(rel), FOUR_NODE "/%s.json", four_node[_i].name);
    ck_assert_int_eq(mscx_plan_load(mscx_test_ref(rel), &plan, err, sizeof(err)), MSCX_ERR_PLAN);
    ck_assert_ptr_null(plan);
    ck_assert_msg(strstr(err, four_node[_i].name) != NULL, "%s", err);
    ck_assert_msg(strstr(err, "expected every rank to reduce each output element in the same order") != NULL,
                  "%s", err);
    ck_assert_msg(strstr(err, four_node[_i].rank) != NULL, "%s", err);
    ck_assert_msg(strstr(err, four_node[_i].path) != NULL, "%s", err);
    ck_assert_msg(strstr(err, "\"ranks_may_differ\": true") != NULL, "%s", err);
}
END_TEST

/* The 4 x 2 plan names both orders of its first differing element. */
START_TEST(test_four_node_orders_named)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    ck_assert_int_eq(
        mscx_plan_load(mscx_test_ref(FOUR_NODE "/allreduce_multi_nodes_4x2.json"), &plan, err, sizeof(err)),
        MSCX_ERR_PLAN);
    ck_assert_msg(strstr(err, "rank 4: (((r0+r1)+(r4+r5))+(r2+r3))+(r6+r7), "
                              "rank 0: (((r0+r1)+(r2+r3))+(r4+r5))+(r6+r7)") != NULL,
                  "%s", err);
}
END_TEST

START_TEST(test_four_node_opt_out)
{
    char rel[256], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    snprintf(rel, sizeof(rel), FOUR_NODE "/%s.json", four_node[_i].name);
    char *text = mscx_test_read_file(mscx_test_ref(rel), NULL);
    ck_assert_ptr_nonnull(text);
    char *opted = with_opt_out(text);
    ck_assert_msg(load_text(opted, rel, &plan, err) == MSCX_OK, "%s", err);
    ck_assert(plan->ranks_may_differ);
    mscx_plan_destroy(plan);
    free(opted);
    free(text);
}
END_TEST

/* The simulation agrees: the 4 x 2 plan, loaded with the opt-out, gives rank 4 other bits than rank 0. */
START_TEST(test_four_node_sim_agrees)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *text = mscx_test_read_file(mscx_test_ref(FOUR_NODE "/allreduce_multi_nodes_4x2.json"), NULL);
    ck_assert_ptr_nonnull(text);
    char *opted = with_opt_out(text);
    ck_assert_msg(load_text(opted, "4x2.json", &plan, err) == MSCX_OK, "%s", err);
    struct mscx_sim_case c = {1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 1, 1, 0};
    struct mscx_sim_result res;
    ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
    ck_assert(!res.pass);
    ck_assert_msg(strstr(res.msg, "ranks disagree on rounding-sensitive inputs: rank 4 ") != NULL, "%s",
                  res.msg);
    mscx_plan_destroy(plan);
    free(opted);
    free(text);
}
END_TEST

/* Every shipped plan loads (mscx_test_plans_next fails the test otherwise) and none opts out. */
START_TEST(test_shipped_accepted)
{
    struct mscx_test_plans it;
    size_t n = 0;
    mscx_test_plans_begin(&it);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL; n++)
        ck_assert_msg(!plan->ranks_may_differ, "%s", it.path);
    ck_assert_uint_gt(n, 0);
}
END_TEST

/* The unchanged one-shot plan loads; rank 1 folding ((r0 + r1) + r3) + r2 is refused at that reduce. */
START_TEST(test_reordered_refused)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *text = mscx_test_read_file(mscx_test_src(ONESHOT), NULL);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(load_text(text, "oneshot.json", &plan, err) == MSCX_OK, "%s", err);
    mscx_plan_destroy(plan);
    free(text);

    text = reordered_oneshot();
    plan = NULL;
    ck_assert_int_eq(load_text(text, "reordered.json", &plan, err), MSCX_ERR_PLAN);
    ck_assert_ptr_null(plan);
    ck_assert_msg(strstr(err, "reordered.json") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "gpus[1].threadblocks[0].ops[3]") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "on rank 1 than on rank 0 for its output chunk 0:") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "rank 1: ((r0+r1)+r3)+r2, rank 0: ((r0+r1)+r2)+r3") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "\"ranks_may_differ\": true") != NULL, "%s", err);
    free(text);
}
END_TEST

START_TEST(test_reordered_opt_out)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *text = reordered_oneshot(), *opted = with_opt_out(text);
    ck_assert_msg(load_text(opted, "reordered.json", &plan, err) == MSCX_OK, "%s", err);
    ck_assert(plan->ranks_may_differ);
    mscx_plan_destroy(plan);
    free(opted);
    free(text);
}
END_TEST

/* Only float sums and products depend on the order: a plan limited to integers loads. */
START_TEST(test_reordered_integers_accepted)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *text = reordered_oneshot();
    char *types = strstr(text, "\"dtypes\": [");
    ck_assert_ptr_nonnull(types);
    char *end = strchr(types, ']');
    ck_assert_ptr_nonnull(end);
    const char *ints = "\"dtypes\": [\"int32\"";
    size_t room = (size_t)(end - types);
    ck_assert_uint_ge(room, strlen(ints));
    memset(types, ' ', room);
    memcpy(types, ints, strlen(ints));
    ck_assert_msg(load_text(text, "reordered-int.json", &plan, err) == MSCX_OK, "%s", err);
    mscx_plan_destroy(plan);
    free(text);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("redorder");
    TCase *tc = mscx_tcase("redorder");
    tcase_add_loop_test(tc, test_four_node_refused, 0, (int)N_FOUR_NODE);
    tcase_add_test(tc, test_four_node_orders_named);
    tcase_add_test(tc, test_four_node_sim_agrees);
    tcase_add_loop_test(tc, test_four_node_opt_out, 0, (int)N_FOUR_NODE);
    tcase_add_test(tc, test_shipped_accepted);
    tcase_add_test(tc, test_commutative_accepted);
    tcase_add_test(tc, test_association_refused);
    tcase_add_test(tc, test_too_large_unchecked);
    tcase_add_test(tc, test_reordered_refused);
    tcase_add_test(tc, test_reordered_opt_out);
    tcase_add_test(tc, test_reordered_integers_accepted);
    suite_add_tcase(s, tc);
    return s;
}
