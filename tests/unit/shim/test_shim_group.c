/* SPDX-License-Identifier: MIT */
/*
 * Collectives inside ncclGroupStart/End under the shim built with the fake
 * executor (fake_exec.c), against the fake libnccl with its CUDA events
 * (fake_cuda.c), a world of one rank and the shipped plans, so that the
 * collectives that route run on our (fake) executor. Each mode checks the
 * exact sequence of FAKE_NCCL_LOG (NCCL calls, launches, event records and
 * waits) and the communicator's summary (MSCX_DEBUG_FILE):
 *
 *   routed     four routable collectives are kept and launched, in issue
 *              order, after the real ncclGroupEnd; none reaches NCCL
 *   mixed      routable, an unroutable dtype, routable: each call routes
 *              on its own; the first launches before NCCL's group end,
 *              the last after it
 *   identity   the same unroutable dtype in place, at one rank, changes
 *              nothing: the shim answers it and the group stays routed
 *   send       an ncclSend in the middle, or a communicator not ours:
 *              that call goes to NCCL, the collectives still route
 *   order      two communicators, an NCCL-bound call on one: only that
 *              one's later kept calls launch after NCCL's group end
 *   streams    three streams of one communicator are joined on the first
 *   comms      two communicators in one group, each joined on its own streams
 *   nested     only the outermost ncclGroupEnd launches
 *   end-fails  the real ncclGroupEnd fails: the kept calls are dropped
 *   refused    a launch the executor refuses goes to NCCL outside the group;
 *              any other launch error is the group's result
 *   no-events  no event for a join: that call fails with an error, the
 *              others run
 *   simulate   ncclGroupSimulateEnd: the kept calls go to NCCL first, and
 *              the group is over
 *   threads    a group is this thread's: another thread's call launches at once
 *   nonblocking  a group that creates a non-blocking communicator and
 *              issues routable collectives on a ready non-blocking one:
 *              the real ncclGroupEnd answers ncclInProgress, and every
 *              kept call still runs (its result checked)
 *
 * The ranks modes run the communicators of ncclCommInitAll as ranks on
 * threads of one process (FAKE_NCCL_LOCAL=1), each rank grouping its calls
 * its own way; every rank's summary must show the same route for each call:
 *
 *   ranks-split  2 ranks, communicators A and B: rank 0 runs group{AR(A)}
 *                then AR(B, fp64), rank 1 group{AR(A), AR(B, fp64)}
 *   ranks-p2p    4 ranks: each runs group{send/recv between ranks 0 and 1
 *                only, AR 1 KB}
 *   ranks-comms  2 ranks, one group with a call on A and one on B of
 *                another dtype, in opposite orders on the two ranks
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/status.h"
#include "rec_gen.h"
#include "shim_check.h"

#define S(n) ((cudaStream_t)(uintptr_t)(0x5000 + 0x100 * (n)))
#define MAX_WANT 32
#define LINE_MAX_LEN 256

static float bufs[8][1024];

/* ---- the fake executor's launch results, by size ---- */

static uint64_t refuse_bytes, fail_bytes;

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    if (bytes == refuse_bytes)
        return MSCX_ERR_INVALID_ARG;
    if (bytes == fail_bytes)
        return MSCX_ERR_CUDA;
    return MSCX_OK;
}

/* ---- the logs ---- */

/* The expected log lines since fake_log_clear(). */
struct want {
    char line[MAX_WANT][LINE_MAX_LEN];
    int n;
};

static void want_reset(struct want *w)
{
    w->n = 0;
}

