/* SPDX-License-Identifier: MIT */
/*
 * The GPU executor's one-rank identity decision (onerank.h): which plans
 * launch as one device copy (out of place) or nothing (in place) instead of
 * a kernel. Every plan the decision accepts is run on the host reference
 * executor, which must leave the output equal to the input bit for bit; the
 * plans it refuses include ones whose reference result shows why (a chunk
 * left unwritten, chunks swapped, a slice, a reduction). A seeded corpus of
 * random one-rank plans checks the same on plans nobody wrote by hand.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onerank.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "plan_model.h"
#include "test_common.h"
#include "test_data.h"

#define LAUNCHES 2

/* Operands and ops, JSON with single quotes (turned into double quotes on load). */
#define OPND(t, i, n) "{'type':'" t "','index':" #i ",'size':" #n "}"
#define COPY(s, d) "{'name':'copy','src_buff':[" s "],'dst_buff':[" d "]}"
#define NOP "{'name':'nop'}"
#define SAME(i, n) COPY(OPND("i", i, n), OPND("o", i, n)) /* input chunks onto the same output chunks */
#define COPY2(s0, s1, d0, d1) "{'name':'copy','src_buff':[" s0 "," s1 "],'dst_buff':[" d0 "," d1 "]}"
#define SLICE(s, d, t, n)                                                                                    \
    "{'name':'copy','src_buff':[" s "],'dst_buff':[" d "],'tbg_info':{'tb_id':" #t ",'tbg_size':" #n "}}"
#define REDUCE2(s0, s1, d) "{'name':'re','src_buff':[" s0 "," s1 "],'dst_buff':[" d "]}"

/* Load a plan from JSON text; NULL (with the reason in @p err) when the loader refuses it. */
static struct mscx_plan *load_json(char *buf, char *err, size_t errlen)
{
    struct mscx_plan *plan = NULL;
    for (char *p = buf; *p; p++)
        if (*p == '\'')
            *p = '"';
    if (mscx_plan_load_buffer(buf, strlen(buf), "inline", &plan, err, errlen) != MSCX_OK)
        return NULL;
    return plan;
}

/*
 * A one-rank plan of collective @p coll with @p ic input and @p oc output
 * chunks; @p blocks is the comma-separated list of thread blocks' op lists,
 * each in brackets ("[op,op],[op]").
 */
static struct mscx_plan *plan1(const char *coll, int inplace, int ic, int oc, const char *blocks)
{
    char tbs[8192], buf[16384], err[MSCX_PLAN_ERR_LEN];
    size_t at = 0;
    int id = 0;
    for (const char *p = blocks; *p;) {
        ck_assert(*p == '[');
        const char *q = p + 1;
        for (int depth = 1; depth; q++) {
            ck_assert(*q);
            depth += *q == '[' ? 1 : *q == ']' ? -1 : 0;
        }
        at += (size_t)snprintf(tbs + at, sizeof(tbs) - at,
                               "%s{'id':%d,'ops':%.*s,'channels':[],"
                               "'remote_buffer_refs':[]}",
                               id ? "," : "", id, (int)(q - p), p);
        ck_assert_uint_lt(at, sizeof(tbs));
        id++;
        p = *q == ',' ? q + 1 : q;
    }
    snprintf(
        buf, sizeof(buf),
        "{'name':'t','collective':'%s','protocol':'Simple','inplace':%s,'use_double_scratch_buffer':false,"
        "'buffer_alignment':16,'num_threads_per_block':512,'min_message_size':0,"
        "'max_message_size':1048576,'gpus':[{'id':0,'input_chunks':%d,'output_chunks':%d,"
        "'scratch_chunks':0,'channels':[],'remote_buffers':[],'semaphores':[],'threadblocks':[%s]}]}",
        coll, inplace ? "true" : "false", ic, oc, tbs);
    struct mscx_plan *plan = load_json(buf, err, sizeof(err));
    ck_assert_msg(plan != NULL, "load failed: %s\n%s", err, buf);
    return plan;
}

/* The decision as the GPU executor takes it for a launch with @p op. */
static int onerank_copy(const struct mscx_plan *plan, enum mscx_redop op)
{
    return mscx_gpu_onerank_identity(plan, 0) && mscx_redop_keeps_one_value(op);
}

/*
 * Run @p plan on the host reference executor for @p msg bytes of @p dt with
 * @p op, LAUNCHES launches. @return 1 when after every launch both the output
 * and the input hold exactly the input as it was filled, 0 when some byte
 * differs, -1 when the host executor cannot run this size (the geometry
 * refuses it).
 */
