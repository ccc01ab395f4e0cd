/* SPDX-License-Identifier: MIT */
/*
 * User buffers of peers in other processes (peer_buffers.h).
 *
 * At each launch, a rank whose input or output buffer is read by a peer in
 * another process (an "exporter") finds the allocation behind the buffer
 * (cuPointerGetAttributes: range start, size and the driver's buffer id,
 * unique in the process for the allocation's lifetime, so an address reused
 * by a new allocation is never mistaken for the old one), takes its CUDA IPC
 * handle from a per-context export cache (cudaIpcGetMemHandle on a miss) and
 * publishes {handle, buffer id, offset} in its slot of the shared-memory
 * exchange (shm_slots.c). A rank that reaches such buffers (a "reader") waits for
 * each exporter's publication of the same launch, maps the handle through a
 * process-wide import cache (cudaIpcOpenMemHandle once per allocation and
 * process: a handle cannot be opened twice in one process) and passes the
 * pointers in the kernel arguments (mscx_gpu_args.uptr). The kernel still
 * waits for the exporter's launch flag (mscx_dpeer_user), so the peer's
 * stream has reached the launch before its buffers are touched.
 *
 * Every rank of the exchange then posts a verdict and waits for all the
 * others': a failure anywhere (memory without an IPC handle, a new buffer
 * under graph capture) refuses the launch on every rank before anything is
 * enqueued, so the shim sends the call to NCCL everywhere. Under capture no
 * cudaIpc call is made; buffers met before are in the caches, and entries
 * used by a capture are pinned until the executor is destroyed (the graph
 * holds their pointers).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "peer_buffers.h"
#include "mscx/log.h"
#include "shm_slots.h"

#define EXPORT_CAP 64 /* allocations per context whose handles are kept (no resources: LRU replaced) */
#define IMPORT_CAP 64 /* mappings per context; past it the least recently used unpinned one is closed */

/* One buffer of a publication. */
struct ubuf_pub {
    cudaIpcMemHandle_t h;
    uint64_t id;      /* the allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID in the exporter */
    uint64_t off;     /* the buffer's offset in the allocation */
    uint64_t present; /* 0: no buffer this launch (NULL or zero bytes) */
};

struct bufs_pub {
    struct ubuf_pub b[2]; /* [0: input, 1: output] */
};
_Static_assert(sizeof(struct bufs_pub) <= MSCX_SLOTS_PAYLOAD_MAX, "publication too large");

struct export_ent {
    uintptr_t base;
    uint64_t size, id, used;
    cudaIpcMemHandle_t h;
};

/* A mapping of a peer's allocation, shared by every context of the process. */
struct import_ent {
    struct import_ent *next;
    int64_t pid;
    uint64_t host, id;
    int device;
    cudaIpcMemHandle_t h;
    void *mapped;
    uint32_t refs; /* contexts holding it */
    int pinned;    /* a captured graph holds its pointer: closed only when refs drop to 0 */
};

static pthread_mutex_t g_imp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct import_ent *g_imp;

struct ctx_imp {
    struct import_ent *e;
    uint64_t used;
};

struct uslot_src {
    uint32_t owner, type; /* type 0: input, 1: output */
};

typedef CUresult (*attrs_fn)(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr);

struct peer_bufs {
    const struct mscx_plan *plan;
    uint32_t rank;
    int device;
    struct mscx_slots *x;
    uint64_t seq;
    mscx_status_t broken; /* the exchange lost step: every later launch fails with this */
    int export_need[2];   /* peers in other processes read this rank's input / output */
    uint32_t nslot;
    struct uslot_src slot[MSCX_GPU_MAX_UPTR];
    uint32_t nowner;
    uint32_t owner[MSCX_GPU_MAX_UPTR]; /* distinct owners of the slots */
    uint32_t ngroup;
    uint32_t *group; /* ranks of the exchange on this node, this one included */
    int64_t *pid;    /* [nranks] */
    uint64_t *host;  /* [nranks] */
    struct export_ent exp[EXPORT_CAP];
    uint32_t nexp;
    struct ctx_imp imp[IMPORT_CAP];
    uint32_t nimp;
    struct mscx_slots_limits lim;
    attrs_fn attrs;
    cudaEvent_t used; /* recorded after each eager launch (mscx_peer_bufs_launched) */
    int used_state;   /* 0: never recorded, 1: recorded, -1: a record failed */
    int capturing;    /* the launch under way is being captured */
};

