/* SPDX-License-Identifier: MIT */
/*
 * A silent NCCL stand-in for shim-bench-fallback: the handful of functions
 * the shim calls on a communicator's way (init, count, rank, device,
 * destroy, the collectives), each returning at once. The recording fake
 * formats every argument byte of every call, which costs far more than the
 * host path being measured.
 *
 * BENCH_NCCL_HOST=1 makes it the shim's host-memory NCCL (as the recording
 * fake is): the shim then builds a bootstrap and, over the fake executor, a
 * communicator state with an executor. Its AllGather copies at one rank,
 * which the bootstrap's exchanges need; nothing else moves bytes.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#define BENCH_EXPORT __attribute__((visibility("default")))
#define BENCH_NCOMMS 64

struct bench_comm {
    atomic_int used;
    int nranks, rank;
};

static struct bench_comm comms[BENCH_NCOMMS];

BENCH_EXPORT ncclResult_t ncclGetVersion(int *version);
BENCH_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
BENCH_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
BENCH_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
BENCH_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
BENCH_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm);
BENCH_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream);
BENCH_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
BENCH_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream);
BENCH_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream);
BENCH_EXPORT ncclResult_t ncclGroupStart(void);
BENCH_EXPORT ncclResult_t ncclGroupEnd(void);
BENCH_EXPORT const char *ncclGetLastError(ncclComm_t comm);
BENCH_EXPORT int mscxFakeNcclHostMemory(void);
BENCH_EXPORT const char *ncclGetErrorString(ncclResult_t result);

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    const char *v = getenv("FAKE_NCCL_VERSION"); /* as an older library's would */
    *version = v ? atoi(v) : NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* Communicators come from a static pool; a destroyed one's handle is handed out again, as malloc would. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    if (!comm || nranks <= 0 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    for (int k = 0; k < BENCH_NCOMMS; k++) {
        int free_slot = 0;
        if (!atomic_compare_exchange_strong(&comms[k].used, &free_slot, 1))
            continue;
        comms[k].nranks = nranks;
        comms[k].rank = rank;
        *comm = (ncclComm_t)&comms[k];
        return ncclSuccess;
    }
    return ncclSystemError;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = ((const struct bench_comm *)comm)->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = ((const struct bench_comm *)comm)->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return ncclInvalidArgument;
    *device = 0;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    atomic_store(&((struct bench_comm *)comm)->used, 0);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)stream;
    return comm ? ncclSuccess : ncclInvalidArgument;
}

int mscxFakeNcclHostMemory(void)
{
    static int host = -1;
    if (host < 0) {
        const char *v = getenv("BENCH_NCCL_HOST");
        host = v && !strcmp(v, "1");
    }
    return host;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    if (!comm)
        return ncclInvalidArgument;
    /* the bootstrap's exchanges (uint8, host memory); the bench's own calls are float */
    if (mscxFakeNcclHostMemory() && datatype == ncclUint8 && ((struct bench_comm *)comm)->nranks == 1 &&
        sendbuff != recvbuff)
        memmove(recvbuff, sendbuff, sendcount);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)recvcount, (void)datatype, (void)op, (void)stream;
    return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
    return comm ? ncclSuccess : ncclInvalidArgument;
}

/* Groups: the depth alone, as a library that launches nothing at the end. */
static __thread int group_depth;

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    return group_depth > 0 && group_depth-- ? ncclSuccess : ncclInvalidUsage;
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return result == ncclSuccess ? "no error" : "error";
}
