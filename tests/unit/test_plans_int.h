/* SPDX-License-Identifier: MIT */
/*
 * Private header of the plans test, shared by test_plans.c and
 * test_plans_twophase_layouts.c: the helpers of test_plans.c that the
 * two-phase layout cases use, and the function of
 * test_plans_twophase_layouts.c that adds those cases.
 */
#ifndef MSCX_TEST_PLANS_INT_H
#define MSCX_TEST_PLANS_INT_H

#include <stdint.h>
#include <check.h>

#include "mscx/plan.h"

/* @p v rounded up to a multiple of @p u. */
static inline uint64_t round_up(uint64_t v, uint64_t u)
{
    return (v + u - 1) / u * u;
}

/* test_plans.c */
void sim_one(const struct mscx_plan *plan, uint64_t bytes, enum mscx_dtype dt, enum mscx_redop op,
             enum mscx_pkt_format pkt, uint32_t seed);
char *run_plangen(const char *args, const char *tag);

/* test_plans_twophase_layouts.c: adds its cases to @p tc (the plangen TCase) */
void plans_add_twophase_layout_tests(TCase *tc);

#endif
