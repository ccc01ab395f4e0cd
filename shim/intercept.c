/* SPDX-License-Identifier: MIT */
/*
 * The intercepted NCCL functions. Each forwards to the real one with the same
 * arguments (and returns its result) unless our executor runs the call.
 * prof is 1 for the pnccl* entry points, which forward to the real pnccl*.
 *
 * Groups: each collective routes on its own merits; one that routes is kept
 * and launched around the outermost ncclGroupEnd, in issue order with the
 * group's NCCL-bound calls (group.c, group_end.c); see shim/README.md.
 *
 * A collective on a communicator we did not set up (not in comm.c's table)
 * is forwarded untouched: never checked, counted or routed. Calls from inside
 * an NCCL library never get here (caller.c).
 */
#include <stddef.h>
#include <string.h>

#include "mscx/log.h"
#include "rendezvous.h"
#include "shim_int.h"

SHIM_HOT int shim_coll_try_route(const struct shim_coll_call *call, ncclResult_t *res_p)
{
    if (!shim_routing_on() && !shim_comm_deferred_disabled())
        return 0;
    if (shim_comm_try_route(call, res_p))
        return 1;
    if (shim_group_collecting)
        shim_p2p_before_forward(call->comm); /* an NCCL-bound call of the group */
    return 0;
}

SHIM_HOT static int try_route(int prof, enum shim_fn api, enum mscx_coll coll, const void *send, void *recv,
                              size_t count, ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, ncclResult_t *res_p)
{
    struct shim_coll_call call = {
        .fn = shim_fn_names[api],
        .api = api,
        .prof = prof,
        .coll = coll,
        .sendbuf = send,
        .recvbuf = recv,
        .count = count,
        .dtype = dt,
        .op = op,
        .root = root,
        .comm = comm,
        .stream = stream,
    };
    return shim_coll_try_route(&call, res_p);
}

SHIM_HOT ncclResult_t shim_ncclAllReduce(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclAllReduce);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAllReduce, MSCX_COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op,
                  0, comm, stream, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

SHIM_HOT ncclResult_t shim_ncclAllGather(int prof, const void *sendbuff, void *recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclAllGather);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAllGather, MSCX_COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                  ncclSum, 0, comm, stream, &res))
        return res;
    return fn(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

SHIM_HOT ncclResult_t shim_ncclReduceScatter(int prof, const void *sendbuff, void *recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclReduceScatter);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclReduceScatter, MSCX_COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount,
                  datatype, op, 0, comm, stream, &res))
        return res;
    return fn(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

SHIM_HOT ncclResult_t shim_ncclBroadcast(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclBroadcast);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclBroadcast, MSCX_COLL_BROADCAST, sendbuff, recvbuff, count, datatype,
                  ncclSum, root, comm, stream, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

SHIM_HOT ncclResult_t shim_ncclBcast(int prof, void *buff, size_t count, ncclDataType_t datatype, int root,
                                     ncclComm_t comm, cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclBcast);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclBcast, MSCX_COLL_BROADCAST, buff, buff, count, datatype, ncclSum, root,
                  comm, stream, &res))
        return res;
    return fn(buff, count, datatype, root, comm, stream);
}

#ifdef SHIM_HAVE_ncclAlltoAll
/* NCCL 2.28 and later; count is per peer (the message is count x ranks elements each way). */
SHIM_HOT ncclResult_t shim_ncclAlltoAll(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    REAL_OR_FAIL(fn, prof, ncclAlltoAll);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAlltoAll, MSCX_COLL_ALLTOALL, sendbuff, recvbuff, count, datatype,
                  ncclSum, 0, comm, stream, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, comm, stream);
}
#endif

/* ---- point to point ---- */

SHIM_HOT ncclResult_t shim_ncclSend(int prof, const void *sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream)
{
    struct shim_p2p_call p = {
        .prof = prof,
        .is_send = 1,
        .sendbuf = sendbuff,
        .count = count,
        .dtype = datatype,
        .peer = peer,
        .comm = comm,
        .stream = stream,
    };
    return shim_p2p_call(&p);
}

