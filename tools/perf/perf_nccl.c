/* SPDX-License-Identifier: MIT */
/*
 * The NCCL backend: one rank per process through the public NCCL API. The
 * calls resolve through the dynamic linker, so LD_PRELOAD of the mscx shim
 * intercepts exactly the same binary.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "perf.h"

/* NCCL_WIN_COLL_SYMMETRIC of NCCL 2.27+, for an nccl.h without it. */
#define PERF_WIN_COLL_SYMMETRIC 0x01

/*
 * The window functions of NCCL 2.27+, looked up at run time so that the
 * tool builds against any nccl.h and runs on any NCCL; the window handle
 * is opaque (ncclWindow_t).
 */
struct nccl_window_api {
    ncclResult_t (*mem_alloc)(void **ptr, size_t size);
    ncclResult_t (*mem_free)(void *ptr);
    ncclResult_t (*reg)(ncclComm_t comm, void *buff, size_t size, void **win_p, int flags);
    ncclResult_t (*dereg)(ncclComm_t comm, void *win);
};

struct nccl_ctx {
    struct perf_boot *boot;
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ev_start, ev_stop;
    char *sendbuf, *recvbuf; /* device, max_bytes each */
    char *hsend, *hout;      /* host staging */
    uint64_t cap;
    struct nccl_window_api win; /* set when the buffers are ncclMemAlloc'd and registered */
    void *win_send, *win_recv;
};

#define CUDA_TRY(call)                                                                                       \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "mscx-perf: rank %d: %s: %s\n", c->boot->rank, #call, cudaGetErrorString(e_));   \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0)

#define NCCL_TRY(call)                                                                                       \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        if (r_ != ncclSuccess) {                                                                             \
            fprintf(stderr, "mscx-perf: rank %d: %s: %s (%s)\n", c->boot->rank, #call,                       \
                    ncclGetErrorString(r_), ncclGetLastError(c->comm));                                      \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0)

/* The buffers of one call; in-place calls share recvbuf as NCCL defines it. */
static void call_ptrs(const struct nccl_ctx *c, const struct perf_call *call, char **send_p, char **recv_p)
{
    size_t es = mscx_perf_type_size(call->type);
    if (!call->in_place) {
        *send_p = c->sendbuf;
        *recv_p = c->recvbuf;
    } else if (call->coll == PERF_ALLGATHER) {
        *recv_p = c->recvbuf;
        *send_p = c->recvbuf + (size_t)c->boot->rank * call->send_count * es;
    } else if (call->coll == PERF_REDUCESCATTER) {
        *send_p = c->recvbuf;
        *recv_p = c->recvbuf + (size_t)c->boot->rank * call->recv_count * es;
    } else {
        *send_p = *recv_p = c->recvbuf;
    }
}

/* count per peer; ncclAlltoAll where NCCL has it (2.28), else the grouped send/recv nccl-tests falls back to.
 */
static int launch_alltoall(struct nccl_ctx *c, char *s, char *r, uint64_t count, ncclDataType_t t)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    NCCL_TRY(ncclAlltoAll(s, r, count, t, c->comm, c->stream));
#else
    size_t off = (size_t)count * mscx_perf_type_size((enum perf_type)t);
    NCCL_TRY(ncclGroupStart());
    for (int q = 0; q < c->boot->nranks; q++) {
        NCCL_TRY(ncclSend(s + (size_t)q * off, count, t, q, c->comm, c->stream));
        NCCL_TRY(ncclRecv(r + (size_t)q * off, count, t, q, c->comm, c->stream));
    }
    NCCL_TRY(ncclGroupEnd());
#endif
    return 0;
}

static int launch(struct nccl_ctx *c, const struct perf_call *call)
{
    char *s, *r;
    ncclDataType_t t = (ncclDataType_t)call->type;
    call_ptrs(c, call, &s, &r);
    switch (call->coll) {
    case PERF_ALLGATHER:
        NCCL_TRY(ncclAllGather(s, r, call->send_count, t, c->comm, c->stream));
        break;
    case PERF_REDUCESCATTER:
        NCCL_TRY(ncclReduceScatter(s, r, call->recv_count, t, (ncclRedOp_t)call->op, c->comm, c->stream));
        break;
    case PERF_ALLTOALL:
        return launch_alltoall(c, s, r, call->send_count / (uint64_t)c->boot->nranks, t);
    default:
        NCCL_TRY(ncclAllReduce(s, r, call->send_count, t, (ncclRedOp_t)call->op, c->comm, c->stream));
        break;
    }
    return 0;
}

