/* SPDX-License-Identifier: MIT */
/*
 * Collectives inside ncclGroupStart/End on one GPU with a world of one rank,
 * as nccl-tests -m 4 and PyTorch's coalesced collectives issue them:
 *
 *   group4   four allreduces on one stream
 *   streams  allreduce, allgather and reducescatter on two streams; after
 *            ncclGroupEnd each stream copies what the other's calls wrote
 *            (right only when every stream waits for the whole group)
 *   mixed    allreduces around an ncclSend/ncclRecv to itself (the pair
 *            goes to NCCL; each allreduce routes, the first launched before
 *            NCCL's group end, the second after it)
 *   graph    a group of three calls captured in a CUDA graph, replayed
 *            three times with new inputs
 *   sendrecv a group of one ncclSend and one ncclRecv to itself (an AlltoAll
 *            of one rank) at 400 B, 1 KB, 16 KB and 1 MB, 1 KB in place, and
 *            captured in a graph replayed three times
 *   nonblocking  on a ready non-blocking communicator, a group of two
 *            allreduces that also creates a second non-blocking
 *            communicator: ncclGroupEnd answers ncclInProgress, and both
 *            allreduces must still run
 *
 *   test-gpu-group OUTFILE
 *
 * Every output (with guard elements past its end) is written to OUTFILE, so
 * that a run on stock NCCL and one with the shim preloaded compare bit for
 * bit (tests/gpu/nccl_compare.py); with one rank every collective is a copy,
 * which the program checks itself (exit 1 on a wrong result). Exits 77 when
 * no GPU is present.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define GUARD 64
#define NBUF 8

static FILE *out;
static int failed;

#define CHECK(what, ok)                                                                                      \
    do {                                                                                                     \
        if (!(ok)) {                                                                                         \
            fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, what);                                 \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)
#define NCCL_OK(call) CHECK(#call, (call) == ncclSuccess)
#define CUDA_OK(call) CHECK(#call, (call) == cudaSuccess)

struct buf {
    size_t n;   /* elements of the input and the output */
    size_t cap; /* elements allocated, guard excluded */
    float *in, *out;
};

static struct buf bufs[NBUF];

