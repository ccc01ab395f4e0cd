/* SPDX-License-Identifier: MIT */
/* The scalar of ncclAvg (mscx/scale.h), from the one definition in op_math.h. */
#include "mscx/scale.h"
#include "op_math.h"

struct mscx_scale mscx_scale_avg(enum mscx_dtype dtype, uint32_t nranks)
{
    struct mscx_scale s = {MSCX_SCALE_NONE, 0, NULL};
    if (mscx_dtype_scalable((unsigned)dtype)) {
        s.kind = MSCX_SCALE_HOST;
        s.value_bits = mscx_avg_scalar_bits((unsigned)dtype, nranks);
    }
    return s;
}