static void want_add(struct want *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void want_add(struct want *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (w->n < MAX_WANT)
        vsnprintf(w->line[w->n++], LINE_MAX_LEN, fmt, ap);
    va_end(ap);
}

static void want_nccl_allreduce(struct want *w, const void *send, void *recv, size_t count, ncclDataType_t dt,
                                ncclComm_t comm, cudaStream_t stream)
{
    char rec[2048];
    rec_fmt_ncclAllReduce(rec, sizeof(rec), send, recv, count, dt, ncclSum, comm, stream);
    want_add(w, "%s", rec);
}

static void want_launch(struct want *w, uint64_t bytes, cudaStream_t stream)
{
    want_add(w, "mscx_exec_launch %llu %p", (unsigned long long)bytes, (void *)stream);
}

/* The log since fake_log_clear() must be exactly @p w, line by line. */
static void check_log(const char *what, const struct want *w)
{
    check_log_lines(what, w->line[0], LINE_MAX_LEN, w->n);
}

/*
 * The summary line of @p comm (at its destroy) must show @p routed calls
 * routed and @p reasons (" reasons:" and the counts) last but for the plans
 * that ran the calls ("; plans: ...").
 */
static void check_summary(ncclComm_t comm, int routed, const char *reasons)
{
    char *line = summary_line(comm);
    if (!line)
        return;
    char info[64], warn[64];
    snprintf(info, sizeof(info), ": routed %d fallback", routed);
    snprintf(warn, sizeof(warn), ": routed %d, sent", routed);
    char *r = strstr(line, " reasons:");
    const char *tail = r ? r + strlen(" reasons:") : "";
    const char *hint = strstr(tail, " ("), *plans = strstr(tail, "; plans:");
    if (plans && (!hint || plans < hint))
        hint = plans;
    size_t len = hint ? (size_t)(hint - tail) : strlen(tail);
    if ((!strstr(line, info) && !strstr(line, warn)) || len != strlen(reasons) ||
        strncmp(tail, reasons, len) != 0)
        FAIL("summary of comm %p: expected routed %d and reasons:%s, got: %s", (void *)comm, routed, reasons,
             line);
}

/* ---- calls ---- */

static void call_ok(const char *what, ncclResult_t r)
{
    if (r != ncclSuccess)
        FAIL("%s returned %d (%s)", what, (int)r, ncclGetLastError(NULL));
}

/* An fp32 sum allreduce of @p count elements in buffers @p b; its result checked. */
static void allreduce(int b, size_t count, ncclDataType_t dt, ncclComm_t comm, cudaStream_t stream)
{
    call_ok("ncclAllReduce", ncclAllReduce(bufs[b], bufs[b + 1], count, dt, ncclSum, comm, stream));
}

static void destroy(ncclComm_t comm)
{
    call_ok("ncclCommDestroy", ncclCommDestroy(comm));
}

/* ---- modes ---- */

/* A mode's start: a communicator of its own, nothing expected yet, the log empty. */
static ncclComm_t mode_begin(struct want *w)
{
    ncclComm_t comm = new_comm();
    want_reset(w);
    fake_log_clear();
    return comm;
}

static void mode_routed(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    call_ok("ncclAllGather", ncclAllGather(bufs[2], bufs[3], 256, ncclFloat32, comm, S(1)));
    call_ok("ncclReduceScatter", ncclReduceScatter(bufs[4], bufs[5], 768, ncclFloat32, ncclSum, comm, S(1)));
    /* an argument error is the call's answer, as outside a group; the group goes on */
    if (ncclAllReduce(bufs[0], bufs[1], 256, (ncclDataType_t)-1, ncclSum, comm, S(1)) != ncclInvalidArgument)
        FAIL("a bad datatype in a group was not refused at the call");
    allreduce(6, 1024, ncclFloat32, comm, S(1));
    want_add(&w, "ncclGroupStart");
    check_log("routed, before ncclGroupEnd", &w);
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 1024, S(1));
    want_launch(&w, 1024, S(1));
    want_launch(&w, 3072, S(1));
    want_launch(&w, 4096, S(1));
    check_log("routed", &w);
    destroy(comm);
    check_summary(comm, 4, "");
}

static void mode_mixed(void)
{
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 24, 0)
    printf("skip: the call no plan takes is an fp8 one, which this nccl.h lacks\n");
    exit(77);
