/* SPDX-License-Identifier: MIT */
/*
 * A second NCCL stand-in for the two-copies test: another libnccl.so.2 (same
 * soname, another directory), with its own version (FAKEB_VERSION), its own
 * communicators and its own group state. Like real NCCL, its functions call
 * each other through their exported names, so those calls go through the PLT
 * and bind to whatever the process's global scope puts first (a preloaded
 * shim): ncclCommInitRank asks ncclGetVersion, every collective checks
 * ncclCommGetAsyncError (NCCL's ncclCommEnsureReady) and runs between
 * ncclGroupStart and ncclGroupEnd, whose outermost end executes the queued
 * operations; ncclBcast calls ncclBroadcast. Built with
 * -fsemantic-interposition so the compiler keeps those calls on the PLT
 * (the shim-two-copies-plt test checks the relocations).
 *
 * "Device" memory is host memory and streams are ignored; world size 1: a
 * collective's result is its input.
 */
#include <stdint.h>
#include <string.h>

#include "fake_copyb.h"

#define FAKEB_EXPORT __attribute__((visibility("default")))
#define FAKEB_MAGIC 0xfa4eb0b0c033c033ull
#define FAKEB_NCOMMS 16
#define FAKEB_NPENDING 32

struct fakeb_op {
    const void *send;
    void *recv;
    size_t bytes;
    struct fakeb_comm *comm;
};

struct fakeb_comm {
    uint64_t magic;
    int version; /* what ncclGetVersion said at init */
    int nranks;
    int ops; /* collectives executed */
    ncclResult_t async;
};

static struct fakeb_comm comms[FAKEB_NCOMMS];
static __thread int group_depth;
static __thread struct fakeb_op pending[FAKEB_NPENDING];
static __thread int npending;

static struct fakeb_comm *comm_of(ncclComm_t comm)
{
    struct fakeb_comm *c = (struct fakeb_comm *)comm;
    for (int i = 0; i < FAKEB_NCOMMS; i++)
        if (c == &comms[i])
            return c->magic == FAKEB_MAGIC ? c : NULL;
    return NULL;
}

static size_t type_bytes(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

FAKEB_EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = FAKEB_VERSION;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    memset(id->internal, 0xb0, sizeof(id->internal));
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    if (!comm || nranks != 1 || rank != 0)
        return ncclInvalidArgument;
    for (int i = 0; i < FAKEB_NCOMMS; i++) {
        struct fakeb_comm *c = &comms[i];
        if (c->magic == FAKEB_MAGIC)
            continue;
        memset(c, 0, sizeof(*c));
        ncclResult_t res = ncclGetVersion(&c->version);
        if (res != ncclSuccess)
            return res;
        c->magic = FAKEB_MAGIC;
        c->nranks = nranks;
        *comm = (ncclComm_t)c;
        return ncclSuccess;
    }
    return ncclSystemError;
}

FAKEB_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    struct fakeb_comm *c = comm_of(comm);
    if (!c)
        return ncclInvalidArgument;
    c->magic = 0;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    struct fakeb_comm *c = comm_of(comm);
    if (!c || !count)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm_of(comm) || !rank)
        return ncclInvalidArgument;
    *rank = 0;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm_of(comm) || !device)
        return ncclInvalidArgument;
    *device = 0;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    struct fakeb_comm *c = comm_of(comm);
    if (!c || !asyncError)
        return ncclInvalidArgument;
    *asyncError = c->async;
    return ncclSuccess;
}

FAKEB_EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    return result == ncclSuccess ? "fakeb: no error" : "fakeb: error";
}

FAKEB_EXPORT ncclResult_t ncclGroupStart(void); /* nccl.h declares it without (void) */
FAKEB_EXPORT ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

FAKEB_EXPORT ncclResult_t ncclGroupEnd(void);
FAKEB_EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    for (int i = 0; i < npending; i++) {
        if (pending[i].recv != pending[i].send)
            memmove(pending[i].recv, pending[i].send, pending[i].bytes);
        pending[i].comm->ops++;
    }
    npending = 0;
    return ncclSuccess;
}

/* NCCL's enqueue: check the comm is ready, then queue the op inside a group. */
static ncclResult_t enqueue(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm)
{
    struct fakeb_comm *c = comm_of(comm);
    ncclResult_t async = ncclSuccess;
    if (!c || !recv || !send || type_bytes(dt) == 0)
        return ncclInvalidArgument;
    ncclResult_t res = ncclCommGetAsyncError(comm, &async);
    if (res != ncclSuccess)
        return res;
    if (async != ncclSuccess)
        return async;
    if ((res = ncclGroupStart()) != ncclSuccess)
        return res;
    if (npending < FAKEB_NPENDING)
        pending[npending++] = (struct fakeb_op){send, recv, count * type_bytes(dt), c};
    else
        res = ncclSystemError;
    ncclResult_t end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

FAKEB_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream)
{
    (void)stream;
    if ((int)op < 0 || op >= ncclNumOps)
        return ncclInvalidArgument;
    return enqueue(sendbuff, recvbuff, count, datatype, comm);
}

FAKEB_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream)
{
    (void)stream;
    if (root != 0)
        return ncclInvalidArgument;
    return enqueue(sendbuff, recvbuff, count, datatype, comm);
}

FAKEB_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

FAKEB_EXPORT int fakeb_comm_info(ncclComm_t comm, int *version, int *ops)
{
    struct fakeb_comm *c = comm_of(comm);
    if (!c)
        return -1;
    *version = c->version;
    *ops = c->ops;
    return 0;
}
