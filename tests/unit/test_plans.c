/* SPDX-License-Identifier: MIT */
/*
 * The shipped plans (the JSON files in plans/) and the generator (mscx-plangen):
 * every plan loads, is executable, claims a sane range that no sibling
 * overlaps, and computes its collective on the host executor (mscx_sim_check)
 * at its range boundaries and at odd sizes, for every datatype and operator
 * it claims, with LL16 and LL8 packets and back-to-back launches. The
 * two-node allreduce uses the fused packet ops; unfused generator output
 * gives bit-identical results. The generator's two-phase block layouts
 * (--blocks, --layout) are checked in test_plans_twophase_layouts.c.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test_common.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "mscx/sim.h"
#include "plan_model.h"
#include "test_plans_int.h"

#define MAX_PLANS 128
#define SIM_CAP (2ull << 20)

static char *plan_files[MAX_PLANS];
static size_t nplan_files;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted list of JSON files in plans/ (file names). */
static void list_plans(void)
{
    if (nplan_files)
        return;
    DIR *d = opendir(mscx_test_src("plans"));
    ck_assert_msg(d, "cannot open plans/");
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".json") == 0 && nplan_files < MAX_PLANS)
            plan_files[nplan_files++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(plan_files, nplan_files, sizeof(plan_files[0]), cmp_str);
}

static struct mscx_plan *load_plan(const char *file)
{
    char path[4096], rel[512], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    snprintf(rel, sizeof(rel), "plans/%s", file);
    snprintf(path, sizeof(path), "%s", mscx_test_src(rel));
    mscx_status_t s = mscx_plan_load(path, &plan, err, sizeof(err));
    ck_assert_msg(s == MSCX_OK, "%s does not load: %s", file, err);
    return plan;
}

/* Smallest message granule: whole elements on every rank. */
static uint64_t size_unit(const struct mscx_plan *plan, enum mscx_dtype dt)
{
    uint64_t u = mscx_dtype_size(dt);
    enum mscx_coll c = mscx_plan_collective(plan);
    if (c == MSCX_COLL_ALLGATHER || c == MSCX_COLL_REDUCESCATTER || c == MSCX_COLL_ALLTOALL)
        u *= mscx_plan_nranks(plan);
    return u;
}

/* ---- loading, headers, ranges ---- */

START_TEST(test_plans_load)
{
    list_plans();
    ck_assert_uint_ge(nplan_files, 39);
    for (size_t i = 0; i < nplan_files; i++) {
        struct mscx_plan *plan = load_plan(plan_files[i]);
        char err[MSCX_PLAN_ERR_LEN], stem[256];
        ck_assert_msg(mscx_plan_executable(plan, err, sizeof(err)) == MSCX_OK, "%s: %s", plan_files[i], err);
        snprintf(stem, sizeof(stem), "%.*s", (int)(strlen(plan_files[i]) - 5), plan_files[i]);
        ck_assert_str_eq(mscx_plan_name(plan), stem);
        /* the file name states collective, ranks and ranks per node */
        char expect[128];
        snprintf(expect, sizeof(expect), "%s_n%u_rpn%u_", mscx_coll_name(mscx_plan_collective(plan)),
                 mscx_plan_nranks(plan), mscx_plan_ranks_per_node(plan));
        ck_assert_msg(strncmp(stem, expect, strlen(expect)) == 0, "%s: header says %s", stem, expect);
        uint64_t lo, hi;
        mscx_plan_size_range(plan, &lo, &hi);
        ck_assert_uint_ge(lo, 1024);
        ck_assert_uint_le(hi, mscx_plan_nranks(plan) == 1 ? 4u << 20 : 2u << 20); /* one rank: a copy */
        ck_assert_uint_lt(lo, hi);
        /* allreduce in place; the others out of place */
        ck_assert_int_eq(!!mscx_plan_inplace(plan), mscx_plan_collective(plan) == MSCX_COLL_ALLREDUCE);
        /* the GPU harness fits every rank's blocks on one device: nranks * blocks <= 128 */
        for (uint32_t r = 0; r < plan->nranks; r++)
            ck_assert_msg(plan->nranks * plan->gpus[r].ntb <= 128, "%s: %u blocks per rank", stem,
                          plan->gpus[r].ntb);
        if (plan->nranks > 1)
            ck_assert_msg(plan->double_scratch && plan->protocol == MSCX_PROTO_LL, "%s: packet plan", stem);
        /* no shipped plan reaches another rank's user buffers (the shim would not use it) */
        ck_assert_msg(!mscx_plan_reaches_peer_user(plan), "%s reaches a peer's input or output", stem);
        mscx_plan_destroy(plan);
    }
}
END_TEST