#else
    ncclComm_t comm = new_comm();
    struct want w;
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 1024, ncclFloat8e4m3, comm, S(1)); /* no mscx type */
    /* through the profiler's name: it reaches NCCL's pncclAllReduce */
    call_ok("pncclAllReduce", pncclAllReduce(bufs[4], bufs[5], 512, ncclFloat32, ncclSum, comm, S(1)));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[2], bufs[3], 1024, ncclFloat8e4m3, comm, S(1));
    want_launch(&w, 1024, S(1));
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 2048, S(1));
    check_log("mixed", &w);
    destroy(comm);
    check_summary(comm, 2, " dtype 1");
#endif
}

static void mode_identity(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    call_ok("ncclAllReduce", ncclAllReduce(bufs[2], bufs[2], 512, ncclFloat64, ncclSum, comm, S(1)));
    allreduce(4, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 1024, S(1));
    want_launch(&w, 2048, S(1));
    check_log("identity", &w);
    destroy(comm);
    check_summary(comm, 3, "");
    char *line = summary_line(comm);
    if (line && !strstr(line, " identity 1"))
        FAIL("the summary does not name the call answered in place: %s", line);
}

static void mode_send(void)
{
    ncclComm_t comm = new_comm();
    ncclComm_t foreign = (ncclComm_t)(uintptr_t)0x7f00dead0000ull;
    struct want w;
    char rec[2048];
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    call_ok("ncclSend", ncclSend(bufs[2], 64, ncclFloat32, 0, comm, S(1)));
    allreduce(4, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    rec_fmt_ncclSend(rec, sizeof(rec), bufs[2], 64, ncclFloat32, 0, comm, S(1));
    want_add(&w, "%s", rec);
    want_launch(&w, 1024, S(1));
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 2048, S(1));
    /* a collective on a communicator that is not ours */
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 256, ncclFloat32, foreign, S(1));
    allreduce(4, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[2], bufs[3], 256, ncclFloat32, foreign, S(1));
    want_launch(&w, 1024, S(1)); /* nothing of their communicator went to NCCL: both before NCCL's end */
    want_launch(&w, 2048, S(1));
    want_add(&w, "ncclGroupEnd");
    check_log("send", &w);
    destroy(comm);
    check_summary(comm, 4, "");
}

static void mode_order(void)
{
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 24, 0)
    printf("skip: the call no plan takes is an fp8 one, which this nccl.h lacks\n");
    exit(77);
#else
    ncclComm_t a = new_comm(), b = new_comm();
    struct want w;
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, a, S(1));
    allreduce(2, 1024, ncclFloat8e4m3, b, S(1)); /* NCCL's */
    allreduce(4, 512, ncclFloat32, b, S(1));
    allreduce(6, 768, ncclFloat32, a, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[2], bufs[3], 1024, ncclFloat8e4m3, b, S(1));
    want_launch(&w, 1024, S(1));
    want_launch(&w, 3072, S(1));
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 2048, S(1));
    check_log("order", &w);
    destroy(a);
    destroy(b);
    check_summary(a, 2, "");
    check_summary(b, 1, " dtype 1");
#endif
}

static void mode_streams(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    for (int round = 0; round < 2; round++) {
        call_ok("ncclGroupStart", ncclGroupStart());
        allreduce(0, 256, ncclFloat32, comm, S(1));
        allreduce(2, 512, ncclFloat32, comm, S(2));
        allreduce(4, 768, ncclFloat32, comm, S(1));
        allreduce(6, 1024, ncclFloat32, comm, S(3));
        call_ok("ncclGroupEnd", ncclGroupEnd());
        want_add(&w, "ncclGroupStart");
        if (round == 0)
            want_add(&w, "cudaEventCreate ev0 0"); /* once per thread and device */
        want_add(&w, "ncclGroupEnd");
        want_add(&w, "cudaEventRecord ev0 %p", (void *)S(2));
        want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(1));
        want_add(&w, "cudaEventRecord ev0 %p", (void *)S(3));
        want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(1));
        for (int k = 1; k <= 4; k++)
            want_launch(&w, 1024 * k, S(1));
        want_add(&w, "cudaEventRecord ev0 %p", (void *)S(1));
        want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(2));
        want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(3));
    }
    check_log("streams", &w);
    destroy(comm);
    check_summary(comm, 8, "");
}

