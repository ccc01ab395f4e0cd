/* SPDX-License-Identifier: MIT */
/*
 * Our own test helpers (tests/common). The walk over the shipped plans
 * visits each of them once, in order. The test data of test_data.c are
 * pinned: the digests below are of the bytes that test-gpu-exec's and
 * test-launch-emulation's own generators made before they were shared, so any
 * change to what the tests feed the executors fails here.
 */
#include <string.h>

#include "mscx/plan.h"
#include "test_common.h"
#include "test_data.h"

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV_BASIS 0xcbf29ce484222325ull

/* Every size (whole elements and tails), rank 0..7, launch 0..2, output and input. */
static uint64_t fill_digest(enum mscx_test_data d, enum mscx_dtype dt)
{
    static const uint64_t sizes[] = {1, 3, 4, 12, 13, 100, 1000, 4108};
    static uint8_t buf[4108];
    uint64_t h = FNV_BASIS;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
        for (uint32_t r = 0; r < 8; r++)
            for (uint32_t l = 0; l < 3; l++)
                for (int out = 0; out < 2; out++) {
                    mscx_test_data_fill(buf, sizes[s], dt, mscx_test_data_seed(r, l, out), d);
                    h = fnv1a(h, buf, sizes[s]);
                }
    return h;
}

static uint64_t mix_digest(enum mscx_test_data d)
{
    uint64_t h = FNV_BASIS;
    for (uint64_t x = 0; x < 1000; x++) {
        uint64_t m = mscx_test_data_mix(d, x * 0x9e3779b9ull);
        uint8_t b[8];
        for (int k = 0; k < 8; k++)
            b[k] = (uint8_t)(m >> 8 * k);
        h = fnv1a(h, b, 8);
    }
    return h;
}

static const struct {
    enum mscx_test_data d;
    enum mscx_dtype dt;
    uint64_t digest;
} k_pinned[] = {
    {MSCX_TEST_DATA_ANY, MSCX_DT_FP32, 0x8b9173f44448d94dull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_FP16, 0x697644f1700b229bull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_BF16, 0x49ff97f648a60789ull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_INT32, 0x7a20e5686d20f4edull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_UINT32, 0x7a20e5686d20f4edull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_INT8, 0xda73f920787e0653ull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_UINT8, 0xda73f920787e0653ull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_INT64, 0xa15fc0d7935fca3eull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_UINT64, 0xa15fc0d7935fca3eull},
    {MSCX_TEST_DATA_ANY, MSCX_DT_FP64, 0xa15fc0d7935fca3eull},
    {MSCX_TEST_DATA_SPREAD, MSCX_DT_FP32, 0xd810e8831419153bull},
    {MSCX_TEST_DATA_SPREAD, MSCX_DT_FP16, 0xd18f7ebd6a0975b7ull},
    {MSCX_TEST_DATA_SPREAD, MSCX_DT_INT32, 0xd810e8831419153bull},
    {MSCX_TEST_DATA_SPREAD, MSCX_DT_UINT32, 0xd810e8831419153bull},
};

START_TEST(test_data_pinned)
{
    ck_assert_uint_eq(mix_digest(MSCX_TEST_DATA_ANY), 0x019ca6ad0ca4e2dcull);
    ck_assert_uint_eq(mix_digest(MSCX_TEST_DATA_SPREAD), 0xe6e2542982c61779ull);
    for (size_t i = 0; i < sizeof(k_pinned) / sizeof(k_pinned[0]); i++) {
        uint64_t got = fill_digest(k_pinned[i].d, k_pinned[i].dt);
        ck_assert_msg(got == k_pinned[i].digest, "recipe %d %s: digest %#018llx, pinned %#018llx",
                      k_pinned[i].d, mscx_dtype_name(k_pinned[i].dt), (unsigned long long)got,
                      (unsigned long long)k_pinned[i].digest);
    }
}
END_TEST

/* The fill writes exactly n bytes, and the two recipes differ. */
START_TEST(test_data_bounds)
{
    uint8_t a[40], b[40];
    memset(a, 0xa5, sizeof(a));
    memset(b, 0xa5, sizeof(b));
    mscx_test_data_fill(a, 13, MSCX_DT_FP32, 5, MSCX_TEST_DATA_ANY);
    mscx_test_data_fill(b, 13, MSCX_DT_FP32, 5, MSCX_TEST_DATA_SPREAD);
    for (size_t i = 13; i < sizeof(a); i++)
        ck_assert(a[i] == 0xa5 && b[i] == 0xa5);
    ck_assert_uint_lt(mscx_test_data_diff(a, b, 13), 13);
}
END_TEST

START_TEST(test_data_diff)
{
    uint8_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = b[i] = (uint8_t)(i * 37);
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 16), 16);
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 0), 0);
    b[15] ^= 1;
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 16), 15);
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 15), 15);
    b[6] ^= 0x80;
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 16), 6);
    b[0] ^= 2;
    ck_assert_uint_eq(mscx_test_data_diff(a, b, 16), 0);
}
END_TEST

START_TEST(test_plans_walk)
{
    char **names;
    size_t nn = mscx_test_json_names(mscx_test_src("plans"), &names);
    struct mscx_test_plans it;
    mscx_test_plans_begin(&it);
    ck_assert_uint_eq(it.n, nn);
    ck_assert_uint_gt(nn, 0);
    size_t seen = 0;
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL; seen++) {
        ck_assert_uint_lt(seen, nn);
        size_t pl = strlen(it.path), fl = strlen(names[seen]);
        ck_assert_msg(pl > fl && it.path[pl - fl - 1] == '/' && strcmp(it.path + pl - fl, names[seen]) == 0,
                      "walk at %zu: %s, want %s", seen, it.path, names[seen]);
        ck_assert_uint_gt(mscx_plan_nranks(plan), 0);
    }
    ck_assert_uint_eq(seen, nn);
    ck_assert_ptr_null(mscx_test_plans_next(&it)); /* past the end: still the end */
    mscx_test_free_names(names, nn);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("selftest");
    TCase *tc = mscx_tcase("data");
    tcase_add_test(tc, test_data_pinned);
    tcase_add_test(tc, test_data_bounds);
    tcase_add_test(tc, test_data_diff);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("plans");
    tcase_add_test(tc, test_plans_walk);
    suite_add_tcase(s, tc);
    return s;
}
