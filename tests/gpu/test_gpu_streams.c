/* SPDX-License-Identifier: MIT */
/*
 * Launches of one executor on several streams with no event between them
 * run in the order they were made (launch_order.h), as NCCL's launches of
 * one communicator do. plans/allreduce_n2_rpn2_oneshot_1K_16K.json, fp32
 * sum, two ranks on one GPU; every result is compared bit for bit with the
 * host executor. Modes (argv[1]):
 *   mproc  two processes, one rank each (CUDA IPC): 10,000 AllReduces
 *          alternating between two streams (4 KB on one, 12 KB on the
 *          other, out of place, every 4th one a scaled sum by 1, which
 *          goes through the staging buffer)
 *   local  the same with both ranks in one process (an in-process group,
 *          two streams per rank)
 *   graph  two processes: one CUDA graph captured from an origin stream
 *          with two branches forked from it, 100 AllReduces alternating
 *          between the branches, replayed 100 times (10,000 launches), an
 *          eager AllReduce on a third stream after each replay, outputs
 *          checked after every replay
 * Without the ordering, the launches of two streams read the same flag and
 * scratch half: wrong sums, or a wait the timeout ends (MSCX_TIMEOUT_MS is
 * set to 20 s here, so a hang fails instead of blocking). Exits 77 without
 * a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/plan.h"
#include "proc_mesh.h"
#include "test_data.h"
#include "gpu_test.h"

#define PLAN MSCX_SOURCE_ROOT "/plans/allreduce_n2_rpn2_oneshot_1K_16K.json"
#define NRANKS 2
#define NPAT 16        /* input patterns per size */
#define LAUNCHES 10000 /* mproc, local */
#define GLAUNCHES 100  /* per graph */
#define REPLAYS 100
#define SZMAX 12288u

static const uint64_t g_size[2] = {4096, 12288}; /* stream 0's, stream 1's */
static const char *g_mode;

struct rk {
    uint32_t rank;
    struct mscx_exec *ex;
    uint32_t pid;
    cudaStream_t st[2];
    float *din[2][NPAT]; /* per size */
    uint8_t *dout;       /* one slot of SZMAX per launch */
    float *one;          /* the device scalar 1.0f of the scaled launches */
};

static struct mscx_test_ref g_ref[2];

static int refs_make(const struct mscx_plan *plan)
{
    char err[512];
    for (int k = 0; k < 2; k++) {
        uint64_t in_b, out_b;
        mscx_coll_sizes(MSCX_COLL_ALLREDUCE, NRANKS, g_size[k], &in_b, &out_b);
        struct mscx_hostexec_cfg cfg = {in_b, out_b, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, NPAT,
                                        0,    0,     NULL,         NULL,           NULL};
        if (mscx_test_ref_run(plan, &cfg, MSCX_TEST_DATA_ANY, &g_ref[k], err, sizeof(err)) != MSCX_OK) {
            FAIL("host executor: %s", err);
            return 1;
        }
    }
    return 0;
}

/* Streams, the inputs of every pattern (filled as the host reference fills them) and the output slots. */
static int rk_buffers(struct rk *r, size_t slots)
{
    uint8_t *h = malloc(SZMAX);
    if (!h || cudaMalloc((void **)&r->dout, slots * SZMAX) != cudaSuccess ||
        cudaMalloc((void **)&r->one, sizeof(float)) != cudaSuccess) {
        FAIL("rank %u: allocation", r->rank);
        free(h);
        return 1;
    }
    float one = 1.0f;
    int bad = cudaMemcpy(r->one, &one, sizeof(one), cudaMemcpyHostToDevice) != cudaSuccess;
    for (int k = 0; k < 2 && !bad; k++) {
        bad |= cudaStreamCreateWithFlags(&r->st[k], cudaStreamNonBlocking) != cudaSuccess;
        for (int p = 0; p < NPAT && !bad; p++) {
            /* the reference's collected input is its output here: the plan runs in place */
            mscx_test_data_fill(h, g_size[k], MSCX_DT_FP32, mscx_test_data_seed(r->rank, (uint32_t)p, 0),
                                MSCX_TEST_DATA_ANY);
            bad |= cudaMalloc((void **)&r->din[k][p], g_size[k]) != cudaSuccess ||
                   cudaMemcpy(r->din[k][p], h, g_size[k], cudaMemcpyHostToDevice) != cudaSuccess;
        }
    }
    free(h);
    if (bad)
        FAIL("rank %u: buffers", r->rank);
    return bad;
}

