/* SPDX-License-Identifier: MIT */
/*
 * The state beside each real communicator (struct shim_comm), shared by the
 * files that set it up (setup.c, deferred.c, agree.c), route its calls
 * (route_call.c, p2p.c), count them (stats.c) and end it (teardown.c).
 * Its lifetime and the rules for reading it are in comm.c.
 */
#ifndef MSCX_SHIM_COMM_INT_H
#define MSCX_SHIM_COMM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mscx/exec.h"
#include "shim_int.h"

#ifndef MSCX_VERSION
#define MSCX_VERSION "unknown"
#endif

#define NSTAT_COLL SHIM_NSTAT_COLL

struct shim_comm {
    atomic_int refs; /* 0: on the free list or being set up; first, outside what setup clears */
    /* what every call reads, on the first cache line */
    ncclComm_t comm;
    struct mscx_exec *exec;
    const volatile int32_t *exec_error; /* mscx_exec_error_word(exec), or NULL */
    struct shim_route_plan *route;      /* [nroute], priority order */
    _Atomic int deferred;               /* enum comm_deferred: setup still to run at the first collective */
    _Atomic int err; /* mscx_status_t of the first failed kernel: the communicator's sticky error, 0: none */
    uint32_t nranks, rpn;
    unsigned forced;
    /* a call's collective's window, on a line of its own: a call of a size no plan takes reads no more */
    _Alignas(64) struct shim_route_window win[MSCX_COLL_COUNT]; /* of route, for this comm's layout */
    size_t nroute;
    uint32_t *exec_id; /* [nroute] */
    /* the rest */
    struct shim_comm *next_free;
    int prof;              /* of the init, for a deferred setup's calls of the real NCCL */
    struct shim_join join; /* how a deferred setup's ranks meet */
    const char *how;       /* how it was created, for a deferred setup's messages */
    uint32_t rank;
    int device;
    struct mscx_bootstrap *bs;
    const char **route_name;       /* [nroute] plan paths */
    _Atomic uint64_t *route_calls; /* [nroute]: calls each plan ran */
    _Atomic uint64_t
        identity_calls[NSTAT_COLL]; /* in-place calls at one rank, answered without moving data */
    int stopped; /* stopped by an abort, revoke or shrink: the release must not wait on the device */
    uint8_t secret[SHIM_SECRET_BYTES]; /* rank 0's random draw, shared by the fixed exchange */
    _Atomic uint64_t counts[NSTAT_COLL][SHIM_NBUCKETS][SHIM_WHY_COUNT]; /* as struct shim_stats */
    /* sends and recvs, counted from the init on (a blocking setup with an executor), else NULL */
    int p2p_counted;                  /* set before the build: the count starts with the communicator */
    _Atomic uint64_t *p2p_sent;       /* [nranks]: sends to rank j handed to NCCL or run as an AlltoAll */
    _Atomic uint64_t *p2p_received;   /* [nranks]: recvs from rank j */
    struct shim_p2p_agree *p2p_agree; /* opened at the first vote, by the thread of the group */
    pthread_mutex_t p2p_lock;         /* guards p2p_agree's opening */
    _Atomic int p2p_gave_up;          /* a vote timed out: this rank votes no from then on */
};

/*
 * A non-blocking communicator is published at init as a placeholder, its
 * setup deferred to its first collective outside a group
 * (shim_comm_setup_deferred): its init may still be running.
 */
enum comm_deferred {
    DEFER_NONE = 0, /* set up (or never to be): route as the state says */
    DEFER_SETUP,    /* the full setup runs at the first collective */
    DEFER_DISABLED, /* MSCX_DISABLE or a bad setting: there only the fixed exchange, voting "fall back" */
    DEFER_RUNNING,  /* the setup is running on the thread of the first collective */
};

/* ---- comm.c: the state's lifetime ---- */

/** A cleared object for @p comm with its settings (@p cfg: NULL for none), not yet published. NULL without
 * memory. */
struct shim_comm *shim_comm_new(int prof, ncclComm_t comm, const char *how, const struct mscx_config *cfg);
/** Publish @p c with the table's reference. @return 0, or -1 when the table is full (@p c released). */
int shim_comm_publish(struct shim_comm *c);
/** Unlink @p comm's state; the caller owns the table's reference and must put it. */
struct shim_comm *shim_comm_unlink(ncclComm_t comm);
/** Release an object no call references: its executor, its plan arrays; then onto the free list. */
void shim_comm_release(struct shim_comm *c);
/** shim_comm_error() once the executor's error word is set: the executor's error, recorded once. */
mscx_status_t shim_comm_error_record(struct shim_comm *c);
/*
 * The sticky error of @p c: once one of its kernels failed (a timeout, an
 * abort, a peer's error), the communicator is broken for good, as an NCCL
 * communicator is after an asynchronous error. One relaxed load once set;
 * before that, one read of the executor's error word (host memory).
 * @return MSCX_OK or the first error
 */
