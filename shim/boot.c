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
    void *dhead;              /* [nranks + 1] headers, allocated at create */
    uint64_t rounds;          /* header rounds run */
};

/* Every exchange starts with a round of these, so a rank that cannot take part says so. */
struct boot_head {
    uint64_t ok;
    uint64_t bytes;
};

/* One ncclAllGather of @p bytes from device @p dmine into device @p dall, then to host @p all. */
static mscx_status_t gather(struct shim_boot *b, void *dmine, void *dall, void *all, size_t bytes)
{
    shim_fn_ncclAllGather_t ag = SHIM_REAL(b->prof, ncclAllGather);
    if (!ag)
        return MSCX_ERR_SYSTEM;
    ncclResult_t r = ag(dmine, dall, bytes, ncclUint8, b->comm, b->stream);
    if (r != ncclSuccess) {
        MSCX_WARN("mscx: bootstrap ncclAllGather of %zu bytes failed: %d", bytes, (int)r);
        return MSCX_ERR_SYSTEM;
    }
    if (cudaMemcpyAsync(all, dall, bytes * b->bs.nranks, cudaMemcpyDeviceToHost, b->stream) != cudaSuccess ||
        cudaStreamSynchronize(b->stream) != cudaSuccess) {
        MSCX_WARN("mscx: bootstrap exchange: CUDA error %s", cudaGetErrorString(cudaGetLastError()));
        return MSCX_ERR_CUDA;
    }
    return MSCX_OK;
}

/*
 * The header round: every rank says whether it can go on. @return MSCX_OK
 * when all can, MSCX_ERR_REMOTE when some rank cannot (the same answer on
 * every rank), or the local error of the round itself.
 */
static mscx_status_t head_round(struct shim_boot *b, int ok, size_t bytes)
{
    uint32_t n = b->bs.nranks;
    struct boot_head mine = {(uint64_t)(ok != 0), bytes}, *all = calloc(n, sizeof(*all));
    char *dmine = (char *)b->dhead + (size_t)n * sizeof(mine);
    mscx_status_t st = MSCX_ERR_NO_MEMORY;
    b->rounds++;
    if (!all)
        return st; /* a few bytes of host memory: documented as the one unannounced failure */
    if (cudaMemcpyAsync(dmine, &mine, sizeof(mine), cudaMemcpyHostToDevice, b->stream) != cudaSuccess) {
        st = MSCX_ERR_CUDA;
        goto out;
    }
    if ((st = gather(b, dmine, b->dhead, all, sizeof(mine))) != MSCX_OK)
        goto out;
    for (uint32_t r = 0; r < n; r++)
        if (!all[r].ok || all[r].bytes != bytes) {
            st = MSCX_ERR_REMOTE;
            break;
        }
out:
    free(all);
    return st;
}

static mscx_status_t boot_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct shim_boot *b = ctx;
    size_t total = bytes * b->bs.nranks;
    void *dbuf = NULL;
    int prev = -1;
    mscx_status_t st;

    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(b->device) != cudaSuccess)
        return MSCX_ERR_CUDA; /* cannot happen after create; nothing to take part with */
    /* Allocate before the header round, so that a failure is announced, not a hang. */
    int ok = bytes == 0 || cudaMalloc(&dbuf, total + bytes) == cudaSuccess;
    if (!ok)
        dbuf = NULL;
    st = head_round(b, ok, bytes);
    if (st != MSCX_OK || bytes == 0)
        goto out;
    char *dmine = (char *)dbuf + total;
    if (cudaMemcpyAsync(dmine, mine, bytes, cudaMemcpyHostToDevice, b->stream) != cudaSuccess) {
        st = MSCX_ERR_CUDA;
        goto out;
    }
    st = gather(b, dmine, dbuf, all, bytes);
out:
    if (st == MSCX_ERR_REMOTE)
        MSCX_INFO(MSCX_SUB_SHIM, "mscx: a rank could not take part in a bootstrap exchange of %zu bytes", bytes);
    if (dbuf)
        cudaFree(dbuf);
    cudaSetDevice(prev);
    return st;
}

mscx_status_t shim_boot_agree(struct mscx_bootstrap *bs, int ok)
{
    struct shim_boot *b = bs->ctx;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(b->device) != cudaSuccess)
        return MSCX_ERR_CUDA;
    mscx_status_t st = head_round(b, ok, 0);
    cudaSetDevice(prev);
    return st;
}

uint64_t shim_boot_rounds(const struct mscx_bootstrap *bs)
{
    const struct shim_boot *b = bs->ctx;
    return b->rounds;
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
        cudaMalloc(&b->dhead, ((size_t)nranks + 1) * sizeof(struct boot_head)) != cudaSuccess) {
        MSCX_WARN("mscx: bootstrap on device %d: %s", cuda_device, cudaGetErrorString(cudaGetLastError()));
        if (prev >= 0)
            cudaSetDevice(prev);
        free(b);
        return MSCX_ERR_CUDA;
    }
    if (cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking) != cudaSuccess) {
        /* the legacy stream still serves: failing here would leave the other ranks waiting */
        cudaGetLastError();
        b->stream = 0;
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
    if (b->stream)
        cudaStreamDestroy(b->stream);
    cudaFree(b->dhead);
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

mscx_status_t shim_boot_agree(struct mscx_bootstrap *bs, int ok)
{
    (void)bs;
    (void)ok;
    return MSCX_ERR_UNSUPPORTED;
}

uint64_t shim_boot_rounds(const struct mscx_bootstrap *bs)
{
    (void)bs;
    return 0;
}

#endif
