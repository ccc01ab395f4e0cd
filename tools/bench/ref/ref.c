/* SPDX-License-Identifier: MIT */
/* The hand-written baselines' rules: what they run and how much scratch they need. */
#include <stdio.h>
#include <string.h>

#include "ref.h"

enum mscx_ref_algo mscx_ref_algo_of_plan(const char *plan_name)
{
    if (plan_name == NULL)
        return MSCX_REF_NONE;
    if (strstr(plan_name, "alltoall"))
        return strstr(plan_name, "oneshot") ? MSCX_REF_ALLTOALL : MSCX_REF_NONE;
    if (strstr(plan_name, "oneshot"))
        return MSCX_REF_ONESHOT;
    if (strstr(plan_name, "twophase") || strstr(plan_name, "allreduce_pkt"))
        return MSCX_REF_TWOPHASE;
    return MSCX_REF_NONE;
}

const char *mscx_ref_algo_name(enum mscx_ref_algo algo)
{
    switch (algo) {
    case MSCX_REF_ONESHOT:
        return "oneshot";
    case MSCX_REF_TWOPHASE:
        return "twophase";
    case MSCX_REF_ALLTOALL:
        return "alltoall";
    default:
        return "none";
    }
}

/* Alltoall moves data only: any dtype and reduction; every peer's block whole 8-byte units. */
static const char *alltoall_why(enum mscx_dtype dtype, uint32_t nranks, uint64_t bytes)
{
    if ((unsigned)dtype >= MSCX_DT_COUNT)
        return "unknown data type";
    if (nranks < 1 || nranks > MSCX_REF_MAX_RANKS)
        return "rank count outside 1..16";
    if (bytes == 0 || bytes % (8ull * nranks))
        return "size is not a positive multiple of 8 bytes per peer";
    return NULL;
}

int mscx_ref_supports(enum mscx_ref_algo algo, enum mscx_dtype dtype, enum mscx_redop op, uint32_t nranks,
                      uint64_t bytes, const char **why_p)
{
    const char *why = NULL;
    if (algo == MSCX_REF_ALLTOALL)
        why = alltoall_why(dtype, nranks, bytes);
    else if (algo != MSCX_REF_ONESHOT && algo != MSCX_REF_TWOPHASE)
        why = "no hand-written kernel for this algorithm";
    else if (dtype != MSCX_DT_FP32 && dtype != MSCX_DT_FP16 && dtype != MSCX_DT_BF16 &&
             dtype != MSCX_DT_INT32 && dtype != MSCX_DT_UINT32)
        why = "data type not one of float, half, bfloat16, int32, uint32";
    else if (op != MSCX_REDOP_SUM)
        why = "reduction is not sum";
    else if (nranks < 1 || nranks > MSCX_REF_MAX_RANKS || (algo == MSCX_REF_TWOPHASE && nranks < 2))
        why = "rank count outside 1..16 (two-phase: 2..16)";
    else if (bytes == 0 || bytes % 8)
        why = "size is not a positive multiple of 8 bytes";
    if (why_p)
        *why_p = why;
    return why == NULL;
}

uint64_t mscx_ref_scratch_bytes(enum mscx_ref_algo algo, uint32_t nranks, uint64_t bytes)
{
    uint64_t units = bytes / 8, cu;
    if (nranks == 0)
        return 0;
    switch (algo) {
    case MSCX_REF_ONESHOT:
        /* two halves of nranks slots of 16-byte packets for the whole buffer */
        return 2 * (uint64_t)nranks * 16 * units;
    case MSCX_REF_TWOPHASE:
        /* two halves of two regions (contributions, results) of nranks chunk slots */
        cu = (units + nranks - 1) / nranks;
        return 2 * 2 * (uint64_t)nranks * 16 * cu;
    case MSCX_REF_ALLTOALL:
        /* two halves of nranks slots of 16-byte packets for one peer's block */
        return 2 * (uint64_t)nranks * 16 * (units / nranks);
    default:
        return 0;
    }
}

int mscx_ref_check_launch(const struct mscx_ref_launch *l, char *err, size_t errlen)
{
    const char *why = NULL;
    uint64_t need;
    if (!mscx_ref_supports(l->algo, l->dtype, MSCX_REDOP_SUM, l->nranks, l->bytes, &why)) {
        snprintf(err, errlen, "baseline %s, %llu bytes, %u ranks: %s", mscx_ref_algo_name(l->algo),
                 (unsigned long long)l->bytes, l->nranks, why);
        return -1;
    }
    if (l->rank >= l->nranks || l->send == NULL || l->recv == NULL || l->state == NULL) {
        snprintf(err, errlen, "baseline: rank %u of %u, or a NULL buffer or state", l->rank, l->nranks);
        return -1;
    }
    if (l->algo == MSCX_REF_ALLTOALL && l->send == l->recv) {
        snprintf(err, errlen,
                 "baseline alltoall: out of place only (the output is written while peers read)");
        return -1;
    }
    if ((uintptr_t)l->send % 8 || (uintptr_t)l->recv % 8) {
        snprintf(err, errlen, "baseline: buffers must be 8-byte aligned");
        return -1;
    }
    for (uint32_t r = 0; r < l->nranks; r++) {
        if (l->scratch[r] == NULL || (uintptr_t)l->scratch[r] % 16) {
            snprintf(err, errlen, "baseline: scratch of rank %u is NULL or not 16-byte aligned", r);
            return -1;
        }
    }
    if (l->blocks < 1 || l->blocks > MSCX_REF_MAX_BLOCKS || l->threads < 1 || l->threads > 1024) {
        snprintf(err, errlen, "baseline: %u blocks of %u threads (1..%d blocks, 1..1024 threads)", l->blocks,
                 l->threads, MSCX_REF_MAX_BLOCKS);
        return -1;
    }
    need = mscx_ref_scratch_bytes(l->algo, l->nranks, l->bytes);
    if (need > l->scratch_bytes) {
        snprintf(err, errlen,
                 "baseline %s, %llu bytes, %u ranks: needs %llu bytes of scratch, %llu allocated",
                 mscx_ref_algo_name(l->algo), (unsigned long long)l->bytes, l->nranks,
                 (unsigned long long)need, (unsigned long long)l->scratch_bytes);
        return -1;
    }
    return 0;
}
