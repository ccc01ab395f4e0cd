/* SPDX-License-Identifier: MIT */
/*
 * Scaled sums on the host reference executor (mscx_hostexec_run_scaled):
 * ncclAvg and PreMulSum on every shipped AllReduce and ReduceScatter plan of
 * 1, 2, 4 and 8 ranks, fp32, fp16 and bf16, a host scalar and a device scalar
 * that changes between launches. Each run is checked three ways: bit for bit
 * against a plain sum of the same plan over inputs the test scaled itself
 * (each product computed here in double, exact, and rounded once to the
 * datatype by the compiler's or this file's own conversion); against the
 * exact sum of the products, within the bound of n - 1 roundings; and an
 * out-of-place plan's input must keep its bytes. The scalar of ncclAvg is
 * checked against NCCL's recipe computed here.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "mscx/scale.h"
#include "test_common.h"
#include "test_data.h"

#define LAUNCHES 2

/* ---- the datatypes, computed independently of op_math.h ---- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double h16_value(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (double)x;
}

static uint16_t h16_from_double(double d)
{
    _Float16 x = (_Float16)d; /* the compiler's conversion: one rounding to nearest-even */
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* A finite float to bf16, nearest-even. */
static uint16_t bf16_from_float(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t up = (u & 0xffffu) > 0x8000u || ((u & 0xffffu) == 0x8000u && (u & 0x10000u));
    return (uint16_t)((u >> 16) + up);
}

static double elem_value(enum mscx_dtype dt, const uint8_t *p)
{
    uint16_t h;
    uint32_t w;
    if (dt == MSCX_DT_FP32) {
        memcpy(&w, p, 4);
        return bits_f32(w);
    }
    memcpy(&h, p, 2);
    return dt == MSCX_DT_FP16 ? h16_value(h) : bits_f32((uint32_t)h << 16);
}

/* The product x * s (bits of @p dt), exact in double, rounded once to @p dt, stored at @p p. */
static void product_store(enum mscx_dtype dt, double x, uint64_t s, uint8_t *p)
{
    uint8_t sb[4];
    memcpy(sb, &s, 4);
    double prod = x * elem_value(dt, sb);
    if (dt == MSCX_DT_FP32) {
        uint32_t w = f32_bits((float)prod);
        memcpy(p, &w, 4);
    } else {
        /* bf16 products of the test data have 16 significant bits: exact in float */
        uint16_t h = dt == MSCX_DT_FP16 ? h16_from_double(prod) : bf16_from_float((float)prod);
        memcpy(p, &h, 2);
    }
}

/* NCCL's ncclAvg scalar: float(1.0 / n), and for half and bfloat16 that float rounded to the type. */
static uint64_t nccl_avg_bits(enum mscx_dtype dt, uint32_t n)
{
    float f = (float)(1.0 / n);
    if (dt == MSCX_DT_FP16)
        return h16_from_double((double)f); /* float to double is exact */
    if (dt == MSCX_DT_BF16)
        return bf16_from_float(f);
    return f32_bits(f);
}

static uint64_t scalar_bits(enum mscx_dtype dt, double v)
{
    uint64_t one = dt == MSCX_DT_FP32 ? f32_bits(1.0f) : dt == MSCX_DT_FP16 ? h16_from_double(1.0) : 0x3f80u;
    uint8_t b[4] = {0};
    product_store(dt, v, one, b);
    uint32_t w = 0;
    memcpy(&w, b, dt == MSCX_DT_FP32 ? 4 : 2);
    return w;
}

START_TEST(test_avg_scalar)
{
    static const enum mscx_dtype dts[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16};
    for (size_t d = 0; d < 3; d++)
        for (uint32_t n = 1; n <= 1024; n++) {
            struct mscx_scale s = mscx_scale_avg(dts[d], n);
            ck_assert_int_eq(s.kind, MSCX_SCALE_HOST);
            ck_assert_msg(s.value_bits == nccl_avg_bits(dts[d], n), "%s 1/%u: 0x%llx, NCCL's 0x%llx",
                          mscx_dtype_name(dts[d]), n, (unsigned long long)s.value_bits,
                          (unsigned long long)nccl_avg_bits(dts[d], n));
        }
    /* 1/3: half 0x3555 (0.33325), bfloat16 0x3eab (0.333984), fp32 0x3eaaaaab */
    ck_assert_uint_eq(mscx_scale_avg(MSCX_DT_FP16, 3).value_bits, 0x3555u);
    ck_assert_uint_eq(mscx_scale_avg(MSCX_DT_BF16, 3).value_bits, 0x3eabu);
    ck_assert_uint_eq(mscx_scale_avg(MSCX_DT_FP32, 3).value_bits, 0x3eaaaaabu);
    /* integers are NCCL's sum-then-divide: not a scaled sum */
    ck_assert_int_eq(mscx_scale_avg(MSCX_DT_INT32, 4).kind, MSCX_SCALE_NONE);
    ck_assert_int_eq(mscx_scale_avg(MSCX_DT_FP64, 4).kind, MSCX_SCALE_NONE);
}
END_TEST

