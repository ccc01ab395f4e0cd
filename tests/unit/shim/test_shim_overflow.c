/* SPDX-License-Identifier: MIT */
/*
 * Counts whose byte size overflows a size_t, at every entry point: each
 * call returns ncclInvalidArgument with the reason in ncclGetLastError, and
 * nothing reaches the fake NCCL or our executor. Run with the shim preloaded
 * and FAKE_NCCL_LOG set; one mode per run:
 *
 *   routed   the shim built with the fake executor (fake_exec.c), a world of
 *            one rank and the shipped plans: a small AllReduce first runs on
 *            the executor (else the test would prove nothing)
 *   ranks    FAKE_NCCL_NRANKS=4, no plans: 2^61 fp32 elements (2^63 bytes)
 *            fit for AllReduce and Broadcast, which reach NCCL, but not
 *            times 4 ranks for AllGather, ReduceScatter and AlltoAll
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <nccl.h>

#include "shim_check.h"

#define HUGE_COUNT (((size_t)1 << 62) + 256) /* x 4 bytes wraps to 1,024 */

static float buf[1024];

/* One call with @p count elements: @p is_call names it for the messages. */
static ncclResult_t call(const char *name, ncclComm_t comm, size_t count)
{
    if (!strcmp(name, "ncclAllReduce"))
        return ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
    if (!strcmp(name, "ncclAllGather"))
        return ncclAllGather(buf, buf, count, ncclFloat32, comm, NULL);
    if (!strcmp(name, "ncclReduceScatter"))
        return ncclReduceScatter(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
    if (!strcmp(name, "ncclBroadcast"))
        return ncclBroadcast(buf, buf, count, ncclFloat32, 0, comm, NULL);
    if (!strcmp(name, "ncclBcast"))
        return ncclBcast(buf, count, ncclFloat32, 0, comm, NULL);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (!strcmp(name, "ncclAlltoAll"))
        return ncclAlltoAll(buf, buf, count, ncclFloat32, comm, NULL);
#endif
    if (!strcmp(name, "ncclSend"))
        return ncclSend(buf, count, ncclFloat32, 0, comm, NULL);
    if (!strcmp(name, "ncclRecv"))
        return ncclRecv(buf, count, ncclFloat32, 0, comm, NULL);
    FAIL("no call %s", name);
    return ncclInternalError;
}

static void expect_refused(const char *name, ncclComm_t comm, size_t count, int in_group)
{
    fake_log_clear();
    if (in_group && ncclGroupStart() != ncclSuccess)
        FAIL("%s: ncclGroupStart failed", name);
    ncclResult_t r = call(name, comm, count);
    const char *why = ncclGetLastError(comm);
    if (r != ncclInvalidArgument)
        FAIL("%s(count %zu)%s returned %d, not ncclInvalidArgument", name, count,
             in_group ? " in a group" : "", (int)r);
    if (!why || !strstr(why, name) || !strstr(why, "overflows"))
        FAIL("%s: ncclGetLastError says \"%s\", not the overflow", name, why ? why : "(null)");
    if (in_group && ncclGroupEnd() != ncclSuccess)
        FAIL("%s: the group's end failed", name);
    if (fake_got(name) || fake_got("mscx_exec_launch"))
        FAIL("%s(count %zu) reached NCCL or the executor:\n%s", name, count,
             read_file(getenv("FAKE_NCCL_LOG")));
    printf("%s count %zu%s: ncclInvalidArgument, \"%s\"\n", name, count, in_group ? " (group)" : "", why);
}

static ncclComm_t init(int nranks)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, nranks, id, 0) != ncclSuccess || !comm)
        FAIL("ncclCommInitRank failed");
    return comm;
}

static const char *const all_calls[] = {
    "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast",
    "ncclBcast",     "ncclSend",      "ncclRecv",
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    "ncclAlltoAll",
#endif
};
#define NCALLS (sizeof(all_calls) / sizeof(all_calls[0]))

static void run_routed(void)
{
    ncclComm_t comm = init(1);
    if (!comm)
        return;
    fake_log_clear();
    if (ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
        !fake_got("mscx_exec_launch"))
        FAIL("a 1 KB allreduce did not run on our executor, the test would prove nothing:\n%s",
             read_file(getenv("FAKE_NCCL_LOG")));
    for (size_t i = 0; i < NCALLS; i++) {
        expect_refused(all_calls[i], comm, HUGE_COUNT, 0);
        expect_refused(all_calls[i], comm, SIZE_MAX, 1);
    }
    ncclCommDestroy(comm);
}

static void run_ranks(void)
{
    ncclComm_t comm = init(4);
    size_t count = (size_t)1 << 61; /* 2^63 bytes of fp32: fits once, not 4 times */
    if (!comm)
        return;
    expect_refused("ncclAllGather", comm, count, 0);
    expect_refused("ncclReduceScatter", comm, count, 0);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    expect_refused("ncclAlltoAll", comm, count, 0);
#endif
    static const char *const whole[] = {"ncclAllReduce", "ncclBroadcast"};
    for (int i = 0; i < 2; i++) {
        fake_log_clear();
        ncclResult_t r = call(whole[i], comm, count);
        if (r != ncclSuccess || !fake_got(whole[i]))
            FAIL("%s of 2^63 bytes (no rank factor) did not reach NCCL (result %d)", whole[i], (int)r);
    }
    ncclCommDestroy(comm);
}

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=FILE %s routed|ranks\n", argv[0]);
        return 2;
    }
    const char *world = getenv("FAKE_NCCL_WORLD");
    if (world && *world)
        mkdir(world, 0755);
    if (!strcmp(argv[1], "routed"))
        run_routed();
    else if (!strcmp(argv[1], "ranks"))
        run_ranks();
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
