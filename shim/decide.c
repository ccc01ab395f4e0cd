/* SPDX-License-Identifier: MIT */
/*
 * What the shim does with a collective call, before anything is enqueued:
 * a count whose size overflows is the caller's error; on a communicator of
 * ours, NCCL's own argument checks, then the decision (route.c's pick, then
 * the symmetric window rule). route_call.c acts on it for a collective,
 * p2p.c for a send/recv group that makes an AlltoAll.
 */
#include <limits.h>
#include <stdint.h>

#include "comm_int.h"

/*
 * The size of a call must be a number: count x element size, times the rank
 * count for the collectives whose buffers hold one block per rank (AllGather,
 * ReduceScatter, AlltoAll), must fit in a size_t. A count past that is a
 * caller's error, answered with ncclInvalidArgument and its reason before
 * anything is routed, kept or forwarded: a wrapped byte count would
 * otherwise look like a small message.
 */
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

/* NCCL's own answer to a bad datatype, op or broadcast root of a collective on one of our comms. */
SHIM_HOT static ncclResult_t check_args(const struct shim_comm *c, const struct shim_coll_call *call)
{
    int has_op = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    int bad_root = call->root < 0 || (uint32_t)call->root >= c->nranks;
    if (call->coll == MSCX_COLL_BROADCAST && c->nranks && bad_root)
        return shim_err_set(ncclInvalidArgument,
                            "mscx: %s: invalid root %d (root should be in the 0..%u range)", call->fn,
                            call->root, c->nranks - 1);
    if ((int)call->dtype < 0 || ((int)call->dtype >= (int)ncclNumTypes && !shim_dtype_newer(call->dtype)))
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid datatype %d", call->fn, (int)call->dtype);
    if (has_op && (int)call->op < 0)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid reduction operation %d", call->fn,
                            (int)call->op);
    return ncclSuccess;
}

/* The routing decision for a call of @p msg bytes: @return the route, or -1 with the reason. */
SHIM_HOT int shim_comm_decide(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                              enum shim_reason *why_p)
{
    if (!c->exec) {
        *why_p = SHIM_WHY_NO_STATE;
        return -1;
    }
    if (call->config_nccl) { /* the same config on every rank (NCCL's rule for nccl<Coll>Config) */
        *why_p = SHIM_WHY_CONFIG;
        return -1;
    }
    struct shim_route_query q = {
        .coll = call->coll,
        .nranks = c->nranks,
        .ranks_per_node = c->rpn,
        .msg_bytes = msg,
        .dtype = call->dtype,
        .op = call->op,
        .root = call->root,
        .forced_mask = c->forced,
        .group_fallback = shim_group_simulated(),
        .comm = call->comm,
    };
    int pick = (unsigned)call->coll < MSCX_COLL_COUNT
                   ? shim_route_pick_windowed(&q, c->route, c->nroute, &c->win[call->coll], why_p)
                   : shim_route_pick(&q, c->route, c->nroute, why_p);
    /*
     * Buffers in symmetric NCCL windows may take NCCL's symmetric kernels, faster than the NCCL
     * our plans' ranges were measured against: only a plan measured faster than those takes them.
     * A local fact, but rank-uniform as NCCL's own choice of those kernels is: a symmetric window
     * binds every rank to pass such buffers at the same offsets.
     */
    if (pick >= 0 && !c->route[pick].beats_nccl_window && shim_window_covers_call(call)) {
        *why_p = SHIM_WHY_WINDOW;
        return -1;
    }
    return pick;
}

SHIM_HOT int shim_comm_pick(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t *msg_p,
                            enum shim_reason *why_p, ncclResult_t *res_p)
{
    if ((*res_p = check_args(c, call)) != ncclSuccess)
        return SHIM_PICK_ANSWERED;
    uint64_t msg = (uint64_t)call->count * shim_dtype_bytes(call->dtype);
    if (call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER ||
        call->coll == MSCX_COLL_ALLTOALL)
        msg *= c->nranks ? c->nranks : 1;
    *msg_p = msg;
    if (shim_dtype_newer(call->dtype)) {
        *why_p = SHIM_WHY_DTYPE;
        return -1;
    }
    return shim_comm_decide(c, call, msg, why_p);
}
