/* SPDX-License-Identifier: MIT */
/*
 * The lifetime of our state beside each real communicator (struct
 * shim_comm, comm_int.h), found by the real ncclComm_t in comm_table.c:
 * the executor, the plans usable on this communicator, and the routing
 * statistics printed at destroy. Its setup is setup.c's, the routing of
 * its calls route_call.c's, its end teardown.c's.
 *
 * Every collective looks its communicator up without a lock. State objects
 * are recycled, never freed: a call that found one keeps reading valid
 * memory whatever a concurrent teardown does. A call holds a reference,
 * taken only while the count is not zero and kept only when the object
 * still belongs to the call's communicator; the last reference releases the
 * executor and the plan arrays and puts the object on the free list. The
 * count orders every access to the other fields: they are written only
 * while it is zero, or before the communicator is handed to the application.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "mscx/fork.h"
#include "mscx/log.h"

static pthread_mutex_t free_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void free_fork_init(void)
{
    mscx_fork_protect(&free_lock, MSCX_FORK_SHIM_FREE);
}
static struct shim_comm *free_list;

/* A reference to @p c when it still belongs to @p key. @return 1 when taken. */
SHIM_HOT static int comm_ref(struct shim_comm *c, uintptr_t key)
{
    int n = atomic_load_explicit(&c->refs, memory_order_relaxed);
    do {
        if (n == 0)
            return 0; /* released: being recycled */
    } while (!atomic_compare_exchange_weak_explicit(&c->refs, &n, n + 1, memory_order_acquire,
                                                    memory_order_relaxed));
    if ((uintptr_t)c->comm == key)
        return 1;
    shim_comm_put(c); /* recycled for another communicator meanwhile */
    return 0;
}

SHIM_HOT struct shim_comm *shim_comm_get(ncclComm_t comm)
{
    uintptr_t key = (uintptr_t)comm;
    struct shim_comm *c = key ? shim_table_find(key) : NULL;
    return c && comm_ref(c, key) ? c : NULL;
}

/* A cleared object for a new communicator, its count still 0. */
static struct shim_comm *comm_alloc(void)
{
    pthread_mutex_lock(&free_lock);
    struct shim_comm *c = free_list;
    if (c)
        free_list = c->next_free;
    pthread_mutex_unlock(&free_lock);
    if (!c) {
        /* on a cache line of its own: the fields every call reads share one */
        size_t size = (sizeof(*c) + 63) / 64 * 64;
        c = aligned_alloc(64, size);
        if (c)
            memset(c, 0, size);
        return c;
    }
    /* calls that still hold the old address only ever read the count while it is 0 */
    memset((char *)c + offsetof(struct shim_comm, comm), 0, sizeof(*c) - offsetof(struct shim_comm, comm));
    return c;
}

void shim_comm_release(struct shim_comm *c)
{
    if (c->stopped) {
        mscx_exec_destroy_deferred(c->exec);
        shim_boot_destroy_deferred(c->bs);
    } else {
        if (c->exec)
            mscx_exec_destroy(c->exec);
        shim_boot_destroy(c->bs);
    }
    free(c->route);
    free(c->exec_id);
    free(c->route_name);
    free((void *)c->route_calls);
    free((void *)c->p2p_sent);
    free((void *)c->p2p_received);
    shim_p2p_agree_close(c->p2p_agree);
    pthread_mutex_lock(&free_lock);
    c->next_free = free_list;
    free_list = c;
    pthread_mutex_unlock(&free_lock);
}

SHIM_HOT void shim_comm_put(struct shim_comm *c)
{
    if (c)
        shim_comm_unref(c);
}

/*
 * Publish @p c with the table's reference. A communicator NCCL handed out at
 * the address of one still in the table replaces it: *old_p receives the
 * object replaced, whose table reference the caller must put.
 * @return 0, or -1 when every slot is taken
 */
static int table_insert(struct shim_comm *c, struct shim_comm **old_p)
{
    void *old;
    atomic_store_explicit(&c->refs, 1, memory_order_release);
    if (shim_table_insert((uintptr_t)c->comm, c, &old) != 0) {
        atomic_store_explicit(&c->refs, 0, memory_order_relaxed);
        return -1;
    }
    *old_p = old;
    return 0;
}

/* Unlink; the caller owns the table's reference and must put it. */
struct shim_comm *shim_comm_unlink(ncclComm_t comm)
{
    return comm ? shim_table_remove((uintptr_t)comm) : NULL;
}

/* A cleared object for @p comm with its settings, not yet published. NULL without memory. */
struct shim_comm *shim_comm_new(int prof, ncclComm_t comm, const char *how, const struct mscx_config *cfg)
{
    struct shim_comm *c = shim_boot_fault("comm-alloc") ? NULL : comm_alloc();
    if (!c)
        return NULL; /* no state: calls go to NCCL */
    c->comm = comm;
    c->prof = prof;
    c->how = how;
    if (cfg && shim_parse_forced(cfg->force_fallback, &c->forced) != 0) {
        shim_warn_once("force-fallback",
                       "mscx: bad MSCX_FORCE_FALLBACK '%s': expected a comma list of allreduce, "
                       "allgather, reducescatter, alltoall, broadcast or all; everything falls back",
                       cfg->force_fallback);
        c->forced = ~0u;
    }
    return c;
}

/* Publish @p c with the table's reference. @return 0, or -1 when the table is full (@p c released). */
int shim_comm_publish(struct shim_comm *c)
{
    struct shim_comm *old;
    if (shim_boot_fault("table") || table_insert(c, &old) != 0) {
        shim_warn_once("comm-table",
                       "mscx: more than %u communicators at once; the next ones stay on NCCL "
                       "without routing statistics",
                       SHIM_TABLE_SIZE);
        shim_comm_release(c);
        return -1;
    }
    shim_comm_put(old); /* state of a communicator NCCL freed without us seeing it, or a placeholder */
    return 0;
}

mscx_status_t shim_comm_error_record(struct shim_comm *c)
{
    mscx_status_t st = mscx_exec_async_error(c->exec);
    if (st == MSCX_OK)
        return MSCX_OK;
    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&c->err, &expected, (int)st, memory_order_relaxed,
                                                memory_order_relaxed))
        MSCX_WARN("mscx: a kernel of comm %p rank %u/%u failed: %s; every later call on it returns an error "
                  "(abort the communicator and create a new one)",
                  (void *)c->comm, c->rank, c->nranks, mscx_status_str(st));
    return (mscx_status_t)atomic_load_explicit(&c->err, memory_order_relaxed);
}
