/* SPDX-License-Identifier: MIT */
/*
 * Executors: create and destroy, the in-process group of
 * mscx_exec_create_local_group, the error block the kernels and the proxy
 * write, and the debug hooks of launch_abi.h.
 */
#include <pthread.h>
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

mscx_status_t mscx_gpu_dev_enter(int dev, struct mscx_gpu_dev_scope *sc)
{
    sc->mode = cudaStreamCaptureModeRelaxed;
    sc->mode_set = cudaThreadExchangeStreamCaptureMode(&sc->mode) == cudaSuccess;
    if (!sc->mode_set)
        (void)cudaGetLastError();
    sc->prev_dev = -1;
    if (cudaGetDevice(&sc->prev_dev) != cudaSuccess)
        sc->prev_dev = -1;
    return CU(cudaSetDevice(dev));
}

void mscx_gpu_dev_leave(const struct mscx_gpu_dev_scope *sc)
{
    int now = -1;
    if (sc->prev_dev >= 0 && !(cudaGetDevice(&now) == cudaSuccess && now == sc->prev_dev) &&
        cudaSetDevice(sc->prev_dev) != cudaSuccess)
        (void)cudaGetLastError();
    if (sc->mode_set) {
        enum cudaStreamCaptureMode m = sc->mode;
        (void)cudaThreadExchangeStreamCaptureMode(&m);
    }
}

/*
 * The executor's own setup stream: non-blocking, so that its copies neither
 * wait for the legacy default stream nor make the caller's streams wait.
 */
static mscx_status_t exec_open(struct mscx_exec *ex)
{
    MSCX_CHECK(device_check(ex->device, &ex->pdl_ok));
    MSCX_CHECK(CU(cudaStreamCreateWithFlags(&ex->ustream, cudaStreamNonBlocking)));
    MSCX_CHECK(mscx_gpu_order_open(ex));
    MSCX_CHECK(CU(cudaHostAlloc((void **)&ex->host, sizeof(*ex->host), cudaHostAllocMapped)));
    memset(ex->host, 0, sizeof(*ex->host));
    return CU(cudaHostGetDevicePointer((void **)&ex->host_dev, ex->host, 0));
}

static void deferred_reap(void);

mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p)
{
    mscx_status_t st;
    struct mscx_exec *ex;
    struct mscx_gpu_dev_scope scope;
    if (!bs || !exec_p || bs->rank >= bs->nranks)
        return MSCX_ERR_INVALID_ARG;
    deferred_reap();
    ex = calloc(1, sizeof(*ex));
    if (!ex)
        return MSCX_ERR_NO_MEMORY;
    ex->bs = *bs;
    ex->device = cuda_device;
    st = mscx_gpu_dev_enter(cuda_device, &scope);
    if (st == MSCX_OK)
        st = exec_open(ex);
    if (st == MSCX_OK) {
        ex->traced = mscx_gpu_trace_attach();
        *exec_p = ex;
        mscx_gpu_dev_leave(&scope);
        return MSCX_OK;
    }
    mscx_gpu_order_close(ex);
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    free(ex);
    mscx_gpu_dev_leave(&scope);
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

const volatile int32_t *mscx_exec_error_word(struct mscx_exec *ex)
{
    return ex ? (const volatile int32_t *)&ex->host->err.code : NULL;
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
    free(gp->prog_rbuf);
    free(gp->prog_tmp);
    if (gp->prog_dev)
        cudaFree(gp->prog_dev);
    if (gp->prog_pin)
        cudaFreeHost(gp->prog_pin);
}

/* Free everything of @p ex (its kernels ended, or told to stop and its memory no longer read). */
static void exec_free(struct mscx_exec *ex)
{
    struct mscx_gpu_dev_scope scope;
    if (mscx_gpu_dev_enter(ex->device, &scope) != MSCX_OK)
        (void)cudaGetLastError();
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
    mscx_gpu_order_close(ex);
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    for (unsigned i = 0; i < ex->ndone_ev; i++)
        cudaEventDestroy(ex->done_ev[i]);
    free(ex);
    mscx_gpu_dev_leave(&scope);
}

/*
 * Executors released by mscx_exec_destroy_deferred(): stopped, their memory
 * kept until a destroy, which frees device memory anyway, frees it too, or
 * until a later create finds their work provably over (deferred_reap).
 */
static pthread_mutex_t g_deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mscx_exec *g_deferred;

/* The most stopped executors one create frees: it stays a small cost, and the list still shrinks. */
#define REAP_PER_CREATE 2

/*
 * At the abort, an event after every launch on each stream the executor's
 * launches went to (cudaEventRecord does not wait). Where one cannot be
 * recorded (a stream being captured into a graph, or gone), the end of its
 * work is not provable: the executor stays until a destroy.
 */
static void done_events_record(struct mscx_exec *ex)
{
    for (unsigned i = 0; i < ex->nlaunch_streams && !ex->streams_unknown; i++) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaEvent_t ev;
        if (cudaStreamIsCapturing(ex->launch_streams[i], &cs) != cudaSuccess ||
            cs != cudaStreamCaptureStatusNone ||
            cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            ex->streams_unknown = 1;
            break;
        }
        ex->done_ev[ex->ndone_ev++] = ev;
        if (cudaEventRecord(ev, ex->launch_streams[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            ex->streams_unknown = 1;
        }
    }
}

/* 1 when every launch of stopped @p ex has ended: each event query says done (a query never waits). */
static int exec_idle(struct mscx_exec *ex)
{
    if (ex->streams_unknown)
        return 0;
    for (unsigned i = 0; i < ex->ndone_ev; i++) {
        cudaError_t rc = cudaEventQuery(ex->done_ev[i]);
        if (rc != cudaSuccess) {
            if (rc != cudaErrorNotReady)
                (void)cudaGetLastError();
            return 0;
        }
    }
    return 1;
}

/* Free at most REAP_PER_CREATE stopped executors whose work has provably ended. */
static void deferred_reap(void)
{
    struct mscx_exec *idle = NULL;
    unsigned n = 0;
    pthread_mutex_lock(&g_deferred_lock);
    for (struct mscx_exec **pp = &g_deferred; *pp && n < REAP_PER_CREATE;) {
        struct mscx_exec *ex = *pp;
        if (!exec_idle(ex)) {
            pp = &ex->next_deferred;
            continue;
        }
        *pp = ex->next_deferred;
        ex->next_deferred = idle;
        idle = ex;
        n++;
    }
    pthread_mutex_unlock(&g_deferred_lock);
    while (idle) {
        struct mscx_exec *next = idle->next_deferred;
        exec_free(idle);
        idle = next;
    }
}

void mscx_exec_destroy(struct mscx_exec *ex)
{
    if (!ex)
        return;
    exec_free(ex);
    pthread_mutex_lock(&g_deferred_lock);
    struct mscx_exec *d = g_deferred;
    g_deferred = NULL;
    pthread_mutex_unlock(&g_deferred_lock);
    while (d) {
        struct mscx_exec *next = d->next_deferred;
        exec_free(d);
        d = next;
    }
}

/*
 * Only host-side stops here, none waiting on the device: the abort word, the
 * proxy (no request served after this), the network's endpoint (no received
 * write lands after this). The kernels told to stop may still read the
 * context, scratch and error block, so nothing of the device's is freed.
 */
void mscx_exec_destroy_deferred(struct mscx_exec *ex)
{
    if (!ex)
        return;
    mscx_exec_abort(ex);
    for (uint32_t i = 0; i < ex->nplans; i++)
        mscx_gpu_port_stop(ex->plans[i].port);
    mscx_gpu_net_close(ex->net);
    struct mscx_gpu_dev_scope scope;
    if (mscx_gpu_dev_enter(ex->device, &scope) == MSCX_OK) {
        done_events_record(ex);
    } else {
        (void)cudaGetLastError();
        ex->streams_unknown = 1;
    }
    mscx_gpu_dev_leave(&scope);
    pthread_mutex_lock(&g_deferred_lock);
    ex->next_deferred = g_deferred;
    g_deferred = ex;
    pthread_mutex_unlock(&g_deferred_lock);
    MSCX_INFO(MSCX_SUB_EXEC,
              "rank %u: executor stopped; its memory is freed at a later setup once its launches "
              "have ended, or at the next destroy",
              ex->bs.rank);
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
        struct mscx_bootstrap bs = {r, nranks, g, local_allgather,
                                    NULL}; /* in process: no connection to secure */
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
    cudaError_t rc = cudaMemcpyAsync(gp->d_ctx + gp->off_bflag, f, gp->ntb * sizeof(uint32_t),
                                     cudaMemcpyHostToDevice, ex->ustream);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(ex->ustream);
    free(f);
    return rc == cudaSuccess ? 0 : -1;
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
    cudaError_t rc =
        n ? cudaMemcpyAsync(gp->scratch, h, n * 4u, cudaMemcpyHostToDevice, ex->ustream) : cudaSuccess;
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(ex->ustream);
    free(h);
    return rc == cudaSuccess ? 0 : -1;
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