/* Launch @p i of the eager modes: stream i % 2, pattern i % NPAT, output slot @p slot. */
static mscx_status_t launch(struct rk *r, uint32_t i, size_t slot, cudaStream_t s)
{
    int k = (int)(i & 1u);
    void *out = r->dout + slot * SZMAX;
    const void *in = r->din[k][(i / 2u) % NPAT];
    if (i % 4u == 3u) {
        struct mscx_scale one = {MSCX_SCALE_DEVICE, 0, r->one};
        return mscx_exec_launch_scaled(r->ex, r->pid, in, out, g_size[k], MSCX_DT_FP32, MSCX_REDOP_SUM, &one,
                                       MSCX_PKT_LL16, s);
    }
    return mscx_exec_launch(r->ex, r->pid, in, out, g_size[k], MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16,
                            s);
}

/* Output slots [0, n) of @p r against launches first .. first + n - 1 (slot j: launch first + j). */
static int check(struct rk *r, uint32_t first, size_t n, const char *what)
{
    size_t bytes = n * SZMAX;
    uint8_t *h = malloc(bytes);
    int bad = 0;
    if (!h || cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, r->dout, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        FAIL("rank %u: %s: %s", r->rank, what, cudaGetErrorString(cudaGetLastError()));
        free(h);
        return 1;
    }
    for (size_t j = 0; j < n && bad < 5; j++) {
        uint32_t i = first + (uint32_t)j;
        int k = (int)(i & 1u);
        const uint8_t *want = mscx_test_ref_out(&g_ref[k], (i / 2u) % NPAT, r->rank);
        uint64_t d = mscx_test_data_diff(h + j * SZMAX, want, g_size[k]);
        if (d != g_size[k]) {
            uint64_t w = d & ~(uint64_t)3;
            FAIL(
                "rank %u: %s: launch %u (stream %d, %llu bytes) differs from the host executor at byte %llu: "
                "word %02x%02x%02x%02x, expected %02x%02x%02x%02x",
                r->rank, what, i, k, (unsigned long long)g_size[k], (unsigned long long)d,
                h[j * SZMAX + w + 3], h[j * SZMAX + w + 2], h[j * SZMAX + w + 1], h[j * SZMAX + w],
                want[w + 3], want[w + 2], want[w + 1], want[w]);
            bad++;
        }
    }
    free(h);
    return bad != 0;
}

static int status_ok(const struct rk *r, mscx_status_t st, uint32_t i)
{
    if (st == MSCX_OK)
        return 1;
    FAIL("rank %u: launch %u: %s", r->rank, i, mscx_status_str(st));
    return 0;
}

/* mproc and local: LAUNCHES launches alternating between the two streams of each rank in @p rs. */
static int run_alternating(struct rk *rs, uint32_t nr)
{
    for (uint32_t q = 0; q < nr; q++)
        if (rk_buffers(&rs[q], LAUNCHES))
            return 1;
    for (uint32_t i = 0; i < LAUNCHES; i++)
        for (uint32_t q = 0; q < nr; q++)
            if (!status_ok(&rs[q], launch(&rs[q], i, i, rs[q].st[i & 1u]), i))
                return 1;
    int bad = 0;
    for (uint32_t q = 0; q < nr; q++) {
        bad |= check(&rs[q], 0, LAUNCHES, "alternating streams");
        bad |= mscx_exec_async_error(rs[q].ex) != MSCX_OK;
    }
    if (!bad)
        printf("%u launches per rank on two streams, all bit-exact\n", LAUNCHES);
    return bad;
}

/*
 * graph: capture GLAUNCHES launches alternating between two branches of
 * @p r's origin stream, replay the graph REPLAYS times, each followed by an
 * eager launch on a third stream without an event; eager launches before
 * the capture too.
 */
