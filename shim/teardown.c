/* SPDX-License-Identifier: MIT */
/*
 * The end of a communicator of ours: destroy, and abort, revoke or shrink
 * around the real call; and the asynchronous error of a communicator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"

/*
 * An abort, revoke or shrink with NCCL_SHRINK_ABORT comes in two halves
 * around the real call. Before it: unlink (later calls go to NCCL) and set
 * the abort word our kernels poll, so that the real call, which may wait
 * for every kernel on the device, never waits for ours. After it: the
 * summary, and the release, deferred (shim_comm_release): a CUDA free there
 * would wait for kernels that only the application's next abort ends.
 */
struct shim_comm *shim_comm_stop(ncclComm_t comm)
{
    shim_redop_forget_comm(comm);
    shim_window_forget_comm(comm);
    struct shim_comm *c = shim_comm_unlink(comm);
    if (!c)
        return NULL;
    c->stopped = 1;
    if (c->exec)
        mscx_exec_abort(c->exec);
    return c;
}

void shim_comm_stop_finish(struct shim_comm *c, const char *how)
{
    if (!c)
        return;
    struct shim_stats snap;
    shim_stats_snapshot(c, &snap);
    shim_stats_print(c, &snap, how);
    shim_summary_finish(&snap, c->comm, c->rank, c->nranks, "abort");
    shim_comm_put(c);
}

void shim_comm_teardown(ncclComm_t comm, int abort)
{
    if (abort) {
        shim_comm_stop_finish(shim_comm_stop(comm), "abort");
        return;
    }
    shim_redop_forget_comm(comm);
    shim_window_forget_comm(comm);
    struct shim_comm *c = shim_comm_unlink(comm);
    if (!c)
        return;
    struct shim_stats snap;
    shim_stats_snapshot(c, &snap);
    shim_stats_print(c, &snap, "destroy");
    shim_summary_finish(&snap, c->comm, c->rank, c->nranks, "destroy");
    shim_comm_put(c);
}

ncclResult_t shim_comm_async_error(ncclComm_t comm)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return ncclSuccess;
    mscx_status_t st = shim_comm_error(c);
    shim_comm_put(c);
    return shim_status_to_nccl(st);
}
