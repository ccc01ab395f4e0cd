/* SPDX-License-Identifier: MIT */
/*
 * ncclGroupStart/End on this thread, while calls come: the depth; the
 * communicators created inside a group, set up after the outermost
 * ncclGroupEnd (their real init completes there); the collectives kept for
 * our executor, in issue order; and the communicators that had an
 * NCCL-bound call in the group. group_end.c ends the group.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "group_int.h"

#define GROUP_MAX_DEVICES 8

__thread int shim_group_collecting;
__thread struct shim_group_state shim_grp;

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
    const struct shim_dev_join_ops *ops = shim_group_join_ops();
    for (int i = 0; i < nevents; i++)
        ops->event_destroy(events[i].ev);
    nevents = 0;
    free(shim_grp.kept);
    shim_grp.kept = NULL;
    shim_grp.nkept = shim_grp.cap_kept = 0;
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

void *shim_group_event(int device)
{
    for (int i = 0; i < nevents; i++)
        if (events[i].device == device)
            return events[i].ev;
    void *ev = NULL;
    if (nevents == GROUP_MAX_DEVICES || shim_group_join_ops()->event_create(device, &ev) != 0)
        return NULL;
    arm_exit();
    events[nevents].device = device;
    events[nevents].ev = ev;
    nevents++;
    return ev;
}

static int grow_kept(void)
{
    int cap = shim_grp.cap_kept ? 2 * shim_grp.cap_kept : 16;
    struct kept_call *k = realloc(shim_grp.kept, (size_t)cap * sizeof(*k));
    if (!k)
        return -1;
    arm_exit();
    shim_grp.kept = k;
    shim_grp.cap_kept = cap;
    return 0;
}

/* ---- the group ---- */

SHIM_HOT int shim_group_depth(void)
{
    return shim_grp.depth;
}

int shim_group_simulated(void)
{
    return shim_grp.simulated;
}

void shim_group_defer(ncclComm_t comm, const struct shim_join *j)
{
    if (shim_grp.npending < GROUP_MAX_PENDING) {
        shim_grp.joins[shim_grp.npending] = *j;
        shim_grp.pending[shim_grp.npending++] = comm;
    } else {
        shim_grp.overflow = 1;
    }
}

void shim_group_note_err(ncclResult_t r)
{
    if (r != ncclSuccess && shim_grp.err == ncclSuccess)
        shim_grp.err = r;
}

void shim_group_enter(void)
{
    if (shim_grp.depth++ == 0) {
        shim_group_collecting = 1;
        shim_grp.nkept = 0;
        shim_grp.nforwarded = 0;
        shim_grp.simulated = 0;
        shim_grp.err = ncclSuccess;
    }
}

int shim_group_p2p_open(void)
{
    return shim_group_collecting && shim_grp.nkept == 0 && shim_grp.nforwarded == 0;
}

static int was_forwarded(ncclComm_t comm)
{
    for (int i = 0; i < shim_grp.nforwarded; i++)
        if (shim_grp.forwarded[i] == comm)
            return 1;
    return shim_grp.nforwarded < 0;
}

void shim_group_mark_forwarded(ncclComm_t comm)
{
    if (!comm || was_forwarded(comm))
        return;
    if (shim_grp.nforwarded == GROUP_MAX_FORWARDED)
        shim_grp.nforwarded = -1;
    else
        shim_grp.forwarded[shim_grp.nforwarded++] = comm;
}

int shim_group_reserve(void)
{
    return shim_grp.nkept < shim_grp.cap_kept || grow_kept() == 0 ? 0 : -1;
}

/* 1 when an earlier kept call of @p call's communicator uses another stream: the join needs an event. */
static int joins_streams(const struct shim_coll_call *call)
{
    for (int i = 0; i < shim_grp.nkept; i++)
        if (shim_grp.kept[i].call.comm == call->comm && shim_grp.kept[i].call.stream != call->stream)
            return 1;
    return 0;
}

ncclResult_t shim_group_keep(const struct shim_coll_call *call, int device)
{
    if (shim_group_reserve() != 0)
        return shim_err_set(ncclSystemError, "mscx: %s in a group: no memory to keep it until ncclGroupEnd",
                            call->fn);
    if (joins_streams(call) && !shim_group_event(device))
        return shim_err_set(ncclUnhandledCudaError,
                            "mscx: %s in a group: no CUDA event to join the streams of "
                            "comm %p",
                            call->fn, (void *)call->comm);
    struct kept_call *k = &shim_grp.kept[shim_grp.nkept++];
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
