/* SPDX-License-Identifier: MIT */
/*
 * RDMA transport for port channels over RC QPs (see transport.h).
 *
 * put    = IBV_WR_RDMA_WRITE, signaled every IB_SIGNAL_EVERY work requests.
 * signal = IBV_WR_ATOMIC_FETCH_AND_ADD of 1 on the 64-bit word. An RC QP
 *          executes requests in order at the responder, so the atomic is
 *          performed after the data of every earlier write has been placed.
 * flush  = post a signaled zero-byte write if the last request was not
 *          signaled, then poll the CQ until every request of the connection
 *          has completed. A completion of a signaled request retires all
 *          earlier ones of its QP.
 * Any completion error, or a QP found in the error state, fails the
 * connection with MSCX_ERR_IBV.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibv_wrap.h"
#include "mscx/env.h"
#include "mscx/log.h"
#include "transport.h"

#define IB_SQ_DEPTH 256
#define IB_CQ_DEPTH 4096
#define IB_SIGNAL_EVERY 32
#define IB_MAX_WRITE (1ull << 30)
#define IB_WRID_PEER_SHIFT 40
#define IB_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

struct ib_blob {
    uint64_t magic;
    uint64_t comm_id;
    uint32_t version;
    uint32_t rank; /* writer */
    uint32_t dst;  /* the rank it is meant for */
    uint32_t qpn;
    uint32_t psn;
    uint16_t lid;
    uint8_t port;
    uint8_t link_layer;
    uint32_t mtu; /* enum ibv_mtu */
    uint8_t gid[16];
};
_Static_assert(sizeof(struct ib_blob) <= MSCX_TP_BLOB_BYTES, "blob too big");

struct mscx_tp_mr {
    struct ibv_mr *mr;
    void *base;
    size_t len;
    unsigned flags;
    struct mscx_tp_mr *prev, *next; /* the endpoint's regions: ep_destroy deregisters what is left */
};

struct mscx_tp_conn {
    struct mscx_tp_ep *ep;
    uint32_t peer;
    struct ibv_qp *qp;
    uint32_t psn;
    uint64_t posted; /* work requests posted */
    uint64_t done;   /* work requests known complete */
    uint64_t last_signaled;
    uint64_t last_raddr; /* any valid remote address / rkey, for the flush write */
    uint32_t last_rkey;
    mscx_status_t err;
};

struct mscx_tp_ep {
    struct mscx_tp_params p;
    const struct mscx_ibv *ibv;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    uint8_t port;
    struct ibv_port_attr pattr;
    union ibv_gid gid;
    int gid_index;
    char devname[64];
    uint64_t *atomic_result; /* fetch-and-add returns land here; never read */
    struct ibv_mr *atomic_mr;
    struct mscx_tp_conn **conns;
    struct mscx_tp_mr *mrs; /* registered regions, newest first */
};

/* ---------------------------------------------------------------- device choice */

int mscx_tp_ib_pci_distance(const char *a, const char *b)
{
    /* Hops from each device up to their closest common ancestor in the sysfs tree. */
    size_t i = 0, common = 0;
    while (a[i] && a[i] == b[i]) {
        if (a[i] == '/')
            common = i;
        i++;
    }
    if ((a[i] == '\0' || a[i] == '/') && (b[i] == '\0' || b[i] == '/'))
        common = i;
    int d = 0;
    for (const char *p = a + common; *p; p++)
        d += *p == '/';
    for (const char *p = b + common; *p; p++)
        d += *p == '/';
    return d;
}

static int port_active(const struct mscx_ibv *ibv, struct ibv_context *ctx, uint8_t port,
                       struct ibv_port_attr *attr)
{
    memset(attr, 0, sizeof(*attr));
    return ibv->query_port(ctx, port, attr) == 0 && attr->state == IBV_PORT_ACTIVE;
}

/* MSCX_IB_HCA ("name" or "name:port") into @p want (empty: any device) and @p want_port_p (0: any port). */
static void hca_wanted(const char *hca, char *want, size_t len, unsigned *want_port_p)
{
    if (!hca || !hca[0])
        return;
    snprintf(want, len, "%s", hca);
    char *colon = strchr(want, ':');
    if (colon) {
        *colon = '\0';
        *want_port_p = (unsigned)atoi(colon + 1);
    }
}

