/* SPDX-License-Identifier: MIT */
/*
 * Node topology and port channels through the CPU proxy, GPU side (see
 * gpu_port.h): the "cuda" link for peers of the same node in other
 * processes, the GPU hooks of the TCP link for peers on other nodes, and the
 * setup that wires a plan context's FIFO to the process's proxy (proxy.c).
 *
 * cuda link: puts are cudaMemcpyAsync into the peer's IPC-mapped scratch on
 * one non-blocking stream per executor (never the legacy default stream: the
 * executor's kernel may be waiting on the copy). A signal is the channel's
 * running count written as a 64-bit value with an 8-byte host-to-device copy
 * into the peer's inbound token, on the same stream, so it lands after every
 * earlier put (stream order). Only this link writes that token (one sender
 * per paired channel), so an absolute value is an add of one. The values
 * come from a pinned ring of 1024 slots; a slot is reused only after the
 * event recorded behind its group of 64 copies has completed. (A copy was
 * chosen over cuStreamWriteValue64: it needs no driver entry point and no
 * stream-memory-op support, and it is what the peer's copy engine ordering
 * already covers.)
 *
 * Between nodes: MSCX_TRANSPORT picks the transport once per process (auto:
 * RDMA when libibverbs opens with an active device, GPUDirect registration
 * of GPU memory is possible and every rank agrees; else TCP, INFO line).
 * RDMA: this rank's scratch and tokens are registered through a dmabuf of
 * the GPU memory (cuMemGetHandleForAddressRange), so peers write them
 * directly; the source of a put is staged through a host bounce ring per
 * link (registered once), as for TCP.
 *
 * TCP link: the source is staged to a pinned host buffer with a copy on the
 * same stream; the receiver thread of the TCP endpoint writes received bytes
 * into GPU memory with a copy on its own non-blocking stream (synchronous
 * before the next message is applied, so a signal lands after its data) and
 * applies a signal as read, add one, write of the token.
 */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "mscx/env.h"
#include "mscx/log.h"
#include "gpu_port.h"
#include "port_fifo.h"
#include "proxy_int.h"
#include "transport.h"

#define SIG_RING 1024u
#define SIG_GROUP 64u
#define BOUNCE_BYTES (1u << 20)
#define CONNECT_GRACE_MS 30000u

struct gpu_net {
    int device;
    uint32_t nranks;
    cudaStream_t stream;    /* proxy thread: cuda-link copies and TCP staging */
    cudaStream_t rx_stream; /* TCP receiver thread */
    uint64_t *ring;         /* pinned signal values */
    uint64_t ring_n;
    cudaEvent_t ring_ev[SIG_RING / SIG_GROUP];
    cudaEvent_t flush_ev;
    const struct mscx_transport_ops *tp;  /* chosen on the first connection: tcp or ib */
    const struct mscx_plink_ops *plink;   /* mscx_plink_tcp or mscx_plink_ib */
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn **conn; /* [nranks] */
    void *bounce;
    struct mscx_tp_mr *bounce_mr;
};

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
    void **lbounce; /* [nchan] RDMA: each link's host bounce ring */
    struct late_res *late; /* this rank's late-bound region (TCP puts into its user buffers), or NULL */
};

static mscx_status_t cu(cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return MSCX_OK;
    MSCX_WARN("cuda error: %s: %s", what, cudaGetErrorString(rc));
    return MSCX_ERR_CUDA;
}

#define CU(call) cu((call), #call)

/* ---------------------------------------------------------------- topology */

static const char *buf_name(unsigned t)
{
    return t == MSCX_BUF_INPUT     ? "input"
           : t == MSCX_BUF_OUTPUT  ? "output"
           : t == MSCX_BUF_SCRATCH ? "scratch"
                                   : "?";
}

static int same_proc(const struct gpu_peer *a, const struct gpu_peer *b)
{
    return a->pid == b->pid && a->host == b->host;
}

static int data_port_op(unsigned opc)
{
    return opc == MSCX_OP_PUT || opc == MSCX_OP_PUT_WITH_SIGNAL || opc == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH ||
           opc == MSCX_OP_PUT_PACKETS || opc == MSCX_OP_READ_PUT_PACKETS;
}

