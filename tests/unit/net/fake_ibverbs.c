/* SPDX-License-Identifier: MIT */
/*
 * A test double of libibverbs, loaded through the executor's dlopen wrapper
 * (MSCX_IBV_SO). RC semantics over host memory shared between the test's
 * processes: the world (QP and MR tables) and the heap handed out by
 * fake_ibv_alloc() live in one MAP_SHARED region created by
 * fake_ibv_world_init() before fork, so they sit at the same address in
 * every process and a "remote" write is a store by the poster.
 *
 * What it checks like hardware would: QP state machine and attribute masks,
 * that RTR names an existing QP with the right LID, PSNs, lkeys / rkeys,
 * access flags and bounds (errors complete with the hardware status and put
 * the QP in the error state, later requests are flushed), send queue depth,
 * and it places writes in ascending aligned 8-byte units in posting order.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* verbs.h turns these into inline wrappers; the double defines the real symbols. */
#undef ibv_query_port
#undef ibv_reg_mr
#define NDEV 2
#define MAX_MR 256
#define MAX_QP 64

/* Control API of the double, used by tests/unit/net/test_ib.c through dlsym. */
EXPORT int fake_ibv_world_init(size_t heap_bytes);
EXPORT void *fake_ibv_alloc(size_t bytes);
EXPORT void fake_ibv_inject(unsigned what);
EXPORT unsigned fake_ibv_regs(int dmabuf);

enum { FAKE_FAIL_REG = 1, FAKE_QP_ERR = 2, FAKE_DEV0_DOWN = 4 };

struct wmr {
    int used;
    pid_t owner;
    uint32_t lkey, rkey;
    uint64_t addr, len;
    int access, dmabuf;
};

struct wqp {
    int used;
    pid_t owner;
    uint32_t qpn;
    enum ibv_qp_state state;
    uint32_t dest_qpn, rq_psn, sq_psn;
    uint16_t lid;
};

struct world {
    pthread_mutex_t lock;
    uint32_t next_key, next_qpn;
    unsigned inject;
    unsigned dmabuf_regs, host_regs;
    struct wmr mr[MAX_MR];
    struct wqp qp[MAX_QP];
    size_t heap_used, heap_size;
    _Alignas(64) char heap[];
};

static struct world *W;

struct fake_qp;

struct fake_cq {
    struct ibv_cq cq;
    struct ibv_wc ring[8192];
    struct fake_qp *qp[8192]; /* whose completion, and its posted count: polling retires SQ slots */
    uint64_t seq[8192];
    unsigned head, tail;
};

struct fake_qp {
    struct ibv_qp qp;
    struct wqp *w;
    struct fake_cq *cq;
    uint32_t max_send_wr;
    uint64_t posted, retired;
};

static struct ibv_device devs[NDEV];
static struct ibv_device *devlist[NDEV + 1];

EXPORT int fake_ibv_world_init(size_t heap_bytes)
{
    size_t sz = sizeof(struct world) + heap_bytes;
    W = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (W == MAP_FAILED)
        return -1;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&W->lock, &a);
    W->next_key = 0x100;
    W->next_qpn = 0x40;
    W->heap_size = heap_bytes;
    return 0;
}

EXPORT void *fake_ibv_alloc(size_t bytes)
{
    pthread_mutex_lock(&W->lock);
    size_t off = (W->heap_used + 4095) & ~(size_t)4095;
    void *p = off + bytes <= W->heap_size ? W->heap + off : NULL;
    if (p)
        W->heap_used = off + bytes;
    pthread_mutex_unlock(&W->lock);
    return p;
}

EXPORT void fake_ibv_inject(unsigned what)
{
    __atomic_store_n(&W->inject, what, __ATOMIC_SEQ_CST);
}

EXPORT unsigned fake_ibv_regs(int dmabuf)
{
    return dmabuf ? W->dmabuf_regs : W->host_regs;
}

/* ---------------------------------------------------------------- devices */