static int user_type(uint32_t t)
{
    return t == MSCX_BUF_INPUT || t == MSCX_BUF_OUTPUT;
}

/*
 * Distinct (owner, type) user buffers of other processes of the node that
 * rank @p r reaches; fills @p slot when given. (A user buffer on another node
 * is reached only by proxied port puts, which its owner's proxy resolves:
 * nothing to map.)
 */
static uint32_t rank_slots(const struct mscx_plan *plan, const struct gpu_peer *peers, const uint32_t *node,
                           uint32_t r, struct uslot_src *slot, uint32_t *uslot)
{
    const struct mscx_gpu *g = &plan->gpus[r];
    struct uslot_src seen[2 * MSCX_GPU_MAX_UPTR];
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->nrbuf; i++) {
        uint32_t o = g->rbuf[i].rank, t = g->rbuf[i].type == MSCX_BUF_OUTPUT;
        if (uslot)
            uslot[i] = UINT32_MAX;
        if (!user_type(g->rbuf[i].type) || mscx_gpu_same_proc(&peers[r], &peers[o]) || node[o] != node[r])
            continue;
        uint32_t k = 0;
        while (k < n && !(seen[k].owner == o && seen[k].type == t))
            k++;
        if (k == n) {
            if (n == 2 * MSCX_GPU_MAX_UPTR)
                return n + 1; /* over the limit either way */
            seen[n++] = (struct uslot_src){o, t};
        }
        if (uslot)
            uslot[i] = k;
    }
    if (slot)
        memcpy(slot, seen, (n < MSCX_GPU_MAX_UPTR ? n : MSCX_GPU_MAX_UPTR) * sizeof(*slot));
    return n;
}

mscx_status_t mscx_peer_bufs_check(const struct mscx_plan *plan, const struct gpu_peer *peers,
                                   const uint32_t *node)
{
    for (uint32_t r = 0; r < plan->nranks; r++) {
        uint32_t n = rank_slots(plan, peers, node, r, NULL, NULL);
        if (n > MSCX_GPU_MAX_UPTR) {
            MSCX_WARN("plan %s: rank %u reaches %s%u input or output buffers of ranks in other processes, "
                      "more than %d; refusing",
                      plan->name, r, n > 2 * MSCX_GPU_MAX_UPTR ? "over " : "",
                      n > 2 * MSCX_GPU_MAX_UPTR ? 2 * MSCX_GPU_MAX_UPTR : n, MSCX_GPU_MAX_UPTR);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    return MSCX_OK;
}

static attrs_fn attrs_entry(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return (attrs_fn)fn;
}

/* One exchange record of the setup: the segment's name, or why there is none. */
struct setup_rec {
    int32_t st;
    int32_t part; /* takes part in the exchange */
    char name[MSCX_SLOTS_NAME_MAX];
};

static void bufs_free(struct peer_bufs *u)
{
    if (u->used)
        cudaEventDestroy(u->used);
    mscx_slots_destroy(u->x);
    free(u->group);
    free(u->pid);
    free(u->host);
    free(u);
}

/*
 * Each rank's part in the exchange, in @p role: bit 0 it reads, bit 1 its
 * input is read, bit 2 its output is read (by other processes of its node).
 * @return whether any rank takes part
 */
static int exchange_roles(const struct peer_bufs_setup *s, uint8_t *role)
{
    const struct mscx_plan *plan = s->plan;
    int any = 0;
    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nrbuf; i++) {
            uint32_t o = g->rbuf[i].rank;
            if (!user_type(g->rbuf[i].type) || mscx_gpu_same_proc(&s->peers[r], &s->peers[o]) ||
                s->node[o] != s->node[r])
                continue;
            role[r] |= 1u;
            role[o] |= g->rbuf[i].type == MSCX_BUF_OUTPUT ? 4u : 2u;
            any = 1;
        }
    }
    return any;
}