static int sync_port_op(unsigned opc)
{
    return opc == MSCX_OP_SIGNAL || opc == MSCX_OP_RELAXED_SIGNAL || opc == MSCX_OP_WAIT ||
           opc == MSCX_OP_RELAXED_WAIT || opc == MSCX_OP_FLUSH;
}

/* Check one op of rank @p r (thread block @p b, index @p j in the block). */
static mscx_status_t check_op(const struct mscx_plan *plan, const struct gpu_peer *peers,
                              const uint32_t *node, uint32_t r, uint32_t b, uint32_t j,
                              const struct mscx_dev_op *op)
{
    const struct mscx_gpu *g = &plan->gpus[r];
    const char *name = mscx_opcode_name((enum mscx_opcode)op->opcode);
    int proxied = 0;
    if (op->chan_type == MSCX_CHAN_PORT && op->nchan > 0) {
        uint32_t np = 0;
        for (uint32_t i = 0; i < op->nchan; i++) {
            uint32_t c = op->chan[i];
            if (c < g->nchan[MSCX_CHAN_PORT] &&
                !same_proc(&peers[r], &peers[g->chan[MSCX_CHAN_PORT][c].peer]))
                np++;
        }
        if (np != 0 && np != op->nchan &&
            !(op->opcode == MSCX_OP_SIGNAL || op->opcode == MSCX_OP_RELAXED_SIGNAL ||
              op->opcode == MSCX_OP_WAIT || op->opcode == MSCX_OP_RELAXED_WAIT)) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s): its port channels mix peers in this process "
                "and peers in other processes; refusing",
                plan->name, r, b, j, name);
            return MSCX_ERR_UNSUPPORTED;
        }
        proxied = np == op->nchan;
        if (proxied && !data_port_op(op->opcode) && !sync_port_op(op->opcode)) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s): this operation is not supported on a port "
                "channel to another process (only put, pws, pwsf, ppkt, rppkt, signal, wait, flush); "
                "refusing",
                plan->name, r, b, j, name);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    for (uint32_t k = 0; k < op->nsrc + op->ndst; k++) {
        int is_dst = k >= op->nsrc;
        const struct mscx_dev_operand *o = is_dst ? &op->dst[k - op->nsrc] : &op->src[k];
        if (!(o->flags & MSCX_OPND_REMOTE))
            continue;
        if (o->rbuf >= g->nrbuf)
            continue; /* the validator reports this */
        const struct mscx_rbuf *rb = &g->rbuf[o->rbuf];
        int other_node = node[rb->rank] != node[r];
        int via_proxy = proxied && data_port_op(op->opcode);
        /* raw puts may write the peer's input or output buffer (resolved per launch); packet puts scratch only */
        int raw_put = op->opcode == MSCX_OP_PUT || op->opcode == MSCX_OP_PUT_WITH_SIGNAL ||
                      op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH;
        if (via_proxy && (!is_dst || (rb->type != MSCX_BUF_SCRATCH && !raw_put))) {
            MSCX_WARN("plan %s: rank %u thread block %u op %u (%s): a port operation to another process must "
                      "write the peer's scratch buffer, or its input or output buffer with put, pws or pwsf "
                      "(%s operand %u names rank %u's %s buffer); refusing",
                      plan->name, r, b, j, name, is_dst ? "destination" : "source", is_dst ? k - op->nsrc : k,
                      rb->rank, buf_name(rb->type));
            return MSCX_ERR_UNSUPPORTED;
        }
        if (other_node && !via_proxy) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s) reaches rank %u's buffer directly, but rank %u "
                "is on node %u and rank %u on node %u: only port put, pws, pwsf, ppkt and rppkt cross "
                "nodes; refusing",
                plan->name, r, b, j, name, rb->rank, r, node[r], rb->rank, node[rb->rank]);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    return MSCX_OK;
}

