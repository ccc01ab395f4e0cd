/* SPDX-License-Identifier: MIT */
/*
 * The executor backend (--executor N): N ranks on one GPU through the mscx
 * executor directly, no NCCL; with --baseline, the hand-written kernel of
 * the same algorithm (tools/bench/ref/) instead. Every rank has its own stream;
 * one timed iteration forks from stream 0 to every rank's stream, launches
 * every rank and joins back. Under -G the iterations are captured that way
 * in one graph.
 *
 * Plans: --plan FILE runs at every size; otherwise each size runs the plan of
 * MSCX_PLAN_DIR for the collective and rank count (one node) whose size range
 * holds it, as the shim picks. The baseline runs the algorithm of that plan
 * with its block and thread counts. A size, type or reduction that the plan
 * or the kernel cannot run is reported n/a.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/plan.h"
#include "perf.h"
#include "ref.h"

#define EXEC_MAX_PLANS 32
#define EXEC_MAX_NOTES 16

struct exec_plan {
    struct mscx_plan *plan;
    uint32_t *ids;           /* [n]: the plan's id in each rank's executor */
    uint64_t lo, hi;         /* message sizes it takes */
    enum mscx_ref_algo algo; /* the baseline's kernel for it */
    uint32_t blocks, threads;
};

struct exec_ctx {
    uint32_t n;
    int baseline, fixed; /* fixed: --plan, one plan at every size */
    size_t nplans;
    struct exec_plan plans[EXEC_MAX_PLANS];
    struct mscx_exec **ex; /* executor mode */
    char **scratch;        /* baseline mode: [n] scratch, [n] state */
    uint32_t **state;
    uint64_t scratch_bytes, timeout_ns;
    int pdl; /* MSCX_PDL: the baseline kernel launches as the executor does */
    cudaStream_t *streams;
    cudaEvent_t *joins, ev_start, ev_stop;
    char **send, **recv, *hsend, *hout;
    uint64_t cap;
    const char *notes[EXEC_MAX_NOTES]; /* n/a reasons already printed */
    size_t nnotes;
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
    MSCX_DT_INT8,   MSCX_DT_UINT8, MSCX_DT_INT32, MSCX_DT_UINT32, MSCX_DT_INT64,
    MSCX_DT_UINT64, MSCX_DT_FP16,  MSCX_DT_FP32,  MSCX_DT_FP64,   MSCX_DT_BF16,
};
/* perf_op is numbered as ncclRedOp_t (sum prod max min avg); the executor has no avg. */
static const int redop_map[PERF_OP_COUNT] = {MSCX_REDOP_SUM, MSCX_REDOP_PROD, MSCX_REDOP_MAX, MSCX_REDOP_MIN,
                                             -1};
static const enum mscx_coll coll_map[PERF_COLL_COUNT] = {MSCX_COLL_ALLREDUCE, MSCX_COLL_ALLGATHER,
                                                         MSCX_COLL_REDUCESCATTER, MSCX_COLL_ALLTOALL};

/* The message size as MSCCL++ plans define it: the output size for allgather, the input size otherwise. */
static uint64_t msg_bytes(const struct perf_call *call)
{
    return (call->coll == PERF_ALLGATHER ? call->recv_count : call->send_count) *
           mscx_perf_type_size(call->type);
}

/* Print why a call is n/a, once per reason. */
static int not_available(struct exec_ctx *c, const struct perf_call *call, const char *why)
{
    for (size_t i = 0; i < c->nnotes; i++)
        if (c->notes[i] == why)
            return PERF_NA;
    if (c->nnotes < EXEC_MAX_NOTES)
        c->notes[c->nnotes++] = why;
    fprintf(stderr, "mscx-perf: %s: n/a from %llu bytes of %s %s: %s\n",
            c->baseline ? "baseline" : "executor", (unsigned long long)msg_bytes(call),
            mscx_perf_type_name(call->type), mscx_perf_op_name(call->op), why);
    return PERF_NA;
}

