/* SPDX-License-Identifier: MIT */
/*
 * A collective that goes to NCCL after all (a kept call of a group whose
 * launch was refused, or one sent to NCCL's simulation): the real function
 * it was made to, plain or nccl<Coll>Config, with its arguments.
 */
#include "shim_int.h"

#ifdef SHIM_HAVE_ncclAllReduceConfig
/* The real nccl<Coll>Config a call was made to, with its config pointer. */
static ncclResult_t config_forward(const struct shim_coll_call *c)
{
    const ncclCollConfig_t *cfg = c->config;
    switch (c->api) {
    case SHIM_FN_ncclAllReduceConfig: {
        REAL_OR_FAIL(fn, c->prof, ncclAllReduceConfig);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm, c->stream, cfg);
    }
    case SHIM_FN_ncclAllGatherConfig: {
        REAL_OR_FAIL(fn, c->prof, ncclAllGatherConfig);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, c->stream, cfg);
    }
    case SHIM_FN_ncclReduceScatterConfig: {
        REAL_OR_FAIL(fn, c->prof, ncclReduceScatterConfig);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm, c->stream, cfg);
    }
    case SHIM_FN_ncclBroadcastConfig: {
        REAL_OR_FAIL(fn, c->prof, ncclBroadcastConfig);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->root, c->comm, c->stream, cfg);
    }
    case SHIM_FN_ncclAlltoAllConfig: {
        REAL_OR_FAIL(fn, c->prof, ncclAlltoAllConfig);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, c->stream, cfg);
    }
    default:
        return shim_err_set(ncclInternalError, "mscx: %s cannot be forwarded as a collective", c->fn);
    }
}
#endif

/* The real collective a call was made to, with its arguments. */
ncclResult_t shim_coll_forward(const struct shim_coll_call *c)
{
    switch (c->api) {
    case SHIM_FN_ncclAllReduce: {
        REAL_OR_FAIL(fn, c->prof, ncclAllReduce);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm, c->stream);
    }
    case SHIM_FN_ncclAllGather: {
        REAL_OR_FAIL(fn, c->prof, ncclAllGather);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, c->stream);
    }
    case SHIM_FN_ncclReduceScatter: {
        REAL_OR_FAIL(fn, c->prof, ncclReduceScatter);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->comm, c->stream);
    }
    case SHIM_FN_ncclBroadcast: {
        REAL_OR_FAIL(fn, c->prof, ncclBroadcast);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->root, c->comm, c->stream);
    }
    case SHIM_FN_ncclBcast: {
        REAL_OR_FAIL(fn, c->prof, ncclBcast);
        return fn(c->recvbuf, c->count, c->dtype, c->root, c->comm, c->stream);
    }
#ifdef SHIM_HAVE_ncclAlltoAll
    case SHIM_FN_ncclAlltoAll: {
        REAL_OR_FAIL(fn, c->prof, ncclAlltoAll);
        return fn(c->sendbuf, c->recvbuf, c->count, c->dtype, c->comm, c->stream);
    }
#endif
#ifdef SHIM_HAVE_ncclAllReduceConfig
    case SHIM_FN_ncclAllReduceConfig:
    case SHIM_FN_ncclAllGatherConfig:
    case SHIM_FN_ncclReduceScatterConfig:
    case SHIM_FN_ncclBroadcastConfig:
    case SHIM_FN_ncclAlltoAllConfig:
        return config_forward(c);
#endif
    default:
        return shim_err_set(ncclInternalError, "mscx: %s cannot be forwarded as a collective", c->fn);
    }
}