/* This rank's part in @p u: what it exports, the buffers it reads, their owners, the ranks of its group. */
static void bufs_fill(struct peer_bufs *u, const struct peer_bufs_setup *s, const uint8_t *role)
{
    uint32_t rank = s->rank;
    u->plan = s->plan;
    u->rank = rank;
    u->device = s->device;
    u->lim.timeout_ms = s->timeout_ms;
    u->lim.abort = s->abort;
    u->export_need[0] = (role[rank] & 2u) != 0;
    u->export_need[1] = (role[rank] & 4u) != 0;
    u->nslot = rank_slots(s->plan, s->peers, s->node, rank, u->slot, NULL);
    for (uint32_t k = 0; k < u->nslot; k++) {
        uint32_t j = 0;
        while (j < u->nowner && u->owner[j] != u->slot[k].owner)
            j++;
        if (j == u->nowner)
            u->owner[u->nowner++] = u->slot[k].owner;
    }
    for (uint32_t r = 0; r < s->plan->nranks; r++) {
        u->pid[r] = s->peers[r].pid;
        u->host[r] = s->peers[r].host;
        if (role[r] && s->node[r] == s->node[rank])
            u->group[u->ngroup++] = r;
    }
}

/*
 * The context of a rank that takes part, in *u_p (NULL: no memory; freed
 * with bufs_free whatever this returns), and its exchange segment, whose
 * name goes to @p name. @return why this rank cannot take part (it still
 * makes the exchange's collective calls)
 */
static mscx_status_t bufs_create(const struct peer_bufs_setup *s, const uint8_t *role, char *name,
                                 struct peer_bufs **u_p)
{
    uint32_t n = s->plan->nranks;
    struct peer_bufs *u = calloc(1, sizeof(*u));
    *u_p = u;
    if (u) {
        u->group = calloc(n, sizeof(*u->group));
        u->pid = calloc(n, sizeof(*u->pid));
        u->host = calloc(n, sizeof(*u->host));
    }
    if (!u || !u->group || !u->pid || !u->host)
        return MSCX_ERR_NO_MEMORY;
    bufs_fill(u, s, role);
    cudaError_t ce = cudaEventCreateWithFlags(&u->used, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        u->used = NULL;
        MSCX_WARN("plan %s: rank %u: cudaEventCreateWithFlags: %s", s->plan->name, s->rank,
                  cudaGetErrorString(ce));
        return MSCX_ERR_CUDA;
    }
    if ((u->export_need[0] || u->export_need[1]) && !(u->attrs = attrs_entry())) {
        MSCX_WARN("plan %s: rank %u: cuPointerGetAttributes is not available from the CUDA driver: user "
                  "buffers cannot be shared with other processes",
                  s->plan->name, s->rank);
        return MSCX_ERR_UNSUPPORTED;
    }
    return mscx_slots_create(s->plan->name, s->rank, n, name, &u->x);
}

static mscx_status_t setup_allgather(const struct peer_bufs_setup *s, const void *mine, void *all,
                                     size_t bytes)
{
    mscx_status_t st = s->bs->allgather(s->bs->ctx, mine, all, bytes);
    if (st != MSCX_OK)
        MSCX_WARN("plan %s: rank %u: bootstrap allgather of the user-buffer exchange failed: %s",
                  s->plan->name, s->rank, mscx_status_str(st));
    return st;
}

/* Attach to the segments of the other ranks of this rank's group (@p all: every rank's setup record). */
static int32_t attach_group(struct peer_bufs *u, const struct setup_rec *all)
{
    int32_t st = MSCX_OK;
    for (uint32_t i = 0; st == MSCX_OK && i < u->ngroup; i++) {
        uint32_t r = u->group[i];
        if (r == u->rank)
            continue;
        if (all[r].st != MSCX_OK || !all[r].part)
            st = MSCX_ERR_REMOTE; /* that rank says why */
        else
            st = mscx_slots_attach(u->x, r, all[r].name);
    }
    return st;
}

