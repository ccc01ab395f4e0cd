/* SPDX-License-Identifier: MIT */
/*
 * The second half of mscx_exec_add_plan, once every rank's record is known:
 * the node topology checks, the user buffers shared with other processes,
 * CUDA IPC mappings of the peers' contexts and scratch on this node, the
 * context image (op, block, remote buffer, semaphore and channel tables),
 * the port channels through the proxy, and the copy to the device.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "runtime_int.h"

/* What one finalize works with; fin_free frees it (gp->opened belongs to the context). */
struct fin {
    int64_t pid;            /* this process */
    uint64_t host;          /* this host's identity */
    struct gpu_peer *peers; /* [nranks] from the records */
    uint32_t *node;         /* [nranks] each rank's node (mscx_gpu_topology; all 0 in a local group) */
    uint32_t *uslot;        /* [nrbuf] each remote buffer's slot in mscx_gpu_args.uptr, UINT32_MAX: none */
    char **peer_ctx;        /* [nranks] each rank's context as this process reaches it, NULL: another node */
    char **peer_scr;        /* [nranks] each rank's scratch likewise */
    char *img;              /* the context image, copied to gp->d_ctx */
};

static void fin_free(struct fin *f)
{
    free(f->img);
    free(f->peer_ctx);
    free(f->peer_scr);
    free(f->peers);
    free(f->node);
    free(f->uslot);
}

/* Allocate the arrays of @p f and gp->opened; fin_free frees @p f whatever this returns. */
static mscx_status_t fin_alloc(struct gpu_plan *gp, uint32_t nrbuf, struct fin *f)
{
    uint32_t n = gp->plan->nranks;
    memset(f, 0, sizeof(*f));
    f->img = calloc(1, gp->ctx_bytes);
    f->peer_ctx = calloc(n, sizeof(char *));
    f->peer_scr = calloc(n, sizeof(char *));
    gp->opened = calloc(2u * n, sizeof(void *));
    f->peers = calloc(n, sizeof(*f->peers));
    f->node = calloc(n, sizeof(*f->node));
    f->uslot = calloc(nrbuf ? nrbuf : 1, sizeof(*f->uslot));
    if (!f->img || !f->peer_ctx || !f->peer_scr || !gp->opened || !f->peers || !f->node || !f->uslot)
        return MSCX_ERR_NO_MEMORY;
    return MSCX_OK;
}

static void peers_from_recs(const struct gpu_plan *gp, struct gpu_peer *peers)
{
    for (uint32_t r = 0; r < gp->plan->nranks; r++) {
        peers[r].pid = gp->recs[r].pid;
        peers[r].host = gp->recs[r].host;
        peers[r].vnodes = gp->recs[r].vnodes;
        peers[r].device = gp->recs[r].device;
        peers[r].scratch_bytes = gp->recs[r].scratch_bytes;
    }
}

/* Collective (before the port setup on every rank): user buffers that peers in other processes reach. */
static mscx_status_t share_user_bufs(struct mscx_exec *ex, struct gpu_plan *gp, const struct fin *f)
{
    const struct mscx_config *cfg;
    MSCX_CHECK(mscx_config_get(&cfg));
    struct peer_bufs_setup us = {.plan = gp->plan,
                                 .rank = ex->bs.rank,
                                 .device = ex->device,
                                 .bs = &ex->bs,
                                 .peers = f->peers,
                                 .node = f->node,
                                 .timeout_ms = cfg->timeout_ms,
                                 .abort = &ex->host->abort};
    return mscx_peer_bufs_setup(&us, f->uslot, &gp->peer_bufs);
}

/*
 * Each rank's context and scratch as this process reaches them: the
 * pointers themselves in this process, CUDA IPC mappings on this node
 * (kept in gp->opened), none on another node.
 */
