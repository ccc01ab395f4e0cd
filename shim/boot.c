/* SPDX-License-Identifier: MIT */
/*
 * The executor's bootstrap over the real communicator: allgather is the real
 * ncclAllGather of a small device buffer on a private stream, followed by a
 * synchronisation of that stream. Used only at communicator setup, never
 * during capture.
 *
 * Its buffers, stream and device are devops.c's: in the shim's test build,
 * host memory instead of device memory where the real library is the test
 * suite's fake NCCL, which moves host bytes between its ranks (with or without a GPU, with or
 * without CUDA in the build). A real NCCL never does; without it and
 * without a device every bootstrap is unsupported and the shim forwards
 * everything.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/exec.h"
#include "mscx/fork.h"
#include "mscx/log.h"
#include "shim_int.h"

struct shim_boot {
    struct mscx_bootstrap bs;        /* first: the executor holds a pointer to this */
    struct shim_boot *next_deferred; /* on the list of shim_boot_destroy_deferred */
    ncclComm_t comm;
    int prof;
    int device;
    cudaStream_t stream; /* the boot stream; NULL: the legacy stream, or host memory */
    const int *stop;     /* non-zero: stop waiting for a non-blocking call (NULL: never) */
    void *dhead;         /* [nranks + 1] slots of SHIM_BOOT_FIXED_BYTES, allocated at create */
    uint64_t rounds;     /* header rounds run */
};

/* Every exchange starts with a round of these, so a rank that cannot take part says so. */
struct boot_head {
    uint64_t ok;
    uint64_t bytes;
};
_Static_assert(sizeof(struct boot_head) <= SHIM_BOOT_FIXED_BYTES, "head slot");

/* The operations on the buffers, streams and device of a bootstrap. */
static const struct shim_dev_setup_ops *dev(void)
{
    return &shim_dev_ops()->setup;
}

/* ---- buffers: device memory, or host memory under the fake NCCL ---- */

static void buf_free(void *p)
{
    if (p)
        dev()->free(p);
}

/* Host bytes into a buffer (ordered before the next gather on the boot stream). */
static int buf_put(const struct shim_boot *b, void *dst, const void *src, size_t n)
{
    return dev()->put(dst, src, n, b->stream);
}

/* A buffer's bytes into host memory, after everything enqueued before. */
static int buf_get(const struct shim_boot *b, void *dst, const void *src, size_t n)
{
    return dev()->get(dst, src, n, b->stream);
}

/* Enter @p b's scope (shim_dev_scope); leave it with dev_leave() whatever this returns. @return 1 on success
 */
static int dev_enter(const struct shim_boot *b, struct shim_dev_scope *sc)
{
    return dev()->enter(b->device, sc);
}

static void dev_leave(const struct shim_dev_scope *sc)
{
    dev()->leave(sc);
}

/* The device runtime's last error (cleared) as the cause of a failed exchange; nothing without a runtime. */
static void warn_device_error(void)
{
    const char *(*text)(void) = shim_dev_ops()->error_text;
    if (text)
        MSCX_WARN("mscx: bootstrap exchange: CUDA error %s", text());
}

/* ---- exchanges ---- */

/*
 * A call on a non-blocking communicator may answer ncclInProgress: then
 * ncclCommGetAsyncError is polled until it says anything else, as NCCL's
 * own waits do, or until the communicator is stopped. @return the outcome
 */
static ncclResult_t wait_done(const struct shim_boot *b, ncclResult_t r)
{
    if (r != ncclInProgress)
        return r;
    shim_fn_ncclCommGetAsyncError_t gae = SHIM_REAL(b->prof, ncclCommGetAsyncError);
    if (!gae)
        return ncclSystemError;
    while (r == ncclInProgress) {
        if (b->stop && __atomic_load_n(b->stop, __ATOMIC_ACQUIRE))
            return ncclInvalidUsage; /* aborted meanwhile */
        ncclResult_t async = ncclInProgress, q = gae(b->comm, &async);
        r = q != ncclSuccess ? q : async;
        if (r == ncclInProgress)
            sched_yield();
    }
    return r;
}

