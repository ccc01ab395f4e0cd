/* SPDX-License-Identifier: MIT */
/*
 * Multi-process GPU executor tests: N forked processes on one GPU, one rank
 * each, a socketpair bootstrap between them (tests/common/proc_mesh.h), each
 * rank's results compared bit for bit with the host reference executor.
 * Modes (argv[1]):
 *   ipc      plans/allreduce_n2_rpn2_oneshot_1K_16K.json, 2 processes: memory
 *            channels through CUDA IPC across processes
 *   twonode  plans/allreduce_n4_rpn2_hier2_1K_64K.json, 4 processes,
 *            MSCX_VIRTUAL_NODES=2 (ranks 0,1 node 0; 2,3 node 1): memory
 *            channels through CUDA IPC within a node, port channels through
 *            the CPU proxy over TCP between nodes; prints latency per size
 *   cudaport the same plan and 4 processes on one node (no MSCX_VIRTUAL_NODES):
 *            port channels to other processes of the same node go through
 *            the CPU proxy's cuda link (copies into IPC-mapped memory)
 *   kill     the twonode setup; rank 2 SIGKILLs itself right after launching
 *            a collective: every survivor must end with MSCX_ERR_TIMEOUT or
 *            MSCX_ERR_REMOTE within MSCX_TIMEOUT_MS (+ slack), nothing hangs
 *   watchdog the same with no timeout (the default wait): a thread of each
 *            survivor aborts it 1 s after the death, as PyTorch's watchdog
 *            does; every survivor's launch ends within 1 s of its abort
 *   peerbufs MSCCL++ DSL op plans whose ops read or write a peer's input or
 *            output buffer (put, get, read-reduce, port-channel put ...), one
 *            rank per process: user buffers registered across processes
 *            (peer_buffers.c). Every rank's input and output are compared with
 *            the host executor over launches with reused, new and
 *            freed-and-reallocated buffers, a CUDA graph captured with
 *            registered buffers and replayed, and two refusals that must be
 *            the same on every rank: managed memory, and a new buffer under
 *            capture
 *   straggler  the ipc setup with the default MSCX_TIMEOUT_MS (0: no limit):
 *            rank 1 launches 20 s after rank 0; rank 0's kernel waits for it
 *            and both results are right
 *   error    the ipc setup with MSCX_TIMEOUT_MS=100 and a peer that never
 *            launches: rank 0's collective ends with MSCX_ERR_TIMEOUT, and
 *            the error stays (the shim's communicator then fails every call)
 * A plan path after the mode replaces the mode's plan; the process count is
 * the plan's rank count (twonode: MSCX_VIRTUAL_NODES when set, else the
 * plan's ranks / its ranks per node).
 * The GPU time-slices the processes, so sizes stay small and latencies are
 * dominated by the time slices. MSCX_TEST_SPREAD_GPUS=1 puts process r on
 * GPU r % (GPU count) instead of GPU 0: with one process per GPU the
 * latency lines are real (a 2-rank two-node plan on 2 GPUs: TCP between
 * the virtual nodes). The parent has a hard deadline and kills
 * every rank past it. Exits 77 without a GPU (probed in a child: CUDA must
 * not be initialised before fork).
 * This file holds the shared rank setup, the fill and check helpers, the
 * process launcher, main and every mode but peerbufs, whose rank code is in
 * test_gpu_mproc_peerbufs.c; mproc_int.h declares what the two share.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "launch_abi.h"
#include "op_plan_skip.h"
#include "proc_mesh.h"
#include "gpu_test.h"
#include "mproc_int.h"

#define ITERS 2
#define KILL_TIMEOUT_MS 3000
#define WATCHDOG_MS 1000 /* the watchdog mode's abort, after the peer died */
#define LAT_ITERS 20

const char *g_mode;
static int g_spread; /* MSCX_TEST_SPREAD_GPUS=1: process r on GPU r % count */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Deterministic values per (rank, iter, size, byte); fp32 values are multiples of 1/64, so sums are exact. */
void fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint32_t rank, uint32_t iter, uint64_t size)
{
    uint64_t seed = (uint64_t)rank * 7919u + iter * 131u + size * 3u + 1u;
    for (uint64_t i = 0; i + 4 <= n; i += 4) {
        uint64_t x = (seed + i) * 0x9e3779b97f4a7c15ull;
        x ^= x >> 29;
        if (dt == MSCX_DT_FP32) {
            float f = (float)((int64_t)(x % 4001) - 2000) / 64.0f;
            memcpy(p + i, &f, 4);
        } else {
            uint32_t u = (uint32_t)(x >> 17);
            memcpy(p + i, &u, 4);
        }
    }
    for (uint64_t i = n / 4 * 4; i < n; i++)
        p[i] = (uint8_t)(seed + i);
}

