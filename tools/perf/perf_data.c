/* SPDX-License-Identifier: MIT */
/*
 * Exact-arithmetic inputs and the expected outputs. Inputs are small whole
 * numbers, so every summation order gives the same result in every data type
 * (bfloat16 holds whole numbers exactly up to 256, so sums stay exact up to
 * 85 ranks; int8 up to 42). The seed changes the data from size to size so a
 * stale buffer from the previous size does not pass.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "perf.h"

double mscx_perf_value(enum perf_op op, int rank, int nranks, uint64_t i, int seed)
{
    uint64_t h = i * 3u + (uint64_t)rank * 5u + (uint64_t)seed;
    switch (op) {
    case PERF_PROD:
        /* One rank per element contributes 2, the others 1: the product is 2. */
        return ((i + (uint64_t)seed + (uint64_t)rank) % (uint64_t)nranks) == 0 ? 2.0 : 1.0;
    case PERF_MIN:
    case PERF_MAX:
        return (double)(h % 11u);
    case PERF_AVG:
        /* Pairs of ranks add +1 and -1, so the sum is n times the common base. */
        return (double)(((uint64_t)seed + i) % 4u) +
               ((rank % 2 == 0) ? (rank + 1 < nranks ? 1.0 : 0.0) : -1.0);
    default:
        return (double)(h % 4u);
    }
}

static uint16_t float_to_half(float f)
{
    uint32_t x, sign, mant;
    int32_t exp;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* may carry into the exponent, which is still correct */
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        x = sign | 0x7f800000u | (mant << 13);
    else
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void mscx_perf_store(enum perf_type t, void *buf, uint64_t i, double v)
{
    switch (t) {
    case PERF_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case PERF_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case PERF_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case PERF_UINT32:
        ((uint32_t *)buf)[i] = (uint32_t)v;
        break;
    case PERF_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case PERF_UINT64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case PERF_HALF:
        ((uint16_t *)buf)[i] = float_to_half((float)v);
        break;
    case PERF_FLOAT:
        ((float *)buf)[i] = (float)v;
        break;
    case PERF_DOUBLE:
        ((double *)buf)[i] = v;
        break;
    case PERF_BF16:
        ((uint16_t *)buf)[i] = float_to_bf16((float)v);
        break;
    default:
        break;
    }
}

double mscx_perf_load(enum perf_type t, const void *buf, uint64_t i)
{
    switch (t) {
    case PERF_INT8:
        return ((const int8_t *)buf)[i];
    case PERF_UINT8:
        return ((const uint8_t *)buf)[i];
    case PERF_INT32:
        return ((const int32_t *)buf)[i];
    case PERF_UINT32:
        return ((const uint32_t *)buf)[i];
    case PERF_INT64:
        return (double)((const int64_t *)buf)[i];
    case PERF_UINT64:
        return (double)((const uint64_t *)buf)[i];
    case PERF_HALF:
        return half_to_float(((const uint16_t *)buf)[i]);
    case PERF_FLOAT:
        return ((const float *)buf)[i];
    case PERF_DOUBLE:
        return ((const double *)buf)[i];
    case PERF_BF16:
        return bf16_to_float(((const uint16_t *)buf)[i]);
    default:
        return NAN;
    }
}

void mscx_perf_fill(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                    void *buf, uint64_t count)
{
    (void)c;
    for (uint64_t i = 0; i < count; i++)
        mscx_perf_store(t, buf, i, mscx_perf_value(op, rank, nranks, i, seed));
}

static double fold(enum perf_op op, int nranks, uint64_t i, int seed)
{
    double acc = mscx_perf_value(op, 0, nranks, i, seed);
    for (int q = 1; q < nranks; q++) {
        double v = mscx_perf_value(op, q, nranks, i, seed);
        switch (op) {
        case PERF_PROD:
            acc *= v;
            break;
        case PERF_MIN:
            acc = v < acc ? v : acc;
            break;
        case PERF_MAX:
            acc = v > acc ? v : acc;
            break;
        default:
            acc += v;
            break;
        }
    }
    return op == PERF_AVG ? acc / nranks : acc;
}

double mscx_perf_expected(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                          uint64_t recv, uint64_t i)
{
    (void)t;
    switch (c) {
    case PERF_ALLGATHER: {
        uint64_t part = recv / (uint64_t)nranks;
        return mscx_perf_value(op, (int)(i / part), nranks, i % part, seed);
    }
    case PERF_REDUCESCATTER:
        return fold(op, nranks, (uint64_t)rank * recv + i, seed);
    case PERF_ALLTOALL: { /* block q came from rank q's block for this rank */
        uint64_t part = recv / (uint64_t)nranks;
        return mscx_perf_value(op, (int)(i / part), nranks, (uint64_t)rank * part + i % part, seed);
    }
    default:
        return fold(op, nranks, i, seed);
    }
}

int64_t mscx_perf_check(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                        const void *out, uint64_t recv)
{
    int64_t wrong = 0;
    /* avg may be computed as a sum of pre-scaled terms: allow rounding. */
    double tol = op == PERF_AVG ? (t == PERF_BF16 ? 2e-2 : t == PERF_HALF ? 2e-3 : 1e-5) : 0.0;
    for (uint64_t i = 0; i < recv; i++) {
        double want = mscx_perf_expected(c, t, op, rank, nranks, seed, recv, i);
        double got = mscx_perf_load(t, out, i);
        if (!(fabs(got - want) <= tol * (fabs(want) > 1.0 ? fabs(want) : 1.0)))
            wrong++;
    }
    return wrong;
}