static int host_keeps_input(const struct mscx_plan *plan, uint64_t msg, enum mscx_dtype dt,
                            enum mscx_redop op)
{
    uint64_t in_b, out_b;
    char err[512];
    mscx_coll_sizes(mscx_plan_collective(plan), mscx_plan_nranks(plan), msg, &in_b, &out_b);
    struct mscx_hostexec_cfg cfg = {in_b, out_b, dt, op, MSCX_PKT_LL16, LAUNCHES, 0, 0, NULL, NULL, NULL};
    struct mscx_test_ref ref;
    struct mscx_geom g;
    if (mscx_plan_geom(plan, 0, in_b, out_b, dt, &g, err, sizeof(err)) != MSCX_OK)
        return -1;
    mscx_status_t st = mscx_test_ref_run(plan, &cfg, MSCX_TEST_DATA_ANY, &ref, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s, %llu bytes: host executor: %s", mscx_plan_name(plan),
                  (unsigned long long)msg, err);
    uint8_t *want = malloc(in_b + 1);
    ck_assert_ptr_nonnull(want);
    int same = in_b == out_b;
    for (uint32_t it = 0; it < LAUNCHES && same; it++) {
        mscx_test_data_fill(want, in_b, dt, mscx_test_data_seed(0, it, 0), MSCX_TEST_DATA_ANY);
        same = mscx_test_data_diff(mscx_test_ref_out(&ref, it, 0), want, out_b) == out_b &&
               mscx_test_data_diff(mscx_test_ref_in(&ref, it, 0), want, in_b) == in_b;
    }
    free(want);
    mscx_test_ref_fini(&ref);
    return same;
}

static const uint64_t k_sizes[] = {1024, 4096 + 12, 12288, 65536 + 4, 1048576};
static const enum mscx_dtype k_dtypes[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_INT8, MSCX_DT_FP64};

/* Every shipped one-rank plan is the identity, and the host executor agrees; no other shipped plan is. */
START_TEST(test_shipped_plans)
{
    struct mscx_test_plans it;
    int found[MSCX_COLL_COUNT] = {0};
    mscx_test_plans_begin(&it);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        if (mscx_plan_nranks(plan) != 1) {
            for (uint32_t r = 0; r < mscx_plan_nranks(plan); r++)
                ck_assert_msg(!mscx_gpu_onerank_identity(plan, r), "%s rank %u taken for a one-rank identity",
                              it.path, r);
            continue;
        }
        ck_assert_msg(mscx_gpu_onerank_identity(plan, 0), "%s: a one-rank plan not recognised", it.path);
        found[mscx_plan_collective(plan)]++;
        uint64_t mn, mx;
        mscx_plan_size_range(plan, &mn, &mx);
        for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
            for (size_t d = 0; d < sizeof(k_dtypes) / sizeof(k_dtypes[0]); d++) {
                uint64_t msg = k_sizes[s] / mscx_dtype_size(k_dtypes[d]) * mscx_dtype_size(k_dtypes[d]);
                if (msg < mn || msg > mx || !mscx_plan_supports(plan, k_dtypes[d], MSCX_REDOP_SUM))
                    continue;
                ck_assert_msg(host_keeps_input(plan, msg, k_dtypes[d], MSCX_REDOP_SUM) == 1,
                              "%s, %llu bytes of %s: the host executor's output is not the input", it.path,
                              (unsigned long long)msg, mscx_dtype_name(k_dtypes[d]));
            }
        }
    }
    ck_assert_int_ge(found[MSCX_COLL_ALLREDUCE], 1);
    ck_assert_int_ge(found[MSCX_COLL_ALLGATHER], 1);
    ck_assert_int_ge(found[MSCX_COLL_REDUCESCATTER], 1);
}
END_TEST