struct ref {
    enum mscx_dtype dt;
    uint32_t rank;
    uint64_t size;
    uint8_t *out[ITERS];
    uint8_t *in[ITERS];
};

static void ref_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct ref *r = ctx;
    fill(out, out_bytes, r->dt, rank, iter, r->size + 1);
    fill(in, in_bytes, r->dt, rank, iter, r->size);
}

static void ref_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct ref *r = ctx;
    if (rank == r->rank && iter < ITERS) {
        memcpy(r->out[iter], out, out_bytes);
        memcpy(r->in[iter], in, in_bytes);
    }
}

void report_error(struct proc_mesh *m, struct mscx_exec *ex, mscx_status_t st, const char *when)
{
    struct mscx_gpu_err e;
    mscx_gpu_debug_error(ex, &e);
    if (e.block == UINT32_MAX)
        RFAIL(m, "%s: %s, recorded by the proxy (the WARN above names the request)", when,
              mscx_status_str(st));
    else
        RFAIL(m, "%s: %s, thread block %u op %u (opcode %s)%s", when, mscx_status_str(st), e.block, e.op,
              mscx_opcode_name((enum mscx_opcode)e.opcode),
              e.op == 0xffffu ? " = the end-of-launch drain of port requests" : "");
}

/* Input and output of @p rank in @p base as the collective's in-place rule says, or apart. */
void layout(const struct mscx_plan *plan, uint32_t rank, uint64_t in_b, uint64_t out_b, uint8_t *base,
            uint8_t **in_p, uint8_t **out_p)
{
    if (!mscx_plan_inplace(plan)) {
        *in_p = base;
        *out_p = base + ((in_b + 255) & ~255ull);
        return;
    }
    switch (mscx_plan_collective(plan)) {
    case MSCX_COLL_ALLGATHER:
        *out_p = base;
        *in_p = base + rank * in_b;
        break;
    case MSCX_COLL_REDUCESCATTER:
        *in_p = base;
        *out_p = base + rank * out_b;
        break;
    default:
        *in_p = *out_p = base;
        break;
    }
}

