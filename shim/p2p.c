/* SPDX-License-Identifier: MIT */
/*
 * ncclSend and ncclRecv. Each one that reaches NCCL on a communicator of
 * ours is counted per peer (the communicator's positions, at the end of
 * this file).
 *
 * Inside a group that has kept no collective and forwarded nothing, the
 * sends and recvs of one communicator are kept; a collective or a call
 * bound for NCCL that follows sends them to NCCL first, and routes on its
 * own merits. At the outermost ncclGroupEnd, before NCCL's, a
 * kept set that is one send and one recv of one count, type and stream to
 * and from every rank is an AlltoAll in NCCL's sense when the rank's own
 * pair is there and the blocks lie in one buffer per side, block j at
 * j x count elements: a send buffer and a receive buffer that do not
 * overlap (or, at one rank, are the same). Such a set becomes one kept AlltoAll of that count when
 * shim_comm_p2p_agree() says every rank runs it; anything else goes to
 * NCCL in issue order, still inside NCCL's group.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "comm_int.h"
#include "mscx/log.h"

/* Two calls per rank of the largest agreement (SHIM_P2P_AGREE_MAX_RANKS). */
#define P2P_MAX_KEPT 128

static __thread struct shim_p2p_call kept[P2P_MAX_KEPT];
static __thread int nkept;
static __thread uint32_t kept_nranks; /* the rank count of kept[0]'s communicator, looked up once */

int shim_p2p_nkept(void)
{
    return nkept;
}

ncclComm_t shim_p2p_comm(void)
{
    return nkept > 0 ? kept[0].comm : NULL;
}

static ncclResult_t forward(const struct shim_p2p_call *p)
{
    ncclResult_t r;
    if (p->is_send) {
        shim_fn_ncclSend_t fn = SHIM_REAL(p->prof, ncclSend);
        if (!fn)
            return shim_err_result();
        shim_err_clear();
        r = fn(p->sendbuf, p->count, p->dtype, p->peer, p->comm, p->stream);
    } else {
        shim_fn_ncclRecv_t fn = SHIM_REAL(p->prof, ncclRecv);
        if (!fn)
            return shim_err_result();
        shim_err_clear();
        r = fn(p->recvbuf, p->count, p->dtype, p->peer, p->comm, p->stream);
    }
    if (r == ncclSuccess)
        shim_comm_p2p_count(p->comm, p->is_send, p->peer);
    return r;
}

ncclResult_t shim_p2p_to_nccl(void)
{
    int n = nkept;
    ncclResult_t res = ncclSuccess;
    nkept = 0;
    for (int i = 0; i < n; i++) {
        ncclResult_t r = forward(&kept[i]);
        if (r != ncclSuccess && res == ncclSuccess)
            res = r;
    }
    return res;
}

/*
 * 1 when @p p can wait for the group's end: NCCL's checks of its arguments
 * would pass it, and it is ours. Every kept call is on kept[0]'s
 * communicator, so only the first one looks it up.
 */
static int keepable(const struct shim_p2p_call *p)
{
    uint32_t rank;
    int device;
    if (!shim_group_p2p_open() || nkept == P2P_MAX_KEPT)
        return 0;
    if (nkept > 0 && kept[0].comm != p->comm)
        return 0;
    if ((int)p->dtype < 0 || (int)p->dtype >= (int)ncclNumTypes || p->count == 0)
        return 0;
    if ((p->is_send ? p->sendbuf : p->recvbuf) == NULL || p->peer < 0)
        return 0;
    if (nkept == 0 && shim_comm_p2p_tracked(p->comm, &rank, &kept_nranks, &device) != 0)
        return 0;
    return (uint32_t)p->peer < kept_nranks;
}

ncclResult_t shim_p2p_call(const struct shim_p2p_call *p)
{
    const struct mscx_config *cfg = shim_config();
    ncclResult_t res;
    if (cfg && !cfg->disable &&
        shim_count_overflows(p->prof, p->is_send ? "ncclSend" : "ncclRecv", p->count, p->dtype, 0, p->comm,
                             &res))
        return res;
    if (cfg && !cfg->disable && keepable(p)) {
        kept[nkept++] = *p;
        return ncclSuccess;
    }
    if (shim_group_collecting)
        shim_p2p_before_forward(p->comm); /* the kept sends and recvs go first */
    return forward(p);
}

void shim_p2p_before_forward(ncclComm_t comm)
{
    if (!shim_group_collecting)
        return;
    if (nkept > 0) {
        shim_group_mark_forwarded(kept[0].comm);
        shim_group_note_err(shim_p2p_to_nccl());
    }
    shim_group_mark_forwarded(comm);
}

