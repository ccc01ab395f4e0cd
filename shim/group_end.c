/* SPDX-License-Identifier: MIT */
/*
 * The end of this thread's group (group.c keeps it): ncclGroupEnd and
 * ncclGroupSimulateEnd.
 *
 * Each collective of a group routes on its own merits, as outside a group
 * (route_call.c): what else the group holds never changes where it runs. A
 * collective that routes is kept in issue order. NCCL launches the calls it
 * gets in a group at the group's end, all at once; the kept calls take the
 * places that keep each communicator's order: those issued before the first
 * NCCL-bound call on their communicator in the group launch just before the
 * real outermost ncclGroupEnd, the others just after it (docs/design.md,
 * "Groups", argues why this cannot deadlock). A group with no NCCL-bound
 * call launches everything after the real end. NCCL makes every stream of
 * a group wait for the whole group, per communicator: within each of those
 * two batches, when one communicator's kept calls use several streams, the
 * first stream waits for the others (an event recorded on each), every call
 * launches on it, and the others wait for it.
 * The sends and recvs of a group that keeps no collective and forwards
 * nothing are kept by p2p.c and decided before NCCL's group ends
 * (shim_group_before_end): one kept AlltoAll, or NCCL.
 * A group that ends in ncclGroupSimulateEnd runs nothing: its kept calls
 * go to NCCL's simulation first.
 */
#include <string.h>

#include "group_int.h"

/* After the outermost ncclGroupEnd succeeded: set up the communicators created in the group. */
static ncclResult_t flush_pending(int prof)
{
    int n = shim_grp.npending;
    int overflow = shim_grp.overflow;
    shim_grp.npending = 0;
    shim_grp.overflow = 0;
    /*
     * The grown communicators' ranks meet now, outside the group, on every
     * rank alike; a non-blocking one is then set up at its first collective,
     * as outside a group, and leaves the list.
     */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        struct shim_join *j = &shim_grp.joins[i];
        int nb_grow = j->kind == SHIM_JOIN_GROW && j->grow.nonblocking;
        shim_join_resolve(j);
        if (nb_grow) {
            shim_comm_defer_setup(prof, shim_grp.pending[i], "by ncclCommGrow", j);
            continue;
        }
        shim_grp.pending[kept] = shim_grp.pending[i];
        shim_grp.joins[kept++] = *j;
    }
    n = kept;
    if (overflow) {
        /* more than we kept: none of them can run an exchange with the others */
        ncclResult_t res = ncclSuccess;
        for (int i = 0; i < n; i++) {
            ncclResult_t r = shim_comm_setup_nonblocking(prof, shim_grp.pending[i], "in a group");
            if (r != ncclSuccess && res == ncclSuccess)
                res = r;
        }
        return res;
    }
    return shim_comm_setup_several(prof, shim_grp.pending, shim_grp.joins, n, "in a group");
}

void shim_group_before_simulate(void)
{
    if (!shim_group_collecting)
        return;
    shim_group_collecting = 0;
    shim_grp.simulated = 1;
    shim_group_note_err(shim_p2p_to_nccl());
    for (int i = 0; i < shim_grp.nkept; i++) {
        ncclResult_t r;
        /* counted there as sent to NCCL with the group */
        if (!shim_comm_try_route(&shim_grp.kept[i].call, &r))
            r = shim_coll_forward(&shim_grp.kept[i].call);
        shim_group_note_err(r);
    }
    shim_grp.nkept = 0;
}

/*
 * Make @p device current, as NCCL does for each communicator of a group.
 * *@p cur is the current one as far as the group's end knows it (-1:
 * unknown): a device already current is not set again.
 */
static void use_device(const struct shim_dev_join_ops *ops, int *cur, int device)
{
    if (!ops->set_device || device < 0 || device == *cur)
        return;
    ops->set_device(device);
    *cur = device;
}

/* One kept call on @p stream, outside any group: our executor, or NCCL when it refused before enqueueing. */
static ncclResult_t launch_one(const struct kept_call *k, cudaStream_t stream)
{
    struct shim_coll_call call = k->call;
    call.stream = stream;
    ncclResult_t r;
    if (!shim_comm_try_route(&call, &r))
        r = shim_coll_forward(&call);
    return r;
}

/* For each kept call in [@p from, @p to): the first call of its communicator there, and whether its stream is
 * new. */
static void plan_joins(int from, int to)
{
    for (int i = from; i < to; i++) {
        struct kept_call *k = &shim_grp.kept[i];
        k->lead = i;
        k->new_stream = 1;
        k->join_failed = 0;
        for (int j = from; j < i && k->new_stream; j++) {
            if (shim_grp.kept[j].call.comm != k->call.comm)
                continue;
            if (k->lead == i)
                k->lead = j;
            k->new_stream = shim_grp.kept[j].call.stream != k->call.stream;
        }
    }
}