/* The active port of @p dev (@p want_port, or the first of 1 and 2); 0 for none, -1 when it does not open. */
static int device_port(const struct mscx_ibv *ibv, struct ibv_device *dev, unsigned want_port)
{
    struct ibv_context *ctx = ibv->open_device(dev);
    if (!ctx)
        return -1;
    struct ibv_port_attr attr;
    int port = 0;
    for (unsigned pt = want_port ? want_port : 1; pt <= (want_port ? want_port : 2) && !port; pt++)
        if (port_active(ibv, ctx, (uint8_t)pt, &attr))
            port = (int)pt;
    ibv->close_device(ctx);
    return port;
}

/* Hops between the GPU at sysfs path @p gpu_path and device @p name; 0 when either path is unknown. */
static int device_distance(const char *name, const char *gpu_path)
{
    char dp[PATH_MAX], rp[PATH_MAX];
    snprintf(dp, sizeof(dp), "/sys/class/infiniband/%s/device", name);
    if (gpu_path[0] && realpath(dp, rp))
        return mscx_tp_ib_pci_distance(gpu_path, rp);
    return 0;
}

/*
 * The index in @p list of the device to use: among those named @p want (any
 * when empty) with an active port, the one closest to the GPU, the first on a
 * tie. Sets ep->port; -1 when there is none.
 */
static int pick_device(struct mscx_tp_ep *ep, struct ibv_device **list, int n, const char *want,
                       unsigned want_port, const char *gpu_path)
{
    const struct mscx_ibv *ibv = ep->ibv;
    int best = -1, best_dist = INT_MAX;
    for (int i = 0; i < n; i++) {
        const char *name = ibv->get_device_name(list[i]);
        if (want[0] && strcmp(name, want) != 0)
            continue;
        int port = device_port(ibv, list[i], want_port);
        if (port < 0)
            continue;
        if (!port) {
            MSCX_INFO(MSCX_SUB_IB, "ib: %s has no active port", name);
            continue;
        }
        int dist = device_distance(name, gpu_path);
        if (best < 0 || dist < best_dist) {
            best = i;
            best_dist = dist;
            ep->port = (uint8_t)port;
        }
    }
    return best;
}

/* Open the device named by MSCX_IB_HCA ("name" or "name:port"), else the one closest to the GPU. */
static mscx_status_t ib_open_device(struct mscx_tp_ep *ep)
{
    const struct mscx_config *cfg;
    const struct mscx_ibv *ibv = ep->ibv;
    char want[64] = "", gpu_path[PATH_MAX] = "";
    unsigned want_port = 0;
    int n = 0;
    mscx_status_t st = MSCX_ERR_IBV;

    MSCX_CHECK(mscx_config_get(&cfg));
    hca_wanted(cfg->ib_hca, want, sizeof(want), &want_port);
    struct ibv_device **list = ibv->get_device_list(&n);
    if (!list || n == 0) {
        MSCX_INFO(MSCX_SUB_IB, "ib: no RDMA device");
        st = MSCX_ERR_UNSUPPORTED;
        goto out;
    }
    if (ep->p.gpu_pci) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s", ep->p.gpu_pci);
        if (!realpath(p, gpu_path))
            gpu_path[0] = '\0';
    }
    int best = pick_device(ep, list, n, want, want_port, gpu_path);
    if (best < 0) {
        if (want[0])
            MSCX_WARN("ib: MSCX_IB_HCA names %s, which is not an RDMA device with an active port",
                      cfg->ib_hca);
        else
            MSCX_INFO(MSCX_SUB_IB, "ib: no RDMA device with an active port");
        st = want[0] ? MSCX_ERR_IBV : MSCX_ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(ep->devname, sizeof(ep->devname), "%s", ibv->get_device_name(list[best]));
    ep->ctx = ibv->open_device(list[best]);
    if (!ep->ctx || !port_active(ibv, ep->ctx, ep->port, &ep->pattr)) {
        MSCX_WARN("ib: cannot open %s port %u: %s", ep->devname, ep->port, strerror(errno));
        goto out;
    }
    MSCX_INFO(MSCX_SUB_IB, "ib: rank %u uses %s port %u (%s%s)", ep->p.rank, ep->devname, ep->port,
              want[0]       ? "MSCX_IB_HCA"
              : gpu_path[0] ? "closest to GPU "
                            : "first active",
              want[0]       ? ""
              : gpu_path[0] ? ep->p.gpu_pci
                            : "");
    st = MSCX_OK;
out:
    if (list)
        ibv->free_device_list(list);
    return st;
}

