/* SPDX-License-Identifier: MIT */
/*
 * The size of a call must be a number: count x element size, times the rank
 * count for the collectives whose buffers hold one block per rank (AllGather,
 * ReduceScatter, AlltoAll), must fit in a size_t. A count past that is a
 * caller's error, answered with ncclInvalidArgument and its reason before
 * anything is routed, kept or forwarded: a wrapped byte count would
 * otherwise look like a small message.
 */
#include <limits.h>
#include <stdint.h>

#include "shim_int.h"

/* The rank count of @p comm from the real NCCL, 0 when it cannot say. */
static uint64_t comm_ranks(int prof, ncclComm_t comm)
{
    shim_fn_ncclCommCount_t count = SHIM_REAL(prof, ncclCommCount);
    int n = 0;
    if (!count || !comm || count(comm, &n) != ncclSuccess || n <= 0)
        return 0;
    return (uint64_t)n;
}

int shim_count_overflows(int prof, const char *fn, size_t count, ncclDataType_t dt, int per_rank,
                         ncclComm_t comm, ncclResult_t *res_p)
{
    uint64_t es = shim_dtype_bytes(dt), n;
    if (count > SIZE_MAX / es) {
        *res_p =
            shim_err_set(ncclInvalidArgument, "mscx: %s: count %zu x %llu-byte elements overflows a size_t",
                         fn, count, (unsigned long long)es);
        return 1;
    }
    uint64_t bytes = (uint64_t)count * es;
    if (!per_rank || bytes <= SIZE_MAX / INT_MAX) /* no rank count can take it past SIZE_MAX */
        return 0;
    n = comm_ranks(prof, comm);
    if (n == 0 || bytes <= SIZE_MAX / n)
        return 0;
    *res_p = shim_err_set(ncclInvalidArgument,
                          "mscx: %s: count %zu x %llu-byte elements x %llu ranks overflows a size_t", fn,
                          count, (unsigned long long)es, (unsigned long long)n);
    return 1;
}
