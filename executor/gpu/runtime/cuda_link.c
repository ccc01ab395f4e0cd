/* SPDX-License-Identifier: MIT */
/*
 * The "cuda" proxy link to a peer of the same node in another process:
 * puts and signals are copies on the executor's proxy stream into the
 * peer's memory mapped here (the scheme is in port_int.h).
 */
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "mscx/log.h"
#include "port_int.h"

struct cuda_link {
    struct gpu_net *net;
    char *peer_scr;
    unsigned long long *peer_tok;
    uint64_t count; /* signals sent */
};

static mscx_status_t cl_put(void *link, const void *src, uint64_t dst_off, uint64_t len, unsigned tp_flags,
                            uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    (void)tp_flags; /* a device-to-device copy writes aligned 8-byte units whole */
    (void)deadline_ns;
    MSCX_CHECK(CU(cudaSetDevice(l->net->device)));
    return CU(cudaMemcpyAsync(l->peer_scr + dst_off, src, len, cudaMemcpyDeviceToDevice, l->net->stream));
}

/* The kernel mapped the peer's buffer of this launch (peer_buffers.c) and names its address here. */
static mscx_status_t cl_put_user(void *link, const void *src, const struct mscx_puser *dst, uint64_t len,
                                 uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    (void)deadline_ns;
    if (!dst->addr) {
        MSCX_WARN(
            "internal bug: a put into a user buffer of a peer of the same node without its mapped address");
        return MSCX_ERR_INTERNAL;
    }
    MSCX_CHECK(CU(cudaSetDevice(l->net->device)));
    return CU(
        cudaMemcpyAsync((void *)(uintptr_t)dst->addr, src, len, cudaMemcpyDeviceToDevice, l->net->stream));
}

static mscx_status_t cl_signal(void *link, uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    struct gpu_net *n = l->net;
    (void)deadline_ns;
    uint64_t i = n->ring_n % SIG_RING;
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    /* the copies that last used this group have run (never recorded: returns at once) */
    if (i % SIG_GROUP == 0)
        MSCX_CHECK(CU(cudaEventSynchronize(n->ring_ev[i / SIG_GROUP])));
    n->ring[i] = ++l->count;
    MSCX_CHECK(CU(cudaMemcpyAsync(l->peer_tok, &n->ring[i], 8, cudaMemcpyHostToDevice, n->stream)));
    if (i % SIG_GROUP == SIG_GROUP - 1)
        MSCX_CHECK(CU(cudaEventRecord(n->ring_ev[i / SIG_GROUP], n->stream)));
    n->ring_n++;
    return MSCX_OK;
}

/* Wait for everything issued on the executor's proxy stream, polling, until the deadline. */
static mscx_status_t net_stream_wait(struct gpu_net *n, uint64_t deadline_ns)
{
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaEventRecord(n->flush_ev, n->stream)));
    for (unsigned spins = 0;; spins++) {
        cudaError_t rc = cudaEventQuery(n->flush_ev);
        if (rc == cudaSuccess)
            return MSCX_OK;
        if (rc != cudaErrorNotReady)
            return mscx_gpu_check(rc, "cudaEventQuery(proxy stream)");
        if (mscx_tp_now_ns() >= deadline_ns) {
            MSCX_WARN("proxy: copies on the proxy stream of device %d did not complete before the deadline",
                      n->device);
            return MSCX_ERR_TIMEOUT;
        }
        if (spins < 1024) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static mscx_status_t cl_flush(void *link, int local, uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    (void)local; /* a finished copy has read its source and landed */
    return net_stream_wait(l->net, deadline_ns);
}

const struct mscx_plink_ops mscx_gpu_cuda_link_ops = {
    .name = "cuda",
    .put = cl_put,
    .put_user = cl_put_user,
    .signal = cl_signal,
    .flush = cl_flush,
    .check = NULL, /* a dead peer on the same host shows as a timeout of the waiting kernel */
};

mscx_status_t mscx_gpu_cuda_link_create(struct gpu_net *n, char *peer_scr, unsigned long long *peer_tok,
                                        void **link_p)
{
    struct cuda_link *l = calloc(1, sizeof(*l));
    if (!l)
        return MSCX_ERR_NO_MEMORY;
    l->net = n;
    l->peer_scr = peer_scr;
    l->peer_tok = peer_tok;
    *link_p = l;
    return MSCX_OK;
}

void mscx_gpu_cuda_link_destroy(void *link)
{
    free(link);
}
