/* SPDX-License-Identifier: MIT */
/*
 * The peerbufs mode of the multi-process GPU test (test_gpu_mproc.c runs it):
 * MSCCL++ DSL op plans whose ops read or write a peer's input or output
 * buffer, one rank per process, user buffers registered across processes.
 * Each rank's input and output are compared with the host executor over
 * launches with reused, new and freed-and-reallocated buffers and the replays
 * of a captured CUDA graph, followed by two launches every rank must refuse:
 * a buffer in managed memory, and a new buffer under graph capture. Last,
 * launches on more new buffers than a context keeps mapped, back to back:
 * each one past the limit closes a peer's oldest mapping while earlier
 * kernels may still run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "mscx/exec.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "plan_model.h"
#include "proc_mesh.h"
#include "mproc_int.h"

/* ---- peerbufs: user buffers of peers in other processes ---- */

#define UITERS 6   /* eager launches: buffers reused, new, freed and reallocated */
#define UREPLAYS 3 /* replays of the captured launch */
#define UREF (UITERS + UREPLAYS + 1)
#define UEVICT 70 /* new buffers in a row, past the 64 mappings a context keeps */

struct uref {
    enum mscx_dtype dt;
    uint32_t rank;
    uint64_t size;
    uint8_t *out[UREF], *in[UREF];
};

static void uref_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                      uint64_t out_bytes)
{
    struct uref *r = ctx;
    fill(out, out_bytes, r->dt, rank, iter, r->size + 1);
    fill(in, in_bytes, r->dt, rank, iter, r->size);
}

static void uref_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                         const void *out, uint64_t out_bytes)
{
    struct uref *r = ctx;
    if (rank == r->rank && iter < UREF) {
        memcpy(r->out[iter], out, out_bytes);
        memcpy(r->in[iter], in, in_bytes);
    }
}

struct ucase {
    struct rank_ctx *c;
    struct uref *ref;
    uint64_t size, in_b, out_b;
};

/* Fill @p base's input and output with launch @p it's values (as uref_fill) and wait until they landed. */
static int ufill(struct ucase *u, uint8_t *base, uint32_t it)
{
    uint8_t *din, *dout;
    struct rank_ctx *c = u->c;
    layout(c->plan, c->m->rank, u->in_b, u->out_b, base, &din, &dout);
    fill(c->host, u->out_b, u->ref->dt, c->m->rank, it, u->size + 1);
    int bad = cudaMemcpy(dout, c->host, u->out_b, cudaMemcpyHostToDevice) != cudaSuccess ||
              cudaDeviceSynchronize() != cudaSuccess;
    fill(c->host, u->in_b, u->ref->dt, c->m->rank, it, u->size);
    bad |= cudaMemcpy(din, c->host, u->in_b, cudaMemcpyHostToDevice) != cudaSuccess ||
           cudaDeviceSynchronize() != cudaSuccess;
    if (bad)
        RFAIL(c->m, "filling the buffers of launch %u failed", it);
    return bad;
}

/* After a launch: wait, check errors, let every rank finish (peers write our buffers), compare. */
static int ucheck(struct ucase *u, uint8_t *base, uint32_t it, const char *what)
{
    struct rank_ctx *c = u->c;
    struct proc_mesh *m = c->m;
    uint8_t *din, *dout;
    layout(c->plan, m->rank, u->in_b, u->out_b, base, &din, &dout);
    cudaError_t ce = cudaStreamSynchronize(c->st);
    if (ce != cudaSuccess) {
        RFAIL(m, "%s: cudaStreamSynchronize: %s", what, cudaGetErrorString(ce));
        return 1;
    }
    mscx_status_t st = mscx_exec_async_error(c->ex);
    if (st != MSCX_OK) {
        report_error(m, c->ex, st, what);
        return 1;
    }
    if (proc_mesh_barrier(m) != 0) {
        RFAIL(m, "%s: barrier after the launch failed", what);
        return 1;
    }
    for (int t = 0; t < 2; t++) {
        uint64_t nb = t ? u->out_b : u->in_b;
        const uint8_t *want = t ? u->ref->out[it] : u->ref->in[it];
        if (cudaMemcpy(c->host, t ? dout : din, nb, cudaMemcpyDeviceToHost) != cudaSuccess) {
            RFAIL(m, "%s: cudaMemcpy back failed", what);
            return 1;
        }
        if (memcmp(c->host, want, nb) != 0) {
            uint64_t at = 0;
            while (c->host[at] == want[at])
                at++;
            RFAIL(m, "%s: %s differs from the host executor at byte %llu of %llu", what,
                  t ? "output" : "input", (unsigned long long)at, (unsigned long long)nb);
            return 1;
        }
    }
    return 0;
}

