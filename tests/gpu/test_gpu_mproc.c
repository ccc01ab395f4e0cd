/* SPDX-License-Identifier: MIT */
/*
 * Multi-process GPU executor tests: N forked processes on one GPU, one rank
 * each, a socketpair bootstrap between them (tests/common/proc_mesh.h), each
 * rank's results compared bit for bit with the host reference executor.
 * Modes (argv[1]):
 *   ipc      plans/allreduce_n2_rpn2_oneshot_1K_64K.json, 2 processes: memory
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
 * The GPU time-slices the processes, so sizes stay small and latencies are
 * dominated by the time slices. The parent has a hard deadline and kills
 * every rank past it. Exits 77 without a GPU (probed in a child: CUDA must
 * not be initialised before fork).
 */
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
#include "gpu_int.h"
#include "proc_mesh.h"

#define ITERS 2
#define KILL_TIMEOUT_MS 3000
#define LAT_ITERS 20

static const char *g_mode;

#define RFAIL(m, ...)                                                                                        \
    do {                                                                                                     \
        fprintf(stderr, "FAIL rank %u (%s): ", (m)->rank, g_mode);                                           \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        fputc('\n', stderr);                                                                                 \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Deterministic values per (rank, iter, size, byte); fp32 values are multiples of 1/64, so sums are exact. */
static void fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint32_t rank, uint32_t iter, uint64_t size)
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
    (void)in;
    (void)in_bytes;
    if (rank == r->rank && iter < ITERS)
        memcpy(r->out[iter], out, out_bytes);
}

static void report_error(struct proc_mesh *m, struct mscx_exec *ex, mscx_status_t st, const char *when)
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

struct rank_ctx {
    struct proc_mesh *m;
    struct mscx_plan *plan;
    struct mscx_exec *ex;
    uint32_t pid;
    cudaStream_t st;
    uint8_t *dbuf; /* in-place allreduce: in == out */
    uint8_t *host;
};

