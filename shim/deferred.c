/* SPDX-License-Identifier: MIT */
/*
 * Non-blocking communicators: a placeholder published at init, whose full
 * setup runs at the communicator's first collective outside a group, once
 * its real init has completed.
 */
#include <stdatomic.h>

#include "comm_int.h"
#include "mscx/env.h"
#include "mscx/log.h"

/* Set once a placeholder under MSCX_DISABLE or a bad setting exists: their collectives then look it up. */
static atomic_int deferred_disabled;

int shim_comm_deferred_disabled(void)
{
    return atomic_load_explicit(&deferred_disabled, memory_order_relaxed);
}

ncclResult_t shim_comm_defer_setup(int prof, ncclComm_t comm, const char *how, const struct shim_join *j)
{
    const struct mscx_config *cfg = shim_config();
    if (!shim_config_lenient() || !comm)
        return ncclSuccess;
    int disabled = !cfg || cfg->disable;
    struct shim_comm *c = shim_comm_new(prof, comm, how, cfg);
    if (!c)
        return ncclSuccess;
    c->join = *j;
    atomic_store_explicit(&c->deferred, disabled ? DEFER_DISABLED : DEFER_SETUP, memory_order_relaxed);
    if (disabled)
        atomic_store_explicit(&deferred_disabled, 1, memory_order_relaxed);
    if (shim_comm_publish(c) == 0)
        MSCX_INFO(MSCX_SUB_SHIM,
                  "comm %p created %s is non-blocking: its setup runs at its first collective "
                  "outside a group",
                  (void *)comm, how);
    return ncclSuccess;
}

/* @return 1 when the real init of @p p's communicator has completed; else says why not, at INFO. */
static int init_completed(const struct shim_comm *p)
{
    shim_fn_ncclCommGetAsyncError_t gae = SHIM_REAL(p->prof, ncclCommGetAsyncError);
    ncclResult_t async = ncclInProgress, r = gae ? gae(p->comm, &async) : ncclSystemError;
    if (r == ncclSuccess && async == ncclSuccess)
        return 1;
    shim_err_clear();
    MSCX_INFO(MSCX_SUB_SHIM,
              "comm %p created %s: its init had not completed at its first collective "
              "(ncclCommGetAsyncError: %d, %d); it stays on NCCL",
              (void *)p->comm, p->how, (int)r, (int)async);
    return 0;
}

/* Unlink placeholder @p p, if still linked, and drop the call's reference. */
static void placeholder_drop(struct shim_comm *p)
{
    struct shim_comm *t = shim_comm_unlink(p->comm);
    void *old = NULL;
    if (t == p)
        shim_comm_put(t);
    else if (t)
        shim_table_insert((uintptr_t)t->comm, t, &old); /* not ours to unlink */
    shim_comm_put(p);
}

static void stats_copy(struct shim_comm *to, const struct shim_comm *from)
{
    for (int k = 0; k < NSTAT_COLL; k++)
        for (int b = 0; b < SHIM_NBUCKETS; b++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                atomic_store_explicit(&to->counts[k][b][w],
                                      atomic_load_explicit(&from->counts[k][b][w], memory_order_relaxed),
                                      memory_order_relaxed);
}

static int comm_stopped(const struct shim_comm *c)
{
    return __atomic_load_n(&c->stopped, __ATOMIC_ACQUIRE);
}

/*
 * The full setup of placeholder @p p, on this thread, in place of it: the
 * new state is published only once complete, so that a concurrent
 * ncclCommGetAsyncError (a watchdog thread) never reads it half made.
 * @return the new state referenced, or NULL (the call goes to NCCL)
 */
static struct shim_comm *deferred_build(struct shim_comm *p)
{
    const struct mscx_config *cfg = shim_config();
    struct shim_comm *c = cfg ? shim_comm_new(p->prof, p->comm, p->how, cfg) : NULL;
    if (!c) {
        if (cfg)
            shim_comm_vote_fall_back(p->prof, p->comm, cfg, "out of memory for its state", 1, &p->join);
        return NULL;
    }
    if (shim_comm_build(c, cfg, &p->join, &p->stopped) != ncclSuccess) {
        MSCX_WARN("%s; comm %p stays on NCCL", shim_err_text(), (void *)p->comm);
        shim_err_clear();
        return NULL;
    }
    if (c->bs)
        shim_boot_watch(c->bs, &c->stopped); /* from now on its own: @p p is recycled */
    stats_copy(c, p);
    if (comm_stopped(p)) {
        c->stopped = 1; /* aborted meanwhile: nothing of it may wait on the device */
        shim_comm_release(c);
        return NULL;
    }
    if (shim_comm_publish(c) != 0)
        return NULL;
    shim_err_clear(); /* what the setup met is logged; this call's answer is its own */
    if (comm_stopped(p)) {
        shim_comm_stop_finish(shim_comm_stop(p->comm), "abort"); /* aborted while being published */
        return NULL;
    }
    return shim_comm_get(p->comm);
}

struct shim_comm *shim_comm_setup_deferred(struct shim_comm *p)
{
    int kind = atomic_load_explicit(&p->deferred, memory_order_relaxed);
    if (kind == DEFER_RUNNING || shim_group_depth() > 0 ||
        !atomic_compare_exchange_strong_explicit(&p->deferred, &kind, DEFER_RUNNING, memory_order_relaxed,
                                                 memory_order_relaxed)) {
        if (kind != DEFER_DISABLED)
            return p; /* no executor yet: this call goes to NCCL, counted */
        shim_comm_put(p);
        return NULL;
    }
    if (!init_completed(p)) {
        atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
        if (kind != DEFER_DISABLED)
            return p;
        placeholder_drop(p);
        return NULL;
    }
    if (kind == DEFER_DISABLED) {
        const struct mscx_config *lenient = shim_config_lenient();
        if (lenient)
            shim_comm_setup_disabled(p->prof, p->comm, lenient, &p->join);
        atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
        placeholder_drop(p);
        return NULL;
    }
    struct shim_comm *c = deferred_build(p);
    atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
    if (!c)
        return p; /* the placeholder serves for statistics */
    shim_comm_put(p);
    return c;
}