static int ulaunch(struct ucase *u, uint8_t *base, uint32_t it, const char *what)
{
    struct rank_ctx *c = u->c;
    uint8_t *din, *dout;
    layout(c->plan, c->m->rank, u->in_b, u->out_b, base, &din, &dout);
    if (ufill(u, base, it))
        return 1;
    if (proc_mesh_barrier(c->m) != 0) {
        RFAIL(c->m, "%s: barrier failed", what);
        return 1;
    }
    mscx_status_t st =
        mscx_exec_launch(c->ex, c->pid, din, dout, u->size, u->ref->dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, c->st);
    if (st != MSCX_OK) {
        RFAIL(c->m, "%s: launch: %s", what, mscx_status_str(st));
        return 1;
    }
    return ucheck(u, base, it, what);
}

/* A launch every rank must refuse with MSCX_ERR_UNSUPPORTED (rank @p odd uses @p odd_base, the others @p
 * base). */
static int urefused(struct ucase *u, uint8_t *base, uint32_t odd, uint8_t *odd_base, int capture,
                    const char *what)
{
    struct rank_ctx *c = u->c;
    uint8_t *b = c->m->rank == odd ? odd_base : base, *din, *dout;
    layout(c->plan, c->m->rank, u->in_b, u->out_b, b, &din, &dout);
    if (proc_mesh_barrier(c->m) != 0)
        return 1;
    cudaGraph_t g = NULL;
    if (capture && cudaStreamBeginCapture(c->st, cudaStreamCaptureModeGlobal) != cudaSuccess) {
        RFAIL(c->m, "%s: cudaStreamBeginCapture failed", what);
        return 1;
    }
    mscx_status_t st =
        mscx_exec_launch(c->ex, c->pid, din, dout, u->size, u->ref->dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, c->st);
    if (capture) {
        cudaError_t ce = cudaStreamEndCapture(c->st, &g);
        if (ce != cudaSuccess) {
            RFAIL(c->m, "%s: cudaStreamEndCapture: %s (a refused launch must leave the capture intact)", what,
                  cudaGetErrorString(ce));
            return 1;
        }
        size_t nodes = 0;
        cudaGraphGetNodes(g, NULL, &nodes);
        cudaGraphDestroy(g);
        if (nodes != 0) {
            RFAIL(c->m, "%s: the refused launch captured %zu nodes", what, nodes);
            return 1;
        }
    }
    if (st != MSCX_ERR_UNSUPPORTED) {
        RFAIL(c->m, "%s: launch returned %s, expected MSCX_ERR_UNSUPPORTED on every rank", what,
              mscx_status_str(st));
        return 1;
    }
    if (cudaStreamSynchronize(c->st) != cudaSuccess || mscx_exec_async_error(c->ex) != MSCX_OK) {
        RFAIL(c->m, "%s: an error after a refused launch", what);
        return 1;
    }
    printf("rank %u: %s: refused with MSCX_ERR_UNSUPPORTED as expected\n", c->m->rank, what);
    return 0;
}

/*
 * UEVICT launches, each on new buffers, with no wait between them: past the
 * mappings a context keeps, each launch closes a peer's oldest one, and the
 * executor must first wait for the kernels that may still use it. Every
 * buffer then holds the host executor's result of launch @p it.
 */
