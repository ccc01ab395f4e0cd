/* SPDX-License-Identifier: MIT */
/*
 * Scaled sums on the GPU (mscx_exec_launch_scaled: ncclAvg and PreMulSum):
 * N ranks of a plan in this process on one GPU, bit for bit against the host
 * reference executor's scaled run (mscx_hostexec_run_scaled). Modes (argv[1]):
 *   plans  every shipped AllReduce and ReduceScatter plan of at most 8 ranks
 *          (or the plan files named): fp32, fp16 and bf16 at several sizes,
 *          the average's scalar, a host scalar and a device scalar that
 *          changes between launches, both packet formats, the call placed as
 *          the plan expects and the other way; an out-of-place call's send
 *          buffer must keep its bytes
 *   graph  one scaled launch per rank with a device scalar, captured in a
 *          CUDA graph and replayed with a new scalar written before each
 *          replay: every replay's result is the one of its scalar
 * Every case runs under MSCX_TIMEOUT_MS=5000. Exits 77 when no GPU is present.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/hostexec.h"
#include "mscx/scale.h"
#include "op_math.h"
#include "test_data.h"
#include "gpu_test.h"

#define ITERS 2
#define MAXR 8

static int g_cases, g_plans;

/* The scalars of a call: kind, and per launch the scalar's bits. */
enum scale_case { SC_AVG, SC_HOST, SC_DEVICE, SC_COUNT };
static const char *const k_case_names[SC_COUNT] = {"avg", "host scalar", "device scalar"};

/* A value of @p dt as bits (for the test's scalars; all exact in every type). */
static uint64_t dt_bits(enum mscx_dtype dt, float v)
{
    if (dt == MSCX_DT_FP16)
        return mscx_f32_to_f16(v);
    if (dt == MSCX_DT_BF16)
        return mscx_f32_to_bf16(v);
    return mscx_f32_bits(v);
}

static uint64_t case_scalar(enum scale_case sc, enum mscx_dtype dt, uint32_t n, int launch)
{
    static const float k_vals[] = {0.3f, -1.75f, 3.0f, 0.0625f};
    if (sc == SC_AVG)
        return mscx_scale_avg(dt, n).value_bits;
    return dt_bits(dt, k_vals[sc == SC_DEVICE ? launch % 4 : 0]);
}

/* ---- the host reference ---- */

struct ref {
    enum mscx_dtype dt;
    uint32_t n, iters;
    uint64_t in_b, out_b;
    uint64_t scalar[ITERS];
    uint32_t dev_scalar; /* MSCX_SCALE_DEVICE: each rank's fill of launch k writes scalar[k] */
    uint8_t **out;       /* [launch * n + rank] */
};

static void ref_fill(void *ctx, uint32_t rank, uint32_t it, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct ref *r = ctx;
    mscx_test_data_fill(out, out_bytes, r->dt, mscx_test_data_seed(rank, it, 1), MSCX_TEST_DATA_ANY);
    mscx_test_data_fill(in, in_bytes, r->dt, mscx_test_data_seed(rank, it, 0), MSCX_TEST_DATA_ANY);
    r->dev_scalar = (uint32_t)r->scalar[it];
}

static void ref_collect(void *ctx, uint32_t rank, uint32_t it, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct ref *r = ctx;
    (void)in;
    (void)in_bytes;
    memcpy(r->out[it * r->n + rank], out, out_bytes);
}

