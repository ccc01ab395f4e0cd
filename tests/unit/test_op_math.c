/* SPDX-License-Identifier: MIT */
/*
 * Min and max against NCCL's definition (fminf/fmaxf for fp32, __hmin/__hmax
 * for fp16 and bf16, plain comparisons for integers): every reducible dtype,
 * both ops, every pair of special values (NaNs with and without payload and
 * sign, signed zeros, infinities, ordinary values), then folds in every
 * order, then the host executor on shipped plans with one rank's input NaN.
 *
 * The oracle here is written apart from op_math.h: each value gets a rank in
 * the total order -inf < ... < -0 < +0 < ... < +inf; min keeps the lowest,
 * max the highest, NaNs are left out, and only NaNs give NCCL's canonical
 * NaN (0x7fffffff, 0x7fff).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "op_math.h"
#include "test_common.h"

/* A special value: its bits and its place in the order (NAN_RANK for a NaN). */
struct sval {
    uint32_t bits;
    int order;
};
#define NAN_RANK 1000

static const struct sval f32_vals[] = {
    {0x7fc00000u, NAN_RANK}, {0xffc00000u, NAN_RANK}, {0x7fa00001u, NAN_RANK}, {0x7fffffffu, NAN_RANK},
    {0xff800000u, 0},        {0xbf800000u, 1},        {0x80000001u, 2},        {0x80000000u, 3},
    {0x00000000u, 4},        {0x00000001u, 5},        {0x3f800000u, 6},        {0x7f7fffffu, 7},
    {0x7f800000u, 8},
};
static const struct sval f16_vals[] = {
    {0x7e00u, NAN_RANK}, {0xfe00u, NAN_RANK}, {0x7c01u, NAN_RANK}, {0x7fffu, NAN_RANK}, {0xfc00u, 0},
    {0xbc00u, 1},        {0x8001u, 2},        {0x8000u, 3},        {0x0000u, 4},        {0x0001u, 5},
    {0x3c00u, 6},        {0x7bffu, 7},        {0x7c00u, 8},
};
static const struct sval bf16_vals[] = {
    {0x7fc0u, NAN_RANK}, {0xffc0u, NAN_RANK}, {0x7f81u, NAN_RANK}, {0x7fffu, NAN_RANK}, {0xff80u, 0},
    {0xbf80u, 1},        {0x8001u, 2},        {0x8000u, 3},        {0x0000u, 4},        {0x0001u, 5},
    {0x3f80u, 6},        {0x7f7fu, 7},        {0x7f80u, 8},
};
static const struct sval i32_vals[] = {
    {0x80000000u, 0}, {0xffffffffu, 1}, {0x00000000u, 2}, {0x00000001u, 3}, {0x7fffffffu, 4},
};
static const struct sval u32_vals[] = {
    {0x00000000u, 0}, {0x00000001u, 1}, {0x7fffffffu, 2}, {0x80000000u, 3}, {0xffffffffu, 4},
};

struct dt_vals {
    enum mscx_dtype dt;
    const struct sval *v;
    size_t n;
    uint32_t nan;
};

static const struct dt_vals dts[] = {
    {MSCX_DT_FP32, f32_vals, sizeof(f32_vals) / sizeof(f32_vals[0]), 0x7fffffffu},
    {MSCX_DT_FP16, f16_vals, sizeof(f16_vals) / sizeof(f16_vals[0]), 0x7fffu},
    {MSCX_DT_BF16, bf16_vals, sizeof(bf16_vals) / sizeof(bf16_vals[0]), 0x7fffu},
    {MSCX_DT_INT32, i32_vals, sizeof(i32_vals) / sizeof(i32_vals[0]), 0},
    {MSCX_DT_UINT32, u32_vals, sizeof(u32_vals) / sizeof(u32_vals[0]), 0},
};

/* NCCL's answer for a list of values. */
static uint32_t oracle(const struct dt_vals *d, enum mscx_redop op, const struct sval *const *x, size_t n)
{
    const struct sval *best = NULL;
    for (size_t i = 0; i < n; i++) {
        if (x[i]->order == NAN_RANK)
            continue;
        if (best == NULL || (op == MSCX_REDOP_MIN ? x[i]->order < best->order : x[i]->order > best->order))
            best = x[i];
    }
    return best ? best->bits : d->nan;
}

/* The executors' answer: fold in list order from the first operand, as both executors do. */
static uint32_t fold(const struct dt_vals *d, enum mscx_redop op, const struct sval *const *x, size_t n)
{
    uint32_t esize = mscx_dtype_size(d->dt);
    uint8_t acc[4] = {0}, b[4] = {0};
    memcpy(acc, &x[0]->bits, esize); /* little-endian: the low bytes */
    for (size_t i = 1; i < n; i++) {
        memcpy(b, &x[i]->bits, esize);
        mscx_reduce_bytes(d->dt, op, acc, b, esize);
    }
    uint32_t r = 0;
    memcpy(&r, acc, esize);
    return r;
}

