/* SPDX-License-Identifier: MIT */
/*
 * A program that calls the NCCL API the way nccl-tests does, on one GPU with
 * a world of one rank: ncclGetUniqueId + ncclCommInitRank, then AllReduce
 * (sum, max, min, prod) over fp32/fp16/bf16/int32 at sizes on both sides of
 * the shipped one-rank plans' ranges (odd element counts included),
 * AllGather, ReduceScatter and Broadcast, in-place and out-of-place, eagerly
 * and inside a CUDA graph capture replayed several times.
 *
 *   test-nccl-api OUTFILE
 *
 * Every output buffer, with guard elements past its end, is written to
 * OUTFILE (a text header per case, then the raw bytes), so that a run on
 * stock NCCL and one with the shim preloaded can be compared bit for bit
 * (tests/gpu/nccl_compare.py). The program also checks every result itself
 * (with one rank every collective is a copy) and exits 1 on a wrong one.
 * Exits 77 when no GPU is present.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define GUARD 64 /* elements past the end of every output */

static FILE *out;
static int wrong_total;
static int call_fail;

#define NCCL_OK(call)                                                                                        \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        if (r_ != ncclSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_),     \
                    ncclGetLastError(NULL));                                                                 \
            call_fail++;                                                                                     \
        }                                                                                                    \
    } while (0)

#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static size_t dt_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    default:
        return 4;
    }
}

static const char *dt_name(ncclDataType_t dt)
{
    switch (dt) {
    case ncclFloat32:
        return "float";
    case ncclFloat16:
        return "half";
    case ncclBfloat16:
        return "bf16";
    case ncclInt32:
        return "int32";
    default:
        return "?";
    }
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *const n[] = {"sum", "prod", "max", "min"};
    return (int)op >= 0 && (int)op < 4 ? n[op] : "?";
}

/* Finite values of every type from a seed: small integers times powers of two. */
static void fill(void *host, ncclDataType_t dt, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 2654435761u + seed * 97u) % 2001u) - 1000;
        switch (dt) {
        case ncclFloat32:
            ((float *)host)[i] = (float)v * 0.125f;
            break;
        case ncclInt32:
            ((int32_t *)host)[i] = v * 7919;
            break;
        case ncclFloat16: {
            /* sign, exponent 10..20, 10 mantissa bits: always finite */
            uint16_t h = (uint16_t)(((unsigned)v & 0x8000u) | ((10u + (unsigned)(i % 11u)) << 10) |
                                    ((unsigned)(i * 37u + seed) & 0x3ffu));
            ((uint16_t *)host)[i] = h;
            break;
        }
        case ncclBfloat16: {
            uint16_t b = (uint16_t)(((unsigned)v & 0x8000u) | ((120u + (unsigned)(i % 13u)) << 7) |
                                    ((unsigned)(i * 53u + seed) & 0x7fu));
            ((uint16_t *)host)[i] = b;
            break;
        }
        default:
            break;
        }
    }
}

struct bufs {
    void *send, *recv;    /* device */
    unsigned char *h_in;  /* host copy of the input */
    unsigned char *h_out; /* host copy of recv incl. guard */
    size_t in_bytes, out_bytes;
};

/* Dump recv (out_elems + GUARD) and check it: data must equal @p expect, the guard 0xA5. */
static void record(const char *name, const struct bufs *b, const void *recv, size_t out_bytes,
                   const void *expect, size_t esize, cudaStream_t s)
{
    size_t total = out_bytes + GUARD * esize;
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(b->h_out, recv, total, cudaMemcpyDeviceToHost));
    int wrong = memcmp(b->h_out, expect, out_bytes) != 0;
    for (size_t i = out_bytes; i < total; i++)
        wrong |= b->h_out[i] != 0xA5;
    if (wrong) {
        fprintf(stderr, "WRONG: %s\n", name);
        wrong_total++;
    }
    fprintf(out, "%s bytes=%zu wrong=%d\n", name, total, wrong);
    fwrite(b->h_out, 1, total, out);
    fputc('\n', out);
}