struct ibv_device **ibv_get_device_list(int *num)
{
    for (int i = 0; i < NDEV; i++) {
        strcpy(devs[i].name, i ? "fake_mlx5_1" : "fake_mlx5_0");
        strcpy(devs[i].dev_name, devs[i].name);
        devs[i].transport_type = IBV_TRANSPORT_IB;
        devlist[i] = &devs[i];
    }
    devlist[NDEV] = NULL;
    if (num)
        *num = W ? NDEV : 0;
    return devlist;
}

void ibv_free_device_list(struct ibv_device **list)
{
    (void)list;
}

const char *ibv_get_device_name(struct ibv_device *dev)
{
    return dev->name;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return NULL;
    ctx->device = dev;
    ctx->ops.post_send = fake_post_send;
    ctx->ops.poll_cq = fake_poll_cq;
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    free(ctx);
    return 0;
}

static int dev_index(struct ibv_context *ctx)
{
    return (int)(ctx->device - devs);
}

int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *cattr)
{
    struct ibv_port_attr *attr = (struct ibv_port_attr *)cattr; /* callers pass the full struct */
    if (port != 1)
        return EINVAL;
    memset(attr, 0, sizeof(*attr));
    int down = dev_index(ctx) == 0 && (W->inject & FAKE_DEV0_DOWN);
    attr->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    attr->lid = (uint16_t)(0x10 + dev_index(ctx));
    attr->active_mtu = IBV_MTU_4096;
    attr->max_mtu = IBV_MTU_4096;
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    if (port != 1 || index > 0)
        return EINVAL;
    memset(gid, 0, sizeof(*gid));
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    gid->raw[15] = (uint8_t)dev_index(ctx);
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd)
        pd->context = ctx;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

/* ---------------------------------------------------------------- memory */

static struct ibv_mr *reg(struct ibv_pd *pd, uint64_t addr, size_t len, int access, int dmabuf)
{
    if (__atomic_load_n(&W->inject, __ATOMIC_SEQ_CST) & FAKE_FAIL_REG) {
        errno = EFAULT;
        return NULL;
    }
    struct ibv_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&W->lock);
    int i = 0;
    while (i < MAX_MR && W->mr[i].used)
        i++;
    if (i == MAX_MR) {
        pthread_mutex_unlock(&W->lock);
        free(mr);
        errno = ENOMEM;
        return NULL;
    }
    uint32_t k = W->next_key++;
    W->mr[i] = (struct wmr){.used = 1,
                            .owner = getpid(),
                            .lkey = k,
                            .rkey = k << 8 | 0x5a,
                            .addr = addr,
                            .len = len,
                            .access = access,
                            .dmabuf = dmabuf};
    if (dmabuf)
        W->dmabuf_regs++;
    else
        W->host_regs++;
    pthread_mutex_unlock(&W->lock);
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = (void *)(uintptr_t)addr;
    mr->length = len;
    mr->handle = (uint32_t)i;
    mr->lkey = k;
    mr->rkey = k << 8 | 0x5a;
    return mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return reg(pd, (uintptr_t)addr, len, access, 0);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                                 int access)
{
    if (fcntl(fd, F_GETFD) < 0) {
        errno = EBADF;
        return NULL;
    }
    return reg(pd, iova + offset, len, access, 1);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&W->lock);
    W->mr[mr->handle].used = 0;
    pthread_mutex_unlock(&W->lock);
    free(mr);
    return 0;
}

