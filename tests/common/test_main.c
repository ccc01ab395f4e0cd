/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "mscx/plan.h"
#include "test_common.h"

#define MAX_ALLOW 16

static char allow[MAX_ALLOW][128];
static int nallow;
static char last_warn[1536];
static char last_log[1536];
static int warn_count;
static int unexpected;
static char unexpected_msg[1536];

static void test_log_handler(enum mscx_log_level level, unsigned subsys, const char *file, int line,
                             const char *msg, void *ctx)
{
    (void)subsys;
    (void)ctx;
    snprintf(last_log, sizeof(last_log), "%s", msg);
    if (level != MSCX_LOG_WARN) {
        if (getenv("MSCX_TEST_SHOW_LOG"))
            fprintf(stderr, "log: %s\n", msg);
        return;
    }
    warn_count++;
    snprintf(last_warn, sizeof(last_warn), "%s", msg);
    for (int i = 0; i < nallow; i++)
        if (strstr(msg, allow[i]))
            return;
    if (!unexpected)
        snprintf(unexpected_msg, sizeof(unexpected_msg), "%s (%s:%d)", msg, file, line);
    unexpected++;
}

static void fixture_setup(void)
{
    nallow = 0;
    last_warn[0] = '\0';
    last_log[0] = '\0';
    warn_count = 0;
    unexpected = 0;
    mscx_log_set_handler(test_log_handler, NULL);
}

static void fixture_teardown(void)
{
    int n = unexpected;
    unexpected = 0;
    ck_assert_msg(n == 0, "%d unexpected warning(s), first: %s", n, unexpected_msg);
}

TCase *mscx_tcase(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_set_timeout(tc, 120);
    return tc;
}

void mscx_test_allow_warn(const char *substr)
{
    if (nallow < MAX_ALLOW)
        snprintf(allow[nallow++], sizeof(allow[0]), "%s", substr);
}

const char *mscx_test_last_warn(void)
{
    return last_warn;
}

const char *mscx_test_last_log(void)
{
    return last_log;
}

int mscx_test_warn_count(void)
{
    return warn_count;
}

static const char *join(const char *base, const char *rel)
{
    static __thread char buf[8][1024];
    static __thread int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof(buf[0]), "%s/%s", base, rel);
    return b;
}

const char *mscx_test_src(const char *rel)
{
    return join(MSCX_SOURCE_ROOT, rel);
}

const char *mscx_test_ref(const char *rel)
{
    return join(MSCX_SOURCE_ROOT "/tests/data/mscclpp", rel);
}

char *mscx_test_read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len_p)
            *len_p = (size_t)n;
    }
    return buf;
}

static int cmp_name(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

size_t mscx_test_json_names(const char *dir, char ***names_p)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d, "cannot open %s", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l <= 5 || strcmp(e->d_name + l - 5, ".json") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof(*names));
            ck_assert_ptr_nonnull(names);
        }
        names[n] = strdup(e->d_name);
        ck_assert_ptr_nonnull(names[n]);
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), cmp_name);
    *names_p = names;
    return n;
}

void mscx_test_free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

void mscx_test_plans_begin(struct mscx_test_plans *it)
{
    memset(it, 0, sizeof(*it));
    it->n = mscx_test_json_names(mscx_test_src("plans"), &it->names);
}

struct mscx_plan *mscx_test_plans_next(struct mscx_test_plans *it)
{
    char err[MSCX_PLAN_ERR_LEN];
    if (it->plan) {
        mscx_plan_destroy(it->plan);
        it->plan = NULL;
    }
    if (it->next == it->n) {
        if (it->names)
            mscx_test_free_names(it->names, it->n);
        it->names = NULL;
        return NULL;
    }
    snprintf(it->path, sizeof(it->path), "%s/%s", mscx_test_src("plans"), it->names[it->next++]);
    ck_assert_msg(mscx_plan_load(it->path, &it->plan, err, sizeof(err)) == MSCX_OK, "%s: %s", it->path, err);
    return it->plan;
}

int main(void)
{
    SRunner *sr = srunner_create(mscx_test_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
