/* SPDX-License-Identifier: MIT */
/* The shim's pure parts: the routing decision, node placement, status mapping, the communicator table. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "shim_int.h"
#include "test_common.h"

/* NCCL's fp8 types, named from 2.24 on; an older nccl.h has their values only (a newer client's calls carry
 * them). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define FP8_E4M3 ncclFloat8e4m3
#define FP8_E5M2 ncclFloat8e5m2
#else
#define FP8_E4M3 ((ncclDataType_t)10)
#define FP8_E5M2 ((ncclDataType_t)11)
#endif

static struct shim_route_plan mk_plan(enum mscx_coll coll, uint32_t nranks, uint32_t rpn, uint64_t lo,
                                      uint64_t hi)
{
    struct shim_route_plan p;
    memset(&p, 0, sizeof(p));
    p.coll = coll;
    p.nranks = nranks;
    p.ranks_per_node = rpn;
    p.min_bytes = lo;
    p.max_bytes = hi;
    for (int d = 0; d < MSCX_DT_COUNT; d++)
        for (int o = 0; o < MSCX_REDOP_COUNT; o++)
            p.supports[d][o] = coll == MSCX_COLL_ALLGATHER || coll == MSCX_COLL_BROADCAST ||
                               ((MSCX_DT_REDUCIBLE_MASK >> d) & 1u);
    return p;
}

static struct shim_route_query mk_query(enum mscx_coll coll, uint64_t bytes)
{
    struct shim_route_query q;
    memset(&q, 0, sizeof(q));
    q.coll = coll;
    q.nranks = 8;
    q.ranks_per_node = 8;
    q.msg_bytes = bytes;
    q.dtype = ncclFloat32;
    q.op = ncclSum;
    return q;
}

/* Two allreduce plans [1K, 64K] and [64K+1, 1M], one allgather plan [4K, 32K]. */
static struct shim_route_plan plans[3];
static void setup_plans(void)
{
    plans[0] = mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 1024, 65536);
    plans[1] = mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 65537, 1 << 20);
    plans[2] = mk_plan(MSCX_COLL_ALLGATHER, 8, 8, 4096, 32768);
}

static const struct {
    enum mscx_coll coll;
    uint64_t bytes;
    int pick;
    enum shim_reason why;
} size_table[] = {
    {MSCX_COLL_ALLREDUCE, 0, -1, SHIM_WHY_SIZE},
    {MSCX_COLL_ALLREDUCE, 1023, -1, SHIM_WHY_SIZE},
    {MSCX_COLL_ALLREDUCE, 1024, 0, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, 1025, 0, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, 65535, 0, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, 65536, 0, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, 65537, 1, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, (1 << 20) - 1, 1, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, 1 << 20, 1, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLREDUCE, (1 << 20) + 1, -1, SHIM_WHY_SIZE},
    {MSCX_COLL_ALLGATHER, 4095, -1, SHIM_WHY_SIZE},
    {MSCX_COLL_ALLGATHER, 4096, 2, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLGATHER, 32768, 2, SHIM_WHY_ROUTED},
    {MSCX_COLL_ALLGATHER, 32769, -1, SHIM_WHY_SIZE},
    {MSCX_COLL_REDUCESCATTER, 4096, -1, SHIM_WHY_NO_PLAN},
    {MSCX_COLL_BROADCAST, 4096, -1, SHIM_WHY_NO_PLAN},
};

START_TEST(test_size_boundaries)
{
    setup_plans();
    enum shim_reason why = SHIM_WHY_COUNT;
    struct shim_route_query q = mk_query(size_table[_i].coll, size_table[_i].bytes);
    int pick = shim_route_pick(&q, plans, 3, &why);
    ck_assert_msg(pick == size_table[_i].pick && why == size_table[_i].why,
                  "%s %llu bytes: got plan %d (%s), expected %d (%s)", mscx_coll_name(q.coll),
                  (unsigned long long)q.msg_bytes, pick, shim_reason_name(why), size_table[_i].pick,
                  shim_reason_name(size_table[_i].why));
}
END_TEST