/* The end of everything enqueued on the boot stream. */
static mscx_status_t buf_sync(const struct shim_boot *b)
{
    if (!dev()->sync(b->stream)) {
        warn_device_error();
        return MSCX_ERR_CUDA;
    }
    return MSCX_OK;
}

/*
 * One ncclAllGather of @p bytes from buffer @p dmine into buffer @p dall,
 * then to host @p all (NULL: not read, only waited for). At one rank there is nothing to exchange: the rank's
 * own bytes are read back, and the communicator never sees a call on the
 * boot stream.
 */
static mscx_status_t gather(struct shim_boot *b, void *dmine, void *dall, void *all, size_t bytes)
{
    shim_fn_ncclAllGather_t ag = SHIM_REAL(b->prof, ncclAllGather);
    if (!ag)
        return MSCX_ERR_SYSTEM;
    ncclResult_t r =
        b->bs.nranks == 1 ? ncclSuccess : wait_done(b, ag(dmine, dall, bytes, ncclUint8, b->comm, b->stream));
    if (r != ncclSuccess) {
        MSCX_WARN("mscx: bootstrap ncclAllGather of %zu bytes failed: %d", bytes, (int)r);
        return MSCX_ERR_SYSTEM;
    }
    if (!all)
        return buf_sync(b);
    if (!buf_get(b, all, b->bs.nranks == 1 ? dmine : dall, bytes * b->bs.nranks)) {
        warn_device_error();
        return MSCX_ERR_CUDA;
    }
    return MSCX_OK;
}

/*
 * The header round: every rank says whether it can go on. @return MSCX_OK
 * when all can, MSCX_ERR_REMOTE when some rank cannot (the same answer on
 * every rank), or the local error of the round itself.
 */
static mscx_status_t head_round(struct shim_boot *b, int ok, size_t bytes)
{
    uint32_t n = b->bs.nranks;
    struct boot_head mine = {(uint64_t)(ok != 0), bytes}, *all = calloc(n, sizeof(*all));
    char *dmine = (char *)b->dhead + (size_t)n * sizeof(mine);
    mscx_status_t st = MSCX_ERR_NO_MEMORY;
    b->rounds++;
    if (!all)
        return st; /* a few bytes of host memory: documented as the one unannounced failure */
    if (!buf_put(b, dmine, &mine, sizeof(mine))) {
        st = MSCX_ERR_CUDA;
        goto out;
    }
    if ((st = gather(b, dmine, b->dhead, all, sizeof(mine))) != MSCX_OK)
        goto out;
    for (uint32_t r = 0; r < n; r++)
        if (!all[r].ok || all[r].bytes != bytes) {
            st = MSCX_ERR_REMOTE;
            break;
        }
out:
    free(all);
    return st;
}

/*
 * One exchange's buffer: stream-ordered on the boot stream where the device
 * has memory pools (cudaMallocAsync/cudaFreeAsync), since cudaFree would
 * wait for all the device's work, the caller's included.
 */
static int xbuf_alloc(const struct shim_boot *b, void **p, size_t n)
{
    return dev()->alloc_ordered(p, n, b->stream, b->device);
}

static void xbuf_free(const struct shim_boot *b, void *p)
{
    if (p)
        dev()->free_ordered(p, b->stream, b->device);
}

static mscx_status_t boot_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct shim_boot *b = ctx;
    size_t total = bytes * b->bs.nranks;
    void *dbuf = NULL;
    struct shim_dev_scope scope;
    mscx_status_t st;

    if (!dev_enter(b, &scope)) {
        dev_leave(&scope);
        return MSCX_ERR_CUDA; /* cannot happen after create; nothing to take part with */
    }
    /* Allocate before the header round, so that a failure is announced, not a hang. */
    int ok = bytes == 0 || xbuf_alloc(b, &dbuf, total + bytes);
    st = head_round(b, ok, bytes);
    if (st != MSCX_OK || bytes == 0)
        goto out;
    char *dmine = (char *)dbuf + total;
    if (!buf_put(b, dmine, mine, bytes)) {
        st = MSCX_ERR_CUDA;
        goto out;
    }
    st = gather(b, dmine, dbuf, all, bytes);
out:
    if (st == MSCX_ERR_REMOTE)
        MSCX_INFO(MSCX_SUB_SHIM, "mscx: a rank could not take part in a bootstrap exchange of %zu bytes",
                  bytes);
    xbuf_free(b, dbuf);
    dev_leave(&scope);
    return st;
}