static int nccl_run(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p)
{
    struct nccl_ctx *c = ctx;
    float ms = 0;
    int dummy = 0, all[1024];
    /* Line the ranks up so rank 0's time is not its wait for the slowest. */
    if (c->boot->nranks > 1 && c->boot->nranks <= 1024 &&
        mscx_perf_allgather(c->boot, &dummy, all, sizeof(int)))
        return -1;
    if (graph_iters > 0) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < iters; i++)
            if (launch(c, call)) {
                cudaStreamEndCapture(c->stream, &graph);
                return -1;
            }
        CUDA_TRY(cudaStreamEndCapture(c->stream, &graph));
        CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_TRY(cudaEventRecord(c->ev_start, c->stream));
        for (int g = 0; g < graph_iters; g++)
            CUDA_TRY(cudaGraphLaunch(exec, c->stream));
        CUDA_TRY(cudaEventRecord(c->ev_stop, c->stream));
        CUDA_TRY(cudaStreamSynchronize(c->stream));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        iters *= graph_iters;
    } else {
        CUDA_TRY(cudaEventRecord(c->ev_start, c->stream));
        for (int i = 0; i < iters; i++)
            if (launch(c, call))
                return -1;
        CUDA_TRY(cudaEventRecord(c->ev_stop, c->stream));
        CUDA_TRY(cudaStreamSynchronize(c->stream));
    }
    CUDA_TRY(cudaEventElapsedTime(&ms, c->ev_start, c->ev_stop));
    *us_p = (double)ms * 1000.0 / iters;
    return 0;
}

