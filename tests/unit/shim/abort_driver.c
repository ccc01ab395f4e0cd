/* SPDX-License-Identifier: MIT */
/*
 * Abort, revoke and shrink with NCCL_SHRINK_ABORT never wait on the device
 * before the real call. Runs with LD_PRELOAD of the shim built with the
 * fake executor (fake_exec.c), against the fake libnccl with its device
 * model on (FAKE_NCCL_DEV=1, fake_dev.c), a world of one rank
 * (FAKE_NCCL_WORLD) and the shipped plans, so that the communicator's
 * collectives run on our (fake) executor.
 *
 *   abort-spin    a foreign kernel that only the fake's abort ends
 *   abort-timed   a foreign kernel that ends by itself after 2 s
 *   revoke        our kernel in flight; later calls get NCCL's error
 *   shrink        as abort-spin, through ncclCommShrink(NCCL_SHRINK_ABORT)
 *
 * Each: our call returns within 1 s of the fake's own, and the log shows
 * the order: our kernels stopped, then the real call, then our release
 * (deferred, never a blocking free before the real call).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <nccl.h>
#include "shim_check.h"

#define FAKE_IMPORT __attribute__((visibility("default")))
FAKE_IMPORT int mscxFakeDevSpin(int ms);
FAKE_IMPORT long long mscxFakeDevLastStopNs(void);

#define SLACK_NS 1000000000LL

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static char *read_log(void)
{
    static char buf[1 << 16];
    FILE *f = fopen(getenv("FAKE_NCCL_LOG"), "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

static void clear_log(void)
{
    FILE *f = fopen(getenv("FAKE_NCCL_LOG"), "w");
    if (f)
        fclose(f);
}

/* Offset of the first line starting with @p what, or -1. */
static long line_at(const char *log, const char *what)
{
    size_t n = strlen(what);
    for (const char *p = log; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        if (!strncmp(p, what, n) && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
            return p - log;
    return -1;
}

/* The log since clear_log(): @p first, @p real and @p release, each once, in this order. */
static void check_order(const char *real)
{
    const char *log = read_log();
    long stop = line_at(log, "mscx_exec_abort"), call = line_at(log, real);
    long rel = line_at(log, "mscx_exec_destroy_deferred"), blocking = line_at(log, "mscx_exec_destroy");
    if (stop < 0 || call < 0 || rel < 0)
        FAIL("the log lacks our stop, %s or our release:\n%s", real, log);
    else if (!(stop < call && call < rel))
        FAIL("order: expected mscx_exec_abort, then %s, then mscx_exec_destroy_deferred:\n%s", real, log);
    if (blocking >= 0 && blocking < call)
        FAIL("a blocking release ran before %s:\n%s", real, log);
    if (strstr(log, "never became idle"))
        FAIL("something waited on the device that only the real call frees:\n%s", log);
}

/* Our call took @p ours; the fake's own part of it mscxFakeDevLastStopNs(). */
static void check_time(const char *what, long long ours)
{
    long long fake = mscxFakeDevLastStopNs();
    printf("%s: ours %.3f s, the fake NCCL's own %.3f s\n", what, ours / 1e9, fake / 1e9);
    if (ours > fake + SLACK_NS)
        FAIL("%s took %.3f s, the real call alone %.3f s: more than 1 s longer", what, ours / 1e9,
             fake / 1e9);
}

/* A communicator whose allreduce runs on our executor, with one of our kernels in flight. */
static ncclComm_t routed_comm(float *buf)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess || !comm) {
        FAIL("ncclCommInitRank failed");
        return NULL;
    }
    clear_log();
    ncclResult_t r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
    const char *log = read_log();
    if (r != ncclSuccess || line_at(log, "mscx_exec_launch") < 0 || line_at(log, "ncclAllReduce") >= 0) {
        FAIL("the allreduce did not run on our executor (result %d), the test would prove nothing:\n%s",
             (int)r, log);
        return NULL;
    }
    return comm;
}