/* One size and type: two launches compared with the host executor. @return 0 or 1. */
static int check_size(struct rank_ctx *c, uint64_t size, enum mscx_dtype dt, enum mscx_redop op,
                      enum mscx_pkt_format pkt)
{
    struct proc_mesh *m = c->m;
    uint32_t n = mscx_plan_nranks(c->plan);
    uint64_t in_b, out_b;
    char err[512];
    mscx_coll_sizes(mscx_plan_collective(c->plan), n, size, &in_b, &out_b);
    struct ref r = {dt, m->rank, size, {NULL, NULL}, {NULL, NULL}};
    for (int it = 0; it < ITERS; it++) {
        r.out[it] = calloc(1, out_b + 1);
        r.in[it] = calloc(1, in_b + 1);
    }
    struct mscx_hostexec_cfg cfg = {in_b, out_b, dt, op, pkt, ITERS, 0, 0, ref_fill, ref_collect, &r};
    mscx_status_t st = mscx_hostexec_run(c->plan, &cfg, err, sizeof(err));
    int bad = 0;
    if (st != MSCX_OK) {
        RFAIL(m, "host executor, %llu bytes: %s", (unsigned long long)size, err);
        bad = 1;
        goto out;
    }
    layout(c->plan, m->rank, in_b, out_b, c->dbuf, &c->din, &c->dout);
    for (int it = 0; it < ITERS && !bad; it++) {
        /* as ref_fill: the output first, then the input (which overwrites it where they alias) */
        fill(c->host, out_b, dt, m->rank, (uint32_t)it, size + 1);
        /* pageable H2D may return before the DMA lands: the kernel's stream does not wait for it */
        int cbad = cudaMemcpy(c->dout, c->host, out_b, cudaMemcpyHostToDevice) != cudaSuccess ||
                   cudaDeviceSynchronize() != cudaSuccess;
        fill(c->host, in_b, dt, m->rank, (uint32_t)it, size);
        if (cbad || cudaMemcpy(c->din, c->host, in_b, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            RFAIL(m, "cudaMemcpy of the input failed");
            bad = 1;
            break;
        }
        if (proc_mesh_barrier(m) != 0) {
            RFAIL(m, "bootstrap barrier failed (a peer died?)");
            bad = 1;
            break;
        }
        double t0 = now_ms();
        st = mscx_exec_launch(c->ex, c->pid, c->din, c->dout, size, dt, op, pkt, c->st);
        if (st != MSCX_OK) {
            RFAIL(m, "launch %llu bytes iter %d: %s", (unsigned long long)size, it, mscx_status_str(st));
            bad = 1;
            break;
        }
        cudaError_t ce = cudaStreamSynchronize(c->st);
        double t1 = now_ms();
        if (ce != cudaSuccess) {
            RFAIL(m, "cudaStreamSynchronize: %s", cudaGetErrorString(ce));
            bad = 1;
            break;
        }
        if ((st = mscx_exec_async_error(c->ex)) != MSCX_OK) {
            char when[128];
            snprintf(when, sizeof(when), "%llu bytes %s iter %d after %.1f ms", (unsigned long long)size,
                     mscx_dtype_name(dt), it, t1 - t0);
            report_error(m, c->ex, st, when);
            bad = 1;
            break;
        }
        cudaMemcpy(c->host, c->dout, out_b, cudaMemcpyDeviceToHost);
        if (memcmp(c->host, r.out[it], out_b) != 0) {
            uint64_t at = 0;
            while (c->host[at] == r.out[it][at])
                at++;
            RFAIL(
                m, "%llu bytes %s/%s/%s iter %d: output differs from the host executor at byte %llu of %llu",
                (unsigned long long)size, mscx_dtype_name(dt), mscx_redop_name(op),
                pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", it, (unsigned long long)at, (unsigned long long)out_b);
            uint64_t from = at / 16 * 16;
            fprintf(stderr, "  gpu  @%llu:", (unsigned long long)from);
            for (uint64_t q = from; q < from + 32 && q < out_b; q++)
                fprintf(stderr, " %02x", c->host[q]);
            fprintf(stderr, "\n  host @%llu:", (unsigned long long)from);
            for (uint64_t q = from; q < from + 32 && q < out_b; q++)
                fprintf(stderr, " %02x", r.out[it][q]);
            fputc('\n', stderr);
            bad = 1;
        }
    }
    if (!bad) {
        cudaMemcpy(c->host, c->din, in_b, cudaMemcpyDeviceToHost);
        if (memcmp(c->host, r.in[ITERS - 1], in_b) != 0) {
            RFAIL(m, "%llu bytes: the input differs from the host executor's", (unsigned long long)size);
            bad = 1;
        }
    }
    if (!bad)
        printf("rank %u: %llu bytes %s/%s/%s: %d launches equal to the host executor\n", m->rank,
               (unsigned long long)size, mscx_dtype_name(dt), mscx_redop_name(op),
               pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", ITERS);
out:
    for (int it = 0; it < ITERS; it++) {
        free(r.out[it]);
        free(r.in[it]);
    }
    return bad;
}

/* Back-to-back launches; rank 0 prints the slowest rank's time per launch. */
static int latency(struct rank_ctx *c, uint64_t size)
{
    struct proc_mesh *m = c->m;
    double mine, all[PROC_MESH_MAX];
    uint64_t in_b, out_b;
    mscx_coll_sizes(mscx_plan_collective(c->plan), m->nranks, size, &in_b, &out_b);
    layout(c->plan, m->rank, in_b, out_b, c->dbuf, &c->din, &c->dout);
    if (proc_mesh_barrier(m) != 0)
        return 1;
    double t0 = now_ms();
    for (int i = 0; i < LAT_ITERS; i++)
        if (mscx_exec_launch(c->ex, c->pid, c->din, c->dout, size, MSCX_DT_FP32, MSCX_REDOP_SUM,
                             MSCX_PKT_LL16, c->st) != MSCX_OK)
            return 1;
    if (cudaStreamSynchronize(c->st) != cudaSuccess)
        return 1;
    mine = (now_ms() - t0) * 1e3 / LAT_ITERS;
    mscx_status_t st = mscx_exec_async_error(c->ex);
    if (st != MSCX_OK) {
        report_error(m, c->ex, st, "latency loop");
        return 1;
    }
    if (proc_mesh_allgather(m, &mine, all, sizeof(mine)) != MSCX_OK)
        return 1;
    double worst = 0;
    for (uint32_t q = 0; q < m->nranks; q++)
        worst = all[q] > worst ? all[q] : worst;
    if (m->rank == 0)
        printf("%s latency: %llu bytes fp32 sum ll16: %.1f us per launch (slowest rank, %d back-to-back "
               "launches, "
               "%u processes%s)\n",
               g_mode, (unsigned long long)size, worst, LAT_ITERS, m->nranks,
               g_spread ? ", spread over the GPUs" : " time-sliced on one GPU");
    return 0;
}

int rank_setup(struct rank_ctx *c, struct proc_mesh *m, const char *path, const char *timeout_ms, int vnodes)
{
    char err[512], vn[16];
    memset(c, 0, sizeof(*c));
    c->m = m;
    snprintf(vn, sizeof(vn), "%d", vnodes);
    if (mscx_config_override("MSCX_TIMEOUT_MS", timeout_ms) != MSCX_OK ||
        (vnodes && mscx_config_override("MSCX_VIRTUAL_NODES", vn) != MSCX_OK)) {
        RFAIL(m, "config override");
        return 1;
    }
    int dev = 0, ndev = 0;
    if (g_spread && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0)
        dev = (int)(m->rank % (uint32_t)ndev);
    if (cudaSetDevice(dev) != cudaSuccess) {
        RFAIL(m, "cudaSetDevice(%d)", dev);
        return 1;
    }
    if (mscx_plan_load(path, &c->plan, err, sizeof(err)) != MSCX_OK) {
        RFAIL(m, "plan %s: %s", path, err);
        return 1;
    }
    if (mscx_plan_nranks(c->plan) != m->nranks) {
        RFAIL(m, "plan %s has %u ranks, %u processes", path, mscx_plan_nranks(c->plan), m->nranks);
        return 1;
    }
    struct mscx_bootstrap bs = {m->rank, m->nranks, m, proc_mesh_allgather, NULL};
    mscx_status_t st = mscx_exec_create(&bs, 0, &c->ex);
    if (st == MSCX_OK)
        st = mscx_exec_add_plan(c->ex, c->plan, 65536, &c->pid);
    if (st != MSCX_OK) {
        RFAIL(m, "executor setup (create + add_plan, collective): %s (the WARN above says why)",
              mscx_status_str(st));
        return 1;
    }
    if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&c->dbuf, BUF_BYTES) != cudaSuccess || !(c->host = malloc(BUF_BYTES))) {
        RFAIL(m, "stream or buffer allocation failed");
        return 1;
    }
    return 0;
}

void rank_teardown(struct rank_ctx *c)
{
    if (c->st)
        cudaStreamSynchronize(c->st);
    mscx_exec_destroy(c->ex);
    if (c->st)
        cudaStreamDestroy(c->st);
    cudaFree(c->dbuf);
    free(c->host);
    mscx_plan_destroy(c->plan);
}

/* The plan takes @p size with @p dt and @p op on every rank (an arbitrary plan may not). */
int size_ok(const struct mscx_plan *plan, uint64_t size, enum mscx_dtype dt, enum mscx_redop op)
{
    uint64_t mn, mx, in_b, out_b;
    struct mscx_geom g;
    char err[256];
    mscx_plan_size_range(plan, &mn, &mx);
    if (size < mn || size > mx || !mscx_plan_supports(plan, dt, op))
        return 0;
    mscx_coll_sizes(mscx_plan_collective(plan), mscx_plan_nranks(plan), size, &in_b, &out_b);
    for (uint32_t r = 0; r < mscx_plan_nranks(plan); r++)
        if (mscx_plan_geom(plan, r, in_b, out_b, dt, &g, err, sizeof(err)) != MSCX_OK)
            return 0;
    return 1;
}

static int rank_run(struct proc_mesh *m, const char *path, int vnodes)
{
    static const uint64_t sizes[] = {1024, 4096 + 16, 65536};
    struct rank_ctx c;
    if (rank_setup(&c, m, path, "20000", vnodes))
        return 1;
    int bad = 0, ran = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !bad; i++)
        if (size_ok(c.plan, sizes[i], MSCX_DT_FP32, MSCX_REDOP_SUM)) {
            bad |= check_size(&c, sizes[i], MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16);
            ran++;
        }
    if (!bad && size_ok(c.plan, 4096, MSCX_DT_UINT32, MSCX_REDOP_MAX)) {
        bad |= check_size(&c, 4096, MSCX_DT_UINT32, MSCX_REDOP_MAX, MSCX_PKT_LL8);
        ran++;
    }
    if (!bad && ran == 0) {
        RFAIL(m,
              "the plan takes none of the test's sizes (1024, 4112, 65536 bytes fp32 sum; 4096 uint32 max)");
        bad = 1;
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !bad; i++)
        if (size_ok(c.plan, sizes[i], MSCX_DT_FP32, MSCX_REDOP_SUM))
            bad |= latency(&c, sizes[i]);
    if (!bad && proc_mesh_barrier(m) != 0) {
        RFAIL(m, "final barrier");
        bad = 1;
    }
    rank_teardown(&c);
    return bad;
}

