/* SPDX-License-Identifier: MIT */
/*
 * mscx_exec_add_plan: checks the plan, sizes its launches (threads per
 * block, programmatic dependent launch), allocates the context, scratch,
 * trace rings, staging and program arena, and exchanges each rank's record
 * of them; finalize.c then fills the context's tables.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "onerank.h"
#include "runtime_int.h"

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

void mscx_gpu_ctx_layout(struct gpu_plan *gp, const struct mscx_gpu *gpu)
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
 * for (MSCX_PDL) on a Hopper or later GPU running code built for it
 * (ex->pdl_ok, see device_caps.h), a driver that has it (CUDA 12.3), and room on the device (@p cap blocks,
 * from pick_threads) for every block of the plan twice over: a launch that starts early waits on its SMs
 * while the launch ahead of it runs (one ahead per stream, see mscx_pdl_allow), and a block of a rank that
 * could not become resident would leave its peers spinning.
 */
static int pdl_usable(const struct mscx_exec *ex, uint64_t cap, uint64_t total_blocks)
{
    int drv = 0;
    if (!ex->pdl_ok || cudaDriverGetVersion(&drv) != cudaSuccess)
        return 0;
    return drv >= 12030 && cap >= 2u * total_blocks;
}

/* Start slot @p gp for @p plan: what this rank's launches are, from the plan alone. */
static void plan_init(struct gpu_plan *gp, const struct mscx_plan *plan, uint32_t rank)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
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
}

/*
 * Threads per block and programmatic dependent launch of @p gp. The blocks
 * that must be resident at once are this rank's, or every rank's of a
 * local group (one device); a plan whose blocks cannot all be is refused.
 */
static mscx_status_t plan_shape(const struct mscx_exec *ex, struct gpu_plan *gp)
{
    const struct mscx_plan *plan = gp->plan;
    uint64_t total_blocks = gp->ntb, cap = 0;
    if (ex->group) {
        total_blocks = 0;
        for (uint32_t r = 0; r < plan->nranks; r++)
            total_blocks += plan->gpus[r].ntb;
    }
    gp->nthreads =
        pick_threads(plan, (uint32_t)total_blocks, gp->smem_ops * (uint32_t)sizeof(struct mscx_dev_op), &cap);
    if (gp->nthreads == 0) {
        MSCX_WARN(
            "plan %s: %llu thread blocks cannot all be resident on device %d even at 32 threads; refusing",
            plan->name, (unsigned long long)total_blocks, ex->device);
        return MSCX_ERR_UNSUPPORTED;
    }
    gp->pdl = pdl_usable(ex, cap, total_blocks);
    MSCX_INFO(MSCX_SUB_EXEC, "plan %s: %u blocks of %u threads, programmatic dependent launch %s%s",
              plan->name, gp->ntb, gp->nthreads, gp->pdl ? "on" : "off",
              gp->ident ? "; one rank, identity: launches are one device copy, or nothing in place" : "");
    return MSCX_OK;
}