#ifdef SHIM_HAVE_ncclAlltoAll
/* ---- the shape of an AlltoAll ---- */

/* What a kept set is: the AlltoAll it would be, and whether this rank can run it. */
struct shape {
    struct shim_coll_call alltoall;
    int yes; /* self included, one contiguous buffer per side, no overlap, captured with ranks > 1 */
};

/* Block @p j's address as base + j x @p bytes: the base, or 0 when it does not fit. */
static uintptr_t base_of(const void *p, int j, uint64_t bytes)
{
    uintptr_t a = (uintptr_t)p, off = (uintptr_t)j * bytes;
    return a >= off ? a - off : 0;
}

/*
 * Whether the kept set is one send and one recv per peer of one count,
 * type and stream, the rank's own pair either absent or both there.
 * @return 1 with @p s filled, 0 when it is not an AlltoAll
 */
static int shape_of(uint32_t rank, uint32_t nranks, struct shape *s)
{
    int nsend[P2P_MAX_KEPT / 2] = {0}, nrecv[P2P_MAX_KEPT / 2] = {0};
    const struct shim_p2p_call *first = &kept[0];
    uint64_t bytes = (uint64_t)first->count * shim_dtype_bytes(first->dtype);
    uintptr_t sbase = 0, rbase = 0;
    int contiguous = 1;
    if (nranks > P2P_MAX_KEPT / 2)
        return 0;
    for (int i = 0; i < nkept; i++) {
        const struct shim_p2p_call *p = &kept[i];
        if (p->count != first->count || p->dtype != first->dtype || p->stream != first->stream)
            return 0;
        int *n = p->is_send ? &nsend[p->peer] : &nrecv[p->peer];
        if (++*n > 1)
            return 0;
        uintptr_t b = base_of(p->is_send ? p->sendbuf : p->recvbuf, p->peer, bytes);
        uintptr_t *want = p->is_send ? &sbase : &rbase;
        if (!*want)
            *want = b;
        contiguous &= b != 0 && b == *want;
    }
    for (uint32_t j = 0; j < nranks; j++)
        if (nsend[j] != nrecv[j] || (j != rank && nsend[j] != 1))
            return 0;
    uint64_t span = bytes * nranks;
    int self = nsend[rank] == 1;
    int apart = sbase + span <= rbase || rbase + span <= sbase;
    s->alltoall = (struct shim_coll_call){
        .fn = "ncclSend/ncclRecv",
        .api = SHIM_FN_ncclAlltoAll,
        .prof = first->prof,
        .coll = MSCX_COLL_ALLTOALL,
        .sendbuf = (const void *)sbase,
        .recvbuf = (void *)rbase,
        .count = first->count,
        .dtype = first->dtype,
        .op = ncclSum,
        .comm = first->comm,
        .stream = first->stream,
    };
    /* in place is an AlltoAll's meaning only for a rank alone: its one block stays where it is */
    int in_place = nranks == 1 && sbase == rbase;
    s->yes = self && contiguous && (apart || in_place) &&
             (nranks == 1 || shim_dev_ops()->capturing(first->stream));
    return 1;
}

ncclResult_t shim_p2p_group_end(void)
{
    uint32_t rank, nranks;
    int device;
    struct shape s;
    if (nkept == 0)
        return ncclSuccess;
    if (shim_comm_p2p_tracked(kept[0].comm, &rank, &nranks, &device) != 0 || !shape_of(rank, nranks, &s))
        return shim_p2p_to_nccl();
    /* room for the AlltoAll first: once the ranks agree, it must run */
    if (shim_group_reserve() != 0)
        s.yes = 0;
    if (!shim_comm_p2p_agree(&s.alltoall, s.yes))
        return shim_p2p_to_nccl();
    nkept = 0;
    shim_group_keep(&s.alltoall, device);
    return ncclSuccess;
}
#else
/* Without ncclAlltoAll in nccl.h there is no AlltoAll for a group to become. */
ncclResult_t shim_p2p_group_end(void)
{
    return shim_p2p_to_nccl();
}
#endif

/* ---- the positions of each communicator, and its vote on a group ---- */

/* How long a rank waits for the others' votes on one send/recv group: it waits only under capture. */
#define P2P_VOTE_WAIT_MS 2000

void shim_comm_p2p_count(ncclComm_t comm, int is_send, int peer)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return;
    _Atomic uint64_t *n = is_send ? c->p2p_sent : c->p2p_received;
    if (n && peer >= 0 && (uint32_t)peer < c->nranks)
        atomic_fetch_add_explicit(&n[peer], 1, memory_order_relaxed);
    shim_comm_put(c);
}

