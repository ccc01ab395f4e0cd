/* SPDX-License-Identifier: MIT */
/*
 * One-rank identity plans on the GPU (onerank.h). Every shipped plan of
 * one rank, and a one-rank plan the decision refuses (a copy split into two
 * slices: its result is the input, but only a kernel computes it), through
 * mscx_exec_launch:
 *   - out of place, eager: the output is the input, the input and the bytes
 *     past the output are kept
 *   - in place, eager: the buffer is kept
 *   - captured in a CUDA graph: the identity plans' out-of-place launch is
 *     exactly one memcpy node and their in-place launch no node at all; the
 *     refused plan's launch is a kernel node; replays follow the input
 *   - buffers not 16-byte aligned (fp32), at odd addresses (int8), at the
 *     same offset within 16 bytes and at different ones (the eager copy
 *     kernel's word and byte paths)
 * Exits 77 without a GPU.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "mscx/exec.h"
#include "mscx/plan.h"
#include "gpu_test.h"

#define GUARD 64u
#define MAX_MSG (1u << 20)

static int g_checks;

static const char k_sliced[] =
    "{\"name\":\"sliced_copy_n1\",\"collective\":\"allgather\",\"protocol\":\"Simple\",\"inplace\":false,"
    "\"use_double_scratch_buffer\":false,\"buffer_alignment\":16,\"num_threads_per_block\":512,"
    "\"min_message_size\":0,\"max_message_size\":1048576,\"gpus\":[{\"id\":0,\"input_chunks\":1,"
    "\"output_chunks\":1,\"scratch_chunks\":0,\"channels\":[],\"remote_buffers\":[],\"semaphores\":[],"
    "\"threadblocks\":["
    "{\"id\":0,\"ops\":[{\"name\":\"copy\",\"src_buff\":[{\"type\":\"i\",\"index\":0,\"size\":1}],"
    "\"dst_buff\":[{\"type\":\"o\",\"index\":0,\"size\":1}],\"tbg_info\":{\"tb_id\":0,\"tbg_size\":2}}],"
    "\"channels\":[],\"remote_buffer_refs\":[]},"
    "{\"id\":1,\"ops\":[{\"name\":\"copy\",\"src_buff\":[{\"type\":\"i\",\"index\":0,\"size\":1}],"
    "\"dst_buff\":[{\"type\":\"o\",\"index\":0,\"size\":1}],\"tbg_info\":{\"tb_id\":1,\"tbg_size\":2}}],"
    "\"channels\":[],\"remote_buffer_refs\":[]}]}]}";

static void fill(uint8_t *p, uint64_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* Device buffers: input and output apart, each followed by GUARD bytes, at byte offsets @p skew_in and @p
 * skew_out. */
struct bufs {
    uint8_t *din, *dout, *hin, *hout, *want;
    uint64_t bytes;
};

static void bufs_init(struct bufs *b, uint64_t bytes, uint32_t skew_in, uint32_t skew_out, uint8_t **alloc_in,
                      uint8_t **alloc_out)
{
    CK(cudaMalloc((void **)alloc_in, bytes + GUARD + 16));
    CK(cudaMalloc((void **)alloc_out, bytes + GUARD + 16));
    b->din = *alloc_in + skew_in;
    b->dout = *alloc_out + skew_out;
    b->bytes = bytes;
    b->hin = malloc(bytes + GUARD);
    b->hout = malloc(bytes + GUARD);
    b->want = malloc(bytes + GUARD);
    if (!b->hin || !b->hout || !b->want) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
}

static void bufs_fini(struct bufs *b, uint8_t *alloc_in, uint8_t *alloc_out)
{
    cudaFree(alloc_in);
    cudaFree(alloc_out);
    free(b->hin);
    free(b->hout);
    free(b->want);
}