/* Used by the modes of revoke and shrink, which older headers lack. */
__attribute__((unused)) static void forwarded_with_error(ncclComm_t comm, float *buf, const char *after)
{
    clear_log();
    ncclResult_t r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
    const char *log = read_log();
    if (line_at(log, "ncclAllReduce") < 0 || line_at(log, "mscx_exec_launch") >= 0)
        FAIL("an allreduce after %s was not forwarded to NCCL:\n%s", after, log);
    if (r != ncclInvalidUsage)
        FAIL("an allreduce after %s returned %d, expected NCCL's ncclInvalidUsage", after, (int)r);
}

static void run_abort(int spin_ms)
{
    static float buf[256];
    ncclComm_t comm = routed_comm(buf);
    if (!comm)
        return;
    if (mscxFakeDevSpin(spin_ms) != 0) {
        FAIL("cannot start the foreign kernel");
        return;
    }
    clear_log();
    long long t0 = now_ns();
    ncclResult_t r = ncclCommAbort(comm);
    long long ours = now_ns() - t0;
    if (r != ncclSuccess)
        FAIL("ncclCommAbort returned %d", (int)r);
    check_order("ncclCommAbort");
    check_time("ncclCommAbort", ours);
    if (spin_ms > 0 && mscxFakeDevLastStopNs() < spin_ms * 1000000LL / 2)
        FAIL("the fake's abort did not wait for its kernel: the model is broken");
}

#ifdef NCCL_REVOKE_DEFAULT
static void run_revoke(void)
{
    static float buf[256];
    ncclComm_t comm = routed_comm(buf);
    if (!comm)
        return;
    clear_log();
    long long t0 = now_ns();
    ncclResult_t r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    long long ours = now_ns() - t0;
    if (r != ncclSuccess)
        FAIL("ncclCommRevoke returned %d", (int)r);
    check_order("ncclCommRevoke");
    check_time("ncclCommRevoke", ours);
    forwarded_with_error(comm, buf, "revoke");
    clear_log();
    if (ncclCommDestroy(comm) != ncclSuccess || line_at(read_log(), "ncclCommDestroy") < 0)
        FAIL("ncclCommDestroy after revoke did not reach NCCL");
}
#endif

#ifdef NCCL_SHRINK_ABORT
static void run_shrink(void)
{
    static float buf[256];
    ncclComm_t comm = routed_comm(buf), child = NULL;
    if (!comm)
        return;
    if (mscxFakeDevSpin(0) != 0) {
        FAIL("cannot start the foreign kernel");
        return;
    }
    clear_log();
    long long t0 = now_ns();
    ncclResult_t r = ncclCommShrink(comm, NULL, 0, &child, NULL, NCCL_SHRINK_ABORT);
    long long ours = now_ns() - t0;
    if (r != ncclSuccess || !child)
        FAIL("ncclCommShrink returned %d, child %p", (int)r, (void *)child);
    check_order("ncclCommShrink");
    check_time("ncclCommShrink(NCCL_SHRINK_ABORT)", ours);
    forwarded_with_error(comm, buf, "a shrink with NCCL_SHRINK_ABORT (the parent)");
    if (!child)
        return;
    clear_log();
    r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, child, NULL);
    if (r != ncclSuccess || line_at(read_log(), "mscx_exec_launch") < 0)
        FAIL("the child's allreduce did not run on our executor (%d):\n%s", (int)r, read_log());
    clear_log();
    t0 = now_ns();
    ncclCommAbort(child);
    check_order("ncclCommAbort");
    check_time("ncclCommAbort of the child", now_ns() - t0);
    ncclCommDestroy(comm);
}
#endif

/*
 * A communicator with usable plans that sends a call to NCCL for its size
 * says so at its end at INFO, never WARN (ordinary routing): one summary
 * line with the count (the test runs with MSCX_DEBUG=INFO). The same size in place, at one rank, is
 * answered by the shim and named "identity" among the plans, and so is a
 * datatype no plan takes; ncclAvg in place is NCCL's (it scales).
 */
