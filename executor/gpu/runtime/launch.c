/* SPDX-License-Identifier: MIT */
/*
 * mscx_exec_launch: the launch arguments, cached per (size, dtype, packet
 * format); the buffer placement of the call against the plan's (staging
 * copies, or a compiled program that serves it directly); the peers' user
 * buffers of this launch; then the staging copy in, the kernel, the copy
 * out, all on the caller's stream.
 */
#include <string.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "onerank.h"
#include "op_math.h"
#include "runtime_int.h"
#include "copy_abi.h"
#include "scale_abi.h"

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
 * Whether @p s is being captured into a CUDA graph. When the query itself
 * is refused (the legacy stream while another thread captures in global
 * mode), the answer is yes: the copy then takes the form legal everywhere.
 */
static bool stream_capturing(cudaStream_t s)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/*
 * A launch of a one-rank identity plan (gpu_plan.ident): its output is its
 * input. In place (one buffer: at rank 0 every collective's aliasing is
 * send == recv) nothing is enqueued, so nothing is captured into a graph
 * either; out of place one device copy on the call's stream at the
 * device's copy bandwidth, not the one thread block's of the plan. Run
 * eagerly the copy is a kernel of our own, whose launch costs the host
 * about 1 us less than cudaMemcpyAsync's; under capture it is a memcpy
 * node, which a graph runs faster than a kernel node (0.84 against 0.92
 * us at 1 KB on one H200). It gives the bytes the program would: every
 * output chunk is the input chunk of the same index and size.
 */
static mscx_status_t onerank_launch(const void *sendbuf, void *recvbuf, uint64_t bytes, cudaStream_t s)
{
    if (sendbuf == recvbuf || bytes == 0)
        return MSCX_OK;
    if (!stream_capturing(s)) {
        int rc = mscx_gpu_copy_launch(recvbuf, sendbuf, bytes, s);
        return rc ? mscx_gpu_check((cudaError_t)rc, "one-rank copy") : MSCX_OK;
    }
    if (cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDefault, s) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "one-rank copy");
    return MSCX_OK;
}

/*
 * This rank's geometry of a call of @p msg_bytes: refuses a size the plan
 * cannot take, or one that needs more scratch than was allocated
 * (max_msg_bytes).
 */
static mscx_status_t call_geom(const struct mscx_exec *ex, const struct gpu_plan *gp, uint64_t msg_bytes,
                               enum mscx_dtype dtype, struct mscx_geom *g_p)
{
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
        MSCX_WARN(
            "caller bug: plan %s: %llu bytes need %llu bytes of scratch, %llu allocated (max_msg_bytes)",
            plan->name, (unsigned long long)msg_bytes, (unsigned long long)g.scratch_bytes,
            (unsigned long long)gp->scratch_bytes);
        return MSCX_ERR_INVALID_ARG;
    }
    *g_p = g;
    return MSCX_OK;
}

/* The geometry of every class of @p gp for the call of @p g (class 0: this rank's, @p g itself). */
static mscx_status_t class_geoms(const struct gpu_plan *gp, uint64_t msg_bytes, enum mscx_dtype dtype,
                                 const struct mscx_geom *g, struct mscx_gpu_geom *geom)
{
    const struct mscx_plan *plan = gp->plan;
    char err[256];
    for (uint32_t c = 0; c < gp->ngeom; c++) {
        struct mscx_geom h = *g;
        uint32_t o = gp->geom_rank[c];
        mscx_status_t st;
        if (c > 0 && (st = mscx_plan_geom(plan, o, g->in_bytes, g->out_bytes, dtype, &h, err, sizeof(err))) !=
                         MSCX_OK) {
            MSCX_WARN("caller bug: plan %s, rank %u, %llu bytes: %s", plan->name, o,
                      (unsigned long long)msg_bytes, err);
            return st;
        }
        geom[c].slot = h.slot;
        geom[c].in_chunk = h.in_chunk;
        geom[c].out_chunk = h.out_chunk;
    }
    return MSCX_OK;
}

/* The cached arguments of a call of geometry @p g: the context's tables, the geometry classes, the flags. */
static void args_fill(struct gpu_plan *gp, const struct mscx_geom *g, const struct mscx_gpu_geom *geom,
                      const struct mscx_config *cfg, enum mscx_pkt_format pkt)
{
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
    a->in_bytes = g->in_bytes;
    a->out_bytes = g->out_bytes;
    for (uint32_t c = 0; c < gp->ngeom; c++)
        a->geom[c] = geom[c];
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
}

/*
 * Cache the arguments and the compiled program of calls of (@p msg_bytes,
 * @p dtype, @p pkt). The cache is left as it was when the size is refused.
 */