struct watchdog {
    struct mscx_exec *ex;
    double fired_at; /* now_ms() when it aborted */
};

/* What PyTorch's watchdog does when a collective is stuck: abort after a while, from another thread. */
static void *watchdog_main(void *arg)
{
    struct watchdog *w = arg;
    usleep(WATCHDOG_MS * 1000);
    w->fired_at = now_ms();
    mscx_exec_abort(w->ex);
    return NULL;
}

/*
 * Rank 2 dies mid-collective. With @p watchdog 0 the survivors' opt-in
 * timeout (KILL_TIMEOUT_MS) ends their wait; with 1 the wait is NCCL's
 * (MSCX_TIMEOUT_MS 0, no limit) and a watchdog thread aborts each survivor.
 */
static int rank_kill(struct proc_mesh *m, const char *path, int watchdog)
{
    struct rank_ctx c;
    char to[32];
    snprintf(to, sizeof(to), "%d", watchdog ? 0 : KILL_TIMEOUT_MS);
    if (rank_setup(&c, m, path, to, 2))
        return 1;
    struct watchdog w = {NULL, 0};
    pthread_t wt;
    for (int it = 0; it < 3; it++) { /* everybody healthy first */
        if (proc_mesh_barrier(m) != 0 ||
            mscx_exec_launch(c.ex, c.pid, c.dbuf, c.dbuf, 65536, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16,
                             c.st) != MSCX_OK ||
            cudaStreamSynchronize(c.st) != cudaSuccess || mscx_exec_async_error(c.ex) != MSCX_OK) {
            RFAIL(m, "warm-up launch %d failed", it);
            return 1;
        }
    }
    if (proc_mesh_barrier(m) != 0) {
        RFAIL(m, "barrier before the kill");
        return 1;
    }
    if (m->rank == 2) {
        mscx_exec_launch(c.ex, c.pid, c.dbuf, c.dbuf, 65536, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16,
                         c.st);
        printf("rank 2: launched, now SIGKILL\n");
        fflush(stdout);
        raise(SIGKILL);
    }
    alarm(KILL_TIMEOUT_MS / 1000 * 4 + 60); /* a hang below ends this process with SIGALRM */
    w.ex = c.ex;
    if (watchdog && pthread_create(&wt, NULL, watchdog_main, &w) != 0) {
        RFAIL(m, "cannot start the watchdog thread");
        return 1;
    }
    for (int it = 0; it < 100; it++) {
        double t0 = now_ms();
        mscx_status_t st = mscx_exec_launch(c.ex, c.pid, c.dbuf, c.dbuf, 65536, MSCX_DT_FP32, MSCX_REDOP_SUM,
                                            MSCX_PKT_LL16, c.st);
        cudaError_t ce = cudaStreamSynchronize(c.st);
        if (st == MSCX_OK)
            st = mscx_exec_async_error(c.ex);
        double ms = now_ms() - t0;
        if (ce != cudaSuccess) {
            RFAIL(m, "cudaStreamSynchronize after the peer died: %s", cudaGetErrorString(ce));
            return 1;
        }
        if (st == MSCX_OK)
            continue;
        struct mscx_gpu_err e;
        mscx_gpu_debug_error(c.ex, &e);
        printf("rank %u: launch %d after rank 2 died ended with %s after %.0f ms (%s, block %d op %d)\n",
               m->rank, it, mscx_status_str(st), ms,
               e.block == UINT32_MAX ? "recorded by the proxy" : "recorded by the kernel", (int)e.block,
               (int)e.op);
        if (st != MSCX_ERR_TIMEOUT && st != MSCX_ERR_REMOTE) {
            RFAIL(m, "expected MSCX_ERR_TIMEOUT or MSCX_ERR_REMOTE, got %s", mscx_status_str(st));
            return 1;
        }
        if (watchdog) {
            pthread_join(wt, NULL);
            double after = now_ms() - w.fired_at;
            printf("rank %u: the launch ended %.0f ms after the watchdog's abort\n", m->rank, after);
            if (after > 1000) {
                RFAIL(m, "the launch ended %.0f ms after the abort, more than 1 s", after);
                return 1;
            }
        } else if (ms > KILL_TIMEOUT_MS + 10000) {
            RFAIL(m, "the error took %.0f ms, more than MSCX_TIMEOUT_MS %d + 10 s", ms, KILL_TIMEOUT_MS);
            return 1;
        }
        double t1 = now_ms();
        rank_teardown(&c);
        printf("rank %u: destroy with a dead peer took %.0f ms\n", m->rank, now_ms() - t1);
        return 0;
    }
    if (watchdog)
        pthread_join(wt, NULL);
    RFAIL(m, "100 launches completed without an error although rank 2 is dead");
    return 1;
}

