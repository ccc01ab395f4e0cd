/* SPDX-License-Identifier: MIT */
/*
 * Port channels of one plan context through the CPU proxy (gpu_port.h):
 * which of this rank's channels go through it, the regions this rank
 * registers for the ranks of other nodes, a link per proxied channel (cuda
 * on this node, the transport's between nodes), the FIFO and its device
 * state, and the attachment to the process's proxy (proxy.c).
 */
#include <stdlib.h>
#include <string.h>
#include "mscx/log.h"
#include "port_int.h"

struct gpu_port {
    struct gpu_net *net;
    struct mscx_pqueue *q;
    struct mscx_pfifo *fifo;   /* host view (mapped) */
    struct mscx_gpu_port *dev; /* device state + proxied[] + dirty[] */
    uint32_t nchan;
    void **links;
    const struct mscx_plink_ops **lops;
    struct mscx_gpu_host *host;
    int reported;
    void **lbounce;        /* [nchan] RDMA: each link's host bounce ring */
    struct late_res *late; /* this rank's late-bound region (TCP puts into its user buffers), or NULL */
};

static void port_fail(void *ctx, mscx_status_t st)
{
    struct gpu_port *p = ctx;
    struct mscx_gpu_host *h = p->host;
    if (__atomic_load_n(&h->err.code, __ATOMIC_ACQUIRE) == 0) {
        h->err.block = UINT32_MAX; /* the proxy, not a thread block */
        h->err.op = UINT32_MAX;
        h->err.opcode = 0;
        __atomic_store_n(&h->err.code, (int32_t)st, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&h->abort, 1, __ATOMIC_SEQ_CST);
}

void mscx_gpu_port_stop(struct gpu_port *p)
{
    if (!p)
        return;
    if (p->late) {
        /* the receiver thread calls the resolver no more once this returns */
        mscx_gpu_late_destroy(p->late);
        p->late = NULL;
    }
    if (!p->q)
        return;
    mscx_proxy_detach(p->q);
    p->q = NULL;
}

void mscx_gpu_port_free(struct gpu_port *p)
{
    if (!p)
        return;
    mscx_gpu_port_stop(p);
    for (uint32_t k = 0; k < p->nchan; k++) {
        if (!p->links || !p->links[k])
            continue;
        if (p->lops[k] == &mscx_plink_tcp || p->lops[k] == &mscx_plink_ib)
            mscx_plink_tcp_destroy(p->links[k]);
        else
            mscx_gpu_cuda_link_destroy(p->links[k]);
    }
    for (uint32_t k = 0; p->lbounce && k < p->nchan; k++)
        if (p->lbounce[k])
            cudaFreeHost(p->lbounce[k]); /* its registration goes with the endpoint */
    free(p->lbounce);
    free(p->links);
    free(p->lops);
    if (p->dev)
        cudaFree(p->dev);
    if (p->fifo)
        cudaFreeHost(p->fifo);
    free(p);
}

void mscx_gpu_port_report(struct gpu_port *p, uint32_t rank, const char *plan_name)
{
    if (!p || p->reported)
        return;
    p->reported = 1;
    char buf[512];
    mscx_pqueue_describe(p->q, buf, sizeof(buf));
    MSCX_WARN("rank %u plan %s failed with port channels through the proxy: %s", rank, plan_name, buf);
}

/* The staging hook of the links between nodes: a put's source copied to host memory on the proxy stream. */
static mscx_status_t stage_d2h(void *ctx, void *dst, const void *src, size_t len)
{
    struct gpu_net *n = ctx;
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, n->stream)));
    return CU(cudaStreamSynchronize(n->stream));
}

/*
 * Register this rank's scratch and port tokens for TCP peers, and its late-bound region @p lr when peers on
 * other nodes put into its user buffers (NULL: none), and share the descriptors, 3 per rank (collective).
 */