START_TEST(test_dtype_op_layout)
{
    setup_plans();
    enum shim_reason why;
    struct shim_route_query q = mk_query(MSCX_COLL_ALLREDUCE, 4096);
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 0);
    /* ncclAvg of a floating type runs as a scaled sum; of an integer type (NCCL: sum, then divide) never */
    q.op = ncclAvg;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 0);
    q.dtype = ncclInt32;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    q.dtype = ncclFloat32;
    /* a PreMulSum op that ncclRedOpCreatePreMulSum did not make on this communicator never routes */
    q.op = (ncclRedOp_t)ncclNumOps;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    /* max is accepted by the default support table, int64 is not reducible */
    q.op = ncclMax;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 0);
    q.dtype = ncclInt64;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    /* fp8 has no mscx type */
    q.dtype = FP8_E4M3;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_DTYPE);
    /* allgather ignores the op and moves any dtype */
    q = mk_query(MSCX_COLL_ALLGATHER, 4096);
    q.op = ncclAvg;
    q.dtype = ncclInt64;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 2);
    /* a plan narrowed to fp16 sum */
    struct shim_route_plan narrow = mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 0, 1 << 20);
    memset(narrow.supports, 0, sizeof(narrow.supports));
    narrow.supports[MSCX_DT_FP16][MSCX_REDOP_SUM] = 1;
    q = mk_query(MSCX_COLL_ALLREDUCE, 4096);
    ck_assert_int_eq(shim_route_pick(&q, &narrow, 1, &why), -1);
    q.dtype = ncclFloat16;
    ck_assert_int_eq(shim_route_pick(&q, &narrow, 1, &why), 0);
    /* rank count and ranks per node must match */
    q = mk_query(MSCX_COLL_ALLREDUCE, 4096);
    q.nranks = 16;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_NO_PLAN);
    q.nranks = 8;
    q.ranks_per_node = 4;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_NO_PLAN);
}
END_TEST

/* An allgather plan with 4 output chunks per rank section (32 over 8 ranks) routes only element
 * counts its chunks split evenly; the next plan takes the others. */
START_TEST(test_elem_multiple)
{
    struct shim_route_plan two[2] = {mk_plan(MSCX_COLL_ALLGATHER, 8, 8, 0, 1 << 20),
                                     mk_plan(MSCX_COLL_ALLGATHER, 8, 8, 0, 1 << 20)};
    two[0].elem_multiple = 32;
    enum shim_reason why = SHIM_WHY_COUNT;
    struct shim_route_query q = mk_query(MSCX_COLL_ALLGATHER, 32 * 4); /* 32 fp32 */
    ck_assert_int_eq(shim_route_pick(&q, two, 2, &why), 0);
    q.msg_bytes = 40 * 4; /* 40 fp32: 5 per rank over 4 chunks */
    ck_assert_int_eq(shim_route_pick(&q, two, 2, &why), 1);
    ck_assert_int_eq(shim_route_pick(&q, two, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    q.dtype = ncclFloat16; /* the same 160 bytes are 80 halves: not a multiple of 32 either */
    ck_assert_int_eq(shim_route_pick(&q, two, 1, &why), -1);
    q.msg_bytes = 64 * 2;
    ck_assert_int_eq(shim_route_pick(&q, two, 1, &why), 0);
}
END_TEST

START_TEST(test_forced_group_root)
{
    setup_plans();
    enum shim_reason why;
    unsigned mask = 0;
    struct shim_route_query q = mk_query(MSCX_COLL_ALLREDUCE, 4096);
    ck_assert_int_eq(shim_parse_forced("allgather,allreduce", &mask), 0);
    q.forced_mask = mask;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_FORCED);
    ck_assert_int_eq(shim_parse_forced("broadcast", &mask), 0);
    q.forced_mask = mask;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 0);
    ck_assert_int_eq(shim_parse_forced("all", &mask), 0);
    ck_assert_uint_eq(mask, ~0u);
    ck_assert_int_eq(shim_parse_forced("", &mask), 0);
    ck_assert_uint_eq(mask, 0);
    ck_assert_int_eq(shim_parse_forced("allreduce,bogus", &mask), -1);
    q.forced_mask = 0;
    q.group_fallback = 1;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_GROUP);
    struct shim_route_plan bc = mk_plan(MSCX_COLL_BROADCAST, 8, 8, 0, 1 << 20);
    q = mk_query(MSCX_COLL_BROADCAST, 4096);
    ck_assert_int_eq(shim_route_pick(&q, &bc, 1, &why), 0);
    q.root = 3;
    ck_assert_int_eq(shim_route_pick(&q, &bc, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_ROOT);
}
END_TEST

/*
 * Broadcast plans serve their own root: four roots of a 4-rank layout in two
 * size ranges, root 2 covering only the lower one.
 */
