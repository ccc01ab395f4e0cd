/* SPDX-License-Identifier: MIT */
/*
 * The shim's mapping of a call's reduction op (redop_table.c): ncclAvg of
 * the floating types as a sum scaled by NCCL's 1/nranks, integer averages
 * to NCCL, PreMulSum ops per (communicator, op handle) and datatype, and the
 * routing decision that follows from it.
 */
#include <string.h>

#include "shim_int.h"
#include "test_common.h"

/* NCCL's fp8 e4m3 type, named from 2.24 on; an older nccl.h has only its value (a newer client's calls carry
 * it). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define FP8_E4M3 ncclFloat8e4m3
#else
#define FP8_E4M3 ((ncclDataType_t)10)
#endif

/* Two communicators, as handles only. */
static int comm_a_obj, comm_b_obj;
#define COMM_A ((ncclComm_t)&comm_a_obj)
#define COMM_B ((ncclComm_t)&comm_b_obj)

static struct mscx_scale host_scale(uint64_t bits)
{
    struct mscx_scale s = {MSCX_SCALE_HOST, bits, NULL};
    return s;
}

START_TEST(test_builtin_and_avg)
{
    enum mscx_redop op = MSCX_REDOP_COUNT;
    struct mscx_scale s = host_scale(123);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, ncclMax, ncclInt32, &op, &s), 0);
    ck_assert_int_eq(op, MSCX_REDOP_MAX);
    ck_assert_int_eq(s.kind, MSCX_SCALE_NONE);
    static const ncclDataType_t fl[] = {ncclFloat32, ncclFloat16, ncclBfloat16};
    static const enum mscx_dtype mf[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16};
    for (int i = 0; i < 3; i++)
        for (uint32_t n = 2; n <= 16; n++) {
            op = MSCX_REDOP_COUNT;
            ck_assert_int_eq(shim_redop_resolve(COMM_A, n, ncclAvg, fl[i], &op, &s), 0);
            ck_assert_int_eq(op, MSCX_REDOP_SUM);
            ck_assert_int_eq(s.kind, MSCX_SCALE_HOST);
            ck_assert_uint_eq(s.value_bits, mscx_scale_avg(mf[i], n).value_bits);
        }
    /* one rank: x * 1 is x, so the average is the plain sum */
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 1, ncclAvg, ncclBfloat16, &op, &s), 0);
    ck_assert_int_eq(op, MSCX_REDOP_SUM);
    ck_assert_int_eq(s.kind, MSCX_SCALE_NONE);
    /* integers: NCCL sums, then divides; fp64 and fp8: not a type the executors scale */
    static const ncclDataType_t other[] = {ncclInt32, ncclUint32, ncclInt8, ncclInt64, ncclFloat64, FP8_E4M3};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, ncclAvg, other[i], &op, &s), -1);
}
END_TEST

START_TEST(test_premulsum_table)
{
    enum mscx_redop op;
    struct mscx_scale s, half = host_scale(0x3555), dev = {MSCX_SCALE_DEVICE, 0, &comm_a_obj};
    ncclRedOp_t p0 = (ncclRedOp_t)ncclNumOps, p1 = (ncclRedOp_t)(ncclNumOps + 1);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclFloat16, &op, &s), -1); /* not made yet */
    ck_assert_int_eq(shim_redop_record(COMM_A, p0, ncclFloat16, &half), 0);
    ck_assert_int_eq(shim_redop_record(COMM_A, p1, ncclFloat32, &dev), 0);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclFloat16, &op, &s), 0);
    ck_assert_int_eq(op, MSCX_REDOP_SUM);
    ck_assert_int_eq(s.kind, MSCX_SCALE_HOST);
    ck_assert_uint_eq(s.value_bits, 0x3555);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p1, ncclFloat32, &op, &s), 0);
    ck_assert_int_eq(s.kind, MSCX_SCALE_DEVICE);
    ck_assert_ptr_eq(s.dev_ptr, &comm_a_obj);
    /* made for fp16, used with fp32 or bf16: NCCL's to answer */
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclFloat32, &op, &s), -1);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclBfloat16, &op, &s), -1);
    /* another communicator's handle of the same value is another op */
    ck_assert_int_eq(shim_redop_resolve(COMM_B, 4, p0, ncclFloat16, &op, &s), -1);
    /* destroyed */
    shim_redop_forget(COMM_A, p0);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclFloat16, &op, &s), -1);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p1, ncclFloat32, &op, &s), 0);
    shim_redop_forget(COMM_A, p1);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p1, ncclFloat32, &op, &s), -1);
    /* made again: the new scalar */
    ck_assert_int_eq(shim_redop_record(COMM_A, p0, ncclFloat16, &half), 0);
    struct mscx_scale other = host_scale(0x3c00);
    ck_assert_int_eq(shim_redop_record(COMM_A, p0, ncclFloat16, &other), 0);
    ck_assert_int_eq(shim_redop_resolve(COMM_A, 4, p0, ncclFloat16, &op, &s), 0);
    ck_assert_uint_eq(s.value_bits, 0x3c00);
    shim_redop_forget(COMM_A, p0);
}
END_TEST

