/* SPDX-License-Identifier: MIT */
/**
 * @file scale.h
 * The scalar of a scaled sum: NCCL's PreMulSum, and ncclAvg on floating
 * types (PreMulSum with the scalar 1/nranks, see mscx_avg_scalar_bits()).
 * Every rank multiplies its own input by the scalar, element by element,
 * each product rounded once to the datatype, and the products are summed.
 * Shared by the GPU executor (exec.h) and the host reference executor
 * (hostexec.h).
 */
#ifndef MSCX_SCALE_H
#define MSCX_SCALE_H

#include <stdint.h>
#include "mscx/dev_types.h"

#ifdef __cplusplus
extern "C" {
#endif

enum mscx_scale_kind {
    MSCX_SCALE_NONE = 0, /* a plain reduction */
    MSCX_SCALE_HOST,     /* the scalar is value_bits */
    MSCX_SCALE_DEVICE,   /* the scalar is read from dev_ptr by each launch when it runs */
};

/**
 * The scalar, in the launch's datatype: its bits in the low bits of
 * value_bits (fp32: 32 bits, fp16 and bf16: 16), or a pointer to one element
 * of that datatype in device memory (for the host executor: host memory, read
 * at the start of every launch). Only fp32, fp16 and bf16 are scaled.
 */
struct mscx_scale {
    enum mscx_scale_kind kind;
    uint64_t value_bits;
    const void *dev_ptr;
};

/**
 * NCCL's ncclAvg on a floating type, as a scaled sum: the scalar 1/@p nranks
 * computed as the double 1.0 / nranks converted to fp32, and for fp16 and
 * bf16 that fp32 value rounded to nearest-even in the type (NCCL:
 * __float2half(float(1.0 / nRanks))).
 * @return an MSCX_SCALE_HOST scale; MSCX_SCALE_NONE for a datatype that
 *         cannot be scaled (NCCL averages integers by a sum and a division)
 */
struct mscx_scale mscx_scale_avg(enum mscx_dtype dtype, uint32_t nranks);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_SCALE_H */
