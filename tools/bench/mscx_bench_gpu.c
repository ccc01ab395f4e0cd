/* SPDX-License-Identifier: MIT */
/*
 * mscx-bench-gpu: in-process N-rank benchmarks of the GPU executor on one GPU.
 *   mscx-bench-gpu [--ranks N] [--plans gen|dsl] [--edges] [algo-plan-dir [plans-dir [max-bytes]]]
 * algo-plan-dir holds the DSL's allreduce_pkt_n{2,4,8}.json; plans-dir this
 * project's plans/ (every allreduce_n{N}_rpn{N}_{oneshot,twophase}_*.json:
 * what the shim routes for one node, each at the sizes of its range).
 * Before them, a launch probe: one rank, no peers (bench_probe).
 * --ranks N runs only the rows of N ranks (1: the probe only), --plans only
 * this project's plans (gen) or the DSL's (dsl), --edges prints each
 * captured graph's shape on stderr. With gen, the one-node packet AlltoAll
 * plans (alltoall_n{N}_rpn{N}_oneshot_*.json, out of place, fp32) also run
 * against the hand-written one-shot alltoall (ref_alltoall.cu), rows "a2a".
 * Prints a markdown table: each plan-driven LL16 packet allreduce (fp32 sum)
 * against a hand-written kernel of the same algorithm (tools/bench/ref/),
 * eager and under CUDA graphs, and the launch+completion time of an empty plan.
 * Graph times: ITERS collectives of every rank captured in one graph, the
 * graph replayed REPS times, median replay / ITERS, so graph launch cost is
 * amortised. Two graphs: ranks' streams forked once and joined at the end
 * (launches back to back per rank), and joined (fork and join around every
 * collective, as a framework's collective stream does). Eager: REPS batches
 * of ITERS launches, median batch / ITERS. The executor and the hand-written
 * kernel alternate rep by rep.
 */
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/plan.h"
#include "ref.h"

#define MAXR 8

/* the largest exec / hand ratio per mode (eager, graph, joined), shipped plans' rows of 1 KB to 64 KB */
static double g_worst[3];
static int g_pdl;   /* MSCX_PDL as the executor reads it: the hand-written kernel launches the same way */
static int g_edges; /* --edges: print each captured graph's shape on stderr */
#define ITERS 100
#define REPS 11

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct bench {
    uint32_t n, pid[MAXR], blocks, threads;
    enum mscx_ref_algo algo;
    struct mscx_exec *ex[MAXR];
    cudaStream_t st[MAXR];
    float *buf[MAXR];
    float *out[MAXR]; /* alltoall: the output (out of place); NULL: in place in buf */
    char *scr[MAXR];
    uint32_t *state[MAXR];
    uint64_t msg, scratch_bytes;
    int ref;
};

