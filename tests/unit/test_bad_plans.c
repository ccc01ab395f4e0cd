/* SPDX-License-Identifier: MIT */
/* placeholder, filled in by its owner */
#include "test_common.h"

Suite *mscx_test_suite(void)
{
    return suite_create("bad_plans");
}