/* Every rank's verdict on the setup (@p sts; this rank's @p ost): a failure anywhere refuses the plan. */
static mscx_status_t setup_verdict(const struct peer_bufs_setup *s, int32_t ost, const int32_t *sts)
{
    for (uint32_t r = 0; r < s->plan->nranks; r++)
        if (sts[r] != MSCX_OK) {
            if (r != s->rank || ost == MSCX_ERR_REMOTE)
                MSCX_WARN(
                    "plan %s: rank %u could not set up the user-buffer exchange (%s; its log says why); "
                    "refusing the plan",
                    s->plan->name, r, mscx_status_str(sts[r]));
            return MSCX_ERR_UNSUPPORTED;
        }
    return MSCX_OK;
}

mscx_status_t mscx_peer_bufs_setup(const struct peer_bufs_setup *s, uint32_t *uslot, struct peer_bufs **u_p)
{
    const struct mscx_plan *plan = s->plan;
    uint32_t n = plan->nranks, rank = s->rank;
    mscx_status_t st = MSCX_OK;
    uint8_t *role = calloc(n, 1); /* exchange_roles */
    struct setup_rec *all = calloc(n, sizeof(*all));
    int32_t *sts = calloc(n, sizeof(*sts));
    struct peer_bufs *u = NULL;
    if (!role || !all || !sts) {
        st = MSCX_ERR_NO_MEMORY;
        goto out;
    }
    int any = exchange_roles(s, role);
    rank_slots(plan, s->peers, s->node, rank, NULL, uslot);
    if (!any) {
        *u_p = NULL;
        goto out;
    }
    /* from here every rank makes the same collective calls, whatever fails locally */
    struct setup_rec mine;
    memset(&mine, 0, sizeof(mine));
    mine.part = role[rank] != 0;
    if (mine.part)
        mine.st = bufs_create(s, role, mine.name, &u);
    if ((st = setup_allgather(s, &mine, all, sizeof(mine))) != MSCX_OK)
        goto out;
    int32_t ost = mine.st;
    if (mine.part && ost == MSCX_OK)
        ost = attach_group(u, all);
    if ((st = setup_allgather(s, &ost, sts, sizeof(ost))) != MSCX_OK)
        goto out;
    if (u && u->x)
        mscx_slots_unlink(u->x); /* everyone attached (or gave up): the name is no longer needed */
    if ((st = setup_verdict(s, ost, sts)) != MSCX_OK)
        goto out;
    if (mine.part) {
        MSCX_INFO(MSCX_SUB_IPC,
                  "plan %s: rank %u exchanges user buffers with %u ranks of its node (exports%s%s, "
                  "reads %u)",
                  plan->name, rank, u->ngroup - 1, u->export_need[0] ? " input" : "",
                  u->export_need[1] ? " output" : "", u->nslot);
        *u_p = u;
        u = NULL;
    } else {
        *u_p = NULL;
    }
out:
    if (u)
        bufs_free(u);
    free(role);
    free(all);
    free(sts);
    return st;
}

/* ---- export ---- */

/* The allocation behind a buffer, as cuPointerGetAttributes reports it. */
struct alloc_info {
    unsigned long long id;
    CUdeviceptr base;
    size_t size;
};