static mscx_status_t args_cache(struct mscx_exec *ex, struct gpu_plan *gp, uint64_t msg_bytes,
                                enum mscx_dtype dtype, enum mscx_pkt_format pkt)
{
    const struct mscx_config *cfg;
    struct mscx_geom g;
    struct mscx_gpu_geom geom[MSCX_GPU_MAX_GEOM];
    MSCX_CHECK(call_geom(ex, gp, msg_bytes, dtype, &g));
    MSCX_CHECK(mscx_config_get(&cfg));
    MSCX_CHECK(class_geoms(gp, msg_bytes, dtype, &g, geom));
    args_fill(gp, &g, geom, cfg, pkt);
    gp->c_kent = cfg->exec_compile && !gp->ident ? mscx_progcache_find(gp, gp->plan, ex->bs.rank, msg_bytes,
                                                                       (int)dtype, (int)pkt, 0, &gp->c_args)
                                                 : -1;
    gp->c_kent_split = -2;
    gp->c_msg = msg_bytes;
    gp->c_dtype = (int)dtype;
    gp->c_pkt = (int)pkt;
    return MSCX_OK;
}

/*
 * The compiled program a call runs (an index in gp->prog_slot, -1: none) and
 * whether its buffers are staged (*staged_p). A call whose placement
 * differs from the plan's is staged (alias_adapt), unless the compiled
 * program can serve it directly: an out-of-place call on an in-place
 * AllReduce plan runs the program split to read the send and write the
 * receive buffer (mscx_gpu_program_split); an in-place call on an out-of-place
 * plan runs the program as it is where it never reads an input byte after
 * something overwrote it (mscx_gpu_program_alias_ok). Both need what the fast
 * kernel needs, and 16-byte aligned buffers.
 */
static int pick_program(struct mscx_exec *ex, struct gpu_plan *gp, const void *sendbuf, void *recvbuf,
                        uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_pkt_format pkt, int *staged_p)
{
    struct mscx_gpu_args *a = &gp->c_args;
    int kent = gp->c_kent, staged = 1;
    if (kent >= 0 && gp->prog_slot[kent].whole && !gp->port && !gp->publish && !gp->peer_bufs &&
        (((uintptr_t)sendbuf | (uintptr_t)recvbuf) & 15u) == 0 &&
        call_is_inplace(gp, ex->bs.rank, sendbuf, recvbuf) != (int)gp->plan->inplace) {
        if (gp->plan->inplace && gp->plan->coll == MSCX_COLL_ALLREDUCE) {
            if (gp->c_kent_split == -2)
                gp->c_kent_split =
                    mscx_progcache_find(gp, gp->plan, ex->bs.rank, msg_bytes, (int)dtype, (int)pkt, 1, a);
            if (gp->c_kent_split >= 0) {
                kent = gp->c_kent_split;
                staged = 0;
            }
        } else if (!gp->plan->inplace && gp->prog_slot[kent].alias) {
            staged = 0;
        }
    }
    *staged_p = staged;
    return kent;
}

/* Program entry @p kent in the arguments (uploaded first), when the kernel's buffers are 16-byte aligned. */
static mscx_status_t args_program(struct mscx_exec *ex, struct gpu_plan *gp, int kent,
                                  const struct alias_plan *ap)
{
    struct mscx_gpu_args *a = &gp->c_args;
    a->program = NULL;
    a->whole = 0;
    a->packet = 0;
    if (kent >= 0 && (((uintptr_t)ap->in | (uintptr_t)ap->out) & 15u) == 0) {
        struct prog_slot *e = &gp->prog_slot[kent];
        MSCX_CHECK(mscx_progcache_upload(ex, gp, e));
        a->program = gp->prog_dev + e->off;
        a->kstride = e->stride;
        a->kmax_ops = e->kmax_ops;
        a->kmax_opnd = e->kmax_opnd;
        a->interp_mask = e->interp_mask;
        a->whole = e->whole && !gp->port && !gp->publish && !gp->peer_bufs;
        a->packet = a->whole && e->packet;
    }
    return MSCX_OK;
}

