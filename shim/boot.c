/* SPDX-License-Identifier: MIT */
/*
 * The executor's bootstrap over the real communicator: allgather is the real
 * ncclAllGather of a small device buffer on a private stream, followed by a
 * synchronisation of that stream. Used only at communicator setup, never
 * during capture. Without CUDA every bootstrap is unsupported and the shim
 * forwards everything.
 */
#include <stdlib.h>
#include <string.h>

#include "mscx/exec.h"
#include "mscx/log.h"
#include "shim_int.h"

#ifdef MSCX_SHIM_CUDA
#include <cuda_runtime_api.h>

struct shim_boot {
    struct mscx_bootstrap bs; /* first: the executor holds a pointer to this */
    ncclComm_t comm;
    int prof;
    int device;
    cudaStream_t stream;
};

static mscx_status_t boot_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct shim_boot *b = ctx;
    shim_fn_ncclAllGather_t ag = SHIM_REAL(b->prof, ncclAllGather);
    size_t total = bytes * b->bs.nranks;
    void *dbuf = NULL;
    int prev = -1;
    mscx_status_t st = MSCX_ERR_CUDA;

    if (!ag)
        return MSCX_ERR_SYSTEM;
    if (bytes == 0)
        return MSCX_OK;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(b->device) != cudaSuccess)
        return MSCX_ERR_CUDA;
    if (cudaMalloc(&dbuf, total + bytes) != cudaSuccess) {
        dbuf = NULL;
        goto out;
    }
    char *dmine = (char *)dbuf + total;
    if (cudaMemcpyAsync(dmine, mine, bytes, cudaMemcpyHostToDevice, b->stream) != cudaSuccess)
        goto out;
    ncclResult_t r = ag(dmine, dbuf, bytes, ncclUint8, b->comm, b->stream);
    if (r != ncclSuccess) {
        MSCX_WARN("mscx: bootstrap ncclAllGather of %zu bytes failed: %d", bytes, (int)r);
        st = MSCX_ERR_SYSTEM;
        goto out;
    }
    if (cudaMemcpyAsync(all, dbuf, total, cudaMemcpyDeviceToHost, b->stream) != cudaSuccess ||
        cudaStreamSynchronize(b->stream) != cudaSuccess)
        goto out;
    st = MSCX_OK;
out:
    if (st == MSCX_ERR_CUDA)
        MSCX_WARN("mscx: bootstrap exchange: CUDA error %s", cudaGetErrorString(cudaGetLastError()));
    if (dbuf)
        cudaFree(dbuf);
    cudaSetDevice(prev);
    return st;
}

mscx_status_t shim_boot_create(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                               struct mscx_bootstrap **bs_p)
{
    int count = 0, prev = -1;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError(); /* clear the sticky "no device" */
        return MSCX_ERR_UNSUPPORTED;
    }
    struct shim_boot *b = calloc(1, sizeof(*b));
    if (!b)
        return MSCX_ERR_NO_MEMORY;
    b->bs.rank = rank;
    b->bs.nranks = nranks;
    b->bs.ctx = b;
    b->bs.allgather = boot_allgather;
    b->comm = comm;
    b->prof = prof;
    b->device = cuda_device;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(cuda_device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking) != cudaSuccess) {
        MSCX_WARN("mscx: bootstrap stream on device %d: %s", cuda_device, cudaGetErrorString(cudaGetLastError()));
        if (prev >= 0)
            cudaSetDevice(prev);
        free(b);
        return MSCX_ERR_CUDA;
    }
    cudaSetDevice(prev);
    *bs_p = &b->bs;
    return MSCX_OK;
}

void shim_boot_destroy(struct mscx_bootstrap *bs)
{
    if (!bs)
        return;
    struct shim_boot *b = bs->ctx;
    cudaStreamDestroy(b->stream);
    free(b);
}

#else /* no CUDA */

mscx_status_t shim_boot_create(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                               struct mscx_bootstrap **bs_p)
{
    (void)comm;
    (void)prof;
    (void)rank;
    (void)nranks;
    (void)cuda_device;
    *bs_p = NULL;
    return MSCX_ERR_UNSUPPORTED;
}

void shim_boot_destroy(struct mscx_bootstrap *bs)
{
    (void)bs;
}

#endif