/* Every pair, in both orders, through the byte fold and through the word (both lanes for 16-bit types). */
START_TEST(test_minmax_pairs)
{
    const struct dt_vals *d = &dts[_i / 2];
    enum mscx_redop op = (_i & 1) ? MSCX_REDOP_MAX : MSCX_REDOP_MIN;
    int checked = 0;
    for (size_t i = 0; i < d->n; i++) {
        for (size_t j = 0; j < d->n; j++) {
            const struct sval *x[2] = {&d->v[i], &d->v[j]};
            uint32_t want = oracle(d, op, x, 2);
            uint32_t got = fold(d, op, x, 2);
            ck_assert_msg(got == want, "%s %s(0x%x, 0x%x): got 0x%x, NCCL 0x%x", mscx_dtype_name(d->dt),
                          mscx_redop_name(op), x[0]->bits, x[1]->bits, got, want);
            if (mscx_dtype_size(d->dt) == 2) { /* the other lane of a word holds another pair */
                uint32_t a = x[0]->bits | (d->v[j].bits << 16), b = x[1]->bits | (d->v[i].bits << 16);
                uint32_t w = mscx_reduce_word(d->dt, op, a, b);
                ck_assert_uint_eq(w & 0xffffu, want);
                ck_assert_uint_eq(w >> 16,
                                  oracle(d, op, (const struct sval *const[]){&d->v[j], &d->v[i]}, 2));
            }
            checked++;
        }
    }
    ck_assert_int_eq(checked, (int)(d->n * d->n));
}
END_TEST

/* Folds of four values in every order give NCCL's answer, whichever position holds a NaN. */
START_TEST(test_minmax_fold_orders)
{
    const struct dt_vals *d = &dts[_i / 2];
    enum mscx_redop op = (_i & 1) ? MSCX_REDOP_MAX : MSCX_REDOP_MIN;
    size_t n = d->n;
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < n; b += 2)
            for (size_t c = 1; c < n; c += 3)
                for (size_t e = 0; e < n; e += 5) {
                    const struct sval *x[4] = {&d->v[a], &d->v[b], &d->v[c], &d->v[e]};
                    uint32_t want = oracle(d, op, x, 4);
                    static const int perm[6][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2},
                                                   {2, 0, 3, 1}, {1, 0, 3, 2}, {3, 0, 2, 1}};
                    for (int p = 0; p < 6; p++) {
                        const struct sval *y[4] = {x[perm[p][0]], x[perm[p][1]], x[perm[p][2]],
                                                   x[perm[p][3]]};
                        ck_assert_msg(fold(d, op, y, 4) == want, "%s %s order %d of 0x%x 0x%x 0x%x 0x%x",
                                      mscx_dtype_name(d->dt), mscx_redop_name(op), p, x[0]->bits, x[1]->bits,
                                      x[2]->bits, x[3]->bits);
                    }
                }
}
END_TEST

/* A NaN sum or product is the canonical NaN, as the GPU's arithmetic makes it. */
START_TEST(test_nan_arith_canonical)
{
    ck_assert_uint_eq(mscx_reduce_word(MSCX_DT_FP32, MSCX_REDOP_SUM, 0xffc00001u, 0x3f800000u), 0x7fffffffu);
    ck_assert_uint_eq(mscx_reduce_word(MSCX_DT_FP32, MSCX_REDOP_SUM, 0x7f800000u, 0xff800000u), 0x7fffffffu);
    ck_assert_uint_eq(mscx_reduce_word(MSCX_DT_FP32, MSCX_REDOP_PROD, 0x00000000u, 0x7f800000u), 0x7fffffffu);
    ck_assert_uint_eq(mscx_reduce16(MSCX_DT_FP16, MSCX_REDOP_SUM, 0xfe00u, 0x3c00u), 0x7fffu);
    ck_assert_uint_eq(mscx_reduce16(MSCX_DT_BF16, MSCX_REDOP_PROD, 0xffc1u, 0x3f80u), 0x7fffu);
    ck_assert_uint_eq(mscx_reduce16(MSCX_DT_FP16, MSCX_REDOP_SUM, 0x3c00u, 0x3c00u), 0x4000u); /* 1 + 1 */
}
END_TEST

/* ---- the host executor on shipped plans: inputs rank + 1, one rank NaN ---- */

struct nan_run {
    enum mscx_dtype dt;
    uint32_t nan_rank;
    uint8_t *out[16];
    uint64_t out_bytes;
};