static int run_graph(struct rk *r)
{
    cudaStream_t origin, eager;
    cudaEvent_t fork_ev, join_ev[2];
    cudaGraph_t g;
    cudaGraphExec_t ge;
    if (rk_buffers(r, GLAUNCHES + 1) ||
        cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&join_ev[0], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&join_ev[1], cudaEventDisableTiming) != cudaSuccess) {
        FAIL("rank %u: graph setup", r->rank);
        return 1;
    }
    /* eager launches first (slot GLAUNCHES): the capture's first launch follows them */
    for (uint32_t i = 0; i < 8; i++)
        if (!status_ok(r, launch(r, 0, GLAUNCHES, eager), i))
            return 1;
    int bad = cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal) != cudaSuccess ||
              cudaEventRecord(fork_ev, origin) != cudaSuccess ||
              cudaStreamWaitEvent(r->st[0], fork_ev, 0) != cudaSuccess ||
              cudaStreamWaitEvent(r->st[1], fork_ev, 0) != cudaSuccess;
    for (uint32_t i = 0; i < GLAUNCHES && !bad; i++)
        bad = !status_ok(r, launch(r, i, i, r->st[i & 1u]), i);
    for (int k = 0; k < 2 && !bad; k++)
        bad = cudaEventRecord(join_ev[k], r->st[k]) != cudaSuccess ||
              cudaStreamWaitEvent(origin, join_ev[k], 0) != cudaSuccess;
    if (cudaStreamEndCapture(origin, &g) != cudaSuccess || bad ||
        cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        FAIL("rank %u: capture: %s", r->rank, cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    for (uint32_t rep = 0; rep < REPLAYS && !bad; rep++) {
        if (cudaMemsetAsync(r->dout, 0xff, GLAUNCHES * SZMAX, origin) != cudaSuccess ||
            cudaGraphLaunch(ge, origin) != cudaSuccess) {
            FAIL("rank %u: replay %u: %s", r->rank, rep, cudaGetErrorString(cudaGetLastError()));
            return 1;
        }
        if (!status_ok(r, launch(r, 0, GLAUNCHES, eager), rep)) /* launch 0: 4 KB, pattern 0 */
            return 1;
        bad |= check(r, 0, GLAUNCHES, "graph replay");
        uint8_t *h = malloc(SZMAX);
        const uint8_t *want = mscx_test_ref_out(&g_ref[0], 0, r->rank);
        if (!h ||
            cudaMemcpy(h, r->dout + GLAUNCHES * SZMAX, g_size[0], cudaMemcpyDeviceToHost) != cudaSuccess ||
            mscx_test_data_diff(h, want, g_size[0]) != g_size[0]) {
            FAIL("rank %u: the eager launch after replay %u differs from the host executor", r->rank, rep);
            bad = 1;
        }
        free(h);
    }
    bad |= mscx_exec_async_error(r->ex) != MSCX_OK;
    if (!bad)
        printf("rank %u: %u replays of %u launches on two branches, eager launches between, all bit-exact\n",
               r->rank, REPLAYS, GLAUNCHES);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return bad;
}

static int rank_main(struct proc_mesh *m, const struct mscx_plan *plan)
{
    struct rk r;
    memset(&r, 0, sizeof(r));
    r.rank = m->rank;
    struct mscx_bootstrap bs = {m->rank, m->nranks, m, proc_mesh_allgather, NULL};
    if (cudaSetDevice(0) != cudaSuccess || mscx_exec_create(&bs, 0, &r.ex) != MSCX_OK ||
        mscx_exec_add_plan(r.ex, plan, 65536, &r.pid) != MSCX_OK) {
        FAIL("rank %u: executor setup", m->rank);
        return 1;
    }
    int bad = strcmp(g_mode, "graph") == 0 ? run_graph(&r) : run_alternating(&r, 1);
    cudaDeviceSynchronize();
    mscx_exec_destroy(r.ex);
    return bad;
}

static int run_local(const struct mscx_plan *plan)
{
    struct rk rs[NRANKS];
    struct mscx_exec *ex[NRANKS];
    memset(rs, 0, sizeof(rs));
    if (mscx_exec_create_local_group(NRANKS, 0, ex) != MSCX_OK) {
        FAIL("local group");
        return 1;
    }
    for (uint32_t q = 0; q < NRANKS; q++) {
        rs[q].rank = q;
        rs[q].ex = ex[q];
        if (mscx_exec_add_plan(ex[q], plan, 65536, &rs[q].pid) != MSCX_OK) {
            FAIL("add_plan rank %u", q);
            return 1;
        }
    }
    int bad = run_alternating(rs, NRANKS);
    cudaDeviceSynchronize();
    for (uint32_t q = 0; q < NRANKS; q++)
        mscx_exec_destroy(ex[q]);
    return bad;
}

int main(int argc, char **argv)
{
    g_mode = argc > 1 ? argv[1] : "mproc";
    if (strcmp(g_mode, "mproc") != 0 && strcmp(g_mode, "local") != 0 && strcmp(g_mode, "graph") != 0) {
        fprintf(stderr, "unknown mode %s (mproc, local, graph)\n", g_mode);
        return 2;
    }
    if (!gpu_present()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    struct mscx_plan *plan;
    char err[512];
    if (mscx_config_override("MSCX_TIMEOUT_MS", "20000") != MSCX_OK ||
        mscx_plan_load(PLAN, &plan, err, sizeof(err)) != MSCX_OK) {
        FAIL("plan %s: %s", PLAN, err);
        return 1;
    }
    if (refs_make(plan))
        return 1;
    if (strcmp(g_mode, "local") == 0)
        return run_local(plan);
    struct proc_mesh m;
    pid_t pids[PROC_MESH_MAX];
    int r = proc_mesh_fork(&m, NRANKS, 120000, pids);
    if (r >= 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        int rc = rank_main(&m, plan);
        fflush(NULL);
        _exit(rc);
    }
    if (r == -2) {
        FAIL("cannot fork the ranks");
        return 1;
    }
    int code[PROC_MESH_MAX];
    int bad = proc_mesh_wait(pids, NRANKS, 500, code) != 0;
    for (uint32_t q = 0; q < NRANKS; q++)
        if (code[q] != 0) {
            FAIL("rank %u exited with %d", q, code[q]);
            bad = 1;
        }
    return bad;
}