static mscx_status_t map_peers(const struct mscx_exec *ex, struct gpu_plan *gp, struct fin *f)
{
    uint32_t rank = ex->bs.rank;
    for (uint32_t r = 0; r < gp->plan->nranks; r++) {
        const struct gpu_rec *rc = &gp->recs[r];
        if (rc->pid == f->pid && rc->host == f->host) {
            f->peer_ctx[r] = (char *)(uintptr_t)rc->ctx_dev;
            f->peer_scr[r] = (char *)(uintptr_t)rc->scratch_dev;
            continue;
        }
        if (f->node[r] != f->node[rank])
            continue; /* another node: reached only through the proxy's TCP link */
        void *p = NULL;
        MSCX_CHECK(CU(cudaIpcOpenMemHandle(&p, rc->ctx_ipc, cudaIpcMemLazyEnablePeerAccess)));
        gp->opened[2 * r] = p;
        f->peer_ctx[r] = p;
        if (rc->scratch_dev) {
            MSCX_CHECK(CU(cudaIpcOpenMemHandle(&p, rc->scratch_ipc, cudaIpcMemLazyEnablePeerAccess)));
            gp->opened[2 * r + 1] = p;
            f->peer_scr[r] = p;
        }
    }
    return MSCX_OK;
}

/* The image's header: counts, scratch, the tables' device addresses, whether this rank publishes. */
static void image_header(const struct mscx_exec *ex, const struct gpu_plan *gp, struct mscx_gpu_ctx *c)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    char *d = gp->d_ctx;
    c->host = ex->host_dev;
    c->ntb = gpu->ntb;
    c->nrbuf = gpu->nrbuf;
    c->nsem = gpu->nsem;
    c->scratch = gp->scratch;
    c->scratch_bytes = gp->scratch_bytes;
    c->bflag = (uint32_t *)(d + gp->off_bflag);
    for (uint32_t r = 0; r < plan->nranks; r++) /* some peer reads this rank's user buffers */
        for (uint32_t i = 0; i < plan->gpus[r].nrbuf; i++)
            if (plan->gpus[r].rbuf[i].rank == rank && plan->gpus[r].rbuf[i].type != MSCX_BUF_SCRATCH)
                c->publish = 1;
    c->ops = (const struct mscx_dev_op *)(d + gp->off_ops);
    c->tb_begin = (const uint32_t *)(d + gp->off_tb);
    c->rbuf = (const struct mscx_gpu_rbuf *)(d + gp->off_rbuf);
    c->sem = (int32_t *)(d + gp->off_sem);
}

/* The op table (sync marks set) and each block's first op. */
static void image_ops(const struct gpu_plan *gp, uint32_t rank, char *img)
{
    const struct mscx_gpu *gpu = &gp->plan->gpus[rank];
    memcpy(img + gp->off_ops, gpu->ops, (size_t)gpu->nops * sizeof(struct mscx_dev_op));
    mscx_gpu_mark_syncs(gp->plan, rank, (struct mscx_dev_op *)(img + gp->off_ops));
    uint32_t *tb = (uint32_t *)(img + gp->off_tb);
    for (uint32_t b = 0; b < gpu->ntb; b++)
        tb[b] = gpu->tb[b].op_begin;
    tb[gpu->ntb] = gpu->ntb ? gpu->tb[gpu->ntb - 1].op_begin + gpu->tb[gpu->ntb - 1].nops : 0;
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

/* The remote buffer table: each buffer's kind, geometry class, scratch half and how it is reached. */
static mscx_status_t image_rbufs(const struct mscx_exec *ex, const struct gpu_plan *gp, const struct fin *f)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct mscx_gpu_ctx *c = (struct mscx_gpu_ctx *)f->img;
    struct mscx_gpu_rbuf *rb = (struct mscx_gpu_rbuf *)(f->img + gp->off_rbuf);
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        uint32_t o = gpu->rbuf[i].rank;
        rb[i].type = gpu->rbuf[i].type;
        rb[i].geom = geom_class(gp, o);
        rb[i].half = plan->double_scratch ? gp->recs[o].scratch_bytes / 2u : 0;
        if (gp->recs[o].device != gp->recs[rank].device)
            c->sys_scope = 1;
        if (gpu->rbuf[i].type == MSCX_BUF_SCRATCH) {
            rb[i].kind = MSCX_GPU_RBUF_SCRATCH;
            rb[i].ptr = f->peer_scr[o];
            continue;
        }
        /* another process: the host maps each launch's buffers (peer_buffers.c); the flag is still pub's */
        int other = gp->recs[o].pid != f->pid || gp->recs[o].host != f->host;
        if (!ex->group && f->node[o] != f->node[rank]) {
            /* another node: only proxied port puts reach it (mscx_gpu_topology); its proxy resolves them */
            rb[i].kind = MSCX_GPU_RBUF_NET;
            rb[i].pub = NULL;
            continue;
        }
        if (other != (f->uslot[i] != UINT32_MAX) || !f->peer_ctx[o]) {
            MSCX_WARN("internal bug: plan %s: rank %u: remote buffer %u of rank %u has no mapping",
                      plan->name, rank, i, o);
            return MSCX_ERR_INTERNAL;
        }
        rb[i].kind = other ? MSCX_GPU_RBUF_MAPPED : MSCX_GPU_RBUF_USER;
        rb[i].uslot = other ? f->uslot[i] : 0;
        rb[i].pub = (struct mscx_gpu_pub *)(f->peer_ctx[o] + offsetof(struct mscx_gpu_ctx, pub));
    }
    return MSCX_OK;
}