/* The plan for a call, or PERF_NA. */
static int pick(struct exec_ctx *c, const struct perf_call *call, const struct exec_plan **ep_p)
{
    uint64_t msg = msg_bytes(call);
    const struct exec_plan *ep = NULL;
    const char *why = NULL;
    int op = redop_map[call->op];
    if (c->fixed) {
        ep = &c->plans[0];
    } else {
        for (size_t i = 0; i < c->nplans && ep == NULL; i++)
            if (msg >= c->plans[i].lo && msg <= c->plans[i].hi)
                ep = &c->plans[i];
        if (ep == NULL)
            return not_available(c, call, "no plan of MSCX_PLAN_DIR takes this size");
    }
    if (op < 0)
        return not_available(c, call, "the executor has no avg reduction");
    if (!mscx_plan_supports(ep->plan, dtype_map[call->type], (enum mscx_redop)op))
        return not_available(c, call, "the plan does not take this data type and reduction");
    if (c->baseline &&
        !mscx_ref_supports(ep->algo, dtype_map[call->type], (enum mscx_redop)op, c->n, msg, &why))
        return not_available(c, call, why);
    *ep_p = ep;
    return 0;
}

static void rank_ptrs(const struct exec_ctx *c, const struct perf_call *call, uint32_t r, char **s_p,
                      char **d_p)
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

static int launch_rank(struct exec_ctx *c, const struct exec_plan *ep, const struct perf_call *call,
                       uint32_t r)
{
    uint64_t msg = msg_bytes(call);
    char *s, *d, err[256];
    rank_ptrs(c, call, r, &s, &d);
    if (c->baseline) {
        struct mscx_ref_launch l;
        memset(&l, 0, sizeof(l));
        l.algo = ep->algo;
        l.dtype = dtype_map[call->type];
        l.send = s;
        l.recv = d;
        for (uint32_t p = 0; p < c->n; p++)
            l.scratch[p] = c->scratch[p];
        l.scratch_bytes = c->scratch_bytes;
        l.state = c->state[r];
        l.rank = r;
        l.nranks = c->n;
        l.bytes = msg;
        l.blocks = ep->blocks;
        l.threads = ep->threads;
        l.timeout_ns = c->timeout_ns;
        l.pdl = (uint32_t)c->pdl;
        if (mscx_ref_launch(&l, c->streams[r], err, sizeof(err))) {
            fprintf(stderr, "mscx-perf: rank %u: %s\n", r, err);
            return -1;
        }
        return 0;
    }
    mscx_status_t st = mscx_exec_launch(c->ex[r], ep->ids[r], s, d, msg, dtype_map[call->type],
                                        (enum mscx_redop)redop_map[call->op], MSCX_PKT_LL16, c->streams[r]);
    if (st != MSCX_OK) {
        fprintf(stderr, "mscx-perf: rank %u: launch of plan %s, %llu bytes failed: %s\n", r,
                mscx_plan_name(ep->plan), (unsigned long long)msg, mscx_status_str(st));
        return -1;
    }
    return 0;
}

/* One collective: fork from stream 0 to every rank's stream, launch, join back. */
static int launch_all(struct exec_ctx *c, const struct exec_plan *ep, const struct perf_call *call)
{
    CUDA_TRY(cudaEventRecord(c->joins[0], c->streams[0]));
    for (uint32_t r = 1; r < c->n; r++)
        CUDA_TRY(cudaStreamWaitEvent(c->streams[r], c->joins[0], 0));
    for (uint32_t r = 0; r < c->n; r++)
        if (launch_rank(c, ep, call, r))
            return -1;
    for (uint32_t r = 1; r < c->n; r++) {
        CUDA_TRY(cudaEventRecord(c->joins[r], c->streams[r]));
        CUDA_TRY(cudaStreamWaitEvent(c->streams[0], c->joins[r], 0));
    }
    return 0;
}

