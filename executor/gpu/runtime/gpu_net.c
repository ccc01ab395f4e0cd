/* SPDX-License-Identifier: MIT */
/*
 * The network state of one executor (struct gpu_net, port_int.h): the
 * proxy's and the receiver's streams, the signal ring of the cuda links,
 * and the transport between nodes: its choice (MSCX_TRANSPORT, agreed by
 * every rank), the endpoint with its bounce buffer, the connections, and
 * the hooks through which the endpoint's receiver thread writes GPU memory.
 */
#include <stdlib.h>
#include <string.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "port_int.h"

#define CONNECT_GRACE_MS 30000u

void mscx_gpu_net_close(struct gpu_net *n)
{
    if (!n || !n->ep)
        return;
    n->tp->ep_destroy(n->ep); /* closes connections, stops the receiver, frees regions */
    n->ep = NULL;
}

void mscx_gpu_net_destroy(struct gpu_net *n)
{
    if (!n)
        return;
    cudaSetDevice(n->device);
    mscx_gpu_net_close(n);
    free(n->conn);
    if (n->stream)
        cudaStreamSynchronize(n->stream);
    for (uint32_t i = 0; i < SIG_RING / SIG_GROUP; i++)
        if (n->ring_ev[i])
            cudaEventDestroy(n->ring_ev[i]);
    if (n->flush_ev)
        cudaEventDestroy(n->flush_ev);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    if (n->rx_stream)
        cudaStreamDestroy(n->rx_stream);
    if (n->ring)
        cudaFreeHost(n->ring);
    if (n->bounce)
        cudaFreeHost(n->bounce);
    free(n);
}

mscx_status_t mscx_gpu_net_create(int device, uint32_t nranks, struct gpu_net **net_p)
{
    mscx_status_t st;
    struct gpu_net *n = calloc(1, sizeof(*n));
    if (!n)
        return MSCX_ERR_NO_MEMORY;
    n->device = device;
    n->nranks = nranks;
    n->conn = calloc(nranks, sizeof(*n->conn));
    if (!n->conn) {
        free(n);
        return MSCX_ERR_NO_MEMORY;
    }
    if ((st = CU(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking))) != MSCX_OK ||
        (st = CU(cudaStreamCreateWithFlags(&n->rx_stream, cudaStreamNonBlocking))) != MSCX_OK ||
        (st = CU(cudaEventCreateWithFlags(&n->flush_ev, cudaEventDisableTiming))) != MSCX_OK ||
        (st = CU(cudaHostAlloc((void **)&n->ring, SIG_RING * sizeof(uint64_t), cudaHostAllocDefault))) !=
            MSCX_OK)
        goto err;
    for (uint32_t i = 0; i < SIG_RING / SIG_GROUP; i++)
        if ((st = CU(cudaEventCreateWithFlags(&n->ring_ev[i], cudaEventDisableTiming))) != MSCX_OK)
            goto err;
    *net_p = n;
    return MSCX_OK;
err:
    mscx_gpu_net_destroy(n);
    return st;
}

/* ---- the receiver thread's hooks (TCP) ---- */

static mscx_status_t rx_copy(void *ctx, void *dst, const void *src, size_t len, unsigned put_flags,
                             unsigned mr_flags)
{
    struct gpu_net *n = ctx;
    (void)put_flags;
    if (!(mr_flags & MSCX_TP_MR_GPU)) {
        memcpy(dst, src, len);
        return MSCX_OK;
    }
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, n->rx_stream)));
    return CU(cudaStreamSynchronize(n->rx_stream));
}

static mscx_status_t rx_add(void *ctx, uint64_t *dst, unsigned mr_flags)
{
    struct gpu_net *n = ctx;
    uint64_t v = 0;
    if (!(mr_flags & MSCX_TP_MR_GPU)) {
        __atomic_fetch_add(dst, 1, __ATOMIC_RELEASE);
        return MSCX_OK;
    }
    /* this receiver is the only writer of the token: read, add one, write back */
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaMemcpyAsync(&v, dst, 8, cudaMemcpyDeviceToHost, n->rx_stream)));
    MSCX_CHECK(CU(cudaStreamSynchronize(n->rx_stream)));
    v++;
    MSCX_CHECK(CU(cudaMemcpyAsync(dst, &v, 8, cudaMemcpyHostToDevice, n->rx_stream)));
    return CU(cudaStreamSynchronize(n->rx_stream));
}