/* ---------------------------------------------------------------- CQ / QP */

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_ctx, struct ibv_comp_channel *ch,
                             int vec)
{
    (void)ch;
    (void)vec;
    struct fake_cq *cq = calloc(1, sizeof(*cq));
    if (!cq || cqe > 8192) {
        free(cq);
        errno = EINVAL;
        return NULL;
    }
    cq->cq.context = ctx;
    cq->cq.cq_context = cq_ctx;
    cq->cq.cqe = cqe;
    return &cq->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    free(cq);
    return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (ia->qp_type != IBV_QPT_RC || !ia->send_cq || ia->cap.max_send_wr == 0 || ia->cap.max_send_wr > 4096) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_qp *q = calloc(1, sizeof(*q));
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&W->lock);
    int i = 0;
    while (i < MAX_QP && W->qp[i].used)
        i++;
    if (i == MAX_QP) {
        pthread_mutex_unlock(&W->lock);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    W->qp[i] = (struct wqp){.used = 1, .owner = getpid(), .qpn = W->next_qpn++, .state = IBV_QPS_RESET};
    pthread_mutex_unlock(&W->lock);
    q->w = &W->qp[i];
    q->cq = (struct fake_cq *)ia->send_cq;
    q->max_send_wr = ia->cap.max_send_wr;
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.qp_num = q->w->qpn;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.state = IBV_QPS_RESET;
    return &q->qp;
}

static struct wqp *find_qp(uint32_t qpn)
{
    for (int i = 0; i < MAX_QP; i++)
        if (W->qp[i].used && W->qp[i].qpn == qpn)
            return &W->qp[i];
    return NULL;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    struct fake_qp *q = (struct fake_qp *)qp;
    int rc = 0;
    if (!(mask & IBV_QP_STATE))
        return EINVAL;
    pthread_mutex_lock(&W->lock);
    enum ibv_qp_state from = q->w->state, to = a->qp_state;
    int need = 0;
    if (to == IBV_QPS_ERR || to == IBV_QPS_RESET) {
        need = IBV_QP_STATE;
    } else if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
        need = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        if (a->port_num != 1)
            rc = EINVAL;
        q->w->lid = (uint16_t)(0x10 + dev_index(qp->context));
    } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        need = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        struct wqp *d = find_qp(a->dest_qp_num);
        if (!d || d->lid != a->ah_attr.dlid) /* the handshake must carry the right qpn and lid */
            rc = EINVAL;
        q->w->dest_qpn = a->dest_qp_num;
        q->w->rq_psn = a->rq_psn;
    } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
        need = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
        q->w->sq_psn = a->sq_psn;
    } else {
        rc = EINVAL;
    }
    if ((mask & need) != need)
        rc = EINVAL;
    if (!rc)
        q->w->state = qp->state = to;
    pthread_mutex_unlock(&W->lock);
    return rc;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia)
{
    (void)mask;
    memset(a, 0, sizeof(*a));
    memset(ia, 0, sizeof(*ia));
    a->qp_state = ((struct fake_qp *)qp)->w->state;
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct fake_qp *q = (struct fake_qp *)qp;
    pthread_mutex_lock(&W->lock);
    q->w->used = 0;
    pthread_mutex_unlock(&W->lock);
    free(q);
    return 0;
}

/* ---------------------------------------------------------------- data path */

static struct wmr *find_mr(uint32_t key, int remote, pid_t owner, uint64_t addr, uint64_t len, int access)
{
    for (int i = 0; i < MAX_MR; i++) {
        struct wmr *m = &W->mr[i];
        if (!m->used || (remote ? m->rkey : m->lkey) != key || m->owner != owner)
            continue;
        if (addr < m->addr || len > m->len || addr - m->addr > m->len - len || (m->access & access) != access)
            return NULL;
        return m;
    }
    return NULL;
}

static void cqe(struct fake_qp *q, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op)
{
    struct fake_cq *cq = q->cq;
    unsigned slot = cq->tail % 8192;
    cq->ring[slot] = (struct ibv_wc){.wr_id = wr_id, .status = st, .opcode = op, .qp_num = q->qp.qp_num};
    cq->qp[slot] = q;
    cq->seq[slot] = q->posted;
    cq->tail++;
}