/* The device memory of @p gp: context, scratch, trace rings, staging and program arena, zeroed. */
static mscx_status_t plan_alloc(const struct mscx_exec *ex, struct gpu_plan *gp, uint64_t max_msg_bytes)
{
    const struct mscx_plan *plan = gp->plan;
    uint32_t rank = ex->bs.rank;
    mscx_gpu_ctx_layout(gp, &plan->gpus[rank]);
    MSCX_CHECK(CU(cudaMalloc((void **)&gp->d_ctx, gp->ctx_bytes)));
    MSCX_CHECK(CU(cudaMemsetAsync(gp->d_ctx, 0, gp->ctx_bytes, ex->ustream)));
    /* fixed halves for double-buffered plans (see mscx_plan_scratch_size) */
    mscx_plan_scratch_size(plan, rank, max_msg_bytes, &gp->scratch_bytes, &gp->scratch_half);
    if (gp->scratch_bytes) {
        MSCX_CHECK(CU(cudaMalloc((void **)&gp->scratch, gp->scratch_bytes)));
        MSCX_CHECK(CU(cudaMemsetAsync(gp->scratch, 0, gp->scratch_bytes, ex->ustream)));
    }
    if (ex->traced && gp->ntb) {
        size_t tb = (size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(struct mscx_trace_rec);
        MSCX_CHECK(CU(cudaMalloc((void **)&gp->d_trace, tb)));
        MSCX_CHECK(CU(cudaMalloc((void **)&gp->d_trace_n, gp->ntb * sizeof(uint32_t))));
        MSCX_CHECK(CU(cudaMemsetAsync(gp->d_trace, 0, tb, ex->ustream)));
        MSCX_CHECK(CU(cudaMemsetAsync(gp->d_trace_n, 0, gp->ntb * sizeof(uint32_t), ex->ustream)));
    }
    uint64_t in, out;
    mscx_coll_sizes(plan->coll, plan->nranks, max_msg_bytes, &in, &out);
    gp->tmp_bytes = gp->ident ? 0 : in > out ? in : out; /* an identity launch never stages */
    if (gp->tmp_bytes)
        MSCX_CHECK(CU(cudaMalloc((void **)&gp->tmp, gp->tmp_bytes)));
    if (gp->ntb) {
        gp->prog_tmp = malloc(sizeof(*gp->prog_tmp));
        if (!gp->prog_tmp)
            return MSCX_ERR_NO_MEMORY;
        gp->prog_cap = MSCX_GPU_PROGRAM_ARENA;
        MSCX_CHECK(CU(cudaMalloc((void **)&gp->prog_dev, gp->prog_cap)));
        MSCX_CHECK(CU(cudaHostAlloc((void **)&gp->prog_pin, gp->prog_cap, cudaHostAllocDefault)));
    }
    gp->c_kent = -1;
    gp->c_kent_split = -2;
    return CU(cudaStreamSynchronize(ex->ustream)); /* the zeroing is done; nothing else is waited for */
}

/* Free what plan_alloc allocated of @p gp, for an add_plan that fails, and clear the slot. */
static void plan_alloc_undo(struct gpu_plan *gp)
{
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
    free(gp->prog_tmp);
    if (gp->prog_dev)
        cudaFree(gp->prog_dev);
    if (gp->prog_pin)
        cudaFreeHost(gp->prog_pin);
    memset(gp, 0, sizeof(*gp));
}

/* This rank's record of @p gp, for the other ranks (IPC handles only between processes). */
static mscx_status_t plan_record(const struct mscx_exec *ex, const struct gpu_plan *gp, struct gpu_rec *rec_p)
{
    const struct mscx_config *cfg;
    struct gpu_rec mine;
    memset(&mine, 0, sizeof(mine));
    mine.pid = (int64_t)getpid();
    mine.host = host_identity();
    mine.device = ex->device;
    mine.ctx_dev = (uint64_t)(uintptr_t)gp->d_ctx;
    mine.scratch_dev = (uint64_t)(uintptr_t)gp->scratch;
    mine.scratch_bytes = gp->scratch_bytes;
    MSCX_CHECK(mscx_config_get(&cfg));
    mine.vnodes =
        cfg->virtual_nodes > 1 ? (int32_t)(cfg->virtual_nodes > 65536 ? 65536 : cfg->virtual_nodes) : 0;
    if (!ex->group) {
        MSCX_CHECK(CU(cudaIpcGetMemHandle(&mine.ctx_ipc, gp->d_ctx)));
        if (gp->scratch)
            MSCX_CHECK(CU(cudaIpcGetMemHandle(&mine.scratch_ipc, gp->scratch)));
    }
    *rec_p = mine;
    return MSCX_OK;
}

/* In-process group: the last rank to add plan @p id shares every rank's record and finalises every rank. */
static mscx_status_t group_add(struct mscx_exec *ex, uint32_t id)
{
    struct local_group *g = ex->group;
    uint32_t n = ex->plans[id].plan->nranks;
    if (++g->added[id] != n)
        return MSCX_OK;
    for (uint32_t r = 0; r < n; r++) {
        /* every rank's own record is in its own recs; share them all */
        for (uint32_t q = 0; q < n; q++)
            g->execs[r]->plans[id].recs[q] = g->execs[q]->plans[id].recs[q];
    }
    for (uint32_t r = 0; r < n; r++)
        MSCX_CHECK(mscx_gpu_plan_finalize(g->execs[r], &g->execs[r]->plans[id]));
    return MSCX_OK;
}

static mscx_status_t add_plan_on(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p)
{
    mscx_status_t st;
    char err[256];
    if (ex->nplans >= MSCX_GPU_MAX_PLANS)
        return MSCX_ERR_NO_MEMORY;
    if ((st = mscx_plan_executable(plan, err, sizeof(err))) != MSCX_OK) {
        MSCX_WARN("plan %s: %s", plan->name, err);
        return st;
    }
    uint32_t rank = ex->bs.rank, id = ex->nplans;
    struct gpu_plan *gp = &ex->plans[id];
    struct gpu_rec mine;
    plan_init(gp, plan, rank);
    if ((st = setup_geoms(gp, rank)) != MSCX_OK || (st = plan_shape(ex, gp)) != MSCX_OK ||
        (st = plan_alloc(ex, gp, max_msg_bytes)) != MSCX_OK || (st = plan_record(ex, gp, &mine)) != MSCX_OK)
        goto fail;
    gp->recs = calloc(plan->nranks, sizeof(*gp->recs));
    if (!gp->recs) {
        st = MSCX_ERR_NO_MEMORY;
        goto fail;
    }
    ex->nplans++;
    *plan_id_p = id;
    if (ex->group) {
        gp->recs[rank] = mine;
        return group_add(ex, id);
    }
    if ((st = ex->bs.allgather(ex->bs.ctx, &mine, gp->recs, sizeof(mine))) != MSCX_OK) {
        MSCX_WARN("plan %s: bootstrap allgather failed: %s", plan->name, mscx_status_str(st));
        return st;
    }
    return mscx_gpu_plan_finalize(ex, gp);
fail:
    plan_alloc_undo(gp);
    return st;
}

mscx_status_t mscx_exec_add_plan(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p)
{
    struct mscx_gpu_dev_scope scope;
    if (!ex || !plan || !plan_id_p || plan->nranks != ex->bs.nranks)
        return MSCX_ERR_INVALID_ARG;
    mscx_status_t st = mscx_gpu_dev_enter(ex->device, &scope);
    if (st == MSCX_OK)
        st = add_plan_on(ex, plan, max_msg_bytes, plan_id_p);
    mscx_gpu_dev_leave(&scope);
    return st;
}