/* Written plans that are the identity: the decision takes them, and the host executor agrees. */
START_TEST(test_identity_plans)
{
    static const struct {
        const char *coll;
        int inplace, ic, oc;
        const char *blocks;
    } cases[] = {
        {"allgather", 0, 1, 1, "[" SAME(0, 1) "]"},
        /* three blocks, out of order, nops between */
        {"reducescatter", 0, 3, 3, "[" NOP "," SAME(2, 1) "],[" SAME(0, 1) "," NOP "],[" SAME(1, 1) "]"},
        /* one op of two pairs */
        {"allgather", 0, 4, 4,
         "[" COPY2(OPND("i", 2, 2), OPND("i", 0, 2), OPND("o", 2, 2), OPND("o", 0, 2)) "]"},
        /* overlapping copies of the same bytes */
        {"allgather", 0, 3, 3, "[" SAME(0, 2) "],[" SAME(1, 2) "]"},
        {"allreduce", 1, 1, 1, "[" NOP "]"},
        {"allreduce", 1, 2, 2, "[" NOP "," SAME(0, 2) "]"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct mscx_plan *plan =
            plan1(cases[c].coll, cases[c].inplace, cases[c].ic, cases[c].oc, cases[c].blocks);
        ck_assert_msg(mscx_gpu_onerank_identity(plan, 0), "case %zu not taken", c);
        for (int op = 0; op < MSCX_REDOP_COUNT; op++)
            ck_assert_msg(onerank_copy(plan, (enum mscx_redop)op), "case %zu refused with %s", c,
                          mscx_redop_name((enum mscx_redop)op));
        int ran = 0;
        for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
            int r = host_keeps_input(plan, k_sizes[s], MSCX_DT_FP32, MSCX_REDOP_SUM);
            ck_assert_msg(r != 0, "case %zu, %llu bytes: the host executor's output is not the input", c,
                          (unsigned long long)k_sizes[s]);
            ran += r == 1;
        }
        ck_assert_msg(ran > 0, "case %zu: no size ran", c);
        mscx_plan_destroy(plan);
    }
}
END_TEST

/*
 * Written one-rank plans that are not the identity: refused. Where the host
 * executor can run them, its output differs from the input, which is what
 * the refusal guards against.
 */
START_TEST(test_refused_plans)
{
    static const struct {
        const char *what, *coll;
        int inplace, ic, oc;
        const char *blocks;
        int differs; /* the host executor's output is not the input */
    } cases[] = {
        {"a chunk left unwritten", "allgather", 0, 2, 2, "[" SAME(0, 1) "]", 1},
        {"chunks swapped", "allgather", 0, 2, 2,
         "[" COPY(OPND("i", 0, 1), OPND("o", 1, 1)) "," COPY(OPND("i", 1, 1), OPND("o", 0, 1)) "]", 1},
        {"one slice of two", "allgather", 0, 1, 1, "[" SLICE(OPND("i", 0, 1), OPND("o", 0, 1), 0, 2) "]", 1},
        {"a reduction of the input with itself", "allreduce", 0, 1, 1,
         "[" REDUCE2(OPND("i", 0, 1), OPND("i", 0, 1), OPND("o", 0, 1)) "]", 1},
        {"nothing written out of place", "allgather", 0, 1, 1, "[" NOP "]", 1},
        {"in place, a chunk moved", "allreduce", 1, 2, 2, "[" COPY(OPND("i", 1, 1), OPND("o", 0, 1)) "]", 1},
        {"through the output", "allgather", 0, 2, 2,
         "[" SAME(0, 1) "," COPY(OPND("o", 0, 1), OPND("o", 1, 1)) "]", 1},
        {"input chunks unlike the output's", "allgather", 0, 2, 1, "[" SAME(0, 1) "]", 0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct mscx_plan *plan =
            plan1(cases[c].coll, cases[c].inplace, cases[c].ic, cases[c].oc, cases[c].blocks);
        ck_assert_msg(!mscx_gpu_onerank_identity(plan, 0), "%s: taken for the identity", cases[c].what);
        ck_assert_msg(!onerank_copy(plan, MSCX_REDOP_SUM), "%s: taken for a copy", cases[c].what);
        int ran = 0, differs = 0;
        for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
            int r = host_keeps_input(plan, k_sizes[s], MSCX_DT_FP32, MSCX_REDOP_SUM);
            ran += r >= 0;
            differs += r == 0;
        }
        if (cases[c].differs)
            ck_assert_msg(ran > 0 && differs == ran, "%s: the host executor kept the input at %d of %d sizes",
                          cases[c].what, ran - differs, ran);
        else
            ck_assert_msg(ran == 0, "%s: the geometry was expected to refuse every size", cases[c].what);
        mscx_plan_destroy(plan);
    }
}
END_TEST