mscx_status_t mscx_gpu_topology(const struct mscx_plan *plan, const struct gpu_peer *peers, uint32_t *node)
{
    uint32_t n = plan->nranks;
    int32_t v = peers[0].vnodes;
    for (uint32_t r = 1; r < n; r++) {
        if (peers[r].vnodes != v) {
            MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES differs between ranks (rank 0: %d, rank %u: %d); refusing",
                      plan->name, v, r, peers[r].vnodes);
            return MSCX_ERR_INVALID_ARG;
        }
    }
    if (v > 1 && (uint32_t)v > n) {
        MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES %d is more than the plan's %u ranks; refusing", plan->name, v,
                  n);
        return MSCX_ERR_INVALID_ARG;
    }
    if (v > 1 && n % (uint32_t)v != 0) {
        MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES %d does not divide the plan's %u ranks; refusing", plan->name,
                  v, n);
        return MSCX_ERR_INVALID_ARG;
    }
    uint32_t per = v > 1 ? n / (uint32_t)v : n, nodes = 0;
    for (uint32_t r = 0; r < n; r++) {
        node[r] = UINT32_MAX;
        for (uint32_t q = 0; q < r; q++)
            if (peers[q].host == peers[r].host && q / per == r / per) {
                node[r] = node[q];
                break;
            }
        if (node[r] == UINT32_MAX)
            node[r] = nodes++;
    }
    for (uint32_t r = 0; r < n; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t k = 0; k < g->nchan[MSCX_CHAN_MEMORY]; k++) {
            uint32_t p = g->chan[MSCX_CHAN_MEMORY][k].peer;
            if (node[p] != node[r]) {
                MSCX_WARN(
                    "plan %s: rank %u's memory channel %u to rank %u crosses nodes (node %u and node %u%s): "
                    "memory channels must stay within a node; refusing",
                    plan->name, r, k, p, node[r], node[p], v > 1 ? ", MSCX_VIRTUAL_NODES split" : "");
                return MSCX_ERR_UNSUPPORTED;
            }
        }
        for (uint32_t b = 0; b < g->ntb; b++)
            for (uint32_t j = 0; j < g->tb[b].nops; j++)
                MSCX_CHECK(check_op(plan, peers, node, r, b, j, &g->ops[g->tb[b].op_begin + j]));
    }
    return MSCX_OK;
}

/* ---------------------------------------------------------------- cuda link */

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

/* The kernel mapped the peer's buffer of this launch (peer_buffers.c) and names the address in this process. */
static mscx_status_t cl_put_user(void *link, const void *src, const struct mscx_puser *dst, uint64_t len,
                                 uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    (void)deadline_ns;
    if (!dst->addr) {
        MSCX_WARN("internal bug: a put into a user buffer of a peer of the same node without its mapped address");
        return MSCX_ERR_INTERNAL;
    }
    MSCX_CHECK(CU(cudaSetDevice(l->net->device)));
    return CU(cudaMemcpyAsync((void *)(uintptr_t)dst->addr, src, len, cudaMemcpyDeviceToDevice, l->net->stream));
}

static mscx_status_t cl_signal(void *link, uint64_t deadline_ns)
{
    struct cuda_link *l = link;
    struct gpu_net *n = l->net;
    (void)deadline_ns;
    uint64_t i = n->ring_n % SIG_RING;
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    if (i % SIG_GROUP ==
        0) /* the copies that last used this group have run (never recorded: returns at once) */
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
            return cu(rc, "cudaEventQuery(proxy stream)");
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

static const struct mscx_plink_ops cuda_link_ops = {
    .name = "cuda",
    .put = cl_put,
    .put_user = cl_put_user,
    .signal = cl_signal,
    .flush = cl_flush,
    .check = NULL, /* a dead peer on the same host shows as a timeout of the waiting kernel */
};

/* ---------------------------------------------------------------- TCP hooks */

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
 * Called from the TCP receiver thread only.
 */
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

/* Does a rank on another node reach rank @p rank's input or output buffer (by a proxied port put)? */
static int late_target(const struct gpu_port_setup *s, uint32_t rank)
{
    for (uint32_t r = 0; r < s->plan->nranks; r++) {
        const struct mscx_gpu *g = &s->plan->gpus[r];
        for (uint32_t i = 0; s->node[r] != s->node[rank] && i < g->nrbuf; i++)
            if (g->rbuf[i].rank == rank && g->rbuf[i].type != MSCX_BUF_SCRATCH)
                return 1;
    }
    return 0;
}

static mscx_status_t stage_d2h(void *ctx, void *dst, const void *src, size_t len)
{
    struct gpu_net *n = ctx;
    MSCX_CHECK(CU(cudaSetDevice(n->device)));
    MSCX_CHECK(CU(cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, n->stream)));
    return CU(cudaStreamSynchronize(n->stream));
}