/* The allocation behind this rank's @p which buffer [ptr, +bytes); refused unless peers can map it. */
static mscx_status_t export_alloc(struct peer_bufs *u, const void *ptr, uint64_t bytes, const char *which,
                                  struct alloc_info *ai_p)
{
    unsigned int memtype = 0, managed = 0, ipc_ok = 0;
    unsigned long long id = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[] = {&memtype, &managed, &ipc_ok, &id, &base, &size};
    CUresult rc = u->attrs(6, at, data, (CUdeviceptr)(uintptr_t)ptr);
    const char *pn = u->plan->name;
    if (rc != CUDA_SUCCESS) {
        MSCX_WARN("plan %s: rank %u: cuPointerGetAttributes on its %s buffer %p failed (CUresult %d)", pn,
                  u->rank, which, ptr, (int)rc);
        return MSCX_ERR_UNSUPPORTED;
    }
    /* booleans are written as bool: only the low byte counts */
    managed &= 0xffu;
    ipc_ok &= 0xffu;
    if (memtype != CU_MEMORYTYPE_DEVICE || managed) {
        MSCX_WARN(
            "plan %s: rank %u: its %s buffer %p is %s, which peers in other processes cannot map (CUDA IPC "
            "needs cudaMalloc memory); such calls are refused",
            pn, u->rank, which, ptr,
            managed                         ? "managed memory"
            : memtype == CU_MEMORYTYPE_HOST ? "host memory"
                                            : "not device memory");
        return MSCX_ERR_UNSUPPORTED;
    }
    if (!ipc_ok) {
        MSCX_WARN(
            "plan %s: rank %u: its %s buffer %p comes from an allocation without a CUDA IPC handle "
            "(cuMemCreate/VMM or a memory pool); peers in other processes cannot map it; such calls are "
            "refused",
            pn, u->rank, which, ptr);
        return MSCX_ERR_UNSUPPORTED;
    }
    uintptr_t p = (uintptr_t)ptr;
    if (p < (uintptr_t)base || p - (uintptr_t)base + bytes > size) {
        MSCX_WARN("caller bug: plan %s: rank %u: its %s buffer %p + %llu bytes runs past its allocation "
                  "[0x%llx, +%zu)",
                  pn, u->rank, which, ptr, (unsigned long long)bytes, (unsigned long long)base, size);
        return MSCX_ERR_UNSUPPORTED;
    }
    *ai_p = (struct alloc_info){id, base, size};
    return MSCX_OK;
}

/*
 * The export cache's entry of allocation @p ai: on a miss (or a new
 * allocation at a reused address) a new CUDA IPC handle, refused under
 * capture, in a free entry or the least recently used one.
 */
static mscx_status_t export_entry(struct peer_bufs *u, const struct alloc_info *ai, int capturing,
                                  const char *which, const void *ptr, struct export_ent **e_p)
{
    const char *pn = u->plan->name;
    struct export_ent *e = NULL, *lru = NULL;
    for (uint32_t i = 0; i < u->nexp; i++) {
        if (u->exp[i].base == (uintptr_t)ai->base) {
            e = &u->exp[i];
            break;
        }
        if (!lru || u->exp[i].used < lru->used)
            lru = &u->exp[i];
    }
    if (e && e->id == ai->id) {
        *e_p = e;
        return MSCX_OK;
    }
    /* new allocation, or a new one at a reused address (its buffer id differs) */
    if (capturing) {
        MSCX_WARN(
            "plan %s: rank %u: its %s buffer %p is new to the executor and the launch is being captured "
            "into a CUDA graph, where no CUDA IPC handle can be made: run one launch with this buffer "
            "outside capture first; this call is refused",
            pn, u->rank, which, ptr);
        return MSCX_ERR_UNSUPPORTED;
    }
    cudaIpcMemHandle_t h;
    cudaError_t ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)ai->base);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        MSCX_WARN(
            "plan %s: rank %u: cudaIpcGetMemHandle on the allocation of its %s buffer %p: %s; such calls "
            "are refused",
            pn, u->rank, which, ptr, cudaGetErrorString(ce));
        return MSCX_ERR_UNSUPPORTED;
    }
    if (!e)
        e = u->nexp < EXPORT_CAP ? &u->exp[u->nexp++] : lru;
    e->base = (uintptr_t)ai->base;
    e->size = ai->size;
    e->id = ai->id;
    e->h = h;
    MSCX_INFO(MSCX_SUB_IPC, "plan %s: rank %u exports the allocation 0x%llx (%zu bytes) of its %s buffer", pn,
              u->rank, (unsigned long long)ai->base, ai->size, which);
    *e_p = e;
    return MSCX_OK;
}