/* Make the lead streams wait for the other streams of their communicators. */
static void join_in(int from, int to, const struct shim_dev_join_ops *ops, int *cur)
{
    for (int i = from; i < to; i++) {
        struct kept_call *k = &shim_grp.kept[i], *lead = &shim_grp.kept[k->lead];
        if (k->lead == i || !k->new_stream || lead->join_failed)
            continue;
        void *ev = shim_group_event(k->device);
        use_device(ops, cur, k->device);
        if (!ev || ops->event_record(ev, (void *)k->call.stream) != 0 ||
            ops->stream_wait((void *)lead->call.stream, ev) != 0)
            lead->join_failed = 1;
    }
}

/* Make the other streams of each communicator wait for its lead stream. @return 0, or -1 when one failed */
static int join_out(int from, int to, const struct shim_dev_join_ops *ops, int *cur)
{
    int failed = 0;
    for (int l = from; l < to; l++) {
        if (shim_grp.kept[l].lead != l || shim_grp.kept[l].join_failed)
            continue;
        int recorded = 0;
        void *ev = NULL;
        for (int i = l + 1; i < to; i++) {
            if (shim_grp.kept[i].lead != l || !shim_grp.kept[i].new_stream)
                continue;
            if (!recorded) {
                ev = shim_group_event(shim_grp.kept[l].device);
                use_device(ops, cur, shim_grp.kept[l].device);
                recorded = ev && ops->event_record(ev, (void *)shim_grp.kept[l].call.stream) == 0 ? 1 : -1;
            }
            if (recorded < 0 || ops->stream_wait((void *)shim_grp.kept[i].call.stream, ev) != 0)
                failed = 1;
        }
    }
    return failed ? -1 : 0;
}

/* The kept calls [@p from, @p to), in issue order, each on its communicator's lead stream. @return the first
 * error */
static ncclResult_t launch_kept(int from, int to)
{
    if (from >= to)
        return ncclSuccess;
    const struct shim_dev_join_ops *ops = shim_group_join_ops();
    int prev = ops->get_device ? ops->get_device() : -1, cur = prev;
    ncclResult_t res = ncclSuccess;
    plan_joins(from, to);
    join_in(from, to, ops, &cur);
    for (int i = from; i < to; i++) {
        const struct kept_call *lead = &shim_grp.kept[shim_grp.kept[i].lead];
        use_device(ops, &cur, shim_grp.kept[i].device);
        ncclResult_t r =
            lead->join_failed ? ncclUnhandledCudaError : launch_one(&shim_grp.kept[i], lead->call.stream);
        if (r != ncclSuccess && res == ncclSuccess)
            res = r;
    }
    for (int l = from; l < to; l++)
        if (shim_grp.kept[l].lead == l && shim_grp.kept[l].join_failed)
            res = shim_err_set(ncclUnhandledCudaError,
                               "mscx: joining the streams of a group on comm %p failed (a CUDA event record "
                               "or wait); none of its calls in that group ran",
                               (void *)shim_grp.kept[l].call.comm);
    if (join_out(from, to, ops, &cur) != 0)
        res = shim_err_set(ncclUnhandledCudaError, "mscx: making the streams of a group wait for its calls "
                                                   "failed (a CUDA event record or wait)");
    use_device(ops, &cur, prev);
    return res;
}

/* Move the kept calls marked before to the front, each part in issue order. @return how many are before */
static int partition_before(void)
{
    int nb = 0;
    for (int i = 0; i < shim_grp.nkept; i++) {
        if (!shim_grp.kept[i].before)
            continue;
        struct kept_call k = shim_grp.kept[i];
        memmove(&shim_grp.kept[nb + 1], &shim_grp.kept[nb], (size_t)(i - nb) * sizeof(k));
        shim_grp.kept[nb++] = k;
    }
    return nb;
}

void shim_group_before_end(void)
{
    if (shim_grp.depth != 1 || !shim_group_collecting)
        return;
    shim_group_note_err(shim_p2p_group_end());
    shim_group_collecting = 0; /* what launches now runs at once */
    /* with nothing bound for NCCL every kept call waits for its end, which may still fail */
    shim_grp.nlaunched = shim_grp.nforwarded != 0 ? partition_before() : 0;
    shim_group_note_err(launch_kept(0, shim_grp.nlaunched));
}

ncclResult_t shim_group_end(int prof, ncclResult_t res)
{
    if (shim_grp.depth == 0 || --shim_grp.depth > 0)
        return res;
    shim_group_collecting = 0;
    shim_grp.simulated = 0;
    int from = shim_grp.nlaunched, to = shim_grp.nkept;
    shim_grp.nkept = 0;
    shim_grp.nlaunched = 0;
    ncclResult_t err = shim_grp.err;
    shim_grp.err = ncclSuccess;
    if (res != ncclSuccess && res != ncclInProgress) {
        /* NCCL ran none of the group: the calls kept for after it are dropped with it */
        shim_grp.npending = 0;
        shim_grp.overflow = 0;
        return res;
    }
    /* ncclInProgress: NCCL took the group and finishes it in the background; what we kept runs now */
    ncclResult_t setup = flush_pending(prof);
    ncclResult_t launched = launch_kept(from, to);
    if (err != ncclSuccess)
        return err;
    if (setup != ncclSuccess)
        return setup;
    return launched != ncclSuccess ? launched : res;
}