static enum ibv_wc_status execute(struct fake_qp *q, struct ibv_send_wr *wr)
{
    struct wqp *d = find_qp(q->w->dest_qpn);
    if (!d || d->dest_qpn != q->w->qpn || (d->state != IBV_QPS_RTR && d->state != IBV_QPS_RTS) ||
        d->rq_psn != q->w->sq_psn)
        return IBV_WC_RETRY_EXC_ERR; /* nobody answers at that qpn / psn */
    if (d->owner != getpid() && kill(d->owner, 0) < 0 && errno == ESRCH)
        return IBV_WC_RETRY_EXC_ERR; /* its process is gone (the kernel would have destroyed its QPs) */
    uint64_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    if (wr->num_sge && !find_mr(wr->sg_list[0].lkey, 0, getpid(), wr->sg_list[0].addr, len, 0))
        return IBV_WC_LOC_PROT_ERR;
    if (wr->opcode == IBV_WR_RDMA_WRITE) {
        if (len == 0)
            return IBV_WC_SUCCESS;
        if (!find_mr(wr->wr.rdma.rkey, 1, d->owner, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_WRITE))
            return IBV_WC_REM_ACCESS_ERR;
        /* Place in ascending order; aligned 8-byte units are single stores. */
        char *dst = (char *)(uintptr_t)wr->wr.rdma.remote_addr;
        const char *src = (const char *)(uintptr_t)wr->sg_list[0].addr;
        uint64_t i = 0;
        for (; i < len && ((uintptr_t)(dst + i) & 7); i++)
            dst[i] = src[i];
        for (; i + 8 <= len; i += 8) {
            uint64_t v;
            memcpy(&v, src + i, 8);
            __atomic_store_n((uint64_t *)(dst + i), v, __ATOMIC_RELEASE);
        }
        for (; i < len; i++)
            dst[i] = src[i];
        return IBV_WC_SUCCESS;
    }
    if (wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        if (len != 8 || wr->wr.atomic.remote_addr % 8)
            return IBV_WC_REM_INV_REQ_ERR;
        if (!find_mr(wr->wr.atomic.rkey, 1, d->owner, wr->wr.atomic.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC))
            return IBV_WC_REM_ACCESS_ERR;
        uint64_t old = __atomic_fetch_add((uint64_t *)(uintptr_t)wr->wr.atomic.remote_addr,
                                          wr->wr.atomic.compare_add, __ATOMIC_SEQ_CST);
        memcpy((void *)(uintptr_t)wr->sg_list[0].addr, &old, 8);
        return IBV_WC_SUCCESS;
    }
    return IBV_WC_REM_INV_REQ_ERR;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fake_qp *q = (struct fake_qp *)qp;
    for (; wr; wr = wr->next) {
        if (q->w->state != IBV_QPS_RTS && q->w->state != IBV_QPS_ERR) {
            *bad = wr;
            return EINVAL;
        }
        if (q->posted - q->retired >= q->max_send_wr) {
            *bad = wr; /* the caller did not poll for completions */
            return ENOMEM;
        }
        if (__atomic_exchange_n(&W->inject, W->inject & ~(unsigned)FAKE_QP_ERR, __ATOMIC_SEQ_CST) &
            FAKE_QP_ERR)
            q->w->state = qp->state = IBV_QPS_ERR;
        q->posted++;
        enum ibv_wc_opcode op = wr->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_FETCH_ADD;
        if (q->w->state == IBV_QPS_ERR) {
            cqe(q, wr->wr_id, IBV_WC_WR_FLUSH_ERR, op);
            continue;
        }
        enum ibv_wc_status st = execute(q, wr);
        if (st != IBV_WC_SUCCESS)
            q->w->state = qp->state = IBV_QPS_ERR;
        if (st != IBV_WC_SUCCESS || (wr->send_flags & IBV_SEND_SIGNALED))
            cqe(q, wr->wr_id, st, op);
    }
    return 0;
}

static int fake_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    int k = 0;
    while (k < n && cq->head != cq->tail) {
        unsigned slot = cq->head % 8192;
        wc[k] = cq->ring[slot];
        if (cq->seq[slot] > cq->qp[slot]->retired)
            cq->qp[slot]->retired = cq->seq[slot];
        cq->head++;
        k++;
    }
    return k;
}