SHIM_HOT static inline mscx_status_t shim_comm_error(struct shim_comm *c)
{
    int e = atomic_load_explicit(&c->err, memory_order_relaxed);
    if (e != 0 || !c->exec)
        return (mscx_status_t)e;
    if (c->exec_error && *c->exec_error == 0)
        return MSCX_OK;
    return shim_comm_error_record(c);
}
/** shim_comm_put() of a reference @p c (not NULL), inline for the routing path. */
SHIM_HOT static inline void shim_comm_unref(struct shim_comm *c)
{
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_release) == 1) {
        atomic_thread_fence(memory_order_acquire);
        shim_comm_release(c);
    }
}

/* ---- agree.c: the fixed first exchange ---- */

/**
 * The fixed first exchange of a blocking communicator, its ranks meeting as
 * @p j says. @p bs: its bootstrap (NULL with one rank, or at a rendezvous).
 * @return 1 when every rank may go on to route (then *rpn_p and @p secret
 * are set), 0 when all fall back (the same on every rank), -1 when the
 * exchange did not complete
 */
int shim_agree(ncclComm_t comm, struct mscx_bootstrap *bs, const struct shim_join *j,
               const struct mscx_config *cfg, uint32_t rank, uint32_t nranks, uint64_t plan_hash,
               uint32_t *rpn_p, uint8_t secret[SHIM_SECRET_BYTES]);
/**
 * The fixed exchange without a bootstrap: a "fall back" vote, the others'
 * records unread. @return MSCX_OK when every rank took part
 */
mscx_status_t shim_agree_vote_only(int prof, ncclComm_t comm, const struct shim_join *j,
                                   const struct mscx_config *cfg, uint32_t rank, uint32_t nranks, int device);
/** What made this rank vote "fall back": a WARN when @p warn (news), else INFO. */
void shim_agree_vote_warn(ncclComm_t comm, uint32_t rank, uint32_t nranks, const char *why, int warn);

/* ---- setup.c ---- */

/**
 * The setup of @p c (from shim_comm_new()): the plans, the fixed exchange
 * with its ranks meeting as @p j says (NULL: none), the executor, the
 * routing windows. @p stop (NULL: none)
 * ends the exchanges' waits when it becomes non-zero. @return ncclSuccess,
 * or an error (strict mode) after which @p c is released
 */
ncclResult_t shim_comm_build(struct shim_comm *c, const struct mscx_config *cfg, const struct shim_join *j,
                             const int *stop);
/** MSCX_DISABLE or a bad setting: no state, but the fixed exchange joined (as @p j says) voting "fall back".
 */
void shim_comm_setup_disabled(int prof, ncclComm_t comm, const struct mscx_config *cfg,
                              const struct shim_join *j);
/** A rank whose setup failed locally (@p why) joins the fixed exchange (as @p j says) voting "fall back". */
void shim_comm_vote_fall_back(int prof, ncclComm_t comm, const struct mscx_config *cfg, const char *why,
                              int warn, const struct shim_join *j);

/* ---- decide.c ---- */

/** The routing decision for a call of @p msg bytes on @p c: @return the route, or -1 with the reason. */
int shim_comm_decide(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                     enum shim_reason *why_p);
/** shim_comm_pick()'s answer for a call with a bad datatype, op or broadcast root. */
#define SHIM_PICK_ANSWERED (-2)
/**
 * What to do with @p call on @p c, in one call for the routing path: NCCL's
 * own answer to a bad datatype, op or broadcast root (SHIM_PICK_ANSWERED,
 * *@p res_p set); else the call's bytes in *@p msg_p and the route, or -1
 * with the reason.
 */
int shim_comm_pick(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t *msg_p,
                   enum shim_reason *why_p, ncclResult_t *res_p);

/* ---- stats.c ---- */

/** Count a call of @p bytes of @p coll on @p c, routed or not (@p why). */
SHIM_HOT static inline void shim_stats_add(struct shim_comm *c, enum mscx_coll coll, uint64_t bytes,
                                           enum shim_reason why)
{
    if ((unsigned)coll >= NSTAT_COLL)
        return;
    atomic_fetch_add_explicit(&c->counts[coll][shim_size_bucket(bytes)][why], 1, memory_order_relaxed);
}
/** The counters and the plans of @p c that ran calls, into @p s. */
void shim_stats_snapshot(const struct shim_comm *c, struct shim_stats *s);
/** The summary line of @p c, at INFO; @p how: where (destroy, abort). */
void shim_stats_print(const struct shim_comm *c, const struct shim_stats *s, const char *how);

#endif