/* Plans of more than one rank, and ranks other than 0, are never taken. */
START_TEST(test_refused_ranks)
{
    struct mscx_plan *plan = plan1("allgather", 0, 1, 1, "[" COPY(OPND("i", 0, 1), OPND("o", 0, 1)) "]");
    ck_assert(mscx_gpu_onerank_identity(plan, 0));
    ck_assert(!mscx_gpu_onerank_identity(plan, 1));
    mscx_plan_destroy(plan);
    char buf[8192], err[MSCX_PLAN_ERR_LEN];
    /* two ranks, each copying its own input to its output and nothing else: the collective needs the peer's
     */
    char g[2][1024];
    for (int r = 0; r < 2; r++)
        snprintf(g[r], sizeof(g[r]),
                 "{'id':%d,'input_chunks':1,'output_chunks':1,'scratch_chunks':0,'channels':[],"
                 "'remote_buffers':[],'semaphores':[],'threadblocks':[{'id':0,'ops':[" COPY(
                     OPND("i", 0, 1), OPND("o", 0, 1)) "],'channels':[],'remote_buffer_refs':[]}]}",
                 r);
    snprintf(buf, sizeof(buf),
             "{'name':'t2','collective':'test','protocol':'Simple','inplace':false,"
             "'use_double_scratch_buffer':false,'buffer_alignment':16,'num_threads_per_block':512,"
             "'min_message_size':0,'max_message_size':1048576,'gpus':[%s,%s]}",
             g[0], g[1]);
    plan = load_json(buf, err, sizeof(err));
    ck_assert_msg(plan != NULL, "load failed: %s", err);
    ck_assert(!mscx_gpu_onerank_identity(plan, 0));
    ck_assert(!mscx_gpu_onerank_identity(plan, 1));
    mscx_plan_destroy(plan);
}
END_TEST

/*
 * The operator: sum, prod, min and max of one value are that value; any other
 * (a scaled sum such as NCCL's PreMulSum, which the operator enum does not
 * hold, stands here as the first value past it) must not take the copy.
 */
START_TEST(test_redops)
{
    struct mscx_plan *plan = plan1("allreduce", 1, 1, 1, "[" NOP "]");
    ck_assert(mscx_redop_keeps_one_value(MSCX_REDOP_SUM));
    ck_assert(mscx_redop_keeps_one_value(MSCX_REDOP_PROD));
    ck_assert(mscx_redop_keeps_one_value(MSCX_REDOP_MIN));
    ck_assert(mscx_redop_keeps_one_value(MSCX_REDOP_MAX));
    ck_assert(!mscx_redop_keeps_one_value((enum mscx_redop)MSCX_REDOP_COUNT));
    ck_assert(!mscx_redop_keeps_one_value((enum mscx_redop) - 1));
    ck_assert(onerank_copy(plan, MSCX_REDOP_PROD));
    ck_assert(!onerank_copy(plan, (enum mscx_redop)MSCX_REDOP_COUNT));
    mscx_plan_destroy(plan);
}
END_TEST

/* ---- random one-rank plans ---- */

struct rng {
    uint64_t x;
};

static uint32_t rnd(struct rng *g, uint32_t n)
{
    g->x = mscx_test_data_mix(MSCX_TEST_DATA_ANY, g->x + 0x9e3779b97f4a7c15ull);
    return (uint32_t)(g->x % n);
}

/* An operand of @p type within @p chunks chunks. */
static size_t rnd_opnd(struct rng *g, char *out, size_t len, char type, uint32_t chunks)
{
    uint32_t i = rnd(g, chunks), n = 1 + rnd(g, chunks - i);
    return (size_t)snprintf(out, len, "{'type':'%c','index':%u,'size':%u}", type, i, n);
}