/* ---- straggler and error: the wait limit ---- */

#define STRAGGLER_S 20
#define SMALL_BYTES 4096

/* Rank r's input is r + 1 everywhere; an AllReduce sum gives n (n + 1) / 2. */
static int small_launch(struct rank_ctx *c, mscx_status_t *st_p, double *ms_p)
{
    uint64_t in_b, out_b;
    uint32_t n = mscx_plan_nranks(c->plan);
    mscx_coll_sizes(mscx_plan_collective(c->plan), n, SMALL_BYTES, &in_b, &out_b);
    layout(c->plan, c->m->rank, in_b, out_b, c->dbuf, &c->din, &c->dout);
    float *h = (float *)c->host;
    for (uint64_t i = 0; i < in_b / 4; i++)
        h[i] = (float)(c->m->rank + 1);
    if (cudaMemcpy(c->din, h, in_b, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        return 1;
    double t0 = now_ms();
    mscx_status_t st = mscx_exec_launch(c->ex, c->pid, c->din, c->dout, SMALL_BYTES, MSCX_DT_FP32,
                                        MSCX_REDOP_SUM, MSCX_PKT_LL16, c->st);
    cudaError_t ce = cudaStreamSynchronize(c->st);
    *ms_p = now_ms() - t0;
    if (ce != cudaSuccess)
        return 1;
    *st_p = st == MSCX_OK ? mscx_exec_async_error(c->ex) : st;
    return 0;
}

static int small_check(struct rank_ctx *c)
{
    uint32_t n = mscx_plan_nranks(c->plan);
    float want = (float)(n * (n + 1) / 2);
    float *h = (float *)c->host;
    if (cudaMemcpy(h, c->dout, SMALL_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    for (uint64_t i = 0; i < SMALL_BYTES / 4; i++)
        if (h[i] != want) {
            RFAIL(c->m, "element %llu is %g, expected %g", (unsigned long long)i, (double)h[i], (double)want);
            return 1;
        }
    return 0;
}

static int rank_straggler(struct proc_mesh *m, const char *path)
{
    struct rank_ctx c;
    const struct mscx_config *cfg;
    if (rank_setup(&c, m, path, NULL, 0)) /* NULL: MSCX_TIMEOUT_MS at its default */
        return 1;
    if (mscx_config_get(&cfg) != MSCX_OK || cfg->timeout_ms != 0) {
        RFAIL(m, "the default MSCX_TIMEOUT_MS is not 0");
        return 1;
    }
    alarm(STRAGGLER_S * 3 + 60);
    if (proc_mesh_barrier(m) != 0) {
        RFAIL(m, "barrier");
        return 1;
    }
    if (m->rank == 1)
        sleep(STRAGGLER_S);
    mscx_status_t st = MSCX_OK;
    double ms = 0;
    if (small_launch(&c, &st, &ms) != 0 || st != MSCX_OK) {
        RFAIL(m, "the collective with a straggler failed: %s after %.0f ms", mscx_status_str(st), ms);
        return 1;
    }
    printf("rank %u: the collective took %.0f ms (rank 1 came %d s late)\n", m->rank, ms, STRAGGLER_S);
    if (m->rank == 0 && ms < (STRAGGLER_S - 1) * 1000.0) {
        RFAIL(m, "rank 0 finished in %.0f ms although rank 1 launched %d s late: the test proves nothing", ms,
              STRAGGLER_S);
        return 1;
    }
    int bad = small_check(&c);
    if (proc_mesh_barrier(m) != 0)
        bad = 1;
    rank_teardown(&c);
    return bad;
}

static int rank_error(struct proc_mesh *m, const char *path)
{
    struct rank_ctx c;
    if (rank_setup(&c, m, path, NULL, 0)) /* setup without a limit: the ranks are time-sliced on one GPU */
        return 1;
    if (mscx_config_override("MSCX_TIMEOUT_MS", "100") != MSCX_OK) { /* read by the first launch */
        RFAIL(m, "config override");
        return 1;
    }
    alarm(120);
    if (proc_mesh_barrier(m) != 0) {
        RFAIL(m, "barrier");
        return 1;
    }
    int bad = 0;
    if (m->rank == 0) {
        mscx_status_t st = MSCX_OK;
        double ms = 0;
        if (small_launch(&c, &st, &ms) != 0) {
            RFAIL(m, "the launch or its stream failed");
            bad = 1;
        } else if (st != MSCX_ERR_TIMEOUT) {
            RFAIL(m, "a peer that never came: %s after %.0f ms, expected MSCX_ERR_TIMEOUT",
                  mscx_status_str(st), ms);
            bad = 1;
        } else if (ms > 10000) {
            RFAIL(m, "the timeout took %.0f ms with MSCX_TIMEOUT_MS=100", ms);
            bad = 1;
        }
        if (mscx_exec_async_error(c.ex) == MSCX_OK) {
            RFAIL(m, "the error did not stay");
            bad = 1;
        }
        printf("rank 0: a peer that never came: %s after %.0f ms; the error stays\n", mscx_status_str(st),
               ms);
    }
    if (proc_mesh_barrier(m) != 0) /* rank 1 never launched: it waits here for rank 0's verdict */
        bad = 1;
    rank_teardown(&c);
    return bad;
}

/* Fork one process per rank of @p path and run @p mode there. @return 0 passed, 1 failed. */
static int run_procs(const char *mode, const char *path, uint32_t n, int vnodes)
{
    int watchdog = strcmp(mode, "watchdog") == 0, kill_mode = watchdog || strcmp(mode, "kill") == 0;
    printf("%s: %s, %u processes on %s%s\n", mode, path, n, g_spread ? "GPUs rank % count" : "GPU 0",
           vnodes > 1 ? ", MSCX_VIRTUAL_NODES split" : "");
    fflush(stdout);
    struct proc_mesh m;
    pid_t pids[PROC_MESH_MAX];
    int r = proc_mesh_fork(&m, n, 120000, pids);
    if (r >= 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        int rc = kill_mode                        ? rank_kill(&m, path, watchdog)
                 : strcmp(mode, "peerbufs") == 0  ? rank_peerbufs(&m, path)
                 : strcmp(mode, "straggler") == 0 ? rank_straggler(&m, path)
                 : strcmp(mode, "error") == 0     ? rank_error(&m, path)
                                                  : rank_run(&m, path, vnodes > 1 ? vnodes : 0);
        fflush(NULL);
        _exit(rc);
    }
    if (r == -2) {
        fprintf(stderr, "FAIL: cannot fork the ranks\n");
        return 1;
    }
    int code[PROC_MESH_MAX];
    int late = proc_mesh_wait(pids, n, kill_mode ? 150 : 400, code);
    int bad = late != 0;
    for (uint32_t q = 0; q < n; q++) {
        int want = kill_mode && q == 2 ? 128 + SIGKILL : 0;
        if (code[q] != want) {
            fprintf(stderr, "FAIL: rank %u exited with %d, expected %d%s\n", q, code[q], want,
                    code[q] == 128 + SIGALRM ? " (hung: its alarm fired)" : "");
            bad = 1;
        }
    }
    return bad;
}

/* The plan's rank count, and why it cannot run here (NULL: it can). */
static const char *plan_ranks(const char *path, int op_test, uint32_t *n_p, uint32_t *rpn_p)
{
    static char why[640];
    struct mscx_plan *plan;
    char err[512];
    if (mscx_plan_load(path, &plan, err, sizeof(err)) != MSCX_OK) {
        snprintf(why, sizeof(why), "cannot load: %s", err);
        return why;
    }
    const char *res = NULL;
    *n_p = mscx_plan_nranks(plan);
    *rpn_p = mscx_plan_ranks_per_node(plan);
    if (*n_p < 1 || *n_p > PROC_MESH_MAX) {
        snprintf(why, sizeof(why), "%u ranks (1..%d processes here)", *n_p, PROC_MESH_MAX);
        res = why;
    } else if (op_test && mscx_plan_collective(plan) == MSCX_COLL_TEST && pkt_unproduced(plan)) {
        res = "reads packets no op sends (the host simulation seeds them; nothing does on the GPU)";
    } else if (op_test && mscx_plan_collective(plan) == MSCX_COLL_TEST && raw_write_race(plan)) {
        res = "a rank reads a user-buffer chunk that a peer writes unordered (order-dependent result)";
    } else if (op_test && first_exporter(plan) == UINT32_MAX) {
        res = "no rank reaches a peer's input or output buffer";
    } else if (mscx_plan_executable(plan, err, sizeof(err)) != MSCX_OK) {
        snprintf(why, sizeof(why), "%s", err);
        res = why;
    }
    mscx_plan_destroy(plan);
    return res;
}

int main(int argc, char **argv)
{
    g_mode = argc > 1 ? argv[1] : "ipc";
    const char *sp = getenv("MSCX_TEST_SPREAD_GPUS");
    g_spread = sp && strcmp(sp, "1") == 0;
    const char *path = NULL;
    uint32_t n, rpn;
    int vnodes = 0;
    if (strcmp(g_mode, "ipc") == 0 || strcmp(g_mode, "straggler") == 0 || strcmp(g_mode, "error") == 0) {
        path = MSCX_SOURCE_ROOT "/plans/allreduce_n2_rpn2_oneshot_1K_16K.json";
    } else if (strcmp(g_mode, "twonode") == 0 || strcmp(g_mode, "cudaport") == 0 ||
               strcmp(g_mode, "kill") == 0 || strcmp(g_mode, "watchdog") == 0) {
        path = MSCX_SOURCE_ROOT "/plans/allreduce_n4_rpn2_hier2_1K_64K.json";
    } else if (strcmp(g_mode, "peerbufs") != 0) {
        fprintf(stderr,
                "unknown mode %s (ipc, twonode, cudaport, kill, watchdog, peerbufs, straggler, error)\n",
                g_mode);
        return 2;
    }
    if (argc > 2)
        path = argv[2];
    if (!gpu_present()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (strcmp(g_mode, "peerbufs") == 0 && !path) {
        /*
         * The DSL's op demonstrations that reach peers' user buffers: through
         * memory channels, and (put_with_signal*_test) through port channels,
         * whose proxy copies into the peer's mapped input over the cuda link.
         */
        static const char *const names[] = {"put_test",
                                            "get_test",
                                            "read_reduce_test",
                                            "read_reduce_send_test",
                                            "reduce_send_test",
                                            "get_fuse_test",
                                            "put_fuse_test",
                                            "put_with_signal_test",
                                            "put_with_signal_and_flush_test"};
        const char *ref = MSCX_SOURCE_ROOT "/tests/data/mscclpp";
        int ran = 0, bad = 0;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            char p[4096];
            snprintf(p, sizeof(p), "%s/mscclpp-op-plans/%s.json", ref, names[i]);
            const char *why = plan_ranks(p, 1, &n, &rpn);
            if (why) {
                printf("skip %s: %s\n", p, why);
                continue;
            }
            int b = run_procs(g_mode, p, n, 0);
            printf("%s %s\n", b ? "FAIL" : "ok  ", p);
            bad |= b;
            ran++;
        }
        if (ran < 3) {
            fprintf(stderr, "FAIL: only %d of the op plans ran (reference plans missing? looked in %s)\n",
                    ran, ref);
            bad = 1;
        }
        printf("peerbufs: %d plans across processes, %s\n", ran, bad ? "FAILED" : "passed");
        return bad;
    }
    const char *why = plan_ranks(path, strcmp(g_mode, "peerbufs") == 0, &n, &rpn);
    if (why) {
        fprintf(stderr, "FAIL: %s: %s\n", path, why);
        return 1;
    }
    if ((strcmp(g_mode, "kill") == 0 || strcmp(g_mode, "watchdog") == 0) && n < 3) {
        fprintf(stderr, "FAIL: %s mode needs at least 3 ranks (rank 2 dies), %s has %u\n", g_mode, path, n);
        return 1;
    }
    if (strcmp(g_mode, "twonode") == 0 || strcmp(g_mode, "kill") == 0 || strcmp(g_mode, "watchdog") == 0) {
        /* virtual nodes: MSCX_VIRTUAL_NODES when set, else the plan's ranks / its ranks per node */
        const struct mscx_config *cfg;
        if (mscx_config_get(&cfg) == MSCX_OK && cfg->virtual_nodes > 0)
            vnodes = (int)cfg->virtual_nodes;
        else if (rpn > 0 && rpn < n && n % rpn == 0)
            vnodes = (int)(n / rpn);
        else
            vnodes = 1;
        if (vnodes < 2)
            printf("%s: %s is one node (%u ranks per node): no virtual node split\n", g_mode, path, rpn);
    }
    int bad = run_procs(g_mode, path, n, vnodes);
    printf("%s: %s\n", g_mode, bad ? "FAILED" : "passed");
    return bad;
}