static void buf_init(struct buf *b, size_t n, int seed)
{
    float *h = malloc((n + GUARD) * sizeof(float));
    CHECK("malloc", h);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((i * 7 + (size_t)seed * 131) % 1000) - 500.0f;
    b->n = n;
    if (b->cap < n) { /* the same buffers for the same size: a captured graph keeps their addresses */
        cudaFree(b->in);
        cudaFree(b->out);
        CUDA_OK(cudaMalloc((void **)&b->in, (n + GUARD) * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&b->out, (n + GUARD) * sizeof(float)));
        b->cap = n;
    }
    CUDA_OK(cudaMemcpy(b->in, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(b->out, 0xff, (n + GUARD) * sizeof(float)));
    /* both run on the legacy stream, which the test's non-blocking streams do not wait for */
    CUDA_OK(cudaDeviceSynchronize());
    free(h);
}

/* Dump @p dev (n elements and the guard) and check it equals @p want (n elements of device memory). */
static void dump(const char *name, const float *dev, const float *want, size_t n)
{
    float *h = malloc((n + GUARD) * sizeof(float)), *w = malloc(n * sizeof(float));
    CHECK("malloc", h && w);
    CUDA_OK(cudaMemcpy(h, dev, (n + GUARD) * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(w, want, n * sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = memcmp(h, w, n * sizeof(float)) != 0;
    for (size_t i = n; i < n + GUARD; i++) {
        uint32_t bits;
        memcpy(&bits, &h[i], sizeof(bits));
        wrong |= bits != 0xffffffffu;
    }
    if (wrong) {
        fprintf(stderr, "%s: wrong result\n", name);
        failed = 1;
    }
    /* the dump format of nccl_compare.py: a header with the byte count, the bytes, a newline */
    fprintf(out, "%s bytes=%zu wrong=%d\n", name, (n + GUARD) * sizeof(float), wrong);
    fwrite(h, sizeof(float), n + GUARD, out);
    fputc('\n', out);
    free(h);
    free(w);
}

static void allreduce(struct buf *b, ncclComm_t comm, cudaStream_t s)
{
    NCCL_OK(ncclAllReduce(b->in, b->out, b->n, ncclFloat32, ncclSum, comm, s));
}

static void run_group4(ncclComm_t comm, cudaStream_t s1)
{
    static const size_t n[4] = {256, 1024, 4096, 65536};
    for (int i = 0; i < 4; i++)
        buf_init(&bufs[i], n[i], i);
    NCCL_OK(ncclGroupStart());
    for (int i = 0; i < 4; i++)
        allreduce(&bufs[i], comm, s1);
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s1));
    for (int i = 0; i < 4; i++)
        dump("group4", bufs[i].out, bufs[i].in, bufs[i].n);
}

static void run_streams(ncclComm_t comm, cudaStream_t s1, cudaStream_t s2)
{
    buf_init(&bufs[0], 262144, 10); /* 1 MiB on s2: still running when s1 would not wait */
    buf_init(&bufs[1], 1024, 11);
    buf_init(&bufs[2], 4096, 12);
    buf_init(&bufs[3], 4096, 13);
    buf_init(&bufs[4], 262144, 14); /* s1's copy of bufs[0].out */
    buf_init(&bufs[5], 4096, 15);   /* s2's copy of bufs[3].out */
    NCCL_OK(ncclGroupStart());
    allreduce(&bufs[0], comm, s2);
    allreduce(&bufs[1], comm, s1);
    NCCL_OK(ncclAllGather(bufs[2].in, bufs[2].out, bufs[2].n, ncclFloat32, comm, s2));
    NCCL_OK(ncclReduceScatter(bufs[3].in, bufs[3].out, bufs[3].n, ncclFloat32, ncclSum, comm, s1));
    NCCL_OK(ncclGroupEnd());
    size_t b0 = bufs[0].n * sizeof(float), b3 = bufs[3].n * sizeof(float);
    CUDA_OK(cudaMemcpyAsync(bufs[4].out, bufs[0].out, b0, cudaMemcpyDeviceToDevice, s1));
    CUDA_OK(cudaMemcpyAsync(bufs[5].out, bufs[3].out, b3, cudaMemcpyDeviceToDevice, s2));
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; i++)
        dump("streams", bufs[i].out, bufs[i].in, bufs[i].n);
    dump("streams-s1-copy", bufs[4].out, bufs[0].in, bufs[0].n);
    dump("streams-s2-copy", bufs[5].out, bufs[3].in, bufs[3].n);
}

static void run_mixed(ncclComm_t comm, cudaStream_t s1)
{
    buf_init(&bufs[0], 256, 20);
    buf_init(&bufs[1], 1024, 21);
    buf_init(&bufs[2], 512, 22);
    NCCL_OK(ncclGroupStart());
    allreduce(&bufs[0], comm, s1);
    NCCL_OK(ncclSend(bufs[1].in, bufs[1].n, ncclFloat32, 0, comm, s1));
    NCCL_OK(ncclRecv(bufs[1].out, bufs[1].n, ncclFloat32, 0, comm, s1));
    allreduce(&bufs[2], comm, s1);
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s1));
    for (int i = 0; i < 3; i++)
        dump("mixed", bufs[i].out, bufs[i].in, bufs[i].n);
}

static void run_graph(ncclComm_t comm, cudaStream_t s1)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    buf_init(&bufs[0], 256, 30);
    buf_init(&bufs[1], 4096, 31);
    buf_init(&bufs[2], 1024, 32);
    CUDA_OK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    NCCL_OK(ncclGroupStart());
    allreduce(&bufs[0], comm, s1);
    allreduce(&bufs[1], comm, s1);
    NCCL_OK(ncclAllGather(bufs[2].in, bufs[2].out, bufs[2].n, ncclFloat32, comm, s1));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamEndCapture(s1, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < 3; i++)
            buf_init(&bufs[i], bufs[i].n, 40 + 3 * rep + i);
        CUDA_OK(cudaGraphLaunch(exec, s1));
        CUDA_OK(cudaStreamSynchronize(s1));
        for (int i = 0; i < 3; i++)
            dump("graph", bufs[i].out, bufs[i].in, bufs[i].n);
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
}

/* One ncclSend and one ncclRecv of @p b to and from this rank, in a group: an AlltoAll of one rank. */
static void self_pair(struct buf *b, ncclComm_t comm, cudaStream_t s)
{
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(b->in, b->n, ncclFloat32, 0, comm, s));
    NCCL_OK(ncclRecv(b->out, b->n, ncclFloat32, 0, comm, s));
    NCCL_OK(ncclGroupEnd());
}

