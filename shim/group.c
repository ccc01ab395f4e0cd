/* SPDX-License-Identifier: MIT */
/*
 * ncclGroupStart/End on this thread: the depth; the communicators created
 * inside a group, set up after the outermost ncclGroupEnd (their real init
 * completes there); and the collectives kept for our executor.
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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "shim_int.h"

#define GROUP_MAX_PENDING 64
#define GROUP_MAX_DEVICES 8

static __thread int group_depth;
static __thread ncclComm_t group_pending[GROUP_MAX_PENDING];
static __thread struct shim_join group_joins[GROUP_MAX_PENDING]; /* of group_pending */
static __thread int group_npending;
static __thread int group_overflow;

__thread int shim_group_collecting;

struct kept {
    struct shim_coll_call call;
#ifdef SHIM_HAVE_ncclAllReduceConfig
    ncclCollConfig_t config; /* a copy of an nccl<Coll>Config call's config, which may not outlive the call */
#endif
    int device;
    int before;      /* issued before any NCCL-bound call of its communicator in the group */
    int lead;        /* index of the first kept call of the same communicator: its stream is the join's */
    int new_stream;  /* the first kept call of its communicator on this stream */
    int join_failed; /* on a lead: joining its communicator's streams failed, none of its calls run */
};

static __thread struct kept *kept;
static __thread int nkept, cap_kept;
#define GROUP_MAX_FORWARDED 32
static __thread ncclComm_t
    forwarded[GROUP_MAX_FORWARDED]; /* communicators with an NCCL-bound call in the group */
static __thread int nforwarded;     /* -1: more than the list holds, every communicator counts as one */
static __thread int nlaunched;      /* kept calls launched before the real ncclGroupEnd */
static __thread int simulated;      /* the group ends in ncclGroupSimulateEnd: its calls go to NCCL */
static __thread ncclResult_t
    group_err; /* the first error of a call forwarded in the group or launched before its end */

/*
 * The stream operations of a join (devops.c): CUDA's, or in the shim's test
 * build the test suite's fake NCCL's, which record what a join does. Without either there is no
 * event: keeping a call on a second stream of a communicator then fails.
 */
static const struct shim_dev_join_ops *join_ops(void)
{
    return &shim_dev_ops()->join;
}

/* ---- per-thread storage: the kept calls and one event per device, released at thread exit ---- */

struct group_event {
    int device;
    void *ev;
};
static __thread struct group_event events[GROUP_MAX_DEVICES];
static __thread int nevents;

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;
static __thread int key_armed;

static void thread_exit(void *unused)
{
    (void)unused;
    const struct shim_dev_join_ops *ops = join_ops();
    for (int i = 0; i < nevents; i++)
        ops->event_destroy(events[i].ev);
    nevents = 0;
    free(kept);
    kept = NULL;
    nkept = cap_kept = 0;
}