static int ueviction(struct ucase *u, uint32_t it)
{
    struct rank_ctx *c = u->c;
    uint8_t *bufs[UEVICT] = {0};
    char what[160];
    int bad = 0, n = 0;
    while (n < UEVICT && !bad) {
        if (cudaMalloc((void **)&bufs[n], BUF_BYTES) != cudaSuccess) {
            RFAIL(c->m, "eviction: cudaMalloc of buffer %d failed", n);
            bad = 1;
            break;
        }
        bad = ufill(u, bufs[n++], it);
    }
    if (!bad && proc_mesh_barrier(c->m) != 0) {
        RFAIL(c->m, "eviction: barrier failed");
        bad = 1;
    }
    for (int k = 0; k < n && !bad; k++) {
        uint8_t *din, *dout;
        layout(c->plan, c->m->rank, u->in_b, u->out_b, bufs[k], &din, &dout);
        mscx_status_t st = mscx_exec_launch(c->ex, c->pid, din, dout, u->size, u->ref->dt, MSCX_REDOP_SUM,
                                            MSCX_PKT_LL16, c->st);
        if (st != MSCX_OK) {
            RFAIL(c->m, "eviction: launch %d of %d: %s", k, UEVICT, mscx_status_str(st));
            bad = 1;
        }
    }
    for (int k = 0; k < n && !bad; k++) {
        snprintf(what, sizeof(what), "%s eviction launch %d of %d", mscx_plan_name(c->plan), k, UEVICT);
        bad |= ucheck(u, bufs[k], it, what);
    }
    if (!bad)
        printf("rank %u: %d launches on new buffers back to back: every one equal to the host executor\n",
               c->m->rank, UEVICT);
    for (int k = 0; k < n; k++)
        cudaFree(bufs[k]);
    return bad;
}

/* The lowest rank whose input or output buffer a rank of another process reaches (one rank per process). */
uint32_t first_exporter(const struct mscx_plan *plan)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t r = 0; r < plan->nranks; r++)
        for (uint32_t i = 0; i < plan->gpus[r].nrbuf; i++) {
            const struct mscx_rbuf *rb = &plan->gpus[r].rbuf[i];
            if (rb->type != MSCX_BUF_SCRATCH && rb->rank != r && rb->rank < best)
                best = rb->rank;
        }
    return best;
}

