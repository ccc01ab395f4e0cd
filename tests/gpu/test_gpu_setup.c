/* SPDX-License-Identifier: MIT */
/*
 * Executor setup has no device-wide side effects. Modes (argv[1]):
 *   busy    creating executors and adding a plan while another stream is
 *           held busy (a host function that waits up to 3 s, on a blocking
 *           stream, so the legacy default stream waits for it too) returns
 *           within 1 s: setup waits for its own stream only
 *   device  create, add_plan and destroy leave the caller's current device
 *           as it was (device 1 current, where there are two GPUs), also
 *           when create fails
 *   threads two ranks in one process on GPUs 0 and 1, one thread each (as
 *           nccl-tests -t 2): an allreduce through raw pointers to the other
 *           GPU's memory is right (peer access enabled by add_plan); skipped
 *           on one GPU
 * Exits 77 when no GPU is present.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "mscx/exec.h"
#include "mscx/plan.h"
#include "gpu_test.h"

#define BUSY_MS 3000
#define SETUP_LIMIT_MS 1000
#define MSG (64u * 1024u)

static const char *g_plan_path =
    MSCX_SOURCE_ROOT "/tests/data/mscclpp/mscclpp-algo-plans/allreduce_pkt_n2.json";

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static struct mscx_plan *load_plan(void)
{
    struct mscx_plan *plan;
    char err[1024];
    if (mscx_plan_load(g_plan_path, &plan, err, sizeof(err)) != MSCX_OK) {
        FAIL("load %s: %s", g_plan_path, err);
        return NULL;
    }
    return plan;
}

/* Two executors of one local group on device 0 with @p plan added. @return 0 or -1 */
static int group_setup(const struct mscx_plan *plan, struct mscx_exec **ex)
{
    uint32_t pid[2];
    if (mscx_exec_create_local_group(2, 0, ex) != MSCX_OK)
        return -1;
    if (mscx_exec_add_plan(ex[0], plan, MSG, &pid[0]) != MSCX_OK ||
        mscx_exec_add_plan(ex[1], plan, MSG, &pid[1]) != MSCX_OK) {
        mscx_exec_destroy(ex[0]);
        mscx_exec_destroy(ex[1]);
        return -1;
    }
    return 0;
}

/* ---- busy ---- */

static atomic_int g_release;

/* Holds its stream until released or BUSY_MS pass. */
static void CUDART_CB hold(void *arg)
{
    (void)arg;
    double t0 = now_ms();
    while (!atomic_load(&g_release) && now_ms() - t0 < BUSY_MS)
        usleep(1000);
}

static void test_busy(void)
{
    struct mscx_plan *plan = load_plan();
    struct mscx_exec *ex[2];
    if (!plan)
        return;
    CK(cudaSetDevice(0));
    if (group_setup(plan, ex) != 0) { /* the first setup loads the kernels: not timed */
        FAIL("setup (warm-up)");
        mscx_plan_destroy(plan);
        return;
    }
    mscx_exec_destroy(ex[0]);
    mscx_exec_destroy(ex[1]);
    cudaStream_t busy;
    CK(cudaStreamCreate(&busy)); /* blocking: the legacy default stream waits for it */
    CK(cudaLaunchHostFunc(busy, hold, NULL));
    usleep(50 * 1000);
    double t0 = now_ms();
    int rc = group_setup(plan, ex);
    double ms = now_ms() - t0;
    atomic_store(&g_release, 1);
    CK(cudaStreamSynchronize(busy));
    CK(cudaStreamDestroy(busy));
    if (rc != 0) {
        FAIL("busy: setup failed");
    } else {
        if (ms >= SETUP_LIMIT_MS)
            FAIL("busy: create and add_plan took %.0f ms while another stream was busy (limit %d ms): setup "
                 "waits for work that is not its own",
                 ms, SETUP_LIMIT_MS);
        else
            printf("busy: create and add_plan took %.0f ms while another stream was busy for up to %d ms\n",
                   ms, BUSY_MS);
        mscx_exec_destroy(ex[0]);
        mscx_exec_destroy(ex[1]);
    }
    mscx_plan_destroy(plan);
}

/* ---- device ---- */

static void expect_device(int want, const char *after)
{
    int d = -1;
    CK(cudaGetDevice(&d));
    if (d != want)
        FAIL("device: after %s the current device is %d, was %d", after, d, want);
    CK(cudaSetDevice(want));
}

