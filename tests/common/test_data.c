/* SPDX-License-Identifier: MIT */
/* Test data: see test_data.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_data.h"

/* One element of @p es bytes at @p p from the random word @p r. */
static void elem_any(uint8_t *p, uint32_t es, enum mscx_dtype dt, uint64_t r);
static void elem_spread(uint8_t *p, uint32_t es, enum mscx_dtype dt, uint64_t r);

/*
 * A recipe: its mixer, x ^= x >> s0; x *= m0; x ^= x >> s1; x *= m1;
 * x ^= x >> s2 (ANY's is MurmurHash3's fmix64), the multiplier that spreads
 * seeds apart, and its elements.
 */
static const struct recipe {
    unsigned s0, s1, s2;
    uint64_t m0, m1, seed_mul;
    void (*elem)(uint8_t *p, uint32_t es, enum mscx_dtype dt, uint64_t r);
} k_recipes[] = {
    [MSCX_TEST_DATA_ANY] = {33, 33, 33, 0xff51afd7ed558ccdull, 0xc4ceb9fe1a85ec53ull, 1000003ull, elem_any},
    [MSCX_TEST_DATA_SPREAD] = {31, 29, 32, 0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x100000001b3ull,
                               elem_spread},
};

static inline uint64_t recipe_mix(const struct recipe *k, uint64_t x)
{
    x ^= x >> k->s0;
    x *= k->m0;
    x ^= x >> k->s1;
    x *= k->m1;
    return x ^ (x >> k->s2);
}

uint64_t mscx_test_data_mix(enum mscx_test_data d, uint64_t x)
{
    return recipe_mix(&k_recipes[d], x);
}

uint64_t mscx_test_data_seed(uint32_t rank, uint32_t launch, int out)
{
    return (uint64_t)rank * 7u + launch * 131u + (out ? 1u : 2u);
}

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

static inline void recipe_fill(const struct recipe *k, uint8_t *p, uint64_t n, enum mscx_dtype dt,
                               uint64_t seed)
{
    uint32_t es = mscx_dtype_size(dt);
    for (uint64_t i = 0; i + es <= n; i += es)
        k->elem(p + i, es, dt, recipe_mix(k, seed * k->seed_mul + i));
    for (uint64_t i = n / es * es; i < n; i++)
        p[i] = (uint8_t)recipe_mix(k, seed + i);
}

void mscx_test_data_fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint64_t seed, enum mscx_test_data d)
{
    /* a constant index each, so that the compiler folds the recipe into its loop */
    if (d == MSCX_TEST_DATA_SPREAD)
        recipe_fill(&k_recipes[MSCX_TEST_DATA_SPREAD], p, n, dt, seed);
    else
        recipe_fill(&k_recipes[MSCX_TEST_DATA_ANY], p, n, dt, seed);
}

uint64_t mscx_test_data_diff(const uint8_t *a, const uint8_t *b, uint64_t n)
{
    uint64_t at = 0;
    while (at < n && a[at] == b[at])
        at++;
    return at;
}

static void ref_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    const struct mscx_test_ref *ref = ctx;
    mscx_test_data_fill(out, out_bytes, ref->dt, mscx_test_data_seed(rank, iter, 1), ref->data);
    mscx_test_data_fill(in, in_bytes, ref->dt, mscx_test_data_seed(rank, iter, 0), ref->data);
}

static void ref_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct mscx_test_ref *ref = ctx;
    if (iter < ref->launches && rank < ref->nranks) {
        memcpy(ref->out[(size_t)iter * ref->nranks + rank], out, out_bytes);
        memcpy(ref->in[(size_t)iter * ref->nranks + rank], in, in_bytes);
    }
}

mscx_status_t mscx_test_ref_run(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                enum mscx_test_data d, struct mscx_test_ref *ref_p, char *err, size_t errlen)
{
    struct mscx_test_ref ref = {d, cfg->dtype, mscx_plan_nranks(plan), cfg->iters, NULL, NULL};
    size_t nbuf = (size_t)ref.launches * ref.nranks;
    mscx_status_t st = MSCX_ERR_NO_MEMORY;
    ref.out = calloc(nbuf ? nbuf : 1, sizeof(*ref.out));
    ref.in = calloc(nbuf ? nbuf : 1, sizeof(*ref.in));
    if (ref.out == NULL || ref.in == NULL)
        goto err_nomem;
    for (size_t i = 0; i < nbuf; i++) {
        ref.out[i] = calloc(1, cfg->out_bytes + 1);
        ref.in[i] = calloc(1, cfg->in_bytes + 1);
        if (ref.out[i] == NULL || ref.in[i] == NULL)
            goto err_nomem;
    }
    struct mscx_hostexec_cfg run = *cfg;
    run.fill = ref_fill;
    run.collect = ref_collect;
    run.ctx = &ref;
    st = mscx_hostexec_run(plan, &run, err, errlen);
    if (st != MSCX_OK)
        goto err_free;
    *ref_p = ref;
    return MSCX_OK;

err_nomem:
    snprintf(err, errlen, "test reference: out of memory");
err_free:
    mscx_test_ref_fini(&ref);
    return st;
}

void mscx_test_ref_fini(struct mscx_test_ref *ref)
{
    size_t nbuf = (size_t)ref->launches * ref->nranks;
    for (size_t i = 0; i < nbuf; i++) {
        if (ref->out)
            free(ref->out[i]);
        if (ref->in)
            free(ref->in[i]);
    }
    free(ref->out);
    free(ref->in);
    memset(ref, 0, sizeof(*ref));
}
