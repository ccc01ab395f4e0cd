/* SPDX-License-Identifier: MIT */
/*
 * Executors: create and destroy, the in-process group of
 * mscx_exec_create_local_group, the error block the kernels and the proxy
 * write, and the debug hooks of launch_abi.h.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "device_caps.h"
#include "runtime_int.h"

mscx_status_t mscx_gpu_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return MSCX_OK;
    MSCX_WARN("cuda error: %s: %s", what, cudaGetErrorString(rc));
    return MSCX_ERR_CUDA;
}

/*
 * The build's code for @p dev and whether launches may start early. A
 * device the build has no code for, or whose driver cannot load it, is
 * refused (the caller keeps its collectives on NCCL), with one warning per
 * process.
 */
static mscx_status_t device_check(int dev, int *pdl_ok_p)
{
    static atomic_int warned;
    int major = 0, minor = 0;
    const struct mscx_config *cfg;
    MSCX_CHECK(mscx_config_get(&cfg));
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "device attributes");
    struct mscx_gpu_image img;
    struct mscx_gpu_features f;
    char line[160];
    mscx_gpu_image_built(&img);
    mscx_gpu_features_choose(major, minor, &img, cfg->pdl, &f);
    mscx_gpu_features_describe(major, minor, &f, line, sizeof(line));
    cudaError_t load = f.runs ? (cudaError_t)mscx_gpu_kernels_loadable() : cudaErrorNoKernelImageForDevice;
    if (load != cudaSuccess) {
        if (atomic_exchange(&warned, 1) == 0)
            MSCX_WARN("GPU %d, %s (%s): collectives stay on NCCL", dev, line, cudaGetErrorString(load));
        (void)cudaGetLastError();
        return MSCX_ERR_UNSUPPORTED;
    }
    MSCX_INFO(MSCX_SUB_EXEC, "GPU %d, %s", dev, line);
    *pdl_ok_p = f.pdl;
    return MSCX_OK;
}

mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p)
{
    mscx_status_t st;
    struct mscx_exec *ex;
    if (!bs || !exec_p || bs->rank >= bs->nranks)
        return MSCX_ERR_INVALID_ARG;
    ex = calloc(1, sizeof(*ex));
    if (!ex)
        return MSCX_ERR_NO_MEMORY;
    ex->bs = *bs;
    ex->device = cuda_device;
    GPU_CHECK_GOTO(cudaSetDevice(cuda_device), st, fail);
    if ((st = device_check(cuda_device, &ex->pdl_ok)) != MSCX_OK)
        goto fail;
    GPU_CHECK_GOTO(cudaHostAlloc((void **)&ex->host, sizeof(*ex->host), cudaHostAllocMapped), st, fail);
    memset(ex->host, 0, sizeof(*ex->host));
    GPU_CHECK_GOTO(cudaHostGetDevicePointer((void **)&ex->host_dev, ex->host, 0), st, fail);
    ex->traced = mscx_gpu_trace_attach();
    *exec_p = ex;
    return MSCX_OK;
fail:
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    free(ex);
    return st;
}

mscx_status_t mscx_exec_async_error(struct mscx_exec *ex)
{
    if (!ex)
        return MSCX_ERR_INVALID_ARG;
    int32_t code = *(volatile int32_t *)&ex->host->err.code;
    if (code == 0)
        return MSCX_OK;
    for (uint32_t i = 0; i < ex->nplans; i++)
        mscx_gpu_port_report(ex->plans[i].port, ex->bs.rank, ex->plans[i].plan->name);
    return (mscx_status_t)code;
}

void mscx_exec_abort(struct mscx_exec *ex)
{
    if (!ex)
        return;
    if (ex->host->err.code == 0) {
        ex->host->err.opcode = 0;
        ex->host->err.code = MSCX_ERR_REMOTE;
    }
    ex->host->abort = 1;
    __sync_synchronize();
}

/* Free plan context @p id of @p ex (its port already stopped, the executor's network gone). */
static void plan_release(struct mscx_exec *ex, uint32_t id)
{
    struct gpu_plan *gp = &ex->plans[id];
    mscx_gpu_port_free(gp->port);
    mscx_peer_bufs_destroy(gp->peer_bufs);
    if (gp->opened) {
        for (uint32_t k = 0; k < 2u * gp->plan->nranks; k++)
            if (gp->opened[k])
                cudaIpcCloseMemHandle(gp->opened[k]);
        free(gp->opened);
    }
    if (gp->d_trace) {
        mscx_gpu_trace_collect(ex->bs.rank, id, gp);
        cudaFree(gp->d_trace);
        cudaFree(gp->d_trace_n);
    }
    if (gp->scratch)
        cudaFree(gp->scratch);
    if (gp->tmp)
        cudaFree(gp->tmp);
    if (gp->d_ctx)
        cudaFree(gp->d_ctx);
    free(gp->recs);
    free(gp->h_ops);
    free(gp->kp_rbuf);
    free(gp->kp_tmp);
    if (gp->kp_dev)
        cudaFree(gp->kp_dev);
    if (gp->kp_pin)
        cudaFreeHost(gp->kp_pin);
}

