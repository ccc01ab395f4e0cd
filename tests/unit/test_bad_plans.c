/* SPDX-License-Identifier: MIT */
/*
 * The broken-plan corpus (tests/data/bad-plans, made by generate.py there):
 * every file is refused with MSCX_ERR_PLAN, the output pointer untouched, and
 * a one-line message naming the file, the JSON path, the reason and line:col.
 * Also: every prefix of a valid plan is refused, and random byte damage never
 * crashes the loader.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/plan.h"
#include "test_common.h"

#define CORPUS "tests/data/bad-plans"
#define SENTINEL ((struct mscx_plan *)0x5a5a)

static char **names;
static int nnames;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_corpus(void)
{
    DIR *dir = opendir(mscx_test_src(CORPUS));
    struct dirent *e;
    if (dir == NULL)
        return;
    while ((e = readdir(dir)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".json") == 0) {
            names = realloc(names, (size_t)(nnames + 1) * sizeof(*names));
            names[nnames++] = strndup(e->d_name, n - 5);
        }
    }
    closedir(dir);
    qsort(names, (size_t)nnames, sizeof(*names), cmp_str);
}

START_TEST(test_corpus_size)
{
    ck_assert_int_ge(nnames, 30);
}
END_TEST

START_TEST(test_bad_plan_refused)
{
    const char *name = names[_i];
    char rel[512], path[1024], err[MSCX_PLAN_ERR_LEN], expect[1024], where[64] = "";
    struct mscx_plan *p = SENTINEL;
    size_t len;

    snprintf(rel, sizeof(rel), CORPUS "/%s.expect", name);
    char *ex = mscx_test_read_file(mscx_test_src(rel), &len);
    ck_assert_msg(ex != NULL, "%s has no .expect file", name);
    char *nl = strchr(ex, '\n');
    ck_assert_ptr_nonnull(nl);
    *nl = '\0';
    snprintf(expect, sizeof(expect), "%s", ex);
    if (nl[1] && nl[1] != '\n') {
        char *nl2 = strchr(nl + 1, '\n');
        if (nl2)
            *nl2 = '\0';
        snprintf(where, sizeof(where), ":%s: ", nl + 1);
    }
    free(ex);

    snprintf(rel, sizeof(rel), CORPUS "/%s.json", name);
    snprintf(path, sizeof(path), "%s", mscx_test_src(rel));
    mscx_status_t st = mscx_plan_load(path, &p, err, sizeof(err));
    ck_assert_msg(st == MSCX_ERR_PLAN, "%s: status %d (%s)", name, st, err);
    ck_assert_ptr_eq(p, SENTINEL);
    ck_assert_msg(strncmp(err, "plan bug: ", 10) == 0, "%s: %s", name, err);
    ck_assert_msg(strstr(err, path) != NULL, "%s: message does not name the file: %s", name, err);
    ck_assert_msg(strstr(err, expect) != NULL, "%s: message\n  %s\nlacks\n  %s", name, err, expect);
    ck_assert_msg(strchr(err, '\n') == NULL, "%s: message is not one line", name);
    if (where[0])
        ck_assert_msg(strstr(err, where) != NULL, "%s: message\n  %s\nlacks position %s", name, err, where);
    /* every message carries a line:col, syntax errors included */
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^plan bug: .*:[1-9][0-9]*:[0-9]+: ", REG_EXTENDED), 0);
    ck_assert_msg(regexec(&re, err, 0, NULL, 0) == 0, "%s: no line:col in %s", name, err);
    regfree(&re);

    /* the same from memory, with the origin named in the message */
    char *buf = mscx_test_read_file(path, &len);
    ck_assert_ptr_nonnull(buf);
    st = mscx_plan_load_buffer(buf, len, "mem.json", &p, err, sizeof(err));
    ck_assert_int_eq(st, MSCX_ERR_PLAN);
    ck_assert_ptr_eq(p, SENTINEL);
    ck_assert_msg(strstr(err, "mem.json:") && strstr(err, expect), "%s: %s", name, err);
    /* NULL error buffer is fine */
    ck_assert_int_eq(mscx_plan_load_buffer(buf, len, NULL, &p, NULL, 0), MSCX_ERR_PLAN);
    ck_assert_ptr_eq(p, SENTINEL);
    free(buf);
}
END_TEST