/* ---- runs ---- */

struct run {
    enum mscx_coll coll;
    enum mscx_dtype dt;
    uint32_t nranks;
    uint64_t in_b, out_b;
    int prescale;              /* the reference run: fill with the products, plain sum */
    uint64_t scalar[LAUNCHES]; /* the scalar of each launch */
    uint32_t dev_scalar;       /* what MSCX_SCALE_DEVICE points at: each rank's fill of launch k writes k's */
    int device;
    uint8_t **out, **in; /* [launch * nranks + rank] after each launch */
    uint64_t in_changed; /* launches after which an out-of-place input differed from its fill */
    int inplace;
};

static void fill_input(const struct run *r, uint32_t rank, uint32_t it, uint8_t *in)
{
    mscx_test_data_fill(in, r->in_b, r->dt, mscx_test_data_seed(rank, it, 0), MSCX_TEST_DATA_ANY);
    if (!r->prescale)
        return;
    uint32_t es = mscx_dtype_size(r->dt);
    for (uint64_t i = 0; i + es <= r->in_b; i += es)
        product_store(r->dt, elem_value(r->dt, in + i), r->scalar[it], in + i);
}

static void run_fill(void *ctx, uint32_t rank, uint32_t it, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct run *r = ctx;
    memset(out, 0xa5, out_bytes);
    fill_input(r, rank, it, in);
    r->dev_scalar = (uint32_t)r->scalar[it]; /* every rank's fill of a launch writes the same value */
}

static void run_collect(void *ctx, uint32_t rank, uint32_t it, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct run *r = ctx;
    memcpy(r->out[it * r->nranks + rank], out, out_bytes);
    memcpy(r->in[it * r->nranks + rank], in, in_bytes);
    if (!r->inplace && !r->prescale) {
        uint8_t *want = malloc(in_bytes + 1);
        ck_assert_ptr_nonnull(want);
        fill_input(r, rank, it, want);
        if (memcmp(want, in, in_bytes) != 0)
            __atomic_fetch_add(&r->in_changed, 1, __ATOMIC_RELAXED);
        free(want);
    }
}

static void run_alloc(struct run *r)
{
    size_t n = (size_t)LAUNCHES * r->nranks;
    r->out = calloc(n, sizeof(*r->out));
    r->in = calloc(n, sizeof(*r->in));
    ck_assert(r->out && r->in);
    for (size_t i = 0; i < n; i++) {
        r->out[i] = calloc(1, r->out_b + 1);
        r->in[i] = calloc(1, r->in_b + 1);
        ck_assert(r->out[i] && r->in[i]);
    }
}

static void run_free(struct run *r)
{
    for (size_t i = 0; i < (size_t)LAUNCHES * r->nranks; i++) {
        free(r->out[i]);
        free(r->in[i]);
    }
    free(r->out);
    free(r->in);
}

