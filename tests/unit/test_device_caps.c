/* SPDX-License-Identifier: MIT */
/*
 * The choice of code and features per device (executor/gpu/device_caps.c):
 * a fat build (SASS for 8.0, 9.0, 10.0, PTX of 10.0) on A100, A10-class
 * 8.6, H100/H200, B200 and a newer device; a V100 (7.0), which gets nothing;
 * a PTX-only 8.0 build on an H200, which runs through the driver's compiler
 * without programmatic dependent launch.
 */
#include "device_caps.h"
#include "test_common.h"

static const struct mscx_gpu_image fat = {{80, 90, 100}, 3, 100};

static struct mscx_gpu_features choose(int major, int minor, const struct mscx_gpu_image *img, bool pdl)
{
    struct mscx_gpu_features f;
    mscx_gpu_features_choose(major, minor, img, pdl, &f);
    return f;
}

START_TEST(test_fat_build)
{
    struct mscx_gpu_features f = choose(8, 0, &fat, true);
    ck_assert(f.runs && !f.jit && f.sass == 80 && !f.pdl);
    f = choose(8, 6, &fat, true);
    ck_assert(f.runs && !f.jit && f.sass == 80 && !f.pdl);
    f = choose(9, 0, &fat, true);
    ck_assert(f.runs && !f.jit && f.sass == 90 && f.pdl);
    f = choose(9, 0, &fat, false); /* MSCX_PDL=0 */
    ck_assert(f.runs && f.sass == 90 && !f.pdl);
    f = choose(10, 0, &fat, true);
    ck_assert(f.runs && !f.jit && f.sass == 100 && f.pdl);
    f = choose(12, 0, &fat, true); /* newer than the build: the PTX */
    ck_assert(f.runs && f.jit && f.sass == 0 && f.pdl);
}
END_TEST

START_TEST(test_too_old)
{
    struct mscx_gpu_features f = choose(7, 0, &fat, true);
    ck_assert(!f.runs && !f.jit && !f.pdl);
    char line[128];
    mscx_gpu_features_describe(7, 0, &f, line, sizeof(line));
    ck_assert_str_eq(line, "compute 7.0: no code for it in this build");
}
END_TEST

START_TEST(test_ptx_only)
{
    const struct mscx_gpu_image ptx80 = {{0}, 0, 80};
    struct mscx_gpu_features f = choose(9, 0, &ptx80, true);
    ck_assert(f.runs && f.jit && !f.pdl); /* code built for 8.0 has no wait for the kernel ahead */
    f = choose(7, 5, &ptx80, true);
    ck_assert(!f.runs);
    const struct mscx_gpu_image sm90 = {{90}, 1, 0};
    f = choose(8, 0, &sm90, true); /* SASS never runs on an older major */
    ck_assert(!f.runs);
    f = choose(10, 0, &sm90, true); /* nor on a newer one */
    ck_assert(!f.runs);
}
END_TEST

START_TEST(test_arch_list)
{
    unsigned a[8];
    ck_assert_int_eq(mscx_gpu_arch_list("80,90,100", a, 8), 3);
    ck_assert(a[0] == 80 && a[1] == 90 && a[2] == 100);
    ck_assert_int_eq(mscx_gpu_arch_list("", a, 8), 0);
    ck_assert_int_eq(mscx_gpu_arch_list("80,,90", a, 8), -1);
    ck_assert_int_eq(mscx_gpu_arch_list("sm_80", a, 8), -1);
    ck_assert_int_eq(mscx_gpu_arch_list("80,90,100", a, 2), -1);
    char line[128];
    struct mscx_gpu_features f = choose(9, 0, &fat, true);
    mscx_gpu_features_describe(9, 0, &f, line, sizeof(line));
    ck_assert_str_eq(line, "compute 9.0: SASS sm_90, PDL on");
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("device-caps");
    TCase *tc = mscx_tcase("choose");
    tcase_add_test(tc, test_fat_build);
    tcase_add_test(tc, test_too_old);
    tcase_add_test(tc, test_ptx_only);
    tcase_add_test(tc, test_arch_list);
    suite_add_tcase(s, tc);
    return s;
}