static mscx_status_t export_buf(struct peer_bufs *u, const void *ptr, uint64_t bytes, int capturing,
                                const char *which, struct ubuf_pub *b)
{
    struct alloc_info ai;
    struct export_ent *e;
    memset(b, 0, sizeof(*b));
    if (!ptr || bytes == 0)
        return MSCX_OK;
    MSCX_CHECK(export_alloc(u, ptr, bytes, which, &ai));
    MSCX_CHECK(export_entry(u, &ai, capturing, which, ptr, &e));
    e->used = u->seq;
    b->h = e->h;
    b->id = e->id;
    b->off = (uintptr_t)ptr - e->base;
    b->present = 1;
    return MSCX_OK;
}

/* ---- import ---- */

/* Drop this context's hold on @p e; the last holder closes it. Called with g_imp_lock held. */
static void import_release_locked(struct import_ent *e)
{
    if (--e->refs != 0)
        return;
    for (struct import_ent **pp = &g_imp; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    cudaError_t ce = cudaIpcCloseMemHandle(e->mapped);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        MSCX_WARN("cudaIpcCloseMemHandle of a peer's user buffer mapping %p: %s", e->mapped,
                  cudaGetErrorString(ce));
    }
    free(e);
}

/*
 * This context's mapping of @p b from @p owner, when it holds one (no lock:
 * only this rank's thread launches): its address for the buffer in
 * *ptr_p. Else @return 0, and *lru_p is the least recently used unpinned
 * mapping of the context (NULL: none).
 */
static int import_held(struct peer_bufs *u, uint32_t owner, const struct ubuf_pub *b, int capturing,
                       char **ptr_p, struct ctx_imp **lru_p)
{
    struct ctx_imp *lru = NULL;
    for (uint32_t i = 0; i < u->nimp; i++) {
        struct import_ent *e = u->imp[i].e;
        if (e->pid == u->pid[owner] && e->host == u->host[owner] && e->id == b->id &&
            memcmp(&e->h, &b->h, sizeof(b->h)) == 0) {
            u->imp[i].used = u->seq;
            if (capturing)
                e->pinned = 1; /* benign race with other contexts: only ever set */
            *ptr_p = (char *)e->mapped + b->off;
            return 1;
        }
        if (!e->pinned && (!lru || u->imp[i].used < lru->used))
            lru = &u->imp[i];
    }
    *lru_p = lru;
    return 0;
}

/*
 * The process-wide mapping of @p b from @p owner, opened on a miss (refused
 * under capture). Called with g_imp_lock held.
 */
static mscx_status_t import_open_locked(struct peer_bufs *u, uint32_t owner, const struct ubuf_pub *b,
                                        int capturing, const char *which, struct import_ent **e_p)
{
    const char *pn = u->plan->name;
    struct import_ent *e = g_imp;
    while (e && !(e->pid == u->pid[owner] && e->host == u->host[owner] && e->device == u->device &&
                  e->id == b->id && memcmp(&e->h, &b->h, sizeof(b->h)) == 0))
        e = e->next;
    if (e) {
        *e_p = e;
        return MSCX_OK;
    }
    if (capturing) {
        MSCX_WARN("plan %s: rank %u: rank %u's %s buffer is new to this process and the launch is being "
                  "captured into a CUDA graph, where no CUDA IPC handle can be opened: run one launch with "
                  "this buffer outside capture first; this call is refused",
                  pn, u->rank, owner, which);
        return MSCX_ERR_UNSUPPORTED;
    }
    e = calloc(1, sizeof(*e));
    if (!e)
        return MSCX_ERR_NO_MEMORY;
    cudaError_t ce = cudaIpcOpenMemHandle(&e->mapped, b->h, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        MSCX_WARN("plan %s: rank %u: cudaIpcOpenMemHandle of rank %u's %s buffer: %s; this call is refused",
                  pn, u->rank, owner, which, cudaGetErrorString(ce));
        free(e);
        return MSCX_ERR_UNSUPPORTED;
    }
    e->pid = u->pid[owner];
    e->host = u->host[owner];
    e->device = u->device;
    e->id = b->id;
    e->h = b->h;
    e->next = g_imp;
    g_imp = e;
    MSCX_INFO(MSCX_SUB_IPC, "plan %s: rank %u mapped rank %u's %s buffer allocation at %p", pn, u->rank,
              owner, which, e->mapped);
    *e_p = e;
    return MSCX_OK;
}

