/* SPDX-License-Identifier: MIT */
/*
 * Test data for the tests that compare an executor with the host reference
 * executor bit for bit (test-gpu-exec on a GPU, test-launch-emulation emulating the
 * GPU programs on the host): deterministic buffer contents, and the host
 * reference's result of a call kept for comparison. Plain C, no check: the
 * gpu suite's harness links it too.
 *
 * The contents are part of what each test checks (which sums round, which
 * bytes a misplaced access would show), so each test keeps the recipe it was
 * written with, and the selftest pins both recipes' bytes: a change to them
 * is a test failure, not a silent change of the data.
 */
#ifndef MSCX_TEST_DATA_H
#define MSCX_TEST_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "mscx/hostexec.h"
#include "mscx/plan.h"

enum mscx_test_data {
    /*
     * test-gpu-exec: every dtype. fp32 multiples of 1/64 in [-156.25, 156.25];
     * fp16 and bf16 of exponents 2^-3 .. 2^2; integers and fp64 raw bytes.
     */
    MSCX_TEST_DATA_ANY,
    /*
     * test-launch-emulation: fp16 of exponents 2^-5 .. 2^5, 4-byte types as floats of
     * 2^-12 .. 2^11 (spread, so that a sum in another order rounds
     * differently); other dtypes raw bytes.
     */
    MSCX_TEST_DATA_SPREAD,
};

/** The 64-bit mixing function behind recipe @p d (also good for any other test randomness). */
uint64_t mscx_test_data_mix(enum mscx_test_data d, uint64_t x);

/** The seed of a rank's output (@p out != 0) or input buffer at a launch (0-based). */
uint64_t mscx_test_data_seed(uint32_t rank, uint32_t launch, int out);

/**
 * Fill @p n bytes at @p p with values of @p dt (finite where the recipe
 * says what they are), deterministic in (@p d, @p seed, byte); bytes past
 * the last whole element get noise.
 */
void mscx_test_data_fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint64_t seed, enum mscx_test_data d);

/** The first byte at which @p a and @p b differ; @p n when they do not. */
uint64_t mscx_test_data_diff(const uint8_t *a, const uint8_t *b, uint64_t n);

/**
 * The host reference executor's result of one call: every rank's output and
 * input after each launch, the buffers filled before each launch with
 * mscx_test_data_fill at mscx_test_data_seed (output first, then input: in
 * place, the input wins).
 */
struct mscx_test_ref {
    enum mscx_test_data data;
    enum mscx_dtype dt;
    uint32_t nranks, launches;
    uint8_t **out, **in; /* [launch * nranks + rank], out_bytes + 1 and in_bytes + 1 bytes */
};

/**
 * Run @p plan on the host executor for the call @p cfg describes (sizes,
 * dtype, op, format, iters = launches, schedule, timeout; its fill, collect
 * and ctx are not used) with recipe @p d, and keep the result in *@p ref_p
 * (release with mscx_test_ref_fini).
 * @return MSCX_OK, else the host executor's status (or MSCX_ERR_NO_MEMORY)
 *         with the reason in @p err (*@p ref_p is then not written).
 */
mscx_status_t mscx_test_ref_run(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                enum mscx_test_data d, struct mscx_test_ref *ref_p, char *err, size_t errlen);
void mscx_test_ref_fini(struct mscx_test_ref *ref);

/** A rank's output and input as the host reference left them after @p launch (0-based). */
static inline const uint8_t *mscx_test_ref_out(const struct mscx_test_ref *ref, uint32_t launch,
                                               uint32_t rank)
{
    return ref->out[(size_t)launch * ref->nranks + rank];
}

static inline const uint8_t *mscx_test_ref_in(const struct mscx_test_ref *ref, uint32_t launch, uint32_t rank)
{
    return ref->in[(size_t)launch * ref->nranks + rank];
}

#endif
