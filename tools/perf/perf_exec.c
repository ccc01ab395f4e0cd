/* SPDX-License-Identifier: MIT */
/*
 * The executor backend (--executor N): N ranks on one GPU through the mscx
 * executor directly, no NCCL. Every rank has its own stream; one timed
 * iteration launches every rank and joins their streams.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "mscx/exec.h"
#include "mscx/plan.h"
#include "perf.h"

struct exec_ctx {
    uint32_t n, plan_id;
    struct mscx_plan *plan;
    struct mscx_exec **ex;
    cudaStream_t *streams;
    cudaEvent_t *joins, ev_start, ev_stop;
    char **send, **recv, *hsend, *hout;
    uint64_t cap;
};

#define CUDA_TRY(call)                                                                                       \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "mscx-perf: %s: %s\n", #call, cudaGetErrorString(e_));                           \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0)

static const enum mscx_dtype dtype_map[PERF_TYPE_COUNT] = {
    MSCX_DT_INT8, MSCX_DT_UINT8, MSCX_DT_INT32, MSCX_DT_UINT32, MSCX_DT_INT64,
    MSCX_DT_UINT64, MSCX_DT_FP16, MSCX_DT_FP32, MSCX_DT_FP64, MSCX_DT_BF16,
};
static const enum mscx_coll coll_map[PERF_COLL_COUNT] = {MSCX_COLL_ALLREDUCE, MSCX_COLL_ALLGATHER,
                                                        MSCX_COLL_REDUCESCATTER};

static void rank_ptrs(const struct exec_ctx *c, const struct perf_call *call, uint32_t r, char **s_p, char **d_p)
{
    size_t es = mscx_perf_type_size(call->type);
    *s_p = c->send[r];
    *d_p = c->recv[r];
    if (call->in_place) {
        *s_p = c->recv[r];
        if (call->coll == PERF_ALLGATHER)
            *s_p = c->recv[r] + (size_t)r * call->send_count * es;
        else if (call->coll == PERF_REDUCESCATTER)
            *d_p = c->recv[r] + (size_t)r * call->recv_count * es;
    }
}

/* One collective: fork from stream 0 to every rank's stream, launch, join back. */
static int launch_all(struct exec_ctx *c, const struct perf_call *call)
{
    uint64_t msg = (call->coll == PERF_ALLGATHER ? call->recv_count : call->send_count) *
                   mscx_perf_type_size(call->type);
    CUDA_TRY(cudaEventRecord(c->joins[0], c->streams[0]));
    for (uint32_t r = 1; r < c->n; r++)
        CUDA_TRY(cudaStreamWaitEvent(c->streams[r], c->joins[0], 0));
    for (uint32_t r = 0; r < c->n; r++) {
        char *s, *d;
        mscx_status_t st;
        rank_ptrs(c, call, r, &s, &d);
        st = mscx_exec_launch(c->ex[r], c->plan_id, s, d, msg, dtype_map[call->type], (enum mscx_redop)call->op,
                              MSCX_PKT_LL16, c->streams[r]);
        if (st != MSCX_OK) {
            fprintf(stderr, "mscx-perf: rank %u: launch of %llu bytes failed: %s\n", r, (unsigned long long)msg,
                    mscx_status_str(st));
            return -1;
        }
    }
    for (uint32_t r = 1; r < c->n; r++) {
        CUDA_TRY(cudaEventRecord(c->joins[r], c->streams[r]));
        CUDA_TRY(cudaStreamWaitEvent(c->streams[0], c->joins[r], 0));
    }
    return 0;
}

