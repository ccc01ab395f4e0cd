/* SPDX-License-Identifier: MIT */
/*
 * The setup paths of the shim: non-blocking communicators and several
 * communicators created together on one thread. Runs with LD_PRELOAD of the
 * shim built with the fake executor (fake_exec.c), against the fake libnccl
 * (its calls and the executor's land in FAKE_NCCL_LOG, in order) and the
 * shipped plans, so that a communicator set up in full routes its calls.
 *
 *   nonblocking        ncclCommInitRankConfig with blocking = 0 answers
 *                      ncclInProgress (FAKE_NCCL_NB_POLLS); the caller polls
 *                      ncclCommGetAsyncError; no exchange runs there; the
 *                      first ncclAllReduce sets up (its exchanges answer
 *                      ncclInProgress too) and is routed, returning ncclSuccess
 *   nonblocking-early  the first ncclAllReduce comes before the init completed:
 *                      it and every later call go to NCCL
 *   nonblocking-group  the first collective inside a group goes to NCCL and
 *                      sets nothing up; the next one outside sets up and routes
 *   several-initall    ncclCommInitAll of 2 (FAKE_NCCL_LOCAL=1): both set up
 *                      (one thread each), then each routes its calls
 *   several-group      two ncclCommInitRank in one group, likewise
 *   quiet              ncclCommInitAll of 4 (FAKE_NCCL_LOCAL=1) with the shipped
 *                      plans of every node layout; on each rank a routed 1 KB
 *                      allreduce, a 64 MB one and an fp64 one (NCCL's by size
 *                      and type), then destroy: ordinary routing, so the
 *                      caller sees nothing on stderr at the default log level
 *   --expect-shim --lifecycle
 *                      agree.sh's rank program on a non-blocking communicator
 *                      of FAKE_NCCL_NRANKS ranks: init, poll, two allreduces,
 *                      destroy; every call must succeed
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nccl.h>

#include "shim_check.h"

#define COUNT 256

/* Lines of the log since fake_log_clear() that start with @p what followed by a space or the end. */
static int count_lines(const char *what)
{
    const char *log = read_file(getenv("FAKE_NCCL_LOG"));
    size_t n = strlen(what);
    int k = 0;
    for (const char *p = log; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        k += !strncmp(p, what, n) && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0');
    return k;
}

static void expect_lines(const char *what, int want, const char *when)
{
    int got = count_lines(what);
    if (got != want)
        FAIL("%s: %d log lines '%s', expected %d", when, got, what, want);
}

/* An allreduce of COUNT floats on @p comm: @return its result. */
static ncclResult_t allreduce(ncclComm_t comm)
{
    static float in[COUNT], out[COUNT];
    return ncclAllReduce(in, out, COUNT, ncclFloat, ncclSum, comm, NULL);
}

static ncclComm_t init_nonblocking(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        FAIL("ncclGetUniqueId");
    ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    if (r != ncclInProgress || !comm)
        FAIL("non-blocking init answered %d (comm %p), expected ncclInProgress", (int)r, (void *)comm);
    return comm;
}

/* Poll as NCCL's users must. @return the in-progress answers seen. */
static int poll_init(ncclComm_t comm)
{
    int polls = 0;
    ncclResult_t async = ncclInProgress;
    while (async == ncclInProgress && polls < 1000) {
        if (ncclCommGetAsyncError(comm, &async) != ncclSuccess)
            FAIL("ncclCommGetAsyncError failed");
        polls += async == ncclInProgress;
    }
    if (async != ncclSuccess)
        FAIL("the init never completed: %d", (int)async);
    return polls;
}

static void nonblocking_lifecycle(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclGetUniqueId(&id);
    ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, 0, &config);
    if ((r != ncclSuccess && r != ncclInProgress) || !comm) {
        FAIL("non-blocking init answered %d", (int)r);
        return;
    }
    poll_init(comm);
    for (int i = 0; i < 2; i++)
        if ((r = allreduce(comm)) != ncclSuccess)
            FAIL("allreduce %d answered %d", i, (int)r);
    ncclCommDestroy(comm);
}

static void nonblocking(void)
{
    fake_log_clear();
    ncclComm_t comm = init_nonblocking();
    int polls = poll_init(comm);
    if (polls < 1)
        FAIL("the fake answered ncclInProgress to no poll: the test proves nothing");
    /* nothing of the setup ran at init or in ncclCommGetAsyncError */
    expect_lines("ncclAllGather", 0, "before the first collective");
    expect_lines("mscx_exec_create", 0, "before the first collective");
    for (int i = 0; i < 2; i++) {
        ncclResult_t r = allreduce(comm);
        if (r != ncclSuccess)
            FAIL("routed allreduce %d on a non-blocking comm answered %d, expected ncclSuccess", i, (int)r);
    }
    expect_lines("mscx_exec_create", 1, "after two allreduces");
    expect_lines("mscx_exec_launch", 2, "after two allreduces");
    expect_lines("ncclAllReduce", 0, "after two allreduces (none forwarded)");
    /* one rank has nothing to exchange: its setup never calls the communicator (the two-rank
     * exchange under ncclInProgress is shim-setup-nonblocking-agree-*) */
    expect_lines("ncclAllGather", 0, "after the setup of a one-rank communicator");
    ncclCommDestroy(comm);
}