static void mode_comms(void)
{
    ncclComm_t a = new_comm(), b = new_comm();
    struct want w;
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, a, S(1));
    allreduce(2, 512, ncclFloat32, b, S(5));
    allreduce(4, 768, ncclFloat32, a, S(2));
    allreduce(6, 1024, ncclFloat32, b, S(5));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "cudaEventCreate ev0 0");
    want_add(&w, "ncclGroupEnd");
    want_add(&w, "cudaEventRecord ev0 %p", (void *)S(2));
    want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(1));
    want_launch(&w, 1024, S(1));
    want_launch(&w, 2048, S(5));
    want_launch(&w, 3072, S(1));
    want_launch(&w, 4096, S(5));
    want_add(&w, "cudaEventRecord ev0 %p", (void *)S(1));
    want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(2));
    check_log("comms", &w);
    destroy(a);
    destroy(b);
    check_summary(a, 2, "");
    check_summary(b, 2, "");
}

struct other_thread {
    ncclComm_t comm;
    ncclResult_t res;
};

static void *other_main(void *arg)
{
    struct other_thread *t = arg;
    t->res = ncclAllReduce(bufs[2], bufs[3], 512, ncclFloat32, ncclSum, t->comm, S(2));
    return NULL;
}

static void mode_threads(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    /* another thread is in no group: its call launches at once */
    struct other_thread t = {comm, ncclInternalError};
    pthread_t tid;
    if (pthread_create(&tid, NULL, other_main, &t) != 0 || pthread_join(tid, NULL) != 0)
        FAIL("cannot run the other thread");
    call_ok("the other thread's ncclAllReduce", t.res);
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_launch(&w, 2048, S(2));
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 1024, S(1));
    check_log("threads", &w);
    destroy(comm);
    check_summary(comm, 2, "");
}

static void mode_nested(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(2, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupEnd");
    check_log("nested, after the inner ncclGroupEnd", &w);
    allreduce(4, 768, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 1024, S(1));
    want_launch(&w, 2048, S(1));
    want_launch(&w, 3072, S(1));
    /* the group is over: a call launches at once */
    allreduce(6, 1024, ncclFloat32, comm, S(1));
    want_launch(&w, 4096, S(1));
    check_log("nested", &w);
    destroy(comm);
    check_summary(comm, 4, "");
}

static void mode_end_fails(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 512, ncclFloat32, comm, S(2));
    setenv("FAKE_NCCL_RESULT", "2", 1); /* the fake's ncclGroupEnd fails with ncclSystemError */
    ncclResult_t r = ncclGroupEnd();
    unsetenv("FAKE_NCCL_RESULT");
    if (r != ncclSystemError)
        FAIL("ncclGroupEnd returned %d, expected the real one's ncclSystemError", (int)r);
    want_add(&w, "ncclGroupStart");
    want_add(&w, "cudaEventCreate ev0 0");
    want_add(&w, "ncclGroupEnd");
    /* nothing kept is left: the next call and the next group run alone */
    allreduce(4, 768, ncclFloat32, comm, S(1));
    want_launch(&w, 3072, S(1));
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(6, 1024, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 4096, S(1));
    check_log("end-fails", &w);
    destroy(comm);
    check_summary(comm, 2, "");
}

