/* SPDX-License-Identifier: MIT */
/*
 * The failure report of the test programs that run without check: FAIL()
 * prints its message and counts it, and the program exits non-zero when
 * failures is not zero.
 */
#ifndef MSCX_TEST_FAIL_H
#define MSCX_TEST_FAIL_H

#include <stdio.h>

/* The failures reported so far. */
static int failures __attribute__((unused));

#define FAIL(...)                                                                                            \
    do {                                                                                                     \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                                               \
        fputc('\n', stderr);                                                                                 \
        failures++;                                                                                          \
    } while (0)

#endif /* MSCX_TEST_FAIL_H */