static int one_iter(struct bench *b)
{
    for (uint32_t r = 0; r < b->n; r++) {
        int rc;
        if (b->ref) {
            struct mscx_ref_launch l = {
                .algo = b->algo,
                .dtype = MSCX_DT_FP32,
                .send = b->buf[r],
                .recv = b->out[r] ? b->out[r] : b->buf[r],
                .scratch_bytes = b->scratch_bytes,
                .state = b->state[r],
                .rank = r,
                .nranks = b->n,
                .bytes = b->msg,
                .blocks = b->blocks,
                .threads = b->threads,
                .timeout_ns = 10000000000ull,
                .pdl = (uint32_t)g_pdl,
            };
            char err[256];
            for (uint32_t p = 0; p < b->n; p++)
                l.scratch[p] = b->scr[p];
            rc = mscx_ref_launch(&l, b->st[r], err, sizeof(err));
            if (rc)
                fprintf(stderr, "mscx-bench-gpu: %s\n", err);
        } else
            rc = mscx_exec_launch(b->ex[r], b->pid[r], b->buf[r], b->out[r] ? b->out[r] : b->buf[r], b->msg,
                                  MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, b->st[r]);
        if (rc)
            return -1;
    }
    return 0;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return a < c ? -1 : a > c;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

/* One batch of @p iters eager collectives (after a sync): us per collective, or -1. */
static double eager_batch(struct bench *b, int iters)
{
    cudaDeviceSynchronize();
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
        if (one_iter(b))
            return -1;
    cudaDeviceSynchronize();
    return (now_us() - t0) / iters;
}

/* Nodes, kernel nodes, edges and programmatic edges of @p g, on stderr. */
static void print_edges(cudaGraph_t g, const struct bench *b, int join)
{
    size_t nn = 0, ne = 0, nk = 0, np = 0;
    if (cudaGraphGetNodes(g, NULL, &nn) != cudaSuccess ||
        cudaGraphGetEdges(g, NULL, NULL, NULL, &ne) != cudaSuccess)
        return;
    cudaGraphNode_t *nodes = calloc(nn + 1, sizeof(*nodes)), *from = calloc(ne + 1, sizeof(*from)),
                    *to = calloc(ne + 1, sizeof(*to));
    cudaGraphEdgeData *ed = calloc(ne + 1, sizeof(*ed));
    if (nodes && from && to && ed && cudaGraphGetNodes(g, nodes, &nn) == cudaSuccess &&
        cudaGraphGetEdges(g, from, to, ed, &ne) == cudaSuccess) {
        for (size_t i = 0; i < nn; i++) {
            enum cudaGraphNodeType t;
            nk += cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
        }
        for (size_t i = 0; i < ne; i++)
            np += ed[i].type == cudaGraphDependencyTypeProgrammatic;
        fprintf(stderr,
                "graph %s %s ranks %u bytes %llu: %zu nodes (%zu kernels), %zu edges, %zu programmatic\n",
                b->ref ? "hand" : "exec", join ? "joined" : "plain", b->n, (unsigned long long)b->msg, nn, nk,
                ne, np);
    }
    free(nodes);
    free(from);
    free(to);
    free(ed);
}

/*
 * A graph of @p per_graph collectives of every rank. Plain: the ranks' streams
 * fork from stream 0 once, run back to back and join at the end, so a launch
 * follows its rank's previous launch only. Joined (@p join): every collective
 * forks from stream 0 and joins back to it, as a framework's collective stream
 * does around each call, so each launch follows every rank's previous one.
 */
static cudaGraphExec_t make_graph(struct bench *b, int per_graph, int join)
{
    cudaGraph_t g;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t fork, ev[MAXR];
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    for (uint32_t r = 0; r < b->n; r++)
        cudaEventCreateWithFlags(&ev[r], cudaEventDisableTiming);
    cudaStreamBeginCapture(b->st[0], cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < per_graph; i++) {
        if (i == 0 || join) {
            cudaEventRecord(fork, b->st[0]);
            for (uint32_t r = 1; r < b->n; r++)
                cudaStreamWaitEvent(b->st[r], fork, 0);
        }
        one_iter(b);
        if (i == per_graph - 1 || join)
            for (uint32_t r = 1; r < b->n; r++) {
                cudaEventRecord(ev[r], b->st[r]);
                cudaStreamWaitEvent(b->st[0], ev[r], 0);
            }
    }
    if (cudaStreamEndCapture(b->st[0], &g) != cudaSuccess)
        g = NULL;
    else if (g_edges)
        print_edges(g, b, join);
    if (g && cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        ge = NULL;
    if (g)
        cudaGraphDestroy(g);
    cudaEventDestroy(fork);
    for (uint32_t r = 0; r < b->n; r++)
        cudaEventDestroy(ev[r]);
    if (ge) { /* one replay untimed: first-use costs stay out of the figures */
        cudaGraphLaunch(ge, b->st[0]);
        cudaDeviceSynchronize();
    }
    return ge;
}

/* One replay of @p ge: us per collective, or -1. */
static double graph_replay(struct bench *b, cudaGraphExec_t ge, int per_graph)
{
    static cudaEvent_t e0, e1;
    float ms = 0;
    if (!ge)
        return -1;
    if (!e0 && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        return -1;
    cudaEventRecord(e0, b->st[0]);
    cudaGraphLaunch(ge, b->st[0]);
    cudaEventRecord(e1, b->st[0]);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        return -1;
    return ms * 1000.0 / per_graph;
}

static uint64_t g_max_bytes = 4u << 20;

static void bench_plan(struct mscx_plan *plan, uint32_t n, enum mscx_ref_algo algo, const char *label);

/* Plan file names in size order: by the number after the algorithm (1K < 4K < 16K < 64K). */
static uint64_t name_size(const char *name)
{
    const char *p = strrchr(name, '_'); /* ..._<min>_<max>.json: the min is before the last '_' */
    while (p && p > name && p[-1] != '_')
        p--;
    if (!p)
        return 0;
    char *end;
    uint64_t v = strtoull(p, &end, 10);
    return *end == 'K' ? v << 10 : *end == 'M' ? v << 20 : v;
}

static int cmp_name(const void *x, const void *y)
{
    uint64_t a = name_size(*(char *const *)x), b = name_size(*(char *const *)y);
    return a < b ? -1 : a > b;
}

static void bench_n(const char *path, uint32_t n, enum mscx_ref_algo algo, const char *label)
{
    char err[1024];
    struct mscx_plan *plan;
    if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        return;
    }
    bench_plan(plan, n, algo, label);
}

/* Run @p plan (then destroyed) against the hand-written kernel, a row per size. */
/*
 * One row: the executor and the hand-written kernel at b->msg bytes. They
 * alternate, rep by rep, in each mode (eager; graph; joined graph), so that
 * drift in the machine's speed falls on both alike; each figure is the
 * median of its REPS.
 */
static void bench_size(struct bench *b, const char *label)
{
    double t[3][2][REPS];
    cudaGraphExec_t ge[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int ref = 0; ref < 2; ref++) {
        b->ref = ref;
        if (one_iter(b)) /* warm: the plan's first use at this size */
            continue;
        cudaDeviceSynchronize();
        for (int j = 0; j < 2; j++)
            ge[ref][j] = make_graph(b, ITERS, j);
    }
    for (int k = 0; k < REPS; k++)
        for (int ref = 0; ref < 2; ref++) {
            b->ref = ref;
            t[0][ref][k] = eager_batch(b, ITERS);
            for (int j = 0; j < 2; j++)
                t[1 + j][ref][k] = graph_replay(b, ge[ref][j], ITERS);
        }
    double m[3][2];
    for (int i = 0; i < 3; i++)
        for (int ref = 0; ref < 2; ref++)
            m[i][ref] = median(t[i][ref], REPS);
    for (int ref = 0; ref < 2; ref++)
        for (int j = 0; j < 2; j++)
            if (ge[ref][j])
                cudaGraphExecDestroy(ge[ref][j]);
    for (int i = 0; i < 3 && b->msg <= 65536 && strncmp(label, "gen ", 4) == 0; i++)
        if (m[i][0] > 0 && m[i][1] > 0 && m[i][0] / m[i][1] > g_worst[i])
            g_worst[i] = m[i][0] / m[i][1];
    printf("| %s | %u | %llu | %u | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", label,
           b->n, (unsigned long long)b->msg, b->blocks, m[0][0], m[0][1], m[0][0] / m[0][1], m[1][0], m[1][1],
           m[1][0] / m[1][1], m[2][0], m[2][1], m[2][0] / m[2][1]);
    fflush(stdout);
}

static void bench_plan(struct mscx_plan *plan, uint32_t n, enum mscx_ref_algo algo, const char *label)
{
    struct bench b;
    memset(&b, 0, sizeof(b));
    b.n = n;
    b.blocks = mscx_plan_threadblocks(plan, 0);
    b.threads = mscx_plan_threads_per_block(plan) ? mscx_plan_threads_per_block(plan) : 1024;
    b.algo = algo;
    uint64_t mn, mx;
    mscx_plan_size_range(plan, &mn, &mx);
    const uint64_t maxmsg = mx < g_max_bytes ? mx : g_max_bytes;
    b.scratch_bytes = mscx_ref_scratch_bytes(algo, n, maxmsg);
    if (mscx_exec_create_local_group(n, 0, b.ex) != MSCX_OK)
        return;
    for (uint32_t r = 0; r < n; r++) {
        if (mscx_exec_add_plan(b.ex[r], plan, maxmsg, &b.pid[r]) != MSCX_OK) {
            fprintf(stderr, "add_plan failed\n");
            return;
        }
        cudaStreamCreateWithFlags(&b.st[r], cudaStreamNonBlocking);
        cudaMalloc((void **)&b.buf[r], maxmsg);
        cudaMemset(b.buf[r], 0, maxmsg);
        if (algo == MSCX_REF_ALLTOALL) {
            cudaMalloc((void **)&b.out[r], maxmsg);
            cudaMemset(b.out[r], 0, maxmsg);
        }
        cudaMalloc((void **)&b.scr[r], b.scratch_bytes);
        cudaMemset(b.scr[r], 0, b.scratch_bytes);
        cudaMalloc((void **)&b.state[r], MSCX_REF_STATE_BYTES);
        cudaMemset(b.state[r], 0, MSCX_REF_STATE_BYTES);
    }
    for (uint64_t msg = 1024; msg <= maxmsg; msg *= 4) {
        if (msg < mn)
            continue;
        b.msg = msg;
        bench_size(&b, label);
    }
    for (uint32_t r = 0; r < n; r++) {
        cudaStreamDestroy(b.st[r]);
        cudaFree(b.buf[r]);
        cudaFree(b.out[r]);
        cudaFree(b.scr[r]);
        cudaFree(b.state[r]);
        mscx_exec_destroy(b.ex[r]);
    }
    mscx_plan_destroy(plan);
}

static const char k_empty[] =
    "{\"name\":\"empty\",\"collective\":\"allreduce\",\"protocol\":\"Simple\",\"inplace\":true,"
    "\"num_threads_per_block\":1024,\"use_double_scratch_buffer\":false,\"buffer_alignment\":16,"
    "\"min_message_size\":0,\"max_message_size\":18446744073709551615,\"gpus\":[{\"id\":0,\"input_chunks\":1,"
    "\"output_chunks\":1,\"scratch_chunks\":0,\"threadblocks\":[{\"id\":0,\"ops\":[{\"name\":\"nop\"}],"
    "\"channels\":[],\"remote_buffer_refs\":[]}],\"channels\":[],\"remote_buffers\":[],\"semaphores\":[]}]}";

/*
 * The launch probe: one rank, no peers, 8 blocks of 512 threads (about the
 * 8-rank one-shot plan's shape), each block copying its chunk of the input into
 * scratch through the executor, against the hand-written one-shot kernel for
 * one rank in the same shape. The difference is the executor's fixed cost per
 * launch (arguments, program staging, prologue). The copy goes to scratch, not
 * onto the output: a one-rank program that leaves the output equal to the
 * input launches no kernel at all.
 */
static void bench_probe(void)
{
    char js[8192], err[1024];
    int o = snprintf(
        js, sizeof(js),
        "{\"name\":\"probe_oneshot\",\"collective\":\"allreduce\",\"protocol\":\"LL\",\"inplace\":true,"
        "\"num_threads_per_block\":512,\"use_double_scratch_buffer\":false,\"buffer_alignment\":16,"
        "\"min_message_size\":0,\"max_message_size\":65536,\"gpus\":[{\"id\":0,\"input_chunks\":8,"
        "\"output_chunks\":8,\"scratch_chunks\":8,\"threadblocks\":[");
    for (int b = 0; b < 8 && o < (int)sizeof(js); b++)
        o +=
            snprintf(js + o, sizeof(js) - (size_t)o,
                     "%s{\"id\":%d,\"ops\":[{\"name\":\"copy\",\"src_buff\":[{\"type\":\"i\",\"index\":%d,"
                     "\"size\":1}],\"dst_buff\":[{\"type\":\"s\",\"index\":%d,\"size\":1}]}],\"channels\":[],"
                     "\"remote_buffer_refs\":[]}",
                     b ? "," : "", b, b, b);
    if (o < (int)sizeof(js))
        o += snprintf(js + o, sizeof(js) - (size_t)o,
                      "],\"channels\":[],\"remote_buffers\":[],\"semaphores\":[]}]}");
    struct mscx_plan *plan;
    if (o >= (int)sizeof(js) ||
        mscx_plan_load_buffer(js, (size_t)o, "probe", &plan, err, sizeof(err)) != MSCX_OK) {
        fprintf(stderr, "launch probe plan: %s\n", o >= (int)sizeof(js) ? "too long" : err);
        return;
    }
    bench_plan(plan, 1, MSCX_REF_ONESHOT, "launch probe (1 rank, copy)");
}

/*
 * Every generated one-node AllReduce plan of @p n ranks in @p pdir (one-shot
 * and two-phase, whatever their ranges), in name order, each against the
 * hand-written kernel of its algorithm.
 */
static void bench_gen(const char *pdir, uint32_t n)
{
    static const char *const algos[] = {"oneshot", "twophase"};
    for (int a = 0; a < 2; a++) {
        char pre[64], path[4096], label[128], *names[16];
        int nn = 0;
        snprintf(pre, sizeof(pre), "allreduce_n%u_rpn%u_%s_", n, n, algos[a]);
        DIR *d = opendir(pdir);
        struct dirent *de;
        while (d && nn < 16 && (de = readdir(d)))
            if (strncmp(de->d_name, pre, strlen(pre)) == 0)
                names[nn++] = strdup(de->d_name);
        if (d)
            closedir(d);
        qsort(names, (size_t)nn, sizeof(names[0]), cmp_name);
        for (int i = 0; i < nn; i++) {
            if (names[i]) {
                snprintf(path, sizeof(path), "%s/%s", pdir, names[i]);
                snprintf(label, sizeof(label), "gen %s %.*s", algos[a],
                         (int)strcspn(names[i] + strlen(pre), "."), names[i] + strlen(pre));
                bench_n(path, n, a == 0 ? MSCX_REF_ONESHOT : MSCX_REF_TWOPHASE, label);
            }
            free(names[i]);
        }
    }
}

/* The one-node packet AlltoAll plans of @p n ranks in @p pdir, each against the hand-written alltoall. */
static void bench_a2a(const char *pdir, uint32_t n)
{
    char pre[64], path[4096], label[128];
    snprintf(pre, sizeof(pre), "alltoall_n%u_rpn%u_oneshot_", n, n);
    DIR *d = opendir(pdir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, pre, strlen(pre)) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", pdir, de->d_name);
        snprintf(label, sizeof(label), "a2a oneshot %.*s", (int)strcspn(de->d_name + strlen(pre), "."),
                 de->d_name + strlen(pre));
        bench_n(path, n, MSCX_REF_ALLTOALL, label);
    }
    if (d)
        closedir(d);
}

static void bench_empty(void)
{
    struct mscx_plan *plan;
    struct mscx_exec *ex;
    char err[1024];
    uint32_t pid;
    void *buf;
    cudaStream_t st;
    if (mscx_plan_load_buffer(k_empty, sizeof(k_empty) - 1, "empty", &plan, err, sizeof(err)) != MSCX_OK) {
        fprintf(stderr, "empty plan: %s\n", err);
        return;
    }
    if (mscx_exec_create_local_group(1, 0, &ex) != MSCX_OK ||
        mscx_exec_add_plan(ex, plan, 1024, &pid) != MSCX_OK)
        return;
    cudaMalloc(&buf, 1024);
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (int i = 0; i < 100; i++)
        mscx_exec_launch(ex, pid, buf, buf, 1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, st);
    cudaStreamSynchronize(st);
    double t0 = now_us();
    for (int i = 0; i < 2000; i++) {
        mscx_exec_launch(ex, pid, buf, buf, 1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, st);
        cudaStreamSynchronize(st);
    }
    double sync_lat = (now_us() - t0) / 2000;
    t0 = now_us();
    for (int i = 0; i < 2000; i++)
        mscx_exec_launch(ex, pid, buf, buf, 1024, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, st);
    cudaStreamSynchronize(st);
    double pipe = (now_us() - t0) / 2000;
    printf(
        "\nempty plan (1 rank, 1 block, nop; a rank with only nops launches no kernel, so this is the call's "
        "host cost; mscx-bench-launch times the kernel itself on an empty program): launch+sync %.2f us, "
        "back-to-back %.2f us per call\n",
        sync_lat, pipe);
    cudaFree(buf);
    cudaStreamDestroy(st);
    mscx_exec_destroy(ex);
    mscx_plan_destroy(plan);
}

/* The command line. */
struct bench_opts {
    uint32_t ranks;   /* 0: every rank count; 1: the probe only */
    int gen, dsl;     /* which plans run */
    const char *dir;  /* the DSL's plans */
    const char *pdir; /* this project's plans */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mscx-bench-gpu [--ranks 1|2|4|8] [--plans gen|dsl] [--edges] "
               "[algo-plan-dir [plans-dir [max-bytes]]]\n");
}

