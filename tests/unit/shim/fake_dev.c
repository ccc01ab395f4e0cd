/* SPDX-License-Identifier: MIT */
/*
 * The fake libnccl's device (FAKE_NCCL_DEV=1): a model of the one fact an
 * abort depends on. A CUDA free waits until no kernel runs on the device;
 * a foreign kernel (NCCL's, stuck on a dead peer) may end only when the
 * real abort tells it to; so freeing before the real abort hangs.
 *
 * Kernels are counted: the fake executor's (tests/unit/shim/fake_exec.c)
 * run until its abort word is set, the foreign one (mscxFakeDevSpin) until
 * the fake's ncclCommAbort, ncclCommRevoke or ncclCommShrink with
 * NCCL_SHRINK_ABORT, or, when timed, for its time whatever NCCL does. mscxFakeDevWaitIdle is the CUDA
 * free: it waits for no kernel, at most FAKE_NCCL_IDLE_MS (default 5000,
 * then it says so in the log). The fake's abort does what NCCL's does: it
 * stops its own kernel and waits for the device to be idle.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_nccl.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int busy;        /* kernels running */
static int foreign_end; /* the foreign kernel must end */
static long long last_stop_ns;
static ncclComm_t revoked[64];
static int nrevoked;
static __thread ncclResult_t next_result; /* the result of the call whose hook ran, when not ncclSuccess */

static int dev_on(void)
{
    const char *s = getenv("FAKE_NCCL_DEV");
    return s && *s == '1';
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void deadline_in(struct timespec *ts, long long ns)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long t = (long long)ts->tv_nsec + ns;
    ts->tv_sec += (time_t)(t / 1000000000LL);
    ts->tv_nsec = (long)(t % 1000000000LL);
}

FAKE_EXPORT void mscxFakeDevBusy(int delta)
{
    pthread_mutex_lock(&mu);
    busy += delta;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

FAKE_EXPORT int mscxFakeDevWaitIdle(void)
{
    const char *s = getenv("FAKE_NCCL_IDLE_MS");
    long long limit = (s && *s ? atoll(s) : 5000) * 1000000LL;
    struct timespec ts;
    deadline_in(&ts, limit);
    int rc = 0;
    pthread_mutex_lock(&mu);
    while (busy > 0 && rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &ts);
    int idle = busy <= 0;
    pthread_mutex_unlock(&mu);
    if (!idle)
        fake_record("fake: the device never became idle (a real free would hang here)");
    return idle ? 0 : -1;
}

static void *foreign_kernel(void *arg)
{
    long long ms = (long long)(intptr_t)arg;
    struct timespec ts;
    deadline_in(&ts, (ms > 0 ? ms : 3600000LL) * 1000000LL);
    int rc = 0;
    pthread_mutex_lock(&mu);
    while ((ms > 0 || !foreign_end) && rc == 0) /* a timed kernel ends by itself, whatever NCCL does */
        rc = pthread_cond_timedwait(&cv, &mu, &ts);
    busy--;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return NULL;
}

FAKE_EXPORT int mscxFakeDevSpin(int ms)
{
    pthread_t t;
    pthread_mutex_lock(&mu);
    busy++;
    foreign_end = 0;
    pthread_mutex_unlock(&mu);
    if (pthread_create(&t, NULL, foreign_kernel, (void *)(intptr_t)ms) != 0) {
        mscxFakeDevBusy(-1);
        return -1;
    }
    pthread_detach(t);
    return 0;
}

/* How long the fake's last abort, revoke or shrink with abort took. */
FAKE_EXPORT long long mscxFakeDevLastStopNs(void)
{
    pthread_mutex_lock(&mu);
    long long ns = last_stop_ns;
    pthread_mutex_unlock(&mu);
    return ns;
}

/* NCCL's abort: end its own kernel, then free, which waits for the device. */
static void fake_stop(ncclComm_t comm)
{
    long long t0 = now_ns();
    pthread_mutex_lock(&mu);
    foreign_end = 1;
    pthread_cond_broadcast(&cv);
    if (nrevoked < (int)(sizeof(revoked) / sizeof(revoked[0])))
        revoked[nrevoked++] = comm;
    pthread_mutex_unlock(&mu);
    mscxFakeDevWaitIdle();
    pthread_mutex_lock(&mu);
    last_stop_ns = now_ns() - t0;
    pthread_mutex_unlock(&mu);
}

ncclResult_t fake_dev_result(void)
{
    ncclResult_t r = next_result;
    next_result = ncclSuccess;
    return r;
}

void fake_hook_ncclCommAbort(ncclComm_t comm)
{
    if (dev_on())
        fake_stop(comm);
}

void fake_hook_ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    (void)revokeFlags;
    if (dev_on())
        fake_stop(comm);
}

void fake_dev_shrink(ncclComm_t comm, int shrinkFlags)
{
#ifdef NCCL_SHRINK_ABORT
    if (dev_on() && (shrinkFlags & NCCL_SHRINK_ABORT))
        fake_stop(comm);
#else
    (void)comm;
    (void)shrinkFlags;
#endif
}

/* A revoked or aborted communicator refuses new collectives, as NCCL's does. */
void fake_hook_ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff;
    (void)recvbuff;
    (void)count;
    (void)datatype;
    (void)op;
    (void)stream;
    if (!dev_on())
        return;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nrevoked; i++)
        if (revoked[i] == comm)
            next_result = ncclInvalidUsage;
    pthread_mutex_unlock(&mu);
}
