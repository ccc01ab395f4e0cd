/* SPDX-License-Identifier: MIT */
/* Test data: see test_data.h. */
#include <string.h>

#include "test_data.h"

/* MurmurHash3's 64-bit finalizer */
static uint64_t mix_any(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t mix_spread(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

uint64_t mscx_test_data_mix(enum mscx_test_data d, uint64_t x)
{
    return d == MSCX_TEST_DATA_SPREAD ? mix_spread(x) : mix_any(x);
}

uint64_t mscx_test_data_seed(uint32_t rank, uint32_t launch, int out)
{
    return (uint64_t)rank * 7u + launch * 131u + (out ? 1u : 2u);
}

/* One element of @p es bytes at @p p from the random word @p r. */
static void elem_any(uint8_t *p, uint32_t es, enum mscx_dtype dt, uint64_t r)
{
    if (dt == MSCX_DT_FP32) {
        float f = (float)((int64_t)(r % 20001) - 10000) / 64.0f;
        memcpy(p, &f, 4);
    } else if (dt == MSCX_DT_FP16) {
        uint16_t h = (uint16_t)((r & 0x83ffu) | (((r >> 16) % 6 + 12) << 10)); /* 2^-3 .. 2^2 */
        memcpy(p, &h, 2);
    } else if (dt == MSCX_DT_BF16) {
        uint16_t h =
            (uint16_t)((r & 0x8000u) | (((r >> 16) % 6 + 124) << 7) | (r >> 40 & 0x7fu)); /* 2^-3 .. 2^2 */
        memcpy(p, &h, 2);
    } else {
        for (uint32_t k = 0; k < es; k++)
            p[k] = (uint8_t)(r >> (8 * k));
    }
}

static void elem_spread(uint8_t *p, uint32_t es, enum mscx_dtype dt, uint64_t r)
{
    if (dt == MSCX_DT_FP16) {
        uint16_t h = (uint16_t)((r & 0x83ffu) | (((r >> 16) % 11 + 10) << 10)); /* 2^-5 .. 2^5 */
        memcpy(p, &h, 2);
    } else if (es == 4) {
        uint32_t u = (uint32_t)((r & 0x807fffffu) | (((r >> 32) % 24 + 115) << 23)); /* 2^-12 .. 2^11 */
        memcpy(p, &u, 4);
    } else {
        for (uint32_t k = 0; k < es; k++)
            p[k] = (uint8_t)(r >> (8 * k));
    }
}

void mscx_test_data_fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint64_t seed, enum mscx_test_data d)
{
    const int spread = d == MSCX_TEST_DATA_SPREAD;
    const uint64_t mul = spread ? 0x100000001b3ull : 1000003ull;
    uint32_t es = mscx_dtype_size(dt);
    for (uint64_t i = 0; i + es <= n; i += es) {
        uint64_t r = mscx_test_data_mix(d, seed * mul + i);
        if (spread)
            elem_spread(p + i, es, dt, r);
        else
            elem_any(p + i, es, dt, r);
    }
    for (uint64_t i = n / es * es; i < n; i++)
        p[i] = (uint8_t)mscx_test_data_mix(d, seed + i);
}

uint64_t mscx_test_data_diff(const uint8_t *a, const uint8_t *b, uint64_t n)
{
    uint64_t at = 0;
    while (at < n && a[at] == b[at])
        at++;
    return at;
}