SHIM_HOT ncclResult_t shim_ncclRecv(int prof, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream)
{
    struct shim_p2p_call p = {
        .prof = prof,
        .is_send = 0,
        .recvbuf = recvbuff,
        .count = count,
        .dtype = datatype,
        .peer = peer,
        .comm = comm,
        .stream = stream,
    };
    return shim_p2p_call(&p);
}

/* ---- groups ---- */

SHIM_HOT ncclResult_t shim_ncclGroupStart(int prof)
{
    REAL_OR_FAIL(fn, prof, ncclGroupStart);
    ncclResult_t res = fn();
    if (res == ncclSuccess)
        shim_group_enter();
    return res;
}

SHIM_HOT ncclResult_t shim_ncclGroupEnd(int prof)
{
    REAL_OR_FAIL(fn, prof, ncclGroupEnd);
    shim_group_before_end();
    return shim_group_end(prof, fn());
}

#ifdef SHIM_HAVE_ncclGroupSimulateEnd
/* It ends the group as ncclGroupEnd does, launching nothing: the kept calls go to NCCL first, simulated. */
ncclResult_t shim_ncclGroupSimulateEnd(int prof, ncclSimInfo_t *simInfo)
{
    REAL_OR_FAIL(fn, prof, ncclGroupSimulateEnd);
    shim_group_before_simulate();
    return shim_group_end(prof, fn(simInfo));
}
#endif

/* ---- communicator lifecycle ---- */

static int nonblocking(const ncclConfig_t *config)
{
    return config && config->magic == 0xcafebeef &&
           config->size >= offsetof(ncclConfig_t, blocking) + sizeof(int) && config->blocking == 0;
}

/*
 * Our rendezvous marker in the unused tail of NCCL's fresh @p id (for an
 * ncclCommGrow of a communicator of @p grow_from ranks; 0 otherwise); under
 * MSCX_DISABLE, or where it cannot be marked, the id stays exactly NCCL's.
 */
static void mark_id(ncclUniqueId *id, uint32_t grow_from)
{
    const struct mscx_config *cfg = shim_config_lenient();
    if (id && !(cfg && cfg->disable))
        (void)shim_rdv_mark(id, shim_rdv_bound_ms(cfg), grow_from);
}

/*
 * Set up now, after the outermost ncclGroupEnd when inside a group, or, for
 * a non-blocking communicator (whose init may answer ncclInProgress), at
 * its first collective outside a group (shim_comm_setup_deferred()).
 */
static ncclResult_t after_init(int prof, ncclResult_t res, ncclComm_t comm, const char *how,
                               const ncclConfig_t *config, const struct shim_join *j)
{
    int nb = nonblocking(config);
    /* under MSCX_DISABLE or a bad setting too: comm_setup still joins the agreement */
    if ((res != ncclSuccess && !(nb && res == ncclInProgress)) || !comm || !shim_config_lenient())
        return res;
    if (nb) {
        /* in a group, with others of this thread maybe: statistics only, calls go to NCCL */
        ncclResult_t r = shim_group_depth() > 0 ? shim_comm_setup_nonblocking(prof, comm, how)
                                                : shim_comm_defer_setup(prof, comm, how, j);
        return r != ncclSuccess ? r : res;
    }
    if (shim_group_depth() > 0) {
        shim_group_defer(comm, j);
        return res;
    }
    return shim_comm_setup(prof, comm, how, j);
}

ncclResult_t shim_ncclCommInitRank(int prof, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    REAL_OR_FAIL(fn, prof, ncclCommInitRank);
    ncclResult_t res = fn(comm, nranks, commId, rank);
    struct shim_join j;
    shim_join_by_id(&j, &commId);
    return after_init(prof, res, comm ? *comm : NULL, "by ncclCommInitRank", NULL, &j);
}

ncclResult_t shim_ncclCommInitRankConfig(int prof, ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                         int rank, ncclConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclCommInitRankConfig);
    ncclResult_t res = fn(comm, nranks, commId, rank, config);
    struct shim_join j;
    shim_join_by_id(&j, &commId);
    return after_init(prof, res, comm ? *comm : NULL, "by ncclCommInitRankConfig", config, &j);
}

