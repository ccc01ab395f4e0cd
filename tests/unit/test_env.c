/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mscx/dev_types.h"
#include "mscx/env.h"
#include "mscx/fork.h"
#include "mscx/log.h"
#include "test_common.h"

START_TEST(test_defaults)
{
    const struct mscx_config *cfg;
    mscx_config_reset();
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
    ck_assert_int_eq(cfg->disable, 0);
    ck_assert_int_eq(cfg->strict, 0);
    ck_assert_uint_eq(cfg->timeout_ms, 0);
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
    {"MSCX_DISABLE", "maybe"},    {"MSCX_TIMEOUT_MS", "-5"}, {"MSCX_TIMEOUT_MS", "12abc"},
    {"MSCX_TIMEOUT_MS", ""},      {"MSCX_PACKET", "ll32"},   {"MSCX_DEBUG", "LOUD"},
    {"MSCX_DEBUG_SUBSYS", "FOO"}, {"MSCX_STRICT", "2"},      {"MSCX_SCRATCH_MAX", "99999999999999999999999"},
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
    /* the lenient view: degraded, every value usable (the bad one at its default) */
    ck_assert(mscx_config_degraded());
    ck_assert(strstr(mscx_config_degraded_reason(), bad_values[_i].name) != NULL);
    ck_assert_int_eq(mscx_config_get_lenient(&cfg), MSCX_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(cfg);
    ck_assert_uint_eq(cfg->timeout_ms, 0);
    ck_assert_int_eq(cfg->debug_level, MSCX_LOG_WARN);
    ck_assert_int_eq(mscx_test_warn_count(), 1);
    mscx_config_reset();
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK);
    ck_assert(!mscx_config_degraded());
    ck_assert_str_eq(mscx_config_degraded_reason(), "");
}
END_TEST

START_TEST(test_mark_degraded)
{
    mscx_config_reset();
    ck_assert(!mscx_config_degraded());
    mscx_test_allow_warn("bad thing");
    mscx_config_mark_degraded("bad thing one");
    mscx_config_mark_degraded("bad thing two");
    ck_assert(mscx_config_degraded());
    ck_assert_str_eq(mscx_config_degraded_reason(), "bad thing one");
    ck_assert_int_eq(mscx_test_warn_count(), 1);
    const struct mscx_config *cfg;
    ck_assert_int_eq(mscx_config_get(&cfg), MSCX_OK); /* the values themselves are good */
    mscx_config_reset();
    ck_assert(!mscx_config_degraded());
}
END_TEST

/* ---- fork.h: a mutex another thread holds at fork() is free in the child ---- */

static pthread_mutex_t fork_m1 = PTHREAD_MUTEX_INITIALIZER, fork_m2 = PTHREAD_MUTEX_INITIALIZER;
static volatile int fork_holding;

static void *hold_a_while(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&fork_m2);
    pthread_mutex_lock(&fork_m1);
    fork_holding = 1;
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
    pthread_mutex_unlock(&fork_m1);
    pthread_mutex_unlock(&fork_m2);
    return NULL;
}

START_TEST(test_fork_releases_locks)
{
    int before = mscx_fork_protected_count();
    ck_assert_int_eq(mscx_fork_protect(&fork_m1, MSCX_FORK_LOG), 0);
    ck_assert_int_eq(mscx_fork_protect(&fork_m2, MSCX_FORK_SHIM_CALLER), 0); /* held outside m1: first */
    ck_assert_int_eq(mscx_fork_protect(&fork_m1, MSCX_FORK_LOG), 0);         /* again: no second entry */
    ck_assert_int_eq(mscx_fork_protected_count(), before + 2);
    pthread_t t;
    fork_holding = 0;
    pthread_create(&t, NULL, hold_a_while, NULL);
    while (!fork_holding) {
        struct timespec t1 = {0, 1000 * 1000};
        nanosleep(&t1, NULL);
    }
    pid_t pid = fork(); /* waits for the thread to let go of both */
    if (pid == 0) {
        int free1 = pthread_mutex_trylock(&fork_m1) == 0, free2 = pthread_mutex_trylock(&fork_m2) == 0;
        _exit(free1 && free2 ? 0 : 1);
    }
    ck_assert_int_ge(pid, 0);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    pthread_join(t, NULL);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child found a registered mutex held");
    /* the parent's locks work as before */
    ck_assert_int_eq(pthread_mutex_trylock(&fork_m1), 0);
    pthread_mutex_unlock(&fork_m1);
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

/* A library path through the working directory is recognised; a bare name or an absolute path is not one. */
START_TEST(test_path_relative)
{
    ck_assert_int_eq(mscx_path_relative("lib/libnccl.so.2"), 1);
    ck_assert_int_eq(mscx_path_relative("./libnccl.so.2"), 1);
    ck_assert_int_eq(mscx_path_relative("../x/libibverbs.so.1"), 1);
    ck_assert_int_eq(mscx_path_relative("libnccl.so.2"), 0);
    ck_assert_int_eq(mscx_path_relative("/usr/lib/libnccl.so.2"), 0);
    ck_assert_int_eq(mscx_path_relative(NULL), 0);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("env");
    TCase *tc = mscx_tcase("config");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_override_values);
    tcase_add_loop_test(tc, test_bad_value_names_variable, 0,
                        (int)(sizeof(bad_values) / sizeof(bad_values[0])));
    tcase_add_test(tc, test_unknown_override_name);
    tcase_add_test(tc, test_mark_degraded);
    tcase_add_test(tc, test_fork_releases_locks);
    tcase_add_test(tc, test_log_level_filter);
    tcase_add_test(tc, test_path_relative);
    suite_add_tcase(s, tc);
    return s;
}