int shim_comm_p2p_tracked(ncclComm_t comm, uint32_t *rank_p, uint32_t *nranks_p, int *device_p)
{
    struct shim_comm *c = shim_comm_get(comm);
    int ok = c && c->p2p_sent && !atomic_load_explicit(&c->deferred, memory_order_relaxed);
    if (ok) {
        *rank_p = c->rank;
        *nranks_p = c->nranks;
        *device_p = c->device;
    }
    shim_comm_put(c);
    return ok ? 0 : -1;
}

/* The agreement segment of @p c, opened on first use. NULL when it cannot be. */
static struct shim_p2p_agree *p2p_agreement(struct shim_comm *c)
{
    pthread_mutex_lock(&c->p2p_lock);
    if (!c->p2p_agree) {
        mscx_status_t st = shim_p2p_agree_open(c->secret, c->rank, c->nranks, &c->p2p_agree);
        if (st != MSCX_OK) {
            shim_warn_once("p2p-agree",
                           "mscx: no shared memory for the agreement on send/recv groups (%s); "
                           "such groups go to NCCL",
                           mscx_status_str(st));
            atomic_store_explicit(&c->p2p_gave_up, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&c->p2p_lock);
    return c->p2p_agree;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The vote of this rank on @p alltoall's group. @return 1 when every rank runs it */
static int p2p_vote(struct shim_comm *c, const struct shim_coll_call *alltoall, uint64_t msg, int yes)
{
    uint64_t sent[SHIM_P2P_AGREE_MAX_RANKS], received[SHIM_P2P_AGREE_MAX_RANKS];
    for (uint32_t j = 0; j < c->nranks; j++) {
        sent[j] = atomic_load_explicit(&c->p2p_sent[j], memory_order_relaxed);
        received[j] = atomic_load_explicit(&c->p2p_received[j], memory_order_relaxed);
    }
    struct shim_p2p_agree *a = p2p_agreement(c);
    if (!a)
        return 0; /* the others, waiting for this rank's vote, give up in time */
    struct shim_p2p_point pt = {
        .bytes = msg / c->nranks,
        .dtype = (int32_t)alltoall->dtype,
        .yes = yes && !c->p2p_gave_up,
        .sent = sent,
        .received = received,
    };
    uint64_t t0 = now_ms();
    int run = shim_p2p_agree_vote(a, &pt, P2P_VOTE_WAIT_MS);
    if (!run && pt.yes && now_ms() - t0 >= P2P_VOTE_WAIT_MS) {
        /* a rank that never votes: stop waiting for it, here and, through this rank's no, everywhere */
        atomic_store_explicit(&c->p2p_gave_up, 1, memory_order_relaxed);
        MSCX_WARN("mscx: comm %p rank %u/%u: a send/recv group waited %d ms for the other ranks' agreement; "
                  "such groups of this communicator go to NCCL from now on",
                  (void *)c->comm, c->rank, c->nranks, P2P_VOTE_WAIT_MS);
    }
    return run;
}

int shim_comm_p2p_agree(const struct shim_coll_call *alltoall, int yes)
{
    struct shim_comm *c = shim_comm_get(alltoall->comm);
    if (!c)
        return 0;
    int run = 0;
    if (c->p2p_sent) {
        uint64_t msg = (uint64_t)alltoall->count * shim_dtype_bytes(alltoall->dtype) * c->nranks;
        enum shim_reason why = SHIM_WHY_SENDRECV;
        int pick = shim_comm_decide(c, alltoall, msg, &why);
#ifdef SHIM_HAVE_ncclAlltoAll
        /* a launch the executor refuses goes to NCCL's AlltoAll, the same on every rank */
        yes = yes && shim_real_fn(alltoall->prof ? SHIM_FN_pncclAlltoAll : SHIM_FN_ncclAlltoAll);
#else
        yes = 0;
#endif
        yes = yes && pick >= 0 && shim_comm_error(c) == MSCX_OK;
        run = c->nranks == 1 ? yes : p2p_vote(c, alltoall, msg, yes);
        if (run) {
            for (uint32_t j = 0; j < c->nranks; j++) {
                atomic_fetch_add_explicit(&c->p2p_sent[j], j != c->rank, memory_order_relaxed);
                atomic_fetch_add_explicit(&c->p2p_received[j], j != c->rank, memory_order_relaxed);
            }
        } else {
            shim_stats_add(c, MSCX_COLL_ALLTOALL, msg, pick >= 0 ? SHIM_WHY_SENDRECV : why);
        }
    }
    shim_comm_put(c);
    return run;
}