/* ---- the transport ---- */

/*
 * Whether this rank can use ib under MSCX_TRANSPORT @p mode (auto or ib):
 * an RDMA device opens (its endpoint in *ep_p) and CUDA can export GPU
 * memory as a dmabuf. Else *why_p says why not.
 */
static int ib_usable(const char *mode, const struct mscx_tp_params *p, struct mscx_tp_ep **ep_p,
                     const char **why_p)
{
#ifdef MSCX_NET_HAS_IB
    if (strcmp(mode, "tcp") != 0) {
        mscx_status_t st;
        if (strcmp(mode, "auto") == 0)
            MSCX_NOWARN(st = mscx_tp_ib.ep_create(p, ep_p));
        else
            st = mscx_tp_ib.ep_create(p, ep_p);
        if (st != MSCX_OK)
            *why_p = "no usable RDMA device (libibverbs missing, no device or no active port)";
        else if (!mscx_gpu_dmabuf_available())
            *why_p = "RDMA device present, but CUDA cannot export GPU memory as a dmabuf (no GPUDirect RDMA)";
        else
            return 1;
    }
#else
    (void)p;
    (void)ep_p;
    if (strcmp(mode, "tcp") != 0)
        *why_p = "built without infiniband/verbs.h";
#endif
    return 0;
}

/*
 * Choose the transport between nodes (collective: every rank must agree).
 * auto: ib when this rank opened an RDMA device and can export GPU memory as
 * a dmabuf, and so can every other rank; else tcp. ib: the same, but an error
 * when some rank cannot. tcp: tcp.
 */
static mscx_status_t net_choose(struct gpu_net *n, const struct gpu_port_setup *s,
                                const struct mscx_tp_params *p)
{
    const struct mscx_config *cfg;
    const char *why = "MSCX_TRANSPORT tcp";
    uint32_t nr = s->plan->nranks;
    MSCX_CHECK(mscx_config_get(&cfg));
    const char *mode = cfg->transport && cfg->transport[0] ? cfg->transport : "auto";
    if (strcmp(mode, "auto") != 0 && strcmp(mode, "ib") != 0 && strcmp(mode, "tcp") != 0) {
        MSCX_WARN("MSCX_TRANSPORT is %s: expected auto, ib or tcp", mode);
        return MSCX_ERR_INVALID_ARG;
    }
    uint8_t mine = 0, *all = calloc(nr, 1);
    if (!all)
        return MSCX_ERR_NO_MEMORY;
    struct mscx_tp_ep *ib_ep = NULL;
    mine = (uint8_t)ib_usable(mode, p, &ib_ep, &why);
    mscx_status_t st = s->bs->allgather(s->bs->ctx, &mine, all, 1);
    uint32_t bad = UINT32_MAX;
    for (uint32_t r = 0; st == MSCX_OK && r < nr; r++)
        if (!all[r] && bad == UINT32_MAX)
            bad = r;
    free(all);
    if (st != MSCX_OK) {
        MSCX_WARN("rank %u: exchanging the transport choice failed: %s", s->rank, mscx_status_str(st));
        goto err;
    }
    if (bad == UINT32_MAX) {
#ifdef MSCX_NET_HAS_IB
        n->tp = &mscx_tp_ib;
        n->plink = &mscx_plink_ib;
        n->ep = ib_ep;
        MSCX_INFO(
            MSCX_SUB_PROXY,
            "rank %u: port channels between nodes use ib (MSCX_TRANSPORT %s): GPU scratch registered through "
            "dmabuf (GPUDirect RDMA), put sources staged through a registered host bounce buffer",
            s->rank, mode);
        return MSCX_OK;
#endif
    }
    if (ib_ep)
        mscx_tp_ib.ep_destroy(ib_ep);
    if (strcmp(mode, "ib") == 0) {
        if (mine)
            MSCX_WARN("rank %u: MSCX_TRANSPORT is ib, but rank %u cannot use it; refusing", s->rank, bad);
        else
            MSCX_WARN("rank %u: MSCX_TRANSPORT is ib, but this rank cannot use it: %s; refusing", s->rank,
                      why);
        return MSCX_ERR_UNSUPPORTED;
    }
    n->tp = &mscx_tp_tcp;
    n->plink = &mscx_plink_tcp;
    MSCX_INFO(MSCX_SUB_PROXY, "rank %u: port channels between nodes use tcp (MSCX_TRANSPORT %s: %s)", s->rank,
              mode,
              strcmp(mode, "tcp") == 0 ? why
              : mine                   ? "another rank cannot use ib"
                                       : why);
    return mscx_tp_tcp.ep_create(p, &n->ep);
err:
    if (ib_ep)
        mscx_tp_ib.ep_destroy(ib_ep);
    return st;
}

