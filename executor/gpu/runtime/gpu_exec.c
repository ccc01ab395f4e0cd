/* SPDX-License-Identifier: MIT */
/*
 * Host side of the GPU executor: contexts, plan upload, scratch and CUDA IPC
 * exchange, launches. The kernel is in kernels/exec_kernel.cu; the device
 * layout in launch_abi.h.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "mscx/exec.h"
#include "mscx/env.h"
#include "mscx/log.h"
#include "mscx/trace.h"
#include "plan_int.h"
#include "launch_abi.h"
#include "onerank.h"
#include "gpu_port.h"
#include "peer_buffers.h"

#define MSCX_GPU_MAX_PLANS 64

/* What a rank tells its peers about one plan context. */
struct gpu_rec {
    int64_t pid;
    uint64_t host;        /* host identity: a pid names a process only together with it */
    int32_t device;
    int32_t vnodes;       /* MSCX_VIRTUAL_NODES as this rank read it */
    uint64_t ctx_dev;     /* struct mscx_gpu_ctx * in the owner's address space */
    uint64_t scratch_dev;
    uint64_t scratch_bytes; /* allocated; its half is the fixed offset of the even-flag launches */
    cudaIpcMemHandle_t ctx_ipc;
    cudaIpcMemHandle_t scratch_ipc;
};

/* compiled programs kept per plan context (sizes, dtypes and packet formats seen) and their arena */
#define MSCX_GPU_KP_ENTRIES 64
#define MSCX_GPU_KP_ARENA (256u * 1024u)

struct gpu_plan {
    const struct mscx_plan *plan;
    uint32_t ntb, nthreads;
    char *d_ctx;           /* the context allocation: struct mscx_gpu_ctx + tables */
    size_t ctx_bytes;
    size_t off_ops, off_tb, off_rbuf, off_sem, off_bflag, off_tok[MSCX_CHAN_COUNT], off_exp[MSCX_CHAN_COUNT],
        off_pin[MSCX_CHAN_COUNT];
    char *scratch;
    uint64_t scratch_bytes;
    uint64_t scratch_half;  /* fixed per context: scratch_bytes / 2 when double buffered, else 0 */
    char *tmp;             /* staging for calls whose in-place-ness differs from the plan's */
    uint64_t tmp_bytes;
    struct gpu_rec *recs;  /* [nranks] */
    void **opened;         /* [2 * nranks] IPC mappings to close */
    int ready;
    uint32_t smem_ops;     /* ops staged in shared memory per block (0: none) */
    uint32_t ngeom;        /* geometry classes; geom_rank[c] represents class c (class 0: this rank) */
    uint32_t geom_rank[MSCX_GPU_MAX_GEOM];
    int reduce;            /* the plan has reduction ops */
    int idle;              /* this rank's program is only nops: no kernel is needed */
    int ident;             /* one rank, the identity program (mscx_gpu_onerank_identity): no kernel either */
    int pdl;               /* launch with programmatic dependent launch (pdl_usable) */
    int publish, sys_scope; /* copies of the context's flags (kernel arguments) */
    struct mscx_dev_op *h_ops;      /* the uploaded op image (sync marks set), for the launch compiler */
    struct mscx_kp_rbuf *kp_rbuf;   /* [nrbuf] remote buffers as the compiler sees them */
    /*
     * Compiled programs, one per (size, dtype, packet format) seen, appended
     * to an arena in device memory (and its pinned mirror, the copy source)
     * and never freed before the context: a captured graph keeps pointing at
     * its program. When the arena is full, new sizes run the interpreter.
     */
    struct mscx_program *kp_tmp;      /* the compiler's output before encoding */
    char *kp_dev, *kp_pin;
    size_t kp_cap, kp_used;
    uint32_t kp_nent;
    int kp_full_said;
    struct kp_ent {
        uint64_t msg;
        int dtype, pkt;
        size_t off;
        uint32_t stride, kmax_ops, kmax_opnd, interp_mask;
        int split;    /* for out-of-place calls on an in-place AllReduce plan (mscx_gpu_kp_split) */
        int usable;   /* 0: a split program that cannot be had at this shape (remembered, not retried) */
        int alias;    /* out-of-place plan: the program may run an in-place call as it is (mscx_gpu_kp_alias_ok) */
        int whole;    /* every block compiled, no GENERIC entry */
        int packet;   /* whole, and every entry a packet kind (mscx_gpu_kp_packet_only) */
        int uploaded; /* copied outside capture (a copy captured in a graph runs only with it) */
    } kp_ent[MSCX_GPU_KP_ENTRIES];
    int c_pkt;
    int c_kent;                     /* the cached launch's program: kp_ent index, -1: none */
    int c_kent_split;               /* its split form for out-of-place calls: index, -1: none, -2: not looked up */
    struct mscx_trace_rec *d_trace; /* MSCX_TRACE: [ntb][MSCX_TRACE_CAP] device records */
    uint32_t *d_trace_n;            /* [ntb] ring positions */
    struct gpu_port *port;  /* port channels through the CPU proxy (NULL: none) */
    struct peer_bufs *peer_bufs; /* user buffers shared with other processes (NULL: none) */
    /* launch cache */
    uint64_t c_msg;
    int c_dtype;
    struct mscx_gpu_args c_args;
};

struct local_group {
    uint32_t nranks;
    uint32_t refs;
    struct mscx_exec **execs;
    uint32_t added[MSCX_GPU_MAX_PLANS];
};

struct mscx_exec {
    struct mscx_bootstrap bs;
    int device;
    struct mscx_gpu_host *host;     /* mapped */
    struct mscx_gpu_host *host_dev; /* its device view */
    struct local_group *group;
    int traced; /* MSCX_TRACE was set at create: plans record per-op times */
    struct gpu_net *net;            /* proxy streams and TCP endpoint (NULL until a plan needs them) */
    cudaStream_t ustream;           /* compiled program uploads (NULL until the first) */
    uint32_t nplans;
    struct gpu_plan plans[MSCX_GPU_MAX_PLANS];
};

/* ---- MSCX_TRACE: records of every traced executor of the process, written when the last one goes ---- */

#define MSCX_TRACE_CAP 8192u /* records kept per thread block (the latest ones) */

static struct {
    pthread_mutex_t lock;
    uint32_t live;                  /* executors created while tracing is on and not yet destroyed */
    uint32_t lowest_rank;
    struct mscx_trace_block *blocks;
    size_t nblocks, cap;
} g_trace = {PTHREAD_MUTEX_INITIALIZER, 0, UINT32_MAX, NULL, 0, 0};

static int trace_on(void)
{
    const struct mscx_config *cfg;
    return mscx_config_get(&cfg) == MSCX_OK && cfg->trace && cfg->trace[0];
}

/* MSCX_TRACE with %p replaced by the pid and %r by the lowest rank of the process. */
static void trace_path(const char *tmpl, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = tmpl; *p && o + 1 < len; p++) {
        if (p[0] == '%' && (p[1] == 'p' || p[1] == 'r')) {
            int k = snprintf(out + o, len - o, "%lu",
                             p[1] == 'p' ? (unsigned long)getpid() : (unsigned long)g_trace.lowest_rank);
            o += k > 0 ? (size_t)k : 0;
            if (o >= len)
                o = len - 1;
            p++;
            continue;
        }
        out[o++] = *p;
    }
    out[o] = '\0';
}