/* @return 0, or 2 after printing what is wrong */
static int parse_opts(int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {{"ranks", required_argument, NULL, 'r'},
                                             {"plans", required_argument, NULL, 'p'},
                                             {"edges", no_argument, NULL, 'e'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    char *end;
    int c;
    *o = (struct bench_opts){0, 1, 1, "tests/data/mscclpp/mscclpp-algo-plans", "plans"};
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'r':
            o->ranks = (uint32_t)strtoul(optarg, &end, 10);
            if (*end || (o->ranks != 1 && o->ranks != 2 && o->ranks != 4 && o->ranks != 8)) {
                fprintf(stderr, "mscx-bench-gpu: --ranks %s: want 1, 2, 4 or 8\n", optarg);
                return 2;
            }
            break;
        case 'p':
            o->gen = strcmp(optarg, "gen") == 0;
            o->dsl = strcmp(optarg, "dsl") == 0;
            if (!o->gen && !o->dsl) {
                fprintf(stderr, "mscx-bench-gpu: --plans %s: want gen or dsl\n", optarg);
                return 2;
            }
            break;
        case 'e':
            g_edges = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind > 3) {
        usage(stderr);
        return 2;
    }
    if (optind < argc)
        o->dir = argv[optind];
    if (optind + 1 < argc)
        o->pdir = argv[optind + 1];
    if (optind + 2 < argc && strtoull(argv[optind + 2], NULL, 0) >= 1024)
        g_max_bytes = strtoull(argv[optind + 2], NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    if (parse_opts(argc, argv, &o))
        return 2;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no GPU\n");
        return 77;
    }
    char path[4096];
    const struct mscx_config *cfg;
    if (mscx_config_get(&cfg) != MSCX_OK)
        return 2;
    g_pdl = cfg->pdl;
    printf("LL16 packet allreduce, fp32 sum, in place; us per allreduce (all ranks); graph: %d per graph, "
           "median of %d replays; programmatic dependent launch (MSCX_PDL) %s for both kernels; rows a2a: "
           "LL16 packet alltoall, fp32, out of place, us per alltoall\n\n",
           ITERS, REPS, g_pdl ? "on" : "off");
    printf("| plan | ranks | bytes | blocks/rank | exec eager | hand eager | eager ratio | exec graph | hand "
           "graph | "
           "graph ratio | exec joined | hand joined | joined ratio |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (o.ranks == 0 || o.ranks == 1)
        bench_probe();
    for (uint32_t n = 2; n <= 8; n *= 2) {
        if (o.ranks != 0 && o.ranks != n)
            continue;
        if (o.gen)
            bench_gen(o.pdir, n);
        if (o.gen)
            bench_a2a(o.pdir, n);
        snprintf(path, sizeof(path), "%s/allreduce_pkt_n%u.json", o.dir, n);
        if (o.dsl)
            bench_n(path, n, MSCX_REF_TWOPHASE, "dsl allreduce_pkt");
    }
    printf("\nexecutor overhead (exec / hand), largest over the rows above of shipped plans (gen) at "
           "1 KB-64 KB: eager %.2f, graph %.2f, joined graph %.2f\n",
           g_worst[0], g_worst[1], g_worst[2]);
    bench_empty();
    return 0;
}