static mscx_status_t share_regions(struct gpu_net *n, const struct gpu_port_setup *s, struct late_res *lr,
                                   struct mscx_tp_rdesc *all)
{
    struct mscx_tp_rdesc mine[3];
    struct mscx_tp_mr *mr;
    uint32_t ntok = s->plan->gpus[s->rank].nchan[MSCX_CHAN_PORT];
    memset(mine, 0, sizeof(mine));
    /* a failure here still takes part in the exchange, so the other ranks fail instead of waiting */
    mscx_status_t lst = MSCX_OK;
    if (n->tp == &mscx_tp_tcp) {
        if (s->scratch_bytes)
            lst = mscx_tp_tcp.mr_register(n->ep, s->scratch, s->scratch_bytes,
                                          MSCX_TP_MR_GPU | MSCX_TP_MR_REMOTE_WRITE, -1, &mr, &mine[0]);
        if (lst == MSCX_OK && ntok)
            lst = mscx_tp_tcp.mr_register(n->ep, s->tok, (size_t)ntok * 8u,
                                          MSCX_TP_MR_GPU | MSCX_TP_MR_REMOTE_WRITE, -1, &mr, &mine[1]);
        if (lst == MSCX_OK && lr)
            lst = mscx_gpu_late_register(lr, &mine[2]);
    } else {
        if (s->scratch_bytes)
            lst = mscx_gpu_ib_register(n, s->scratch, s->scratch_bytes, &mr, &mine[0]);
        if (lst == MSCX_OK && ntok)
            lst = mscx_gpu_ib_register(n, s->tok, (size_t)ntok * 8u, &mr, &mine[1]);
    }
    if (lst != MSCX_OK)
        memset(mine, 0, sizeof(mine)); /* tp 0: peers refuse to use them (mscx_tp_check_remote) */
    mscx_status_t st = s->bs->allgather(s->bs->ctx, mine, all, sizeof(mine));
    if (st != MSCX_OK)
        MSCX_WARN("plan %s: rank %u: exchanging %s region descriptors failed: %s", s->plan->name, s->rank,
                  n->tp->name, mscx_status_str(st));
    else
        st = lst;
    for (uint32_t r = 0; st == MSCX_OK && r < s->plan->nranks; r++) {
        if (r == s->rank || s->node[r] == s->node[s->rank])
            continue;
        if ((s->peers[r].scratch_bytes && all[3u * r].len == 0) ||
            (mscx_gpu_late_target(s, r) && all[3u * r + 2u].tp == 0)) {
            MSCX_WARN("plan %s: rank %u could not register its memory for %s; failing with it", s->plan->name,
                      r, n->tp->name);
            st = MSCX_ERR_REMOTE;
        }
    }
    return st;
}

/* ---- setup ---- */

/* What a port setup holds until the port is attached; build_free frees what is left of it. */
struct port_build {
    const struct gpu_port_setup *s;
    struct gpu_net *n;
    uint8_t *proxied;         /* [nchan] this rank's channel goes through the proxy */
    struct mscx_tp_rdesc *rd; /* [3 * nranks] every rank's region descriptors (between nodes), or NULL */
    struct late_res *lr;      /* this rank's late-bound region until the port holds it, or NULL */
    struct gpu_port *p;
    struct mscx_pchan *pc; /* [nchan] the channels as the proxy serves them */
};

static void build_free(struct port_build *b)
{
    free(b->pc);
    mscx_gpu_late_destroy(b->lr);
    mscx_gpu_port_stop(b->p);
    mscx_gpu_port_free(b->p);
    free(b->rd);
    free(b->proxied);
}

/* Whether some port channel of the plan crosses nodes: every rank decides the same. */
static int crosses_nodes(const struct gpu_port_setup *s)
{
    const struct mscx_plan *plan = s->plan;
    for (uint32_t r = 0; r < plan->nranks; r++)
        for (uint32_t k = 0; k < plan->gpus[r].nchan[MSCX_CHAN_PORT]; k++)
            if (s->node[plan->gpus[r].chan[MSCX_CHAN_PORT][k].peer] != s->node[r])
                return 1;
    return 0;
}