static void mode_refused(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    refuse_bytes = 2048;
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 512, ncclFloat32, comm, S(2));
    allreduce(4, 768, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "cudaEventCreate ev0 0");
    want_add(&w, "ncclGroupEnd");
    want_add(&w, "cudaEventRecord ev0 %p", (void *)S(2));
    want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(1));
    want_launch(&w, 1024, S(1));
    want_add(&w, "mscx_exec_launch_failed 2048 %p", (void *)S(1));
    /* to NCCL outside the group, in its place on the joined stream */
    want_nccl_allreduce(&w, bufs[2], bufs[3], 512, ncclFloat32, comm, S(1));
    want_launch(&w, 3072, S(1));
    want_add(&w, "cudaEventRecord ev0 %p", (void *)S(1));
    want_add(&w, "cudaStreamWaitEvent %p ev0", (void *)S(2));
    /* any other launch error is the group's result; the other calls still run */
    fail_bytes = 1024;
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(4, 768, ncclFloat32, comm, S(1));
    ncclResult_t r = ncclGroupEnd();
    if (r != ncclUnhandledCudaError || !strstr(ncclGetLastError(NULL), "launch failed"))
        FAIL("a failed launch at ncclGroupEnd returned %d (%s), expected ncclUnhandledCudaError", (int)r,
             ncclGetLastError(NULL));
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupEnd");
    want_add(&w, "mscx_exec_launch_failed 1024 %p", (void *)S(1));
    want_launch(&w, 3072, S(1));
    check_log("refused", &w);
    destroy(comm);
    check_summary(comm, 3, " launch 1");
}

static void mode_no_events(void)
{
    struct want w;
    ncclComm_t comm = mode_begin(&w);
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    /* a rank-local failure is this call's error, never a different route: nothing ran */
    ncclResult_t r = ncclAllReduce(bufs[2], bufs[3], 512, ncclFloat32, ncclSum, comm, S(2));
    if (r != ncclUnhandledCudaError || !strstr(ncclGetLastError(NULL), "no CUDA event"))
        FAIL("a call with no event for its join returned %d (%s), expected ncclUnhandledCudaError", (int)r,
             ncclGetLastError(NULL));
    allreduce(4, 768, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_add(&w, "ncclGroupEnd");
    want_launch(&w, 1024, S(1));
    want_launch(&w, 3072, S(1));
    check_log("no-events", &w);
    destroy(comm);
    check_summary(comm, 2, "");
}

static void mode_simulate(void)
{
#ifndef NCCL_SIM_INFO_INITIALIZER
    printf("skip: this nccl.h has no ncclGroupSimulateEnd\n");
    exit(77);
#else
    ncclComm_t comm = new_comm();
    struct want w;
    char rec[2048];
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupSimulateEnd", ncclGroupSimulateEnd(&info));
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[0], bufs[1], 256, ncclFloat32, comm, S(1));
    want_nccl_allreduce(&w, bufs[2], bufs[3], 512, ncclFloat32, comm, S(1));
    ncclSimInfo_t *infop = &info;
    rec_fmt_ncclGroupSimulateEnd(rec, sizeof(rec), infop);
    want_add(&w, "%s", rec);
    /* the group is over */
    allreduce(4, 768, ncclFloat32, comm, S(1));
    want_launch(&w, 3072, S(1));
    check_log("simulate", &w);
    destroy(comm);
    check_summary(comm, 1, " group 2");
#endif
}

/* The helpers of mode_nonblocking, whose calls older headers lack. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
/* A non-blocking communicator of one rank, its init completed (polled as NCCL's users must). */
static ncclComm_t new_nonblocking(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess)
        r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    if (r != ncclInProgress || !comm) {
        FAIL("a non-blocking init answered %d, expected ncclInProgress", (int)r);
        exit(1);
    }
    ncclResult_t async = ncclInProgress;
    for (int polls = 0; async == ncclInProgress && polls < 1000; polls++)
        if (ncclCommGetAsyncError(comm, &async) != ncclSuccess)
            async = ncclInternalError;
    if (async != ncclSuccess)
        FAIL("the non-blocking init never completed: %d", (int)async);
    return comm;
}

/* The offset of @p line in the fake's log (-1: absent). */
static long log_at(const char *line)
{
    const char *log = read_file(getenv("FAKE_NCCL_LOG"));
    const char *p = log ? strstr(log, line) : NULL;
    return p ? (long)(p - log) : -1;
}