mscx_status_t shim_boot_fixed(struct mscx_bootstrap *bs, const void *mine, void *all)
{
    struct shim_boot *b = bs->ctx;
    struct shim_dev_scope scope;
    if (!dev_enter(b, &scope)) {
        dev_leave(&scope);
        return MSCX_ERR_CUDA;
    }
    char *dmine = (char *)b->dhead + (size_t)b->bs.nranks * SHIM_BOOT_FIXED_BYTES;
    mscx_status_t st = MSCX_ERR_CUDA;
    if (buf_put(b, dmine, mine, SHIM_BOOT_FIXED_BYTES))
        st = gather(b, dmine, b->dhead, all, SHIM_BOOT_FIXED_BYTES);
    dev_leave(&scope);
    return st;
}

mscx_status_t shim_boot_agree(struct mscx_bootstrap *bs, int ok)
{
    struct shim_boot *b = bs->ctx;
    struct shim_dev_scope scope;
    if (!dev_enter(b, &scope)) {
        dev_leave(&scope);
        return MSCX_ERR_CUDA;
    }
    mscx_status_t st = head_round(b, ok, 0);
    dev_leave(&scope);
    return st;
}

uint64_t shim_boot_rounds(const struct mscx_bootstrap *bs)
{
    const struct shim_boot *b = bs->ctx;
    return b->rounds;
}

/* The device, buffer and stream of @p b. @return MSCX_OK or MSCX_ERR_CUDA (logged). */
static mscx_status_t boot_resources(struct shim_boot *b)
{
    struct shim_dev_scope scope;
    size_t bytes = ((size_t)b->bs.nranks + 1) * SHIM_BOOT_FIXED_BYTES;
    if (!dev_enter(b, &scope) || shim_boot_fault("boot") || !dev()->alloc(&b->dhead, bytes)) {
        if (shim_dev_ops()->error_text)
            MSCX_INFO(MSCX_SUB_SHIM, "bootstrap on device %d: %s", b->device, shim_dev_ops()->error_text());
        dev_leave(&scope);
        return MSCX_ERR_CUDA;
    }
    /* NULL: the legacy stream still serves; failing here would leave the other ranks waiting */
    b->stream = dev()->stream_create();
    dev_leave(&scope);
    return MSCX_OK;
}

static void deferred_reap(void);

mscx_status_t shim_boot_create(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                               struct mscx_bootstrap **bs_p)
{
    /* under the fake NCCL host memory serves, on a machine with a GPU too */
    if (!dev()->have_device())
        return MSCX_ERR_UNSUPPORTED;
    deferred_reap();
    struct shim_boot *b = calloc(1, sizeof(*b));
    if (!b)
        return MSCX_ERR_NO_MEMORY;
    b->bs.rank = rank;
    b->bs.nranks = nranks;
    b->bs.ctx = b;
    b->bs.allgather = boot_allgather;
    b->comm = comm;
    b->prof = prof;
    b->device = cuda_device;
    if (boot_resources(b) != MSCX_OK) {
        free(b);
        return MSCX_ERR_CUDA;
    }
    *bs_p = &b->bs;
    return MSCX_OK;
}

/*
 * The receiving buffer of a vote: device memory, else pinned host memory
 * (which the device reaches through unified addressing), so that a rank
 * whose device is full still takes part. *pinned_p: which one it is.
 */
static int vote_alloc(void **p, size_t n, int *pinned_p)
{
    *pinned_p = 0;
    if (dev()->alloc(p, n))
        return 1;
    if (dev()->alloc_pinned(p, n)) {
        *pinned_p = 1;
        return 1;
    }
    return 0;
}

static void vote_free(const struct shim_boot *b, void *p, int pinned)
{
    if (pinned) {
        dev()->free_pinned(p);
        p = NULL;
    }
    if (b->stream)
        dev()->stream_destroy(b->stream);
    buf_free(p);
}