START_TEST(test_plans_ranges_disjoint)
{
    list_plans();
    struct mscx_plan *plans[MAX_PLANS];
    for (size_t i = 0; i < nplan_files; i++)
        plans[i] = load_plan(plan_files[i]);
    for (size_t i = 0; i < nplan_files; i++) {
        for (size_t j = i + 1; j < nplan_files; j++) {
            const struct mscx_plan *a = plans[i], *b = plans[j];
            if (mscx_plan_collective(a) != mscx_plan_collective(b) ||
                mscx_plan_nranks(a) != mscx_plan_nranks(b) ||
                mscx_plan_ranks_per_node(a) != mscx_plan_ranks_per_node(b) ||
                mscx_plan_inplace(a) != mscx_plan_inplace(b) || mscx_plan_root(a) != mscx_plan_root(b))
                continue;
            uint64_t alo, ahi, blo, bhi;
            mscx_plan_size_range(a, &alo, &ahi);
            mscx_plan_size_range(b, &blo, &bhi);
            ck_assert_msg(ahi < blo || bhi < alo, "%s and %s overlap", plan_files[i], plan_files[j]);
        }
    }
    /* and every (collective, world) is covered from 1K without holes */
    for (size_t i = 0; i < nplan_files; i++) {
        uint64_t lo, hi;
        mscx_plan_size_range(plans[i], &lo, &hi);
        if (lo == 1024)
            continue;
        int found = 0;
        for (size_t j = 0; j < nplan_files; j++) {
            uint64_t l2, h2;
            mscx_plan_size_range(plans[j], &l2, &h2);
            found |= mscx_plan_collective(plans[j]) == mscx_plan_collective(plans[i]) &&
                     mscx_plan_root(plans[j]) == mscx_plan_root(plans[i]) &&
                     mscx_plan_nranks(plans[j]) == mscx_plan_nranks(plans[i]) &&
                     mscx_plan_ranks_per_node(plans[j]) == mscx_plan_ranks_per_node(plans[i]) && h2 + 1 == lo;
        }
        ck_assert_msg(found, "%s: nothing ends just below its range", plan_files[i]);
    }
    for (size_t i = 0; i < nplan_files; i++)
        mscx_plan_destroy(plans[i]);
}
END_TEST

/* ---- simulation ---- */