/*
 * Before closing this context's least recently used unpinned mapping to
 * make room (rare: only past IMPORT_CAP distinct buffers): a kernel of an
 * earlier launch may still use it. Only eager launches use an unpinned
 * mapping (a captured one pins what it maps), and the executor runs its
 * launches one after the other whatever their streams (launch_order.h): so
 * once the latest eager launch of this context is done, every one before
 * it is. Its end is the `used` event, recorded after it; nothing else on
 * the device is waited for. Called without g_imp_lock: no other context's
 * import waits behind this.
 */
static mscx_status_t import_evict_wait(const struct peer_bufs *u)
{
    if (u->used_state == 0)
        return MSCX_OK; /* no eager launch of this context yet */
    if (u->used_state < 0) {
        MSCX_WARN("plan %s: rank %u: the end of an earlier launch is unknown (its event was not recorded); "
                  "no mapping is closed and this call is refused",
                  u->plan->name, u->rank);
        return MSCX_ERR_CUDA;
    }
    cudaError_t ce = cudaEventSynchronize(u->used);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        MSCX_WARN("plan %s: rank %u: waiting for the latest launch before closing a mapping: %s",
                  u->plan->name, u->rank, cudaGetErrorString(ce));
        return MSCX_ERR_CUDA;
    }
    return MSCX_OK;
}

/* Close mapping @p lru of this context (after import_evict_wait). Called with g_imp_lock held. */
static void import_evict_locked(struct peer_bufs *u, struct ctx_imp *lru)
{
    import_release_locked(lru->e);
    *lru = u->imp[--u->nimp];
}

static mscx_status_t import_buf(struct peer_bufs *u, uint32_t owner, const struct ubuf_pub *b, int capturing,
                                const char *which, char **ptr_p)
{
    struct ctx_imp *lru;
    struct import_ent *e;
    if (!b->present) {
        *ptr_p = NULL;
        return MSCX_OK;
    }
    if (import_held(u, owner, b, capturing, ptr_p, &lru))
        return MSCX_OK;
    if (u->nimp == IMPORT_CAP && !lru) {
        MSCX_WARN(
            "plan %s: rank %u: %d peer user buffers are mapped and pinned by CUDA graphs; no room for rank "
            "%u's %s buffer; this call is refused",
            u->plan->name, u->rank, IMPORT_CAP, owner, which);
        return MSCX_ERR_UNSUPPORTED;
    }
    mscx_status_t st = u->nimp == IMPORT_CAP ? import_evict_wait(u) : MSCX_OK;
    if (st != MSCX_OK)
        return st;
    pthread_mutex_lock(&g_imp_lock);
    st = import_open_locked(u, owner, b, capturing, which, &e);
    if (st == MSCX_OK) {
        e->refs++;
        if (capturing)
            e->pinned = 1;
        if (u->nimp == IMPORT_CAP)
            import_evict_locked(u, lru);
    }
    if (st == MSCX_OK) {
        u->imp[u->nimp++] = (struct ctx_imp){e, u->seq};
        *ptr_p = (char *)e->mapped + b->off;
    }
    pthread_mutex_unlock(&g_imp_lock);
    return st;
}

/* ---- launch ---- */

static const char *const k_which[2] = {"input", "output"};

