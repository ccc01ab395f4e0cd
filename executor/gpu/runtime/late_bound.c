/* SPDX-License-Identifier: MIT */
/*
 * The late-bound region of one plan context (TCP): puts from other nodes
 * into this rank's input or output buffer name the launch flag; this rank's
 * kernel publishes the buffers of each launch (ctx->pub, by flag parity,
 * flag last with a release) when it starts, so the receiver thread reads
 * the flag of that parity from device memory: equal, the buffers are that
 * launch's (read the pointers, then the flag again); older, the launch has
 * not started here yet (the transport asks again, up to MSCX_TIMEOUT_MS);
 * newer, the launch's buffers were replaced (an error: it would need the
 * sender to be two launches behind a receiver that waits for its data).
 * The resolver is called from the TCP receiver thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mscx/log.h"
#include "port_int.h"

struct late_res {
    struct gpu_net *n;
    const struct mscx_gpu_pub *pub; /* device address of this rank's publication */
    uint32_t rank;
    char plan[64];
    struct mscx_tp_mr *mr;
    struct mscx_late_pub cache[2]; /* by parity: the last publication read whole */
};

static mscx_status_t read_dev(struct gpu_net *n, void *dst, const void *src, size_t len)
{
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, n->rx_stream)));
    return CU(cudaStreamSynchronize(n->rx_stream));
}

/*
 * The publication of a parity is read flag first, then the pointers and
 * sizes, then the flag again: equal both times, they are that launch's (the
 * next launch of the parity publishes only after this one completed, and a
 * receiver that waits for this put's signal does not complete before it).
 */
static mscx_status_t late_resolve(void *ctx, uint32_t buf, uint32_t launch, uint64_t off, uint64_t len,
                                  void **dst_p, unsigned *mr_flags_p)
{
    struct late_res *lr = ctx;
    uint32_t par = launch & 1u;
    struct mscx_late_pub *c = &lr->cache[par];
    if (c->flag != launch && launch != 0) {
        struct mscx_late_pub now;
        memset(&now, 0, sizeof(now));
        MSCX_CHECK(read_dev(lr->n, &now.flag, &lr->pub->flag[par], 4));
        if (now.flag == launch) {
            uint32_t again = 0;
            MSCX_CHECK(read_dev(lr->n, now.ptr, lr->pub->ptr[par], sizeof(now.ptr)));
            MSCX_CHECK(read_dev(lr->n, now.bytes, lr->pub->bytes[par], sizeof(now.bytes)));
            MSCX_CHECK(read_dev(lr->n, &again, &lr->pub->flag[par], 4));
            if (again != launch)
                memset(&now, 0, sizeof(now)), now.flag = again;
        }
        if (now.flag == launch)
            *c = now;
        else
            return mscx_late_pick(&now, lr->rank, lr->plan, buf, launch, off, len, dst_p);
    }
    mscx_status_t st = mscx_late_pick(c, lr->rank, lr->plan, buf, launch, off, len, dst_p);
    if (st == MSCX_OK)
        *mr_flags_p = MSCX_TP_MR_GPU;
    return st;
}

int mscx_gpu_late_target(const struct gpu_port_setup *s, uint32_t rank)
{
    for (uint32_t r = 0; r < s->plan->nranks; r++) {
        const struct mscx_gpu *g = &s->plan->gpus[r];
        for (uint32_t i = 0; s->node[r] != s->node[rank] && i < g->nrbuf; i++)
            if (g->rbuf[i].rank == rank && g->rbuf[i].type != MSCX_BUF_SCRATCH)
                return 1;
    }
    return 0;
}

struct late_res *mscx_gpu_late_create(struct gpu_net *n, const struct mscx_gpu_pub *pub, uint32_t rank,
                                      const char *plan_name)
{
    struct late_res *lr = calloc(1, sizeof(*lr));
    if (!lr)
        return NULL;
    lr->n = n;
    lr->pub = pub;
    lr->rank = rank;
    snprintf(lr->plan, sizeof(lr->plan), "%s", plan_name);
    return lr;
}

mscx_status_t mscx_gpu_late_register(struct late_res *lr, struct mscx_tp_rdesc *desc_p)
{
    return mscx_tp_tcp.mr_register_late(lr->n->ep, late_resolve, lr, &lr->mr, desc_p);
}

void mscx_gpu_late_destroy(struct late_res *lr)
{
    if (!lr)
        return;
    if (lr->mr)
        lr->n->tp->mr_deregister(lr->n->ep, lr->mr);
    free(lr);
}
