/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for the real libnccl on a GPU machine (test_gpu_abort.c): just
 * what the shim's setup needs, on device memory, and an abort that behaves
 * as NCCL's: it ends its own kernel (the foreign kernel, through the flag
 * the test registers) and then frees device memory, which waits for every
 * kernel on the device. Several processes are the ranks of one
 * communicator through files in FAKE_GPU_NCCL_WORLD (ncclAllGather).
 * Revoked and aborted communicators refuse collectives (ncclInvalidUsage).
 * Sends and recvs do nothing and are counted (test_gpu_sendrecv.c), as are
 * AlltoAlls, which copy at one rank and are refused at more.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define EXPORT __attribute__((visibility("default")))

struct ncclComm {
    int nranks, rank, dev;
    int revoked;
    void *dbuf; /* freed at abort and destroy, as NCCL frees its buffers */
};

/* The test's hooks (dlsym): the foreign kernel's flag, and how long the last abort took. */
EXPORT void mscxFakeGpuSetFlag(volatile int *flag);
EXPORT long long mscxFakeGpuLastAbortNs(void);
EXPORT void mscxFakeGpuP2pCalls(long long *sends, long long *recvs, long long *alltoalls);

static volatile int *g_flag; /* the foreign kernel's flag (mapped host memory) */
static long long g_last_abort_ns;
static unsigned g_seq;
static long long g_sends, g_recvs, g_alltoalls; /* calls that reached this library */

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

EXPORT void mscxFakeGpuSetFlag(volatile int *flag)
{
    g_flag = flag;
}

EXPORT long long mscxFakeGpuLastAbortNs(void)
{
    return g_last_abort_ns;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    *version = 22809;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof(*id));
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (!c)
        return ncclSystemError;
    c->nranks = nranks;
    c->rank = rank;
    cudaGetDevice(&c->dev);
    if (cudaMalloc(&c->dbuf, 4096) != cudaSuccess) {
        free(c);
        return ncclUnhandledCudaError;
    }
    *comm = c;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t *config)
{
    (void)config;
    return ncclCommInitRank(comm, nranks, id, rank);
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    *count = comm->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    *rank = comm->rank;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    *device = comm->dev;
    return ncclSuccess;
}

static int put_file(const char *path, const void *p, size_t n)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n && rename(tmp, path) == 0 ? 0 : -1;
}

static int get_file(const char *path, void *p, size_t n)
{
    for (int ms = 0; ms < 60000; ms++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t r = fread(p, 1, n, f);
            fclose(f);
            if (r == n)
                return 0;
        }
        usleep(1000);
    }
    return -1;
}

/* Bytes only (the shim's bootstrap uses ncclUint8). */
EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                  ncclComm_t comm, cudaStream_t stream)
{
    if (comm->revoked || dt != ncclUint8)
        return ncclInvalidUsage;
    char *host = malloc(count * (size_t)comm->nranks + 1);
    const char *world = getenv("FAKE_GPU_NCCL_WORLD");
    unsigned seq = g_seq++;
    ncclResult_t res = ncclSystemError;
    if (!host ||
        cudaMemcpyAsync(host + count * (size_t)comm->rank, send, count, cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        goto out;
    for (int r = 0; r < comm->nranks && comm->nranks > 1; r++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/ag.%u.%d", world ? world : ".", seq, r);
        if (r == comm->rank ? put_file(path, host + count * (size_t)r, count)
                            : get_file(path, host + count * (size_t)r, count))
            goto out;
    }
    if (cudaMemcpyAsync(recv, host, count * (size_t)comm->nranks, cudaMemcpyHostToDevice, stream) ==
            cudaSuccess &&
        cudaStreamSynchronize(stream) == cudaSuccess)
        res = ncclSuccess;
out:
    free(host);
    return res;
}

/* Never reached on a routed call; a forwarded one copies (one rank) or is refused (revoked). */
EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)op;
    if (comm->revoked)
        return ncclInvalidUsage;
    size_t es = dt == ncclFloat16 || dt == ncclBfloat16 ? 2 : dt == ncclFloat64 || dt == ncclInt64 ? 8 : 4;
    if (comm->nranks != 1)
        return ncclInternalError;
    return send == recv ||
                   cudaMemcpyAsync(recv, send, count * es, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
}

EXPORT void mscxFakeGpuP2pCalls(long long *sends, long long *recvs, long long *alltoalls)
{
    *sends = __atomic_load_n(&g_sends, __ATOMIC_RELAXED);
    *recvs = __atomic_load_n(&g_recvs, __ATOMIC_RELAXED);
    *alltoalls = __atomic_load_n(&g_alltoalls, __ATOMIC_RELAXED);
}

/* Never reached on a routed call; a forwarded one copies (one rank) or is refused. */
EXPORT ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                 ncclComm_t comm, cudaStream_t stream)
{
    __atomic_fetch_add(&g_alltoalls, 1, __ATOMIC_RELAXED);
    if (comm->revoked)
        return ncclInvalidUsage;
    size_t es = dt == ncclFloat16 || dt == ncclBfloat16 ? 2 : dt == ncclFloat64 || dt == ncclInt64 ? 8 : 4;
    if (comm->nranks != 1)
        return ncclInternalError;
    return send == recv ||
                   cudaMemcpyAsync(recv, send, count * es, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
}

/* Counted, moving nothing: a test checks no data of a send or recv that reaches here. */
EXPORT ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    (void)send, (void)count, (void)dt, (void)stream;
    __atomic_fetch_add(&g_sends, 1, __ATOMIC_RELAXED);
    if (comm->revoked)
        return ncclInvalidUsage;
    return peer < 0 || peer >= comm->nranks ? ncclInvalidArgument : ncclSuccess;
}

EXPORT ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    (void)recv, (void)count, (void)dt, (void)stream;
    __atomic_fetch_add(&g_recvs, 1, __ATOMIC_RELAXED);
    if (comm->revoked)
        return ncclInvalidUsage;
    return peer < 0 || peer >= comm->nranks ? ncclInvalidArgument : ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    (void)comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags)
{
    (void)flags;
    comm->revoked = 1;
    if (g_flag)
        *g_flag = 1;
    return ncclSuccess;
}

/* NCCL's abort: end its kernel, then free (a CUDA free waits for the whole device). */
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    long long t0 = now_ns();
    if (g_flag)
        *g_flag = 1;
    __sync_synchronize();
    cudaFree(comm->dbuf);
    free(comm);
    g_last_abort_ns = now_ns() - t0;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    cudaFree(comm->dbuf);
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    *err = comm->revoked ? ncclInvalidUsage : ncclSuccess;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : "fake gpu nccl error";
}

EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}