void mscx_exec_destroy(struct mscx_exec *ex)
{
    if (!ex)
        return;
    cudaSetDevice(ex->device);
    /* no proxy request and no received TCP write touches memory past this point */
    for (uint32_t i = 0; i < ex->nplans; i++)
        mscx_gpu_port_stop(ex->plans[i].port);
    mscx_gpu_net_destroy(ex->net);
    for (uint32_t i = 0; i < ex->nplans; i++)
        plan_release(ex, i);
    if (ex->traced)
        mscx_gpu_trace_detach();
    if (ex->group && --ex->group->refs == 0) {
        free(ex->group->execs);
        free(ex->group);
    }
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    free(ex);
}

static mscx_status_t local_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    (void)ctx;
    (void)mine;
    (void)all;
    (void)bytes;
    return MSCX_ERR_INTERNAL; /* the local group never uses the bootstrap */
}

mscx_status_t mscx_exec_create_local_group(uint32_t nranks, int cuda_device, struct mscx_exec **execs)
{
    mscx_status_t st = MSCX_OK;
    if (nranks == 0 || !execs)
        return MSCX_ERR_INVALID_ARG;
    struct local_group *g = calloc(1, sizeof(*g));
    if (!g)
        return MSCX_ERR_NO_MEMORY;
    g->execs = calloc(nranks, sizeof(*g->execs));
    if (!g->execs) {
        free(g);
        return MSCX_ERR_NO_MEMORY;
    }
    g->nranks = nranks;
    for (uint32_t r = 0; r < nranks; r++) {
        struct mscx_bootstrap bs = {r, nranks, g, local_allgather};
        if ((st = mscx_exec_create(&bs, cuda_device, &g->execs[r])) != MSCX_OK)
            break;
        g->execs[r]->group = g;
        g->refs++;
    }
    if (st != MSCX_OK) {
        struct mscx_exec **e = g->execs;
        uint32_t refs = g->refs;
        for (uint32_t r = 0; r < refs; r++)
            mscx_exec_destroy(e[r]); /* the last one frees g */
        if (refs == 0) {
            free(g->execs);
            free(g);
        }
        return st;
    }
    memcpy(execs, g->execs, nranks * sizeof(*execs));
    return MSCX_OK;
}

int mscx_gpu_debug_set_flag(struct mscx_exec *ex, uint32_t plan_id, uint32_t flag)
{
    if (!ex || plan_id >= ex->nplans)
        return -1;
    struct gpu_plan *gp = &ex->plans[plan_id];
    uint32_t *f = calloc(gp->ntb ? gp->ntb : 1, sizeof(uint32_t));
    if (!f)
        return -1;
    for (uint32_t b = 0; b < gp->ntb; b++)
        f[b] = flag;
    cudaError_t rc =
        cudaMemcpy(gp->d_ctx + gp->off_bflag, f, gp->ntb * sizeof(uint32_t), cudaMemcpyHostToDevice);
    free(f);
    return rc == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

int mscx_gpu_debug_fill_scratch(struct mscx_exec *ex, uint32_t plan_id, uint32_t word)
{
    if (!ex || plan_id >= ex->nplans)
        return -1;
    struct gpu_plan *gp = &ex->plans[plan_id];
    uint64_t n = gp->scratch_bytes / 4u;
    uint32_t *h = malloc(n ? n * 4u : 4u);
    if (!h)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        h[i] = word;
    cudaError_t rc = n ? cudaMemcpy(gp->scratch, h, n * 4u, cudaMemcpyHostToDevice) : cudaSuccess;
    free(h);
    return rc == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

void mscx_gpu_debug_error(struct mscx_exec *ex, struct mscx_gpu_err *err_p)
{
    memset(err_p, 0, sizeof(*err_p));
    if (!ex)
        return;
    __sync_synchronize();
    err_p->block = ex->host->err.block;
    err_p->op = ex->host->err.op;
    err_p->opcode = ex->host->err.opcode;
    err_p->code = *(volatile int32_t *)&ex->host->err.code;
}
