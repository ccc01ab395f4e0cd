/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "mscx/dev_types.h"
#include "mscx/env.h"
#include "mscx/log.h"
#include "test_common.h"

START_TEST(test_defaults)
{
    const struct mscx_config *cfg;
    mscx_config_reset();
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
    ck_assert_int_eq(cfg->disable, 0);
    ck_assert_int_eq(cfg->strict, 0);
    ck_assert_uint_eq(cfg->timeout_ms, 60000);
    ck_assert_int_eq(cfg->packet, -1);
    ck_assert_str_eq(cfg->transport, "auto");
}
END_TEST

START_TEST(test_override_values)
{
    const struct mscx_config *cfg;
    ck_assert_int_eq(mscx_config_override("MSCX_DISABLE", "1"), MSCX_OK);
    ck_assert_int_eq(mscx_config_override("MSCX_TIMEOUT_MS", "250"), MSCX_OK);
    ck_assert_int_eq(mscx_config_override("MSCX_PACKET", "ll8"), MSCX_OK);
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG_SUBSYS", "^IB,NET"), MSCX_OK);
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
    ck_assert_int_eq(cfg->disable, 1);
    ck_assert_uint_eq(cfg->timeout_ms, 250);
    ck_assert_int_eq(cfg->packet, MSCX_PKT_LL8);
    ck_assert_uint_eq(cfg->debug_subsys, MSCX_SUB_ALL & ~(MSCX_SUB_IB | MSCX_SUB_NET));
    mscx_config_reset();
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
    ck_assert_int_eq(cfg->disable, 0);
}
END_TEST

static const struct {
    const char *name, *value;
} bad_values[] = {
    {"MSCX_DISABLE", "maybe"},  {"MSCX_TIMEOUT_MS", "-5"},      {"MSCX_TIMEOUT_MS", "12abc"},
    {"MSCX_TIMEOUT_MS", ""},    {"MSCX_PACKET", "ll32"},        {"MSCX_DEBUG", "LOUD"},
    {"MSCX_DEBUG_SUBSYS", "FOO"}, {"MSCX_STRICT", "2"},         {"MSCX_SCRATCH_MAX", "99999999999999999999999"},
    {"MSCX_PDL", "sometimes"},
};

START_TEST(test_bad_value_names_variable)
{
    const struct mscx_config *cfg = NULL;
    mscx_test_allow_warn("bad environment value");
    ck_assert_int_eq(mscx_config_override(bad_values[_i].name, bad_values[_i].value), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_ERR_INVALID_ARG);
    ck_assert_ptr_null(cfg);
    ck_assert_msg(strstr(mscx_test_last_warn(), bad_values[_i].name) != NULL, "warning '%s' does not name %s",
                  mscx_test_last_warn(), bad_values[_i].name);
    ck_assert_int_eq(mscx_test_warn_count(), 1);
    mscx_config_reset();
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
}
END_TEST

START_TEST(test_unknown_override_name)
{
    ck_assert_int_eq(mscx_config_override("MSCX_NO_SUCH_THING", "1"), MSCX_ERR_INVALID_ARG);
}
END_TEST

static int seen_info;
static void capture(enum mscx_log_level level, unsigned subsys, const char *file, int line, const char *msg,
                    void *ctx)
{
    (void)file;
    (void)line;
    (void)ctx;
    if (level == MSCX_LOG_INFO && (subsys & MSCX_SUB_PLAN) && strstr(msg, "hello 42"))
        seen_info++;
}

START_TEST(test_log_level_filter)
{
    mscx_log_set_handler(capture, NULL);
    seen_info = 0;
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG", "WARN"), MSCX_OK);
    MSCX_INFO(MSCX_SUB_PLAN, "hello %d", 42);
    ck_assert_int_eq(seen_info, 0);
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG", "INFO"), MSCX_OK);
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG_SUBSYS", "INIT"), MSCX_OK);
    MSCX_INFO(MSCX_SUB_PLAN, "hello %d", 42);
    ck_assert_int_eq(seen_info, 0);
    ck_assert_int_eq(mscx_config_override("MSCX_DEBUG_SUBSYS", "PLAN"), MSCX_OK);
    MSCX_INFO(MSCX_SUB_PLAN, "hello %d", 42);
    ck_assert_int_eq(seen_info, 1);
    mscx_config_reset();
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("env");
    TCase *tc = mscx_tcase("config");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_override_values);
    tcase_add_loop_test(tc, test_bad_value_names_variable, 0, (int)(sizeof(bad_values) / sizeof(bad_values[0])));
    tcase_add_test(tc, test_unknown_override_name);
    tcase_add_test(tc, test_log_level_filter);
    suite_add_tcase(s, tc);
    return s;
}