/* ---------------------------------------------------------------- setup */

void mscx_gpu_net_destroy(struct gpu_net *n)
{
    if (!n)
        return;
    cudaSetDevice(n->device);
    if (n->ep)
        n->tp->ep_destroy(n->ep); /* closes connections, stops the receiver, frees regions */
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

static mscx_status_t net_create(int device, uint32_t nranks, struct gpu_net **net_p)
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

/* cuMemGetHandleForAddressRange through the runtime's driver entry point (no libcuda link). */
typedef int (*get_handle_fn)(void *handle, unsigned long long dptr, size_t size, int type, unsigned long long flags);
#define DMABUF_HANDLE_TYPE 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */

static get_handle_fn dmabuf_entry(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return (get_handle_fn)fn;
}

/*
 * Register device memory [base, base+len) on the RDMA endpoint through a
 * dmabuf of its page-aligned cover; the descriptor names the exact region.
 */
static mscx_status_t ib_register_gpu(struct gpu_net *n, void *base, size_t len, struct mscx_tp_mr **mr_p,
                                     struct mscx_tp_rdesc *desc_p)
{
    get_handle_fn get = dmabuf_entry();
    uintptr_t a = (uintptr_t)base & ~(uintptr_t)4095, e = ((uintptr_t)base + len + 4095) & ~(uintptr_t)4095;
    int fd = -1;
    if (!get) {
        MSCX_WARN("ib: cuMemGetHandleForAddressRange is not available: no GPUDirect RDMA (set MSCX_TRANSPORT tcp)");
        return MSCX_ERR_UNSUPPORTED;
    }
    int rc = get(&fd, (unsigned long long)a, e - a, DMABUF_HANDLE_TYPE, 0);
    if (rc != 0 || fd < 0) {
        MSCX_WARN("ib: no dmabuf for GPU memory %p + %zu (cuMemGetHandleForAddressRange error %d): no GPUDirect "
                  "RDMA here (set MSCX_TRANSPORT tcp)",
                  base, len, rc);
        return MSCX_ERR_UNSUPPORTED;
    }
    mscx_status_t st =
        n->tp->mr_register(n->ep, (void *)a, e - a, MSCX_TP_MR_GPU | MSCX_TP_MR_REMOTE_WRITE, fd, mr_p, desc_p);
    close(fd); /* the registration holds its own reference */
    if (st == MSCX_OK) {
        desc_p->addr = (uint64_t)(uintptr_t)base; /* remote addresses are virtual: the cover's key reaches these */
        desc_p->len = len;
    }
    return st;
}

/*
 * Choose the transport between nodes (collective: every rank must agree).
 * auto: ib when this rank opened an RDMA device and can export GPU memory as
 * a dmabuf, and so can every other rank; else tcp. ib: the same, but an error
 * when some rank cannot. tcp: tcp.
 */
static mscx_status_t net_choose(struct gpu_net *n, const struct gpu_port_setup *s, const struct mscx_tp_params *p)
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
#ifdef MSCX_NET_HAS_IB
    if (strcmp(mode, "tcp") != 0) {
        mscx_status_t st;
        if (strcmp(mode, "auto") == 0)
            MSCX_NOWARN(st = mscx_tp_ib.ep_create(p, &ib_ep));
        else
            st = mscx_tp_ib.ep_create(p, &ib_ep);
        if (st != MSCX_OK)
            why = "no usable RDMA device (libibverbs missing, no device or no active port)";
        else if (!dmabuf_entry())
            why = "RDMA device present, but CUDA cannot export GPU memory as a dmabuf (no GPUDirect RDMA)";
        else
            mine = 1;
    }
#else
    if (strcmp(mode, "tcp") != 0)
        why = "built without infiniband/verbs.h";
#endif
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
        MSCX_INFO(MSCX_SUB_PROXY,
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
            MSCX_WARN("rank %u: MSCX_TRANSPORT is ib, but this rank cannot use it: %s; refusing", s->rank, why);
        return MSCX_ERR_UNSUPPORTED;
    }
    n->tp = &mscx_tp_tcp;
    n->plink = &mscx_plink_tcp;
    MSCX_INFO(MSCX_SUB_PROXY, "rank %u: port channels between nodes use tcp (MSCX_TRANSPORT %s: %s)", s->rank, mode,
              strcmp(mode, "tcp") == 0 ? why : mine ? "another rank cannot use ib" : why);
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

/* The endpoint, and connections to every rank this plan reaches by a port channel across nodes (collective).
 */
static mscx_status_t net_connect(struct gpu_net *n, const struct gpu_port_setup *s)
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
        MSCX_WARN("plan %s: rank %u: %s connections to the ranks of other nodes failed: %s", plan->name,
                  rank, n->tp->name, mscx_status_str(st));
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
        if (p->late->mr)
            p->net->tp->mr_deregister(p->net->ep, p->late->mr);
        free(p->late);
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
            free(p->links[k]);
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
            lst = mscx_tp_tcp.mr_register_late(n->ep, late_resolve, lr, &lr->mr, &mine[2]);
    } else {
        if (s->scratch_bytes)
            lst = ib_register_gpu(n, s->scratch, s->scratch_bytes, &mr, &mine[0]);
        if (lst == MSCX_OK && ntok)
            lst = ib_register_gpu(n, s->tok, (size_t)ntok * 8u, &mr, &mine[1]);
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
        if ((s->peers[r].scratch_bytes && all[3u * r].len == 0) || (late_target(s, r) && all[3u * r + 2u].tp == 0)) {
            MSCX_WARN("plan %s: rank %u could not register its memory for %s; failing with it", s->plan->name, r,
                      n->tp->name);
            st = MSCX_ERR_REMOTE;
        }
    }
    return st;
}