/* Same communicator id on every rank: a hash of every rank's process identity. */
static uint64_t comm_id(const struct gpu_peer *peers, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t r = 0; r < n; r++) {
        const unsigned char *p = (const unsigned char *)&peers[r];
        for (size_t i = 0; i < offsetof(struct gpu_peer, vnodes); i++)
            h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

mscx_status_t mscx_gpu_net_connect(struct gpu_net *n, const struct gpu_port_setup *s)
{
    const struct mscx_plan *plan = s->plan;
    uint32_t rank = s->rank, nr = plan->nranks;
    if (!n->ep) {
        struct mscx_tp_params p = {.rank = rank,
                                   .nranks = nr,
                                   .comm_id = comm_id(s->peers, nr),
                                   .copy_to_target = rx_copy,
                                   .add_to_target = rx_add,
                                   .hook_ctx = n,
                                   .late_timeout_ms = s->timeout_ms};
        if (s->bs->secret)
            memcpy(p.secret, s->bs->secret, sizeof(p.secret));
        MSCX_CHECK(net_choose(n, s, &p));
        MSCX_CHECK(CU(cudaHostAlloc(&n->bounce, BOUNCE_BYTES, cudaHostAllocDefault)));
        struct mscx_tp_rdesc unused;
        MSCX_CHECK(n->tp->mr_register(n->ep, n->bounce, BOUNCE_BYTES, 0, -1, &n->bounce_mr, &unused));
    }
    uint8_t *want = calloc(nr, 1);
    struct mscx_tp_conn **got = calloc(nr, sizeof(*got));
    mscx_status_t st = MSCX_OK;
    if (!want || !got) {
        st = MSCX_ERR_NO_MEMORY;
        goto out; /* the other ranks fail in their bootstrap exchange */
    }
    const struct mscx_gpu *g = &plan->gpus[rank];
    for (uint32_t k = 0; k < g->nchan[MSCX_CHAN_PORT]; k++) {
        uint32_t p = g->chan[MSCX_CHAN_PORT][k].peer;
        if (s->node[p] != s->node[rank] && !n->conn[p])
            want[p] = 1;
    }
    uint64_t dl = mscx_tp_deadline(s->timeout_ms ? s->timeout_ms + CONNECT_GRACE_MS : 0);
    st = mscx_tp_connect_all(n->tp, n->ep, rank, nr, want, s->bs->allgather, s->bs->ctx, dl, got);
    if (st != MSCX_OK) {
        MSCX_WARN("plan %s: rank %u: %s connections to the ranks of other nodes failed: %s", plan->name, rank,
                  n->tp->name, mscx_status_str(st));
        goto out;
    }
    for (uint32_t p = 0; p < nr; p++) {
        if (got[p]) {
            n->conn[p] = got[p];
            MSCX_INFO(MSCX_SUB_PROXY, "rank %u: %s connection to rank %u (node %u)", rank, n->tp->name, p,
                      s->node[p]);
        }
    }
out:
    free(want);
    free(got);
    return st;
}