static int exec_run(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p)
{
    struct exec_ctx *c = ctx;
    float ms = 0;
    (void)graph_iters; /* -G is refused at open */
    CUDA_TRY(cudaEventRecord(c->ev_start, c->streams[0]));
    for (int i = 0; i < iters; i++)
        if (launch_all(c, call))
            return -1;
    CUDA_TRY(cudaEventRecord(c->ev_stop, c->streams[0]));
    CUDA_TRY(cudaStreamSynchronize(c->streams[0]));
    CUDA_TRY(cudaEventElapsedTime(&ms, c->ev_start, c->ev_stop));
    if (mscx_exec_async_error(c->ex[0]) != MSCX_OK) {
        fprintf(stderr, "mscx-perf: executor kernel failed: %s\n", mscx_status_str(mscx_exec_async_error(c->ex[0])));
        return -1;
    }
    *us_p = (double)ms * 1000.0 / iters;
    return 0;
}

static int exec_check(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p)
{
    struct exec_ctx *c = ctx;
    size_t es = mscx_perf_type_size(call->type);
    int64_t wrong = 0;
    for (uint32_t r = 0; r < c->n; r++) {
        char *s, *d;
        rank_ptrs(c, call, r, &s, &d);
        mscx_perf_fill(call->coll, call->type, call->op, (int)r, (int)c->n, seed, c->hsend, call->send_count);
        CUDA_TRY(cudaMemset(c->recv[r], 0xff, c->cap));
        CUDA_TRY(cudaMemcpy(s, c->hsend, call->send_count * es, cudaMemcpyHostToDevice));
    }
    if (launch_all(c, call))
        return -1;
    CUDA_TRY(cudaStreamSynchronize(c->streams[0]));
    for (uint32_t r = 0; r < c->n; r++) {
        char *s, *d;
        rank_ptrs(c, call, r, &s, &d);
        CUDA_TRY(cudaMemcpy(c->hout, d, call->recv_count * es, cudaMemcpyDeviceToHost));
        wrong += mscx_perf_check(call->coll, call->type, call->op, (int)r, (int)c->n, seed, c->hout, call->recv_count);
    }
    *wrong_p = wrong;
    return 0;
}

/* --plan, else the first plan in MSCX_PLAN_DIR for this collective and rank count. */
static int find_plan(const struct perf_opts *o, uint32_t n, struct mscx_plan **plan_p)
{
    char err[MSCX_PLAN_ERR_LEN], path[1024];
    const char *dir = getenv("MSCX_PLAN_DIR");
    struct dirent *e;
    DIR *d;
    if (o->plan_path) {
        if (mscx_plan_load(o->plan_path, plan_p, err, sizeof(err)) != MSCX_OK) {
            fprintf(stderr, "mscx-perf: %s\n", err);
            return -1;
        }
        return 0;
    }
    if (dir == NULL || (d = opendir(dir)) == NULL) {
        fprintf(stderr, "mscx-perf: --executor needs --plan FILE or MSCX_PLAN_DIR\n");
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        struct mscx_plan *p;
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (mscx_plan_load(path, &p, err, sizeof(err)) != MSCX_OK)
            continue;
        if (mscx_plan_collective(p) == coll_map[o->coll] && mscx_plan_nranks(p) == n) {
            closedir(d);
            *plan_p = p;
            return 0;
        }
        mscx_plan_destroy(p);
    }
    closedir(d);
    fprintf(stderr, "mscx-perf: no %u-rank %s plan in %s\n", n, mscx_perf_coll_name(o->coll), dir);
    return -1;
}