/* Mark this rank's paired port channels to other processes in @p proxied. @return whether there is one */
static int mark_proxied(const struct gpu_port_setup *s, uint8_t *proxied)
{
    const struct mscx_gpu *g = &s->plan->gpus[s->rank];
    int any = 0;
    for (uint32_t k = 0; k < g->nchan[MSCX_CHAN_PORT]; k++) {
        const struct mscx_chan *ch = &g->chan[MSCX_CHAN_PORT][k];
        proxied[k] = ch->paired && !mscx_gpu_same_proc(&s->peers[s->rank], &s->peers[ch->peer]);
        any |= proxied[k];
    }
    return any;
}

/*
 * Between nodes (collective): the connections, the check that the transport
 * serves the late-bound puts the plan has, and every rank's regions.
 */
static mscx_status_t build_between_nodes(struct port_build *b)
{
    const struct gpu_port_setup *s = b->s;
    const struct mscx_plan *plan = s->plan;
    struct gpu_net *n = b->n;
    mscx_status_t st = MSCX_OK;
    b->rd = calloc(3u * plan->nranks, sizeof(*b->rd));
    if (!b->rd)
        return MSCX_ERR_NO_MEMORY;
    MSCX_CHECK(mscx_gpu_net_connect(n, s));
    /* the same answer on every rank (same plan, same transport): all refuse together */
    for (uint32_t r = 0; r < plan->nranks; r++) {
        if (mscx_gpu_late_target(s, r) && !n->tp->mr_register_late) {
            MSCX_WARN("plan %s: a port put from another node writes rank %u's input or output buffer, which "
                      "the %s transport cannot do (it needs the buffer's remote address and key at every "
                      "launch); use MSCX_TRANSPORT=tcp, or a plan that puts into scratch; refusing",
                      plan->name, r, n->tp->name);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    if (mscx_gpu_late_target(s, s->rank) && !(b->lr = mscx_gpu_late_create(n, s->pub, s->rank, plan->name)))
        st = MSCX_ERR_NO_MEMORY; /* the peers fail in the exchange below (no descriptor) */
    mscx_status_t rst = share_regions(n, s, b->lr, b->rd);
    return st != MSCX_OK ? st : rst;
}

/* The port of this rank's @p nchan port channels (it takes the late-bound region), room for the links. */
static mscx_status_t build_port(struct port_build *b, uint32_t nchan)
{
    struct gpu_port *p = calloc(1, sizeof(*p));
    if (!p)
        return MSCX_ERR_NO_MEMORY;
    b->p = p;
    p->net = b->n;
    p->nchan = nchan;
    p->host = b->s->host;
    p->late = b->lr;
    b->lr = NULL;
    p->links = calloc(nchan, sizeof(*p->links));
    p->lops = calloc(nchan, sizeof(*p->lops));
    b->pc = calloc(nchan, sizeof(*b->pc));
    if (!p->links || !p->lops || !b->pc)
        return MSCX_ERR_NO_MEMORY;
    return MSCX_OK;
}

/* A cuda link for channel @p k to @p peer of this node, into the peer's memory mapped here. */
static mscx_status_t link_cuda(struct port_build *b, uint32_t k, uint32_t peer)
{
    const struct gpu_port_setup *s = b->s;
    struct gpu_port *p = b->p;
    mscx_status_t st = mscx_gpu_cuda_link_create(b->n, s->peer_scr[peer],
                                                 (unsigned long long *)s->port_tok[k], &p->links[k]);
    if (st != MSCX_OK)
        return st;
    p->lops[k] = &mscx_gpu_cuda_link_ops;
    if (!s->port_tok[k] || (!s->peer_scr[peer] && b->pc[k].dst_bytes)) {
        MSCX_WARN("internal bug: plan %s: rank %u port channel %u to rank %u on the same node has no "
                  "mapped peer memory",
                  s->plan->name, s->rank, k, peer);
        st = MSCX_ERR_INTERNAL;
    }
    MSCX_INFO(MSCX_SUB_PROXY, "plan %s: rank %u port channel %u to rank %u: proxy, cuda copies",
              s->plan->name, s->rank, k, peer);
    return st;
}

/*
 * The bounce buffer of channel @p k's link between nodes: the endpoint's
 * for TCP; for RDMA, which reads it after put returns, one ring per link,
 * registered once.
 */
static mscx_status_t link_bounce(struct port_build *b, uint32_t k, void **bounce_p, struct mscx_tp_mr **mr_p)
{
    struct gpu_net *n = b->n;
    struct gpu_port *p = b->p;
    struct mscx_tp_rdesc unused;
    if (n->tp == &mscx_tp_tcp) {
        *bounce_p = n->bounce;
        *mr_p = n->bounce_mr;
        return MSCX_OK;
    }
    if (!p->lbounce && !(p->lbounce = calloc(p->nchan, sizeof(*p->lbounce))))
        return MSCX_ERR_NO_MEMORY;
    MSCX_CHECK(CU(cudaHostAlloc(&p->lbounce[k], BOUNCE_BYTES, cudaHostAllocDefault)));
    MSCX_CHECK(n->tp->mr_register(n->ep, p->lbounce[k], BOUNCE_BYTES, 0, -1, mr_p, &unused));
    *bounce_p = p->lbounce[k];
    return MSCX_OK;
}

/* A link of the transport between nodes for channel @p k (@p ch) to its peer on another node. */
static mscx_status_t link_net(struct port_build *b, uint32_t k, const struct mscx_chan *ch)
{
    const struct gpu_port_setup *s = b->s;
    struct gpu_net *n = b->n;
    uint32_t peer = ch->peer;
    void *bounce;
    struct mscx_tp_mr *bmr;
    MSCX_CHECK(link_bounce(b, k, &bounce, &bmr));
    struct mscx_ptcp_link_params lp = {.tp = n->tp,
                                       .ep = n->ep,
                                       .conn = n->conn[peer],
                                       .dst = b->rd[3u * peer],
                                       .tok = b->rd[3u * peer + 1u],
                                       .user = b->rd[3u * peer + 2u],
                                       .tok_off = (uint64_t)ch->pair * 8u,
                                       .bounce_mr = bmr,
                                       .bounce = bounce,
                                       .async_src = n->tp != &mscx_tp_tcp,
                                       .bounce_bytes = BOUNCE_BYTES,
                                       .stage = stage_d2h,
                                       .stage_ctx = n,
                                       .peer = peer};
    if (!lp.conn) {
        MSCX_WARN("internal bug: plan %s: rank %u has no %s connection to rank %u", s->plan->name, s->rank,
                  n->tp->name, peer);
        return MSCX_ERR_INTERNAL;
    }
    mscx_status_t st = mscx_plink_tcp_create(&lp, &b->p->links[k]);
    b->p->lops[k] = n->plink;
    MSCX_INFO(MSCX_SUB_PROXY, "plan %s: rank %u port channel %u to rank %u (node %u): proxy, %s",
              s->plan->name, s->rank, k, peer, s->node[peer], n->tp->name);
    return st;
}

/* A link per proxied channel, and each channel as the proxy serves it. */
static mscx_status_t build_links(struct port_build *b)
{
    const struct gpu_port_setup *s = b->s;
    const struct mscx_gpu *g = &s->plan->gpus[s->rank];
    struct gpu_port *p = b->p;
    mscx_status_t st = MSCX_OK;
    for (uint32_t k = 0; k < p->nchan && st == MSCX_OK; k++) {
        if (!b->proxied[k])
            continue;
        const struct mscx_chan *ch = &g->chan[MSCX_CHAN_PORT][k];
        b->pc[k].peer = ch->peer;
        b->pc[k].dst_bytes = s->peers[ch->peer].scratch_bytes;
        st = s->node[ch->peer] == s->node[s->rank] ? link_cuda(b, k, ch->peer) : link_net(b, k, ch);
        b->pc[k].ops = p->lops[k];
        b->pc[k].link = p->links[k];
    }
    return st;
}

/*
 * Copy @p bytes from host @p src to device @p dst on a private non-blocking
 * stream, then wait for that stream only (no other work on the device).
 */
static mscx_status_t copy_private(void *dst, const void *src, size_t bytes)
{
    cudaStream_t s;
    MSCX_CHECK(CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    mscx_status_t st = CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    if (st == MSCX_OK)
        st = CU(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
    return st;
}

/* The FIFO in mapped host memory, and the port's device state: struct, proxied[nchan], dirty[ntb]. */
static mscx_status_t build_dev_state(struct port_build *b)
{
    struct gpu_port *p = b->p;
    uint32_t nchan = p->nchan;
    mscx_status_t st;
    size_t dev_bytes = sizeof(struct mscx_gpu_port) + 64 + nchan + (size_t)b->s->ntb * 4u + 4u;
    char *img = calloc(1, dev_bytes);
    if (!img)
        return MSCX_ERR_NO_MEMORY;
    if ((st = CU(cudaHostAlloc((void **)&p->fifo, sizeof(struct mscx_pfifo), cudaHostAllocMapped))) !=
            MSCX_OK ||
        (st = CU(cudaMalloc((void **)&p->dev, dev_bytes))) != MSCX_OK)
        goto out;
    memset(p->fifo, 0, sizeof(*p->fifo));
    struct mscx_gpu_port *dp = (struct mscx_gpu_port *)img;
    char *dbase = (char *)p->dev;
    size_t o_prox = (sizeof(struct mscx_gpu_port) + 63) / 64 * 64;
    size_t o_dirty = (o_prox + nchan + 3) / 4 * 4;
    if ((st = CU(cudaHostGetDevicePointer((void **)&dp->fifo, p->fifo, 0))) != MSCX_OK)
        goto out;
    dp->head = 0;
    dp->proxied = (const uint8_t *)(dbase + o_prox);
    dp->dirty = (uint32_t *)(dbase + o_dirty);
    memcpy(img + o_prox, b->proxied, nchan);
    st = copy_private(p->dev, img, dev_bytes);
out:
    free(img);
    return st;
}

static mscx_status_t build_attach(struct port_build *b)
{
    struct gpu_port *p = b->p;
    struct mscx_pqueue_desc qd = {.fifo = p->fifo,
                                  .nchan = p->nchan,
                                  .chan = b->pc,
                                  .rank = b->s->rank,
                                  .name = b->s->plan->name,
                                  .timeout_ms = b->s->timeout_ms,
                                  .fail = port_fail,
                                  .ctx = p};
    return mscx_proxy_attach(&qd, &p->q);
}

mscx_status_t mscx_gpu_port_setup(struct gpu_net **net_p, const struct gpu_port_setup *s,
                                  struct gpu_port **port_p, struct mscx_gpu_port **dev_p)
{
    uint32_t nchan = s->plan->gpus[s->rank].nchan[MSCX_CHAN_PORT];
    struct port_build b = {.s = s};
    mscx_status_t st = MSCX_OK;

    *port_p = NULL;
    *dev_p = NULL;
    int between = crosses_nodes(s);
    b.proxied = calloc(nchan ? nchan : 1, 1);
    if (!b.proxied)
        return MSCX_ERR_NO_MEMORY;
    int any = mark_proxied(s, b.proxied);
    if (!any && !between)
        goto out;
    if (!*net_p && (st = mscx_gpu_net_create(s->device, s->plan->nranks, net_p)) != MSCX_OK)
        goto out;
    b.n = *net_p;
    if (between && (st = build_between_nodes(&b)) != MSCX_OK)
        goto out;
    /* nothing proxied on this rank, so no paired channel from another node either: no late puts */
    if (!any)
        goto out;
    if ((st = build_port(&b, nchan)) != MSCX_OK || (st = build_links(&b)) != MSCX_OK ||
        (st = build_dev_state(&b)) != MSCX_OK || (st = build_attach(&b)) != MSCX_OK)
        goto out;
    *port_p = b.p;
    *dev_p = b.p->dev;
    b.p = NULL;
out:
    build_free(&b);
    return st;
}