static void fill(int b, float base)
{
    for (int i = 0; i < 1024; i++) {
        bufs[b][i] = base + (float)i;
        bufs[b + 1][i] = 0;
    }
}

static void check_copied(int b, size_t count)
{
    if (memcmp(bufs[b], bufs[b + 1], count * sizeof(float)) != 0)
        FAIL("the allreduce in buffers %d never ran: its output is not its input", b);
}
#endif

static void mode_nonblocking(void)
{
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 24, 0)
    printf("skip: the call no plan takes is an fp8 one, which this nccl.h lacks\n");
    exit(77);
#else
    ncclComm_t a = new_nonblocking();
    allreduce(6, 256, ncclFloat32, a, S(1)); /* its setup runs at its first collective outside a group */
    fill(0, 1.0f);
    fill(2, 5000.0f);
    fill(4, 9000.0f);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, a, S(1));
    ncclComm_t b = NULL;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclGetUniqueId(&id);
    ncclResult_t r = ncclCommInitRankConfig(&b, 1, id, 0, &config);
    if (r != ncclSuccess && r != ncclInProgress)
        FAIL("a non-blocking init in a group answered %d", (int)r);
    allreduce(2, 1024, ncclFloat8e4m3, a, S(1)); /* no mscx type: NCCL's, in NCCL's group */
    allreduce(4, 512, ncclFloat32, a, S(1));
    setenv("FAKE_NCCL_RESULT", "7", 1); /* the real ncclGroupEnd answers ncclInProgress */
    r = ncclGroupEnd();
    unsetenv("FAKE_NCCL_RESULT");
    if (r != ncclInProgress)
        FAIL("ncclGroupEnd returned %d, expected the real one's ncclInProgress", (int)r);
    char first[LINE_MAX_LEN], last[LINE_MAX_LEN];
    snprintf(first, sizeof(first), "mscx_exec_launch 1024 %p", (void *)S(1));
    snprintf(last, sizeof(last), "mscx_exec_launch 2048 %p", (void *)S(1));
    long end = log_at("ncclGroupEnd"), at_first = log_at(first), at_last = log_at(last);
    if (end < 0 || at_first < 0 || at_last < 0 || at_first > end || at_last < end)
        FAIL("the kept calls did not launch around ncclGroupEnd (offsets %ld, %ld, %ld)", at_first, end,
             at_last);
    check_copied(0, 256);
    check_copied(4, 512);
    if (b)
        destroy(b);
    destroy(a);
    check_summary(a, 3, " dtype 1");
#endif
}

/* ---- several ranks on threads ---- */

#define MAX_RANKS 4

struct rank_job {
    int rank, nranks;
    ncclComm_t a, b; /* this rank's communicators */
    void (*body)(const struct rank_job *);
};

static float rank_bufs[MAX_RANKS][4][1024];

static void init_all(ncclComm_t *comms, int n)
{
    int devs[MAX_RANKS] = {0, 1, 2, 3};
    if (ncclCommInitAll(comms, n, devs) != ncclSuccess) {
        FAIL("ncclCommInitAll of %d failed", n);
        exit(1);
    }
}

static void *rank_main(void *arg)
{
    const struct rank_job *j = arg;
    j->body(j);
    return NULL;
}

/* @p body on @p n ranks at once, rank r on communicators a[r] and b[r] (b may be NULL). */
static void run_ranks(int n, const ncclComm_t *a, const ncclComm_t *b, void (*body)(const struct rank_job *))
{
    struct rank_job jobs[MAX_RANKS];
    pthread_t tid[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (struct rank_job){r, n, a[r], b ? b[r] : NULL, body};
        if (pthread_create(&tid[r], NULL, rank_main, &jobs[r]) != 0) {
            FAIL("cannot start rank %d", r);
            exit(1);
        }
    }
    for (int r = 0; r < n; r++)
        pthread_join(tid[r], NULL);
}