/* The semaphores' initial values. */
static void image_sems(const struct gpu_plan *gp, const struct mscx_gpu *gpu, char *img)
{
    int32_t *sem = (int32_t *)(img + gp->off_sem);
    for (uint32_t i = 0; i < gpu->nsem; i++)
        sem[i] = gpu->sem_init[i];
}

/*
 * The memory and port channel tables: this rank's inbound and expected
 * tokens, and each paired channel's inbound token on its peer (NULL on
 * another node: the proxy signals).
 */
static void image_chans(const struct mscx_exec *ex, const struct gpu_plan *gp, const struct fin *f)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct mscx_gpu_ctx *c = (struct mscx_gpu_ctx *)f->img;
    char *d = gp->d_ctx;
    for (int t = MSCX_CHAN_MEMORY; t <= MSCX_CHAN_PORT; t++) {
        c->nchan[t] = gpu->nchan[t];
        c->inbound[t] = (unsigned long long *)(d + gp->off_tok[t]);
        c->expected[t] = (unsigned long long *)(d + gp->off_exp[t]);
        c->peer_inbound[t] = (unsigned long long **)(d + gp->off_pin[t]);
        void **pin = (void **)(f->img + gp->off_pin[t]);
        for (uint32_t k = 0; k < gpu->nchan[t]; k++) {
            const struct mscx_chan *ch = &gpu->chan[t][k];
            if (!ch->paired)
                continue;
            if (gp->recs[ch->peer].device != gp->recs[rank].device)
                c->sys_scope = 1;
            if (!f->peer_ctx[ch->peer]) {
                pin[k] = NULL; /* another node: the proxy signals */
                continue;
            }
            /* peer contexts share our layout rule: recompute the peer's token offset */
            struct gpu_plan tmp;
            mscx_gpu_ctx_layout(&tmp, &plan->gpus[ch->peer]);
            pin[k] = f->peer_ctx[ch->peer] + tmp.off_tok[t] + (size_t)ch->pair * 8u;
        }
    }
}

