/* SPDX-License-Identifier: MIT */
/*
 * The compiled programs of a plan context: one per (message size, dtype,
 * packet format, split) seen, compiled by the launch compiler
 * (launch_compile.c), encoded into the context's pinned arena and copied
 * to its device mirror before the first launch that runs it.
 */
#include <string.h>
#include "mscx/log.h"
#include "runtime_int.h"

int mscx_progcache_find(struct gpu_plan *gp, const struct mscx_plan *plan, uint32_t rank, uint64_t msg,
                        int dtype, int pkt, int split, const struct mscx_gpu_args *a)
{
    for (uint32_t i = 0; i < gp->prog_nslot; i++) {
        const struct prog_slot *e = &gp->prog_slot[i];
        if (e->msg == msg && e->dtype == dtype && e->pkt == pkt && e->split == split)
            return e->usable ? (int)i : -1;
    }
    if (!gp->prog_tmp || !mscx_gpu_compile(plan, rank, gp->h_ops, gp->prog_rbuf, a, gp->prog_tmp))
        return -1;
    struct prog_slot e = {msg, dtype, pkt, gp->prog_used, 0, 0, 0, gp->prog_tmp->interp_mask, split, 1, 0,
                          0,   0,     0};
    e.whole = e.interp_mask == 0;
    for (uint32_t i = 0; i < gp->prog_tmp->kbegin[gp->ntb]; i++)
        if (gp->prog_tmp->entry[i].kind == MSCX_ENTRY_GENERIC)
            e.whole = 0;
    if (split && !(e.whole && mscx_gpu_program_split(gp->prog_tmp, gp->ntb, pkt == MSCX_PKT_LL8 ? 4u : 8u,
                                                     a->out_bytes))) {
        /* remembered, so that calls of this shape do not compile again; no arena bytes */
        if (gp->prog_nslot >= MSCX_GPU_PROGRAM_SLOTS)
            return -1;
        e.usable = 0;
        e.off = 0;
        gp->prog_slot[gp->prog_nslot++] = e;
        return -1;
    }
    if (!plan->inplace && e.whole) {
        uint64_t in_at = 0, out_at = 0;
        if (plan->coll == MSCX_COLL_ALLGATHER)
            in_at = (uint64_t)rank * a->in_bytes;
        else if (plan->coll == MSCX_COLL_REDUCESCATTER)
            out_at = (uint64_t)rank * a->out_bytes;
        e.alias = mscx_gpu_program_alias_ok(gp->prog_tmp, gp->ntb, pkt == MSCX_PKT_LL8 ? 4u : 8u, in_at,
                                            out_at, a->in_bytes);
    }
    e.packet = e.whole && mscx_gpu_program_is_packet(gp->prog_tmp, gp->ntb); /* after the split: what runs */
    size_t bytes = 0;
    if (gp->prog_nslot < MSCX_GPU_PROGRAM_SLOTS)
        bytes = mscx_gpu_program_encode(gp->prog_tmp, gp->ntb, gp->scratch, gp->scratch_half,
                                        gp->prog_pin + gp->prog_used, gp->prog_cap - gp->prog_used, &e.stride,
                                        &e.kmax_ops, &e.kmax_opnd);
    if (bytes == 0) {
        if (!gp->prog_full_said)
            MSCX_INFO(MSCX_SUB_EXEC,
                      "plan %s: compiled programs of %u sizes kept, %zu bytes; new sizes run the "
                      "interpreter",
                      plan->name, gp->prog_nslot, gp->prog_used);
        gp->prog_full_said = 1;
        return -1;
    }
    gp->prog_used += (bytes + 255u) & ~(size_t)255u;
    MSCX_INFO(MSCX_SUB_EXEC, "plan %s rank %u: program for %llu bytes%s compiled, %s (%zu bytes)", plan->name,
              rank, (unsigned long long)msg, split ? " (split)" : "",
              e.packet  ? "whole, packet entries only: the packet kernel runs it (sums, untraced)"
              : e.whole ? "whole: the whole-program kernel runs it"
                        : "partly: some blocks interpret",
              bytes);
    gp->prog_slot[gp->prog_nslot] = e;
    return (int)gp->prog_nslot++;
}

/*
 * Make entry @p e's program visible to a kernel on any stream: copied once,
 * on a private stream that is then synchronised (so a later launch on any
 * stream sees it; the copy waits for nothing the caller's streams run).
 * Under capture too: the thread switches to relaxed capture mode for the
 * copy and the wait (calls that global or thread-local capture would refuse),
 * so the graph gets no copy node. (A copy captured ahead of every kernel
 * would add a node to each launch of every graph whose sizes were first
 * seen in capture.)
 */
mscx_status_t mscx_progcache_upload(struct mscx_exec *ex, struct gpu_plan *gp, struct prog_slot *e)
{
    if (e->uploaded)
        return MSCX_OK;
    size_t bytes = (size_t)e->stride * gp->ntb;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
        return mscx_gpu_check(cudaGetLastError(), "capture mode for the program upload");
    cudaError_t rc = cudaSuccess;
    if (!ex->ustream && (rc = cudaStreamCreateWithFlags(&ex->ustream, cudaStreamNonBlocking)) != cudaSuccess)
        ex->ustream = NULL;
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(gp->prog_dev + e->off, gp->prog_pin + e->off, bytes, cudaMemcpyHostToDevice,
                             ex->ustream);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(ex->ustream);
    enum cudaStreamCaptureMode back = mode;
    cudaThreadExchangeStreamCaptureMode(&back);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it, as the caller's next call must not see it */
        return mscx_gpu_check(rc, "program upload");
    }
    e->uploaded = 1;
    return MSCX_OK;
}