static int exec_setup(struct exec_ctx *c, const struct perf_opts *o, FILE *out)
{
    int dev = o->device >= 0 ? o->device : 0;
    mscx_status_t st;
    if (find_plan(o, c->n, &c->plan))
        return -1;
    if (mscx_plan_collective(c->plan) != coll_map[o->coll] || mscx_plan_nranks(c->plan) != c->n) {
        fprintf(stderr, "mscx-perf: plan %s is a %u-rank %s, not a %u-rank %s\n", mscx_plan_name(c->plan),
                mscx_plan_nranks(c->plan), mscx_coll_name(mscx_plan_collective(c->plan)), c->n,
                mscx_perf_coll_name(o->coll));
        return -1;
    }
    CUDA_TRY(cudaSetDevice(dev));
    c->cap = o->max_bytes ? o->max_bytes : 1;
    c->ex = calloc(c->n, sizeof(*c->ex));
    c->streams = calloc(c->n, sizeof(*c->streams));
    c->joins = calloc(c->n, sizeof(*c->joins));
    c->send = calloc(c->n, sizeof(*c->send));
    c->recv = calloc(c->n, sizeof(*c->recv));
    if (!c->ex || !c->streams || !c->joins || !c->send || !c->recv)
        return -1;
    if ((st = mscx_exec_create_local_group(c->n, dev, c->ex)) != MSCX_OK) {
        fprintf(stderr, "mscx-perf: cannot create %u executors on device %d: %s\n", c->n, dev,
                mscx_status_str(st));
        memset(c->ex, 0, c->n * sizeof(*c->ex));
        return -1;
    }
    for (uint32_t r = 0; r < c->n; r++) {
        if ((st = mscx_exec_add_plan(c->ex[r], c->plan, c->cap, &c->plan_id)) != MSCX_OK) {
            fprintf(stderr, "mscx-perf: rank %u: plan %s: %s\n", r, mscx_plan_name(c->plan), mscx_status_str(st));
            return -1;
        }
        CUDA_TRY(cudaStreamCreateWithFlags(&c->streams[r], cudaStreamNonBlocking));
        CUDA_TRY(cudaEventCreateWithFlags(&c->joins[r], cudaEventDisableTiming));
        CUDA_TRY(cudaMalloc((void **)&c->send[r], c->cap));
        CUDA_TRY(cudaMalloc((void **)&c->recv[r], c->cap));
    }
    CUDA_TRY(cudaEventCreate(&c->ev_start));
    CUDA_TRY(cudaEventCreate(&c->ev_stop));
    CUDA_TRY(cudaMallocHost((void **)&c->hsend, c->cap));
    CUDA_TRY(cudaMallocHost((void **)&c->hout, c->cap));
    if (out)
        fprintf(out, "# Using device %d: %u ranks through the mscx executor, plan %s (%s)\n", dev, c->n,
                mscx_plan_name(c->plan), mscx_plan_origin(c->plan));
    return 0;
}

void mscx_perf_exec_close(struct perf_backend *be)
{
    struct exec_ctx *c = be->ctx;
    if (c == NULL)
        return;
    cudaDeviceSynchronize();
    for (uint32_t r = 0; r < c->n; r++) {
        if (c->ex && c->ex[r])
            mscx_exec_destroy(c->ex[r]);
        if (c->streams && c->streams[r])
            cudaStreamDestroy(c->streams[r]);
        if (c->joins && c->joins[r])
            cudaEventDestroy(c->joins[r]);
        if (c->send)
            cudaFree(c->send[r]);
        if (c->recv)
            cudaFree(c->recv[r]);
    }
    if (c->ev_start)
        cudaEventDestroy(c->ev_start);
    if (c->ev_stop)
        cudaEventDestroy(c->ev_stop);
    cudaFreeHost(c->hsend);
    cudaFreeHost(c->hout);
    free(c->ex);
    free(c->streams);
    free(c->joins);
    free(c->send);
    free(c->recv);
    mscx_plan_destroy(c->plan);
    free(c);
    be->ctx = NULL;
}

int mscx_perf_exec_open(const struct perf_opts *o, FILE *out, struct perf_backend *be)
{
    struct exec_ctx *c = calloc(1, sizeof(*c));
    memset(be, 0, sizeof(*be));
    if (c == NULL)
        return -1;
    if (o->graph_iters) {
        fprintf(stderr, "mscx-perf: -G is not supported with --executor\n");
        free(c);
        return -1;
    }
    c->n = (uint32_t)o->executor_nranks;
    be->name = "executor";
    be->nranks = o->executor_nranks;
    be->ctx = c;
    be->run = exec_run;
    be->check = exec_check;
    if (exec_setup(c, o, out)) {
        mscx_perf_exec_close(be);
        return -1;
    }
    return 0;
}