mscx_status_t shim_boot_fixed_once(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                                   const void *mine, void *all)
{
    struct shim_boot b;
    memset(&b, 0, sizeof(b));
    b.bs.rank = rank;
    b.bs.nranks = nranks;
    b.comm = comm;
    b.prof = prof;
    b.device = cuda_device;
    if (!dev()->have_device())
        return MSCX_ERR_UNSUPPORTED;
    struct shim_dev_scope scope;
    int pinned = 0;
    void *buf = NULL;
    mscx_status_t st = MSCX_ERR_CUDA;
    size_t bytes = ((size_t)nranks + 1) * SHIM_BOOT_FIXED_BYTES;
    if (!dev_enter(&b, &scope) || !vote_alloc(&buf, bytes, &pinned))
        goto out;
    b.stream = dev()->stream_create();
    char *dmine = (char *)buf + (size_t)nranks * SHIM_BOOT_FIXED_BYTES;
    if (pinned)
        memcpy(dmine, mine, SHIM_BOOT_FIXED_BYTES);
    if (pinned || buf_put(&b, dmine, mine, SHIM_BOOT_FIXED_BYTES)) {
        /* pinned memory is read by the host once the exchange is over */
        st = gather(&b, dmine, buf, pinned ? NULL : all, SHIM_BOOT_FIXED_BYTES);
        if (st == MSCX_OK && pinned && all)
            memcpy(all, nranks == 1 ? dmine : buf, (size_t)nranks * SHIM_BOOT_FIXED_BYTES);
    }
out:
    if (buf)
        vote_free(&b, buf, pinned);
    dev_leave(&scope);
    return st;
}

void shim_boot_watch(struct mscx_bootstrap *bs, const int *stop)
{
    struct shim_boot *b = bs->ctx;
    b->stop = stop;
}

void shim_boot_use_device(int device)
{
    dev()->use_device(device); /* on an error the setup's own device calls say what is wrong */
}

/*
 * Bootstraps of stopped communicators, freed by the next shim_boot_destroy(),
 * or by a later shim_boot_create() once their stream has no work left.
 */
static pthread_mutex_t g_deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_boot *g_deferred;

__attribute__((constructor)) static void deferred_fork_init(void)
{
    mscx_fork_protect(&g_deferred_lock, MSCX_FORK_SHIM_WARN);
}

static void boot_free(struct shim_boot *b);

/* 1 when nothing is left on @p b's stream (a query, which never waits). */
static int boot_idle(const struct shim_boot *b)
{
    return !b->stream || dev()->stream_idle(b->stream);
}

/* Free at most two stopped bootstraps whose streams are idle: a small cost per setup, and the list shrinks.
 */
static void deferred_reap(void)
{
    struct shim_boot *idle = NULL;
    unsigned n = 0;
    pthread_mutex_lock(&g_deferred_lock);
    for (struct shim_boot **pp = &g_deferred; *pp && n < 2;) {
        struct shim_boot *b = *pp;
        if (!boot_idle(b)) {
            pp = &b->next_deferred;
            continue;
        }
        *pp = b->next_deferred;
        b->next_deferred = idle;
        idle = b;
        n++;
    }
    pthread_mutex_unlock(&g_deferred_lock);
    while (idle) {
        struct shim_boot *next = idle->next_deferred;
        boot_free(idle);
        idle = next;
    }
}

void shim_boot_destroy_deferred(struct mscx_bootstrap *bs)
{
    if (!bs)
        return;
    struct shim_boot *b = bs->ctx;
    if (dev()->host) {
        boot_free(b); /* host memory: nothing waits on a device */
        return;
    }
    pthread_mutex_lock(&g_deferred_lock);
    b->next_deferred = g_deferred;
    g_deferred = b;
    pthread_mutex_unlock(&g_deferred_lock);
}

void shim_boot_destroy(struct mscx_bootstrap *bs)
{
    if (!bs)
        return;
    boot_free(bs->ctx);
    pthread_mutex_lock(&g_deferred_lock);
    struct shim_boot *d = g_deferred;
    g_deferred = NULL;
    pthread_mutex_unlock(&g_deferred_lock);
    while (d) {
        struct shim_boot *next = d->next_deferred;
        boot_free(d);
        d = next;
    }
}

static void boot_free(struct shim_boot *b)
{
    if (b->stream)
        dev()->stream_destroy(b->stream);
    buf_free(b->dhead);
    free(b);
}