/* RoCE needs a routable GID: take the last IPv4-mapped one of the first 16 (RoCE v2 is listed last). */
static void ib_pick_gid(struct mscx_tp_ep *ep)
{
    ep->gid_index = 0;
    memset(&ep->gid, 0, sizeof(ep->gid));
    for (int i = 0; i < 16; i++) {
        union ibv_gid g;
        if (ep->ibv->query_gid(ep->ctx, ep->port, i, &g) != 0)
            break;
        if (i == 0)
            ep->gid = g;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (ep->pattr.link_layer == IBV_LINK_LAYER_ETHERNET && memcmp(g.raw, v4, 12) == 0) {
            ep->gid = g;
            ep->gid_index = i;
        }
    }
}

/* ---------------------------------------------------------------- endpoint */

static void ib_ep_destroy(struct mscx_tp_ep *ep);
static void ib_mr_deregister(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr);

static mscx_status_t ib_ep_create(const struct mscx_tp_params *params, struct mscx_tp_ep **ep_p)
{
    mscx_status_t st;
    if (!params || !ep_p || params->rank >= params->nranks) {
        MSCX_WARN("caller bug: bad ib endpoint parameters");
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_tp_ep *ep = calloc(1, sizeof(*ep));
    if (!ep || !(ep->conns = calloc(params->nranks, sizeof(*ep->conns))) ||
        posix_memalign((void **)&ep->atomic_result, 64, 64) != 0) {
        MSCX_WARN("ib: out of memory");
        if (ep)
            free(ep->conns);
        free(ep);
        return MSCX_ERR_NO_MEMORY;
    }
    ep->p = *params;
    ep->p.gpu_pci = NULL;
    ep->p.bind_addr = NULL;
    MSCX_CHECK_GOTO(mscx_ibv_load(&ep->ibv), st, err);
    ep->p.gpu_pci = params->gpu_pci; /* only used during device choice */
    st = ib_open_device(ep);
    ep->p.gpu_pci = NULL;
    if (st != MSCX_OK)
        goto err;
    st = MSCX_ERR_IBV;
    ib_pick_gid(ep);
    if (!(ep->pd = ep->ibv->alloc_pd(ep->ctx))) {
        MSCX_WARN("ib: ibv_alloc_pd on %s failed: %s", ep->devname, strerror(errno));
        goto err;
    }
    if (!(ep->cq = ep->ibv->create_cq(ep->ctx, IB_CQ_DEPTH, NULL, NULL, 0))) {
        MSCX_WARN("ib: ibv_create_cq on %s failed: %s", ep->devname, strerror(errno));
        goto err;
    }
    if (!(ep->atomic_mr = ep->ibv->reg_mr(ep->pd, ep->atomic_result, 64, IBV_ACCESS_LOCAL_WRITE))) {
        MSCX_WARN("ib: registering the atomic result buffer on %s failed: %s", ep->devname, strerror(errno));
        goto err;
    }
    *ep_p = ep;
    return MSCX_OK;
err:
    ib_ep_destroy(ep);
    return st;
}

static void ib_conn_close(struct mscx_tp_conn *c)
{
    if (!c)
        return;
    if (c->ep->conns[c->peer] == c)
        c->ep->conns[c->peer] = NULL;
    if (c->qp)
        c->ep->ibv->destroy_qp(c->qp);
    free(c);
}

static void ib_ep_destroy(struct mscx_tp_ep *ep)
{
    if (!ep)
        return;
    for (uint32_t r = 0; r < ep->p.nranks; r++)
        ib_conn_close(ep->conns[r]);
    while (ep->mrs) /* the contract: destroying an endpoint frees its regions (and the PD cannot go before
                       them) */
        ib_mr_deregister(ep, ep->mrs);
    if (ep->atomic_mr)
        ep->ibv->dereg_mr(ep->atomic_mr);
    if (ep->cq)
        ep->ibv->destroy_cq(ep->cq);
    if (ep->pd)
        ep->ibv->dealloc_pd(ep->pd);
    if (ep->ctx)
        ep->ibv->close_device(ep->ctx);
    free(ep->atomic_result);
    free(ep->conns);
    free(ep);
}

/* ---------------------------------------------------------------- memory */

static mscx_status_t ib_mr_register(struct mscx_tp_ep *ep, void *base, size_t len, unsigned flags,
                                    int dmabuf_fd, struct mscx_tp_mr **mr_p, struct mscx_tp_rdesc *desc_p)
{
    if (!ep || !base || !len || !mr_p || !desc_p) {
        MSCX_WARN("caller bug: bad ib memory registration");
        return MSCX_ERR_INVALID_ARG;
    }
    if ((flags & MSCX_TP_MR_GPU) && dmabuf_fd < 0) {
        MSCX_WARN(
            "caller bug: ib registration of GPU memory needs a dmabuf fd; register the host bounce buffer");
        return MSCX_ERR_INVALID_ARG;
    }
    if (dmabuf_fd >= 0 && !ep->ibv->reg_dmabuf_mr) {
        MSCX_WARN("ib: libibverbs has no ibv_reg_dmabuf_mr (IBVERBS_1.12): no GPUDirect RDMA, use the bounce "
                  "buffer");
        return MSCX_ERR_UNSUPPORTED;
    }
    struct mscx_tp_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        MSCX_WARN("ib: out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    if (dmabuf_fd >= 0)
        mr->mr = ep->ibv->reg_dmabuf_mr(ep->pd, 0, len, (uintptr_t)base, dmabuf_fd, IB_ACCESS);
    else
        mr->mr = ep->ibv->reg_mr(ep->pd, base, len, IB_ACCESS);
    if (!mr->mr) {
        MSCX_WARN("ib: registering %zu bytes at %p on %s (%s) failed: %s", len, base, ep->devname,
                  dmabuf_fd >= 0 ? "dmabuf" : "host", strerror(errno));
        free(mr);
        return MSCX_ERR_IBV;
    }
    MSCX_INFO(MSCX_SUB_IB, "ib: registered %zu bytes on %s via %s", len, ep->devname,
              dmabuf_fd >= 0 ? "GPUDirect RDMA (dmabuf)" : "host memory (bounce buffer path)");
    mr->base = base;
    mr->len = len;
    mr->flags = flags;
    mr->next = ep->mrs;
    if (ep->mrs)
        ep->mrs->prev = mr;
    ep->mrs = mr;
    memset(desc_p, 0, sizeof(*desc_p));
    desc_p->addr = (uintptr_t)base;
    desc_p->len = len;
    desc_p->key = mr->mr->rkey;
    desc_p->owner = ep->p.rank;
    desc_p->flags = flags;
    desc_p->tp = 'I';
    *mr_p = mr;
    return MSCX_OK;
}

static void ib_mr_deregister(struct mscx_tp_ep *ep, struct mscx_tp_mr *mr)
{
    if (!ep || !mr)
        return;
    if (mr->prev)
        mr->prev->next = mr->next;
    else
        ep->mrs = mr->next;
    if (mr->next)
        mr->next->prev = mr->prev;
    ep->ibv->dereg_mr(mr->mr);
    free(mr);
}

/* ---------------------------------------------------------------- connect */

static mscx_status_t ib_conn_prepare(struct mscx_tp_ep *ep, uint32_t peer, void *blob,
                                     struct mscx_tp_conn **conn_p)
{
    if (!ep || peer >= ep->p.nranks || peer == ep->p.rank || !blob || !conn_p || ep->conns[peer]) {
        MSCX_WARN("caller bug: bad ib connection request to peer %u", peer);
        return MSCX_ERR_INVALID_ARG;
    }
    struct mscx_tp_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        MSCX_WARN("ib: out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    c->ep = ep;
    c->peer = peer;
    c->psn = (uint32_t)(((uintptr_t)c >> 4) ^ (ep->p.rank * 2654435761u) ^ peer) & 0xffffff;
    struct ibv_qp_init_attr ia = {
        .send_cq = ep->cq,
        .recv_cq = ep->cq,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
        .cap = {.max_send_wr = IB_SQ_DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
    };
    if (!(c->qp = ep->ibv->create_qp(ep->pd, &ia))) {
        MSCX_WARN("ib: ibv_create_qp to peer %u failed: %s", peer, strerror(errno));
        free(c);
        return MSCX_ERR_IBV;
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = ep->port, .qp_access_flags = IB_ACCESS};
    int e =
        ep->ibv->modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (e) {
        MSCX_WARN("ib: qp to peer %u: RESET->INIT failed: %s", peer, strerror(e));
        ep->ibv->destroy_qp(c->qp);
        free(c);
        return MSCX_ERR_IBV;
    }
    struct ib_blob b = {.magic = MSCX_TP_MAGIC,
                        .comm_id = ep->p.comm_id,
                        .version = MSCX_TP_PROTO_VERSION,
                        .rank = ep->p.rank,
                        .dst = peer,
                        .qpn = c->qp->qp_num,
                        .psn = c->psn,
                        .lid = ep->pattr.lid,
                        .port = ep->port,
                        .link_layer = ep->pattr.link_layer,
                        .mtu = ep->pattr.active_mtu};
    memcpy(b.gid, ep->gid.raw, 16);
    memset(blob, 0, MSCX_TP_BLOB_BYTES);
    memcpy(blob, &b, sizeof(b));
    ep->conns[peer] = c;
    *conn_p = c;
    return MSCX_OK;
}

static mscx_status_t ib_conn_establish(struct mscx_tp_conn *c, const void *peer_blob, uint64_t deadline_ns)
{
    struct mscx_tp_ep *ep = c->ep;
    struct ib_blob b;
    (void)deadline_ns; /* nothing blocks: the QP transitions are local */

    memcpy(&b, peer_blob, sizeof(b));
    if (b.magic != MSCX_TP_MAGIC || b.version != MSCX_TP_PROTO_VERSION) {
        MSCX_WARN("ib: refused peer %u: bad handshake magic %#llx or version %u", c->peer,
                  (unsigned long long)b.magic, b.version);
        return MSCX_ERR_REMOTE;
    }
    if (b.comm_id != ep->p.comm_id || b.rank != c->peer || b.dst != ep->p.rank) {
        MSCX_WARN("ib: refused peer %u: communicator id %#llx ranks %u->%u, expected %#llx ranks %u->%u",
                  c->peer, (unsigned long long)b.comm_id, b.rank, b.dst, (unsigned long long)ep->p.comm_id,
                  c->peer, ep->p.rank);
        return MSCX_ERR_REMOTE;
    }
    if (b.link_layer != ep->pattr.link_layer) {
        MSCX_WARN("ib: refused peer %u: link layer %u differs from ours (%u)", c->peer, b.link_layer,
                  ep->pattr.link_layer);
        return MSCX_ERR_REMOTE;
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)(b.mtu < ep->pattr.active_mtu ? b.mtu : ep->pattr.active_mtu),
        .dest_qp_num = b.qpn,
        .rq_psn = b.psn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = b.lid, .sl = 0, .src_path_bits = 0, .port_num = ep->port},
    };
    if (b.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, b.gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)ep->gid_index;
        a.ah_attr.grh.hop_limit = 255;
    }
    int e = ep->ibv->modify_qp(c->qp, &a,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (e) {
        MSCX_WARN("ib: qp to peer %u: INIT->RTR failed (remote qpn %u lid %u): %s", c->peer, b.qpn, b.lid,
                  strerror(e));
        return MSCX_ERR_IBV;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = c->psn;
    a.max_rd_atomic = 1;
    e = ep->ibv->modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (e) {
        MSCX_WARN("ib: qp to peer %u: RTR->RTS failed: %s", c->peer, strerror(e));
        return MSCX_ERR_IBV;
    }
    MSCX_INFO(MSCX_SUB_IB, "ib: rank %u qp %u connected to peer %u qp %u", ep->p.rank, c->qp->qp_num, c->peer,
              b.qpn);
    return MSCX_OK;
}

/* ---------------------------------------------------------------- completions */

static void conn_fail(struct mscx_tp_conn *c, const char *what, const char *detail)
{
    if (c->err != MSCX_OK)
        return;
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    int in_err = c->ep->ibv->query_qp(c->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR;
    MSCX_WARN("ib: connection rank %u -> peer %u failed: %s: %s%s", c->ep->p.rank, c->peer, what, detail,
              in_err ? " (qp in error state)" : "");
    c->err = MSCX_ERR_IBV;
}

/* Poll the endpoint's CQ once; returns the first error of any connection. */
static mscx_status_t ib_poll(struct mscx_tp_ep *ep)
{
    struct ibv_wc wc[16];
    int n = ibv_poll_cq(ep->cq, 16, wc);
    if (n < 0) {
        MSCX_WARN("ib: ibv_poll_cq on %s failed", ep->devname);
        return MSCX_ERR_IBV;
    }
    for (int i = 0; i < n; i++) {
        uint32_t peer = (uint32_t)(wc[i].wr_id >> IB_WRID_PEER_SHIFT);
        uint64_t seq = wc[i].wr_id & ((1ull << IB_WRID_PEER_SHIFT) - 1);
        struct mscx_tp_conn *c = peer < ep->p.nranks ? ep->conns[peer] : NULL;
        if (!c)
            continue; /* closed meanwhile */
        if (wc[i].status != IBV_WC_SUCCESS) {
            char d[96];
            snprintf(d, sizeof(d), "%s (status %d) on request %llu", mscx_ibv_wc_status_str(wc[i].status),
                     (int)wc[i].status, (unsigned long long)seq);
            conn_fail(c, "completion error", d);
            continue;
        }
        if (seq > c->done)
            c->done = seq; /* RC: a completion retires every earlier request of the QP */
    }
    for (uint32_t r = 0; r < ep->p.nranks; r++)
        if (ep->conns[r] && ep->conns[r]->err != MSCX_OK)
            return ep->conns[r]->err;
    return MSCX_OK;
}

static mscx_status_t wait_room(struct mscx_tp_conn *c, uint64_t deadline_ns)
{
    while (c->posted - c->done >= IB_SQ_DEPTH - 1) {
        MSCX_CHECK(ib_poll(c->ep));
        MSCX_CHECK(c->err);
        if (mscx_tp_now_ns() >= deadline_ns) {
            MSCX_WARN("ib: send queue to peer %u stayed full until the deadline", c->peer);
            return MSCX_ERR_TIMEOUT;
        }
    }
    return MSCX_OK;
}

static mscx_status_t post(struct mscx_tp_conn *c, struct ibv_send_wr *wr, int force_signal,
                          uint64_t deadline_ns)
{
    MSCX_CHECK(c->err);
    MSCX_CHECK(wait_room(c, deadline_ns));
    uint64_t seq = c->posted + 1;
    wr->wr_id = ((uint64_t)c->peer << IB_WRID_PEER_SHIFT) | seq;
    if (force_signal || seq - c->last_signaled >= IB_SIGNAL_EVERY)
        wr->send_flags |= IBV_SEND_SIGNALED;
    struct ibv_send_wr *bad = NULL;
    int e = ibv_post_send(c->qp, wr, &bad);
    if (e) {
        conn_fail(c, "ibv_post_send failed", strerror(e));
        return MSCX_ERR_IBV;
    }
    c->posted = seq;
    if (wr->send_flags & IBV_SEND_SIGNALED)
        c->last_signaled = seq;
    return MSCX_OK;
}

/* ---------------------------------------------------------------- data path */

static mscx_status_t check_remote(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                                  uint64_t len)
{
    return mscx_tp_check_remote(rd, 'I', c->peer, roff, len);
}

static mscx_status_t ib_put(struct mscx_tp_conn *c, struct mscx_tp_mr *lmr, uint64_t loff,
                            const struct mscx_tp_rdesc *rd, uint64_t roff, uint64_t len, unsigned flags,
                            uint64_t deadline_ns)
{
    MSCX_CHECK(c->err);
    MSCX_CHECK(check_remote(c, rd, roff, len));
    if (!lmr || loff > lmr->len || len > lmr->len - loff) {
        MSCX_WARN("caller bug: ib put outside the local region");
        return MSCX_ERR_INVALID_ARG;
    }
    if ((flags & MSCX_TP_PUT_PACKET) && ((rd->addr + roff) % 8 || len % 8)) {
        MSCX_WARN("caller bug: packet put to peer %u not in whole aligned 8-byte units", c->peer);
        return MSCX_ERR_INVALID_ARG;
    }
    c->last_raddr = rd->addr + roff;
    c->last_rkey = rd->key;
    /* One write per GiB; RC places them in order. */
    for (uint64_t done = 0; done < len || (len == 0 && done == 0); done += IB_MAX_WRITE) {
        uint64_t n = len - done < IB_MAX_WRITE ? len - done : IB_MAX_WRITE;
        struct ibv_sge sge = {
            .addr = (uintptr_t)lmr->base + loff + done, .length = (uint32_t)n, .lkey = lmr->mr->lkey};
        struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = n ? 1 : 0, .opcode = IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = rd->addr + roff + done;
        wr.wr.rdma.rkey = rd->key;
        MSCX_CHECK(post(c, &wr, 0, deadline_ns));
        if (len == 0)
            break;
    }
    return MSCX_OK;
}

static mscx_status_t ib_signal(struct mscx_tp_conn *c, const struct mscx_tp_rdesc *rd, uint64_t roff,
                               uint64_t deadline_ns)
{
    MSCX_CHECK(c->err);
    MSCX_CHECK(check_remote(c, rd, roff, 8));
    if ((rd->addr + roff) % 8) {
        MSCX_WARN("caller bug: ib signal word at offset %llu is not 8-byte aligned",
                  (unsigned long long)roff);
        return MSCX_ERR_INVALID_ARG;
    }
    struct ibv_sge sge = {
        .addr = (uintptr_t)c->ep->atomic_result, .length = 8, .lkey = c->ep->atomic_mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD};
    wr.wr.atomic.remote_addr = rd->addr + roff;
    wr.wr.atomic.rkey = rd->key;
    wr.wr.atomic.compare_add = 1;
    c->last_raddr = rd->addr + roff;
    c->last_rkey = rd->key;
    return post(c, &wr, 0, deadline_ns);
}

static mscx_status_t ib_flush(struct mscx_tp_conn *c, uint64_t deadline_ns)
{
    MSCX_CHECK(c->err);
    if (c->posted > c->last_signaled) {
        /* A signaled zero-byte write behind the unsignaled tail retires it. */
        struct ibv_send_wr wr = {.num_sge = 0, .opcode = IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = c->last_raddr;
        wr.wr.rdma.rkey = c->last_rkey;
        MSCX_CHECK(post(c, &wr, 1, deadline_ns));
    }
    while (c->done < c->posted) {
        mscx_status_t st = ib_poll(c->ep);
        if (c->err != MSCX_OK)
            return c->err;
        if (st != MSCX_OK)
            return st;
        if (mscx_tp_now_ns() >= deadline_ns) {
            MSCX_WARN("ib: flush to peer %u timed out with %llu requests outstanding", c->peer,
                      (unsigned long long)(c->posted - c->done));
            return MSCX_ERR_TIMEOUT;
        }
    }
    return MSCX_OK;
}

static mscx_status_t ib_progress(struct mscx_tp_ep *ep)
{
    return ib_poll(ep);
}

const struct mscx_transport_ops mscx_tp_ib = {
    .name = "ib",
    .ep_create = ib_ep_create,
    .ep_destroy = ib_ep_destroy,
    .mr_register = ib_mr_register,
    .mr_deregister = ib_mr_deregister,
    .conn_prepare = ib_conn_prepare,
    .conn_establish = ib_conn_establish,
    .conn_close = ib_conn_close,
    .put = ib_put,
    .signal = ib_signal,
    .flush = ib_flush,
    .progress = ib_progress,
};