/* Fill the input with @p seed, the output (and its guard) with another pattern. */
static void bufs_fill(struct bufs *b, uint32_t seed)
{
    fill(b->hin, b->bytes + GUARD, seed);
    fill(b->hout, b->bytes + GUARD, seed ^ 0x5a5a5a5au);
    CK(cudaMemcpy(b->din, b->hin, b->bytes + GUARD, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b->dout, b->hout, b->bytes + GUARD, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* The output is the input and its guard unchanged; the input and its guard are kept. */
static void bufs_check(struct bufs *b, uint32_t seed, const char *what)
{
    g_checks++;
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b->hout, b->dout, b->bytes + GUARD, cudaMemcpyDeviceToHost));
    fill(b->want, b->bytes + GUARD, seed ^ 0x5a5a5a5au);
    fill(b->want, b->bytes, seed);
    if (memcmp(b->hout, b->want, b->bytes + GUARD) != 0)
        FAIL("%s: output differs", what);
    CK(cudaMemcpy(b->hout, b->din, b->bytes + GUARD, cudaMemcpyDeviceToHost));
    fill(b->want, b->bytes + GUARD, seed);
    if (memcmp(b->hout, b->want, b->bytes + GUARD) != 0)
        FAIL("%s: input changed", what);
}

/* The types of the nodes of @p graph: counts of memcpy and kernel nodes, and of all. */
static void graph_nodes(cudaGraph_t graph, size_t *all_p, size_t *memcpy_p, size_t *kernel_p)
{
    size_t n = 0;
    CK(cudaGraphGetNodes(graph, NULL, &n));
    *all_p = n;
    *memcpy_p = *kernel_p = 0;
    if (n == 0)
        return; /* the runtime refuses a node array with a count of 0 */
    cudaGraphNode_t *nodes = calloc(n, sizeof(*nodes));
    if (!nodes)
        exit(1);
    CK(cudaGraphGetNodes(graph, nodes, &n));
    for (size_t i = 0; i < n; i++) {
        enum cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(nodes[i], &t));
        *memcpy_p += t == cudaGraphNodeTypeMemcpy;
        *kernel_p += t == cudaGraphNodeTypeKernel;
    }
    free(nodes);
}

/* Capture one launch on @p s; the graph is returned. */
static cudaGraph_t capture(struct mscx_exec *ex, uint32_t pid, const void *in, void *out, uint64_t msg,
                           enum mscx_dtype dt, cudaStream_t s, const char *what)
{
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    mscx_status_t st = mscx_exec_launch(ex, pid, in, out, msg, dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, s);
    CK(cudaStreamEndCapture(s, &graph));
    if (st != MSCX_OK)
        FAIL("%s: captured launch: %s", what, mscx_status_str(st));
    return graph;
}

static void run_case(struct mscx_exec *ex, uint32_t pid, const struct mscx_plan *plan, int ident,
                     uint64_t msg, enum mscx_dtype dt, uint32_t skew_in, uint32_t skew_out, cudaStream_t s)
{
    char what[512];
    snprintf(what, sizeof(what), "%s, %llu bytes of %s at offsets %u and %u", mscx_plan_name(plan),
             (unsigned long long)msg, mscx_dtype_name(dt), skew_in, skew_out);
    uint8_t *ain, *aout;
    struct bufs b;
    bufs_init(&b, msg, skew_in, skew_out, &ain, &aout);
    uint32_t seed = (uint32_t)msg * 31u + skew_in * 7u + skew_out;

    /* eager, out of place */
    bufs_fill(&b, seed);
    mscx_status_t st = mscx_exec_launch(ex, pid, b.din, b.dout, msg, dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, s);
    if (st != MSCX_OK)
        FAIL("%s: launch: %s", what, mscx_status_str(st));
    bufs_check(&b, seed, what);

    /* eager, in place: the output buffer holds the input */
    bufs_fill(&b, seed + 1);
    CK(cudaMemcpy(b.dout, b.din, msg, cudaMemcpyDeviceToDevice));
    st = mscx_exec_launch(ex, pid, b.dout, b.dout, msg, dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, s);
    if (st != MSCX_OK)
        FAIL("%s: in-place launch: %s", what, mscx_status_str(st));
    bufs_check(&b, seed + 1, what);

    /* captured, in place: nothing for the identity */
    size_t all, ncopy, nkern;
    cudaGraph_t graph = capture(ex, pid, b.dout, b.dout, msg, dt, s, what);
    graph_nodes(graph, &all, &ncopy, &nkern);
    g_checks++;
    if (ident && all != 0)
        FAIL("%s: the in-place launch captured %zu nodes, expected none", what, all);
    if (!ident && nkern != 1)
        FAIL("%s: the in-place launch captured %zu kernel nodes of %zu, expected one", what, nkern, all);
    CK(cudaGraphDestroy(graph));

    /* captured, out of place: one memcpy node for the identity, else a kernel; replays follow the input */
    graph = capture(ex, pid, b.din, b.dout, msg, dt, s, what);
    graph_nodes(graph, &all, &ncopy, &nkern);
    g_checks++;
    if (ident && (all != 1 || ncopy != 1))
        FAIL("%s: the launch captured %zu nodes (%zu memcpy), expected one memcpy node", what, all, ncopy);
    if (!ident && nkern != 1)
        FAIL("%s: the launch captured %zu kernel nodes of %zu, expected one", what, nkern, all);
    cudaGraphExec_t gx;
    CK(cudaGraphInstantiate(&gx, graph, 0));
    for (uint32_t rep = 0; rep < 3; rep++) {
        bufs_fill(&b, seed + 2 + rep);
        CK(cudaGraphLaunch(gx, s));
        bufs_check(&b, seed + 2 + rep, what);
    }
    CK(cudaGraphExecDestroy(gx));
    CK(cudaGraphDestroy(graph));
    bufs_fini(&b, ain, aout);
}