static uint32_t value_bits(enum mscx_dtype dt, float f)
{
    if (dt == MSCX_DT_FP32)
        return mscx_f32_bits(f);
    return dt == MSCX_DT_FP16 ? mscx_f32_to_f16(f) : mscx_f32_to_bf16(f);
}

static void nan_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct nan_run *r = ctx;
    (void)iter;
    (void)out;
    (void)out_bytes;
    uint32_t es = mscx_dtype_size(r->dt);
    static const uint32_t nan[3] = {0x7fc00000u, 0x7e00u, 0x7fc0u}; /* fp32, fp16, bf16 */
    uint32_t v = rank == r->nan_rank ? nan[r->dt] : value_bits(r->dt, (float)(rank + 1));
    for (uint64_t e = 0; e + es <= in_bytes; e += es)
        memcpy((uint8_t *)in + e, &v, es);
}

static void nan_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct nan_run *r = ctx;
    (void)iter;
    (void)in;
    (void)in_bytes;
    memcpy(r->out[rank], out, out_bytes);
}

static const char *const nan_plans[] = {"plans/allreduce_n2_rpn2_oneshot_1K_16K.json",
                                        "plans/allreduce_n4_rpn4_twophase_16K_1M.json",
                                        "plans/allreduce_n8_rpn8_oneshot_1K_16K.json"};

START_TEST(test_hostexec_nan_rank)
{
    static const enum mscx_dtype fdts[3] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16};
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    ck_assert_int_eq(mscx_plan_load(mscx_test_src(nan_plans[_i]), &plan, err, sizeof(err)), MSCX_OK);
    uint32_t n = mscx_plan_nranks(plan);
    uint64_t lo, hi, msg, in_b, out_b;
    mscx_plan_size_range(plan, &lo, &hi);
    msg = ((lo > 4096 ? lo : 4096) + 1023) / 1024 * 1024; /* whole elements of every dtype */
    ck_assert_uint_le(msg, hi);
    mscx_coll_sizes(MSCX_COLL_ALLREDUCE, n, msg, &in_b, &out_b);
    for (int di = 0; di < 3; di++) {
        for (int oi = 0; oi < 2; oi++) {
            enum mscx_redop op = oi ? MSCX_REDOP_MAX : MSCX_REDOP_MIN;
            for (uint32_t nr = 0; nr < n; nr++) {
                struct nan_run r = {fdts[di], nr, {0}, out_b};
                for (uint32_t k = 0; k < n; k++)
                    r.out[k] = malloc(out_b);
                struct mscx_hostexec_cfg cfg;
                memset(&cfg, 0, sizeof(cfg));
                cfg.in_bytes = in_b;
                cfg.out_bytes = out_b;
                cfg.dtype = fdts[di];
                cfg.op = op;
                cfg.pkt = MSCX_PKT_LL16;
                cfg.iters = 1;
                cfg.timeout_ms = 20000;
                cfg.fill = nan_fill;
                cfg.collect = nan_collect;
                cfg.ctx = &r;
                ck_assert_msg(mscx_hostexec_run(plan, &cfg, err, sizeof(err)) == MSCX_OK, "%s: %s",
                              nan_plans[_i], err);
                /* NCCL: the NaN is left out; min is 1 (2 when rank 0 holds it), max is n (n - 1 when rank n -
                 * 1 does) */
                float want_f =
                    op == MSCX_REDOP_MIN ? (nr == 0 ? 2.0f : 1.0f) : (float)(nr == n - 1 ? n - 1 : n);
                uint32_t want = value_bits(fdts[di], want_f), es = mscx_dtype_size(fdts[di]);
                for (uint32_t k = 0; k < n; k++) {
                    for (uint64_t e = 0; e + es <= out_b; e += es) {
                        uint32_t got = 0;
                        memcpy(&got, r.out[k] + e, es);
                        ck_assert_msg(got == want,
                                      "%s: %s %s, NaN on rank %u: rank %u byte %llu got 0x%x want 0x%x",
                                      nan_plans[_i], mscx_dtype_name(fdts[di]), mscx_redop_name(op), nr, k,
                                      (unsigned long long)e, got, want);
                    }
                }
                for (uint32_t k = 0; k < n; k++)
                    free(r.out[k]);
            }
        }
    }
    mscx_plan_destroy(plan);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("op_math");
    TCase *tc = mscx_tcase("minmax");
    tcase_add_loop_test(tc, test_minmax_pairs, 0, 10);
    tcase_add_loop_test(tc, test_minmax_fold_orders, 0, 10);
    tcase_add_test(tc, test_nan_arith_canonical);
    tcase_add_loop_test(tc, test_hostexec_nan_rank, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}