/* One size and type: two launches compared with the host executor. @return 0 or 1. */
static int check_size(struct rank_ctx *c, uint64_t size, enum mscx_dtype dt, enum mscx_redop op,
                      enum mscx_pkt_format pkt)
{
    struct proc_mesh *m = c->m;
    uint32_t n = mscx_plan_nranks(c->plan);
    uint64_t in_b, out_b;
    char err[512];
    mscx_coll_sizes(mscx_plan_collective(c->plan), n, size, &in_b, &out_b);
    struct ref r = {dt, m->rank, size, {NULL, NULL}};
    for (int it = 0; it < ITERS; it++)
        r.out[it] = calloc(1, out_b + 1);
    struct mscx_hostexec_cfg cfg = {in_b, out_b, dt, op, pkt, ITERS, 0, 0, ref_fill, ref_collect, &r};
    mscx_status_t st = mscx_hostexec_run(c->plan, &cfg, err, sizeof(err));
    int bad = 0;
    if (st != MSCX_OK) {
        RFAIL(m, "host executor, %llu bytes: %s", (unsigned long long)size, err);
        bad = 1;
        goto out;
    }
    for (int it = 0; it < ITERS && !bad; it++) {
        fill(c->host, in_b, dt, m->rank, (uint32_t)it, size);
        /* pageable H2D may return before the DMA lands: the kernel's stream does not wait for it */
        if (cudaMemcpy(c->dbuf, c->host, in_b, cudaMemcpyHostToDevice) != cudaSuccess ||
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
        st = mscx_exec_launch(c->ex, c->pid, c->dbuf, c->dbuf, size, dt, op, pkt, c->st);
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
        cudaMemcpy(c->host, c->dbuf, out_b, cudaMemcpyDeviceToHost);
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
    if (!bad)
        printf("rank %u: %llu bytes %s/%s/%s: %d launches equal to the host executor\n", m->rank,
               (unsigned long long)size, mscx_dtype_name(dt), mscx_redop_name(op),
               pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", ITERS);
out:
    for (int it = 0; it < ITERS; it++)
        free(r.out[it]);
    return bad;
}

/* Back-to-back launches; rank 0 prints the slowest rank's time per launch. */
static int latency(struct rank_ctx *c, uint64_t size)
{
    struct proc_mesh *m = c->m;
    double mine, all[PROC_MESH_MAX];
    if (proc_mesh_barrier(m) != 0)
        return 1;
    double t0 = now_ms();
    for (int i = 0; i < LAT_ITERS; i++)
        if (mscx_exec_launch(c->ex, c->pid, c->dbuf, c->dbuf, size, MSCX_DT_FP32, MSCX_REDOP_SUM,
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
               "%u processes time-sliced on one GPU)\n",
               g_mode, (unsigned long long)size, worst, LAT_ITERS, m->nranks);
    return 0;
}

static int rank_setup(struct rank_ctx *c, struct proc_mesh *m, const char *path, const char *timeout_ms,
                      int vnodes)
{
    char err[512];
    memset(c, 0, sizeof(*c));
    c->m = m;
    if (mscx_config_override("MSCX_TIMEOUT_MS", timeout_ms) != MSCX_OK ||
        (vnodes && mscx_config_override("MSCX_VIRTUAL_NODES", "2") != MSCX_OK)) {
        RFAIL(m, "config override");
        return 1;
    }
    if (cudaSetDevice(0) != cudaSuccess) {
        RFAIL(m, "cudaSetDevice(0)");
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
    struct mscx_bootstrap bs = {m->rank, m->nranks, m, proc_mesh_allgather};
    mscx_status_t st = mscx_exec_create(&bs, 0, &c->ex);
    if (st == MSCX_OK)
        st = mscx_exec_add_plan(c->ex, c->plan, 65536, &c->pid);
    if (st != MSCX_OK) {
        RFAIL(m, "executor setup (create + add_plan, collective): %s (the WARN above says why)",
              mscx_status_str(st));
        return 1;
    }
    if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&c->dbuf, 65536 * 2) != cudaSuccess || !(c->host = malloc(65536 * 2))) {
        RFAIL(m, "stream or buffer allocation failed");
        return 1;
    }
    return 0;
}

static void rank_teardown(struct rank_ctx *c)
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

static int rank_run(struct proc_mesh *m, const char *path, int vnodes)
{
    static const uint64_t sizes[] = {1024, 4096 + 16, 65536};
    struct rank_ctx c;
    if (rank_setup(&c, m, path, "20000", vnodes))
        return 1;
    int bad = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !bad; i++)
        bad |= check_size(&c, sizes[i], MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16);
    if (!bad)
        bad |= check_size(&c, 4096, MSCX_DT_UINT32, MSCX_REDOP_MAX, MSCX_PKT_LL8);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !bad; i++)
        bad |= latency(&c, sizes[i]);
    if (!bad && proc_mesh_barrier(m) != 0) {
        RFAIL(m, "final barrier");
        bad = 1;
    }
    rank_teardown(&c);
    return bad;
}

static int rank_kill(struct proc_mesh *m, const char *path)
{
    struct rank_ctx c;
    char to[32];
    snprintf(to, sizeof(to), "%d", KILL_TIMEOUT_MS);
    if (rank_setup(&c, m, path, to, 1))
        return 1;
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
        if (ms > KILL_TIMEOUT_MS + 10000) {
            RFAIL(m, "the error took %.0f ms, more than MSCX_TIMEOUT_MS %d + 10 s", ms, KILL_TIMEOUT_MS);
            return 1;
        }
        double t1 = now_ms();
        rank_teardown(&c);
        printf("rank %u: destroy with a dead peer took %.0f ms\n", m->rank, now_ms() - t1);
        return 0;
    }
    RFAIL(m, "100 launches completed without an error although rank 2 is dead");
    return 1;
}

/* Exit status of a child that counts the GPUs (CUDA stays uninitialised in this process). */
static int gpu_present(void)
{
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 77);
    }
    int code = 77;
    return p > 0 && proc_mesh_wait(&p, 1, 60, &code) == 0 && code == 0;
}

int main(int argc, char **argv)
{
    g_mode = argc > 1 ? argv[1] : "ipc";
    const char *path;
    uint32_t n;
    int kill_mode = strcmp(g_mode, "kill") == 0;
    if (strcmp(g_mode, "ipc") == 0) {
        path = MSCX_SOURCE_ROOT "/plans/allreduce_n2_rpn2_oneshot_1K_64K.json";
        n = 2;
    } else if (strcmp(g_mode, "twonode") == 0 || strcmp(g_mode, "cudaport") == 0 || kill_mode) {
        path = MSCX_SOURCE_ROOT "/plans/allreduce_n4_rpn2_hier2_1K_64K.json";
        n = 4;
    } else {
        fprintf(stderr, "unknown mode %s (ipc, twonode, cudaport, kill)\n", g_mode);
        return 2;
    }
    if (argc > 2)
        path = argv[2];
    if (!gpu_present()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    printf("%s: %s, %u processes on GPU 0\n", g_mode, path, n);
    fflush(stdout);
    struct proc_mesh m;
    pid_t pids[PROC_MESH_MAX];
    int r = proc_mesh_fork(&m, n, 120000, pids);
    if (r >= 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        int rc = kill_mode ? rank_kill(&m, path) : rank_run(&m, path, strcmp(g_mode, "twonode") == 0);
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
    printf("%s: %s\n", g_mode, bad ? "FAILED" : "passed");
    return bad;
}