static const uint64_t k_sizes[] = {1024, 4096 + 12, 65536, MAX_MSG};

static void test_plan(const struct mscx_plan *plan, int ident, cudaStream_t s)
{
    struct mscx_exec *ex;
    uint32_t pid;
    if (mscx_exec_create_local_group(1, 0, &ex) != MSCX_OK) {
        FAIL("%s: executor", mscx_plan_name(plan));
        return;
    }
    mscx_status_t st = mscx_exec_add_plan(ex, plan, MAX_MSG + 64, &pid);
    if (st != MSCX_OK) {
        FAIL("%s: add_plan: %s", mscx_plan_name(plan), mscx_status_str(st));
        mscx_exec_destroy(ex);
        return;
    }
    for (size_t i = 0; i < sizeof(k_sizes) / sizeof(k_sizes[0]); i++)
        run_case(ex, pid, plan, ident, k_sizes[i], MSCX_DT_FP32, 0, 0, s);
    /* not 16-byte aligned: both at the same offset within 16 bytes, and at different ones */
    run_case(ex, pid, plan, ident, 4 * 1027, MSCX_DT_FP32, 4, 4, s);
    run_case(ex, pid, plan, ident, 4 * 1027, MSCX_DT_FP32, 4, 8, s);
    run_case(ex, pid, plan, ident, 4 * 259, MSCX_DT_FP32, 12, 12, s);
    if (mscx_plan_supports(plan, MSCX_DT_INT8, MSCX_REDOP_SUM)) {
        run_case(ex, pid, plan, ident, 1027, MSCX_DT_INT8, 1, 2, s);
        run_case(ex, pid, plan, ident, 65536 + 3, MSCX_DT_INT8, 3, 3, s);
    }
    CK(cudaStreamSynchronize(s));
    if ((st = mscx_exec_async_error(ex)) != MSCX_OK)
        FAIL("%s: async error %s", mscx_plan_name(plan), mscx_status_str(st));
    mscx_exec_destroy(ex);
    printf("%s %s (%s)\n", failures ? "FAIL" : "ok  ", mscx_plan_name(plan), ident ? "identity" : "kernel");
    fflush(stdout);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const char *dir = MSCX_SOURCE_ROOT "/plans";
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort), nplans = 0;
    if (n < 0) {
        fprintf(stderr, "cannot read %s\n", dir);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        size_t l = strlen(nm);
        char path[4096], err[MSCX_PLAN_ERR_LEN];
        struct mscx_plan *plan;
        snprintf(path, sizeof(path), "%s/%s", dir, nm);
        if (l > 5 && strcmp(nm + l - 5, ".json") == 0) {
            if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
                FAIL("load %s: %s", path, err);
            } else {
                if (mscx_plan_nranks(plan) == 1) {
                    test_plan(plan, 1, s);
                    nplans++;
                }
                mscx_plan_destroy(plan);
            }
        }
        free(ents[i]);
    }
    free(ents);
    if (nplans < 3)
        FAIL("%d shipped one-rank plans found, expected one per collective at least", nplans);
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *sliced;
    if (mscx_plan_load_buffer(k_sliced, strlen(k_sliced), "sliced", &sliced, err, sizeof(err)) != MSCX_OK) {
        FAIL("load the sliced plan: %s", err);
    } else {
        test_plan(sliced, 0, s);
        mscx_plan_destroy(sliced);
    }
    CK(cudaStreamDestroy(s));
    printf("%d checks, %d failures\n", g_checks, failures);
    return failures ? 1 : 0;
}