static int ref_run(const struct mscx_plan *plan, struct ref *r, enum scale_case sc, enum mscx_pkt_format pkt)
{
    char err[512];
    r->out = calloc((size_t)r->iters * r->n, sizeof(*r->out));
    for (uint32_t i = 0; i < r->iters * r->n; i++)
        r->out[i] = malloc(r->out_b + 1);
    struct mscx_hostexec_cfg cfg = {
        .in_bytes = r->in_b,
        .out_bytes = r->out_b,
        .dtype = r->dt,
        .op = MSCX_REDOP_SUM,
        .pkt = pkt,
        .iters = r->iters,
        .fill = ref_fill,
        .collect = ref_collect,
        .ctx = r,
    };
    struct mscx_scale s = {sc == SC_DEVICE ? MSCX_SCALE_DEVICE : MSCX_SCALE_HOST, r->scalar[0],
                           sc == SC_DEVICE ? &r->dev_scalar : NULL};
    if (mscx_hostexec_run_scaled(plan, &cfg, &s, err, sizeof(err)) != MSCX_OK) {
        FAIL("%s: host executor: %s", mscx_plan_name(plan), err);
        return -1;
    }
    return 0;
}

static void ref_free(struct ref *r)
{
    for (uint32_t i = 0; r->out && i < r->iters * r->n; i++)
        free(r->out[i]);
    free(r->out);
}

/* ---- the GPU side ---- */

struct group {
    uint32_t n;
    struct mscx_exec *ex[MAXR];
    cudaStream_t st[MAXR];
    uint32_t pid[MAXR];
    uint32_t *dscalar[MAXR]; /* each rank's device scalar */
};

static int group_make(struct group *g, const struct mscx_plan *plan, uint64_t max_msg)
{
    g->n = mscx_plan_nranks(plan);
    if (mscx_exec_create_local_group(g->n, 0, g->ex) != MSCX_OK)
        return -1;
    for (uint32_t r = 0; r < g->n; r++) {
        CK(cudaStreamCreateWithFlags(&g->st[r], cudaStreamNonBlocking));
        CK(cudaMalloc((void **)&g->dscalar[r], 4));
        if (mscx_exec_add_plan(g->ex[r], plan, max_msg, &g->pid[r]) != MSCX_OK)
            return -1;
    }
    return 0;
}

static void group_free(struct group *g)
{
    for (uint32_t r = 0; r < g->n; r++) {
        CK(cudaStreamSynchronize(g->st[r]));
        cudaStreamDestroy(g->st[r]);
        cudaFree(g->dscalar[r]);
        mscx_exec_destroy(g->ex[r]);
    }
}

/* One rank's buffers: the call in place (the collective's aliasing) when @p inplace, else two buffers. */
struct bufs {
    uint8_t *alloc, *in, *out;
};

static void bufs_make(enum mscx_coll coll, uint32_t rank, uint64_t in_b, uint64_t out_b, int inplace,
                      struct bufs *b)
{
    uint64_t need = in_b + out_b + 64;
    CK(cudaMalloc((void **)&b->alloc, need));
    CK(cudaMemset(b->alloc, 0, need));
    b->in = b->alloc;
    if (!inplace)
        b->out = b->alloc + ((in_b + 15) & ~15ull);
    else
        b->out = coll == MSCX_COLL_REDUCESCATTER ? b->in + rank * out_b : b->in;
}

static mscx_status_t launch_rank(struct group *g, uint32_t r, const struct bufs *b, uint64_t msg,
                                 enum mscx_dtype dt, enum scale_case sc, uint64_t bits,
                                 enum mscx_pkt_format pkt)
{
    struct mscx_scale s = {MSCX_SCALE_HOST, bits, NULL};
    if (sc == SC_DEVICE) {
        s.kind = MSCX_SCALE_DEVICE;
        s.dev_ptr = g->dscalar[r];
    }
    return mscx_exec_launch_scaled(g->ex[r], g->pid[r], b->in, b->out, msg, dt, MSCX_REDOP_SUM, &s, pkt,
                                   g->st[r]);
}

/* One case: @p ITERS launches of every rank, each compared with the host reference. @return 1 on a mismatch.
 */