/* An allreduce of 1 KB (fp32, routable) or of fp64 (no plan takes its sum) by @p j on @p comm. */
static void rank_allreduce(const struct rank_job *j, int fp64, ncclComm_t comm)
{
    float *send = rank_bufs[j->rank][fp64 ? 2 : 0], *recv = rank_bufs[j->rank][fp64 ? 3 : 1];
    call_ok("ncclAllReduce",
            ncclAllReduce(send, recv, 256, fp64 ? ncclFloat64 : ncclFloat32, ncclSum, comm, S(1)));
}

static void split_body(const struct rank_job *j)
{
    call_ok("ncclGroupStart", ncclGroupStart());
    rank_allreduce(j, 0, j->a);
    if (j->rank == 1)
        rank_allreduce(j, 1, j->b);
    call_ok("ncclGroupEnd", ncclGroupEnd());
    if (j->rank == 0)
        rank_allreduce(j, 1, j->b);
}

static void p2p_body(const struct rank_job *j)
{
    call_ok("ncclGroupStart", ncclGroupStart());
    if (j->rank < 2) { /* a neighbour exchange where ranks 2 and 3 have no peer */
        int peer = 1 - j->rank;
        call_ok("ncclSend", ncclSend(rank_bufs[j->rank][2], 64, ncclFloat32, peer, j->a, S(1)));
        call_ok("ncclRecv", ncclRecv(rank_bufs[j->rank][3], 64, ncclFloat32, peer, j->a, S(1)));
    }
    rank_allreduce(j, 0, j->a);
    call_ok("ncclGroupEnd", ncclGroupEnd());
}

static void comms_body(const struct rank_job *j)
{
    call_ok("ncclGroupStart", ncclGroupStart());
    rank_allreduce(j, j->rank == 1, j->rank == 1 ? j->b : j->a);
    rank_allreduce(j, j->rank == 0, j->rank == 0 ? j->b : j->a);
    call_ok("ncclGroupEnd", ncclGroupEnd());
}

/* Destroy the @p n ranks of @p comms; each one's summary must show @p routed calls routed and @p reasons. */
static void same_on_ranks(const ncclComm_t *comms, int n, int routed, const char *reasons)
{
    for (int r = 0; r < n; r++)
        destroy(comms[r]);
    for (int r = 0; r < n; r++)
        check_summary(comms[r], routed, reasons);
}

static void mode_ranks_split(void)
{
    ncclComm_t a[2], b[2];
    init_all(a, 2);
    init_all(b, 2);
    run_ranks(2, a, b, split_body);
    same_on_ranks(a, 2, 1, "");
    same_on_ranks(b, 2, 0, " op 1"); /* fp64: no plan takes its sum */
}

static void mode_ranks_p2p(void)
{
    ncclComm_t c[4];
    init_all(c, 4);
    run_ranks(4, c, NULL, p2p_body);
    same_on_ranks(c, 4, 1, "");
}

static void mode_ranks_comms(void)
{
    ncclComm_t a[2], b[2];
    init_all(a, 2);
    init_all(b, 2);
    run_ranks(2, a, b, comms_body);
    same_on_ranks(a, 2, 1, "");
    same_on_ranks(b, 2, 0, " op 1"); /* fp64: no plan takes its sum */
}

static const struct shim_mode modes[] = {
    {"routed", mode_routed},
    {"mixed", mode_mixed},
    {"identity", mode_identity},
    {"send", mode_send},
    {"order", mode_order},
    {"streams", mode_streams},
    {"comms", mode_comms},
    {"nested", mode_nested},
    {"end-fails", mode_end_fails},
    {"refused", mode_refused},
    {"no-events", mode_no_events},
    {"simulate", mode_simulate},
    {"threads", mode_threads},
    {"nonblocking", mode_nonblocking},
    {"ranks-split", mode_ranks_split},
    {"ranks-p2p", mode_ranks_p2p},
    {"ranks-comms", mode_ranks_comms},
};

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