static void make_key(void)
{
    key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

static void arm_exit(void)
{
    if (key_armed)
        return;
    pthread_once(&key_once, make_key);
    if (key_ok && pthread_setspecific(exit_key, &key_armed) == 0)
        key_armed = 1;
}

/* This thread's event on @p device, made on first use. @return NULL when there is none */
static void *group_event(int device)
{
    for (int i = 0; i < nevents; i++)
        if (events[i].device == device)
            return events[i].ev;
    void *ev = NULL;
    if (nevents == GROUP_MAX_DEVICES || join_ops()->event_create(device, &ev) != 0)
        return NULL;
    arm_exit();
    events[nevents].device = device;
    events[nevents].ev = ev;
    nevents++;
    return ev;
}

static int grow_kept(void)
{
    int cap = cap_kept ? 2 * cap_kept : 16;
    struct kept *k = realloc(kept, (size_t)cap * sizeof(*k));
    if (!k)
        return -1;
    arm_exit();
    kept = k;
    cap_kept = cap;
    return 0;
}

/* ---- the group ---- */

SHIM_HOT int shim_group_depth(void)
{
    return group_depth;
}

int shim_group_simulated(void)
{
    return simulated;
}

void shim_group_defer(ncclComm_t comm, const struct shim_join *j)
{
    if (group_npending < GROUP_MAX_PENDING) {
        group_joins[group_npending] = *j;
        group_pending[group_npending++] = comm;
    } else {
        group_overflow = 1;
    }
}

/* After the outermost ncclGroupEnd succeeded: set up the communicators created in the group. */
static ncclResult_t flush_pending(int prof)
{
    int n = group_npending;
    int overflow = group_overflow;
    group_npending = 0;
    group_overflow = 0;
    /* the grown communicators' ranks meet now, outside the group, on every rank alike */
    for (int i = 0; i < n; i++)
        shim_join_resolve(&group_joins[i]);
    if (overflow) {
        /* more than we kept: none of them can run an exchange with the others */
        ncclResult_t res = ncclSuccess;
        for (int i = 0; i < n; i++) {
            ncclResult_t r = shim_comm_setup_nonblocking(prof, group_pending[i], "in a group");
            if (r != ncclSuccess && res == ncclSuccess)
                res = r;
        }
        return res;
    }
    return shim_comm_setup_several(prof, group_pending, group_joins, n, "in a group");
}

static void note_err(ncclResult_t r)
{
    if (r != ncclSuccess && group_err == ncclSuccess)
        group_err = r;
}

void shim_group_enter(void)
{
    if (group_depth++ == 0) {
        shim_group_collecting = 1;
        nkept = 0;
        nforwarded = 0;
        simulated = 0;
        group_err = ncclSuccess;
    }
}

int shim_group_p2p_open(void)
{
    return shim_group_collecting && nkept == 0 && nforwarded == 0;
}

static int was_forwarded(ncclComm_t comm)
{
    for (int i = 0; i < nforwarded; i++)
        if (forwarded[i] == comm)
            return 1;
    return nforwarded < 0;
}

static void mark_forwarded(ncclComm_t comm)
{
    if (!comm || was_forwarded(comm))
        return;
    if (nforwarded == GROUP_MAX_FORWARDED)
        nforwarded = -1;
    else
        forwarded[nforwarded++] = comm;
}

int shim_group_reserve(void)
{
    return nkept < cap_kept || grow_kept() == 0 ? 0 : -1;
}

/* 1 when an earlier kept call of @p call's communicator uses another stream: the join needs an event. */
static int joins_streams(const struct shim_coll_call *call)
{
    for (int i = 0; i < nkept; i++)
        if (kept[i].call.comm == call->comm && kept[i].call.stream != call->stream)
            return 1;
    return 0;
}

ncclResult_t shim_group_keep(const struct shim_coll_call *call, int device)
{
    if (shim_p2p_nkept() > 0)
        shim_group_before_forward(
            NULL); /* sends and recvs beside a collective are no AlltoAll: NCCL's, first */
    if (shim_group_reserve() != 0)
        return shim_err_set(ncclSystemError, "mscx: %s in a group: no memory to keep it until ncclGroupEnd",
                            call->fn);
    if (joins_streams(call) && !group_event(device))
        return shim_err_set(ncclUnhandledCudaError,
                            "mscx: %s in a group: no CUDA event to join the streams of "
                            "comm %p",
                            call->fn, (void *)call->comm);
    struct kept *k = &kept[nkept++];
    k->call = *call;
    k->device = device;
    k->before = !was_forwarded(call->comm);
#ifdef SHIM_HAVE_ncclAllReduceConfig
    if (call->config) {
        const ncclCollConfig_t *cfg = call->config;
        size_t n = cfg->size < sizeof(k->config) ? cfg->size : sizeof(k->config);
        memset(&k->config, 0, sizeof(k->config));
        memcpy(&k->config, cfg, n);
        k->config.size = n; /* what the copy holds: NCCL reads no further */
        k->call.config = &k->config;
    }
#endif
    return ncclSuccess;
}

void shim_group_before_forward(ncclComm_t comm)
{
    if (!shim_group_collecting)
        return;
    if (shim_p2p_nkept() > 0) {
        mark_forwarded(shim_p2p_comm());
        note_err(shim_p2p_to_nccl());
    }
    mark_forwarded(comm);
}

void shim_group_before_simulate(void)
{
    if (!shim_group_collecting)
        return;
    shim_group_collecting = 0;
    simulated = 1;
    note_err(shim_p2p_to_nccl());
    for (int i = 0; i < nkept; i++) {
        ncclResult_t r;
        /* counted there as sent to NCCL with the group */
        if (!shim_comm_try_route(&kept[i].call, &r))
            r = shim_coll_forward(&kept[i].call);
        note_err(r);
    }
    nkept = 0;
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
static ncclResult_t launch_one(const struct kept *k, cudaStream_t stream)
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
        struct kept *k = &kept[i];
        k->lead = i;
        k->new_stream = 1;
        k->join_failed = 0;
        for (int j = from; j < i && k->new_stream; j++) {
            if (kept[j].call.comm != k->call.comm)
                continue;
            if (k->lead == i)
                k->lead = j;
            k->new_stream = kept[j].call.stream != k->call.stream;
        }
    }
}