int rank_peerbufs(struct proc_mesh *m, const char *path)
{
    static const uint64_t sizes[] = {4096 + 16, 1024, 65536};
    struct rank_ctx c;
    if (rank_setup(&c, m, path, "20000", 0))
        return 1;
    struct uref ref;
    memset(&ref, 0, sizeof(ref));
    ref.dt = MSCX_DT_FP32;
    ref.rank = m->rank;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && !ref.size; i++)
        if (size_ok(c.plan, sizes[i], MSCX_DT_FP32, MSCX_REDOP_SUM))
            ref.size = sizes[i];
    struct ucase u = {&c, &ref, ref.size, 0, 0};
    uint8_t *bufB = NULL, *bufC = NULL, *bufD = NULL, *bufM = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t gexec = NULL;
    int bad = 0;
    char err[512], what[160];
    if (!ref.size) {
        RFAIL(m, "the plan takes none of 4112, 1024, 65536 bytes fp32");
        bad = 1;
        goto out;
    }
    mscx_coll_sizes(mscx_plan_collective(c.plan), m->nranks, ref.size, &u.in_b, &u.out_b);
    for (int it = 0; it < UREF; it++) {
        ref.out[it] = calloc(1, u.out_b + 1);
        ref.in[it] = calloc(1, u.in_b + 1);
    }
    struct mscx_hostexec_cfg cfg = {u.in_b, u.out_b, ref.dt,    MSCX_REDOP_SUM, MSCX_PKT_LL16, UREF,
                                    0,      0,       uref_fill, uref_collect,   &ref};
    if (mscx_hostexec_run(c.plan, &cfg, err, sizeof(err)) != MSCX_OK) {
        RFAIL(m, "host executor: %s", err);
        bad = 1;
        goto out;
    }
    /*
     * Launch buffers: A (c.dbuf) first used, reused; B new; B freed and C
     * allocated (often at B's address: a new allocation the caches must not
     * take for B); A again; C again.
     */
    for (uint32_t it = 0; it < UITERS && !bad; it++) {
        uint8_t *base = c.dbuf;
        const char *kind = "buffer A";
        if (it == 2) {
            if (cudaMalloc((void **)&bufB, BUF_BYTES) != cudaSuccess) {
                RFAIL(m, "cudaMalloc B");
                bad = 1;
                break;
            }
            base = bufB;
            kind = "new buffer B";
        } else if (it == 3) {
            uint8_t *oldB = bufB;
            cudaFree(bufB);
            bufB = NULL;
            if (cudaMalloc((void **)&bufC, BUF_BYTES) != cudaSuccess) {
                RFAIL(m, "cudaMalloc C");
                bad = 1;
                break;
            }
            base = bufC;
            kind = bufC == oldB ? "buffer C, reallocated at B's freed address" : "buffer C, after freeing B";
        } else if (it == 5) {
            base = bufC;
            kind = "buffer C again";
        } else if (it > 0) {
            kind = "buffer A again";
        }
        snprintf(what, sizeof(what), "%s launch %u (%s)", mscx_plan_name(c.plan), it, kind);
        bad |= ulaunch(&u, base, it, what);
        if (!bad)
            printf("rank %u: %s: input and output equal to the host executor\n", m->rank, what);
    }
    /* a graph captured with registered buffers, replayed with new contents */
    if (!bad) {
        uint8_t *din, *dout;
        layout(c.plan, m->rank, u.in_b, u.out_b, c.dbuf, &din, &dout);
        if (proc_mesh_barrier(m) != 0 ||
            cudaStreamBeginCapture(c.st, cudaStreamCaptureModeGlobal) != cudaSuccess) {
            RFAIL(m, "capture: begin failed");
            bad = 1;
            goto out;
        }
        mscx_status_t st =
            mscx_exec_launch(c.ex, c.pid, din, dout, u.size, ref.dt, MSCX_REDOP_SUM, MSCX_PKT_LL16, c.st);
        cudaError_t ce = cudaStreamEndCapture(c.st, &graph);
        if (st != MSCX_OK || ce != cudaSuccess || cudaGraphInstantiate(&gexec, graph, 0) != cudaSuccess) {
            RFAIL(m, "capture: launch %s, end capture %s", mscx_status_str(st), cudaGetErrorString(ce));
            bad = 1;
            goto out;
        }
        for (uint32_t k = 0; k < UREPLAYS && !bad; k++) {
            uint32_t it = UITERS + k;
            snprintf(what, sizeof(what), "%s graph replay %u", mscx_plan_name(c.plan), k);
            if (ufill(&u, c.dbuf, it) || proc_mesh_barrier(m) != 0 ||
                cudaGraphLaunch(gexec, c.st) != cudaSuccess) {
                RFAIL(m, "%s: fill, barrier or cudaGraphLaunch failed", what);
                bad = 1;
                break;
            }
            bad |= ucheck(&u, c.dbuf, it, what);
            if (!bad)
                printf("rank %u: %s: input and output equal to the host executor\n", m->rank, what);
        }
    }
    /* refusals: the same on every rank, nothing enqueued, the exchange stays in step */
    uint32_t e = first_exporter(c.plan);
    if (!bad) {
        if (cudaMallocManaged((void **)&bufM, BUF_BYTES, cudaMemAttachGlobal) != cudaSuccess) {
            RFAIL(m, "cudaMallocManaged failed");
            bad = 1;
            goto out;
        }
        snprintf(what, sizeof(what), "%s: rank %u's buffers in managed memory", mscx_plan_name(c.plan), e);
        bad |= urefused(&u, c.dbuf, e, bufM, 0, what);
    }
    if (!bad) {
        if (cudaMalloc((void **)&bufD, BUF_BYTES) != cudaSuccess) {
            RFAIL(m, "cudaMalloc D failed");
            bad = 1;
            goto out;
        }
        snprintf(what, sizeof(what), "%s: rank %u's new buffer first used under graph capture",
                 mscx_plan_name(c.plan), e);
        bad |= urefused(&u, c.dbuf, e, bufD, 1, what);
    }
    if (!bad) {
        snprintf(what, sizeof(what), "%s launch after the refusals (buffer C)", mscx_plan_name(c.plan));
        bad |= ulaunch(&u, bufC, UREF - 1, what);
        if (!bad)
            printf("rank %u: %s: input and output equal to the host executor\n", m->rank, what);
    }
    if (!bad)
        bad |= ueviction(&u, 0);
    if (!bad && proc_mesh_barrier(m) != 0) {
        RFAIL(m, "final barrier");
        bad = 1;
    }
out:
    if (gexec)
        cudaGraphExecDestroy(gexec);
    if (graph)
        cudaGraphDestroy(graph);
    rank_teardown(&c);
    cudaFree(bufB);
    cudaFree(bufC);
    cudaFree(bufD);
    cudaFree(bufM);
    for (int it = 0; it < UREF; it++) {
        free(ref.out[it]);
        free(ref.in[it]);
    }
    return bad;
}