/* Collective: the port channels of this rank that go through the CPU proxy (mscx_gpu_port_setup). */
static mscx_status_t setup_ports(struct mscx_exec *ex, struct gpu_plan *gp, const struct fin *f)
{
    const struct mscx_config *cfg;
    const struct mscx_gpu *gpu = &gp->plan->gpus[ex->bs.rank];
    struct mscx_gpu_ctx *c = (struct mscx_gpu_ctx *)f->img;
    char *d = gp->d_ctx;
    MSCX_CHECK(mscx_config_get(&cfg));
    struct gpu_port_setup ps = {.plan = gp->plan,
                                .rank = ex->bs.rank,
                                .device = ex->device,
                                .bs = &ex->bs,
                                .peers = f->peers,
                                .node = f->node,
                                .peer_scr = f->peer_scr,
                                .port_tok = (void *const *)(f->img + gp->off_pin[MSCX_CHAN_PORT]),
                                .scratch = gp->scratch,
                                .scratch_bytes = gp->scratch_bytes,
                                .tok = (unsigned long long *)(d + gp->off_tok[MSCX_CHAN_PORT]),
                                .ntb = gpu->ntb,
                                .host = ex->host,
                                .timeout_ms = cfg->timeout_ms,
                                .pub = (const struct mscx_gpu_pub *)(d + offsetof(struct mscx_gpu_ctx, pub))};
    MSCX_CHECK(mscx_gpu_port_setup(&ex->net, &ps, &gp->port, &c->port));
    if (c->port)
        c->sys_scope = 1; /* tokens and data land from copy engines and other processes */
    return MSCX_OK;
}

/* What the launch compiler reads of the context: the op image and the remote buffers as it sees them. */
static mscx_status_t keep_for_compiler(struct gpu_plan *gp, const struct mscx_gpu *gpu, const char *img)
{
    const struct mscx_gpu_rbuf *rb = (const struct mscx_gpu_rbuf *)(img + gp->off_rbuf);
    gp->h_ops = malloc((gpu->nops ? gpu->nops : 1) * sizeof(struct mscx_dev_op));
    gp->prog_rbuf = calloc(gpu->nrbuf ? gpu->nrbuf : 1, sizeof(struct mscx_compile_rbuf));
    if (!gp->h_ops || !gp->prog_rbuf)
        return MSCX_ERR_NO_MEMORY;
    memcpy(gp->h_ops, img + gp->off_ops, (size_t)gpu->nops * sizeof(struct mscx_dev_op));
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        gp->prog_rbuf[i].ptr = rb[i].kind == MSCX_GPU_RBUF_SCRATCH ? (char *)rb[i].ptr : NULL;
        gp->prog_rbuf[i].geom = rb[i].geom;
        gp->prog_rbuf[i].half = rb[i].half;
    }
    return MSCX_OK;
}

/* Whether some two ranks of the plan share a process but not a device (every rank decides the same). */
static int several_devices_per_process(const struct gpu_plan *gp)
{
    for (uint32_t r = 0; r < gp->plan->nranks; r++)
        for (uint32_t q = r + 1; q < gp->plan->nranks; q++) {
            const struct gpu_rec *a = &gp->recs[r], *b = &gp->recs[q];
            if (a->pid == b->pid && a->host == b->host && a->device != b->device)
                return 1;
        }
    return 0;
}

/*
 * Let the current device (this rank's) reach @p peer_dev directly, as the
 * kernels do through the raw pointers of ranks in this process.
 * @return MSCX_OK, or MSCX_ERR_UNSUPPORTED with a warning saying why not
 */
static mscx_status_t enable_peer(const struct gpu_plan *gp, uint32_t rank, int dev, int peer_dev)
{
    int can = 0;
    cudaError_t ce = cudaDeviceCanAccessPeer(&can, dev, peer_dev);
    if (ce == cudaSuccess && !can) {
        MSCX_WARN("plan %s: rank %u: GPU %d cannot access GPU %d of a rank in this process (no peer access); "
                  "refusing",
                  gp->plan->name, rank, dev, peer_dev);
        return MSCX_ERR_UNSUPPORTED;
    }
    if (ce == cudaSuccess)
        ce = cudaDeviceEnablePeerAccess(peer_dev, 0);
    if (ce == cudaErrorPeerAccessAlreadyEnabled)
        ce = cudaSuccess;
    (void)cudaGetLastError(); /* neither outcome is sticky: the caller's next call must not see it */
    if (ce != cudaSuccess) {
        MSCX_WARN("plan %s: rank %u: enabling peer access from GPU %d to GPU %d: %s; refusing",
                  gp->plan->name, rank, dev, peer_dev, cudaGetErrorString(ce));
        return MSCX_ERR_UNSUPPORTED;
    }
    return MSCX_OK;
}