static int run_case(const struct mscx_plan *plan, struct group *g, uint64_t msg, enum mscx_dtype dt,
                    enum scale_case sc, enum mscx_pkt_format pkt, int inplace)
{
    enum mscx_coll coll = mscx_plan_collective(plan);
    struct ref ref = {dt, g->n, ITERS, 0, 0, {0}, 0, NULL};
    mscx_coll_sizes(coll, g->n, msg, &ref.in_b, &ref.out_b);
    for (int it = 0; it < ITERS; it++)
        ref.scalar[it] = case_scalar(sc, dt, g->n, it);
    if (ref_run(plan, &ref, sc, pkt) != 0) {
        ref_free(&ref);
        return 1;
    }
    struct bufs b[MAXR];
    uint8_t *h = malloc(ref.in_b + ref.out_b + 2), *want = malloc(ref.in_b + 1);
    int bad = 0;
    for (uint32_t r = 0; r < g->n; r++)
        bufs_make(coll, r, ref.in_b, ref.out_b, inplace, &b[r]);
    for (int it = 0; it < ITERS && !bad; it++) {
        for (uint32_t r = 0; r < g->n; r++) {
            mscx_test_data_fill(h, ref.out_b, dt, mscx_test_data_seed(r, it, 1), MSCX_TEST_DATA_ANY);
            CK(cudaMemcpy(b[r].out, h, ref.out_b, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize());
            mscx_test_data_fill(h, ref.in_b, dt, mscx_test_data_seed(r, it, 0), MSCX_TEST_DATA_ANY);
            CK(cudaMemcpy(b[r].in, h, ref.in_b, cudaMemcpyHostToDevice));
            uint32_t s = (uint32_t)ref.scalar[it];
            CK(cudaMemcpy(g->dscalar[r], &s, 4, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize());
        }
        for (uint32_t r = 0; r < g->n; r++) {
            mscx_status_t st = launch_rank(g, r, &b[r], msg, dt, sc, ref.scalar[it], pkt);
            if (st != MSCX_OK) {
                FAIL("%s: launch rank %u: %s", mscx_plan_name(plan), r, mscx_status_str(st));
                bad = 1;
            }
        }
        CK(cudaDeviceSynchronize());
        for (uint32_t r = 0; r < g->n && !bad; r++) {
            mscx_status_t st = mscx_exec_async_error(g->ex[r]);
            if (st != MSCX_OK) {
                FAIL("%s: rank %u async error %s", mscx_plan_name(plan), r, mscx_status_str(st));
                bad = 1;
                break;
            }
            CK(cudaMemcpy(h, b[r].out, ref.out_b, cudaMemcpyDeviceToHost));
            uint64_t at = mscx_test_data_diff(h, ref.out[it * g->n + r], ref.out_b);
            const char *which = at < ref.out_b ? "output" : NULL;
            if (!which && !inplace) { /* the send buffer is never written */
                CK(cudaMemcpy(h, b[r].in, ref.in_b, cudaMemcpyDeviceToHost));
                mscx_test_data_fill(want, ref.in_b, dt, mscx_test_data_seed(r, it, 0), MSCX_TEST_DATA_ANY);
                if ((at = mscx_test_data_diff(h, want, ref.in_b)) < ref.in_b)
                    which = "send buffer";
            }
            if (which) {
                FAIL("%s: %llu B %s %s %s %s launch %d rank %u: %s differs at byte %llu",
                     mscx_plan_name(plan), (unsigned long long)msg, mscx_dtype_name(dt), k_case_names[sc],
                     pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", inplace ? "in place" : "out of place", it, r,
                     which, (unsigned long long)at);
                bad = 1;
            }
        }
    }
    for (uint32_t r = 0; r < g->n; r++)
        cudaFree(b[r].alloc);
    free(h);
    free(want);
    ref_free(&ref);
    g_cases++;
    return bad;
}

/* The sizes of @p plan to run: its smallest whole-element size, an uneven one, 64 KB and 1 MB + 24 in range.
 */
static size_t plan_sizes(const struct mscx_plan *plan, uint64_t *out)
{
    uint64_t per = mscx_plan_collective(plan) == MSCX_COLL_REDUCESCATTER ? mscx_plan_nranks(plan) : 1;
    uint64_t mn, mx, unit = 16 * per;
    mscx_plan_size_range(plan, &mn, &mx);
    uint64_t first = (mn + unit - 1) / unit * unit, cand[] = {first, first + 100 * per, 65536, 1048576 + 24};
    size_t n = 0;
    for (size_t i = 0; i < 4; i++)
        if (cand[i] >= mn && cand[i] <= mx && cand[i] % (4 * per) == 0 && (n == 0 || cand[i] > out[n - 1]))
            out[n++] = cand[i];
    return n;
}

static void test_plan(const char *path)
{
    struct mscx_plan *plan;
    char err[1024];
    if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
        FAIL("load %s: %s", path, err);
        return;
    }
    enum mscx_coll coll = mscx_plan_collective(plan);
    if ((coll != MSCX_COLL_ALLREDUCE && coll != MSCX_COLL_REDUCESCATTER) || mscx_plan_nranks(plan) > MAXR) {
        mscx_plan_destroy(plan);
        return;
    }
    static const enum mscx_dtype dts[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16};
    uint64_t sizes[4];
    size_t ns = plan_sizes(plan, sizes);
    struct group g;
    if (group_make(&g, plan, 1048576 + 64) != 0) {
        FAIL("%s: setup", path);
        mscx_plan_destroy(plan);
        return;
    }
    g_plans++;
    int bad = 0;
    for (size_t si = 0; si < ns && bad < 3; si++)
        for (size_t d = 0; d < 3 && bad < 3; d++)
            for (int sc = 0; sc < SC_COUNT && bad < 3; sc++) {
                if (!mscx_plan_supports(plan, dts[d], MSCX_REDOP_SUM))
                    continue;
                enum mscx_pkt_format pkt = (si + d + (size_t)sc) % 2 ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
                bad +=
                    run_case(plan, &g, sizes[si], dts[d], (enum scale_case)sc, pkt, mscx_plan_inplace(plan));
                bad +=
                    run_case(plan, &g, sizes[si], dts[d], (enum scale_case)sc, pkt, !mscx_plan_inplace(plan));
            }
    printf("%s %s\n", bad ? "FAIL" : "ok  ", path);
    fflush(stdout);
    group_free(&g);
    mscx_plan_destroy(plan);
}

static void test_dir(const char *dir)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        FAIL("cannot read %s", dir);
        return;
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(ents[i]->d_name);
        if (l > 5 && strcmp(ents[i]->d_name + l - 5, ".json") == 0) {
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", dir, ents[i]->d_name);
            test_plan(p);
        }
        free(ents[i]);
    }
    free(ents);
}