static void run_plan(const struct mscx_plan *plan, struct run *r, const struct mscx_scale *sc)
{
    char err[512];
    struct mscx_hostexec_cfg cfg = {
        .in_bytes = r->in_b,
        .out_bytes = r->out_b,
        .dtype = r->dt,
        .op = MSCX_REDOP_SUM,
        .pkt = MSCX_PKT_LL16,
        .iters = LAUNCHES,
        .fill = run_fill,
        .collect = run_collect,
        .ctx = r,
    };
    mscx_status_t st = mscx_hostexec_run_scaled(plan, &cfg, sc, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s: %s", mscx_plan_name(plan), err);
}

/* Every rank's input of launch @p it as filled, [rank], in_b bytes each (free with inputs_free). */
static uint8_t **inputs_of(const struct run *r, uint32_t it)
{
    uint8_t **in = calloc(r->nranks, sizeof(*in));
    ck_assert_ptr_nonnull(in);
    for (uint32_t q = 0; q < r->nranks; q++) {
        in[q] = malloc(r->in_b + 1);
        ck_assert_ptr_nonnull(in[q]);
        mscx_test_data_fill(in[q], r->in_b, r->dt, mscx_test_data_seed(q, it, 0), MSCX_TEST_DATA_ANY);
    }
    return in;
}

static void inputs_free(const struct run *r, uint8_t **in)
{
    for (uint32_t q = 0; q < r->nranks; q++)
        free(in[q]);
    free(in);
}

/*
 * Every output element against the exact sum of the products: n - 1 sums,
 * each rounded to the datatype once, are off by at most (n - 1) u times the
 * sum of the products' magnitudes (u: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16).
 * The sum of at most 8 products of the test data's few exponents is exact
 * in double.
 */
static void check_accuracy(const struct mscx_plan *plan, const struct run *r)
{
    uint32_t es = mscx_dtype_size(r->dt);
    double u = r->dt == MSCX_DT_FP32 ? 0x1p-24 : r->dt == MSCX_DT_FP16 ? 0x1p-11 : 0x1p-8;
    uint64_t step = r->out_b / es > 64 ? r->out_b / es / 61 * es : es; /* a spread of elements */
    for (uint32_t it = 0; it < LAUNCHES; it++) {
        uint8_t **in = inputs_of(r, it);
        for (uint32_t rank = 0; rank < r->nranks; rank++)
            for (uint64_t o = 0; o + es <= r->out_b; o += step) {
                uint64_t off = r->coll == MSCX_COLL_REDUCESCATTER ? (uint64_t)rank * r->out_b + o : o;
                double sum = 0, abs_sum = 0;
                for (uint32_t q = 0; q < r->nranks; q++) {
                    uint8_t b[4];
                    product_store(r->dt, elem_value(r->dt, in[q] + off), r->scalar[it], b);
                    sum += elem_value(r->dt, b);
                    abs_sum += fabs(elem_value(r->dt, b));
                }
                double got = elem_value(r->dt, r->out[it * r->nranks + rank] + o);
                ck_assert_msg(fabs(got - sum) <= (r->nranks - 1) * u * abs_sum,
                              "%s %s launch %u rank %u byte %llu: %.9g, exact %.9g", mscx_plan_name(plan),
                              mscx_dtype_name(r->dt), it, rank, (unsigned long long)o, got, sum);
            }
        inputs_free(r, in);
    }
}

/*
 * One call of @p msg bytes with scale @p kind (MSCX_SCALE_HOST with AVG's
 * scalar when @p avg, else host or device scalars of the test's choice).
 */
static void check_call(const struct mscx_plan *plan, uint64_t msg, enum mscx_dtype dt, int avg, int device)
{
    struct run got = {0}, ref;
    got.coll = mscx_plan_collective(plan);
    got.dt = dt;
    got.nranks = mscx_plan_nranks(plan);
    got.inplace = mscx_plan_inplace(plan);
    mscx_coll_sizes(got.coll, got.nranks, msg, &got.in_b, &got.out_b);
    static const double k_scalars[LAUNCHES] = {0.3, -1.7};
    for (int it = 0; it < LAUNCHES; it++)
        got.scalar[it] =
            avg ? nccl_avg_bits(dt, got.nranks) : scalar_bits(dt, device ? k_scalars[it] : k_scalars[0]);
    ref = got;
    ref.prescale = 1;
    run_alloc(&got);
    run_alloc(&ref);
    struct mscx_scale sc = {MSCX_SCALE_HOST, got.scalar[0], NULL};
    if (avg)
        sc = mscx_scale_avg(dt, got.nranks);
    if (device) {
        sc.kind = MSCX_SCALE_DEVICE;
        sc.dev_ptr = &got.dev_scalar;
    }
    run_plan(plan, &got, &sc);
    run_plan(plan, &ref, NULL);
    for (uint32_t i = 0; i < LAUNCHES * got.nranks; i++) {
        uint64_t at = mscx_test_data_diff(got.out[i], ref.out[i], got.out_b);
        ck_assert_msg(at == got.out_b,
                      "%s %s %llu bytes %s: launch %u rank %u: byte %llu differs from the sum "
                      "of the scaled inputs",
                      mscx_plan_name(plan), mscx_dtype_name(dt), (unsigned long long)msg,
                      avg      ? "avg"
                      : device ? "device scalar"
                               : "host scalar",
                      i / got.nranks, i % got.nranks, (unsigned long long)at);
    }
    ck_assert_msg(got.in_changed == 0, "%s: the input of an out-of-place plan changed in %llu launches",
                  mscx_plan_name(plan), (unsigned long long)got.in_changed);
    check_accuracy(plan, &got);
    run_free(&got);
    run_free(&ref);
}

/* Two sizes of the plan's range: its smallest and an uneven one above it. */
static int plan_sizes(const struct mscx_plan *plan, enum mscx_dtype dt, uint64_t sizes[2])
{
    uint64_t lo, hi,
        unit = mscx_dtype_size(dt) * (mscx_plan_elem_multiple(plan) ? mscx_plan_elem_multiple(plan) : 1);
    mscx_plan_size_range(plan, &lo, &hi);
    if (mscx_plan_collective(plan) == MSCX_COLL_REDUCESCATTER)
        unit *= mscx_plan_nranks(plan);
    sizes[0] = (lo + unit - 1) / unit * unit;
    sizes[1] = sizes[0] + 3 * unit;
    if (sizes[0] == 0)
        sizes[0] = unit;
    return sizes[1] <= hi ? 2 : 1;
}

static const enum mscx_dtype k_dtypes[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16};
static const enum mscx_coll k_colls[] = {MSCX_COLL_ALLREDUCE, MSCX_COLL_REDUCESCATTER};

/* Loop index _i: one dtype (_i % 3) on the shipped plans of one collective (_i / 3), 1 to 8 ranks. */
START_TEST(test_shipped_plans)
{
    enum mscx_dtype dt = k_dtypes[_i % 3];
    enum mscx_coll want = k_colls[_i / 3];
    struct mscx_test_plans it;
    int plans = 0;
    mscx_test_plans_begin(&it);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        if (mscx_plan_collective(plan) != want || mscx_plan_nranks(plan) > 8 ||
            !mscx_plan_supports(plan, dt, MSCX_REDOP_SUM))
            continue;
        plans++;
        uint64_t sizes[2];
        int ns = plan_sizes(plan, dt, sizes);
        for (int s = 0; s < ns; s++) {
            check_call(plan, sizes[s], dt, 1, 0);
            check_call(plan, sizes[s], dt, 0, s == 0);
        }
    }
    ck_assert_int_ge(plans, 10); /* 1, 2, 4 and 8 ranks */
}
END_TEST