/* A full table keeps what it has and refuses the rest, which then goes to NCCL; forgetting frees room. */
START_TEST(test_table_full)
{
    enum mscx_redop op;
    struct mscx_scale s, one = host_scale(0x3f800000u);
    int kept = 0;
    while (shim_redop_record(COMM_B, (ncclRedOp_t)(ncclNumOps + kept), ncclFloat32, &one) == 0)
        ck_assert_int_lt(++kept, 100000);
    ck_assert_int_ge(kept, 64);
    ck_assert_int_eq(shim_redop_resolve(COMM_B, 2, (ncclRedOp_t)(ncclNumOps + kept), ncclFloat32, &op, &s),
                     -1);
    ck_assert_int_eq(
        shim_redop_resolve(COMM_B, 2, (ncclRedOp_t)(ncclNumOps + kept - 1), ncclFloat32, &op, &s), 0);
    shim_redop_forget(COMM_B, (ncclRedOp_t)ncclNumOps);
    ck_assert_int_eq(shim_redop_record(COMM_B, (ncclRedOp_t)(ncclNumOps + kept), ncclFloat32, &one), 0);
    for (int i = 1; i <= kept; i++)
        shim_redop_forget(COMM_B, (ncclRedOp_t)(ncclNumOps + i));
    ck_assert_int_eq(shim_redop_resolve(COMM_B, 2, (ncclRedOp_t)(ncclNumOps + 1), ncclFloat32, &op, &s), -1);
}
END_TEST

/* A communicator that ends takes its ops along; another communicator's stay. */
START_TEST(test_forget_comm)
{
    enum mscx_redop op;
    struct mscx_scale s, one = host_scale(0x3f800000u);
    for (int i = 0; i < 300; i++) {
        ck_assert_int_eq(shim_redop_record(COMM_A, (ncclRedOp_t)(ncclNumOps + i), ncclFloat32, &one), 0);
        if (i % 3 == 0)
            ck_assert_int_eq(shim_redop_record(COMM_B, (ncclRedOp_t)(ncclNumOps + i), ncclFloat32, &one), 0);
    }
    shim_redop_forget_comm(COMM_A);
    for (int i = 0; i < 300; i++) {
        ck_assert_int_eq(shim_redop_resolve(COMM_A, 2, (ncclRedOp_t)(ncclNumOps + i), ncclFloat32, &op, &s),
                         -1);
        ck_assert_int_eq(shim_redop_resolve(COMM_B, 2, (ncclRedOp_t)(ncclNumOps + i), ncclFloat32, &op, &s),
                         i % 3 == 0 ? 0 : -1);
    }
    shim_redop_forget_comm(COMM_B);
    ck_assert_int_eq(shim_redop_resolve(COMM_B, 2, (ncclRedOp_t)ncclNumOps, ncclFloat32, &op, &s), -1);
    /* the table is empty again: it takes as many as before */
    for (int i = 0; i < 300; i++)
        ck_assert_int_eq(shim_redop_record(COMM_B, (ncclRedOp_t)(ncclNumOps + i), ncclFloat32, &one), 0);
    shim_redop_forget_comm(COMM_B);
}
END_TEST

