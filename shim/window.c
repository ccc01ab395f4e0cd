/* SPDX-License-Identifier: MIT */
/*
 * The NCCL windows the application registered with NCCL_WIN_COLL_SYMMETRIC
 * (ncclCommWindowRegister), so that routing can leave to NCCL a call that
 * NCCL would run on its symmetric kernels, unless the plan was measured
 * faster than those (route_call.c, decide()).
 *
 * NCCL 2.28 considers its symmetric kernels for a collective only when the
 * send and the receive buffer each start inside a window registered with
 * that flag; a symmetric window binds every rank to pass such buffers at
 * the same offsets, so the test is the same on every rank. A window
 * registered without the flag binds nobody (a buffer may lie in one on one
 * rank only), so it is not kept and never changes a decision.
 *
 * One list of (communicator, window, [lo, hi)) under a lock: registration
 * is rare. A lookup while nothing is registered anywhere reads one counter
 * and takes no lock. The list never loses a window: its entry is allocated
 * before NCCL registers it, and where there is no memory for that the
 * registration fails with ncclSystemError before NCCL sees it, as NCCL's
 * own registration fails where it cannot allocate.
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

struct win_entry {
    struct win_entry *next;
    ncclComm_t comm;
    ncclWindow_t win; /* the handle NCCL gave, NULL while unknown (a deferred registration) */
    uintptr_t lo, hi; /* [lo, hi) */
};

static pthread_mutex_t win_lock = PTHREAD_MUTEX_INITIALIZER;
static struct win_entry *wins;
static size_t nwins;
/* nwins: 0 spares a lookup the lock. Written under the lock. */
static atomic_size_t win_watch;

/* A leaf lock (nothing is taken while it is held): any level after the ones held around it. */
__attribute__((constructor)) static void win_fork_init(void)
{
    mscx_fork_protect(&win_lock, MSCX_FORK_SHIM_WARN);
}

static void watch_update(void)
{
    atomic_store_explicit(&win_watch, nwins, memory_order_relaxed);
}

void shim_window_forget_comm(ncclComm_t comm)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return;
    struct win_entry *gone = NULL;
    pthread_mutex_lock(&win_lock);
    for (struct win_entry **pp = &wins; *pp;) {
        struct win_entry *e = *pp;
        if (e->comm == comm) {
            *pp = e->next;
            e->next = gone;
            gone = e;
            nwins--;
        } else {
            pp = &e->next;
        }
    }
    watch_update();
    pthread_mutex_unlock(&win_lock);
    while (gone) {
        struct win_entry *next = gone->next;
        free(gone);
        gone = next;
    }
}

/* 1 when @p p lies in a symmetric window of @p comm. */
static int window_holds(ncclComm_t comm, const void *p)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return 0;
    uintptr_t a = (uintptr_t)p;
    int hit = 0;
    pthread_mutex_lock(&win_lock);
    for (const struct win_entry *e = wins; !hit && e; e = e->next)
        hit = e->comm == comm && e->lo <= a && a < e->hi;
    pthread_mutex_unlock(&win_lock);
    return hit;
}

/*
 * NCCL's test for its symmetric kernels: both buffers in symmetric windows.
 * A broadcast's send buffer matters at its root only (NCCL ignores it
 * elsewhere), so only its receive buffer is tested, for the answer to be
 * the same on every rank.
 */
SHIM_HOT int shim_window_covers_call(const struct shim_coll_call *call)
{
    if (atomic_load_explicit(&win_watch, memory_order_relaxed) == 0)
        return 0;
    return (call->coll == MSCX_COLL_BROADCAST || window_holds(call->comm, call->sendbuf)) &&
           window_holds(call->comm, call->recvbuf);
}

/* ---- the intercepts ---- */

#ifdef SHIM_HAVE_ncclCommWindowRegister
static uintptr_t range_end(const void *p, size_t bytes)
{
    uintptr_t lo = (uintptr_t)p;
    return bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + bytes;
}

/* Forget window @p win of @p comm, if kept. */
static void win_forget(ncclComm_t comm, ncclWindow_t win)
{
    struct win_entry *gone = NULL;
    pthread_mutex_lock(&win_lock);
    for (struct win_entry **pp = &wins; win && *pp; pp = &(*pp)->next) {
        if ((*pp)->comm == comm && (*pp)->win == win) {
            gone = *pp;
            *pp = gone->next;
            nwins--;
            break;
        }
    }
    watch_update();
    pthread_mutex_unlock(&win_lock);
    free(gone);
}

/*
 * A symmetric window is kept on success. Inside a group, or when a
 * non-blocking communicator answers ncclInProgress, the handle may be
 * written only when the operation completes: the range is kept without it,
 * so no deregister removes it, and it counts until the communicator ends
 * (on every rank alike: each registered it).
 */
ncclResult_t shim_ncclCommWindowRegister(int prof, ncclComm_t comm, void *buff, size_t size,
                                         ncclWindow_t *win, int winFlags)
{
    shim_fn_ncclCommWindowRegister_t fn = SHIM_REAL(prof, ncclCommWindowRegister);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    struct win_entry *e = NULL;
    if (winFlags & NCCL_WIN_COLL_SYMMETRIC) {
        e = calloc(1, sizeof(*e));
        if (!e)
            return shim_err_set(ncclSystemError, "mscx: ncclCommWindowRegister: out of host memory");
    }
    int deferred = shim_group_depth() > 0;
    ncclResult_t res = fn(comm, buff, size, win, winFlags);
    if (e && (res == ncclSuccess || res == ncclInProgress)) {
        *e = (struct win_entry){NULL, comm, res == ncclSuccess && !deferred && win ? *win : NULL,
                                (uintptr_t)buff, range_end(buff, size)};
        pthread_mutex_lock(&win_lock);
        e->next = wins;
        wins = e;
        nwins++;
        watch_update();
        pthread_mutex_unlock(&win_lock);
        e = NULL;
    }
    free(e);
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
