/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for the GPU executor (mscx/exec.h), linked into a test build
 * of the shim, so that a communicator gets an executor without a GPU. Its
 * kernels run on the fake libnccl's device model (fake_dev.c): a launch
 * with FAKE_EXEC_STUCK=1 (a dead peer) starts one that runs until the abort
 * word is set, and mscx_exec_destroy frees as CUDA does, waiting for the
 * device to be idle, so that a free before the abort waits as it would on a
 * GPU. Without it a launch's kernel ends at once, as a healthy one does.
 * Every call is appended to FAKE_NCCL_LOG ("mscx_exec_<verb>"), in order
 * with the fake libnccl's own records; a launch as
 * "mscx_exec_launch <bytes> <stream>".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mscx/exec.h"

struct mscx_exec {
    uint32_t nplans;
    int inflight; /* kernels launched and not stopped */
    int aborted;
    int32_t error_word; /* MSCX_ERR_REMOTE once aborted, as the real executor's error record */
    struct mscx_exec *next_deferred;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct mscx_exec *deferred;

/*
 * A symbol of the test program (or of the fake CUDA/NCCL libraries), looked
 * up once: they are there from the start, and the launch path is timed.
 */
static void *test_sym(_Atomic(void *) *slot, atomic_int *looked_up, const char *name)
{
    if (!atomic_load_explicit(looked_up, memory_order_acquire)) {
        atomic_store_explicit(slot, dlsym(RTLD_DEFAULT, name), memory_order_relaxed);
        atomic_store_explicit(looked_up, 1, memory_order_release);
    }
    return atomic_load_explicit(slot, memory_order_relaxed);
}

#define TEST_SYM(type, name)                                                                                 \
    ({                                                                                                       \
        static _Atomic(void *) slot_;                                                                        \
        static atomic_int looked_up_;                                                                        \
        (type) test_sym(&slot_, &looked_up_, name);                                                          \
    })

/* 1 when launches are recorded (FAKE_NCCL_LOG, the fake NCCL's own setting). */
static int recording(void)
{
    const char *path = getenv("FAKE_NCCL_LOG");
    return path && *path;
}

static void record(const char *what)
{
    const char *path = getenv("FAKE_NCCL_LOG"); /* the fake's own setting */
    int fd = path && *path ? open(path, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (fd < 0)
        return;
    char line[128];
    size_t n = strlen(what);
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    memcpy(line, what, n);
    line[n++] = '\n';
    ssize_t w = write(fd, line, n);
    (void)w;
    close(fd);
}

/* FAKE_EXEC_STUCK=1: kernels wait for a dead peer, until the abort word; else they end at once. */
static int stuck(void)
{
    const char *s = getenv("FAKE_EXEC_STUCK");
    return s && *s == '1';
}

static void dev_busy(int delta)
{
    void (*fn)(int) = TEST_SYM(void (*)(int), "mscxFakeDevBusy");
    if (fn)
        fn(delta);
}

/* A CUDA free: waits until no kernel runs on the device. */
static void dev_free(void)
{
    int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "mscxFakeDevWaitIdle");
    if (fn)
        fn();
}

mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p)
{
    (void)cuda_device;
    if (!bs || !exec_p)
        return MSCX_ERR_INVALID_ARG;
    struct mscx_exec *ex = calloc(1, sizeof(*ex));
    if (!ex)
        return MSCX_ERR_NO_MEMORY;
    record("mscx_exec_create");
    *exec_p = ex;
    return MSCX_OK;
}

mscx_status_t mscx_exec_add_plan(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p)
{
    (void)plan;
    (void)max_msg_bytes;
    if (!ex || !plan_id_p)
        return MSCX_ERR_INVALID_ARG;
    *plan_id_p = ex->nplans++;
    return MSCX_OK;
}