static int nccl_check(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p)
{
    struct nccl_ctx *c = ctx;
    size_t es = mscx_perf_type_size(call->type);
    int rank = c->boot->rank, n = c->boot->nranks;
    char *s, *r;
    call_ptrs(c, call, &s, &r);
    mscx_perf_fill(call->coll, call->type, call->op, rank, n, seed, c->hsend, call->send_count);
    /* Poison the output first (0xff bytes are never an expected value), then place the input. */
    CUDA_TRY(cudaMemsetAsync(c->recvbuf, 0xff, c->cap, c->stream));
    CUDA_TRY(cudaMemcpyAsync(s, c->hsend, call->send_count * es, cudaMemcpyHostToDevice, c->stream));
    if (launch(c, call))
        return -1;
    CUDA_TRY(cudaMemcpyAsync(c->hout, r, call->recv_count * es, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    *wrong_p = mscx_perf_check(call->coll, call->type, call->op, rank, n, seed, c->hout, call->recv_count);
    return 0;
}

/* The window functions of the running NCCL; @return 0, or -1 after saying on @p out what is missing. */
static int window_api_find(struct nccl_window_api *w, FILE *out)
{
    static const char *const names[] = {"ncclMemAlloc", "ncclMemFree", "ncclCommWindowRegister",
                                        "ncclCommWindowDeregister"};
    void *fn[4];
    int ver = 0;
    for (int i = 0; i < 4; i++) {
        fn[i] = dlsym(RTLD_DEFAULT, names[i]);
        if (fn[i] == NULL) {
            ncclGetVersion(&ver);
            if (out)
                fprintf(out,
                        "# --nccl-window: NCCL %d has no %s (NCCL 2.27 or newer has it); "
                        "running with cudaMalloc'd buffers, no window\n",
                        ver, names[i]);
            return -1;
        }
    }
    memcpy(&w->mem_alloc, &fn[0], sizeof(fn[0]));
    memcpy(&w->mem_free, &fn[1], sizeof(fn[1]));
    memcpy(&w->reg, &fn[2], sizeof(fn[2]));
    memcpy(&w->dereg, &fn[3], sizeof(fn[3]));
    return 0;
}

/* Send and receive buffers from ncclMemAlloc, each registered as a symmetric window (a collective call). */
static int window_alloc(struct nccl_ctx *c, FILE *out)
{
    c->cap = (c->cap + 4095) & ~(uint64_t)4095; /* NCCL_WIN_REQUIRED_ALIGNMENT */
    NCCL_TRY(c->win.mem_alloc((void **)&c->sendbuf, c->cap));
    NCCL_TRY(c->win.mem_alloc((void **)&c->recvbuf, c->cap));
    NCCL_TRY(c->win.reg(c->comm, c->sendbuf, c->cap, &c->win_send, PERF_WIN_COLL_SYMMETRIC));
    NCCL_TRY(c->win.reg(c->comm, c->recvbuf, c->cap, &c->win_recv, PERF_WIN_COLL_SYMMETRIC));
    if (out)
        fprintf(out, "# NCCL buffers: ncclMemAlloc, registered with ncclCommWindowRegister (symmetric)\n");
    return 0;
}

/* Undo window_alloc: the windows go before the communicator, the memory after it. */
static void window_release(struct nccl_ctx *c)
{
    if (c->win_send)
        c->win.dereg(c->comm, c->win_send);
    if (c->win_recv)
        c->win.dereg(c->comm, c->win_recv);
    c->win_send = c->win_recv = NULL;
}

static int nccl_setup(struct nccl_ctx *c, const struct perf_opts *o, FILE *out)
{
    struct perf_boot *b = c->boot;
    ncclUniqueId id, *ids;
    int dev = (o->device >= 0 ? o->device : 0) + b->local_rank, ver = 0, ndev = 0;
    struct cudaDeviceProp prop;
    char line[384], host[64] = "?", *lines;

    CUDA_TRY(cudaGetDeviceCount(&ndev));
    if (dev >= ndev) {
        fprintf(stderr, "mscx-perf: rank %d wants device %d but %d device(s) are visible\n", b->rank, dev,
                ndev);
        return -1;
    }
    CUDA_TRY(cudaSetDevice(dev));
    CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    gethostname(host, sizeof(host) - 1);
    snprintf(line, sizeof(line), "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n",
             b->rank, (int)getpid(), host, dev, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID, prop.name);
    lines = calloc((size_t)b->nranks, sizeof(line));
    if (lines == NULL || mscx_perf_allgather(b, line, lines, sizeof(line))) {
        free(lines);
        return -1;
    }
    if (out && b->rank == 0) {
        ncclGetVersion(&ver);
        fprintf(out, "# NCCL version code %d (library), %d (headers)\n# Using devices\n", ver,
                NCCL_VERSION_CODE);
        for (int r = 0; r < b->nranks; r++)
            fputs(lines + (size_t)r * sizeof(line), out);
        fflush(out);
    }
    free(lines);

    memset(&id, 0, sizeof(id));
    if (b->rank == 0)
        NCCL_TRY(ncclGetUniqueId(&id));
    ids = calloc((size_t)b->nranks, sizeof(id));
    if (ids == NULL || mscx_perf_allgather(b, &id, ids, sizeof(id))) {
        free(ids);
        return -1;
    }
    id = ids[0];
    free(ids);
    NCCL_TRY(ncclCommInitRank(&c->comm, b->nranks, id, b->rank));

    c->cap = o->max_bytes ? o->max_bytes : 1;
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreate(&c->ev_start));
    CUDA_TRY(cudaEventCreate(&c->ev_stop));
    if (o->nccl_window && window_api_find(&c->win, b->rank == 0 ? out : NULL) == 0) {
        if (window_alloc(c, b->rank == 0 ? out : NULL))
            return -1;
    } else {
        CUDA_TRY(cudaMalloc((void **)&c->sendbuf, c->cap));
        CUDA_TRY(cudaMalloc((void **)&c->recvbuf, c->cap));
    }
    CUDA_TRY(cudaMallocHost((void **)&c->hsend, c->cap));
    CUDA_TRY(cudaMallocHost((void **)&c->hout, c->cap));
    return 0;
}

void mscx_perf_nccl_close(struct perf_backend *be)
{
    struct nccl_ctx *c = be->ctx;
    if (c == NULL)
        return;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->comm) {
        window_release(c);
        ncclCommDestroy(c->comm);
    }
    if (c->win.mem_free) {
        if (c->sendbuf)
            c->win.mem_free(c->sendbuf);
        if (c->recvbuf)
            c->win.mem_free(c->recvbuf);
    } else {
        cudaFree(c->sendbuf);
        cudaFree(c->recvbuf);
    }
    cudaFreeHost(c->hsend);
    cudaFreeHost(c->hout);
    if (c->ev_start)
        cudaEventDestroy(c->ev_start);
    if (c->ev_stop)
        cudaEventDestroy(c->ev_stop);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
    be->ctx = NULL;
}

int mscx_perf_nccl_open(const struct perf_opts *o, struct perf_boot *b, FILE *out, struct perf_backend *be)
{
    struct nccl_ctx *c = calloc(1, sizeof(*c));
    memset(be, 0, sizeof(*be));
    if (c == NULL)
        return -1;
    c->boot = b;
    be->name = "nccl";
    be->nranks = b->nranks;
    be->ctx = c;
    be->run = nccl_run;
    be->check = nccl_check;
    if (nccl_setup(c, o, out)) {
        mscx_perf_nccl_close(be);
        return -1;
    }
    if (c->win_recv)
        be->name = "nccl-window"; /* what the JSON output's "backend" says */
    return 0;
}