static void run_fallback_info(void)
{
    static float small[256];
    const char *path = getenv("MSCX_DEBUG_FILE");
    size_t big_count = (size_t)2 << 20; /* 8 MB: above every one-rank plan's range */
    float *big = calloc(2 * big_count, sizeof(float));
    ncclComm_t comm = big && path ? routed_comm(small) : NULL;
    if (!comm) {
        FAIL("no routed communicator, no 8 MB buffer or no MSCX_DEBUG_FILE");
        free(big);
        return;
    }
    if (ncclAllReduce(big, big + big_count, big_count, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess)
        FAIL("the 8 MB allreduce failed");
    clear_log();
    if (ncclAllReduce(big, big, big_count, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess)
        FAIL("the 8 MB allreduce in place failed");
    if (line_at(read_log(), "ncclAllReduce") >= 0 || line_at(read_log(), "mscx_exec_launch") >= 0)
        FAIL("the 8 MB allreduce in place at one rank went to NCCL or to a plan");
    clear_log();
    if (ncclAllReduce(big, big, 128, ncclFloat64, ncclSum, comm, NULL) != ncclSuccess)
        FAIL("the 1 KB fp64 allreduce in place failed");
    if (line_at(read_log(), "ncclAllReduce") >= 0 || line_at(read_log(), "mscx_exec_launch") >= 0)
        FAIL("the fp64 allreduce in place at one rank (no plan takes fp64) went to NCCL or to a plan");
    clear_log();
    if (ncclAllReduce(big, big, big_count, ncclFloat32, ncclAvg, comm, NULL) != ncclSuccess)
        FAIL("the 8 MB ncclAvg allreduce in place failed");
    if (line_at(read_log(), "ncclAllReduce") < 0)
        FAIL("the 8 MB ncclAvg allreduce in place was not forwarded to NCCL:\n%s", read_log());
    ncclCommDestroy(comm);
    free(big);
    FILE *f = fopen(path, "r");
    char line[4096], me[32];
    int warns = 0, found = 0;
    snprintf(me, sizeof(me), ":%ld:", (long)getpid()); /* host:pid:tid: the file may hold earlier runs */
    while (f && fgets(line, sizeof(line), f)) {
        if (!strstr(line, me))
            continue;
        warns += strstr(line, "WARN") != NULL;
        found += strstr(line, "INFO summary at destroy") && strstr(line, "routed 3 fallback 2:") &&
                 strstr(line, "size 2") && strstr(line, "; plans: ") && strstr(line, "identity 2");
    }
    if (f)
        fclose(f);
    if (warns != 0 || found != 1)
        FAIL("expected no WARN and one INFO summary saying 2 calls went to NCCL by size, got %d warnings, %d "
             "such",
             warns, found);
}

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=FILE %s abort-spin|abort-timed|revoke|shrink|fallback-info\n",
                argv[0]);
        return 2;
    }
    const char *world = getenv("FAKE_NCCL_WORLD");
    if (world && *world)
        mkdir(world, 0755); /* the fake's exchange directory; an existing one serves */
    if (!strcmp(argv[1], "abort-spin"))
        run_abort(0);
    else if (!strcmp(argv[1], "abort-timed"))
        run_abort(2000);
    else if (!strcmp(argv[1], "revoke")) {
#ifdef NCCL_REVOKE_DEFAULT
        run_revoke();
#else
        printf("skip: this nccl.h has no ncclCommRevoke\n");
        return 77;
#endif
    } else if (!strcmp(argv[1], "shrink")) {
#ifdef NCCL_SHRINK_ABORT
        run_shrink();
#else
        printf("skip: this nccl.h has no ncclCommShrink\n");
        return 77;
#endif
    } else if (!strcmp(argv[1], "fallback-info"))
        run_fallback_info();
    else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