/* Called with g_trace.lock held: the last traced executor of the process is gone. */
static void trace_flush_locked(void)
{
    const struct mscx_config *cfg;
    char path[4096];
    size_t nev = 0;
    if (g_trace.nblocks && mscx_config_get(&cfg) == MSCX_OK) {
        trace_path(cfg->trace, path, sizeof(path));
        mscx_status_t st = mscx_trace_save(path, "mscx executor", g_trace.blocks, g_trace.nblocks, &nev);
        if (st == MSCX_OK)
            MSCX_INFO(MSCX_SUB_EXEC, "MSCX_TRACE: wrote %zu op records of %zu thread blocks to %s", nev,
                      g_trace.nblocks, path);
        else
            MSCX_WARN("MSCX_TRACE: cannot write %s: %s", path, mscx_status_str(st));
    }
    for (size_t i = 0; i < g_trace.nblocks; i++)
        free((void *)g_trace.blocks[i].recs);
    free(g_trace.blocks);
    g_trace.blocks = NULL;
    g_trace.nblocks = g_trace.cap = 0;
    g_trace.lowest_rank = UINT32_MAX;
}

/* Copy one plan's rings back (oldest record first) and keep them for the trace file. */
static void trace_collect(uint32_t rank, uint32_t plan_id, const struct gpu_plan *gp)
{
    uint32_t *pos = calloc(gp->ntb ? gp->ntb : 1, sizeof(uint32_t));
    struct mscx_trace_rec *all = malloc((size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(*all));
    if (!pos || !all || cudaMemcpy(pos, gp->d_trace_n, gp->ntb * sizeof(uint32_t), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(all, gp->d_trace, (size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(*all), cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
        MSCX_WARN("MSCX_TRACE: rank %u plan %u: cannot read the trace records back", rank, plan_id);
        free(pos);
        free(all);
        return;
    }
    pthread_mutex_lock(&g_trace.lock);
    for (uint32_t b = 0; b < gp->ntb; b++) {
        uint32_t n = pos[b] < MSCX_TRACE_CAP ? pos[b] : MSCX_TRACE_CAP;
        if (n == 0)
            continue;
        if (g_trace.nblocks == g_trace.cap) {
            size_t nc = g_trace.cap ? 2 * g_trace.cap : 64;
            struct mscx_trace_block *nb = realloc(g_trace.blocks, nc * sizeof(*nb));
            if (!nb)
                break;
            g_trace.blocks = nb;
            g_trace.cap = nc;
        }
        struct mscx_trace_rec *r = malloc(n * sizeof(*r));
        if (!r)
            break;
        uint32_t first = pos[b] - n; /* ring order: the oldest kept record first */
        for (uint32_t i = 0; i < n; i++)
            r[i] = all[(size_t)b * MSCX_TRACE_CAP + (first + i) % MSCX_TRACE_CAP];
        /* one track per (rank, block); a second plan of the same rank gets blocks from 1000 * plan_id */
        g_trace.blocks[g_trace.nblocks++] = (struct mscx_trace_block){rank, plan_id * 1000u + b, r, n};
    }
    if (rank < g_trace.lowest_rank)
        g_trace.lowest_rank = rank;
    pthread_mutex_unlock(&g_trace.lock);
    free(pos);
    free(all);
}

static mscx_status_t gpu_check(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return MSCX_OK;
    MSCX_WARN("cuda error: %s: %s", what, cudaGetErrorString(rc));
    return MSCX_ERR_CUDA;
}

#define GPU_CHECK_GOTO(call, st, label)                                                                      \
    do {                                                                                                     \
        if (((st) = gpu_check((call), #call)) != MSCX_OK)                                                    \
            goto label;                                                                                      \
    } while (0)

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p)
{
    mscx_status_t st;
    struct mscx_exec *ex;
    if (!bs || !exec_p || bs->rank >= bs->nranks)
        return MSCX_ERR_INVALID_ARG;
    ex = calloc(1, sizeof(*ex));
    if (!ex)
        return MSCX_ERR_NO_MEMORY;
    ex->bs = *bs;
    ex->device = cuda_device;
    GPU_CHECK_GOTO(cudaSetDevice(cuda_device), st, fail);
    GPU_CHECK_GOTO(cudaHostAlloc((void **)&ex->host, sizeof(*ex->host), cudaHostAllocMapped), st, fail);
    memset(ex->host, 0, sizeof(*ex->host));
    GPU_CHECK_GOTO(cudaHostGetDevicePointer((void **)&ex->host_dev, ex->host, 0), st, fail);
    if (trace_on()) {
        ex->traced = 1;
        pthread_mutex_lock(&g_trace.lock);
        g_trace.live++;
        pthread_mutex_unlock(&g_trace.lock);
    }
    *exec_p = ex;
    return MSCX_OK;
fail:
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    free(ex);
    return st;
}

/* Layout of the context allocation of @p gp for @p gpu. */
static void ctx_layout(struct gpu_plan *gp, const struct mscx_gpu *gpu)
{
    size_t o = align_up(sizeof(struct mscx_gpu_ctx), 64);
    gp->off_ops = o;
    o = align_up(o + (size_t)gpu->nops * sizeof(struct mscx_dev_op), 64);
    gp->off_tb = o;
    o = align_up(o + (size_t)(gpu->ntb + 1) * sizeof(uint32_t), 64);
    gp->off_rbuf = o;
    o = align_up(o + (size_t)gpu->nrbuf * sizeof(struct mscx_gpu_rbuf), 64);
    gp->off_sem = o;
    o = align_up(o + (size_t)gpu->nsem * sizeof(int32_t), 64);
    gp->off_bflag = o;
    o = align_up(o + (size_t)gpu->ntb * sizeof(uint32_t), 64);
    for (int t = 0; t < MSCX_CHAN_COUNT; t++) {
        uint32_t n = (t == MSCX_CHAN_MEMORY || t == MSCX_CHAN_PORT) ? gpu->nchan[t] : 0;
        gp->off_tok[t] = o;
        o = align_up(o + n * 8u, 64);
        gp->off_exp[t] = o;
        o = align_up(o + n * 8u, 64);
        gp->off_pin[t] = o;
        o = align_up(o + n * sizeof(void *), 64);
    }
    gp->ctx_bytes = o;
}

/* Geometry class of rank @p o's chunk counts (registered by setup_geoms). */
static uint32_t geom_class(const struct gpu_plan *gp, uint32_t o)
{
    const struct mscx_gpu *g = &gp->plan->gpus[o];
    for (uint32_t c = 0; c < gp->ngeom; c++) {
        if (mscx_gpu_same_chunks(&gp->plan->gpus[gp->geom_rank[c]], g))
            return c;
    }
    return 0; /* not reached: setup_geoms registered every owner */
}

/*
 * Register the chunk geometries of this rank and of every owner of a remote
 * buffer it names: remote operands use the owner's geometry. Also notes
 * whether the plan reduces and the shared-memory staging of ops.
 */
static mscx_status_t setup_geoms(struct gpu_plan *gp, uint32_t rank)
{
    const struct mscx_plan *plan = gp->plan;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    gp->ngeom = 1;
    gp->geom_rank[0] = rank;
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        uint32_t o = gpu->rbuf[i].rank, c;
        const struct mscx_gpu *g = &plan->gpus[o];
        for (c = 0; c < gp->ngeom; c++)
            if (mscx_gpu_same_chunks(&plan->gpus[gp->geom_rank[c]], g))
                break;
        if (c < gp->ngeom)
            continue;
        if (gp->ngeom == MSCX_GPU_MAX_GEOM) {
            MSCX_WARN("plan %s: rank %u reaches more than %d distinct chunk geometries; refusing", plan->name,
                      rank, MSCX_GPU_MAX_GEOM);
            return MSCX_ERR_UNSUPPORTED;
        }
        gp->geom_rank[gp->ngeom++] = o;
    }
    uint32_t max_ops = 0;
    for (uint32_t b = 0; b < gpu->ntb; b++)
        if (gpu->tb[b].nops > max_ops)
            max_ops = gpu->tb[b].nops;
    gp->smem_ops = (uint64_t)max_ops * sizeof(struct mscx_dev_op) <= 32768 ? max_ops : 0;
    gp->reduce = 0;
    for (uint32_t i = 0; i < gpu->nops; i++)
        if (mscx_opcode_reduces(gpu->ops[i].opcode))
            gp->reduce = 1;
    return MSCX_OK;
}

/* FNV-1a of the host name and the boot id: ranks on one host and boot share it. */
static uint64_t host_identity(void)
{
    char buf[320] = {0};
    uint64_t h = 1469598103934665603ull;
    if (gethostname(buf, 255) != 0)
        buf[0] = '\0';
    size_t n = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(buf + n, (int)(sizeof(buf) - n), f) == NULL)
            buf[n] = '\0';
        fclose(f);
    }
    for (const char *p = buf; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* Fill the tables of one rank's context once every rank's record is known. */
static mscx_status_t gpu_plan_finalize(struct mscx_exec *ex, struct gpu_plan *gp)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank, n = plan->nranks;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    mscx_status_t st = MSCX_OK;
    int64_t pid = (int64_t)getpid();
    uint64_t host = gp->recs[rank].host;
    char *img = calloc(1, gp->ctx_bytes);
    char **peer_ctx = calloc(n, sizeof(char *)), **peer_scr = calloc(n, sizeof(char *));
    gp->opened = calloc(2u * n, sizeof(void *));
    struct gpu_peer *peers = calloc(n, sizeof(*peers));
    uint32_t *node = calloc(n, sizeof(*node));
    uint32_t *uslot = calloc(gpu->nrbuf ? gpu->nrbuf : 1, sizeof(*uslot));
    if (!img || !peer_ctx || !peer_scr || !gp->opened || !peers || !node || !uslot) {
        st = MSCX_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t r = 0; r < n; r++) {
        peers[r].pid = gp->recs[r].pid;
        peers[r].host = gp->recs[r].host;
        peers[r].vnodes = gp->recs[r].vnodes;
        peers[r].device = gp->recs[r].device;
        peers[r].scratch_bytes = gp->recs[r].scratch_bytes;
    }
    /* every rank checks the whole plan, so that all refuse together (one process: one node) */
    if (!ex->group && ((st = mscx_gpu_topology(plan, peers, node)) != MSCX_OK ||
                       (st = mscx_peer_bufs_check(plan, peers, node)) != MSCX_OK))
        goto out;
    for (uint32_t i = 0; i < gpu->nrbuf; i++)
        uslot[i] = UINT32_MAX;
    if (!ex->group) {
        /* collective (before the port setup on every rank): user buffers that peers in other processes reach */
        const struct mscx_config *cfg;
        if ((st = mscx_config_get(&cfg)) != MSCX_OK)
            goto out;
        struct peer_bufs_setup us = {.plan = plan,
                                    .rank = rank,
                                    .device = ex->device,
                                    .bs = &ex->bs,
                                    .peers = peers,
                                    .node = node,
                                    .timeout_ms = cfg->timeout_ms,
                                    .abort = &ex->host->abort};
        if ((st = mscx_peer_bufs_setup(&us, uslot, &gp->peer_bufs)) != MSCX_OK)
            goto out;
    }
    for (uint32_t r = 0; r < n; r++) {
        const struct gpu_rec *rc = &gp->recs[r];
        if (rc->pid == pid && rc->host == host) {
            peer_ctx[r] = (char *)(uintptr_t)rc->ctx_dev;
            peer_scr[r] = (char *)(uintptr_t)rc->scratch_dev;
            continue;
        }
        if (node[r] != node[rank])
            continue; /* another node: reached only through the proxy's TCP link */
        void *p = NULL;
        GPU_CHECK_GOTO(cudaIpcOpenMemHandle(&p, rc->ctx_ipc, cudaIpcMemLazyEnablePeerAccess), st, out);
        gp->opened[2 * r] = p;
        peer_ctx[r] = p;
        if (rc->scratch_dev) {
            GPU_CHECK_GOTO(cudaIpcOpenMemHandle(&p, rc->scratch_ipc, cudaIpcMemLazyEnablePeerAccess), st, out);
            gp->opened[2 * r + 1] = p;
            peer_scr[r] = p;
        }
    }
    struct mscx_gpu_ctx *c = (struct mscx_gpu_ctx *)img;
    char *d = gp->d_ctx;
    c->host = ex->host_dev;
    c->ntb = gpu->ntb;
    c->nrbuf = gpu->nrbuf;
    c->nsem = gpu->nsem;
    c->scratch = gp->scratch;
    c->scratch_bytes = gp->scratch_bytes;
    c->bflag = (uint32_t *)(d + gp->off_bflag);
    for (uint32_t r = 0; r < n; r++) /* some peer reads this rank's user buffers */
        for (uint32_t i = 0; i < plan->gpus[r].nrbuf; i++)
            if (plan->gpus[r].rbuf[i].rank == rank && plan->gpus[r].rbuf[i].type != MSCX_BUF_SCRATCH)
                c->publish = 1;
    c->ops = (const struct mscx_dev_op *)(d + gp->off_ops);
    c->tb_begin = (const uint32_t *)(d + gp->off_tb);
    c->rbuf = (const struct mscx_gpu_rbuf *)(d + gp->off_rbuf);
    c->sem = (int32_t *)(d + gp->off_sem);
    memcpy(img + gp->off_ops, gpu->ops, (size_t)gpu->nops * sizeof(struct mscx_dev_op));
    mscx_gpu_mark_syncs(plan, rank, (struct mscx_dev_op *)(img + gp->off_ops));
    uint32_t *tb = (uint32_t *)(img + gp->off_tb);
    for (uint32_t b = 0; b < gpu->ntb; b++)
        tb[b] = gpu->tb[b].op_begin;
    tb[gpu->ntb] = gpu->ntb ? gpu->tb[gpu->ntb - 1].op_begin + gpu->tb[gpu->ntb - 1].nops : 0;
    struct mscx_gpu_rbuf *rb = (struct mscx_gpu_rbuf *)(img + gp->off_rbuf);
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        uint32_t o = gpu->rbuf[i].rank;
        rb[i].type = gpu->rbuf[i].type;
        rb[i].geom = geom_class(gp, o);
        rb[i].half = plan->double_scratch ? gp->recs[o].scratch_bytes / 2u : 0;
        if (gp->recs[o].device != gp->recs[rank].device)
            c->sys_scope = 1;
        if (gpu->rbuf[i].type == MSCX_BUF_SCRATCH) {
            rb[i].kind = MSCX_GPU_RBUF_SCRATCH;
            rb[i].ptr = peer_scr[o];
        } else {
            /* another process: the host maps the buffers of each launch (peer_buffers.c), the flag still comes from pub */
            int other = gp->recs[o].pid != pid || gp->recs[o].host != host;
            if (!ex->group && node[o] != node[rank]) {
                /* another node: only proxied port puts reach it (mscx_gpu_topology); its proxy resolves them */
                rb[i].kind = MSCX_GPU_RBUF_NET;
                rb[i].pub = NULL;
                continue;
            }
            if (other != (uslot[i] != UINT32_MAX) || !peer_ctx[o]) {
                MSCX_WARN("internal bug: plan %s: rank %u: remote buffer %u of rank %u has no mapping", plan->name,
                          rank, i, o);
                st = MSCX_ERR_INTERNAL;
                goto out;
            }
            rb[i].kind = other ? MSCX_GPU_RBUF_MAPPED : MSCX_GPU_RBUF_USER;
            rb[i].uslot = other ? uslot[i] : 0;
            rb[i].pub = (struct mscx_gpu_pub *)(peer_ctx[o] + offsetof(struct mscx_gpu_ctx, pub));
        }
    }
    int32_t *sem = (int32_t *)(img + gp->off_sem);
    for (uint32_t i = 0; i < gpu->nsem; i++)
        sem[i] = gpu->sem_init[i];
    for (int t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
        c->nchan[t] = gpu->nchan[t];
        c->inbound[t] = (unsigned long long *)(d + gp->off_tok[t]);
        c->expected[t] = (unsigned long long *)(d + gp->off_exp[t]);
        c->peer_inbound[t] = (unsigned long long **)(d + gp->off_pin[t]);
        void **pin = (void **)(img + gp->off_pin[t]);
        for (uint32_t k = 0; k < gpu->nchan[t]; k++) {
            const struct mscx_chan *ch = &gpu->chan[t][k];
            if (!ch->paired)
                continue;
            if (gp->recs[ch->peer].device != gp->recs[rank].device)
                c->sys_scope = 1;
            if (!peer_ctx[ch->peer]) {
                pin[k] = NULL; /* another node: the proxy signals */
                continue;
            }
            /* peer contexts share our layout rule: recompute the peer's token offset */
            struct gpu_plan tmp;
            ctx_layout(&tmp, &plan->gpus[ch->peer]);
            pin[k] = peer_ctx[ch->peer] + tmp.off_tok[t] + (size_t)ch->pair * 8u;
        }
    }
    if (!ex->group) {
        const struct mscx_config *cfg;
        if ((st = mscx_config_get(&cfg)) != MSCX_OK)
            goto out;
        struct gpu_port_setup ps = {.plan = plan,
                                    .rank = rank,
                                    .device = ex->device,
                                    .bs = &ex->bs,
                                    .peers = peers,
                                    .node = node,
                                    .peer_scr = peer_scr,
                                    .port_tok = (void *const *)(img + gp->off_pin[MSCX_CHAN_PORT]),
                                    .scratch = gp->scratch,
                                    .scratch_bytes = gp->scratch_bytes,
                                    .tok = (unsigned long long *)(d + gp->off_tok[MSCX_CHAN_PORT]),
                                    .ntb = gpu->ntb,
                                    .host = ex->host,
                                    .timeout_ms = cfg->timeout_ms,
                                    .pub = (const struct mscx_gpu_pub *)(d + offsetof(struct mscx_gpu_ctx, pub))};
        if ((st = mscx_gpu_port_setup(&ex->net, &ps, &gp->port, &c->port)) != MSCX_OK)
            goto out;
        if (c->port)
            c->sys_scope = 1; /* tokens and data land from copy engines and other processes */
    }
    GPU_CHECK_GOTO(cudaMemcpy(gp->d_ctx, img, gp->ctx_bytes, cudaMemcpyHostToDevice), st, out);
    gp->h_ops = malloc((gpu->nops ? gpu->nops : 1) * sizeof(struct mscx_dev_op));
    gp->kp_rbuf = calloc(gpu->nrbuf ? gpu->nrbuf : 1, sizeof(struct mscx_kp_rbuf));
    if (!gp->h_ops || !gp->kp_rbuf) {
        st = MSCX_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(gp->h_ops, img + gp->off_ops, (size_t)gpu->nops * sizeof(struct mscx_dev_op));
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        gp->kp_rbuf[i].ptr = rb[i].kind == MSCX_GPU_RBUF_SCRATCH ? (char *)rb[i].ptr : NULL;
        gp->kp_rbuf[i].geom = rb[i].geom;
        gp->kp_rbuf[i].half = rb[i].half;
    }
    gp->publish = (int)c->publish;
    gp->sys_scope = (int)c->sys_scope;
    gp->ready = 1;
out:
    free(img);
    free(peer_ctx);
    free(peer_scr);
    free(peers);
    free(node);
    free(uslot);
    return st;
}

/*
 * Threads per block: the plan's, halved until @p total_blocks all fit on
 * the device at once; *cap_p gets how many blocks of that size fit.
 * @return 0 when none does
 */
static uint32_t pick_threads(const struct mscx_plan *plan, uint32_t total_blocks, uint32_t smem_bytes,
                             uint64_t *cap_p)
{
    int sms = 0, dev = 0;
    uint32_t t = plan->nthreads ? plan->nthreads : 1024;
    if (t > 1024)
        t = 1024;
    t = (t + 31) / 32 * 32;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    for (; t >= 32; t /= 2) {
        int occ = mscx_gpu_kernel_occupancy(t, smem_bytes);
        *cap_p = occ > 0 ? (uint64_t)occ * (uint64_t)sms : 0;
        if (occ > 0 && *cap_p >= total_blocks)
            return t;
        if (t == 32)
            break;
    }
    return 0;
}

/*
 * Whether launches of a plan may use programmatic dependent launch: asked
 * for (MSCX_PDL), a Hopper or later GPU and a driver that has it (CUDA
 * 12.3), and room on the device (@p cap blocks, from pick_threads) for
 * every block of the plan twice over: a launch that starts early waits on
 * its SMs while the launch ahead of it runs (one ahead per stream, see
 * mscx_pdl_allow), and a block of a rank that could not become resident
 * would leave its peers spinning.
 */
static int pdl_usable(uint64_t cap, uint64_t total_blocks)
{
    const struct mscx_config *cfg;
    int dev = 0, major = 0, drv = 0;
    if (mscx_config_get(&cfg) != MSCX_OK || !cfg->pdl || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDriverGetVersion(&drv) != cudaSuccess)
        return 0;
    return major >= 9 && drv >= 12030 && cap >= 2u * total_blocks;
}

mscx_status_t mscx_exec_add_plan(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p)
{
    mscx_status_t st;
    char err[256];
    if (!ex || !plan || !plan_id_p || plan->nranks != ex->bs.nranks)
        return MSCX_ERR_INVALID_ARG;
    if (ex->nplans >= MSCX_GPU_MAX_PLANS)
        return MSCX_ERR_NO_MEMORY;
    if ((st = mscx_plan_executable(plan, err, sizeof(err))) != MSCX_OK) {
        MSCX_WARN("plan %s: %s", plan->name, err);
        return st;
    }
    uint32_t rank = ex->bs.rank, n = plan->nranks;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    uint32_t id = ex->nplans;
    struct gpu_plan *gp = &ex->plans[id];
    memset(gp, 0, sizeof(*gp));
    gp->plan = plan;
    gp->ntb = gpu->ntb;
    gp->c_dtype = -1;
    gp->c_pkt = -1;
    /*
     * A rank whose ops are all nops (the one-rank in-place plans) launches
     * nothing: no packets, signals or peers depend on it, and the launch
     * itself would cost more than the whole collective.
     */
    gp->idle = 1;
    for (uint32_t i = 0; i < gpu->nops; i++)
        if (gpu->ops[i].opcode != MSCX_OP_NOP)
            gp->idle = 0;
    gp->ident = mscx_gpu_onerank_identity(plan, rank);
    uint64_t total_blocks = gpu->ntb;
    if (ex->group) {
        total_blocks = 0;
        for (uint32_t r = 0; r < n; r++)
            total_blocks += plan->gpus[r].ntb;
    }
    GPU_CHECK_GOTO(cudaSetDevice(ex->device), st, fail);
    if ((st = setup_geoms(gp, rank)) != MSCX_OK)
        goto fail;
    uint64_t cap = 0;
    gp->nthreads =
        pick_threads(plan, (uint32_t)total_blocks, gp->smem_ops * (uint32_t)sizeof(struct mscx_dev_op), &cap);
    if (gp->nthreads == 0) {
        MSCX_WARN("plan %s: %llu thread blocks cannot all be resident on device %d even at 32 threads; refusing",
                  plan->name, (unsigned long long)total_blocks, ex->device);
        return MSCX_ERR_UNSUPPORTED;
    }
    gp->pdl = pdl_usable(cap, total_blocks);
    MSCX_INFO(MSCX_SUB_EXEC, "plan %s: %u blocks of %u threads, programmatic dependent launch %s%s",
              plan->name, gp->ntb, gp->nthreads, gp->pdl ? "on" : "off",
              gp->ident ? "; one rank, identity: launches are one device copy, or nothing in place" : "");
    ctx_layout(gp, gpu);
    GPU_CHECK_GOTO(cudaMalloc((void **)&gp->d_ctx, gp->ctx_bytes), st, fail);
    GPU_CHECK_GOTO(cudaMemset(gp->d_ctx, 0, gp->ctx_bytes), st, fail);
    /* fixed halves for double-buffered plans (see mscx_plan_scratch_size) */
    mscx_plan_scratch_size(plan, rank, max_msg_bytes, &gp->scratch_bytes, &gp->scratch_half);
    if (gp->scratch_bytes) {
        GPU_CHECK_GOTO(cudaMalloc((void **)&gp->scratch, gp->scratch_bytes), st, fail);
        GPU_CHECK_GOTO(cudaMemset(gp->scratch, 0, gp->scratch_bytes), st, fail);
    }
    if (ex->traced && gp->ntb) {
        size_t tb = (size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(struct mscx_trace_rec);
        GPU_CHECK_GOTO(cudaMalloc((void **)&gp->d_trace, tb), st, fail);
        GPU_CHECK_GOTO(cudaMalloc((void **)&gp->d_trace_n, gp->ntb * sizeof(uint32_t)), st, fail);
        GPU_CHECK_GOTO(cudaMemset(gp->d_trace, 0, tb), st, fail);
        GPU_CHECK_GOTO(cudaMemset(gp->d_trace_n, 0, gp->ntb * sizeof(uint32_t)), st, fail);
    }
    {
        uint64_t in, out;
        mscx_coll_sizes(plan->coll, n, max_msg_bytes, &in, &out);
        gp->tmp_bytes = in > out ? in : out;
        if (gp->tmp_bytes)
            GPU_CHECK_GOTO(cudaMalloc((void **)&gp->tmp, gp->tmp_bytes), st, fail);
    }
    if (gp->ntb) {
        gp->kp_tmp = malloc(sizeof(*gp->kp_tmp));
        if (!gp->kp_tmp) {
            st = MSCX_ERR_NO_MEMORY;
            goto fail;
        }
        gp->kp_cap = MSCX_GPU_KP_ARENA;
        GPU_CHECK_GOTO(cudaMalloc((void **)&gp->kp_dev, gp->kp_cap), st, fail);
        GPU_CHECK_GOTO(cudaHostAlloc((void **)&gp->kp_pin, gp->kp_cap, cudaHostAllocDefault), st, fail);
    }
    gp->c_kent = -1;
    gp->c_kent_split = -2;
    GPU_CHECK_GOTO(cudaDeviceSynchronize(), st, fail);
    struct gpu_rec mine;
    memset(&mine, 0, sizeof(mine));
    mine.pid = (int64_t)getpid();
    mine.host = host_identity();
    mine.device = ex->device;
    mine.ctx_dev = (uint64_t)(uintptr_t)gp->d_ctx;
    mine.scratch_dev = (uint64_t)(uintptr_t)gp->scratch;
    mine.scratch_bytes = gp->scratch_bytes;
    {
        const struct mscx_config *cfg;
        if ((st = mscx_config_get(&cfg)) != MSCX_OK)
            goto fail;
        mine.vnodes = cfg->virtual_nodes > 1 ? (int32_t)(cfg->virtual_nodes > 65536 ? 65536 : cfg->virtual_nodes) : 0;
    }
    if (!ex->group) {
        GPU_CHECK_GOTO(cudaIpcGetMemHandle(&mine.ctx_ipc, gp->d_ctx), st, fail);
        if (gp->scratch)
            GPU_CHECK_GOTO(cudaIpcGetMemHandle(&mine.scratch_ipc, gp->scratch), st, fail);
    }
    gp->recs = calloc(n, sizeof(*gp->recs));
    if (!gp->recs) {
        st = MSCX_ERR_NO_MEMORY;
        goto fail;
    }
    ex->nplans++;
    *plan_id_p = id;
    if (ex->group) {
        /* in-process group: the last rank to add the plan finalises every rank */
        struct local_group *g = ex->group;
        gp->recs[rank] = mine;
        if (++g->added[id] == n) {
            for (uint32_t r = 0; r < n; r++) {
                /* every rank's own record is in its own recs; share them all */
                for (uint32_t q = 0; q < n; q++)
                    g->execs[r]->plans[id].recs[q] = g->execs[q]->plans[id].recs[q];
            }
            for (uint32_t r = 0; r < n; r++)
                if ((st = gpu_plan_finalize(g->execs[r], &g->execs[r]->plans[id])) != MSCX_OK)
                    return st;
        }
        return MSCX_OK;
    }
    if ((st = ex->bs.allgather(ex->bs.ctx, &mine, gp->recs, sizeof(mine))) != MSCX_OK) {
        MSCX_WARN("plan %s: bootstrap allgather failed: %s", plan->name, mscx_status_str(st));
        return st;
    }
    return gpu_plan_finalize(ex, gp);
fail:
    if (gp->d_trace)
        cudaFree(gp->d_trace);
    if (gp->d_trace_n)
        cudaFree(gp->d_trace_n);
    if (gp->tmp)
        cudaFree(gp->tmp);
    if (gp->scratch)
        cudaFree(gp->scratch);
    if (gp->d_ctx)
        cudaFree(gp->d_ctx);
    memset(gp, 0, sizeof(*gp));
    return st;
}

/*
 * A plan is written for one buffer placement: in-place (the collective's
 * aliasing: allreduce out == in, allgather in == out + rank * in_bytes,
 * reducescatter out == in + rank * out_bytes) or out-of-place. Routing must
 * not depend on pointers, so every call runs whatever its placement: when it
 * differs from the plan's, the data is staged with device copies on the
 * call's stream (graph-capturable) and the plan runs on the placement it
 * expects. The send buffer is never written.
 */
struct alias_plan {
    const void *in;
    void *out;
    const void *pre_src, *post_src;
    void *pre_dst, *post_dst;
    uint64_t pre_bytes, post_bytes;
};

/* Whether a call of the cached geometry is in place by the collective's aliasing rule. */
static int call_is_inplace(const struct gpu_plan *gp, uint32_t rank, const void *send, const void *recv)
{
    const char *s = (const char *)send, *r = (const char *)recv;
    switch (gp->plan->coll) {
    case MSCX_COLL_ALLGATHER:
        return s == r + (uint64_t)rank * gp->c_args.in_bytes;
    case MSCX_COLL_REDUCESCATTER:
        return r == s + (uint64_t)rank * gp->c_args.out_bytes;
    default:
        return s == r;
    }
}

static mscx_status_t alias_adapt(const struct gpu_plan *gp, uint32_t rank, const void *send, void *recv,
                                 struct alias_plan *ap_p)
{
    const struct mscx_plan *plan = gp->plan;
    uint64_t in = gp->c_args.in_bytes, out = gp->c_args.out_bytes;
    char *r = (char *)recv;
    const char *s = (const char *)send;
    struct alias_plan ap = {send, recv, NULL, NULL, NULL, NULL, 0, 0};
    int call_inplace = call_is_inplace(gp, rank, send, recv);
    if (call_inplace == (int)plan->inplace || in == 0) {
        *ap_p = ap;
        return MSCX_OK;
    }
    uint64_t need = plan->inplace && plan->coll != MSCX_COLL_REDUCESCATTER ? 0 : (in > out ? in : out);
    if (need > gp->tmp_bytes) {
        MSCX_WARN("internal bug: plan %s: %llu staging bytes needed, %llu allocated", plan->name,
                  (unsigned long long)need, (unsigned long long)gp->tmp_bytes);
        return MSCX_ERR_INTERNAL;
    }
    if (plan->inplace) {
        switch (plan->coll) {
        case MSCX_COLL_ALLGATHER: /* put our contribution where an in-place call keeps it */
            ap.in = r + (uint64_t)rank * in;
            ap.pre_src = s;
            ap.pre_dst = r + (uint64_t)rank * in;
            ap.pre_bytes = in;
            break;
        case MSCX_COLL_REDUCESCATTER: /* run in place on a copy, then deliver our slice */
            ap.in = gp->tmp;
            ap.out = gp->tmp + (uint64_t)rank * out;
            ap.pre_src = s;
            ap.pre_dst = gp->tmp;
            ap.pre_bytes = in;
            ap.post_src = gp->tmp + (uint64_t)rank * out;
            ap.post_dst = r;
            ap.post_bytes = out;
            break;
        default: /* out == in: start from the input in the output buffer */
            ap.in = r;
            ap.pre_src = s;
            ap.pre_dst = r;
            ap.pre_bytes = in < out ? in : out;
            break;
        }
    } else if (plan->coll == MSCX_COLL_REDUCESCATTER) {
        /* the result would overwrite input the plan still reads: reduce into staging */
        ap.out = gp->tmp;
        ap.post_src = gp->tmp;
        ap.post_dst = r;
        ap.post_bytes = out;
    } else {
        /* the plan writes the output while reading the input: read from a copy */
        ap.in = gp->tmp;
        ap.pre_src = s;
        ap.pre_dst = gp->tmp;
        ap.pre_bytes = in;
    }
    *ap_p = ap;
    return MSCX_OK;
}

/*
 * The compiled program for (@p msg, @p dtype, @p pkt): an entry of the
 * plan's arena, compiled and encoded on first use. @return its index, or -1
 * when the program does not compile or the arena is full (interpreter).
 */
static int kp_find(struct gpu_plan *gp, const struct mscx_plan *plan, uint32_t rank, uint64_t msg, int dtype, int pkt,
                   int split, const struct mscx_gpu_args *a)
{
    for (uint32_t i = 0; i < gp->kp_nent; i++) {
        const struct kp_ent *e = &gp->kp_ent[i];
        if (e->msg == msg && e->dtype == dtype && e->pkt == pkt && e->split == split)
            return e->usable ? (int)i : -1;
    }
    if (!gp->kp_tmp || !mscx_gpu_compile(plan, rank, gp->h_ops, gp->kp_rbuf, a, gp->kp_tmp))
        return -1;
    struct kp_ent e = {msg, dtype, pkt, gp->kp_used, 0, 0, 0, gp->kp_tmp->interp_mask, split, 1, 0, 0, 0, 0};
    e.whole = e.interp_mask == 0;
    for (uint32_t i = 0; i < gp->kp_tmp->kbegin[gp->ntb]; i++)
        if (gp->kp_tmp->kop[i].kind == MSCX_ENTRY_GENERIC)
            e.whole = 0;
    if (split && !(e.whole && mscx_gpu_kp_split(gp->kp_tmp, gp->ntb, pkt == MSCX_PKT_LL8 ? 4u : 8u, a->out_bytes))) {
        /* remembered, so that calls of this shape do not compile again; no arena bytes */
        if (gp->kp_nent >= MSCX_GPU_KP_ENTRIES)
            return -1;
        e.usable = 0;
        e.off = 0;
        gp->kp_ent[gp->kp_nent++] = e;
        return -1;
    }
    if (!plan->inplace && e.whole) {
        uint64_t in_at = 0, out_at = 0;
        if (plan->coll == MSCX_COLL_ALLGATHER)
            in_at = (uint64_t)rank * a->in_bytes;
        else if (plan->coll == MSCX_COLL_REDUCESCATTER)
            out_at = (uint64_t)rank * a->out_bytes;
        e.alias = mscx_gpu_kp_alias_ok(gp->kp_tmp, gp->ntb, pkt == MSCX_PKT_LL8 ? 4u : 8u, in_at, out_at,
                                       a->in_bytes);
    }
    e.packet = e.whole && mscx_gpu_kp_packet_only(gp->kp_tmp, gp->ntb); /* after the split: what runs */
    size_t bytes = 0;
    if (gp->kp_nent < MSCX_GPU_KP_ENTRIES)
        bytes = mscx_gpu_kp_encode(gp->kp_tmp, gp->ntb, gp->scratch, gp->scratch_half, gp->kp_pin + gp->kp_used,
                                   gp->kp_cap - gp->kp_used, &e.stride, &e.kmax_ops, &e.kmax_opnd);
    if (bytes == 0) {
        if (!gp->kp_full_said)
            MSCX_INFO(MSCX_SUB_EXEC, "plan %s: compiled programs of %u sizes kept, %zu bytes; new sizes run the "
                      "interpreter", plan->name, gp->kp_nent, gp->kp_used);
        gp->kp_full_said = 1;
        return -1;
    }
    gp->kp_used += (bytes + 255u) & ~(size_t)255u;
    MSCX_INFO(MSCX_SUB_EXEC, "plan %s rank %u: program for %llu bytes%s compiled, %s (%zu bytes)", plan->name, rank,
              (unsigned long long)msg, split ? " (split)" : "",
              e.packet ? "whole, packet entries only: the packet kernel runs it (sums, untraced)"
              : e.whole ? "whole: the lean kernel runs it" : "partly: some blocks interpret", bytes);
    gp->kp_ent[gp->kp_nent] = e;
    return (int)gp->kp_nent++;
}

/*
 * Make entry @p e's program visible to a kernel on any stream: copied once,
 * on a private stream that is then synchronised (so a later launch on any
 * stream sees it; the copy waits for nothing the caller's streams run).
 * Under capture too: the thread switches to relaxed capture mode for the
 * copy and the wait (calls that global or thread-local capture would refuse),
 * so the graph gets no copy node. (A copy captured ahead of every kernel cost
 * a node per launch in each graph whose sizes were first seen in capture:
 * 7.2 instead of 3.8 us per 1 KB AllReduce on 2 x H200.)
 */
static mscx_status_t kp_upload(struct mscx_exec *ex, struct gpu_plan *gp, struct kp_ent *e)
{
    if (e->uploaded)
        return MSCX_OK;
    size_t bytes = (size_t)e->stride * gp->ntb;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
        return gpu_check(cudaGetLastError(), "capture mode for the program upload");
    cudaError_t rc = cudaSuccess;
    if (!ex->ustream && (rc = cudaStreamCreateWithFlags(&ex->ustream, cudaStreamNonBlocking)) != cudaSuccess)
        ex->ustream = NULL;
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(gp->kp_dev + e->off, gp->kp_pin + e->off, bytes, cudaMemcpyHostToDevice, ex->ustream);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(ex->ustream);
    enum cudaStreamCaptureMode back = mode;
    cudaThreadExchangeStreamCaptureMode(&back);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it, as the caller's next call must not see it */
        return gpu_check(rc, "program upload");
    }
    e->uploaded = 1;
    return MSCX_OK;
}

/*
 * A launch of a one-rank identity plan (gpu_plan.ident): its output is its
 * input. In place (one buffer: at rank 0 every collective's aliasing is
 * send == recv) nothing is enqueued, so nothing is captured into a graph
 * either; out of place one device copy on the call's stream (a memcpy node
 * under capture) at the device's copy bandwidth, not the one thread block's
 * of the plan. It gives the bytes the program would: every output chunk is
 * the input chunk of the same index and size.
 */
static mscx_status_t onerank_launch(const void *sendbuf, void *recvbuf, uint64_t bytes, cudaStream_t s)
{
    if (sendbuf == recvbuf || bytes == 0)
        return MSCX_OK;
    if (cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDefault, s) != cudaSuccess)
        return gpu_check(cudaGetLastError(), "one-rank copy");
    return MSCX_OK;
}

mscx_status_t mscx_exec_launch(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                               uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                               enum mscx_pkt_format pkt, void *stream)
{
    if (!ex || plan_id >= ex->nplans || (unsigned)dtype >= MSCX_DT_COUNT || (unsigned)op >= MSCX_REDOP_COUNT ||
        (pkt != MSCX_PKT_LL16 && pkt != MSCX_PKT_LL8))
        return MSCX_ERR_INVALID_ARG;
    struct gpu_plan *gp = &ex->plans[plan_id];
    if (!gp->ready) {
        MSCX_WARN("caller bug: plan %u launched before every rank added it", plan_id);
        return MSCX_ERR_INVALID_ARG;
    }
    if (gp->c_msg != msg_bytes || gp->c_dtype != (int)dtype || gp->c_pkt != (int)pkt) {
        const struct mscx_plan *plan = gp->plan;
        struct mscx_geom g;
        char err[256];
        uint64_t in, out;
        mscx_coll_sizes(plan->coll, plan->nranks, msg_bytes, &in, &out);
        mscx_status_t st = mscx_plan_geom(plan, ex->bs.rank, in, out, dtype, &g, err, sizeof(err));
        if (st != MSCX_OK) {
            MSCX_WARN("caller bug: plan %s, %llu bytes: %s", plan->name, (unsigned long long)msg_bytes, err);
            return st;
        }
        if (g.scratch_bytes > gp->scratch_bytes) {
            MSCX_WARN("caller bug: plan %s: %llu bytes need %llu bytes of scratch, %llu allocated (max_msg_bytes)",
                      plan->name, (unsigned long long)msg_bytes, (unsigned long long)g.scratch_bytes,
                      (unsigned long long)gp->scratch_bytes);
            return MSCX_ERR_INVALID_ARG;
        }
        const struct mscx_config *cfg;
        MSCX_CHECK(mscx_config_get(&cfg));
        struct mscx_gpu_args *a = &gp->c_args;
        memset(a, 0, sizeof(*a));
        a->ctx = (struct mscx_gpu_ctx *)gp->d_ctx;
        a->ops = (const struct mscx_dev_op *)(gp->d_ctx + gp->off_ops);
        a->tb_begin = (const uint32_t *)(gp->d_ctx + gp->off_tb);
        a->bflag = (uint32_t *)(gp->d_ctx + gp->off_bflag);
        a->scratch = gp->scratch;
        a->scratch_bytes = gp->scratch_bytes;
        a->scratch_half = gp->scratch_half;
        a->publish = (uint32_t)gp->publish;
        a->sys_scope = (uint32_t)gp->sys_scope;
        a->in_bytes = g.in_bytes;
        a->out_bytes = g.out_bytes;
        for (uint32_t c = 0; c < gp->ngeom; c++) {
            struct mscx_geom h = g;
            uint32_t o = gp->geom_rank[c];
            if (c > 0 && (st = mscx_plan_geom(plan, o, in, out, dtype, &h, err, sizeof(err))) != MSCX_OK) {
                MSCX_WARN("caller bug: plan %s, rank %u, %llu bytes: %s", plan->name, o,
                          (unsigned long long)msg_bytes, err);
                return st;
            }
            a->geom[c].slot = h.slot;
            a->geom[c].in_chunk = h.in_chunk;
            a->geom[c].out_chunk = h.out_chunk;
        }
        a->reduce = (uint32_t)gp->reduce;
        a->smem_ops = gp->smem_ops;
        a->port = gp->port != NULL;
        a->timeout_ns = cfg->timeout_ms * 1000000ull;
        if (gp->d_trace) {
            a->trace_cap = MSCX_TRACE_CAP;
            a->trace = gp->d_trace;
            a->trace_n = gp->d_trace_n;
        }
        a->pkt = pkt;
        gp->c_kent = cfg->exec_compile && !gp->ident
                         ? kp_find(gp, plan, ex->bs.rank, msg_bytes, (int)dtype, (int)pkt, 0, a)
                         : -1;
        gp->c_kent_split = -2;
        gp->c_msg = msg_bytes;
        gp->c_dtype = (int)dtype;
        gp->c_pkt = (int)pkt;
    }
    if (gp->ident && gp->c_args.in_bytes == gp->c_args.out_bytes && mscx_redop_keeps_one_value(op))
        return onerank_launch(sendbuf, recvbuf, gp->c_args.in_bytes, (cudaStream_t)stream);
    /* the arguments are passed by value: cudaLaunchKernel copies them, so the cached ones are updated in place */
    struct mscx_gpu_args *a = &gp->c_args;
    struct alias_plan ap = {sendbuf, recvbuf, NULL, NULL, NULL, NULL, 0, 0};
    /*
     * A call whose placement differs from the plan's is staged (alias_adapt),
     * unless the compiled program can serve it directly: an out-of-place call
     * on an in-place AllReduce plan runs the program split to read the send
     * and write the receive buffer (mscx_gpu_kp_split); an in-place call on an
     * out-of-place plan runs the program as it is where it never reads an
     * input byte after something overwrote it (mscx_gpu_kp_alias_ok). Both
     * need what the fast kernel needs, and 16-byte aligned buffers.
     */
    int kent = gp->c_kent, staged = 1;
    if (kent >= 0 && gp->kp_ent[kent].whole && !gp->port && !gp->publish && !gp->peer_bufs &&
        (((uintptr_t)sendbuf | (uintptr_t)recvbuf) & 15u) == 0 &&
        call_is_inplace(gp, ex->bs.rank, sendbuf, recvbuf) != (int)gp->plan->inplace) {
        if (gp->plan->inplace && gp->plan->coll == MSCX_COLL_ALLREDUCE) {
            if (gp->c_kent_split == -2)
                gp->c_kent_split = kp_find(gp, gp->plan, ex->bs.rank, msg_bytes, (int)dtype, (int)pkt, 1, a);
            if (gp->c_kent_split >= 0) {
                kent = gp->c_kent_split;
                staged = 0;
            }
        } else if (!gp->plan->inplace && gp->kp_ent[kent].alias) {
            staged = 0;
        }
    }
    if (staged) {
        mscx_status_t ast = alias_adapt(gp, ex->bs.rank, sendbuf, recvbuf, &ap);
        if (ast != MSCX_OK)
            return ast;
    }
    if (gp->peer_bufs) {
        /* peers in other processes reach this rank's buffers, or this rank theirs: agree on this launch's */
        mscx_status_t ust = mscx_peer_bufs_launch(gp->peer_bufs, ap.in, a->in_bytes, ap.out, a->out_bytes, stream, a->uptr);
        if (ust != MSCX_OK)
            return ust;
    }
    a->in = ap.in;
    a->out = ap.out;
    a->dtype = dtype;
    a->op = op;
    a->pkt = pkt;
    cudaStream_t s = (cudaStream_t)stream;
    a->kprog = NULL;
    a->fast = 0;
    a->kpkt = 0;
    if (kent >= 0 && (((uintptr_t)ap.in | (uintptr_t)ap.out) & 15u) == 0) {
        struct kp_ent *e = &gp->kp_ent[kent];
        mscx_status_t ust = kp_upload(ex, gp, e);
        if (ust != MSCX_OK)
            return ust;
        a->kprog = gp->kp_dev + e->off;
        a->kstride = e->stride;
        a->kmax_ops = e->kmax_ops;
        a->kmax_opnd = e->kmax_opnd;
        a->interp_mask = e->interp_mask;
        a->fast = e->whole && !gp->port && !gp->publish && !gp->peer_bufs;
        a->kpkt = a->fast && e->packet;
    }
    if (ap.pre_bytes && cudaMemcpyAsync(ap.pre_dst, ap.pre_src, ap.pre_bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return gpu_check(cudaGetLastError(), "staging copy");
    if (gp->ntb != 0 && !(gp->idle && !gp->publish)) {
        int rc = mscx_gpu_kernel_launch(a, gp->ntb, gp->nthreads, gp->pdl, stream);
        if (rc != 0)
            return gpu_check((cudaError_t)rc, "kernel launch");
    }
    if (ap.post_bytes && cudaMemcpyAsync(ap.post_dst, ap.post_src, ap.post_bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return gpu_check(cudaGetLastError(), "staging copy");
    return MSCX_OK;
}

mscx_status_t mscx_exec_async_error(struct mscx_exec *ex)
{
    if (!ex)
        return MSCX_ERR_INVALID_ARG;
    int32_t code = *(volatile int32_t *)&ex->host->err.code;
    if (code == 0)
        return MSCX_OK;
    for (uint32_t i = 0; i < ex->nplans; i++)
        mscx_gpu_port_report(ex->plans[i].port, ex->bs.rank, ex->plans[i].plan->name);
    return (mscx_status_t)code;
}

void mscx_exec_abort(struct mscx_exec *ex)
{
    if (!ex)
        return;
    if (ex->host->err.code == 0) {
        ex->host->err.opcode = 0;
        ex->host->err.code = MSCX_ERR_REMOTE;
    }
    ex->host->abort = 1;
    __sync_synchronize();
}

void mscx_exec_destroy(struct mscx_exec *ex)
{
    if (!ex)
        return;
    cudaSetDevice(ex->device);
    /* no proxy request and no received TCP write touches memory past this point */
    for (uint32_t i = 0; i < ex->nplans; i++)
        mscx_gpu_port_stop(ex->plans[i].port);
    mscx_gpu_net_destroy(ex->net);
    for (uint32_t i = 0; i < ex->nplans; i++) {
        struct gpu_plan *gp = &ex->plans[i];
        mscx_gpu_port_free(gp->port);
        mscx_peer_bufs_destroy(gp->peer_bufs);
        if (gp->opened) {
            for (uint32_t k = 0; k < 2u * gp->plan->nranks; k++)
                if (gp->opened[k])
                    cudaIpcCloseMemHandle(gp->opened[k]);
            free(gp->opened);
        }
        if (gp->d_trace) {
            trace_collect(ex->bs.rank, i, gp);
            cudaFree(gp->d_trace);
            cudaFree(gp->d_trace_n);
        }
        if (gp->scratch)
            cudaFree(gp->scratch);
        if (gp->tmp)
            cudaFree(gp->tmp);
        if (gp->d_ctx)
            cudaFree(gp->d_ctx);
        free(gp->recs);
        free(gp->h_ops);
        free(gp->kp_rbuf);
        free(gp->kp_tmp);
        if (gp->kp_dev)
            cudaFree(gp->kp_dev);
        if (gp->kp_pin)
            cudaFreeHost(gp->kp_pin);
    }
    if (ex->traced) {
        pthread_mutex_lock(&g_trace.lock);
        if (--g_trace.live == 0)
            trace_flush_locked();
        pthread_mutex_unlock(&g_trace.lock);
    }
    if (ex->group && --ex->group->refs == 0) {
        free(ex->group->execs);
        free(ex->group);
    }
    if (ex->ustream)
        cudaStreamDestroy(ex->ustream);
    if (ex->host)
        cudaFreeHost(ex->host);
    free(ex);
}

static mscx_status_t local_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    (void)ctx;
    (void)mine;
    (void)all;
    (void)bytes;
    return MSCX_ERR_INTERNAL; /* the local group never uses the bootstrap */
}

mscx_status_t mscx_exec_create_local_group(uint32_t nranks, int cuda_device, struct mscx_exec **execs)
{
    mscx_status_t st = MSCX_OK;
    if (nranks == 0 || !execs)
        return MSCX_ERR_INVALID_ARG;
    struct local_group *g = calloc(1, sizeof(*g));
    if (!g)
        return MSCX_ERR_NO_MEMORY;
    g->execs = calloc(nranks, sizeof(*g->execs));
    if (!g->execs) {
        free(g);
        return MSCX_ERR_NO_MEMORY;
    }
    g->nranks = nranks;
    for (uint32_t r = 0; r < nranks; r++) {
        struct mscx_bootstrap bs = {r, nranks, g, local_allgather};
        if ((st = mscx_exec_create(&bs, cuda_device, &g->execs[r])) != MSCX_OK)
            break;
        g->execs[r]->group = g;
        g->refs++;
    }
    if (st != MSCX_OK) {
        struct mscx_exec **e = g->execs;
        uint32_t refs = g->refs;
        for (uint32_t r = 0; r < refs; r++)
            mscx_exec_destroy(e[r]); /* the last one frees g */
        if (refs == 0) {
            free(g->execs);
            free(g);
        }
        return st;
    }
    memcpy(execs, g->execs, nranks * sizeof(*execs));
    return MSCX_OK;
}

int mscx_gpu_debug_set_flag(struct mscx_exec *ex, uint32_t plan_id, uint32_t flag)
{
    if (!ex || plan_id >= ex->nplans)
        return -1;
    struct gpu_plan *gp = &ex->plans[plan_id];
    uint32_t *f = calloc(gp->ntb ? gp->ntb : 1, sizeof(uint32_t));
    if (!f)
        return -1;
    for (uint32_t b = 0; b < gp->ntb; b++)
        f[b] = flag;
    cudaError_t rc = cudaMemcpy(gp->d_ctx + gp->off_bflag, f, gp->ntb * sizeof(uint32_t), cudaMemcpyHostToDevice);
    free(f);
    return rc == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

int mscx_gpu_debug_fill_scratch(struct mscx_exec *ex, uint32_t plan_id, uint32_t word)
{
    if (!ex || plan_id >= ex->nplans)
        return -1;
    struct gpu_plan *gp = &ex->plans[plan_id];
    uint64_t n = gp->scratch_bytes / 4u;
    uint32_t *h = malloc(n ? n * 4u : 4u);
    if (!h)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        h[i] = word;
    cudaError_t rc = n ? cudaMemcpy(gp->scratch, h, n * 4u, cudaMemcpyHostToDevice) : cudaSuccess;
    free(h);
    return rc == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

void mscx_gpu_debug_error(struct mscx_exec *ex, struct mscx_gpu_err *err_p)
{
    memset(err_p, 0, sizeof(*err_p));
    if (!ex)
        return;
    __sync_synchronize();
    err_p->block = ex->host->err.block;
    err_p->op = ex->host->err.op;
    err_p->opcode = ex->host->err.opcode;
    err_p->code = *(volatile int32_t *)&ex->host->err.code;
}