/* Random makes and destroys against a model: every op kept is found with its own scalar, and no other. */
START_TEST(test_table_model)
{
    enum { NOPS = 600 };
    static uint64_t model[2][NOPS]; /* 0: not kept, else the scalar's bits + 1 */
    uint64_t x = 0x243f6a8885a308d3ull;
    enum mscx_redop op;
    struct mscx_scale s;
    for (int step = 0; step < 20000; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int c = (int)(x & 1), k = (int)((x >> 1) % NOPS);
        ncclComm_t comm = c ? COMM_B : COMM_A;
        ncclRedOp_t h = (ncclRedOp_t)(ncclNumOps + k);
        if ((x >> 20) % 3 == 0) {
            shim_redop_forget(comm, h);
            model[c][k] = 0;
        } else {
            struct mscx_scale v = host_scale((x >> 24) & 0xffffffffu);
            if (shim_redop_record(comm, h, ncclFloat32, &v) == 0)
                model[c][k] = v.value_bits + 1;
        }
        if (step % 97 == 0)
            for (int cc = 0; cc < 2; cc++)
                for (int kk = 0; kk < NOPS; kk++) {
                    int r = shim_redop_resolve(cc ? COMM_B : COMM_A, 2, (ncclRedOp_t)(ncclNumOps + kk),
                                               ncclFloat32, &op, &s);
                    ck_assert_int_eq(r, model[cc][kk] ? 0 : -1);
                    if (r == 0)
                        ck_assert_uint_eq(s.value_bits + 1, model[cc][kk]);
                }
    }
    for (int cc = 0; cc < 2; cc++)
        for (int kk = 0; kk < NOPS; kk++)
            shim_redop_forget(cc ? COMM_B : COMM_A, (ncclRedOp_t)(ncclNumOps + kk));
}
END_TEST

/* Routing: the plan's support of the sum decides; the op reason names what cannot run. */
START_TEST(test_route)
{
    struct shim_route_plan p;
    memset(&p, 0, sizeof(p));
    p.coll = MSCX_COLL_REDUCESCATTER;
    p.nranks = 4;
    p.ranks_per_node = 4;
    p.min_bytes = 1024;
    p.max_bytes = 1 << 20;
    p.supports[MSCX_DT_FP32][MSCX_REDOP_SUM] = 1;
    p.supports[MSCX_DT_BF16][MSCX_REDOP_MAX] = 1; /* not the sum */
    p.supports[MSCX_DT_INT32][MSCX_REDOP_SUM] = 1;
    struct shim_route_query q;
    memset(&q, 0, sizeof(q));
    q.coll = MSCX_COLL_REDUCESCATTER;
    q.nranks = 4;
    q.ranks_per_node = 4;
    q.msg_bytes = 4096;
    q.dtype = ncclFloat32;
    q.op = ncclAvg;
    q.comm = COMM_A;
    enum shim_reason why;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), 0);
    q.dtype = ncclBfloat16;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    q.dtype = ncclInt32; /* the plan sums int32, but the average of integers is not a scaled sum */
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    struct mscx_scale s = host_scale(0x3e800000u);
    ncclRedOp_t pm = (ncclRedOp_t)(ncclNumOps + 3);
    ck_assert_int_eq(shim_redop_record(COMM_A, pm, ncclFloat32, &s), 0);
    q.op = pm;
    q.dtype = ncclFloat32;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), 0);
    q.comm = COMM_B;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    shim_redop_forget(COMM_A, pm);
    q.comm = COMM_A;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), -1);
    ck_assert_int_eq(why, SHIM_WHY_OP);
    /* allgather ignores the op */
    p.coll = q.coll = MSCX_COLL_ALLGATHER;
    p.supports[MSCX_DT_FP32][MSCX_REDOP_SUM] = 1;
    ck_assert_int_eq(shim_route_pick(&q, &p, 1, &why), 0);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("shim-redop");
    TCase *tc = mscx_tcase("redop");
    tcase_add_test(tc, test_builtin_and_avg);
    tcase_add_test(tc, test_premulsum_table);
    tcase_add_test(tc, test_table_full);
    tcase_add_test(tc, test_forget_comm);
    tcase_add_test(tc, test_table_model);
    tcase_add_test(tc, test_route);
    suite_add_tcase(s, tc);
    return s;
}
