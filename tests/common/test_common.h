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

Suite *mscx_test_suite(void);

/** A TCase with the warning fixture and a generous timeout. */
TCase *mscx_tcase(const char *name);

/** Allow warnings containing @p substr until the end of the current test. */
void mscx_test_allow_warn(const char *substr);
/** The last WARN message seen in this test, "" when none. */
const char *mscx_test_last_warn(void);
/** Number of WARN messages seen in this test. */
int mscx_test_warn_count(void);

/** Absolute paths: the source tree, and ../shared/reference beside it. */
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

#endif