/* A scaled launch that is not a sum of a floating type, or has no scalar to read, is refused. */
START_TEST(test_refusals)
{
    char err[512];
    struct mscx_plan *plan = NULL;
    ck_assert_int_eq(
        mscx_plan_load(mscx_test_src("plans/allreduce_n2_rpn2_oneshot_1K_16K.json"), &plan, err, sizeof(err)),
        MSCX_OK);
    struct mscx_hostexec_cfg cfg = {.in_bytes = 1024,
                                    .out_bytes = 1024,
                                    .dtype = MSCX_DT_FP32,
                                    .op = MSCX_REDOP_MAX,
                                    .pkt = MSCX_PKT_LL16,
                                    .iters = 1};
    struct mscx_scale sc = {MSCX_SCALE_HOST, f32_bits(0.5f), NULL};
    mscx_test_allow_warn("scaled launch");
    mscx_test_allow_warn("device scale");
    ck_assert_int_eq(mscx_hostexec_run_scaled(plan, &cfg, &sc, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    cfg.op = MSCX_REDOP_SUM;
    cfg.dtype = MSCX_DT_INT32;
    ck_assert_int_eq(mscx_hostexec_run_scaled(plan, &cfg, &sc, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    cfg.dtype = MSCX_DT_FP32;
    sc.kind = MSCX_SCALE_DEVICE;
    ck_assert_int_eq(mscx_hostexec_run_scaled(plan, &cfg, &sc, err, sizeof(err)), MSCX_ERR_INVALID_ARG);
    sc.kind = MSCX_SCALE_NONE; /* a plain sum */
    ck_assert_int_eq(mscx_hostexec_run_scaled(plan, &cfg, &sc, err, sizeof(err)), MSCX_OK);
    mscx_plan_destroy(plan);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("hostexec-scaled");
    TCase *tc = mscx_tcase("scaled");
    tcase_add_test(tc, test_avg_scalar);
    tcase_add_test(tc, test_refusals);
    tcase_add_loop_test(tc, test_shipped_plans, 0, 6);
    suite_add_tcase(s, tc);
    return s;
}