#ifdef SHIM_HAVE_ncclCommInitRankScalable
ncclResult_t shim_ncclCommInitRankScalable(int prof, ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                           ncclUniqueId *commIds, ncclConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclCommInitRankScalable);
    ncclResult_t res = fn(newcomm, nranks, myrank, nId, commIds, config);
    struct shim_join j; /* every rank holds all nId ids: the first is everyone's */
    shim_join_by_id(&j, nId > 0 ? commIds : NULL);
    return after_init(prof, res, newcomm ? *newcomm : NULL, "by ncclCommInitRankScalable", config, &j);
}
#endif

ncclResult_t shim_ncclCommInitAll(int prof, ncclComm_t *comm, int ndev, const int *devlist)
{
    REAL_OR_FAIL(fn, prof, ncclCommInitAll);
    ncclResult_t res = fn(comm, ndev, devlist);
    if (res != ncclSuccess || !comm || !shim_routing_on())
        return res;
    return shim_comm_setup_several(prof, comm, NULL, ndev, "by ncclCommInitAll");
}

ncclResult_t shim_ncclCommSplit(int prof, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                ncclConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclCommSplit);
    ncclResult_t res = fn(comm, color, key, newcomm, config);
    struct shim_join j;
    shim_join_by_parent(&j, comm);
    return after_init(prof, res, newcomm ? *newcomm : NULL, "by ncclCommSplit", config, &j);
}

#ifdef SHIM_HAVE_ncclCommGrow
/*
 * Every rank of the grown communicator calls ncclCommGrow (the parent's with
 * comm set, the new ones with comm NULL). How its ranks meet is decided
 * first (grow.c), outside any group: in a group, after the outermost
 * ncclGroupEnd. Then each sets it up as after ncclCommInitRank, a
 * non-blocking one at its first collective.
 */
ncclResult_t shim_ncclCommGrow(int prof, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                               ncclComm_t *newcomm, ncclConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclCommGrow);
    ncclResult_t res = fn(comm, nRanks, uniqueId, rank, newcomm, config);
    if ((res != ncclSuccess && res != ncclInProgress) || !newcomm || !*newcomm || !shim_config_lenient())
        return res;
    struct shim_join j;
    shim_join_grow(&j, prof, comm, nRanks, uniqueId, rank);
    j.grow.nonblocking = nonblocking(config);
    if (shim_group_depth() > 0) {
        shim_group_defer(*newcomm, &j);
        return res;
    }
    shim_join_resolve(&j);
    return after_init(prof, res, *newcomm, "by ncclCommGrow", config, &j);
}
#endif

#ifdef SHIM_HAVE_ncclCommGetUniqueId
/* The id for an ncclCommGrow of @p comm: marked as ncclGetUniqueId's, with @p comm's rank count. */
ncclResult_t shim_ncclCommGetUniqueId(int prof, ncclComm_t comm, ncclUniqueId *uniqueId)
{
    REAL_OR_FAIL(fn, prof, ncclCommGetUniqueId);
    ncclResult_t res = fn(comm, uniqueId);
    shim_fn_ncclCommCount_t count = SHIM_REAL(prof, ncclCommCount);
    int nranks = 0;
    if (res == ncclSuccess && count && count(comm, &nranks) == ncclSuccess && nranks > 0)
        mark_id(uniqueId, (uint32_t)nranks);
    return res;
}
#endif

ncclResult_t shim_comm_after_resume(int prof, ncclResult_t res, ncclComm_t comm)
{
    struct shim_join j;
    shim_join_by_parent(&j, comm);
    return after_init(prof, res, comm, "by ncclCommResume", NULL, &j);
}

