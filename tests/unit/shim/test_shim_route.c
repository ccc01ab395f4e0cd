/* SPDX-License-Identifier: MIT */
/* The shim's pure parts: the routing decision, node placement, status mapping. */
#include <string.h>

#include "shim_int.h"
#include "test_common.h"

static struct shim_route_plan mk_plan(enum mscx_coll coll, uint32_t nranks, uint32_t rpn, uint64_t lo, uint64_t hi)
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
    /* ncclAvg and PreMulSum never route */
    q.op = ncclAvg;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    q.op = (ncclRedOp_t)ncclNumOps; /* first dynamic (PreMulSum) op */
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    /* max is accepted by the default support table, int64 is not reducible */
    q.op = ncclMax;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), 0);
    q.dtype = ncclInt64;
    ck_assert_int_eq(shim_route_pick(&q, plans, 3, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    /* fp8 has no mscx type */
    q.dtype = ncclFloat8e4m3;
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
    q.in_group = 1;
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
    tcase_add_test(tc, test_priority);
    tcase_add_test(tc, test_topo);
    tcase_add_test(tc, test_maps);
    suite_add_tcase(s, tc);
    return s;
}