static void prepare(struct bufs *b, void *recv, size_t out_bytes, size_t esize)
{
    CUDA_OK(cudaMemset(recv, 0xA5, out_bytes + GUARD * esize));
    CUDA_OK(cudaMemcpy(b->send, b->h_in, b->in_bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
    CUDA_OK(cudaDeviceSynchronize()); /* the legacy-stream memset/copy must land before work on s */
}

enum coll { AR, AG, RS, BC };
static const char *const coll_names[] = {"allreduce", "allgather", "reducescatter", "broadcast"};

/* One eager call; in place: the input sits where NCCL expects it inside recv. */
static void one(ncclComm_t comm, cudaStream_t s, struct bufs *b, enum coll c, ncclDataType_t dt,
                ncclRedOp_t op, size_t count, int in_place)
{
    size_t esize = dt_size(dt), bytes = count * esize;
    char name[160];
    b->in_bytes = bytes;
    fill(b->h_in, dt, count, (unsigned)(count + (size_t)c * 13 + (size_t)dt * 5 + (size_t)op));
    snprintf(name, sizeof(name), "%s %s %s count=%zu %s", coll_names[c], dt_name(dt),
             c == AR || c == RS ? op_name(op) : "-", count, in_place ? "in-place" : "out-of-place");
    void *recv = in_place ? b->send : b->recv;
    if (in_place) {
        CUDA_OK(cudaMemset(b->send, 0xA5, bytes + GUARD * esize));
        CUDA_OK(cudaMemcpy(b->send, b->h_in, bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
        CUDA_OK(cudaDeviceSynchronize());
    } else {
        prepare(b, recv, bytes, esize);
    }
    const void *send = b->send;
    switch (c) {
    case AR:
        NCCL_OK(ncclAllReduce(send, recv, count, dt, op, comm, s));
        break;
    case AG:
        NCCL_OK(ncclAllGather(send, recv, count, dt, comm, s));
        break;
    case RS:
        NCCL_OK(ncclReduceScatter(send, recv, count, dt, op, comm, s));
        break;
    case BC:
        NCCL_OK(ncclBroadcast(send, recv, count, dt, 0, comm, s));
        break;
    }
    record(name, b, recv, bytes, b->h_in, esize, s);
}

/* A captured sequence replayed with new inputs each time, as nccl-tests -G does. */
static void graph(ncclComm_t comm, cudaStream_t s, struct bufs *b)
{
    const size_t count = 4099; /* fp32: 16396 bytes, inside the one-rank plans' range */
    const size_t small = 3;    /* 12 bytes: below the range, NCCL inside the same graph */
    size_t bytes = count * 4;
    float *recv2 = (float *)b->recv + count + GUARD;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    NCCL_OK(ncclAllReduce(b->send, b->recv, count, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclAllReduce(b->send, recv2, small, ncclFloat32, ncclMax, comm, s));
    NCCL_OK(ncclAllGather(b->recv, b->recv, count, ncclFloat32, comm, s)); /* in place */
    NCCL_OK(ncclBroadcast(b->recv, b->recv, count, ncclFloat32, 0, comm, s));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    for (int rep = 0; rep < 4; rep++) {
        char name[96];
        b->in_bytes = bytes;
        fill(b->h_in, ncclFloat32, count, 1000u + (unsigned)rep);
        CUDA_OK(cudaMemset(b->recv, 0xA5, (count + GUARD) * 4 * 2));
        CUDA_OK(cudaMemcpy(b->send, b->h_in, bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaGraphLaunch(ge, s));
        snprintf(name, sizeof(name), "graph replay %d allreduce+allgather+broadcast count=%zu", rep, count);
        record(name, b, b->recv, bytes, b->h_in, 4, s);
        snprintf(name, sizeof(name), "graph replay %d allreduce max count=%zu", rep, small);
        record(name, b, recv2, small * 4, b->h_in, 4, s);
    }
    CUDA_OK(cudaGraphExecDestroy(ge));
    CUDA_OK(cudaGraphDestroy(g));
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTFILE\n", argv[0]);
        return 2;
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        return 2;
    }
    Dl_info info;
    int version = 0;
    if (dladdr((void *)ncclAllReduce, &info) && info.dli_fname)
        fprintf(stderr, "ncclAllReduce from %s\n", info.dli_fname);
    ncclGetVersion(&version);
    fprintf(stderr, "ncclGetVersion %d\n", version);

    CUDA_OK(cudaSetDevice(0));
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t s;
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
    if (call_fail)
        return 1;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const size_t max_count = (1u << 20) + 3;
    struct bufs b;
    size_t cap = (max_count + GUARD) * 4 * 2;
    CUDA_OK(cudaMalloc(&b.send, cap));
    CUDA_OK(cudaMalloc(&b.recv, cap));
    b.h_in = malloc(cap);
    b.h_out = malloc(cap);
    if (!b.h_in || !b.h_out)
        return 1;

    /* bytes: below 1K, at the plans' 1K edge +-1 element, inside, at 1M, above */
    static const size_t counts[] = {1, 7, 255, 256, 257, 513, 4099, 65537, 262144, 262147, max_count};
    static const ncclDataType_t dts[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32};
    static const ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclMin, ncclProd};
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (size_t di = 0; di < 4; di++)
            for (int ip = 0; ip < 2; ip++) {
                for (size_t oi = 0; oi < 4; oi++)
                    one(comm, s, &b, AR, dts[di], ops[oi], counts[ci], ip);
                one(comm, s, &b, AG, dts[di], ncclSum, counts[ci], ip);
                one(comm, s, &b, RS, dts[di], di == 3 ? ncclMax : ncclSum, counts[ci], ip);
                one(comm, s, &b, BC, dts[di], ncclSum, counts[ci], ip);
            }
    graph(comm, s, &b);
    /* nccl-tests' ncclBcast in place */
    b.in_bytes = 4099 * 4;
    fill(b.h_in, ncclFloat32, 4099, 77);
    CUDA_OK(cudaMemset(b.recv, 0xA5, (4099 + GUARD) * 4));
    CUDA_OK(cudaMemcpy(b.recv, b.h_in, b.in_bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
    CUDA_OK(cudaDeviceSynchronize());
    NCCL_OK(ncclBcast(b.recv, 4099, ncclFloat32, 0, comm, s));
    record("bcast float count=4099 in-place", &b, b.recv, b.in_bytes, b.h_in, 4, s);

    CUDA_OK(cudaStreamSynchronize(s));
    NCCL_OK(ncclCommDestroy(comm));
    cudaFree(b.send);
    cudaFree(b.recv);
    free(b.h_in);
    free(b.h_out);
    fclose(out);
    fprintf(stderr, "test-nccl-api: %d wrong results, %d failed calls\n", wrong_total, call_fail);
    return wrong_total || call_fail ? 1 : 0;
}
