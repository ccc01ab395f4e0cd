/* SPDX-License-Identifier: MIT */
/*
 * The map from a real ncclComm_t to our state, read by every collective
 * without a lock.
 *
 * Open addressing with the key in the slot: a lookup compares keys without
 * touching any object, probes at most `reach` slots past the home slot (the
 * farthest any insert went) and does not stop at a free slot, so removing a
 * key is clearing its slot and nothing ever moves. Writers hold table_lock.
 * A key's slot is written before the key's communicator is handed to the
 * application, so every call on it finds it.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "mscx/fork.h"
#include "shim_int.h"

#define TABLE_BITS 12
_Static_assert(SHIM_TABLE_SIZE == 1u << TABLE_BITS, "the hash takes TABLE_BITS bits");

struct table_slot {
    _Atomic uintptr_t key; /* 0: free */
    _Atomic(void *) obj;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void table_fork_init(void)
{
    mscx_fork_protect(&table_lock, MSCX_FORK_SHIM_TABLE);
}
static struct table_slot table[SHIM_TABLE_SIZE];
static atomic_uint reach;

size_t shim_table_home(uintptr_t key)
{
    uint64_t p = key;
    p ^= p >> 17;
    p *= 0x9e3779b97f4a7c15ull;
    return (size_t)(p >> (64 - TABLE_BITS));
}

SHIM_HOT void *shim_table_find(uintptr_t key)
{
    unsigned n = atomic_load_explicit(&reach, memory_order_acquire);
    size_t s = shim_table_home(key);
    for (unsigned i = 0; i <= n; i++, s = (s + 1) % SHIM_TABLE_SIZE)
        if (atomic_load_explicit(&table[s].key, memory_order_acquire) == key)
            return atomic_load_explicit(&table[s].obj, memory_order_acquire);
    return NULL;
}

/* The slot of @p key, or -1. With table_lock held. */
static long slot_of(uintptr_t key)
{
    unsigned n = atomic_load_explicit(&reach, memory_order_relaxed);
    size_t s = shim_table_home(key);
    for (unsigned i = 0; i <= n; i++, s = (s + 1) % SHIM_TABLE_SIZE)
        if (atomic_load_explicit(&table[s].key, memory_order_relaxed) == key)
            return (long)s;
    return -1;
}

int shim_table_insert(uintptr_t key, void *obj, void **old_p)
{
    int res = -1;
    *old_p = NULL;
    pthread_mutex_lock(&table_lock);
    long at = slot_of(key);
    if (at >= 0) {
        *old_p = atomic_exchange_explicit(&table[at].obj, obj, memory_order_acq_rel);
        res = 0;
    }
    size_t s = shim_table_home(key);
    for (unsigned i = 0; res != 0 && i < SHIM_TABLE_SIZE; i++, s = (s + 1) % SHIM_TABLE_SIZE) {
        if (atomic_load_explicit(&table[s].key, memory_order_relaxed) != 0)
            continue;
        atomic_store_explicit(&table[s].obj, obj, memory_order_release);
        if (i > atomic_load_explicit(&reach, memory_order_relaxed))
            atomic_store_explicit(&reach, i, memory_order_release);
        atomic_store_explicit(&table[s].key, key, memory_order_release);
        res = 0;
    }
    pthread_mutex_unlock(&table_lock);
    return res;
}

void *shim_table_remove(uintptr_t key)
{
    void *obj = NULL;
    pthread_mutex_lock(&table_lock);
    long at = slot_of(key);
    if (at >= 0) {
        obj = atomic_load_explicit(&table[at].obj, memory_order_relaxed);
        atomic_store_explicit(&table[at].key, 0, memory_order_release);
        atomic_store_explicit(&table[at].obj, NULL, memory_order_release);
    }
    pthread_mutex_unlock(&table_lock);
    return obj;
}

void shim_table_each(void (*fn)(void *obj, void *ctx), void *ctx)
{
    pthread_mutex_lock(&table_lock);
    for (size_t s = 0; s < SHIM_TABLE_SIZE; s++) {
        void *obj = atomic_load_explicit(&table[s].obj, memory_order_relaxed);
        if (obj && atomic_load_explicit(&table[s].key, memory_order_relaxed) != 0)
            fn(obj, ctx);
    }
    pthread_mutex_unlock(&table_lock);
}