static void sim_one_x(const struct mscx_plan *plan, uint64_t bytes, enum mscx_dtype dt, enum mscx_redop op,
                      enum mscx_pkt_format pkt, uint32_t seed, bool cross_rank)
{
    struct mscx_sim_case c = {.msg_bytes = bytes,
                              .dtype = dt,
                              .op = op,
                              .pkt = pkt,
                              .iters = 2,
                              .seed = seed,
                              .no_cross_rank = !cross_rank};
    struct mscx_sim_result res;
    memset(&res, 0, sizeof(res));
    mscx_status_t s = mscx_sim_check(plan, &c, &res);
    ck_assert_msg(s == MSCX_OK && res.pass, "%s: %llu bytes %s %s %s: %s (%s)", mscx_plan_name(plan),
                  (unsigned long long)bytes, mscx_dtype_name(dt), mscx_redop_name(op),
                  pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", s == MSCX_OK ? res.msg : mscx_status_str(s), res.msg);
}

/* With the allreduce cross-rank check (float types). */
void sim_one(const struct mscx_plan *plan, uint64_t bytes, enum mscx_dtype dt, enum mscx_redop op,
             enum mscx_pkt_format pkt, uint32_t seed)
{
    sim_one_x(plan, bytes, dt, op, pkt, seed, true);
}

/* One plan, by index (a loop test): boundaries, odd sizes, every claimed dtype x op. */
START_TEST(test_plans_sim)
{
    list_plans();
    if ((size_t)_i >= nplan_files)
        return;
    struct mscx_plan *plan = load_plan(plan_files[_i]);
    bool reduces = mscx_plan_collective(plan) != MSCX_COLL_ALLGATHER &&
                   mscx_plan_collective(plan) != MSCX_COLL_ALLTOALL &&
                   mscx_plan_collective(plan) != MSCX_COLL_BROADCAST;
    uint64_t lo, hi;
    mscx_plan_size_range(plan, &lo, &hi);
    if (hi > SIM_CAP)
        hi = SIM_CAP;
    uint32_t nsmall = 0;

    for (int dt = 0; dt < MSCX_DT_COUNT; dt++) {
        for (int op = 0; op < (reduces ? MSCX_REDOP_COUNT : 1); op++) {
            if (!mscx_plan_supports(plan, (enum mscx_dtype)dt, (enum mscx_redop)op))
                continue;
            uint64_t u = size_unit(plan, (enum mscx_dtype)dt);
            uint64_t small = round_up(lo, u);
            /*
             * every combo at the smallest size, both packet formats; the
             * cross-rank run (sampled: it doubles a float case) with LL16 for
             * the order-sensitive sum and prod, min and max being
             * order-free on its non-zero finite inputs
             */
            sim_one_x(plan, small, (enum mscx_dtype)dt, (enum mscx_redop)op, MSCX_PKT_LL16, 1,
                      op == MSCX_REDOP_SUM || op == MSCX_REDOP_PROD);
            sim_one_x(plan, small, (enum mscx_dtype)dt, (enum mscx_redop)op, MSCX_PKT_LL8, 2,
                      dt == MSCX_DT_BF16 && op == MSCX_REDOP_SUM);
            /* an odd element count that splits unevenly over chunks and slices */
            uint64_t odd = small + 3 * u;
            if ((odd / u) % 2 == 0)
                odd += u;
            if (odd <= hi && (dt + op) % 3 == 0)
                sim_one(plan, odd, (enum mscx_dtype)dt, (enum mscx_redop)op,
                        (dt + op) % 2 ? MSCX_PKT_LL8 : MSCX_PKT_LL16, 3);
            nsmall++;
        }
    }
    ck_assert_uint_gt(nsmall, 0);
    /*
     * Allreduce: mscx_sim_check also requires bit-identical results on every
     * rank with rounding-sensitive float inputs. The loop above ran it at the
     * smallest size for every float type with sum and prod/LL16 and bf16
     * sum/LL8, and odd sizes with fp32 sum/LL16 and bf16 prod/LL8; complete
     * the odd-size square.
     */
    if (mscx_plan_collective(plan) == MSCX_COLL_ALLREDUCE) {
        uint64_t u32 = size_unit(plan, MSCX_DT_FP32), odd = round_up(lo, u32) + 5 * u32;
        if (odd <= hi) {
            sim_one(plan, odd, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL8, 7);
            sim_one(plan, odd, MSCX_DT_BF16, MSCX_REDOP_SUM, MSCX_PKT_LL16, 8);
        }
    }
    /* the top of the range (capped at 2 MB): one sampled combo per plan, rotating */
    static const struct {
        enum mscx_dtype dt;
        enum mscx_redop op;
        enum mscx_pkt_format pkt;
    } top[] = {
        {MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16},
        {MSCX_DT_BF16, MSCX_REDOP_MAX, MSCX_PKT_LL8},
        {MSCX_DT_INT32, MSCX_REDOP_PROD, MSCX_PKT_LL16},
        {MSCX_DT_FP16, MSCX_REDOP_MIN, MSCX_PKT_LL8},
    };
    enum mscx_dtype tdt = top[_i % 4].dt;
    if (!reduces && _i % 4 == 2)
        tdt = MSCX_DT_INT8; /* data movement: a one-byte type */
    uint64_t tu = size_unit(plan, tdt);
    sim_one(plan, hi / tu * tu, tdt, top[_i % 4].op, top[_i % 4].pkt, 4);
    /* a size in the middle of the range with an odd element count */
    uint64_t u = size_unit(plan, MSCX_DT_FP16), mid = round_up(lo + (hi - lo) / 3, u);
    if ((mid / u) % 2 == 0)
        mid += u;
    if (mid <= hi)
        sim_one(plan, mid, MSCX_DT_FP16, reduces ? MSCX_REDOP_MIN : MSCX_REDOP_SUM, MSCX_PKT_LL16, 6);
    mscx_plan_destroy(plan);
}
END_TEST

/*
 * Every shipped AlltoAll plan takes any whole count per peer (its chunks are one per peer block): odd
 * counts near both ends of its range and in between, in elements of 1, 2, 4 and 8 bytes, both packet
 * formats.
 */
static const uint64_t a2a_counts_lo[] = {1, 3, 5, 7, 33, 129, 1001};

static void a2a_uneven(const struct mscx_plan *plan)
{
    static const enum mscx_dtype dts[4] = {MSCX_DT_UINT8, MSCX_DT_BF16, MSCX_DT_FP32, MSCX_DT_FP64};
    uint64_t lo, hi, n = mscx_plan_nranks(plan);
    mscx_plan_size_range(plan, &lo, &hi);
    if (hi > SIM_CAP)
        hi = SIM_CAP;
    ck_assert_uint_eq(mscx_plan_elem_multiple(plan), n);
    for (int d = 0; d < 4; d++) {
        uint64_t u = n * mscx_dtype_size(dts[d]), base = round_up(lo, u) / u, top = hi / u;
        uint64_t counts[10];
        size_t nc = 0;
        for (size_t k = 0; k < sizeof(a2a_counts_lo) / sizeof(a2a_counts_lo[0]); k++)
            if (base + a2a_counts_lo[k] <= top && (k + (size_t)d) % 2 == 0)
                counts[nc++] = base + a2a_counts_lo[k];
        counts[nc++] = top % 2 ? top : top - 1;
        counts[nc++] = (base + (top - base) / 2) | 1;
        for (size_t k = 0; k < nc; k++)
            if (counts[k] >= base && counts[k] <= top)
                sim_one(plan, counts[k] * u, dts[d], MSCX_REDOP_SUM,
                        (k + (size_t)d) % 2 ? MSCX_PKT_LL8 : MSCX_PKT_LL16, (uint32_t)(30 + k));
    }
}

START_TEST(test_plans_alltoall_uneven)
{
    list_plans();
    uint32_t nplans = 0;
    for (size_t i = 0; i < nplan_files; i++) {
        if (strncmp(plan_files[i], "alltoall_", 9) != 0)
            continue;
        struct mscx_plan *plan = load_plan(plan_files[i]);
        ck_assert_int_eq(mscx_plan_collective(plan), MSCX_COLL_ALLTOALL);
        a2a_uneven(plan);
        mscx_plan_destroy(plan);
        nplans++;
    }
    ck_assert_uint_ge(nplans, 7);
}
END_TEST

/*
 * Broadcast: every root of each shipped layout has plans covering 1K-1M
 * (ranges of one root never overlap: test_plans_ranges_disjoint; the file
 * name names the root the plan's extension gives), and each runs NCCL's broadcast from
 * that root at sizes that end in a partial packet line and split unevenly
 * over the blocks, in 1-, 2- and 8-byte elements.
 */
static void bcast_uneven(const struct mscx_plan *plan)
{
    static const struct {
        uint64_t bytes;
        enum mscx_dtype dt;
        enum mscx_pkt_format pkt;
    } cases[] = {
        {1025, MSCX_DT_UINT8, MSCX_PKT_LL16},
        {4093, MSCX_DT_INT8, MSCX_PKT_LL8},
        {2 * 32771, MSCX_DT_FP16, MSCX_PKT_LL16},
        {8 * 100003, MSCX_DT_FP64, MSCX_PKT_LL8},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
        sim_one(plan, cases[k].bytes, cases[k].dt, MSCX_REDOP_SUM, cases[k].pkt, 11 + (uint32_t)k);
}

START_TEST(test_plans_broadcast_roots)
{
    static uint64_t cover[17][17][16]; /* [nranks][ranks per node][root]: bytes of the ranges */
    uint32_t nplans = 0;
    memset(cover, 0, sizeof(cover));
    list_plans();
    for (size_t i = 0; i < nplan_files; i++) {
        if (strncmp(plan_files[i], "broadcast_", 10) != 0)
            continue;
        struct mscx_plan *plan = load_plan(plan_files[i]);
        uint32_t n = mscx_plan_nranks(plan), p = mscx_plan_ranks_per_node(plan), root = mscx_plan_root(plan);
        char tag[32];
        snprintf(tag, sizeof(tag), "_root%u_", root);
        ck_assert_msg(strstr(plan_files[i], tag), "%s: the plan's root is %u", plan_files[i], root);
        ck_assert_uint_lt(root, n);
        ck_assert_uint_le(n, 16);
        uint64_t lo, hi;
        mscx_plan_size_range(plan, &lo, &hi);
        cover[n][p][root] += hi - lo + 1;
        bcast_uneven(plan);
        mscx_plan_destroy(plan);
        nplans++;
    }
    /* one node: LL packets up to 64 KB (no direct plans); two nodes: up to 1 MB */
    static const uint32_t layouts[][3] = {{2, 2, 64},   {4, 4, 64},   {8, 8, 64},
                                          {4, 2, 1024}, {8, 4, 1024}, {16, 8, 1024}};
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++) {
        uint32_t n = layouts[k][0], p = layouts[k][1];
        for (uint32_t root = 0; root < n; root++)
            ck_assert_msg(cover[n][p][root] == (layouts[k][2] << 10) - 1024 + 1,
                          "broadcast n%u rpn%u root %u: %llu bytes covered", n, p, root,
                          (unsigned long long)cover[n][p][root]);
    }
    ck_assert_msg(cover[1][1][0] == (4u << 20) - 1024 + 1, "broadcast n1: %llu bytes covered",
                  (unsigned long long)cover[1][1][0]);
    ck_assert_uint_eq(nplans, 43); /* one range per root and layout; one rank: one copy */
}
END_TEST

/*
 * The broadcast check is not vacuous: a plan loaded with another root than
 * the one it was generated for gives the wrong data, and a plan that leaves
 * every output right but overwrites the root's input (out of place) fails.
 */
static void sim_expect_fail(const struct mscx_plan *plan, const char *why)
{
    struct mscx_sim_case c = {
        .msg_bytes = 1027, .dtype = MSCX_DT_UINT8, .pkt = MSCX_PKT_LL16, .iters = 2, .seed = 5};
    struct mscx_sim_result res;
    ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
    ck_assert_msg(!res.pass && strstr(res.msg, why), "%s: passed or wrong reason: %s", mscx_plan_name(plan),
                  res.msg);
}

START_TEST(test_sim_broadcast_checks)
{
    size_t len;
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *json = mscx_test_read_file(mscx_test_src("tests/data/broadcast/broadcast_n4_root2.json"), &len);
    ck_assert_ptr_nonnull(json);
    ck_assert_int_eq(mscx_plan_load_buffer(json, len, "root2.json", &plan, err, sizeof(err)), MSCX_OK);
    sim_one(plan, 1027, MSCX_DT_UINT8, MSCX_REDOP_SUM, MSCX_PKT_LL16, 5);
    mscx_plan_destroy(plan);
    char *at = strstr(json, "\"root\": 2");
    ck_assert_ptr_nonnull(at);
    at[sizeof("\"root\": ") - 1] = '1';
    ck_assert_int_eq(mscx_plan_load_buffer(json, len, "root1.json", &plan, err, sizeof(err)), MSCX_OK);
    sim_expect_fail(plan, "broadcast: rank ");
    mscx_plan_destroy(plan);
    free(json);
    const char *overwrites = "tests/data/broadcast/broadcast_n2_root_input_overwritten.json";
    ck_assert_int_eq(mscx_plan_load(mscx_test_src(overwrites), &plan, NULL, 0), MSCX_OK);
    sim_expect_fail(plan, "the root's (rank 0) input changed");
    mscx_plan_destroy(plan);
}
END_TEST

/*
 * The cross-rank check is not vacuous: reversing the packet sources of one
 * rank's reductions in a shipped plan keeps every exact result (sums of
 * small integers) but changes the rounding on that rank, and the check must
 * name it.
 */
START_TEST(test_plans_sim_rank_order)
{
    static const struct {
        const char *file;
        uint32_t rank;
    } cases[] = {
        {"allreduce_n4_rpn4_oneshot_1K_4K.json", 2},
        {"allreduce_n8_rpn8_oneshot_1K_16K.json", 5},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mscx_plan *plan = load_plan(cases[i].file);
        struct mscx_gpu *g = &plan->gpus[cases[i].rank];
        uint32_t changed = 0;
        for (uint32_t k = 0; k < g->nops; k++) {
            struct mscx_dev_op *op = &g->ops[k];
            if (!mscx_opcode_reduces(op->opcode) || op->nsrc < 3)
                continue;
            for (uint32_t a = 1, b = op->nsrc - 1; a < b; a++, b--) {
                struct mscx_dev_operand t = op->src[a];
                op->src[a] = op->src[b];
                op->src[b] = t;
            }
            changed++;
        }
        ck_assert_uint_gt(changed, 0);
        struct mscx_sim_case c = {.msg_bytes = 4096,
                                  .dtype = MSCX_DT_FP32,
                                  .op = MSCX_REDOP_SUM,
                                  .pkt = MSCX_PKT_LL16,
                                  .iters = 1,
                                  .seed = 3};
        struct mscx_sim_result res;
        ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
        ck_assert_msg(!res.pass, "%s: reordered rank %u not caught", cases[i].file, cases[i].rank);
        char want[64];
        snprintf(want, sizeof(want), "rank %u ", cases[i].rank);
        ck_assert_msg(strstr(res.msg, "ranks disagree") && strstr(res.msg, want), "%s: %s", cases[i].file,
                      res.msg);
        /* integers are associative: the same plan passes */
        c.dtype = MSCX_DT_INT32;
        ck_assert_int_eq(mscx_sim_check(plan, &c, &res), MSCX_OK);
        ck_assert_msg(res.pass, "%s int32: %s", cases[i].file, res.msg);
        mscx_plan_destroy(plan);
    }
}
END_TEST

/* ---- the two-node allreduce: structure and fusion ---- */

static void count_ops(const struct mscx_plan *plan, uint32_t *counts, uint32_t *port_ppkt)
{
    memset(counts, 0, sizeof(uint32_t) * MSCX_OP_COUNT);
    *port_ppkt = 0;
    for (uint32_t r = 0; r < plan->nranks; r++) {
        for (uint32_t k = 0; k < plan->gpus[r].nops; k++) {
            const struct mscx_dev_op *op = &plan->gpus[r].ops[k];
            counts[op->opcode]++;
            if (op->opcode == MSCX_OP_PUT_PACKETS && op->chan_type == MSCX_CHAN_PORT)
                (*port_ppkt)++;
        }
    }
}

START_TEST(test_plans_hier_allreduce_ops)
{
    static const char *const files[] = {
        "allreduce_n16_rpn8_hier2_1K_64K.json", "allreduce_n16_rpn8_hier2_64K_2M.json",
        "allreduce_n8_rpn4_hier2_1K_64K.json", "allreduce_n4_rpn2_hier2_64K_2M.json"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        struct mscx_plan *plan = load_plan(files[i]);
        uint32_t counts[MSCX_OP_COUNT], port;
        count_ops(plan, counts, &port);
        ck_assert_msg(counts[MSCX_OP_REDUCE_COPY_PACKETS] > 0, "%s: no recpkt", files[i]);
        ck_assert_msg(port > 0, "%s: no port ppkt", files[i]);
        ck_assert_msg(counts[MSCX_OP_READ_PUT_PACKETS] + counts[MSCX_OP_REDUCE_COPY_SEND_PACKETS] > 0,
                      "%s: neither rppkt nor recspkt", files[i]);
        ck_assert_msg(counts[MSCX_OP_REDUCE_COPY_SEND_PACKETS] > 0, "%s: the broadcast was not fused",
                      files[i]);
        /* the file records the fusion it went through */
        ck_assert_msg(plan->fused && plan->fuse.ops_after < plan->fuse.ops_before,
                      "%s: fusion stats %u -> %u", files[i], plan->fuse.ops_before, plan->fuse.ops_after);
        mscx_plan_destroy(plan);
    }
}
END_TEST

/* ---- generator: unfused output runs identically ---- */

char *run_plangen(const char *args, const char *tag)
{
    const char *tool = getenv("MSCX_PLANGEN_TOOL");
    ck_assert_msg(tool && *tool, "MSCX_PLANGEN_TOOL is not set (run through meson test)");
    char *path = malloc(512), cmd[2048];
    snprintf(path, 512, "%s/mscx-test-plangen-%d-%s.json", P_tmpdir, (int)getpid(), tag);
    snprintf(cmd, sizeof(cmd), "%s %s -q -o %s", tool, args, path);
    ck_assert_msg(system(cmd) == 0, "failed: %s", cmd);
    return path;
}

struct collect {
    uint8_t *out[16];
    uint64_t bytes;
};

static void fill_cb(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                    uint64_t out_bytes)
{
    (void)ctx;
    (void)out;
    (void)out_bytes;
    mscx_sim_fill(MSCX_DT_FP16, MSCX_REDOP_SUM, 16, rank, iter, 7, in, in_bytes);
}

static void collect_cb(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                       const void *out, uint64_t out_bytes)
{
    struct collect *c = ctx;
    (void)in;
    (void)in_bytes;
    if (iter == 1 && rank < 16) {
        c->bytes = out_bytes;
        c->out[rank] = malloc(out_bytes);
        memcpy(c->out[rank], out, out_bytes);
    }
}

static void run_host(const struct mscx_plan *plan, uint64_t msg, struct collect *c)
{
    struct mscx_hostexec_cfg cfg = {.dtype = MSCX_DT_FP16,
                                    .op = MSCX_REDOP_SUM,
                                    .pkt = MSCX_PKT_LL8,
                                    .iters = 2,
                                    .sched_seed = 11,
                                    .fill = fill_cb,
                                    .collect = collect_cb,
                                    .ctx = c};
    char err[512];
    mscx_coll_sizes(mscx_plan_collective(plan), mscx_plan_nranks(plan), msg, &cfg.in_bytes, &cfg.out_bytes);
    ck_assert_msg(mscx_hostexec_run(plan, &cfg, err, sizeof(err)) == MSCX_OK, "%s: %s", mscx_plan_name(plan),
                  err);
}

START_TEST(test_plangen_nofuse_same)
{
    static const struct {
        const char *args;
        uint64_t msg;
        bool fuses; /* the algorithm has ops the pass folds */
    } algos[] = {
        {"--coll allreduce --algo oneshot --ranks 4 --tbs-per-peer 2 --min-size 1K --max-size 64K",
         3 * 1024 + 6, true},
        {"--coll allreduce --algo oneshot --ranks 8 --blocks 1 --min-size 1K --max-size 4K", 1024 + 6, true},
        {"--coll allreduce --algo oneshot --ranks 8 --blocks 3 --min-size 1K --max-size 4K", 4096 - 2, true},
        {"--coll allreduce --algo twophase --ranks 8 --tbs-per-peer 2 --min-size 1K --max-size 1M", 40000 + 2,
         true},
        {"--coll allreduce --algo twophase --ranks 8 --blocks 8 --min-size 64K+1 --max-size 1M", 70000 + 2,
         true},
        {"--coll allreduce --algo twophase --ranks 4 --blocks 3 --layout cols --min-size 1K --max-size 1M",
         5000 + 2, true},
        {"--coll allreduce --algo hier2 --ranks 8 --ranks-per-node 4 --tbs-per-peer 2 --max-size 2M",
         24000 + 2, true},
        {"--coll allgather --algo allpairs --ranks 4 --tbs-per-peer 2", 4 * 1026, false},
        {"--coll allgather --algo hier2 --ranks 8 --ranks-per-node 4 --tbs-per-peer 2", 8 * 514, false},
        {"--coll reducescatter --algo allpairs --ranks 4 --tbs-per-peer 2", 4 * 1030, false},
        {"--coll reducescatter --algo hier2 --ranks 8 --ranks-per-node 4 --tbs-per-peer 2", 8 * 1030, true},
    };
    for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
        char args[512], err[MSCX_PLAN_ERR_LEN];
        snprintf(args, sizeof(args), "%s --no-fuse", algos[i].args);
        char *pu = run_plangen(args, "unfused"), *pf = run_plangen(algos[i].args, "fused");
        struct mscx_plan *pu_plan = NULL, *pf_plan = NULL, *refused = NULL;
        ck_assert_int_eq(mscx_plan_load(pu, &pu_plan, err, sizeof(err)), MSCX_OK);
        ck_assert_int_eq(mscx_plan_load(pf, &pf_plan, err, sizeof(err)), MSCX_OK);
        unlink(pu);
        unlink(pf);
        free(pu);
        free(pf);

        /* fusing the unfused plan in process gives the shipped shape */
        struct mscx_fuse_stats st;
        ck_assert_int_eq(mscx_plan_fuse(pu_plan, &refused, &st), MSCX_OK);
        uint32_t nu = 0, nf = 0;
        for (uint32_t r = 0; r < pu_plan->nranks; r++) {
            nu += pu_plan->gpus[r].nops;
            nf += pf_plan->gpus[r].nops;
        }
        ck_assert_uint_eq(st.ops_before, nu);
        ck_assert_uint_eq(st.ops_after, nf);
        if (algos[i].fuses)
            ck_assert_msg(nf < nu, "%s: nothing fused (%u ops)", algos[i].args, nu);

        sim_one(pu_plan, algos[i].msg, MSCX_DT_FP16, MSCX_REDOP_SUM, MSCX_PKT_LL8, 9);
        sim_one(pf_plan, algos[i].msg, MSCX_DT_FP16, MSCX_REDOP_SUM, MSCX_PKT_LL8, 9);
        struct collect cu = {0}, cf = {0};
        run_host(pu_plan, algos[i].msg, &cu);
        run_host(pf_plan, algos[i].msg, &cf);
        ck_assert_uint_eq(cu.bytes, cf.bytes);
        for (uint32_t r = 0; r < mscx_plan_nranks(pu_plan); r++) {
            ck_assert_msg(cu.out[r] && cf.out[r], "rank %u not collected", r);
            ck_assert_msg(memcmp(cu.out[r], cf.out[r], cu.bytes) == 0, "%s: rank %u differs fused vs unfused",
                          algos[i].args, r);
            free(cu.out[r]);
            free(cf.out[r]);
        }
        mscx_plan_destroy(refused);
        mscx_plan_destroy(pu_plan);
        mscx_plan_destroy(pf_plan);
    }
}
END_TEST

