/* SPDX-License-Identifier: MIT */
/*
 * Shared test helpers. Every test binary defines mscx_test_suite() and links
 * test_main.c, which runs it with srunner_run_all(CK_ENV), so CK_RUN_SUITE,
 * CK_RUN_CASE, CK_VERBOSITY and CK_FORK work.
 *
 * Any WARN that a test did not announce with mscx_test_allow_warn() fails the
 * test (checked in the fixture's teardown).
 */
#ifndef MSCX_TEST_COMMON_H
#define MSCX_TEST_COMMON_H

#include <check.h>
#include <stddef.h>

struct mscx_plan;

Suite *mscx_test_suite(void);

/** A TCase with the warning fixture and a generous timeout. */
TCase *mscx_tcase(const char *name);

/** Allow warnings containing @p substr until the end of the current test. */
void mscx_test_allow_warn(const char *substr);
/** The last WARN message seen in this test, "" when none. */
const char *mscx_test_last_warn(void);
/** The last log line of any level seen in this test (INFO only where enabled), "" when none. */
const char *mscx_test_last_log(void);
/** Number of WARN messages seen in this test. */
int mscx_test_warn_count(void);

/** Absolute paths: the source tree, and the vendored MSCCL++ fixtures (tests/data/mscclpp). */
const char *mscx_test_src(const char *rel);
const char *mscx_test_ref(const char *rel);
/** Read a whole file into a malloc'd NUL-terminated buffer (NULL on error). */
char *mscx_test_read_file(const char *path, size_t *len_p);
/**
 * The names of the *.json files in @p dir, sorted (strcmp), in *@p names_p
 * (free with mscx_test_free_names). Fails the test when @p dir cannot be read.
 * @return how many
 */
size_t mscx_test_json_names(const char *dir, char ***names_p);
void mscx_test_free_names(char **names, size_t n);

/*
 * A walk over the shipped plans (the *.json files in plans/, by name), each
 * loaded in turn:
 *     struct mscx_test_plans it;
 *     mscx_test_plans_begin(&it);
 *     for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;)
 *         ...
 * Walk it to the end: the last next() releases everything.
 */
struct mscx_test_plans {
    char **names;
    size_t n, next;         /* how many, and the index of the one next() loads */
    struct mscx_plan *plan; /* the current one, destroyed by the next next() */
    char path[4096];        /* its path */
};

/** List the shipped plans into @p it (fails the test when plans/ cannot be read). */
void mscx_test_plans_begin(struct mscx_test_plans *it);
/**
 * Destroy the current plan and load the next one; a plan that does not load
 * fails the test. @return the plan, or NULL after the last one.
 */
struct mscx_plan *mscx_test_plans_next(struct mscx_test_plans *it);

#endif
