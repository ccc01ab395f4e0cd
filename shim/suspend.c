/* SPDX-License-Identifier: MIT */
/*
 * ncclCommSuspend and ncclCommResume (NCCL 2.29 and later). The executor has
 * no call that releases its memory and brings it back, so a suspend drops
 * our whole state of the communicator (its memory freed, its summary
 * printed), and the resume sets it up again as after a blocking init: the
 * setup exchange and the ranks' agreement run anew inside ncclCommResume.
 * NCCL's resume is collective (every rank's ends in a barrier of the
 * communicator), so every rank runs that exchange at the same point.
 *
 * Between the two the communicator has no state here: every call goes to
 * NCCL untouched, which answers as it does for a suspended communicator.
 * A communicator we never set up is left alone by both.
 */
#include <pthread.h>

#include "mscx/fork.h"
#include "shim_int.h"

#ifdef SHIM_HAVE_ncclCommSuspend

#define SUSPENDED_MAX 256

/* The communicators whose state a suspend dropped, to set up again at their resume. */
static pthread_mutex_t suspended_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void suspended_fork_init(void)
{
    mscx_fork_protect(&suspended_lock, MSCX_FORK_SHIM_WARN);
}
static ncclComm_t suspended[SUSPENDED_MAX];

/* Note @p comm as suspended. @return 0, or -1 when the table is full. */
static int suspended_add(ncclComm_t comm)
{
    int ok = -1;
    pthread_mutex_lock(&suspended_lock);
    for (int i = 0; i < SUSPENDED_MAX && ok != 0; i++)
        if (!suspended[i] || suspended[i] == comm) {
            suspended[i] = comm;
            ok = 0;
        }
    pthread_mutex_unlock(&suspended_lock);
    return ok;
}

/* Forget @p comm. @return 1 when it was noted as suspended. */
static int suspended_take(ncclComm_t comm)
{
    int found = 0;
    pthread_mutex_lock(&suspended_lock);
    for (int i = 0; i < SUSPENDED_MAX; i++)
        if (comm && suspended[i] == comm) {
            suspended[i] = NULL;
            found = 1;
        }
    pthread_mutex_unlock(&suspended_lock);
    return found;
}

ncclResult_t shim_ncclCommSuspend(int prof, ncclComm_t comm, int flags)
{
    shim_fn_ncclCommSuspend_t fn = SHIM_REAL(prof, ncclCommSuspend);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    struct shim_comm *c = shim_comm_get(comm);
    if (c) {
        shim_comm_put(c);
        /* Dropped before NCCL suspends, whatever it answers: a rank whose suspend fails has no
         * state either, and its resume sets up again as every other rank's does. When the table
         * is full the state is dropped all the same; the communicator stays NCCL's. */
        (void)suspended_add(comm);
        shim_comm_teardown(comm, 0);
    }
    return fn(comm, flags);
}

ncclResult_t shim_ncclCommResume(int prof, ncclComm_t comm)
{
    shim_fn_ncclCommResume_t fn = SHIM_REAL(prof, ncclCommResume);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    ncclResult_t res = fn(comm);
    if (!suspended_take(comm))
        return res;
    struct shim_comm *c = shim_comm_get(comm);
    if (c) { /* set up again meanwhile (a new communicator at this address) */
        shim_comm_put(c);
        return res;
    }
    return shim_comm_after_resume(prof, res, comm);
}

#endif /* SHIM_HAVE_ncclCommSuspend */