/* The staging copy in, the kernel (unless this rank has nothing to run) and the copy out, on @p stream. */
static mscx_status_t enqueue(const struct gpu_plan *gp, const struct alias_plan *ap, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (ap->pre_bytes &&
        cudaMemcpyAsync(ap->pre_dst, ap->pre_src, ap->pre_bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "staging copy");
    if (gp->ntb != 0 && !(gp->idle && !gp->publish)) {
        int rc = mscx_gpu_kernel_launch(&gp->c_args, gp->ntb, gp->nthreads, gp->pdl, stream);
        if (rc != 0)
            return mscx_gpu_check((cudaError_t)rc, "kernel launch");
    }
    if (ap->post_bytes && cudaMemcpyAsync(ap->post_dst, ap->post_src, ap->post_bytes,
                                          cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "staging copy");
    return MSCX_OK;
}

/* One launch of a ready plan, its arguments checked, after the previous launch of the executor. */
static mscx_status_t launch_run(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                                uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                                enum mscx_pkt_format pkt, void *stream)
{
    struct gpu_plan *gp = &ex->plans[plan_id];
    mscx_gpu_stream_note(ex, (cudaStream_t)stream);
    if (gp->c_msg != msg_bytes || gp->c_dtype != (int)dtype || gp->c_pkt != (int)pkt)
        MSCX_CHECK(args_cache(ex, gp, msg_bytes, dtype, pkt));
    if (gp->ident && gp->c_args.in_bytes == gp->c_args.out_bytes && mscx_redop_keeps_one_value(op))
        return onerank_launch(sendbuf, recvbuf, gp->c_args.in_bytes, (cudaStream_t)stream);
    /* the arguments are passed by value (cudaLaunchKernel copies them): the cached ones change in place */
    struct mscx_gpu_args *a = &gp->c_args;
    struct alias_plan ap = {sendbuf, recvbuf, NULL, NULL, NULL, NULL, 0, 0};
    int staged;
    int kent = pick_program(ex, gp, sendbuf, recvbuf, msg_bytes, dtype, pkt, &staged);
    if (staged)
        MSCX_CHECK(alias_adapt(gp, ex->bs.rank, sendbuf, recvbuf, &ap));
    if (gp->peer_bufs) {
        /* peers in other processes reach this rank's buffers, or this rank theirs: agree on this launch's */
        MSCX_CHECK(
            mscx_peer_bufs_launch(gp->peer_bufs, ap.in, a->in_bytes, ap.out, a->out_bytes, stream, a->uptr));
    }
    a->in = ap.in;
    a->out = ap.out;
    a->dtype = dtype;
    a->op = op;
    a->pkt = pkt;
    MSCX_CHECK(args_program(ex, gp, kent, &ap));
    mscx_status_t st = enqueue(gp, &ap, stream);
    if (gp->peer_bufs)
        mscx_peer_bufs_launched(gp->peer_bufs, stream); /* whatever enqueue met: its kernel may be in */
    return st;
}

/*
 * Launches of one executor run in the order they were made, whatever their
 * streams (launch_order.h): on the stream of the previous launch this is
 * one compare; on another one the launch first waits for the previous one.
 * The wait and the marks stay enqueued when the launch itself fails.
 */
static mscx_status_t order_finish(struct mscx_exec *ex, void *stream, unsigned steps, mscx_status_t st)
{
    if (steps & MSCX_ORDER_AFTER) {
        mscx_status_t o = mscx_gpu_order_leave(ex, (cudaStream_t)stream, steps);
        if (st == MSCX_OK)
            st = o;
    }
    return st;
}

/* Whether plan @p plan_id of @p ex may be launched (every rank added it). */
static int plan_ready(const struct mscx_exec *ex, uint32_t plan_id)
{
    if (ex->plans[plan_id].ready)
        return 1;
    MSCX_WARN("caller bug: plan %u launched before every rank added it", plan_id);
    return 0;
}

mscx_status_t mscx_exec_launch(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                               uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                               enum mscx_pkt_format pkt, void *stream)
{
    if (!ex || plan_id >= ex->nplans || (unsigned)dtype >= MSCX_DT_COUNT ||
        (unsigned)op >= MSCX_REDOP_COUNT || (pkt != MSCX_PKT_LL16 && pkt != MSCX_PKT_LL8))
        return MSCX_ERR_INVALID_ARG;
    if (!plan_ready(ex, plan_id))
        return MSCX_ERR_INVALID_ARG;
    unsigned steps = 0;
    if (stream != ex->ord.last)
        MSCX_CHECK(mscx_gpu_order_enter(ex, (cudaStream_t)stream, &steps));
    mscx_status_t st = launch_run(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, op, pkt, stream);
    return order_finish(ex, stream, steps, st);
}

/* Whether @p sc is a scale a launch of @p dtype, @p op on @p gp can apply. */
static int scale_usable(const struct gpu_plan *gp, enum mscx_dtype dtype, enum mscx_redop op,
                        const struct mscx_scale *sc)
{
    if ((sc->kind != MSCX_SCALE_HOST && sc->kind != MSCX_SCALE_DEVICE) ||
        (sc->kind == MSCX_SCALE_DEVICE && !sc->dev_ptr) || op != MSCX_REDOP_SUM ||
        !mscx_dtype_scalable((unsigned)dtype))
        return 0;
    return gp->plan->coll == MSCX_COLL_ALLREDUCE || gp->plan->coll == MSCX_COLL_REDUCESCATTER;
}

static mscx_status_t scale_enqueue(enum mscx_dtype dtype, void *dst, const void *src, uint64_t bytes,
                                   const struct mscx_scale *sc, void *stream)
{
    const void *dev = sc->kind == MSCX_SCALE_DEVICE ? sc->dev_ptr : NULL;
    int rc = mscx_gpu_scale_launch((unsigned)dtype, dst, src, bytes, sc->value_bits, dev, stream);
    return rc != 0 ? mscx_gpu_check((cudaError_t)rc, "scale kernel launch") : MSCX_OK;
}

/*
 * The plan's run on the scaled input in the staging buffer (gp->tmp, which
 * this placement leaves free: AllReduce runs out of place from it, and so
 * does an out-of-place ReduceScatter plan; an in-place one runs in place on
 * it and its slice is copied to the output).
 */
static mscx_status_t scaled_run(struct mscx_exec *ex, uint32_t plan_id, void *recvbuf, uint64_t msg_bytes,
                                enum mscx_dtype dtype, enum mscx_pkt_format pkt, void *stream)
{
    struct gpu_plan *gp = &ex->plans[plan_id];
    if (gp->plan->coll != MSCX_COLL_REDUCESCATTER || !gp->plan->inplace)
        return launch_run(ex, plan_id, gp->tmp, recvbuf, msg_bytes, dtype, MSCX_REDOP_SUM, pkt, stream);
    uint64_t out = gp->c_args.out_bytes;
    char *slice = gp->tmp + (uint64_t)ex->bs.rank * out;
    MSCX_CHECK(launch_run(ex, plan_id, gp->tmp, slice, msg_bytes, dtype, MSCX_REDOP_SUM, pkt, stream));
    if (out &&
        cudaMemcpyAsync(recvbuf, slice, out, cudaMemcpyDeviceToDevice, (cudaStream_t)stream) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "scaled output copy");
    return MSCX_OK;
}

/*
 * The scaled launch, checked, after the previous launch of the executor:
 * the scaling kernel writes the staging buffer, so it is ordered too.
 */
static mscx_status_t scaled_launch_run(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf,
                                       void *recvbuf, uint64_t msg_bytes, enum mscx_dtype dtype,
                                       const struct mscx_scale *scale, enum mscx_pkt_format pkt, void *stream)
{
    struct gpu_plan *gp = &ex->plans[plan_id];
    if (gp->c_msg != msg_bytes || gp->c_dtype != (int)dtype || gp->c_pkt != (int)pkt)
        MSCX_CHECK(args_cache(ex, gp, msg_bytes, dtype, pkt));
    uint64_t in = gp->c_args.in_bytes;
    if (in == 0)
        return launch_run(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, MSCX_REDOP_SUM, pkt, stream);
    if (gp->ident && in == gp->c_args.out_bytes) /* the output is the scaled input */
        return scale_enqueue(dtype, recvbuf, sendbuf, in, scale, stream);
    if (in > gp->tmp_bytes) {
        MSCX_WARN(
            "caller bug: plan %s: a scaled launch of %llu bytes needs %llu staging bytes, %llu allocated "
            "(max_msg_bytes)",
            gp->plan->name, (unsigned long long)msg_bytes, (unsigned long long)in,
            (unsigned long long)gp->tmp_bytes);
        return MSCX_ERR_INVALID_ARG;
    }
    MSCX_CHECK(scale_enqueue(dtype, gp->tmp, sendbuf, in, scale, stream));
    return scaled_run(ex, plan_id, recvbuf, msg_bytes, dtype, pkt, stream);
}

mscx_status_t mscx_exec_launch_scaled(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf,
                                      void *recvbuf, uint64_t msg_bytes, enum mscx_dtype dtype,
                                      enum mscx_redop op, const struct mscx_scale *scale,
                                      enum mscx_pkt_format pkt, void *stream)
{
    if (!scale || scale->kind == MSCX_SCALE_NONE)
        return mscx_exec_launch(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, op, pkt, stream);
    if (!ex || plan_id >= ex->nplans || (unsigned)dtype >= MSCX_DT_COUNT ||
        (pkt != MSCX_PKT_LL16 && pkt != MSCX_PKT_LL8))
        return MSCX_ERR_INVALID_ARG;
    if (!plan_ready(ex, plan_id))
        return MSCX_ERR_INVALID_ARG;
    struct gpu_plan *gp = &ex->plans[plan_id];
    if (!scale_usable(gp, dtype, op, scale)) {
        MSCX_WARN("caller bug: plan %s: a scaled launch of %s %s (scale kind %d)", gp->plan->name,
                  mscx_redop_name(op), mscx_dtype_name(dtype), (int)scale->kind);
        return MSCX_ERR_INVALID_ARG;
    }
    unsigned steps = 0;
    if (stream != ex->ord.last)
        MSCX_CHECK(mscx_gpu_order_enter(ex, (cudaStream_t)stream, &steps));
    mscx_status_t st = scaled_launch_run(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, scale, pkt, stream);
    return order_finish(ex, stream, steps, st);
}