static void test_device(int ndev)
{
    struct mscx_plan *plan = load_plan();
    if (!plan)
        return;
    int caller = ndev > 1 ? 1 : 0;
    struct mscx_exec *ex[2] = {NULL, NULL};
    uint32_t pid[2];
    CK(cudaSetDevice(caller));
    if (mscx_exec_create_local_group(2, 0, ex) != MSCX_OK) {
        FAIL("device: create");
        mscx_plan_destroy(plan);
        return;
    }
    expect_device(caller, "create");
    if (mscx_exec_add_plan(ex[0], plan, MSG, &pid[0]) != MSCX_OK)
        FAIL("device: add_plan rank 0");
    expect_device(caller, "add_plan of rank 0");
    if (mscx_exec_add_plan(ex[1], plan, MSG, &pid[1]) != MSCX_OK)
        FAIL("device: add_plan rank 1");
    expect_device(caller, "add_plan of rank 1 (finalises the group)");
    mscx_exec_destroy(ex[0]);
    expect_device(caller, "destroy of rank 0");
    mscx_exec_destroy(ex[1]);
    expect_device(caller, "destroy of rank 1");
    struct mscx_exec *bad = NULL;
    if (mscx_exec_create_local_group(1, ndev, &bad) == MSCX_OK) {
        FAIL("device: create on device %d of %d succeeded", ndev, ndev);
        mscx_exec_destroy(bad);
    }
    (void)cudaGetLastError();
    expect_device(caller, "a create that failed");
    printf(
        "device: device %d stayed current through create, add_plan, destroy and a failed create (%d GPUs)\n",
        caller, ndev);
    mscx_plan_destroy(plan);
}

/* ---- threads ---- */

struct tgroup {
    pthread_barrier_t bar;
    char all[2 * 65536];
    const struct mscx_plan *plan;
    int32_t *result[2];
    int status[2];
};

struct tctx {
    struct tgroup *g;
    uint32_t rank;
};

static mscx_status_t thread_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct tctx *t = ctx;
    if (bytes > sizeof(t->g->all) / 2)
        return MSCX_ERR_INVALID_ARG; /* the same on both ranks: both refuse before the barrier */
    memcpy(t->g->all + t->rank * bytes, mine, bytes);
    pthread_barrier_wait(&t->g->bar);
    memcpy(all, t->g->all, 2 * bytes);
    pthread_barrier_wait(&t->g->bar);
    return MSCX_OK;
}

static void *rank_main(void *arg)
{
    struct tctx *t = arg;
    struct tgroup *g = t->g;
    struct mscx_bootstrap bs = {.rank = t->rank, .nranks = 2, .ctx = t, .allgather = thread_allgather};
    struct mscx_exec *ex = NULL;
    uint32_t pid;
    size_t n = MSG / sizeof(int32_t);
    int32_t *h = malloc(MSG), *d = NULL;
    cudaStream_t s = NULL;
    g->status[t->rank] = -1;
    if (!h || cudaSetDevice((int)t->rank) != cudaSuccess || cudaMalloc((void **)&d, MSG) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        goto out;
    for (size_t i = 0; i < n; i++)
        h[i] = (int32_t)(i % 1000) * (int32_t)(t->rank + 1);
    if (cudaMemcpy(d, h, MSG, cudaMemcpyHostToDevice) != cudaSuccess)
        goto out;
    if (mscx_exec_create(&bs, (int)t->rank, &ex) != MSCX_OK ||
        mscx_exec_add_plan(ex, g->plan, MSG, &pid) != MSCX_OK)
        goto out;
    if (mscx_exec_launch(ex, pid, d, d, MSG, MSCX_DT_INT32, MSCX_REDOP_SUM, MSCX_PKT_LL16, s) != MSCX_OK ||
        cudaStreamSynchronize(s) != cudaSuccess || mscx_exec_async_error(ex) != MSCX_OK)
        goto out;
    if (cudaMemcpy(h, d, MSG, cudaMemcpyDeviceToHost) != cudaSuccess)
        goto out;
    g->result[t->rank] = h;
    h = NULL;
    g->status[t->rank] = 0;
out:
    if (ex)
        mscx_exec_destroy(ex);
    if (s)
        cudaStreamDestroy(s);
    if (d)
        cudaFree(d);
    free(h);
    return NULL;
}

static int test_threads(int ndev)
{
    if (ndev < 2) {
        printf("threads: one GPU: skipped\n");
        return 77;
    }
    struct mscx_plan *plan = load_plan();
    if (!plan)
        return 1;
    static struct tgroup g;
    memset(&g, 0, sizeof(g));
    g.plan = plan;
    pthread_barrier_init(&g.bar, NULL, 2);
    struct tctx t[2] = {{&g, 0}, {&g, 1}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, rank_main, &t[r]);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    size_t n = MSG / sizeof(int32_t), bad = 0;
    for (int r = 0; r < 2; r++) {
        if (g.status[r] != 0) {
            FAIL("threads: rank %d on GPU %d failed (see the log above)", r, r);
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (g.result[r][i] != (int32_t)(i % 1000) * 3)
                bad++;
        free(g.result[r]);
    }
    if (bad)
        FAIL("threads: %zu wrong elements", bad);
    else if (!failures)
        printf("threads: allreduce of 2 ranks on GPUs 0 and 1 in one process is right (%zu elements each)\n",
               n);
    pthread_barrier_destroy(&g.bar);
    mscx_plan_destroy(plan);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const char *mode = argc > 1 ? argv[1] : "busy";
    if (argc > 2)
        g_plan_path = argv[2];
    if (strcmp(mode, "busy") == 0)
        test_busy();
    else if (strcmp(mode, "device") == 0)
        test_device(ndev);
    else if (strcmp(mode, "threads") == 0)
        return test_threads(ndev);
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return failures ? 1 : 0;
}