static void nonblocking_early(void)
{
    fake_log_clear();
    ncclComm_t comm = init_nonblocking();
    allreduce(comm); /* before the init completed: a user error NCCL would answer */
    poll_init(comm);
    allreduce(comm);
    expect_lines("mscx_exec_create", 0, "an early first collective");
    expect_lines("ncclAllReduce", 2, "an early first collective (both forwarded)");
    ncclCommDestroy(comm);
}

static void nonblocking_group(void)
{
    fake_log_clear();
    ncclComm_t comm = init_nonblocking();
    poll_init(comm);
    ncclGroupStart();
    allreduce(comm);
    ncclGroupEnd();
    expect_lines("mscx_exec_create", 0, "a first collective in a group");
    expect_lines("ncclAllGather", 0, "a first collective in a group");
    if (allreduce(comm) != ncclSuccess)
        FAIL("the allreduce after the group failed");
    expect_lines("mscx_exec_create", 1, "the first collective outside a group");
    expect_lines("mscx_exec_launch", 1, "the first collective outside a group");
    ncclCommDestroy(comm);
}

/* Both communicators set up in full: each routes an allreduce outside a group. */
static void check_several(ncclComm_t *comms, int n, const char *how)
{
    expect_lines("mscx_exec_create", n, how);
    for (int i = 0; i < n; i++)
        if (allreduce(comms[i]) != ncclSuccess)
            FAIL("%s: allreduce on comm %d failed", how, i);
    expect_lines("mscx_exec_launch", n, how);
    expect_lines("ncclAllReduce", 0, how);
    for (int i = 0; i < n; i++)
        ncclCommDestroy(comms[i]);
}

static void several_initall(void)
{
    ncclComm_t comms[2] = {NULL, NULL};
    int devs[2] = {0, 1};
    fake_log_clear();
    if (ncclCommInitAll(comms, 2, devs) != ncclSuccess)
        FAIL("ncclCommInitAll failed");
    check_several(comms, 2, "ncclCommInitAll of 2");
}

static void several_group(void)
{
    ncclComm_t comms[2] = {NULL, NULL};
    ncclUniqueId id;
    fake_log_clear();
    ncclGetUniqueId(&id);
    ncclGroupStart();
    for (int i = 0; i < 2; i++)
        if (ncclCommInitRank(&comms[i], 2, id, i) != ncclSuccess)
            FAIL("ncclCommInitRank %d failed", i);
    if (ncclGroupEnd() != ncclSuccess)
        FAIL("ncclGroupEnd failed");
    check_several(comms, 2, "two inits in a group");
}

static void quiet(void)
{
    enum { N = 4, BIG = 16 << 20 };
    ncclComm_t comms[N] = {NULL};
    int devs[N] = {0, 1, 2, 3};
    float *big = calloc(BIG, sizeof(float));
    fake_log_clear();
    if (!big || ncclCommInitAll(comms, N, devs) != ncclSuccess) {
        FAIL("no 64 MB buffer, or ncclCommInitAll of %d failed", N);
        free(big);
        return;
    }
    expect_lines("mscx_exec_create", N, "ncclCommInitAll of 4");
    for (int i = 0; i < N; i++) {
        if (allreduce(comms[i]) != ncclSuccess ||
            ncclAllReduce(big, big, BIG, ncclFloat, ncclSum, comms[i], NULL) != ncclSuccess ||
            ncclAllReduce(big, big, 128, ncclFloat64, ncclSum, comms[i], NULL) != ncclSuccess)
            FAIL("an allreduce on rank %d failed", i);
    }
    expect_lines("mscx_exec_launch", N, "the 1 KB allreduces");
    expect_lines("ncclAllReduce", 2 * N, "the 64 MB and fp64 allreduces");
    for (int i = 0; i < N; i++)
        ncclCommDestroy(comms[i]);
    free(big);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } modes[] = {
        {"nonblocking", nonblocking},
        {"nonblocking-early", nonblocking_early},
        {"nonblocking-group", nonblocking_group},
        {"several-initall", several_initall},
        {"several-group", several_group},
        {"quiet", quiet},
    };
    if (argc == 3 && !strcmp(argv[1], "--expect-shim") && !strcmp(argv[2], "--lifecycle")) {
        nonblocking_lifecycle();
        return failures ? 1 : 0;
    }
    for (size_t i = 0; argc == 2 && i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(argv[1], modes[i].name) != 0)
            continue;
        modes[i].fn();
        if (failures)
            fprintf(stderr, "%s: %d failure(s); the log is %s\n", argv[1], failures, getenv("FAKE_NCCL_LOG"));
        return failures ? 1 : 0;
    }
    fprintf(stderr,
            "usage: %s nonblocking|nonblocking-early|nonblocking-group|several-initall|several-group|quiet\n",
            argv[0]);
    return 2;
}
