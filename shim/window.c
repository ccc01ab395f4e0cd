/* SPDX-License-Identifier: MIT */
/*
 * The NCCL windows the application registered (ncclCommWindowRegister), so
 * that routing can leave a call on a registered buffer to NCCL's symmetric
 * kernels unless the plan was measured faster than those (comm.c decide()).
 *
 * One table of (communicator, window, [lo, hi)) under a lock: registration
 * is rare. A lookup while nothing is registered anywhere reads one counter
 * and takes no lock. The table never misses a registered window: a window
 * it cannot keep (no memory, or WIN_MAX windows kept) marks its
 * communicator incomplete, and every buffer of an incomplete communicator
 * counts as registered until the communicator ends. When even that mark
 * cannot be kept, every buffer of every communicator counts, for good.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "mscx/fork.h"
#include "shim_int.h"

#ifndef SHIM_HAVE_ncclCommWindowRegister
typedef void *ncclWindow_t; /* an nccl.h without windows (before 2.27): none is ever registered */
#endif

#define WIN_MAX (1u << 14) /* windows kept at once; more mark their communicator incomplete */
#define WIN_LOST_MAX 64u   /* incomplete communicators at once; more make every buffer count */

struct win_entry {
    ncclComm_t comm;
    ncclWindow_t win; /* the handle NCCL gave, NULL while unknown (a deferred registration) */
    uintptr_t lo, hi; /* [lo, hi) */
};

static pthread_mutex_t win_lock = PTHREAD_MUTEX_INITIALIZER;
static struct win_entry *wins;
static size_t nwins, capwins;
static ncclComm_t lost[WIN_LOST_MAX]; /* incomplete communicators */
static size_t nlost;
static int lost_all; /* lost[] was full: every buffer of every communicator counts */
/* nwins + nlost + lost_all: 0 spares a lookup the lock. Written under the lock. */
static atomic_size_t win_watch;

/* A leaf lock (nothing is taken while it is held): any level after the ones held around it. */
__attribute__((constructor)) static void win_fork_init(void)
{
    mscx_fork_protect(&win_lock, MSCX_FORK_SHIM_WARN);
}

static void watch_update(void)
{
    atomic_store_explicit(&win_watch, nwins + nlost + (size_t)lost_all, memory_order_relaxed);
}

static int is_lost(ncclComm_t comm)
{
    for (size_t i = 0; i < nlost; i++)
        if (lost[i] == comm)
            return 1;
    return 0;
}

/* The table cannot hold a window of @p comm: all its buffers count from now on. The lock is held. */
static void mark_lost(ncclComm_t comm)
{
    if (lost_all || is_lost(comm))
        return;
    if (nlost < WIN_LOST_MAX)
        lost[nlost++] = comm;
    else
        lost_all = 1;
}

static uintptr_t range_end(const void *p, size_t bytes)
{
    uintptr_t lo = (uintptr_t)p;
    return bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + bytes;
}

/* Keep window @p win (NULL: unknown) of @p comm over [@p buff, @p buff + @p size). */
static void win_record(ncclComm_t comm, ncclWindow_t win, const void *buff, size_t size)
{
    int kept = 0;
    size_t n;
    pthread_mutex_lock(&win_lock);
    if (nwins == capwins && capwins < WIN_MAX) {
        size_t cap = capwins ? capwins * 2 : 16;
        struct win_entry *grown = realloc(wins, cap * sizeof(*wins));
        if (grown) {
            wins = grown;
            capwins = cap;
        }
    }
    if (nwins < capwins) {
        wins[nwins++] = (struct win_entry){comm, win, (uintptr_t)buff, range_end(buff, size)};
        kept = 1;
    } else {
        mark_lost(comm);
    }
    n = nwins;
    watch_update();
    pthread_mutex_unlock(&win_lock);
    if (!kept)
        shim_warn_once("window:lost",
                       "mscx: cannot keep NCCL window %p of comm %p (%zu windows kept, or no memory); "
                       "every buffer of such a communicator counts as registered until it ends",
                       (void *)win, (void *)comm, n);
}

