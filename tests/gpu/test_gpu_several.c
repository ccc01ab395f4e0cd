/* SPDX-License-Identifier: MIT */
/*
 * Several communicators created together on one thread, one GPU each, as
 * ncclCommInitAll and nccl-tests -g N make them: the shim sets each up in a
 * thread of its own, and the ranks of this process then reach each other
 * through plain pointers with peer access (the executor's in-process path).
 * N is the largest of 8, 4, 2 that the GPUs allow.
 *
 *   initall  ncclCommInitAll of N
 *   group    N ncclCommInitRank in one ncclGroupStart/End, on one thread
 *
 * After each, every rank's thread runs fp32 sum allreduces of 1 KB, 16 KB
 * and 64 KB on its own stream (outside a group) and checks the sums itself
 * (small integers: exact in any order); the outputs are written to OUTFILE
 * for tests/gpu/nccl_compare.py, which also requires that the shim routed
 * them. The caller's current device must be the same after each init.
 *
 *   test-gpu-several OUTFILE
 *
 * Exits 77 with fewer than two GPUs.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define MAXR 8

#define CHECK(what, ok)                                                                                      \
    do {                                                                                                     \
        if (!(ok)) {                                                                                         \
            fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, what);                                 \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)
#define NCCL_OK(call) CHECK(#call, (call) == ncclSuccess)
#define CUDA_OK(call) CHECK(#call, (call) == cudaSuccess)

static const size_t counts[] = {256, 4096, 16384};
#define NCOUNT (sizeof(counts) / sizeof(counts[0]))

struct rank {
    int r, n;
    ncclComm_t comm;
    float *out[NCOUNT]; /* host copies of the outputs */
};

static float input(int r, size_t i)
{
    return (float)((i * 7 + (size_t)r * 131) % 1000) - 500.0f;
}

static void *rank_main(void *arg)
{
    struct rank *k = arg;
    cudaStream_t s;
    CUDA_OK(cudaSetDevice(k->r));
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t c = 0; c < NCOUNT; c++) {
        size_t n = counts[c];
        float *h = malloc(n * sizeof(float)), *din, *dout;
        CHECK("malloc", h && (k->out[c] = malloc(n * sizeof(float))));
        for (size_t i = 0; i < n; i++)
            h[i] = input(k->r, i);
        CUDA_OK(cudaMalloc((void **)&din, n * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&dout, n * sizeof(float)));
        CUDA_OK(cudaMemcpy(din, h, n * sizeof(float), cudaMemcpyHostToDevice));
        NCCL_OK(ncclAllReduce(din, dout, n, ncclFloat, ncclSum, k->comm, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(k->out[c], dout, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int q = 0; q < k->n; q++)
                want += input(q, i);
            if (k->out[c][i] != want) {
                fprintf(stderr, "rank %d: allreduce of %zu floats: [%zu] = %g, expected %g\n", k->r, n, i,
                        (double)k->out[c][i], (double)want);
                exit(1);
            }
        }
        CUDA_OK(cudaFree(din));
        CUDA_OK(cudaFree(dout));
        free(h);
    }
    CUDA_OK(cudaStreamDestroy(s));
    return NULL;
}

/* Every rank's allreduces, one thread each; outputs dumped under @p mode. */
static void run_ranks(FILE *out, const char *mode, ncclComm_t *comms, int n)
{
    struct rank ranks[MAXR];
    pthread_t tid[MAXR];
    for (int r = 0; r < n; r++) {
        ranks[r] = (struct rank){.r = r, .n = n, .comm = comms[r]};
        CHECK("pthread_create", pthread_create(&tid[r], NULL, rank_main, &ranks[r]) == 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < n; r++)
        for (size_t c = 0; c < NCOUNT; c++) {
            fprintf(out, "%s-rank%d-%zu bytes=%zu\n", mode, r, counts[c], counts[c] * sizeof(float));
            fwrite(ranks[r].out[c], sizeof(float), counts[c], out);
            fputc('\n', out);
            free(ranks[r].out[c]);
        }
    for (int r = 0; r < n; r++)
        NCCL_OK(ncclCommDestroy(comms[r]));
}

static void expect_device(int want, const char *after)
{
    int dev = -1;
    CUDA_OK(cudaGetDevice(&dev));
    if (dev != want) {
        fprintf(stderr, "the current device is %d after %s, was %d\n", dev, after, want);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTFILE\n", argv[0]);
        return 2;
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        printf("fewer than two GPUs: skipped\n");
        return 77;
    }
    int n = ndev >= 8 ? 8 : ndev >= 4 ? 4 : 2;
    FILE *out = fopen(argv[1], "wb");
    CHECK("fopen", out);
    ncclComm_t comms[MAXR];
    int devs[MAXR];
    for (int r = 0; r < n; r++)
        devs[r] = r;

    CUDA_OK(cudaSetDevice(n - 1));
    NCCL_OK(ncclCommInitAll(comms, n, devs));
    expect_device(n - 1, "ncclCommInitAll");
    run_ranks(out, "initall", comms, n);

    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    CUDA_OK(cudaSetDevice(0));
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
        CUDA_OK(cudaSetDevice(r));
        NCCL_OK(ncclCommInitRank(&comms[r], n, id, r));
    }
    CUDA_OK(cudaSetDevice(0));
    NCCL_OK(ncclGroupEnd());
    expect_device(0, "a group of ncclCommInitRank");
    run_ranks(out, "group", comms, n);
    CHECK("fclose", fclose(out) == 0);
    printf("%d communicators created together, by ncclCommInitAll and in a group: every allreduce right\n",
           n);
    return 0;
}