mscx_status_t mscx_exec_launch(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                               uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                               enum mscx_pkt_format pkt, void *stream)
{
    (void)dtype;
    (void)op;
    (void)pkt;
    if (!ex || plan_id >= ex->nplans)
        return MSCX_ERR_INVALID_ARG;
    /* a launch result a test program chooses by size (test_shim_group.c) */
    mscx_status_t (*chosen)(uint64_t) = TEST_SYM(mscx_status_t(*)(uint64_t), "mscxFakeExecLaunchResult");
    mscx_status_t st = chosen ? chosen(msg_bytes) : MSCX_OK;
    if (recording()) {
        char what[96];
        snprintf(what, sizeof(what), "mscx_exec_launch%s %llu %p", st == MSCX_OK ? "" : "_failed",
                 (unsigned long long)msg_bytes, stream);
        record(what);
    }
    if (st != MSCX_OK)
        return st;
    /* FAKE_EXEC_COPY=1: the result on one rank (the input) is written, as the real executor would */
    const char *copy = getenv("FAKE_EXEC_COPY");
    if (copy && *copy == '1' && sendbuf && recvbuf && sendbuf != recvbuf)
        memmove(recvbuf, sendbuf, msg_bytes);
    pthread_mutex_lock(&mu);
    int run = !ex->aborted && stuck(); /* after the abort word a kernel exits at once */
    ex->inflight += run;
    pthread_mutex_unlock(&mu);
    if (run)
        dev_busy(1);
    return MSCX_OK;
}

/* Recorded as "mscx_exec_launch_scaled OP DTYPE host 0xBITS" or "... device POINTER", then launched. */
mscx_status_t mscx_exec_launch_scaled(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf,
                                      void *recvbuf, uint64_t msg_bytes, enum mscx_dtype dtype,
                                      enum mscx_redop op, const struct mscx_scale *scale,
                                      enum mscx_pkt_format pkt, void *stream)
{
    if (scale && scale->kind != MSCX_SCALE_NONE) {
        char what[128];
        if (scale->kind == MSCX_SCALE_HOST)
            snprintf(what, sizeof(what), "mscx_exec_launch_scaled %d %d host 0x%llx", (int)op, (int)dtype,
                     (unsigned long long)scale->value_bits);
        else
            snprintf(what, sizeof(what), "mscx_exec_launch_scaled %d %d device %p", (int)op, (int)dtype,
                     scale->dev_ptr);
        record(what);
    }
    return mscx_exec_launch(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, op, pkt, stream);
}

/* The error a test program injects (test_shim_errors.c). */
static int (*injected_error(void))(void)
{
    return TEST_SYM(int (*)(void), "mscxFakeExecError");
}

mscx_status_t mscx_exec_async_error(struct mscx_exec *ex)
{
    if (!ex)
        return MSCX_ERR_INVALID_ARG;
    int (*injected)(void) = injected_error();
    if (injected && injected() != 0)
        return (mscx_status_t)injected();
    return ex->aborted ? MSCX_ERR_REMOTE : MSCX_OK;
}

/* No word when a test injects errors by function: the shim then asks mscx_exec_async_error() each time. */
const volatile int32_t *mscx_exec_error_word(struct mscx_exec *ex)
{
    return ex && !injected_error() ? (const volatile int32_t *)&ex->error_word : NULL;
}

void mscx_exec_abort(struct mscx_exec *ex)
{
    if (!ex)
        return;
    record("mscx_exec_abort");
    pthread_mutex_lock(&mu);
    int stopped = ex->inflight;
    ex->inflight = 0;
    ex->aborted = 1;
    __atomic_store_n(&ex->error_word, MSCX_ERR_REMOTE, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
    if (stopped)
        dev_busy(-stopped);
}

static void exec_free(struct mscx_exec *ex)
{
    dev_free();
    pthread_mutex_lock(&mu);
    int left = ex->inflight;
    pthread_mutex_unlock(&mu);
    if (left)
        dev_busy(-left);
    free(ex);
}

void mscx_exec_destroy(struct mscx_exec *ex)
{
    if (!ex)
        return;
    record("mscx_exec_destroy");
    exec_free(ex);
    pthread_mutex_lock(&mu);
    struct mscx_exec *d = deferred;
    deferred = NULL;
    pthread_mutex_unlock(&mu);
    while (d) {
        struct mscx_exec *next = d->next_deferred;
        record("mscx_exec_destroy: a deferred executor");
        exec_free(d);
        d = next;
    }
}

void mscx_exec_destroy_deferred(struct mscx_exec *ex)
{
    if (!ex)
        return;
    record("mscx_exec_destroy_deferred");
    mscx_exec_abort(ex);
    pthread_mutex_lock(&mu);
    ex->next_deferred = deferred;
    deferred = ex;
    pthread_mutex_unlock(&mu);
}

mscx_status_t mscx_exec_create_local_group(uint32_t nranks, int cuda_device, struct mscx_exec **execs)
{
    (void)nranks;
    (void)cuda_device;
    (void)execs;
    return MSCX_ERR_UNSUPPORTED;
}