/* Forget window @p win of @p comm, if kept. */
static void win_forget(ncclComm_t comm, ncclWindow_t win)
{
    pthread_mutex_lock(&win_lock);
    for (size_t i = 0; win && i < nwins; i++) {
        if (wins[i].comm == comm && wins[i].win == win) {
            wins[i] = wins[--nwins];
            break;
        }
    }
    watch_update();
    pthread_mutex_unlock(&win_lock);
}

void shim_window_forget_comm(ncclComm_t comm)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&win_lock);
    for (size_t i = 0; i < nwins;) {
        if (wins[i].comm == comm)
            wins[i] = wins[--nwins];
        else
            i++;
    }
    for (size_t i = 0; i < nlost; i++) {
        if (lost[i] == comm) {
            lost[i] = lost[--nlost];
            break;
        }
    }
    watch_update();
    pthread_mutex_unlock(&win_lock);
}

int shim_window_covers(ncclComm_t comm, const void *p, size_t bytes)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return 0;
    uintptr_t lo = (uintptr_t)p, hi = range_end(p, bytes);
    pthread_mutex_lock(&win_lock);
    int hit = lost_all || is_lost(comm);
    for (size_t i = 0; !hit && i < nwins; i++)
        hit = wins[i].comm == comm && lo < wins[i].hi && wins[i].lo < hi;
    pthread_mutex_unlock(&win_lock);
    return hit;
}

/*
 * The buffers every rank passes: a broadcast's send buffer matters at its
 * root only (NCCL ignores it elsewhere), so it is left out for the answer
 * to be the same on every rank.
 */
SHIM_HOT int shim_window_covers_call(const struct shim_coll_call *call, uint32_t nranks)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return 0;
    size_t unit, all;
    if (__builtin_mul_overflow(call->count, shim_dtype_bytes(call->dtype), &unit))
        unit = SIZE_MAX;
    if (__builtin_mul_overflow(unit, (size_t)(nranks ? nranks : 1), &all))
        all = SIZE_MAX;
    size_t send = unit, recv = unit;
    switch (call->coll) {
    case MSCX_COLL_ALLGATHER:
        recv = all;
        break;
    case MSCX_COLL_REDUCESCATTER:
        send = all;
        break;
    case MSCX_COLL_ALLTOALL:
        send = recv = all;
        break;
    case MSCX_COLL_BROADCAST:
        send = 0;
        break;
    default:
        break;
    }
    return (send && shim_window_covers(call->comm, call->sendbuf, send)) ||
           shim_window_covers(call->comm, call->recvbuf, recv);
}

/* ---- the intercepts ---- */

#ifdef SHIM_HAVE_ncclCommWindowRegister
/*
 * Kept on success. Inside a group, or when a non-blocking communicator
 * answers ncclInProgress, the handle may be written only when the
 * operation completes: the range is kept without it, so no deregister
 * removes it, and it counts until the communicator ends.
 */
ncclResult_t shim_ncclCommWindowRegister(int prof, ncclComm_t comm, void *buff, size_t size,
                                         ncclWindow_t *win, int winFlags)
{
    shim_fn_ncclCommWindowRegister_t fn = SHIM_REAL(prof, ncclCommWindowRegister);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    int deferred = shim_group_depth() > 0;
    ncclResult_t res = fn(comm, buff, size, win, winFlags);
    if (res == ncclSuccess || res == ncclInProgress)
        win_record(comm, res == ncclSuccess && !deferred && win ? *win : NULL, buff, size);
    return res;
}
#endif

#ifdef SHIM_HAVE_ncclCommWindowDeregister
ncclResult_t shim_ncclCommWindowDeregister(int prof, ncclComm_t comm, ncclWindow_t win)
{
    shim_fn_ncclCommWindowDeregister_t fn = SHIM_REAL(prof, ncclCommWindowDeregister);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    ncclResult_t res = fn(comm, win);
    if (res == ncclSuccess)
        win_forget(comm, win);
    return res;
}
#endif