/* The generator is deterministic and refuses what it cannot build. */
START_TEST(test_plangen_cli)
{
    const char *args =
        "--coll allreduce --algo hier2 --ranks 16 --ranks-per-node 8 --min-size 1K --max-size 64K";
    char *a = run_plangen(args, "a"), *b = run_plangen(args, "b");
    size_t la, lb;
    char *ta = mscx_test_read_file(a, &la), *tb = mscx_test_read_file(b, &lb);
    ck_assert_msg(ta && tb && la == lb && memcmp(ta, tb, la) == 0, "two runs differ");
    /* same as the shipped file */
    size_t ls;
    char *ts = mscx_test_read_file(mscx_test_src("plans/allreduce_n16_rpn8_hier2_1K_64K.json"), &ls);
    ck_assert_msg(ts && ls == la && memcmp(ts, ta, la) == 0,
                  "differs from plans/allreduce_n16_rpn8_hier2_1K_64K.json");
    free(ts);
    free(ta);
    free(tb);
    unlink(a);
    unlink(b);
    free(a);
    free(b);

    const char *tool = getenv("MSCX_PLANGEN_TOOL");
    char cmd[1024];
    static const char *const bad[] = {
        "--coll allreduce --algo hier2 --ranks 8",                      /* one node */
        "--coll allreduce --algo oneshot --ranks 8 --ranks-per-node 4", /* two nodes */
        "--coll allreduce --algo copy --ranks 2",
        "--coll allreduce --algo ring --ranks 2",
        "--coll allreduce --algo oneshot --ranks 6 --ranks-per-node 4",
        "--coll allreduce --algo oneshot --ranks 4 --packet ll32",
        "--coll allreduce --algo oneshot --ranks 4 --min-size 2M --max-size 1M",
        "--coll allreduce --algo twophase --ranks 4 --layout cols", /* --layout needs --blocks */
        "--coll allreduce --algo twophase --ranks 4 --blocks 4 --layout diag",
        "--coll allreduce --algo oneshot --ranks 4 --blocks 4 --layout rows",
        "--coll allgather --algo allpairs --ranks 4 --blocks 2",
        "--coll allreduce --algo oneshot --ranks 4 --blocks 0",
        "--coll allreduce --algo oneshot --ranks 4 --blocks 65",
        "--coll broadcast --algo oneshot --ranks 4 --root 4", /* not a rank */
        "--coll broadcast --algo oneshot --ranks 4 --root -1",
        "--coll allreduce --algo oneshot --ranks 4 --root 1", /* broadcast only */
        "--coll broadcast --algo twophase --ranks 4",
        "--coll broadcast --algo direct --ranks 8 --ranks-per-node 4", /* one node */
        "--coll alltoall --algo allpairs --ranks 4",
        "--coll alltoall --algo direct --ranks 8 --ranks-per-node 4", /* one node */
        "--coll alltoall --algo oneshot --ranks 4 --blocks 2",        /* per peer: --tbs-per-peer */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s %s -o /dev/null 2>/dev/null", tool, bad[i]);
        ck_assert_msg(system(cmd) != 0, "accepted: %s", bad[i]);
    }
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("plans");
    TCase *tc = mscx_tcase("shipped");
    tcase_add_test(tc, test_plans_load);
    tcase_add_test(tc, test_plans_ranges_disjoint);
    tcase_add_test(tc, test_plans_hier_allreduce_ops);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("sim");
    tcase_add_loop_test(tc, test_plans_sim, 0, MAX_PLANS);
    tcase_add_test(tc, test_plans_sim_rank_order);
    tcase_add_test(tc, test_plans_alltoall_uneven);
    tcase_add_test(tc, test_plans_broadcast_roots);
    tcase_add_test(tc, test_sim_broadcast_checks);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("plangen");
    tcase_add_test(tc, test_plangen_nofuse_same);
    tcase_add_test(tc, test_plangen_cli);
    plans_add_twophase_layout_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}