static void check_prefixes(const char *rel, size_t stride)
{
    size_t len;
    char *buf = mscx_test_read_file(mscx_test_ref(rel), &len);
    char err[MSCX_PLAN_ERR_LEN];
    ck_assert_ptr_nonnull(buf);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        len--;
    for (size_t cut = 0; cut < len; cut += stride) {
        struct mscx_plan *p = SENTINEL;
        char *copy = malloc(cut + 1);
        memcpy(copy, buf, cut); /* exact-size heap copy: ASan sees any over-read */
        mscx_status_t st = mscx_plan_load_buffer(copy, cut, "cut.json", &p, err, sizeof(err));
        ck_assert_msg(st == MSCX_ERR_PLAN, "%s cut at %zu: status %d", rel, cut, st);
        ck_assert_ptr_eq(p, SENTINEL);
        ck_assert_msg(strstr(err, "cut.json:"), "%s", err);
        free(copy);
    }
    free(buf);
}

START_TEST(test_every_prefix_refused)
{
    check_prefixes("mscclpp-algo-plans/allreduce_pkt_n2.json", 1);
    check_prefixes("mscclpp-op-plans/put_packet_test.json", 1);
}
END_TEST

START_TEST(test_sampled_prefixes_refused)
{
    size_t len;
    char *buf = mscx_test_read_file(mscx_test_ref("mscclpp-algo-plans/allreduce_pkt_n8.json"), &len);
    ck_assert_ptr_nonnull(buf);
    free(buf);
    check_prefixes("mscclpp-algo-plans/allreduce_pkt_n8.json", len / 200 + 1);
}
END_TEST

/* Random byte damage: the loader refuses or accepts, never crashes, never leaks a partial plan. */
START_TEST(test_random_damage)
{
    static const char *const fixtures[] = {
        "mscclpp-op-plans/put_with_signal_test.json", "mscclpp-op-plans/reduce_copy_send_packet_test.json",
        "mscclpp-op-plans/pipeline_test.json",        "mscclpp-op-plans/barrier_test.json",
        "mscclpp-algo-plans/allreduce_pkt_n4.json",
    };
    static const char alphabet[] = "0123456789{}[]\",:-. aeioustrnpkx";
    unsigned seed = 12345;
    int accepted = 0, refused = 0;
    for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++) {
        size_t len;
        char *orig = mscx_test_read_file(mscx_test_ref(fixtures[f]), &len);
        ck_assert_ptr_nonnull(orig);
        for (int iter = 0; iter < 400; iter++) {
            char *buf = malloc(len);
            memcpy(buf, orig, len);
            int flips = 1 + rand_r(&seed) % 3;
            for (int k = 0; k < flips; k++)
                buf[rand_r(&seed) % len] = alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
            struct mscx_plan *p = SENTINEL;
            char err[MSCX_PLAN_ERR_LEN];
            mscx_status_t st = mscx_plan_load_buffer(buf, len, "damaged.json", &p, err, sizeof(err));
            ck_assert_msg(st == MSCX_OK || st == MSCX_ERR_PLAN, "status %d", st);
            if (st == MSCX_OK) {
                ck_assert_ptr_ne(p, SENTINEL);
                mscx_plan_destroy(p);
                accepted++;
            } else {
                ck_assert_ptr_eq(p, SENTINEL);
                ck_assert_msg(strncmp(err, "plan bug: damaged.json:", 23) == 0, "%s", err);
                refused++;
            }
            free(buf);
        }
        free(orig);
    }
    ck_assert_int_gt(refused, 100);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("bad_plans");
    TCase *tc = mscx_tcase("corpus");
    list_corpus();
    tcase_add_test(tc, test_corpus_size);
    tcase_add_loop_test(tc, test_bad_plan_refused, 0, nnames);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("robustness");
    tcase_add_test(tc, test_every_prefix_refused);
    tcase_add_test(tc, test_sampled_prefixes_refused);
    tcase_add_test(tc, test_random_damage);
    suite_add_tcase(s, tc);
    return s;
}