#ifdef SHIM_HAVE_ncclCommShrink
ncclResult_t shim_ncclCommShrink(int prof, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                 ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    REAL_OR_FAIL(fn, prof, ncclCommShrink);
    /* NCCL_SHRINK_ABORT ends the parent's operations: ours stop first, and the parent routes no more */
    struct shim_comm *c = shrinkFlags & NCCL_SHRINK_ABORT ? shim_comm_stop(comm) : NULL;
    ncclResult_t res = fn(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
    shim_comm_stop_finish(c, "shrink");
    struct shim_join j;
    shim_join_by_parent(&j, comm);
    return after_init(prof, res, newcomm ? *newcomm : NULL, "by ncclCommShrink", config, &j);
}
#endif

ncclResult_t shim_ncclCommFinalize(int prof, ncclComm_t comm)
{
    /* Our kernels are ordered on the application's streams: nothing to drain here. */
    REAL_OR_FAIL(fn, prof, ncclCommFinalize);
    return fn(comm);
}

ncclResult_t shim_ncclCommDestroy(int prof, ncclComm_t comm)
{
    REAL_OR_FAIL(fn, prof, ncclCommDestroy);
    shim_comm_teardown(comm, 0);
    shim_join_forget(comm);
    return fn(comm);
}

/*
 * Abort, revoke and shrink with NCCL_SHRINK_ABORT: our kernels are told to
 * stop first, the real call runs, and our memory is released after it
 * without any CUDA call that waits on the device (shim_comm_stop).
 */
ncclResult_t shim_ncclCommAbort(int prof, ncclComm_t comm)
{
    REAL_OR_FAIL(fn, prof, ncclCommAbort);
    struct shim_comm *c = shim_comm_stop(comm);
    shim_join_forget(comm);
    ncclResult_t res = fn(comm);
    shim_comm_stop_finish(c, "abort");
    return res;
}

#ifdef SHIM_HAVE_ncclCommRevoke
/* A revoked communicator routes nothing: its later calls get the real NCCL's answer. */
ncclResult_t shim_ncclCommRevoke(int prof, ncclComm_t comm, int revokeFlags)
{
    REAL_OR_FAIL(fn, prof, ncclCommRevoke);
    struct shim_comm *c = shim_comm_stop(comm);
    ncclResult_t res = fn(comm, revokeFlags);
    shim_comm_stop_finish(c, "revoke");
    return res;
}
#endif

ncclResult_t shim_ncclCommGetAsyncError(int prof, ncclComm_t comm, ncclResult_t *asyncError)
{
    REAL_OR_FAIL(fn, prof, ncclCommGetAsyncError);
    ncclResult_t res = fn(comm, asyncError);
    if (res == ncclSuccess && asyncError && *asyncError == ncclSuccess) {
        ncclResult_t ours = shim_comm_async_error(comm);
        if (ours != ncclSuccess) {
            *asyncError = ours;
            shim_err_set(ours, "mscx: an mscx kernel of comm %p failed (timeout or abort)", (void *)comm);
        }
    }
    return res;
}

/* ---- errors and version ---- */

const char *shim_ncclGetLastError(int prof, ncclComm_t comm)
{
    if (shim_err_is_set())
        return shim_err_text();
    shim_fn_ncclGetLastError_t fn = SHIM_REAL(prof, ncclGetLastError);
    if (!fn)
        return shim_err_text();
    return fn(comm);
}

static const char *own_error_string(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *shim_ncclGetErrorString(int prof, ncclResult_t result)
{
    shim_fn_ncclGetErrorString_t fn = SHIM_REAL(prof, ncclGetErrorString);
    if (!fn)
        return own_error_string(result);
    /* Keeps the thread's last error: callers read this and ncclGetLastError() in one expression. */
    return fn(result);
}

ncclResult_t shim_ncclGetVersion(int prof, int *version)
{
    /* Always the real NCCL's version: applications gate features on it. */
    REAL_OR_FAIL(fn, prof, ncclGetVersion);
    return fn(version);
}

ncclResult_t shim_ncclGetUniqueId(int prof, ncclUniqueId *uniqueId)
{
    /* NCCL's id, with our rendezvous marker (rendezvous.c) */
    REAL_OR_FAIL(fn, prof, ncclGetUniqueId);
    ncclResult_t res = fn(uniqueId);
    if (res == ncclSuccess)
        mark_id(uniqueId, 0);
    return res;
}
