/* SPDX-License-Identifier: MIT */
/*
 * GPU executor tests: N ranks of a plan in this process on one GPU, compared
 * bit for bit with the host reference executor. Modes (argv[1]):
 *   plans   every plan of the MSCCL++ fixtures (tests/data/mscclpp),
 *           tests/data/regressions and plans/ (or of the files and folders
 *           named): at small sizes every dtype, operator and packet format,
 *           larger sizes sampled, 2 launches each; plans refused by design
 *           (load, or not executable) are listed and counted as refused
 *   stress  10,000 back-to-back launches, two plans and alternating sizes
 *   graph   one launch per rank captured in a CUDA graph, replayed 1,000 times
 *   hang    a plan whose peer never runs ends with MSCX_ERR_TIMEOUT
 *   wrap    launches across the 32-bit flag wrap over scratch full of stale
 *           lines that carry the post-wrap flag: results stay right
 * Every case runs under MSCX_TIMEOUT_MS=5000 (host and GPU executors).
 * Exits 77 when no GPU is present.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "mscx/exec.h"
#include "mscx/env.h"
#include "mscx/hostexec.h"
#include "plan_model.h"
#include "launch_abi.h"
#include "op_plan_skip.h"
#include "op_math.h"
#include "test_data.h"
#include "gpu_test.h"

#define ITERS 2
#define MAXR 64

/*
 * Device buffers of one rank laid out as the plan's placement says, or the
 * other one with @p flip (the executor then runs the call split or staged).
 */
struct rank_bufs {
    uint8_t *alloc, *in, *out;
    uint64_t alloc_bytes;
};

static void bufs_make(const struct mscx_plan *plan, uint32_t rank, uint64_t in_b, uint64_t out_b, int flip,
                      struct rank_bufs *b)
{
    uint64_t need = in_b + out_b + 64;
    CK(cudaMalloc((void **)&b->alloc, need));
    CK(cudaMemset(b->alloc, 0, need));
    b->alloc_bytes = need;
    if (!mscx_plan_inplace(plan) == !flip) { /* the call is out of place */
        b->in = b->alloc;
        b->out = b->alloc + ((in_b + 15) & ~15ull);
        return;
    }
    switch (mscx_plan_collective(plan)) {
    case MSCX_COLL_ALLGATHER:
        b->out = b->alloc;
        b->in = b->out + rank * in_b;
        break;
    case MSCX_COLL_REDUCESCATTER:
        b->in = b->alloc;
        b->out = b->in + rank * out_b;
        break;
    default:
        b->in = b->out = b->alloc;
        break;
    }
}

struct group {
    uint32_t n;
    struct mscx_exec *ex[MAXR];
    cudaStream_t st[MAXR];
};

static int group_make(struct group *g, uint32_t n)
{
    g->n = n;
    if (mscx_exec_create_local_group(n, 0, g->ex) != MSCX_OK)
        return -1;
    for (uint32_t r = 0; r < n; r++)
        CK(cudaStreamCreateWithFlags(&g->st[r], cudaStreamNonBlocking));
    return 0;
}

static void group_free(struct group *g)
{
    for (uint32_t r = 0; r < g->n; r++) {
        CK(cudaStreamSynchronize(g->st[r]));
        cudaStreamDestroy(g->st[r]);
        mscx_exec_destroy(g->ex[r]);
    }
}

/*
 * One (plan, size, dtype, op, pkt) case: host reference vs GPU, the call's
 * buffers placed as the plan expects or, with @p flip, the other way (an
 * in-place plan called out of place: the input must keep its bytes; an
 * out-of-place plan called in place: only the output is compared).
 * @return 0 ok, 1 mismatch, 2 skipped
 */