/*
 * Ranks of one process on several GPUs reach each other's memory through
 * plain pointers: peer access from this rank's GPU to each such rank's GPU,
 * enabled here. Collective when some process holds several GPUs (the same
 * on every rank, from the records): every rank says whether it could, and
 * all refuse the plan together if one could not.
 */
static mscx_status_t peer_access_agree(struct mscx_exec *ex, const struct gpu_plan *gp)
{
    uint32_t n = gp->plan->nranks, rank = ex->bs.rank;
    if (ex->group || !several_devices_per_process(gp))
        return MSCX_OK;
    int32_t mine = MSCX_OK, *all = calloc(n, sizeof(*all));
    if (!all)
        return MSCX_ERR_NO_MEMORY; /* a few bytes: as every other host allocation of the exchange */
    const struct gpu_rec *me = &gp->recs[rank];
    for (uint32_t q = 0; q < n && mine == MSCX_OK; q++) {
        const struct gpu_rec *o = &gp->recs[q];
        if (o->pid == me->pid && o->host == me->host && o->device != me->device)
            mine = enable_peer(gp, rank, ex->device, o->device);
    }
    mscx_status_t st = ex->bs.allgather(ex->bs.ctx, &mine, all, sizeof(mine));
    for (uint32_t q = 0; q < n && st == MSCX_OK; q++)
        if (all[q] != MSCX_OK) {
            if (q != rank)
                MSCX_WARN("plan %s: rank %u: rank %u cannot reach the GPU of a rank in its process; every "
                          "rank refuses the plan",
                          gp->plan->name, rank, q);
            st = MSCX_ERR_UNSUPPORTED;
        }
    free(all);
    return st;
}

mscx_status_t mscx_gpu_plan_finalize(struct mscx_exec *ex, struct gpu_plan *gp)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank;
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    int64_t pid = (int64_t)getpid();
    struct fin f;
    mscx_status_t st = fin_alloc(gp, gpu->nrbuf, &f);
    if (st != MSCX_OK)
        goto out;
    f.pid = pid;
    f.host = gp->recs[rank].host;
    peers_from_recs(gp, f.peers);
    /* every rank checks the whole plan, so that all refuse together (one process: one node) */
    if (!ex->group && ((st = mscx_gpu_topology(plan, f.peers, f.node)) != MSCX_OK ||
                       (st = mscx_peer_bufs_check(plan, f.peers, f.node)) != MSCX_OK ||
                       (st = peer_access_agree(ex, gp)) != MSCX_OK))
        goto out;
    for (uint32_t i = 0; i < gpu->nrbuf; i++)
        f.uslot[i] = UINT32_MAX;
    if ((!ex->group && (st = share_user_bufs(ex, gp, &f)) != MSCX_OK) ||
        (st = map_peers(ex, gp, &f)) != MSCX_OK)
        goto out;
    char *img = f.img;
    struct mscx_gpu_ctx *c = (struct mscx_gpu_ctx *)img;
    image_header(ex, gp, c);
    image_ops(gp, rank, img);
    if ((st = image_rbufs(ex, gp, &f)) != MSCX_OK)
        goto out;
    image_sems(gp, gpu, img);
    image_chans(ex, gp, &f);
    if (!ex->group && (st = setup_ports(ex, gp, &f)) != MSCX_OK)
        goto out;
    /* on the executor's own stream, waiting for nothing else: the image is in pageable memory */
    GPU_CHECK_GOTO(cudaMemcpyAsync(gp->d_ctx, img, gp->ctx_bytes, cudaMemcpyHostToDevice, ex->ustream), st,
                   out);
    GPU_CHECK_GOTO(cudaStreamSynchronize(ex->ustream), st, out);
    if ((st = keep_for_compiler(gp, gpu, img)) != MSCX_OK)
        goto out;
    gp->publish = (int)c->publish;
    gp->sys_scope = (int)c->sys_scope;
    gp->ready = 1;
out:
    fin_free(&f);
    return st;
}
