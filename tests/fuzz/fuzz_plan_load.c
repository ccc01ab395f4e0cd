/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the plan loader: any input is either refused with
 * MSCX_ERR_PLAN (output untouched) or gives a plan that survives the
 * accessors, the summary, geometry and a clone/validate round.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mscx/plan.h"
#include "plan_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mscx_plan *p = (struct mscx_plan *)0x1, *c = NULL;
    char err[MSCX_PLAN_ERR_LEN], path[256], msg[512];
    mscx_status_t st = mscx_plan_load_buffer((const char *)data, size, "fuzz", &p, err, sizeof(err));
    if (st != MSCX_OK) {
        if (p != (struct mscx_plan *)0x1 || (st != MSCX_ERR_PLAN && st != MSCX_ERR_NO_MEMORY))
            abort();
        return 0;
    }
    struct mscx_geom g;
    for (uint32_t r = 0; r < mscx_plan_nranks(p); r++)
        (void)mscx_plan_geom(p, r, 4096, 4096, MSCX_DT_FP16, &g, err, sizeof(err));
    (void)mscx_plan_executable(p, err, sizeof(err));
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        uint64_t sizes[] = {1024};
        mscx_plan_describe(p, devnull, sizes, 1);
        fclose(devnull);
    }
    if (mscx_plan_clone(p, &c) == MSCX_OK) {
        if (mscx_plan_validate(c, path, sizeof(path), msg, sizeof(msg)) != MSCX_OK)
            abort(); /* a loaded plan must re-validate */
        mscx_plan_destroy(c);
    }
    mscx_plan_destroy(p);
    return 0;
}