mscx_status_t mscx_peer_bufs_launch(struct peer_bufs *u, const void *in, uint64_t in_bytes, const void *out,
                                    uint64_t out_bytes, void *stream, void **uptr)
{
    if (u->broken != MSCX_OK) {
        MSCX_INFO(MSCX_SUB_IPC, "plan %s: rank %u: the user-buffer exchange failed earlier (%s); refusing",
                  u->plan->name, u->rank, mscx_status_str(u->broken));
        return u->broken;
    }
    const char *pn = u->plan->name;
    uint64_t seq = ++u->seq;
    mscx_status_t mine = MSCX_OK, st;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t ce = cudaStreamIsCapturing((cudaStream_t)stream, &cs);
    if (ce != cudaSuccess) {
        MSCX_WARN("plan %s: rank %u: cudaStreamIsCapturing: %s", pn, u->rank, cudaGetErrorString(ce));
        mine = MSCX_ERR_CUDA;
    }
    int capturing = cs != cudaStreamCaptureStatusNone;
    u->capturing = capturing;
    /* a failure below still takes part in the exchange, so that every rank refuses this launch together */
    if (u->export_need[0] || u->export_need[1]) {
        struct bufs_pub pub;
        memset(&pub, 0, sizeof(pub));
        int32_t pst = mine;
        const void *ptr[2] = {in, out};
        uint64_t bytes[2] = {in_bytes, out_bytes};
        for (int t = 0; t < 2 && pst == MSCX_OK; t++)
            if (u->export_need[t])
                pst = export_buf(u, ptr[t], bytes[t], capturing, k_which[t], &pub.b[t]);
        if (mine == MSCX_OK)
            mine = pst;
        if ((st = mscx_slots_publish(u->x, seq, pst, &pub, sizeof(pub))) != MSCX_OK)
            goto broken;
    }
    for (uint32_t j = 0; j < u->nowner; j++) {
        uint32_t o = u->owner[j];
        struct bufs_pub pub;
        int32_t pst;
        if ((st = mscx_slots_wait(u->x, o, seq, &u->lim, &pst, &pub, sizeof(pub))) != MSCX_OK)
            goto broken;
        if (pst != MSCX_OK) {
            if (mine == MSCX_OK)
                mine = MSCX_ERR_REMOTE; /* the exporter said why */
            continue;
        }
        for (uint32_t k = 0; k < u->nslot && mine == MSCX_OK; k++) {
            if (u->slot[k].owner != o)
                continue;
            char *p = NULL;
            mine = import_buf(u, o, &pub.b[u->slot[k].type], capturing, k_which[u->slot[k].type], &p);
            uptr[k] = p;
        }
    }
    uint32_t bad_rank;
    int32_t bad;
    if ((st = mscx_slots_verdict(u->x, seq, mine)) != MSCX_OK ||
        (st = mscx_slots_agree(u->x, u->group, u->ngroup, seq, &u->lim, &bad_rank, &bad)) != MSCX_OK)
        goto broken;
    if (bad_rank == UINT32_MAX)
        return MSCX_OK;
    if (mine == MSCX_OK || mine == MSCX_ERR_REMOTE)
        MSCX_WARN(
            "plan %s: rank %u: launch %llu is refused on every rank: rank %u could not share or map a user "
            "buffer (%s; its log says why)",
            pn, u->rank, (unsigned long long)seq, bad_rank, mscx_status_str((mscx_status_t)bad));
    return MSCX_ERR_UNSUPPORTED; /* nothing was enqueued on any rank: the caller may fall back */
broken:
    /* the ranks are no longer at the same launch; no later launch can agree */
    u->broken = st == MSCX_ERR_INVALID_ARG ? MSCX_ERR_INTERNAL : st;
    MSCX_WARN(
        "plan %s: rank %u: the user-buffer exchange of launch %llu failed (%s); this plan's launches fail "
        "from now on",
        pn, u->rank, (unsigned long long)seq, mscx_status_str(st));
    return u->broken;
}

void mscx_peer_bufs_launched(struct peer_bufs *u, void *stream)
{
    if (!u || u->nslot == 0 || u->capturing || u->used_state < 0)
        return; /* nothing mapped here, or nothing an eviction could use */
    cudaError_t ce = cudaEventRecord(u->used, (cudaStream_t)stream);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        u->used_state = -1; /* a later eviction refuses rather than guess */
        MSCX_WARN("plan %s: rank %u: cudaEventRecord after a launch: %s", u->plan->name, u->rank,
                  cudaGetErrorString(ce));
        return;
    }
    u->used_state = 1;
}

void mscx_peer_bufs_destroy(struct peer_bufs *u)
{
    if (!u)
        return;
    pthread_mutex_lock(&g_imp_lock);
    for (uint32_t i = 0; i < u->nimp; i++)
        import_release_locked(u->imp[i].e);
    pthread_mutex_unlock(&g_imp_lock);
    bufs_free(u);
}
