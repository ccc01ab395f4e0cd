/* SPDX-License-Identifier: MIT */
/*
 * nccl<Coll>Config (NCCL 2.31 and later): a collective with a per-call
 * ncclCollConfig_t. NCCL requires the same config on every rank, so what
 * the config asks for is a fact every rank shares, and the decision below
 * is the same everywhere:
 *
 *  - no config, or one that leaves the algorithm to the library (no
 *    algSelection) and asks for no launch-completion event: routed exactly
 *    as the plain call (resource hints such as minCTAs, the profiler tag and
 *    vendor extensions only tune NCCL's own kernels);
 *  - an algSelection (forced or not), a launch-completion event, or a
 *    config that is not valid (size, magic): NCCL serves the call, which
 *    answers as it does (reason "config" in the summary).
 *
 * A call that goes to NCCL, now or when its group does (forward.c),
 * reaches the real nccl<Coll>Config with the application's config pointer.
 */
#include <stddef.h>
#include <string.h>

#include "shim_int.h"

#ifdef SHIM_HAVE_ncclAllReduceConfig

/* The config value of @p field: the one in @p cfg when its size covers it, else @p dflt. */
#define CFG_FIELD(cfg, field, dflt)                                                                          \
    ((cfg)->size >= offsetof(ncclCollConfig_t, field) + sizeof((cfg)->field) ? (cfg)->field : (dflt))

/** 1 when @p cfg asks for NCCL itself (see the file comment). */
static int config_wants_nccl(const ncclCollConfig_t *cfg)
{
    if (!cfg)
        return 0;
    if (cfg->magic != NCCL_API_MAGIC || cfg->size < offsetof(ncclCollConfig_t, ext) + sizeof(cfg->ext))
        return 1;
    const char *alg = CFG_FIELD(cfg, algSelection, NULL);
    if (alg && alg[0])
        return 1;
    return CFG_FIELD(cfg, launchCompletionEvent, NULL) != NULL;
}

static int try_route(int prof, enum shim_fn api, enum mscx_coll coll, const void *send, void *recv,
                     size_t count, ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                     cudaStream_t stream, const ncclCollConfig_t *cfg, ncclResult_t *res_p)
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
        .config = cfg,
        .config_nccl = config_wants_nccl(cfg),
    };
    return shim_coll_try_route(&call, res_p);
}

ncclResult_t shim_ncclAllReduceConfig(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream, const ncclCollConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclAllReduceConfig);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAllReduceConfig, MSCX_COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype,
                  op, 0, comm, stream, config, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, op, comm, stream, config);
}

ncclResult_t shim_ncclAllGatherConfig(int prof, const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclAllGatherConfig);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAllGatherConfig, MSCX_COLL_ALLGATHER, sendbuff, recvbuff, sendcount,
                  datatype, ncclSum, 0, comm, stream, config, &res))
        return res;
    return fn(sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
}

ncclResult_t shim_ncclReduceScatterConfig(int prof, const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream, const ncclCollConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclReduceScatterConfig);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclReduceScatterConfig, MSCX_COLL_REDUCESCATTER, sendbuff, recvbuff,
                  recvcount, datatype, op, 0, comm, stream, config, &res))
        return res;
    return fn(sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
}

ncclResult_t shim_ncclBroadcastConfig(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclBroadcastConfig);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclBroadcastConfig, MSCX_COLL_BROADCAST, sendbuff, recvbuff, count, datatype,
                  ncclSum, root, comm, stream, config, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, root, comm, stream, config);
}

ncclResult_t shim_ncclAlltoAllConfig(int prof, const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                     const ncclCollConfig_t *config)
{
    REAL_OR_FAIL(fn, prof, ncclAlltoAllConfig);
    ncclResult_t res;
    if (try_route(prof, SHIM_FN_ncclAlltoAllConfig, MSCX_COLL_ALLTOALL, sendbuff, recvbuff, count, datatype,
                  ncclSum, 0, comm, stream, config, &res))
        return res;
    return fn(sendbuff, recvbuff, count, datatype, comm, stream, config);
}

#endif /* SHIM_HAVE_ncclAllReduceConfig */
