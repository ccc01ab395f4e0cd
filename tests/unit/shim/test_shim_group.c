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
 *   mixed      routable, an unroutable dtype, routable: the group goes to
 *              NCCL in issue order
 *   identity   the same unroutable dtype in place, at one rank, changes
 *              nothing: the shim answers it and the group stays routed
 *   send       an ncclSend in the middle, or a communicator not ours: the
 *              group goes to NCCL in issue order
 *   streams    three streams of one communicator are joined on the first
 *   comms      two communicators in one group, each joined on its own streams
 *   nested     only the outermost ncclGroupEnd launches
 *   end-fails  the real ncclGroupEnd fails: the kept calls are dropped
 *   refused    a launch the executor refuses goes to NCCL outside the group;
 *              any other launch error is the group's result
 *   no-events  no event for a join: the group goes to NCCL
 *   simulate   ncclGroupSimulateEnd: the kept calls go to NCCL first, and
 *              the group is over
 *   threads    a group is this thread's: another thread's call launches at once
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
    char rec[2048];
    want_reset(&w);
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 1024, ncclFloat8e4m3, comm, S(1)); /* no mscx type */
    /* through the profiler's name: it reaches NCCL's pncclAllReduce */
    call_ok("pncclAllReduce", pncclAllReduce(bufs[4], bufs[5], 512, ncclFloat32, ncclSum, comm, S(1)));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[0], bufs[1], 256, ncclFloat32, comm, S(1));
    want_nccl_allreduce(&w, bufs[2], bufs[3], 1024, ncclFloat8e4m3, comm, S(1));
    rec_fmt_pncclAllReduce(rec, sizeof(rec), bufs[4], bufs[5], 512, ncclFloat32, ncclSum, comm, S(1));
    want_add(&w, "%s", rec);
    want_add(&w, "ncclGroupEnd");
    check_log("mixed", &w);
    destroy(comm);
    check_summary(comm, 0, " group 2 dtype 1");
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
    want_nccl_allreduce(&w, bufs[0], bufs[1], 256, ncclFloat32, comm, S(1));
    rec_fmt_ncclSend(rec, sizeof(rec), bufs[2], 64, ncclFloat32, 0, comm, S(1));
    want_add(&w, "%s", rec);
    want_nccl_allreduce(&w, bufs[4], bufs[5], 512, ncclFloat32, comm, S(1));
    want_add(&w, "ncclGroupEnd");
    /* a collective on a communicator that is not ours */
    call_ok("ncclGroupStart", ncclGroupStart());
    allreduce(0, 256, ncclFloat32, comm, S(1));
    allreduce(2, 256, ncclFloat32, foreign, S(1));
    allreduce(4, 512, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[0], bufs[1], 256, ncclFloat32, comm, S(1));
    want_nccl_allreduce(&w, bufs[2], bufs[3], 256, ncclFloat32, foreign, S(1));
    want_nccl_allreduce(&w, bufs[4], bufs[5], 512, ncclFloat32, comm, S(1));
    want_add(&w, "ncclGroupEnd");
    check_log("send", &w);
    destroy(comm);
    check_summary(comm, 0, " group 4");
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
    allreduce(2, 512, ncclFloat32, comm, S(2));
    allreduce(4, 768, ncclFloat32, comm, S(1));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    want_add(&w, "ncclGroupStart");
    want_nccl_allreduce(&w, bufs[0], bufs[1], 256, ncclFloat32, comm, S(1));
    want_nccl_allreduce(&w, bufs[2], bufs[3], 512, ncclFloat32, comm, S(2));
    want_nccl_allreduce(&w, bufs[4], bufs[5], 768, ncclFloat32, comm, S(1));
    want_add(&w, "ncclGroupEnd");
    check_log("no-events", &w);
    destroy(comm);
    check_summary(comm, 0, " group 3");
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

static const struct shim_mode modes[] = {
    {"routed", mode_routed},       {"mixed", mode_mixed},     {"identity", mode_identity},
    {"send", mode_send},
    {"streams", mode_streams},     {"comms", mode_comms},     {"nested", mode_nested},
    {"end-fails", mode_end_fails}, {"refused", mode_refused}, {"no-events", mode_no_events},
    {"simulate", mode_simulate},   {"threads", mode_threads},
};

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
