/* SPDX-License-Identifier: MIT */
/*
 * What the executor runs for the reduction op of a call: the built-in ops
 * as they are; ncclAvg on fp32, fp16 and bf16 as a sum scaled by NCCL's
 * 1/nranks (mscx_scale_avg()); an op of ncclRedOpCreatePreMulSum as a sum
 * scaled by its scalar, for the communicator and datatype it was made for.
 * Those ops are kept here per (communicator, op handle) in a small hash
 * table under a lock; only a call with such an op looks them up.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "mscx/fork.h"
#include "shim_int.h"

/* Slots of the table, a power of two: open addressing, linear probing, never more than REDOP_MAX used. */
#define REDOP_SLOTS 1024u
#define REDOP_MAX (REDOP_SLOTS * 3u / 4u)

struct redop_entry {
    ncclComm_t comm; /* NULL: free */
    ncclRedOp_t op;
    ncclDataType_t dtype;
    struct mscx_scale scale;
};

static pthread_mutex_t redop_lock = PTHREAD_MUTEX_INITIALIZER;
static struct redop_entry redops[REDOP_SLOTS];
static atomic_uint redop_count; /* entries in use: 0 spares a call the lock */

/* A leaf lock (nothing is taken while it is held): any level after the ones held around it. */
__attribute__((constructor)) static void redop_fork_init(void)
{
    mscx_fork_protect(&redop_lock, MSCX_FORK_SHIM_WARN);
}

static uint32_t home(ncclComm_t comm, ncclRedOp_t op)
{
    uint64_t h = ((uint64_t)(uintptr_t)comm ^ ((uint64_t)(uint32_t)op << 40)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 54) & (REDOP_SLOTS - 1);
}

/* The slot of (@p comm, @p op), or the free slot that ends its probe; the lock is held. */
static uint32_t probe(ncclComm_t comm, ncclRedOp_t op)
{
    uint32_t i = home(comm, op);
    while (redops[i].comm && !(redops[i].comm == comm && redops[i].op == op))
        i = (i + 1) & (REDOP_SLOTS - 1);
    return i;
}

int shim_redop_record(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dtype, const struct mscx_scale *scale)
{
    if (!comm)
        return -1;
    int ok = 1;
    pthread_mutex_lock(&redop_lock);
    struct redop_entry *e = &redops[probe(comm, op)];
    if (!e->comm) {
        ok = atomic_load_explicit(&redop_count, memory_order_relaxed) < REDOP_MAX;
        if (ok)
            atomic_fetch_add_explicit(&redop_count, 1, memory_order_relaxed);
    }
    if (ok) {
        e->comm = comm;
        e->op = op;
        e->dtype = dtype;
        e->scale = *scale;
    }
    pthread_mutex_unlock(&redop_lock);
    return ok ? 0 : -1;
}

/* Empty slot @p i, moving back the entries after it whose probe would otherwise pass the hole. */
static void remove_at(uint32_t i)
{
    for (uint32_t j = (i + 1) & (REDOP_SLOTS - 1); redops[j].comm; j = (j + 1) & (REDOP_SLOTS - 1)) {
        uint32_t h = home(redops[j].comm, redops[j].op);
        /* the entry at j may move to i when its home is not in the cyclic range (i, j] */
        if (((j - h) & (REDOP_SLOTS - 1)) >= ((j - i) & (REDOP_SLOTS - 1))) {
            redops[i] = redops[j];
            i = j;
        }
    }
    redops[i].comm = NULL;
}

void shim_redop_forget(ncclComm_t comm, ncclRedOp_t op)
{
    if (!comm || atomic_load_explicit(&redop_count, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&redop_lock);
    uint32_t i = probe(comm, op);
    if (redops[i].comm) {
        remove_at(i);
        atomic_fetch_sub_explicit(&redop_count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&redop_lock);
}

/* The scale of PreMulSum op (@p comm, @p op) made for @p dtype: @return 0, or -1 when there is none. */
static int premulsum_scale(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dtype, struct mscx_scale *scale_p)
{
    if (!comm || atomic_load_explicit(&redop_count, memory_order_relaxed) == 0)
        return -1;
    pthread_mutex_lock(&redop_lock);
    const struct redop_entry *e = &redops[probe(comm, op)];
    int ok = e->comm && e->dtype == dtype;
    if (ok)
        *scale_p = e->scale;
    pthread_mutex_unlock(&redop_lock);
    return ok ? 0 : -1;
}

SHIM_HOT int shim_redop_resolve(ncclComm_t comm, uint32_t nranks, ncclRedOp_t op, ncclDataType_t dtype,
                                enum mscx_redop *op_p, struct mscx_scale *scale_p)
{
    struct mscx_scale none = {MSCX_SCALE_NONE, 0, NULL}, s = none;
    enum mscx_dtype dt;
    if (shim_redop_map(op, op_p) == 0) {
        *scale_p = none;
        return 0;
    }
    if (shim_dtype_map(dtype, &dt) != 0)
        return -1;
    if (op == ncclAvg) {
        s = mscx_scale_avg(dt, nranks);
        if (s.kind == MSCX_SCALE_NONE)
            return -1; /* integers: NCCL sums, then divides */
        if (nranks == 1)
            s = none; /* x * 1 is x, NaN included */
    } else if ((int)op < (int)ncclNumOps || premulsum_scale(comm, op, dtype, &s) != 0) {
        return -1;
    }
    *op_p = MSCX_REDOP_SUM;
    *scale_p = s;
    return 0;
}

void shim_redop_forget_comm(ncclComm_t comm)
{
    if (!comm || atomic_load_explicit(&redop_count, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&redop_lock);
    /* a removal moves later entries back, possibly past the scan: scan until a pass removes nothing */
    for (int removed = 1; removed;) {
        removed = 0;
        for (uint32_t i = 0; i < REDOP_SLOTS; i++) {
            while (redops[i].comm == comm) {
                remove_at(i);
                atomic_fetch_sub_explicit(&redop_count, 1, memory_order_relaxed);
                removed = 1;
            }
        }
    }
    pthread_mutex_unlock(&redop_lock);
}