/* After the streams are synchronised: did a kernel of any rank time out or abort? */
static int async_errors(struct exec_ctx *c)
{
    for (uint32_t r = 0; r < c->n; r++) {
        if (c->baseline) {
            uint32_t e = 0;
            CUDA_TRY(cudaMemcpy(&e, c->state[r] + MSCX_REF_MAX_BLOCKS, sizeof(e), cudaMemcpyDeviceToHost));
            if (e) {
                fprintf(stderr,
                        "mscx-perf: rank %u: a baseline kernel waited longer than MSCX_TIMEOUT_MS for a "
                        "peer's packets\n",
                        r);
                return -1;
            }
        } else {
            mscx_status_t st = mscx_exec_async_error(c->ex[r]);
            if (st != MSCX_OK) {
                fprintf(stderr, "mscx-perf: rank %u: executor kernel failed: %s\n", r, mscx_status_str(st));
                return -1;
            }
        }
    }
    return 0;
}

/* -G: capture @p iters collectives of every rank in one graph, launch it @p graph_iters times. */
static int run_graph(struct exec_ctx *c, const struct exec_plan *ep, const struct perf_call *call, int iters,
                     int graph_iters)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e;
    int failed = 0, rc = -1;
    CUDA_TRY(cudaStreamBeginCapture(c->streams[0], cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters && !failed; i++)
        failed = launch_all(c, ep, call);
    e = cudaStreamEndCapture(c->streams[0], &graph); /* always: leaves the streams out of capture */
    if (failed)
        goto out;
    if (e != cudaSuccess) {
        fprintf(stderr, "mscx-perf: capturing %d iterations of %u ranks: %s\n", iters, c->n,
                cudaGetErrorString(e));
        goto out;
    }
    if ((e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess ||
        (e = cudaGraphUpload(exec, c->streams[0])) != cudaSuccess ||
        (e = cudaEventRecord(c->ev_start, c->streams[0])) != cudaSuccess) {
        fprintf(stderr, "mscx-perf: graph of %d iterations of %u ranks: %s\n", iters, c->n,
                cudaGetErrorString(e));
        goto out;
    }
    for (int g = 0; g < graph_iters; g++) {
        if ((e = cudaGraphLaunch(exec, c->streams[0])) != cudaSuccess) {
            fprintf(stderr, "mscx-perf: cudaGraphLaunch: %s\n", cudaGetErrorString(e));
            goto out;
        }
    }
    if ((e = cudaEventRecord(c->ev_stop, c->streams[0])) != cudaSuccess) {
        fprintf(stderr, "mscx-perf: cudaEventRecord: %s\n", cudaGetErrorString(e));
        goto out;
    }
    rc = 0;
out:
    if (rc == 0 && (e = cudaStreamSynchronize(c->streams[0])) != cudaSuccess) {
        fprintf(stderr, "mscx-perf: graph run: %s\n", cudaGetErrorString(e));
        rc = -1;
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    return rc;
}

static int exec_run(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p)
{
    struct exec_ctx *c = ctx;
    const struct exec_plan *ep;
    float ms = 0;
    int rc = pick(c, call, &ep);
    if (rc)
        return rc;
    if (graph_iters > 0) {
        if (run_graph(c, ep, call, iters, graph_iters))
            return -1;
    } else {
        CUDA_TRY(cudaEventRecord(c->ev_start, c->streams[0]));
        for (int i = 0; i < iters; i++)
            if (launch_all(c, ep, call))
                return -1;
        CUDA_TRY(cudaEventRecord(c->ev_stop, c->streams[0]));
        CUDA_TRY(cudaStreamSynchronize(c->streams[0]));
    }
    CUDA_TRY(cudaEventElapsedTime(&ms, c->ev_start, c->ev_stop));
    if (async_errors(c))
        return -1;
    *us_p = (double)ms * 1000.0 / ((double)iters * (graph_iters > 0 ? graph_iters : 1));
    return 0;
}

static int exec_check(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p)
{
    struct exec_ctx *c = ctx;
    const struct exec_plan *ep;
    size_t es = mscx_perf_type_size(call->type);
    int64_t wrong = 0;
    int rc = pick(c, call, &ep);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < c->n; r++) {
        char *s, *d;
        rank_ptrs(c, call, r, &s, &d);
        mscx_perf_fill(call->coll, call->type, call->op, (int)r, (int)c->n, seed, c->hsend, call->send_count);
        CUDA_TRY(cudaMemset(c->recv[r], 0xff, c->cap));
        CUDA_TRY(cudaMemcpy(s, c->hsend, call->send_count * es, cudaMemcpyHostToDevice));
        CUDA_TRY(cudaDeviceSynchronize()); /* pageable H2D may return before the DMA lands */
    }
    if (launch_all(c, ep, call))
        return -1;
    CUDA_TRY(cudaStreamSynchronize(c->streams[0]));
    if (async_errors(c))
        return -1;
    for (uint32_t r = 0; r < c->n; r++) {
        char *s, *d;
        rank_ptrs(c, call, r, &s, &d);
        CUDA_TRY(cudaMemcpy(c->hout, d, call->recv_count * es, cudaMemcpyDeviceToHost));
        wrong += mscx_perf_check(call->coll, call->type, call->op, (int)r, (int)c->n, seed, c->hout,
                                 call->recv_count);
    }
    *wrong_p = wrong;
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_plan(struct exec_ctx *c, struct mscx_plan *plan)
{
    struct exec_plan *ep;
    if (c->nplans == EXEC_MAX_PLANS) {
        fprintf(stderr, "mscx-perf: more than %d plans for %u ranks; ignoring %s\n", EXEC_MAX_PLANS, c->n,
                mscx_plan_origin(plan));
        mscx_plan_destroy(plan);
        return 0;
    }
    ep = &c->plans[c->nplans++];
    ep->plan = plan;
    mscx_plan_size_range(plan, &ep->lo, &ep->hi);
    ep->algo = mscx_ref_algo_of_plan(mscx_plan_name(plan));
    ep->blocks = mscx_plan_threadblocks(plan, 0);
    ep->threads = mscx_plan_threads_per_block(plan) ? mscx_plan_threads_per_block(plan) : 1024;
    ep->ids = calloc(c->n, sizeof(*ep->ids));
    return ep->ids ? 0 : -1;
}

/* Does the plan fit this run: collective, rank count, one node, executable, a size of the sweep? */
static int plan_fits(const struct exec_ctx *c, const struct perf_opts *o, const struct mscx_plan *p)
{
    char err[256];
    uint64_t lo, hi;
    mscx_plan_size_range(p, &lo, &hi);
    return mscx_plan_collective(p) == coll_map[o->coll] && mscx_plan_nranks(p) == c->n &&
           mscx_plan_ranks_per_node(p) == c->n && mscx_plan_executable(p, err, sizeof(err)) == MSCX_OK &&
           lo <= o->max_bytes && hi >= o->min_bytes;
}

/* --plan, else every plan of MSCX_PLAN_DIR that fits, in name order. */
static int load_plans(struct exec_ctx *c, const struct perf_opts *o)
{
    char err[MSCX_PLAN_ERR_LEN], path[1024], **names = NULL;
    const struct mscx_config *cfg = NULL;
    size_t nnames = 0;
    struct dirent *e;
    struct mscx_plan *p;
    DIR *d;
    int rc = -1;
    if (o->plan_path) {
        if (mscx_plan_load(o->plan_path, &p, err, sizeof(err)) != MSCX_OK) {
            fprintf(stderr, "mscx-perf: %s\n", err);
            return -1;
        }
        c->fixed = 1;
        if (add_plan(c, p))
            return -1;
        if (mscx_plan_collective(p) != coll_map[o->coll] || mscx_plan_nranks(p) != c->n) {
            fprintf(stderr, "mscx-perf: plan %s is a %u-rank %s, not a %u-rank %s\n", mscx_plan_name(p),
                    mscx_plan_nranks(p), mscx_coll_name(mscx_plan_collective(p)), c->n,
                    mscx_perf_coll_name(o->coll));
            return -1;
        }
        if (c->baseline && c->plans[0].algo == MSCX_REF_NONE) {
            fprintf(stderr,
                    "mscx-perf: --baseline: no hand-written kernel for plan %s (there are kernels for "
                    "oneshot and twophase/allreduce_pkt allreduce plans)\n",
                    mscx_plan_name(p));
            return -1;
        }
        return 0;
    }
    if (mscx_config_get(&cfg) != MSCX_OK || cfg->plan_dir == NULL || cfg->plan_dir[0] == '\0' ||
        (d = opendir(cfg->plan_dir)) == NULL) {
        fprintf(stderr, "mscx-perf: --executor needs --plan FILE or MSCX_PLAN_DIR (a readable directory)\n");
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        char **more;
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0 || e->d_name[0] == '.')
            continue;
        if ((more = realloc(names, (nnames + 1) * sizeof(*names))) == NULL ||
            (more[nnames] = strdup(e->d_name)) == NULL) {
            names = more ? more : names;
            closedir(d);
            goto out;
        }
        names = more;
        nnames++;
    }
    closedir(d);
    qsort(names, nnames, sizeof(*names), cmp_names);
    for (size_t i = 0; i < nnames; i++) {
        snprintf(path, sizeof(path), "%s/%s", cfg->plan_dir, names[i]);
        if (mscx_plan_load(path, &p, err, sizeof(err)) != MSCX_OK)
            continue; /* mscx-plan check reports bad plans; the shim skips them too */
        if (!plan_fits(c, o, p)) {
            mscx_plan_destroy(p);
            continue;
        }
        if (add_plan(c, p))
            goto out;
    }
    if (c->nplans == 0) {
        fprintf(stderr, "mscx-perf: no %u-rank one-node %s plan for %llu..%llu bytes in %s\n", c->n,
                mscx_perf_coll_name(o->coll), (unsigned long long)o->min_bytes,
                (unsigned long long)o->max_bytes, cfg->plan_dir);
        goto out;
    }
    rc = 0;
out:
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* The largest message a plan gets in this run. */
static uint64_t plan_cap(const struct exec_ctx *c, const struct exec_plan *ep)
{
    return c->fixed || ep->hi > c->cap ? c->cap : ep->hi;
}

static int setup_baseline(struct exec_ctx *c)
{
    const struct mscx_config *cfg;
    c->scratch = calloc(c->n, sizeof(*c->scratch));
    c->state = calloc(c->n, sizeof(*c->state));
    if (!c->scratch || !c->state) {
        fprintf(stderr, "mscx-perf: out of memory\n");
        return -1;
    }
    if (c->n > MSCX_REF_MAX_RANKS) {
        fprintf(stderr, "mscx-perf: --baseline runs at most %d ranks, not %u\n", MSCX_REF_MAX_RANKS, c->n);
        return -1;
    }
    for (size_t i = 0; i < c->nplans; i++) {
        uint64_t need = mscx_ref_scratch_bytes(c->plans[i].algo, c->n, plan_cap(c, &c->plans[i]));
        if (need > c->scratch_bytes)
            c->scratch_bytes = need;
    }
    if (c->scratch_bytes == 0)
        c->scratch_bytes = 16;
    c->timeout_ns = mscx_config_get(&cfg) == MSCX_OK ? cfg->timeout_ms * 1000000ull : 0;
    c->pdl = mscx_config_get(&cfg) == MSCX_OK && cfg->pdl;
    for (uint32_t r = 0; r < c->n; r++) {
        CUDA_TRY(cudaMalloc((void **)&c->scratch[r], c->scratch_bytes));
        CUDA_TRY(cudaMemset(c->scratch[r], 0, c->scratch_bytes));
        CUDA_TRY(cudaMalloc((void **)&c->state[r], MSCX_REF_STATE_BYTES));
        CUDA_TRY(cudaMemset(c->state[r], 0, MSCX_REF_STATE_BYTES));
    }
    return 0;
}

static int setup_executor(struct exec_ctx *c, int dev)
{
    mscx_status_t st;
    c->ex = calloc(c->n, sizeof(*c->ex));
    if (!c->ex) {
        fprintf(stderr, "mscx-perf: out of memory\n");
        return -1;
    }
    if ((st = mscx_exec_create_local_group(c->n, dev, c->ex)) != MSCX_OK) {
        fprintf(stderr, "mscx-perf: cannot create %u executors on device %d: %s\n", c->n, dev,
                mscx_status_str(st));
        memset(c->ex, 0, c->n * sizeof(*c->ex));
        return -1;
    }
    for (size_t i = 0; i < c->nplans; i++) {
        struct exec_plan *ep = &c->plans[i];
        for (uint32_t r = 0; r < c->n; r++) {
            if ((st = mscx_exec_add_plan(c->ex[r], ep->plan, plan_cap(c, ep), &ep->ids[r])) != MSCX_OK) {
                fprintf(stderr, "mscx-perf: rank %u: plan %s: %s\n", r, mscx_plan_name(ep->plan),
                        mscx_status_str(st));
                return -1;
            }
        }
    }
    return 0;
}

static void describe(const struct exec_ctx *c, FILE *out, int dev)
{
    fprintf(out, "# Using device %d: %u ranks through %s\n", dev, c->n,
            c->baseline ? "the hand-written baseline kernels (tools/bench/ref)" : "the mscx executor");
    for (size_t i = 0; i < c->nplans; i++) {
        const struct exec_plan *ep = &c->plans[i];
        if (c->fixed)
            fprintf(out, "#   every size: ");
        else
            fprintf(out, "#   %llu..%llu bytes: ", (unsigned long long)ep->lo, (unsigned long long)ep->hi);
        if (c->baseline)
            fprintf(out, "%s kernel, %u blocks of %u threads per rank, as plan %s\n",
                    mscx_ref_algo_name(ep->algo), ep->blocks, ep->threads, mscx_plan_name(ep->plan));
        else
            fprintf(out, "plan %s (%s)\n", mscx_plan_name(ep->plan), mscx_plan_origin(ep->plan));
    }
}

static int exec_setup(struct exec_ctx *c, const struct perf_opts *o, FILE *out)
{
    int dev = o->device >= 0 ? o->device : 0;
    if (load_plans(c, o))
        return -1;
    CUDA_TRY(cudaSetDevice(dev));
    c->cap = o->max_bytes ? o->max_bytes : 1;
    c->streams = calloc(c->n, sizeof(*c->streams));
    c->joins = calloc(c->n, sizeof(*c->joins));
    c->send = calloc(c->n, sizeof(*c->send));
    c->recv = calloc(c->n, sizeof(*c->recv));
    if (!c->streams || !c->joins || !c->send || !c->recv) {
        fprintf(stderr, "mscx-perf: out of memory\n");
        return -1;
    }
    if (c->baseline ? setup_baseline(c) : setup_executor(c, dev))
        return -1;
    for (uint32_t r = 0; r < c->n; r++) {
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
        describe(c, out, dev);
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
        if (c->scratch)
            cudaFree(c->scratch[r]);
        if (c->state)
            cudaFree(c->state[r]);
    }
    if (c->ev_start)
        cudaEventDestroy(c->ev_start);
    if (c->ev_stop)
        cudaEventDestroy(c->ev_stop);
    cudaFreeHost(c->hsend);
    cudaFreeHost(c->hout);
    free(c->ex);
    free(c->scratch);
    free(c->state);
    free(c->streams);
    free(c->joins);
    free(c->send);
    free(c->recv);
    for (size_t i = 0; i < c->nplans; i++) {
        mscx_plan_destroy(c->plans[i].plan);
        free(c->plans[i].ids);
    }
    free(c);
    be->ctx = NULL;
}

int mscx_perf_exec_open(const struct perf_opts *o, FILE *out, struct perf_backend *be)
{
    struct exec_ctx *c = calloc(1, sizeof(*c));
    memset(be, 0, sizeof(*be));
    if (c == NULL)
        return -1;
    c->n = (uint32_t)o->executor_nranks;
    c->baseline = o->baseline;
    be->name = o->baseline ? "baseline" : "executor";
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