START_TEST(test_broadcast_root)
{
    struct shim_route_plan bc[7];
    size_t n = 0;
    for (uint32_t r = 0; r < 4; r++) {
        bc[n] = mk_plan(MSCX_COLL_BROADCAST, 4, 4, 1024, 65536);
        bc[n++].root = r;
        if (r != 2) {
            bc[n] = mk_plan(MSCX_COLL_BROADCAST, 4, 4, 65537, 1 << 20);
            bc[n++].root = r;
        }
    }
    struct shim_route_query q = mk_query(MSCX_COLL_BROADCAST, 4096);
    enum shim_reason why;
    q.nranks = q.ranks_per_node = 4;
    for (int r = 0; r < 4; r++) {
        q.root = r;
        q.msg_bytes = 4096;
        int pick = shim_route_pick(&q, bc, n, &why);
        ck_assert_int_ge(pick, 0);
        ck_assert_int_eq(why, SHIM_WHY_ROUTED);
        ck_assert_uint_eq(bc[pick].root, (uint32_t)r);
        ck_assert_uint_eq(bc[pick].max_bytes, 65536);
        q.msg_bytes = 1 << 20;
        pick = shim_route_pick(&q, bc, n, &why);
        if (r == 2) {
            ck_assert_int_eq(pick, -1);
            ck_assert_int_eq(why, SHIM_WHY_ROOT); /* other roots' plans take the size */
        } else {
            ck_assert_int_ge(pick, 0);
            ck_assert_uint_eq(bc[pick].root, (uint32_t)r);
            ck_assert_uint_eq(bc[pick].min_bytes, 65537);
        }
    }
    /* no plan of the layout takes the size: "size" whatever the root */
    q.root = 1;
    q.msg_bytes = 2 << 20;
    ck_assert_int_eq(shim_route_pick(&q, bc, n, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    /* roots outside the plans' ranks */
    q.msg_bytes = 4096;
    q.root = 4;
    ck_assert_int_eq(shim_route_pick(&q, bc, n, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_ROOT);
    q.root = -1;
    ck_assert_int_eq(shim_route_pick(&q, bc, n, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_ROOT);
    /* the root matters for broadcast only */
    struct shim_route_plan ag = mk_plan(MSCX_COLL_ALLGATHER, 4, 4, 1024, 65536);
    q.coll = MSCX_COLL_ALLGATHER;
    q.root = 3;
    ck_assert_int_eq(shim_route_pick(&q, &ag, 1, &why), 0);
}
END_TEST

/* First matching plan in the given (sorted file name) order wins. */
START_TEST(test_priority)
{
    struct shim_route_plan two[2] = {mk_plan(MSCX_COLL_ALLREDUCE, 2, 2, 0, 100),
                                     mk_plan(MSCX_COLL_ALLREDUCE, 2, 2, 50, 1000)};
    struct shim_route_query q = mk_query(MSCX_COLL_ALLREDUCE, 60);
    enum shim_reason why;
    q.nranks = q.ranks_per_node = 2;
    ck_assert_int_eq(shim_route_pick(&q, two, 2, &why), 0);
    q.msg_bytes = 101;
    ck_assert_int_eq(shim_route_pick(&q, two, 2, &why), 1);
}
END_TEST

/* ---- the size window against the plan loop ---- */

/* As the shim's plan set fills each route from its plan. */
static struct shim_route_plan route_of(const struct mscx_plan *plan)
{
    struct shim_route_plan r;
    memset(&r, 0, sizeof(r));
    r.coll = mscx_plan_collective(plan);
    r.nranks = mscx_plan_nranks(plan);
    r.ranks_per_node = mscx_plan_ranks_per_node(plan);
    mscx_plan_size_range(plan, &r.min_bytes, &r.max_bytes);
    r.elem_multiple = mscx_plan_elem_multiple(plan);
    r.root = mscx_plan_root(plan);
    for (int d = 0; d < MSCX_DT_COUNT; d++)
        for (int o = 0; o < MSCX_REDOP_COUNT; o++)
            r.supports[d][o] = mscx_plan_supports(plan, (enum mscx_dtype)d, (enum mscx_redop)o) != 0;
    return r;
}

#define MAX_ROUTES 256
#define MAX_SIZES 4096

struct sweep {
    unsigned long picks, shortcut, routed;
};

static void add_size(uint64_t *sizes, size_t *n, uint64_t v)
{
    if (*n < MAX_SIZES)
        sizes[(*n)++] = v;
}

/* Sizes around every plan bound, every power of two and three times it, and the extremes. */
static size_t sweep_sizes(const struct shim_route_plan *plans, size_t nplans, uint64_t *sizes)
{
    size_t n = 0;
    static const uint64_t fixed[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, UINT64_MAX - 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        add_size(sizes, &n, fixed[i]);
    for (int k = 5; k < 64; k++) {
        add_size(sizes, &n, 1ull << k);
        add_size(sizes, &n, (1ull << k) + 1);
        add_size(sizes, &n, 3ull << (k - 1));
    }
    static const int64_t near[] = {-8, -4, -2, -1, 0, 1, 2, 4, 8};
    for (size_t i = 0; i < nplans; i++) {
        const uint64_t b[2] = {plans[i].min_bytes, plans[i].max_bytes};
        for (int j = 0; j < 2; j++)
            for (size_t k = 0; k < sizeof(near) / sizeof(near[0]); k++) {
                int64_t d = near[k];
                if ((d >= 0 || b[j] >= (uint64_t)-d) && (d <= 0 || b[j] <= UINT64_MAX - (uint64_t)d))
                    add_size(sizes, &n, b[j] + (uint64_t)d);
            }
    }
    return n;
}

/*
 * Every query of collective @p coll and the given layout against @p plans:
 * the windowed pick must equal the full pick, plan and reason.
 */
static void sweep_coll(const struct shim_route_plan *plans, size_t nplans, enum mscx_coll coll,
                       uint32_t nranks, uint32_t rpn, const uint64_t *sizes, size_t nsizes, struct sweep *sw)
{
    static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, (ncclRedOp_t)ncclNumOps};
    struct shim_route_window w;
    shim_route_window_init(&w, plans, nplans, coll, nranks, rpn);
    struct shim_route_query q;
    memset(&q, 0, sizeof(q));
    q.coll = coll;
    q.nranks = nranks;
    q.ranks_per_node = rpn;
    for (size_t si = 0; si < nsizes; si++)
        for (int dt = 0; dt <= (int)ncclNumTypes; dt++)
            for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++)
                for (int variant = 0; variant < 4; variant++) {
                    q.msg_bytes = sizes[si];
                    q.dtype = (ncclDataType_t)dt;
                    q.op = ops[oi];
                    q.root = variant == 1 ? (int)(si % (nranks + 1)) : 0; /* nranks: out of range */
                    q.group_fallback = variant == 2;
                    q.forced_mask = variant == 3 ? 1u << coll : 1u << ((coll + 1) % MSCX_COLL_COUNT);
                    enum shim_reason full = SHIM_WHY_COUNT, fast = SHIM_WHY_COUNT;
                    int a = shim_route_pick(&q, plans, nplans, &full);
                    int b = shim_route_pick_windowed(&q, plans, nplans, &w, &fast);
                    if (a != b || full != fast)
                        ck_abort_msg("%s n%u rpn%u, %llu bytes, dtype %d, op %d, variant %d: "
                                     "full pick %d (%s), windowed %d (%s)",
                                     mscx_coll_name(coll), nranks, rpn, (unsigned long long)q.msg_bytes, dt,
                                     (int)q.op, variant, a, shim_reason_name(full), b,
                                     shim_reason_name(fast));
                    int outside = q.msg_bytes == 0 || !(w.bins >> (63 - __builtin_clzll(q.msg_bytes)) & 1);
                    sw->picks++;
                    sw->routed += a >= 0;
                    sw->shortcut += variant == 0 && outside;
                }
}

/* The routes a communicator of @p nranks and @p rpn keeps, their max_bytes clamped to @p cap. */
static size_t comm_routes(const struct shim_route_plan *all, size_t nall, uint32_t nranks, uint32_t rpn,
                          uint64_t cap, struct shim_route_plan *out)
{
    size_t n = 0;
    for (size_t i = 0; i < nall; i++)
        if (all[i].nranks == nranks && all[i].ranks_per_node == rpn) {
            out[n] = all[i];
            if (out[n].max_bytes > cap)
                out[n].max_bytes = cap;
            n++;
        }
    return n;
}

START_TEST(test_window_shipped)
{
    static struct shim_route_plan all[MAX_ROUTES], mine[MAX_ROUTES];
    static uint64_t sizes[MAX_SIZES];
    size_t nall = 0;
    struct mscx_test_plans it;
    mscx_test_plans_begin(&it);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        ck_assert_uint_lt(nall, MAX_ROUTES);
        all[nall++] = route_of(plan);
    }
    ck_assert_uint_gt(nall, 0);
    /* every layout of the shipped plans and one that none has; caps as MSCX_SCRATCH_MAX sets them */
    static const uint64_t caps[] = {UINT64_MAX, 1u << 20, 65536, 1536};
    struct sweep sw = {0};
    for (size_t li = 0; li <= nall; li++) {
        uint32_t nranks = li < nall ? all[li].nranks : 3, rpn = li < nall ? all[li].ranks_per_node : 3;
        int seen = 0;
        for (size_t j = 0; j < li && li < nall; j++)
            seen |= all[j].nranks == nranks && all[j].ranks_per_node == rpn;
        if (seen)
            continue;
        for (size_t ci = 0; ci < sizeof(caps) / sizeof(caps[0]); ci++) {
            size_t n = comm_routes(all, nall, nranks, rpn, caps[ci], mine);
            size_t nsizes = sweep_sizes(mine, n, sizes);
            for (int coll = 0; coll < MSCX_COLL_COUNT; coll++)
                sweep_coll(mine, n, (enum mscx_coll)coll, nranks, rpn, sizes, nsizes, &sw);
        }
    }
    /* the whole set, other layouts among the plans, for the first layout and for one that none has */
    size_t nsizes = sweep_sizes(all, nall, sizes);
    for (int coll = 0; coll < MSCX_COLL_COUNT; coll++) {
        sweep_coll(all, nall, (enum mscx_coll)coll, all[0].nranks, all[0].ranks_per_node, sizes, nsizes, &sw);
        sweep_coll(all, nall, (enum mscx_coll)coll, 3, 3, sizes, nsizes, &sw);
    }
    /* both outcomes were exercised: calls decided by the window, and calls routed */
    ck_assert_uint_gt(sw.shortcut, 100000);
    ck_assert_uint_gt(sw.routed, 100000);
}
END_TEST

/* Every root of every shipped broadcast layout routes to the plan of that root. */
START_TEST(test_broadcast_root_shipped)
{
    static struct shim_route_plan all[MAX_ROUTES];
    size_t nall = 0, checked = 0;
    struct mscx_test_plans it;
    mscx_test_plans_begin(&it);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        ck_assert_uint_lt(nall, MAX_ROUTES);
        all[nall++] = route_of(plan);
    }
    for (size_t i = 0; i < nall; i++) {
        if (all[i].coll != MSCX_COLL_BROADCAST)
            continue;
        struct shim_route_query q = mk_query(MSCX_COLL_BROADCAST, all[i].min_bytes + 3);
        enum shim_reason why;
        q.nranks = all[i].nranks;
        q.ranks_per_node = all[i].ranks_per_node;
        q.dtype = ncclUint8;
        q.root = (int)all[i].root;
        int pick = shim_route_pick(&q, all, nall, &why);
        ck_assert_int_ge(pick, 0);
        ck_assert_uint_eq(all[pick].root, all[i].root);
        checked++;
    }
    ck_assert_uint_ge(checked, 42);
}
END_TEST

START_TEST(test_window_edges)
{
    struct shim_route_window w;
    enum shim_reason why;
    /* no plan for the collective: NO_PLAN at every size */
    setup_plans();
    shim_route_window_init(&w, plans, 3, MSCX_COLL_REDUCESCATTER, 8, 8);
    ck_assert_uint_eq(w.nplans, 0);
    struct shim_route_query q = mk_query(MSCX_COLL_REDUCESCATTER, 4096);
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_NO_PLAN);
    /* the allreduce window spans both plans; outside it SIZE, inside the first match */
    shim_route_window_init(&w, plans, 3, MSCX_COLL_ALLREDUCE, 8, 8);
    ck_assert_uint_eq(w.nplans, 2);
    ck_assert_uint_eq(w.bins, (2ull << 20) - (1ull << 10)); /* bins 10 to 20 */
    q = mk_query(MSCX_COLL_ALLREDUCE, (1 << 20) + 1);
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    q.msg_bytes = 0;
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    q.msg_bytes = 65537;
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), 1);
    /* the checks before the plans still win outside the window */
    q.msg_bytes = 1 << 30;
    q.group_fallback = 1;
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_GROUP);
    q.group_fallback = 0;
    q.dtype = FP8_E5M2;
    ck_assert_int_eq(shim_route_pick_windowed(&q, plans, 3, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_DTYPE);
    /* a plan capped below its own minimum: an empty range, but still a plan, so SIZE */
    struct shim_route_plan capped = mk_plan(MSCX_COLL_ALLGATHER, 2, 2, 4096, 1024);
    shim_route_window_init(&w, &capped, 1, MSCX_COLL_ALLGATHER, 2, 2);
    q = mk_query(MSCX_COLL_ALLGATHER, 2048);
    q.nranks = q.ranks_per_node = 2;
    ck_assert_int_eq(shim_route_pick_windowed(&q, &capped, 1, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    /* ranges with a gap between them: a size in the gap's bins fails before the plans */
    struct shim_route_plan gapped[2] = {mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 1024, 2047),
                                        mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 8192 + 1, 16384)};
    shim_route_window_init(&w, gapped, 2, MSCX_COLL_ALLREDUCE, 8, 8);
    ck_assert_uint_eq(w.bins, (1ull << 10) | (1ull << 13) | (1ull << 14));
    q = mk_query(MSCX_COLL_ALLREDUCE, 4096);
    ck_assert_int_eq(shim_route_pick_windowed(&q, gapped, 2, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    q.msg_bytes = 8192; /* in a bin a plan reaches, below its range: the plans say SIZE */
    ck_assert_int_eq(shim_route_pick_windowed(&q, gapped, 2, &w, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_SIZE);
    q.msg_bytes = 16384;
    ck_assert_int_eq(shim_route_pick_windowed(&q, gapped, 2, &w, &why), 1);
    /* a range up to the largest size sets the top bin */
    struct shim_route_plan top = mk_plan(MSCX_COLL_ALLREDUCE, 8, 8, 1ull << 40, UINT64_MAX);
    shim_route_window_init(&w, &top, 1, MSCX_COLL_ALLREDUCE, 8, 8);
    ck_assert_uint_eq(w.bins, ~0ull << 40);
    q.msg_bytes = UINT64_MAX;
    ck_assert_int_eq(shim_route_pick_windowed(&q, &top, 1, &w, &why), 0);
    /* plans of another layout stay out of the window */
    shim_route_window_init(&w, plans, 3, MSCX_COLL_ALLREDUCE, 8, 4);
    ck_assert_uint_eq(w.nplans, 0);
}
END_TEST

START_TEST(test_size_bucket)
{
    for (int b = 0; b < SHIM_NBUCKETS - 1; b++) {
        uint64_t lim = shim_bucket_limit(b);
        ck_assert_int_eq(shim_size_bucket(lim), b);
        ck_assert_int_eq(shim_size_bucket(lim + 1), b + 1);
    }
    /* against the definition: the first bucket whose limit holds the size */
    for (int k = 0; k < 64; k++)
        for (int d = -1; d <= 1; d++) {
            uint64_t bytes = (1ull << k) + (uint64_t)(int64_t)d;
            int want = 0;
            while (want < SHIM_NBUCKETS - 1 && bytes > shim_bucket_limit(want))
                want++;
            ck_assert_msg(shim_size_bucket(bytes) == want, "%llu bytes: bucket %d, expected %d",
                          (unsigned long long)bytes, shim_size_bucket(bytes), want);
        }
    ck_assert_int_eq(shim_size_bucket(UINT64_MAX), SHIM_NBUCKETS - 1);
}
END_TEST

/* ---- the communicator table ---- */

/* @p n keys (multiples of 16, as pointers are) whose lookups start at slot @p home. */
static void keys_at(size_t home, uintptr_t *keys, int n)
{
    uintptr_t k = 0x7f0000001000ull;
    for (int found = 0; found < n; k += 16)
        if (shim_table_home(k) == home)
            keys[found++] = k;
}

static void count_obj(void *obj, void *ctx)
{
    (void)obj;
    (*(int *)ctx)++;
}

static int table_count(void)
{
    int n = 0;
    shim_table_each(count_obj, &n);
    return n;
}

/* Keys sharing a home slot: clearing one slot of the chain hides none of the keys beyond it. */
START_TEST(test_table_chain)
{
    uintptr_t k[5];
    int obj[6];
    void *old = &obj[0];
    keys_at(7, k, 5);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(shim_table_insert(k[i], &obj[i], &old), 0);
        ck_assert_ptr_null(old);
    }
    for (int i = 0; i < 4; i++)
        ck_assert_ptr_eq(shim_table_find(k[i]), &obj[i]);
    ck_assert_ptr_null(shim_table_find(k[4]));
    ck_assert_int_eq(table_count(), 4);
    /* the second key's slot is cleared: the third and fourth, beyond it, are still found */
    ck_assert_ptr_eq(shim_table_remove(k[1]), &obj[1]);
    ck_assert_ptr_null(shim_table_find(k[1]));
    ck_assert_ptr_eq(shim_table_find(k[2]), &obj[2]);
    ck_assert_ptr_eq(shim_table_find(k[3]), &obj[3]);
    ck_assert_ptr_null(shim_table_remove(k[1]));
    /* a new key takes the free slot; an old key mapped again returns its object */
    ck_assert_int_eq(shim_table_insert(k[4], &obj[4], &old), 0);
    ck_assert_ptr_eq(shim_table_find(k[4]), &obj[4]);
    ck_assert_int_eq(shim_table_insert(k[3], &obj[5], &old), 0);
    ck_assert_ptr_eq(old, &obj[3]);
    ck_assert_ptr_eq(shim_table_find(k[3]), &obj[5]);
    ck_assert_int_eq(table_count(), 4);
    const int live[] = {0, 2, 3, 4};
    for (int i = 0; i < 4; i++)
        ck_assert_ptr_nonnull(shim_table_remove(k[live[i]]));
    for (int i = 0; i < 5; i++)
        ck_assert_ptr_null(shim_table_find(k[i]));
    ck_assert_int_eq(table_count(), 0);
}
END_TEST

START_TEST(test_table_full)
{
    static uintptr_t keys[SHIM_TABLE_SIZE + 1];
    static char obj[SHIM_TABLE_SIZE + 1];
    void *old;
    for (size_t i = 0; i <= SHIM_TABLE_SIZE; i++)
        keys[i] = 0x7f0000001000ull + 16 * i;
    for (size_t i = 0; i < SHIM_TABLE_SIZE; i++)
        ck_assert_int_eq(shim_table_insert(keys[i], &obj[i], &old), 0);
    ck_assert_int_eq(shim_table_insert(keys[SHIM_TABLE_SIZE], &obj[SHIM_TABLE_SIZE], &old), -1);
    ck_assert_ptr_null(shim_table_find(keys[SHIM_TABLE_SIZE]));
    for (size_t i = 0; i < SHIM_TABLE_SIZE; i++)
        ck_assert_ptr_eq(shim_table_find(keys[i]), &obj[i]);
    ck_assert_int_eq(table_count(), (int)SHIM_TABLE_SIZE);
    for (size_t i = 0; i < SHIM_TABLE_SIZE; i++)
        ck_assert_ptr_eq(shim_table_remove(keys[i]), &obj[i]);
    ck_assert_int_eq(table_count(), 0);
}
END_TEST

#define CHURN_KEYS 6
#define READERS 3

struct table_reader {
    uintptr_t key;
    int obj;
    atomic_int *stop;
    long lookups, misses;
};

static void *reader_main(void *arg)
{
    struct table_reader *r = arg;
    while (!atomic_load(r->stop)) {
        r->misses += shim_table_find(r->key) != &r->obj;
        r->lookups++;
    }
    return NULL;
}

/*
 * Readers look up their own keys while a writer maps and unmaps other keys of
 * the same home slot, before and after theirs in the chain: no lookup misses.
 */
START_TEST(test_table_concurrent)
{
    uintptr_t k[CHURN_KEYS + READERS];
    int churn_obj[CHURN_KEYS];
    void *old;
    atomic_int stop = 0;
    struct table_reader rd[READERS];
    pthread_t tid[READERS];
    keys_at(100, k, CHURN_KEYS + READERS);
    /* chain: churn keys 0-2, the readers' keys, churn keys 3-5 */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(shim_table_insert(k[i], &churn_obj[i], &old), 0);
    for (int i = 0; i < READERS; i++) {
        rd[i] = (struct table_reader){.key = k[CHURN_KEYS + i], .stop = &stop};
        ck_assert_int_eq(shim_table_insert(rd[i].key, &rd[i].obj, &old), 0);
    }
    for (int i = 3; i < CHURN_KEYS; i++)
        ck_assert_int_eq(shim_table_insert(k[i], &churn_obj[i], &old), 0);
    for (int i = 0; i < READERS; i++)
        ck_assert_int_eq(pthread_create(&tid[i], NULL, reader_main, &rd[i]), 0);
    for (int round = 0; round < 20000; round++) {
        int i = round % CHURN_KEYS;
        ck_assert_ptr_eq(shim_table_remove(k[i]), &churn_obj[i]);
        ck_assert_int_eq(shim_table_insert(k[i], &churn_obj[i], &old), 0);
    }
    atomic_store(&stop, 1);
    long lookups = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(tid[i], NULL);
        ck_assert_msg(rd[i].misses == 0, "reader %d missed its key %ld times in %ld lookups", i, rd[i].misses,
                      rd[i].lookups);
        lookups += rd[i].lookups;
    }
    ck_assert_int_gt(lookups, 0);
    for (int i = 0; i < CHURN_KEYS + READERS; i++)
        ck_assert_ptr_nonnull(shim_table_remove(k[i]));
}
END_TEST

static void set_ids(char *ids, const char *const *names, uint32_t n)
{
    memset(ids, 0, (size_t)n * SHIM_HOSTID_LEN);
    for (uint32_t r = 0; r < n; r++)
        strcpy(ids + (size_t)r * SHIM_HOSTID_LEN, names[r]);
}

START_TEST(test_topo)
{
    char ids[8 * SHIM_HOSTID_LEN];
    const char *one[] = {"a", "a", "a", "a"};
    const char *two[] = {"a", "a", "b", "b"};
    const char *uneven[] = {"a", "a", "a", "b"};
    const char *interleaved[] = {"a", "b", "a", "b"};
    const char *back[] = {"a", "a", "b", "b", "a", "a"};
    set_ids(ids, one, 4);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 4), 4);
    set_ids(ids, two, 4);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 4), 2);
    set_ids(ids, uneven, 4);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 4), 0);
    set_ids(ids, interleaved, 4);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 4), 0);
    set_ids(ids, back, 6);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 6), 0);
    /* MSCX_VIRTUAL_NODES splits one host into contiguous blocks */
    for (uint32_t r = 0; r < 8; r++)
        shim_topo_host_id(r, 8, 2, ids + (size_t)r * SHIM_HOSTID_LEN);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 8), 4);
    for (uint32_t r = 0; r < 8; r++)
        shim_topo_host_id(r, 8, 0, ids + (size_t)r * SHIM_HOSTID_LEN);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 8), 8);
    /* a split that does not divide the ranks is ignored, with one warning naming the variable */
    mscx_test_allow_warn("MSCX_VIRTUAL_NODES=4 does not divide the 6 ranks");
    for (uint32_t r = 0; r < 6; r++)
        shim_topo_host_id(r, 6, 4, ids + (size_t)r * SHIM_HOSTID_LEN);
    ck_assert_uint_eq(shim_topo_ranks_per_node(ids, 6), 6);
    ck_assert_int_eq(mscx_test_warn_count(), 1);
}
END_TEST