/* Make the lead streams wait for the other streams of their communicators. */
static void join_in(int from, int to, const struct shim_dev_join_ops *ops, int *cur)
{
    for (int i = from; i < to; i++) {
        struct kept *k = &kept[i], *lead = &kept[k->lead];
        if (k->lead == i || !k->new_stream || lead->join_failed)
            continue;
        void *ev = group_event(k->device);
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
        if (kept[l].lead != l || kept[l].join_failed)
            continue;
        int recorded = 0;
        void *ev = NULL;
        for (int i = l + 1; i < to; i++) {
            if (kept[i].lead != l || !kept[i].new_stream)
                continue;
            if (!recorded) {
                ev = group_event(kept[l].device);
                use_device(ops, cur, kept[l].device);
                recorded = ev && ops->event_record(ev, (void *)kept[l].call.stream) == 0 ? 1 : -1;
            }
            if (recorded < 0 || ops->stream_wait((void *)kept[i].call.stream, ev) != 0)
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
    const struct shim_dev_join_ops *ops = join_ops();
    int prev = ops->get_device ? ops->get_device() : -1, cur = prev;
    ncclResult_t res = ncclSuccess;
    plan_joins(from, to);
    join_in(from, to, ops, &cur);
    for (int i = from; i < to; i++) {
        const struct kept *lead = &kept[kept[i].lead];
        use_device(ops, &cur, kept[i].device);
        ncclResult_t r = lead->join_failed ? ncclUnhandledCudaError : launch_one(&kept[i], lead->call.stream);
        if (r != ncclSuccess && res == ncclSuccess)
            res = r;
    }
    for (int l = from; l < to; l++)
        if (kept[l].lead == l && kept[l].join_failed)
            res = shim_err_set(ncclUnhandledCudaError,
                               "mscx: joining the streams of a group on comm %p failed (a CUDA event record "
                               "or wait); none of its calls in that group ran",
                               (void *)kept[l].call.comm);
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
    for (int i = 0; i < nkept; i++) {
        if (!kept[i].before)
            continue;
        struct kept k = kept[i];
        memmove(&kept[nb + 1], &kept[nb], (size_t)(i - nb) * sizeof(k));
        kept[nb++] = k;
    }
    return nb;
}

void shim_group_before_end(void)
{
    if (group_depth != 1 || !shim_group_collecting)
        return;
    note_err(shim_p2p_group_end());
    shim_group_collecting = 0; /* what launches now runs at once */
    /* with nothing bound for NCCL every kept call waits for its end, which may still fail */
    nlaunched = nforwarded != 0 ? partition_before() : 0;
    note_err(launch_kept(0, nlaunched));
}

ncclResult_t shim_group_end(int prof, ncclResult_t res)
{
    if (group_depth == 0 || --group_depth > 0)
        return res;
    shim_group_collecting = 0;
    simulated = 0;
    int from = nlaunched, to = nkept;
    nkept = 0;
    nlaunched = 0;
    ncclResult_t err = group_err;
    group_err = ncclSuccess;
    if (res != ncclSuccess && res != ncclInProgress) {
        /* NCCL ran none of the group: the calls kept for after it are dropped with it */
        group_npending = 0;
        group_overflow = 0;
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