static void run_sendrecv(ncclComm_t comm, cudaStream_t s1)
{
    /* 400 B has no plan (NCCL); 1 KB, 16 KB and 1 MB run as the one-rank AlltoAll */
    static const size_t n[4] = {100, 256, 4096, 262144};
    for (int i = 0; i < 4; i++) {
        buf_init(&bufs[i], n[i], 50 + i);
        self_pair(&bufs[i], comm, s1);
    }
    buf_init(&bufs[4], 256, 55); /* in place: the output holds the input and is both buffers */
    CUDA_OK(cudaMemcpy(bufs[4].out, bufs[4].in, bufs[4].n * sizeof(float), cudaMemcpyDeviceToDevice));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(bufs[4].out, bufs[4].n, ncclFloat32, 0, comm, s1));
    NCCL_OK(ncclRecv(bufs[4].out, bufs[4].n, ncclFloat32, 0, comm, s1));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s1));
    for (int i = 0; i < 4; i++)
        dump("sendrecv", bufs[i].out, bufs[i].in, bufs[i].n);
    dump("sendrecv-in-place", bufs[4].out, bufs[4].in, bufs[4].n);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    buf_init(&bufs[0], 1024, 60);
    CUDA_OK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    self_pair(&bufs[0], comm, s1);
    CUDA_OK(cudaStreamEndCapture(s1, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        buf_init(&bufs[0], bufs[0].n, 61 + rep);
        CUDA_OK(cudaGraphLaunch(exec, s1));
        CUDA_OK(cudaStreamSynchronize(s1));
        dump("sendrecv-graph", bufs[0].out, bufs[0].in, bufs[0].n);
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
}

static ncclComm_t init_nonblocking(ncclResult_t *res_p)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_OK(ncclGetUniqueId(&id));
    *res_p = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    CHECK("a non-blocking init", (*res_p == ncclSuccess || *res_p == ncclInProgress) && comm);
    return comm;
}

/* Poll as NCCL's users of non-blocking communicators must. */
static void wait_ready(ncclComm_t comm)
{
    ncclResult_t async = ncclInProgress;
    while (async == ncclInProgress)
        NCCL_OK(ncclCommGetAsyncError(comm, &async));
    CHECK("a non-blocking communicator's work", async == ncclSuccess);
}

/* An allreduce on a non-blocking communicator outside a group: NCCL may answer ncclInProgress. */
static void allreduce_nb(struct buf *b, ncclComm_t comm, cudaStream_t s)
{
    ncclResult_t r = ncclAllReduce(b->in, b->out, b->n, ncclFloat32, ncclSum, comm, s);
    CHECK("ncclAllReduce on a non-blocking communicator", r == ncclSuccess || r == ncclInProgress);
}

static void run_nonblocking(cudaStream_t s1)
{
    ncclResult_t r;
    ncclComm_t a = init_nonblocking(&r);
    wait_ready(a);
    buf_init(&bufs[0], 256, 40);
    buf_init(&bufs[1], 512, 41);
    buf_init(&bufs[2], 256, 42);
    allreduce_nb(&bufs[2], a, s1); /* the shim sets a up at its first collective outside a group */
    wait_ready(a);
    NCCL_OK(ncclGroupStart());
    allreduce(&bufs[0], a, s1);
    ncclComm_t b = init_nonblocking(&r);
    allreduce(&bufs[1], a, s1);
    r = ncclGroupEnd();
    CHECK("ncclGroupEnd of a group creating a non-blocking communicator",
          r == ncclSuccess || r == ncclInProgress);
    wait_ready(a);
    wait_ready(b);
    CUDA_OK(cudaStreamSynchronize(s1));
    for (int i = 0; i < 3; i++)
        dump("nonblocking", bufs[i].out, bufs[i].in, bufs[i].n);
    NCCL_OK(ncclCommDestroy(b));
    NCCL_OK(ncclCommDestroy(a));
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (argc != 2 || !(out = fopen(argv[1], "wb"))) {
        fprintf(stderr, "usage: %s OUTFILE\n", argv[0]);
        return 2;
    }
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s1, s2;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
    run_group4(comm, s1);
    run_streams(comm, s1, s2);
    run_mixed(comm, s1);
    run_graph(comm, s1);
    run_sendrecv(comm, s1);
    NCCL_OK(ncclCommDestroy(comm));
    run_nonblocking(s1);
    for (int i = 0; i < NBUF; i++) {
        cudaFree(bufs[i].in);
        cudaFree(bufs[i].out);
    }
    fclose(out);
    printf("%s\n", failed ? "FAIL" : "ok");
    return failed;
}