START_TEST(test_maps)
{
    ck_assert_int_eq(shim_status_to_nccl(MSCX_OK), ncclSuccess);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_INPROGRESS), ncclInProgress);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_ERR_INVALID_ARG), ncclInvalidArgument);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_ERR_CUDA), ncclUnhandledCudaError);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_ERR_REMOTE), ncclRemoteError);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_ERR_TIMEOUT), ncclSystemError);
    ck_assert_int_eq(shim_status_to_nccl(MSCX_ERR_INTERNAL), ncclInternalError);
    ck_assert_int_eq(shim_size_bucket(0), 0);
    ck_assert_int_eq(shim_size_bucket(1024), 0);
    ck_assert_int_eq(shim_size_bucket(1025), 1);
    ck_assert_int_eq(shim_size_bucket(UINT64_MAX), SHIM_NBUCKETS - 1);
    enum mscx_dtype dt;
    enum mscx_redop op;
    ck_assert_int_eq(shim_dtype_map(ncclBfloat16, &dt), 0);
    ck_assert_int_eq(dt, MSCX_DT_BF16);
    ck_assert_int_eq(shim_redop_map(ncclMin, &op), 0);
    ck_assert_int_eq(op, MSCX_REDOP_MIN);
    ck_assert_uint_eq(shim_dtype_bytes(ncclBfloat16), 2);
    ck_assert_uint_eq(shim_dtype_bytes(ncclUint64), 8);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("shim-route");
    TCase *tc = mscx_tcase("route");
    tcase_add_loop_test(tc, test_size_boundaries, 0, (int)(sizeof(size_table) / sizeof(size_table[0])));
    tcase_add_test(tc, test_dtype_op_layout);
    tcase_add_test(tc, test_elem_multiple);
    tcase_add_test(tc, test_forced_group_root);
    tcase_add_test(tc, test_broadcast_root);
    tcase_add_test(tc, test_broadcast_root_shipped);
    tcase_add_test(tc, test_priority);
    tcase_add_test(tc, test_window_shipped);
    tcase_add_test(tc, test_window_edges);
    tcase_add_test(tc, test_size_bucket);
    tcase_add_test(tc, test_table_chain);
    tcase_add_test(tc, test_table_full);
    tcase_add_test(tc, test_table_concurrent);
    tcase_add_test(tc, test_topo);
    tcase_add_test(tc, test_maps);
    suite_add_tcase(s, tc);
    return s;
}