/* One random op: mostly copies (often input to the same output chunks), some nops and reductions. */
static size_t rnd_op(struct rng *g, char *out, size_t len, uint32_t chunks)
{
    uint32_t kind = rnd(g, 10);
    if (kind < 2)
        return (size_t)snprintf(out, len, NOP);
    size_t at = 0;
    char src[128], dst[128];
    if (kind < 4) { /* two input chunks reduced into an output chunk */
        uint32_t a = rnd(g, chunks), b = rnd(g, chunks);
        return (size_t)snprintf(
            out, len,
            "{'name':'re','src_buff':[{'type':'i','index':%u,'size':1},"
            "{'type':'i','index':%u,'size':1}],'dst_buff':[{'type':'o','index':%u,'size':1}]}",
            a, b, rnd(g, chunks));
    }
    uint32_t i = rnd(g, chunks), n = 1 + rnd(g, chunks - i);
    if (rnd(g, 4) != 0) { /* same chunks, input to output */
        snprintf(src, sizeof(src), "{'type':'i','index':%u,'size':%u}", i, n);
        snprintf(dst, sizeof(dst), "{'type':'o','index':%u,'size':%u}", i, n);
    } else {
        rnd_opnd(g, src, sizeof(src), "io"[rnd(g, 2)], chunks);
        rnd_opnd(g, dst, sizeof(dst), 'o', chunks);
    }
    at += (size_t)snprintf(out + at, len - at, "{'name':'copy','src_buff':[%s],'dst_buff':[%s]", src, dst);
    if (rnd(g, 6) == 0) {
        uint32_t size = 2 + rnd(g, 2);
        at += (size_t)snprintf(out + at, len - at, ",'tbg_info':{'tb_id':%u,'tbg_size':%u}", rnd(g, size),
                               size);
    }
    at += (size_t)snprintf(out + at, len - at, "}");
    return at;
}

/*
 * Seeded random one-rank plans (1-4 chunks, 1-3 blocks of 1-4 ops, in and
 * out of place): every one the decision takes leaves the output equal to the
 * input on the host executor. The corpus must hold some of both kinds, and
 * some refused plans whose output differs, or it proves nothing.
 */
START_TEST(test_random_plans)
{
    struct rng g = {20261201};
    int taken = 0, refused_differs = 0, loaded = 0;
    const int nplans = 400;
    for (int p = 0; p < nplans; p++) {
        uint32_t chunks = 1 + rnd(&g, 4), nb = 1 + rnd(&g, 3);
        int inplace = rnd(&g, 3) == 0;
        char blocks[6144];
        size_t at = 0;
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t nops = 1 + rnd(&g, 4);
            at += (size_t)snprintf(blocks + at, sizeof(blocks) - at, "%s{'id':%u,'ops':[", b ? "," : "", b);
            for (uint32_t k = 0; k < nops; k++) {
                if (k)
                    blocks[at++] = ',';
                at += rnd_op(&g, blocks + at, sizeof(blocks) - at, chunks);
            }
            at += (size_t)snprintf(blocks + at, sizeof(blocks) - at,
                                   "],'channels':[],'remote_buffer_refs':[]}");
            ck_assert_uint_lt(at, sizeof(blocks));
        }
        char buf[8192], err[MSCX_PLAN_ERR_LEN];
        snprintf(buf, sizeof(buf),
                 "{'name':'r%d','collective':'test','protocol':'Simple','inplace':%s,"
                 "'use_double_scratch_buffer':false,'buffer_alignment':16,'num_threads_per_block':512,"
                 "'min_message_size':0,'max_message_size':1048576,'gpus':[{'id':0,'input_chunks':%u,"
                 "'output_chunks':%u,'scratch_chunks':0,'channels':[],'remote_buffers':[],'semaphores':[],"
                 "'threadblocks':[%s]}]}",
                 p, inplace ? "true" : "false", chunks, chunks, blocks);
        struct mscx_plan *plan = load_json(buf, err, sizeof(err));
        if (!plan)
            continue; /* the validator refused what the generator made (an input written out of place...) */
        loaded++;
        int ident = mscx_gpu_onerank_identity(plan, 0);
        uint64_t msg = k_sizes[rnd(&g, 3)] / 4 * 4;
        int r = host_keeps_input(plan, msg, MSCX_DT_FP32, MSCX_REDOP_SUM);
        ck_assert_int_ge(r, 0);
        ck_assert_msg(!ident || r == 1,
                      "plan %d taken for the identity, but the host executor's output "
                      "at %llu bytes is not the input:\n%s",
                      p, (unsigned long long)msg, buf);
        taken += ident;
        refused_differs += !ident && r == 0;
        mscx_plan_destroy(plan);
    }
    ck_assert_int_ge(loaded, nplans / 2);
    ck_assert_int_ge(taken, 20);
    ck_assert_int_ge(refused_differs, 20);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("onerank-decision");
    TCase *tc = mscx_tcase("decision");
    tcase_add_test(tc, test_shipped_plans);
    tcase_add_test(tc, test_identity_plans);
    tcase_add_test(tc, test_refused_plans);
    tcase_add_test(tc, test_refused_ranks);
    tcase_add_test(tc, test_redops);
    tcase_add_test(tc, test_random_plans);
    suite_add_tcase(s, tc);
    return s;
}