static int run_case(const struct mscx_plan *plan, struct group *g, const uint32_t *pid, uint64_t msg,
                    enum mscx_dtype dt, enum mscx_redop op, enum mscx_pkt_format pkt, int flip)
{
    uint32_t n = mscx_plan_nranks(plan);
    uint64_t in_b, out_b;
    char err[512];
    mscx_coll_sizes(mscx_plan_collective(plan), n, msg, &in_b, &out_b);
    struct mscx_geom geom;
    for (uint32_t r = 0; r < n; r++)
        if (mscx_plan_geom(plan, r, in_b, out_b, dt, &geom, err, sizeof(err)) != MSCX_OK)
            return 2;
    struct mscx_test_ref ref;
    struct mscx_hostexec_cfg cfg = {in_b, out_b, dt, op, pkt, ITERS, 0, 0, NULL, NULL, NULL};
    int res = 0;
    mscx_status_t st = mscx_test_ref_run(plan, &cfg, MSCX_TEST_DATA_ANY, &ref, err, sizeof(err));
    if (st != MSCX_OK) {
        fprintf(stderr, "skip %s %llu: host executor: %s\n", mscx_plan_name(plan), (unsigned long long)msg,
                err);
        return 2;
    }
    struct rank_bufs b[MAXR];
    for (uint32_t r = 0; r < n; r++)
        bufs_make(plan, r, in_b, out_b, flip, &b[r]);
    uint8_t *hin = malloc(in_b + 1), *hout = malloc(out_b + 1), *want_in = malloc(in_b + 1);
    for (int it = 0; it < ITERS && res == 0; it++) {
        for (uint32_t r = 0; r < n; r++) {
            mscx_test_data_fill(hout, out_b, dt, mscx_test_data_seed(r, it, 1), MSCX_TEST_DATA_ANY);
            mscx_test_data_fill(hin, in_b, dt, mscx_test_data_seed(r, it, 0), MSCX_TEST_DATA_ANY);
            CK(cudaMemcpy(b[r].out, hout, out_b, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
            CK(cudaMemcpy(b[r].in, hin, in_b, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
        }
        CK(cudaDeviceSynchronize());
        for (uint32_t r = 0; r < n; r++) {
            st = mscx_exec_launch(g->ex[r], pid[r], b[r].in, b[r].out, msg, dt, op, pkt, g->st[r]);
            if (st != MSCX_OK) {
                FAIL("%s: launch rank %u: %s", mscx_plan_name(plan), r, mscx_status_str(st));
                res = 1;
            }
        }
        CK(cudaDeviceSynchronize());
        for (uint32_t r = 0; r < n && res == 0; r++) {
            if ((st = mscx_exec_async_error(g->ex[r])) != MSCX_OK) {
                FAIL("%s: rank %u async error %s", mscx_plan_name(plan), r, mscx_status_str(st));
                res = 1;
                break;
            }
            CK(cudaMemcpy(hout, b[r].out, out_b, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hin, b[r].in, in_b, cudaMemcpyDeviceToHost));
            const char *which = NULL;
            uint64_t at = 0;
            const uint8_t *wo = mscx_test_ref_out(&ref, it, r), *wi = mscx_test_ref_in(&ref, it, r);
            if (flip && mscx_plan_inplace(plan)) { /* out of place: the send buffer as it was filled */
                mscx_test_data_fill(want_in, in_b, dt, mscx_test_data_seed(r, it, 0), MSCX_TEST_DATA_ANY);
                wi = want_in;
            }
            if ((at = mscx_test_data_diff(hout, wo, out_b)) < out_b)
                which = "output";
            else if (!(flip && !mscx_plan_inplace(plan)) && (at = mscx_test_data_diff(hin, wi, in_b)) < in_b)
                which = "input";
            if (which) {
                FAIL("%s: %llu B %s/%s/%s%s iter %d rank %u: %s differs at byte %llu", mscx_plan_name(plan),
                     (unsigned long long)msg, mscx_dtype_name(dt), mscx_redop_name(op),
                     pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", flip ? " (placement flipped)" : "", it, r, which,
                     (unsigned long long)at);
                if (in_b <= 64 && out_b <= 64) { /* small: show both executors' bytes */
                    const uint8_t *gb = which[0] == 'o' ? hout : hin;
                    const uint8_t *hb = which[0] == 'o' ? wo : wi;
                    uint64_t nb = which[0] == 'o' ? out_b : in_b;
                    fprintf(stderr, "  gpu :");
                    for (uint64_t q = 0; q < nb; q++)
                        fprintf(stderr, " %02x", gb[q]);
                    fprintf(stderr, "\n  host:");
                    for (uint64_t q = 0; q < nb; q++)
                        fprintf(stderr, " %02x", hb[q]);
                    fputc('\n', stderr);
                }
                res = 1;
            }
        }
    }
    free(hin);
    free(hout);
    free(want_in);
    for (uint32_t r = 0; r < n; r++)
        cudaFree(b[r].alloc);
    mscx_test_ref_fini(&ref);
    return res;
}

/*
 * Small sizes: every plan runs at those in its range with every dtype, every
 * operator and both packet formats. They end in partial element groups and
 * partial 16-byte units (100 and 1000 B are not multiples of 8 or 16, 99 B
 * fits only 1-byte dtypes). For AllGather and ReduceScatter they are the
 * size per rank, for AlltoAll the size per peer block. A plan whose
 * smallest size lies above them runs so at its first multiple of 16 (per
 * rank) and at 100 B (per rank) more. Sizes a
 * dtype cannot divide are no cases; sizes a plan's chunks cannot split are
 * counted as skipped.
 */
static const uint64_t k_full_sizes[] = {4, 12, 99, 100, 1000, 1024, 1024 + 100, 4096 + 12};
#define FULL_SIZES_TOP (4096 + 12)
/* Larger sizes: sampled, two (dtype, operator) pairs per size and format, rotating through k_combo. */
static const uint64_t k_sampled_sizes[] = {65536, 1048576 + 24};
static const struct {
    enum mscx_dtype dt;
    enum mscx_redop op;
} k_combo[] = {
    {MSCX_DT_FP32, MSCX_REDOP_SUM},  {MSCX_DT_FP16, MSCX_REDOP_SUM},   {MSCX_DT_BF16, MSCX_REDOP_PROD},
    {MSCX_DT_INT32, MSCX_REDOP_MIN}, {MSCX_DT_UINT32, MSCX_REDOP_MAX}, {MSCX_DT_FP16, MSCX_REDOP_MAX},
    {MSCX_DT_FP32, MSCX_REDOP_MIN},  {MSCX_DT_BF16, MSCX_REDOP_SUM},
};
#define NCOMBO (sizeof(k_combo) / sizeof(k_combo[0]))

static int g_cases, g_skipped, g_plans, g_flipped, g_refused;

/* Whether some op of the plan reduces: otherwise no executor reads the operator, and one stands for all. */
static int plan_reduces_any(const struct mscx_plan *plan)
{
    for (uint32_t r = 0; r < plan->nranks; r++)
        for (uint32_t i = 0; i < plan->gpus[r].nops; i++)
            if (mscx_opcode_reduces(plan->gpus[r].ops[i].opcode))
                return 1;
    return 0;
}

/* The sizes of @p plan run with every dtype, operator and format, into @p out (10 at most); @return n. */
static size_t full_sizes(const struct mscx_plan *plan, uint64_t *out)
{
    enum mscx_coll coll = mscx_plan_collective(plan);
    int sectioned =
        coll == MSCX_COLL_ALLGATHER || coll == MSCX_COLL_REDUCESCATTER || coll == MSCX_COLL_ALLTOALL;
    uint64_t per = sectioned ? mscx_plan_nranks(plan) : 1;
    uint64_t mn, mx;
    size_t n = 0;
    mscx_plan_size_range(plan, &mn, &mx);
    for (size_t i = 0; i < sizeof(k_full_sizes) / sizeof(k_full_sizes[0]); i++)
        if (k_full_sizes[i] * per >= mn && k_full_sizes[i] * per <= mx)
            out[n++] = k_full_sizes[i] * per;
    if (mn > FULL_SIZES_TOP * per) {
        uint64_t first = (mn + 16 * per - 1) / (16 * per) * (16 * per);
        for (uint64_t s = first; s <= first + 100 * per; s += 100 * per)
            if (s <= mx)
                out[n++] = s;
    }
    return n;
}

struct plan_run {
    const struct mscx_plan *plan;
    struct group *g;
    const uint32_t *pid;
    int bad;
};

/*
 * One case counted as compared, skipped or failed; the first compared case of
 * a size and format also runs with the placement flipped (split or staged by
 * the executor), except for op-test plans, whose buffers are not a
 * collective's. Sizes the dtype cannot divide are no case.
 */
static void plan_case(struct plan_run *pr, uint64_t msg, enum mscx_dtype dt, enum mscx_redop op,
                      enum mscx_pkt_format pkt, int *flip_left)
{
    if (!mscx_plan_supports(pr->plan, dt, op) || msg % mscx_dtype_size(dt))
        return;
    int r = run_case(pr->plan, pr->g, pr->pid, msg, dt, op, pkt, 0);
    if (r == 2)
        g_skipped++;
    else
        g_cases++;
    pr->bad += r == 1;
    if (*flip_left && r == 0 && mscx_plan_collective(pr->plan) != MSCX_COLL_TEST) {
        *flip_left = 0;
        r = run_case(pr->plan, pr->g, pr->pid, msg, dt, op, pkt, 1);
        g_flipped += r != 2;
        pr->bad += r == 1;
    }
}

/* Every dtype, every operator (one when the plan does not reduce) and both formats at @p msg. */
static void plan_size_full(struct plan_run *pr, uint64_t msg)
{
    int nop = plan_reduces_any(pr->plan) ? MSCX_REDOP_COUNT : 1;
    for (int pk = 0; pk < 2; pk++) {
        int flip_left = 1;
        for (int dt = 0; dt < MSCX_DT_COUNT; dt++)
            for (int op = 0; op < nop; op++)
                plan_case(pr, msg, (enum mscx_dtype)dt, (enum mscx_redop)op,
                          pk ? MSCX_PKT_LL8 : MSCX_PKT_LL16, &flip_left);
    }
}

/* Two (dtype, operator) pairs of k_combo per format at sampled size number @p si. */
static void plan_size_sampled(struct plan_run *pr, uint64_t msg, size_t si)
{
    for (int pk = 0; pk < 2; pk++) {
        int flip_left = 1;
        for (size_t k = 0; k < 2; k++) {
            size_t c = (si * 2 + k + (size_t)pk) % NCOMBO;
            plan_case(pr, msg, k_combo[c].dt, k_combo[c].op, pk ? MSCX_PKT_LL8 : MSCX_PKT_LL16, &flip_left);
        }
    }
}

/*
 * Load refusals that are the point of a fixture: plans whose result would
 * depend on the ranks' timing (the validator names the access), and the
 * DSL demonstrations whose signals and waits sit on different channel pairs.
 * Any other load error is a failure.
 */
static int refused_by_design(const char *path, const char *err)
{
    if (strstr(err, "is order-dependent") != NULL)
        return 1;
    return strstr(path, "signal_wait_fuse_test") != NULL && strstr(err, "as many waits on rank") != NULL;
}

static void test_plan(const char *path)
{
    struct mscx_plan *plan;
    char err[1024];
    if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
        if (refused_by_design(path, err)) {
            printf("refused %s: %s\n", path, err);
            g_refused++;
            return;
        }
        FAIL("load %s: %s", path, err);
        return;
    }
    if (mscx_plan_collective(plan) == MSCX_COLL_TEST && pkt_unproduced(plan)) {
        printf(
            "skip %s: reads packets no op sends (the host simulation seeds them; nothing does on the GPU)\n",
            path);
        mscx_plan_destroy(plan);
        return;
    }
    if (mscx_plan_collective(plan) == MSCX_COLL_TEST && raw_write_race(plan)) {
        printf(
            "skip %s: a rank reads a user-buffer chunk that a peer writes unordered (order-dependent result; "
            "the host executor's own result varies)\n",
            path);
        mscx_plan_destroy(plan);
        return;
    }
    if (mscx_plan_nranks(plan) > MAXR) {
        printf("skip %s: %u ranks, more than this test runs in one process\n", path, mscx_plan_nranks(plan));
        mscx_plan_destroy(plan);
        return;
    }
    if (mscx_plan_executable(plan, err, sizeof(err)) != MSCX_OK) {
        printf("refused %s: %s\n", path, err);
        g_refused++;
        mscx_plan_destroy(plan);
        return;
    }
    uint32_t n = mscx_plan_nranks(plan), pid[MAXR];
    uint64_t mn, mx, full[10];
    size_t nfull = full_sizes(plan, full);
    mscx_plan_size_range(plan, &mn, &mx);
    struct group g;
    if (group_make(&g, n) != 0) {
        FAIL("%s: group", path);
        goto out;
    }
    uint64_t maxmsg = 1048576 + 64;
    for (uint32_t r = 0; r < n; r++) {
        mscx_status_t st = mscx_exec_add_plan(g.ex[r], plan, maxmsg, &pid[r]);
        if (st != MSCX_OK) {
            FAIL("%s: add_plan rank %u: %s", path, r, mscx_status_str(st));
            group_free(&g);
            goto out;
        }
    }
    g_plans++;
    struct plan_run pr = {plan, &g, pid, 0};
    for (size_t i = 0; i < nfull && pr.bad < 3; i++)
        plan_size_full(&pr, full[i]);
    for (size_t si = 0; si < sizeof(k_sampled_sizes) / sizeof(k_sampled_sizes[0]) && pr.bad < 3; si++)
        if (k_sampled_sizes[si] >= mn && k_sampled_sizes[si] <= mx)
            plan_size_sampled(&pr, k_sampled_sizes[si], si);
    printf("%s %s\n", pr.bad ? "FAIL" : "ok  ", path);
    fflush(stdout);
    group_free(&g);
out:
    mscx_plan_destroy(plan);
}

static void test_dir(const char *dir)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        printf("skip dir %s\n", dir);
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        size_t l = strlen(nm);
        if (l > 5 && strcmp(nm + l - 5, ".json") == 0) {
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", dir, nm);
            test_plan(p);
        }
        free(ents[i]);
    }
    free(ents);
}

/* Stress, graph and hang use the 2-rank packet allreduce (in place; max is idempotent). */
static const char *g_ar2 = MSCX_SOURCE_ROOT "/tests/data/mscclpp/mscclpp-algo-plans/allreduce_pkt_n2.json";

static struct mscx_plan *load_ar2(void)
{
    struct mscx_plan *plan;
    char err[1024];
    if (mscx_plan_load(g_ar2, &plan, err, sizeof(err)) != MSCX_OK) {
        FAIL("load: %s", err);
        return NULL;
    }
    return plan;
}

/* Expected elementwise max of the ranks' fill patterns (iter 0) for int32. */
static void expect_max(uint32_t n, uint64_t bytes, int32_t *exp)
{
    int32_t *t = malloc(bytes);
    for (uint32_t r = 0; r < n; r++) {
        mscx_test_data_fill((uint8_t *)t, bytes, MSCX_DT_INT32, mscx_test_data_seed(r, 0, 0),
                            MSCX_TEST_DATA_ANY);
        for (uint64_t i = 0; i < bytes / 4; i++)
            exp[i] = r == 0 || t[i] > exp[i] ? t[i] : exp[i];
    }
    free(t);
}

static void test_stress(int graph)
{
    struct mscx_plan *plan = load_ar2();
    if (!plan)
        return;
    struct group g;
    uint32_t pid[2];
    const uint64_t big = 65536, small = 1024 + 16;
    if (group_make(&g, 2) != 0 || mscx_exec_add_plan(g.ex[0], plan, big, &pid[0]) != MSCX_OK ||
        mscx_exec_add_plan(g.ex[1], plan, big, &pid[1]) != MSCX_OK) {
        FAIL("setup");
        return;
    }
    uint8_t *buf[2];
    uint8_t *h = malloc(big);
    for (uint32_t r = 0; r < 2; r++) {
        CK(cudaMalloc((void **)&buf[r], big));
        mscx_test_data_fill(h, big, MSCX_DT_INT32, mscx_test_data_seed(r, 0, 0), MSCX_TEST_DATA_ANY);
        CK(cudaMemcpy(buf[r], h, big, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
    }
    int32_t *exp = malloc(big);
    expect_max(2, big, exp);
    int n_launch = 0;
    if (!graph) {
        for (int i = 0; i < 10000; i++) {
            uint64_t sz = (i % 3 == 0) ? small : big;
            enum mscx_pkt_format pk = (i / 2) % 2 ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
            for (uint32_t r = 0; r < 2; r++)
                if (mscx_exec_launch(g.ex[r], pid[r], buf[r], buf[r], sz, MSCX_DT_INT32, MSCX_REDOP_MAX, pk,
                                     g.st[r]) != MSCX_OK)
                    FAIL("launch %d", i);
            n_launch++;
        }
    } else {
        cudaStream_t s0 = g.st[0];
        cudaEvent_t fork, join;
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
        CK(cudaEventRecord(fork, s0));
        CK(cudaStreamWaitEvent(g.st[1], fork, 0));
        for (uint32_t r = 0; r < 2; r++)
            if (mscx_exec_launch(g.ex[r], pid[r], buf[r], buf[r], big, MSCX_DT_INT32, MSCX_REDOP_MAX,
                                 MSCX_PKT_LL16, g.st[r]) != MSCX_OK)
                FAIL("capture launch");
        CK(cudaEventRecord(join, g.st[1]));
        CK(cudaStreamWaitEvent(s0, join, 0));
        CK(cudaStreamEndCapture(s0, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        for (int i = 0; i < 1000; i++)
            CK(cudaGraphLaunch(ge, s0));
        n_launch = 1000;
        CK(cudaStreamSynchronize(s0));
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(gr);
    }
    CK(cudaDeviceSynchronize());
    for (uint32_t r = 0; r < 2; r++) {
        if (mscx_exec_async_error(g.ex[r]) != MSCX_OK)
            FAIL("rank %u async error", r);
        CK(cudaMemcpy(h, buf[r], big, cudaMemcpyDeviceToHost));
        if (memcmp(h, exp, big) != 0)
            FAIL("%s: rank %u result differs after %d launches", graph ? "graph" : "stress", r, n_launch);
    }
    printf("%s: %d launches per rank checked\n", graph ? "graph" : "stress", n_launch);
    group_free(&g);
    free(h);
    free(exp);
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    mscx_plan_destroy(plan);
}

/* Flags just below the wrap, scratch full of stale lines carrying the first flags after it. */
static void test_wrap(void)
{
    struct mscx_plan *plan = load_ar2();
    if (!plan)
        return;
    struct group g;
    uint32_t pid[2];
    const uint64_t bytes = 4096;
    if (group_make(&g, 2) != 0 || mscx_exec_add_plan(g.ex[0], plan, bytes, &pid[0]) != MSCX_OK ||
        mscx_exec_add_plan(g.ex[1], plan, bytes, &pid[1]) != MSCX_OK) {
        FAIL("setup");
        return;
    }
    if (!mscx_gpu_wrap_clear(0xfffffffeu) || !mscx_gpu_wrap_clear(0xffffffffu) || mscx_gpu_wrap_clear(1u) ||
        mscx_gpu_wrap_clear(0xfffffffdu) || mscx_flag_next(0xffffffffu) != 2u)
        FAIL("wrap: host-side wrap logic");
    uint8_t *buf[2];
    uint8_t *h = malloc(bytes);
    int32_t *exp = malloc(bytes);
    for (uint32_t r = 0; r < 2; r++)
        CK(cudaMalloc((void **)&buf[r], bytes));
    expect_max(2, bytes, exp);
    /*
     * Stale lines of all-W words (data W, flag W) with W a flag that the launches after the wrap use:
     * W = 2 (first post-wrap launch, the second scratch half), then W = 3 (the first half). Flags
     * fffffffc..ffffffff run at 1 KB (they rewrite only the first lines), then 2..5 at 4 KB: the lines
     * past 1 KB still hold flag W unless the wrap cleared them, and a matched stale line feeds W into
     * the int32 max, which changes every element below W (about half of them). Without the clear this
     * test fails.
     */
    for (uint32_t w = 2; w <= 3; w++) {
        for (uint32_t r = 0; r < 2; r++) {
            mscx_test_data_fill(h, bytes, MSCX_DT_INT32, mscx_test_data_seed(r, 0, 0), MSCX_TEST_DATA_ANY);
            CK(cudaMemcpy(buf[r], h, bytes, cudaMemcpyHostToDevice));
            CK(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
            if (mscx_gpu_debug_set_flag(g.ex[r], pid[r], 0xfffffffbu) != 0 ||
                mscx_gpu_debug_fill_scratch(g.ex[r], pid[r], w) != 0)
                FAIL("wrap: debug setup");
        }
        for (int i = 0; i < 8; i++)
            for (uint32_t r = 0; r < 2; r++)
                if (mscx_exec_launch(g.ex[r], pid[r], buf[r], buf[r], i < 4 ? 1024 : bytes, MSCX_DT_INT32,
                                     MSCX_REDOP_MAX, MSCX_PKT_LL16, g.st[r]) != MSCX_OK)
                    FAIL("wrap: launch %d", i);
        CK(cudaDeviceSynchronize());
        for (uint32_t r = 0; r < 2; r++) {
            if (mscx_exec_async_error(g.ex[r]) != MSCX_OK)
                FAIL("wrap: rank %u async error", r);
            CK(cudaMemcpy(h, buf[r], bytes, cudaMemcpyDeviceToHost));
            if (memcmp(h, exp, bytes) != 0)
                FAIL("wrap: rank %u result differs after the flag wrap (stale lines of word %u)", r, w);
        }
    }
    printf("wrap: 2 x 8 launches across the flag wrap over stale lines of post-wrap flags 2 and 3 checked\n");
    group_free(&g);
    free(h);
    free(exp);
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    mscx_plan_destroy(plan);
}

static void test_hang(void)
{
    struct mscx_plan *plan = load_ar2();
    if (!plan)
        return;
    mscx_config_override("MSCX_TIMEOUT_MS", "300");
    struct group g;
    uint32_t pid[2];
    if (group_make(&g, 2) != 0 || mscx_exec_add_plan(g.ex[0], plan, 4096, &pid[0]) != MSCX_OK ||
        mscx_exec_add_plan(g.ex[1], plan, 4096, &pid[1]) != MSCX_OK) {
        FAIL("setup");
        return;
    }
    void *buf;
    CK(cudaMalloc(&buf, 4096));
    if (mscx_exec_launch(g.ex[0], pid[0], buf, buf, 4096, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16,
                         g.st[0]) != MSCX_OK)
        FAIL("launch");
    CK(cudaStreamSynchronize(g.st[0])); /* must return: rank 1 never runs */
    mscx_status_t st = mscx_exec_async_error(g.ex[0]);
    if (st != MSCX_ERR_TIMEOUT)
        FAIL("hang: expected timeout, got %s", mscx_status_str(st));
    else
        printf("hang: rank 0 ended with %s\n", mscx_status_str(st));
    cudaFree(buf);
    group_free(&g);
    mscx_plan_destroy(plan);
    mscx_config_reset();
}

int main(int argc, char **argv)
{
    /*
     * Up to 16 ranks share the GPU, one stream each. With the default 8
     * hardware queues, streams r and r + 8 share one: a staging copy queued
     * after rank r's kernel (an in-place call on an out-of-place
     * ReduceScatter plan) then holds rank r + 8's kernel back until rank r's
     * finishes, which waits for rank r + 8: a hang the timeout ends. One
     * queue per stream (set before CUDA starts; the caller's value wins).
     */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const char *mode = argc > 1 ? argv[1] : "plans";
    if (argc > 2 && strcmp(mode, "plans") != 0)
        g_ar2 = argv[2]; /* the 2-rank packet allreduce plan, where the reference tree is elsewhere */
    if (strcmp(mode, "plans") == 0) {
        mscx_config_override("MSCX_TIMEOUT_MS", "5000"); /* per-case limit, host and GPU */
        if (argc > 2) {
            for (int i = 2; i < argc; i++) {
                size_t l = strlen(argv[i]);
                if (l > 5 && strcmp(argv[i] + l - 5, ".json") == 0)
                    test_plan(argv[i]);
                else
                    test_dir(argv[i]);
            }
        } else {
            const char *ref = MSCX_SOURCE_ROOT "/tests/data/mscclpp";
            char d[4096];
            snprintf(d, sizeof(d), "%s/mscclpp-op-plans", ref);
            test_dir(d);
            snprintf(d, sizeof(d), "%s/mscclpp-algo-plans", ref);
            test_dir(d);
            test_dir(MSCX_SOURCE_ROOT "/tests/data/regressions");
            test_dir(MSCX_SOURCE_ROOT "/plans");
        }
        printf("plans: %d plans, %d cases compared (%d more with the placement flipped), %d plans refused, "
               "%d skipped, %d failures\n",
               g_plans, g_cases, g_flipped, g_refused, g_skipped, failures);
    } else if (strcmp(mode, "stress") == 0) {
        test_stress(0);
    } else if (strcmp(mode, "graph") == 0) {
        test_stress(1);
    } else if (strcmp(mode, "wrap") == 0) {
        test_wrap();
    } else if (strcmp(mode, "hang") == 0) {
        test_hang();
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return failures ? 1 : 0;
}