mscx_status_t mscx_gpu_port_setup(struct gpu_net **net_p, const struct gpu_port_setup *s,
                                  struct gpu_port **port_p, struct mscx_gpu_port **dev_p)
{
    const struct mscx_plan *plan = s->plan;
    uint32_t rank = s->rank, nr = plan->nranks;
    const struct mscx_gpu *g = &plan->gpus[rank];
    uint32_t nchan = g->nchan[MSCX_CHAN_PORT];
    mscx_status_t st = MSCX_OK;
    struct mscx_tp_rdesc *rd = NULL;
    struct gpu_port *p = NULL;
    struct late_res *lr = NULL;
    uint8_t *proxied = NULL;
    int any = 0, tcp = 0;

    *port_p = NULL;
    *dev_p = NULL;
    /* Every rank decides the same: some port channel of the plan crosses nodes. */
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t k = 0; k < plan->gpus[r].nchan[MSCX_CHAN_PORT]; k++)
            if (s->node[plan->gpus[r].chan[MSCX_CHAN_PORT][k].peer] != s->node[r])
                tcp = 1;
    proxied = calloc(nchan ? nchan : 1, 1);
    if (!proxied)
        return MSCX_ERR_NO_MEMORY;
    for (uint32_t k = 0; k < nchan; k++) {
        const struct mscx_chan *ch = &g->chan[MSCX_CHAN_PORT][k];
        proxied[k] = ch->paired && !same_proc(&s->peers[rank], &s->peers[ch->peer]);
        any |= proxied[k];
    }
    if (!any && !tcp) {
        free(proxied);
        return MSCX_OK;
    }
    if (!*net_p && (st = net_create(s->device, nr, net_p)) != MSCX_OK)
        goto err;
    struct gpu_net *n = *net_p;
    if (tcp) {
        rd = calloc(3u * nr, sizeof(*rd));
        if (!rd) {
            st = MSCX_ERR_NO_MEMORY;
            goto err;
        }
        if ((st = net_connect(n, s)) != MSCX_OK)
            goto err;
        /* the same answer on every rank (same plan, same transport): all refuse together */
        for (uint32_t r = 0; r < nr; r++) {
            if (late_target(s, r) && !n->tp->mr_register_late) {
                MSCX_WARN("plan %s: a port put from another node writes rank %u's input or output buffer, which "
                          "the %s transport cannot do (it needs the buffer's remote address and key at every "
                          "launch); use MSCX_TRANSPORT=tcp, or a plan that puts into scratch; refusing",
                          plan->name, r, n->tp->name);
                st = MSCX_ERR_UNSUPPORTED;
                goto err;
            }
        }
        if (late_target(s, rank)) {
            if (!(lr = calloc(1, sizeof(*lr)))) {
                st = MSCX_ERR_NO_MEMORY; /* the peers fail in the exchange below (no descriptor) */
            } else {
                lr->n = n;
                lr->pub = s->pub;
                lr->rank = rank;
                snprintf(lr->plan, sizeof(lr->plan), "%s", plan->name);
            }
        }
        mscx_status_t rst = share_regions(n, s, lr, rd);
        if (st == MSCX_OK)
            st = rst;
        if (st != MSCX_OK)
            goto err;
    }
    if (!any) {
        /* nothing proxied on this rank, so no paired channel from another node either: no late puts */
        if (lr && lr->mr)
            n->tp->mr_deregister(n->ep, lr->mr);
        free(lr);
        free(rd);
        free(proxied);
        return MSCX_OK;
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        st = MSCX_ERR_NO_MEMORY;
        goto err;
    }
    p->net = n;
    p->nchan = nchan;
    p->host = s->host;
    p->late = lr;
    lr = NULL;
    p->links = calloc(nchan, sizeof(*p->links));
    p->lops = calloc(nchan, sizeof(*p->lops));
    struct mscx_pchan *pc = calloc(nchan, sizeof(*pc));
    if (!p->links || !p->lops || !pc) {
        free(pc);
        st = MSCX_ERR_NO_MEMORY;
        goto err;
    }
    for (uint32_t k = 0; k < nchan && st == MSCX_OK; k++) {
        if (!proxied[k])
            continue;
        const struct mscx_chan *ch = &g->chan[MSCX_CHAN_PORT][k];
        uint32_t peer = ch->peer;
        pc[k].peer = peer;
        pc[k].dst_bytes = s->peers[peer].scratch_bytes;
        if (s->node[peer] == s->node[rank]) {
            struct cuda_link *l = calloc(1, sizeof(*l));
            if (!l) {
                st = MSCX_ERR_NO_MEMORY;
                break;
            }
            l->net = n;
            l->peer_scr = s->peer_scr[peer];
            l->peer_tok = (unsigned long long *)s->port_tok[k];
            p->links[k] = l;
            p->lops[k] = &cuda_link_ops;
            if (!l->peer_tok || (!l->peer_scr && pc[k].dst_bytes)) {
                MSCX_WARN("internal bug: plan %s: rank %u port channel %u to rank %u on the same node has no "
                          "mapped peer memory",
                          plan->name, rank, k, peer);
                st = MSCX_ERR_INTERNAL;
            }
            MSCX_INFO(MSCX_SUB_PROXY, "plan %s: rank %u port channel %u to rank %u: proxy, cuda copies",
                      plan->name, rank, k, peer);
        } else {
            void *bounce = n->bounce;
            struct mscx_tp_mr *bmr = n->bounce_mr;
            if (n->tp != &mscx_tp_tcp) {
                /* RDMA reads the bounce after put returns: one ring per link, registered once */
                struct mscx_tp_rdesc unused;
                if (!p->lbounce && !(p->lbounce = calloc(nchan, sizeof(*p->lbounce)))) {
                    st = MSCX_ERR_NO_MEMORY;
                    break;
                }
                if ((st = CU(cudaHostAlloc(&p->lbounce[k], BOUNCE_BYTES, cudaHostAllocDefault))) != MSCX_OK ||
                    (st = n->tp->mr_register(n->ep, p->lbounce[k], BOUNCE_BYTES, 0, -1, &bmr, &unused)) != MSCX_OK)
                    break;
                bounce = p->lbounce[k];
            }
            struct mscx_ptcp_link_params lp = {.tp = n->tp,
                                               .ep = n->ep,
                                               .conn = n->conn[peer],
                                               .dst = rd[3u * peer],
                                               .tok = rd[3u * peer + 1u],
                                               .user = rd[3u * peer + 2u],
                                               .tok_off = (uint64_t)ch->pair * 8u,
                                               .bounce_mr = bmr,
                                               .bounce = bounce,
                                               .async_src = n->tp != &mscx_tp_tcp,
                                               .bounce_bytes = BOUNCE_BYTES,
                                               .stage = stage_d2h,
                                               .stage_ctx = n,
                                               .peer = peer};
            if (!lp.conn) {
                MSCX_WARN("internal bug: plan %s: rank %u has no %s connection to rank %u", plan->name, rank,
                          n->tp->name, peer);
                st = MSCX_ERR_INTERNAL;
                break;
            }
            st = mscx_plink_tcp_create(&lp, &p->links[k]);
            p->lops[k] = n->plink;
            MSCX_INFO(MSCX_SUB_PROXY, "plan %s: rank %u port channel %u to rank %u (node %u): proxy, %s",
                      plan->name, rank, k, peer, s->node[peer], n->tp->name);
        }
        pc[k].ops = p->lops[k];
        pc[k].link = p->links[k];
    }
    if (st != MSCX_OK) {
        free(pc);
        goto err;
    }
    /* FIFO in mapped host memory; device state: struct, proxied[nchan], dirty[ntb] */
    size_t dev_bytes = sizeof(struct mscx_gpu_port) + 64 + nchan + (size_t)s->ntb * 4u + 4u;
    char *img = calloc(1, dev_bytes);
    if (!img ||
        (st = CU(cudaHostAlloc((void **)&p->fifo, sizeof(struct mscx_pfifo), cudaHostAllocMapped))) !=
            MSCX_OK ||
        (st = CU(cudaMalloc((void **)&p->dev, dev_bytes))) != MSCX_OK) {
        if (!img)
            st = MSCX_ERR_NO_MEMORY;
        free(img);
        free(pc);
        goto err;
    }
    memset(p->fifo, 0, sizeof(*p->fifo));
    struct mscx_gpu_port *dp = (struct mscx_gpu_port *)img;
    char *dbase = (char *)p->dev;
    size_t o_prox = (sizeof(struct mscx_gpu_port) + 63) / 64 * 64;
    size_t o_dirty = (o_prox + nchan + 3) / 4 * 4;
    if ((st = CU(cudaHostGetDevicePointer((void **)&dp->fifo, p->fifo, 0))) != MSCX_OK) {
        free(img);
        free(pc);
        goto err;
    }
    dp->head = 0;
    dp->proxied = (const uint8_t *)(dbase + o_prox);
    dp->dirty = (uint32_t *)(dbase + o_dirty);
    memcpy(img + o_prox, proxied, nchan);
    st = CU(cudaMemcpy(p->dev, img, dev_bytes, cudaMemcpyHostToDevice));
    free(img);
    if (st != MSCX_OK) {
        free(pc);
        goto err;
    }
    struct mscx_pqueue_desc qd = {.fifo = p->fifo,
                                  .nchan = nchan,
                                  .chan = pc,
                                  .rank = rank,
                                  .name = plan->name,
                                  .timeout_ms = s->timeout_ms,
                                  .fail = port_fail,
                                  .ctx = p};
    st = mscx_proxy_attach(&qd, &p->q);
    free(pc);
    if (st != MSCX_OK)
        goto err;
    free(rd);
    free(proxied);
    *port_p = p;
    *dev_p = p->dev;
    return MSCX_OK;
err:
    if (lr && lr->mr)
        n->tp->mr_deregister(n->ep, lr->mr);
    free(lr);
    mscx_gpu_port_stop(p);
    mscx_gpu_port_free(p);
    free(rd);
    free(proxied);
    return st;
}