/*
 * The graph: per rank one scaled launch (device scalar, out of place)
 * captured once; before each replay every rank's scalar gets a new value.
 */
static void test_graph_plan(const char *path, enum mscx_dtype dt, uint64_t msg)
{
    struct mscx_plan *plan;
    char err[1024];
    if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
        FAIL("load %s: %s", path, err);
        return;
    }
    struct group g;
    if (group_make(&g, plan, msg) != 0) {
        FAIL("%s: setup", path);
        mscx_plan_destroy(plan);
        return;
    }
    enum mscx_coll coll = mscx_plan_collective(plan);
    uint64_t in_b, out_b;
    mscx_coll_sizes(coll, g.n, msg, &in_b, &out_b);
    struct bufs b[MAXR];
    uint8_t *h = malloc(in_b + out_b + 2);
    for (uint32_t r = 0; r < g.n; r++) {
        bufs_make(coll, r, in_b, out_b, 0, &b[r]);
        mscx_test_data_fill(h, in_b, dt, mscx_test_data_seed(r, 0, 0), MSCX_TEST_DATA_ANY);
        CK(cudaMemcpy(b[r].in, h, in_b, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
    }
    cudaStream_t s0 = g.st[0];
    cudaEvent_t fork, join[MAXR];
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(fork, s0));
    for (uint32_t r = 1; r < g.n; r++)
        CK(cudaStreamWaitEvent(g.st[r], fork, 0));
    for (uint32_t r = 0; r < g.n; r++)
        if (launch_rank(&g, r, &b[r], msg, dt, SC_DEVICE, 0, MSCX_PKT_LL16) != MSCX_OK)
            FAIL("%s: capture launch rank %u", path, r);
    for (uint32_t r = 1; r < g.n; r++) {
        CK(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
        CK(cudaEventRecord(join[r], g.st[r]));
        CK(cudaStreamWaitEvent(s0, join[r], 0));
    }
    CK(cudaStreamEndCapture(s0, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    static const float k_vals[] = {0.5f, -3.0f, 0.1f, 7.25f, 1.0f, -0.0078125f};
    int replays = 0;
    for (int k = 0; k < 60 && !failures; k++) {
        uint32_t s = (uint32_t)dt_bits(dt, k_vals[k % 6] * (float)(1 + k / 6));
        for (uint32_t r = 0; r < g.n; r++)
            CK(cudaMemcpy(g.dscalar[r], &s, 4, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        CK(cudaGraphLaunch(ge, s0));
        CK(cudaStreamSynchronize(s0));
        replays++;
        struct ref ref = {dt, g.n, 1, in_b, out_b, {s}, 0, NULL};
        if (ref_run(plan, &ref, SC_HOST, MSCX_PKT_LL16) != 0)
            break;
        for (uint32_t r = 0; r < g.n; r++) {
            CK(cudaMemcpy(h, b[r].out, out_b, cudaMemcpyDeviceToHost));
            uint64_t at = mscx_test_data_diff(h, ref.out[r], out_b);
            if (at < out_b)
                FAIL("%s graph %s: replay %d (scalar 0x%x) rank %u: output differs at byte %llu", path,
                     mscx_dtype_name(dt), k, s, r, (unsigned long long)at);
        }
        ref_free(&ref);
    }
    for (uint32_t r = 0; r < g.n; r++)
        if (mscx_exec_async_error(g.ex[r]) != MSCX_OK)
            FAIL("%s graph: rank %u async error", path, r);
    printf("graph %s %s: %d replays, each with its own device scalar, checked\n", path, mscx_dtype_name(dt),
           replays);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    for (uint32_t r = 0; r < g.n; r++)
        cudaFree(b[r].alloc);
    free(h);
    group_free(&g);
    mscx_plan_destroy(plan);
}

int main(int argc, char **argv)
{
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32",
           0); /* one hardware queue per rank's stream (test_gpu_exec.c) */
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    mscx_config_override("MSCX_TIMEOUT_MS", "5000");
    const char *mode = argc > 1 ? argv[1] : "plans";
    if (strcmp(mode, "plans") == 0) {
        if (argc > 2)
            for (int i = 2; i < argc; i++)
                test_plan(argv[i]);
        else
            test_dir(MSCX_SOURCE_ROOT "/plans");
        printf("scaled plans: %d plans, %d cases compared, %d failures\n", g_plans, g_cases, failures);
        if (argc <= 2 && g_plans < 20)
            FAIL("only %d shipped plans of 1 to 8 ranks ran", g_plans);
    } else if (strcmp(mode, "graph") == 0) {
        test_graph_plan(MSCX_SOURCE_ROOT "/plans/allreduce_n2_rpn2_oneshot_1K_16K.json", MSCX_DT_FP32, 4096);
        test_graph_plan(MSCX_SOURCE_ROOT "/plans/reducescatter_n4_rpn4_allpairs_1K_64K.json", MSCX_DT_BF16,
                        16384);
        test_graph_plan(MSCX_SOURCE_ROOT "/plans/allreduce_n1_rpn1_copy_1K_4M.json", MSCX_DT_FP16, 8192);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return failures ? 1 : 0;
}
