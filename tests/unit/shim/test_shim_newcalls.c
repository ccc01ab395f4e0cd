/* SPDX-License-Identifier: MIT */
/*
 * The calls newer NCCLs added, under the shim built with the fake executor
 * (fake_exec.c), against the fake libnccl, a world of one rank and the
 * shipped plans (the one-rank AllReduce plan covers 1K-4M). A mode whose
 * calls the nccl.h of the build lacks is skipped (exit 77).
 *
 *   config-routed  nccl<Coll>Config with no config, and with one that leaves
 *                  the algorithm to NCCL (resource hints set), launches on
 *                  our executor as the plain call does
 *   config-forced  an algSelection, a launch-completion event or a config
 *                  that is not valid: the call reaches the real
 *                  ncclAllReduceConfig with its arguments unchanged (reason
 *                  "config"); in a group, the kept calls go first
 *   grow           the communicator of ncclCommGrow is set up and routes
 *   suspend        between ncclCommSuspend and ncclCommResume a call goes
 *                  to NCCL; after the resume it routes again
 *   older-lib      the shim over a library that lacks a call (the bench's
 *                  NCCL stand-in): ncclInvalidUsage and a reason naming it,
 *                  and ncclGetVersion is the library's
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/status.h"
#include "rec_gen.h"
#include "shim_check.h"

#define STREAM ((cudaStream_t)(uintptr_t)0x5100)
#define LINE_LEN 2048
#define SKIP 77

static float sendb[1 << 12], recvb[1 << 12];

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    (void)bytes;
    return MSCX_OK;
}

/* Lines of the fake's log since fake_log_clear() that are exactly @p line. */
__attribute__((unused)) static int count_exact(const char *line)
{
    char *log = read_file(getenv("FAKE_NCCL_LOG"));
    char *save = NULL;
    int k = 0;
    for (char *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        k += strcmp(l, line) == 0;
    return k;
}

__attribute__((unused)) static void want_launch(char *line, uint64_t bytes)
{
    snprintf(line, LINE_LEN, "mscx_exec_launch %llu %p", (unsigned long long)bytes, (void *)STREAM);
}

__attribute__((unused)) static void want_allreduce(char *line, size_t count, ncclComm_t comm)
{
    rec_fmt_ncclAllReduce(line, LINE_LEN, sendb, recvb, count, ncclFloat32, ncclSum, comm, STREAM);
}

/* One AllReduce of 256 floats (1 KB, which the one-rank plan takes) on @p comm. */
__attribute__((unused)) static void allreduce(ncclComm_t comm, const char *what)
{
    ncclResult_t r = ncclAllReduce(sendb, recvb, 256, ncclFloat32, ncclSum, comm, STREAM);
    if (r != ncclSuccess)
        FAIL("%s: ncclAllReduce returned %d (%s)", what, (int)r, ncclGetLastError(NULL));
}

/* The call since fake_log_clear() launched on our executor once (@p ours) or went to NCCL once. */
__attribute__((unused)) static void check_routed(const char *what, const char *nccl_line, int ours)
{
    char launch[LINE_LEN];
    want_launch(launch, 1024);
    int l = count_exact(launch), n = count_exact(nccl_line);
    if (l != (ours ? 1 : 0) || n != (ours ? 0 : 1))
        FAIL("%s: %d launches and %d calls to NCCL, expected %s", what, l, n, ours ? "1 and 0" : "0 and 1");
}

__attribute__((unused)) static void check_summary(ncclComm_t comm, const char *const *has)
{
    char *line = summary_line(comm);
    for (int k = 0; line && has[k]; k++)
        if (!strstr(line, has[k]))
            FAIL("summary of comm %p: no '%s' in: %s", (void *)comm, has[k], line);
}

#ifdef REC_HAVE_ncclAllReduceConfig
static ncclResult_t allreduce_config(ncclComm_t comm, const ncclCollConfig_t *cfg, char *nccl_line)
{
    rec_fmt_ncclAllReduceConfig(nccl_line, LINE_LEN, sendb, recvb, 256, ncclFloat32, ncclSum, comm, STREAM,
                                cfg);
    return ncclAllReduceConfig(sendb, recvb, 256, ncclFloat32, ncclSum, comm, STREAM, cfg);
}

static void mode_config_routed(void)
{
    ncclComm_t comm = new_comm();
    ncclCollConfig_t hints = NCCL_COLLCONFIG_INITIALIZER, empty = NCCL_COLLCONFIG_INITIALIZER;
    hints.minCTAs = 2;
    hints.maxCTAs = 8;
    hints.userProfilerTag = 7;
    empty.algSelection = "";
    const ncclCollConfig_t *cfgs[] = {NULL, &hints, &empty};
    const char *names[] = {"no config", "resource hints", "empty algSelection"};
    for (int k = 0; k < 3; k++) {
        char line[LINE_LEN];
        fake_log_clear();
        ncclResult_t r = allreduce_config(comm, cfgs[k], line);
        if (r != ncclSuccess)
            FAIL("%s: ncclAllReduceConfig returned %d (%s)", names[k], (int)r, ncclGetLastError(NULL));
        check_routed(names[k], line, 1);
    }
    /* the other four collectives take the same path: an AllGather of 1 KB per rank launches too */
    char line[LINE_LEN];
    fake_log_clear();
    rec_fmt_ncclAllGatherConfig(line, LINE_LEN, sendb, recvb, 256, ncclFloat32, comm, STREAM, &hints);
    if (ncclAllGatherConfig(sendb, recvb, 256, ncclFloat32, comm, STREAM, &hints) != ncclSuccess)
        FAIL("ncclAllGatherConfig failed");
    check_routed("allgather config", line, 1);
    /* a count whose size overflows is NCCL's argument error, as with the plain call */
    fake_log_clear();
    ncclResult_t r = ncclAllReduceConfig(sendb, recvb, ((size_t)1 << 62) + 256, ncclFloat32, ncclSum, comm,
                                         STREAM, &hints);
    const char *e = ncclGetLastError(comm);
    if (r != ncclInvalidArgument || !e || !*e)
        FAIL("an overflowing ncclAllReduceConfig: %d '%s', expected ncclInvalidArgument and a reason", (int)r,
             e ? e : "(null)");
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
    static const char *const has[] = {"allreduce<=1K routed 3 fallback 0",
                                      "allgather<=1K routed 1 fallback 0", NULL};
    check_summary(comm, has);
}

static void mode_config_forced(void)
{
    ncclComm_t comm = new_comm();
    ncclCollConfig_t alg = NCCL_COLLCONFIG_INITIALIZER, hint = NCCL_COLLCONFIG_INITIALIZER,
                     event = NCCL_COLLCONFIG_INITIALIZER, bad = NCCL_COLLCONFIG_INITIALIZER;
    alg.algSelection = "ring";
    hint.algSelection = "tree";
    hint.forceAlgSelection = 0;
    event.launchCompletionEvent = (cudaEvent_t)(uintptr_t)0xe7e7;
    bad.magic = 0;
    const ncclCollConfig_t *cfgs[] = {&alg, &hint, &event, &bad};
    const char *names[] = {"forced algSelection", "preferred algSelection", "launch event", "bad magic"};
    for (int k = 0; k < 4; k++) {
        char line[LINE_LEN];
        fake_log_clear();
        ncclResult_t r = allreduce_config(comm, cfgs[k], line);
        if (r != ncclSuccess)
            FAIL("%s: ncclAllReduceConfig returned %d, expected the fake's answer", names[k], (int)r);
        check_routed(names[k], line, 0);
    }
    /*
     * in a group: the routable call routes as it would alone, the forced one goes to NCCL; the routed
     * one, issued first, launches before NCCL's group end
     */
    char want[3][LINE_LEN];
    fake_log_clear();
    if (ncclGroupStart() != ncclSuccess)
        FAIL("ncclGroupStart failed");
    allreduce(comm, "in a group");
    want_allreduce(want[1], 256, comm);
    (void)allreduce_config(comm, &alg, want[2]);
    if (ncclGroupEnd() != ncclSuccess)
        FAIL("ncclGroupEnd failed");
    snprintf(want[0], LINE_LEN, "ncclGroupStart");
    char group_end[LINE_LEN];
    snprintf(group_end, LINE_LEN, "ncclGroupEnd");
    char launch[LINE_LEN];
    want_launch(launch, 1024);
    const char *log = read_file(getenv("FAKE_NCCL_LOG"));
    const char *at_launch = log ? strstr(log, launch) : NULL, *at_end = log ? strstr(log, group_end) : NULL;
    if (count_exact(want[1]) != 0 || count_exact(want[2]) != 1 || count_exact(launch) != 1 ||
        count_exact(group_end) != 1 || !at_launch || !at_end || at_launch > at_end)
        FAIL("a group with a forced config call: expected the forced one at NCCL and one launch before "
             "ncclGroupEnd, got:\n%s",
             log);
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
    static const char *const has[] = {"config 5", NULL};
    check_summary(comm, has);
    const char *line = summary_line(comm);
    if (line && strstr(line, " group "))
        FAIL("a call of the group went to NCCL for the group's sake: %s", line);
}
#else
static void mode_config_routed(void)
{
    printf("skip: this nccl.h has no ncclAllReduceConfig\n");
    exit(SKIP);
}
#define mode_config_forced mode_config_routed
#endif

#ifdef REC_HAVE_ncclCommGrow
static void mode_grow(void)
{
    ncclComm_t parent = new_comm(), grown = NULL;
    ncclUniqueId id;
    memset(&id, 0x21, sizeof(id));
    ncclResult_t r = ncclCommGrow(parent, 1, &id, -1, &grown, NULL);
    if (r != ncclSuccess || !grown) {
        FAIL("ncclCommGrow returned %d, comm %p", (int)r, (void *)grown);
        return;
    }
    char line[LINE_LEN];
    fake_log_clear();
    allreduce(grown, "grown");
    want_allreduce(line, 256, grown);
    check_routed("on the grown communicator", line, 1);
    if (ncclCommDestroy(grown) != ncclSuccess || ncclCommDestroy(parent) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
    char *log = read_file(getenv("MSCX_DEBUG_FILE"));
    char key[96];
    snprintf(key, sizeof(key), "comm %p (by ncclCommGrow)", (void *)grown);
    if (!strstr(log, key))
        FAIL("no setup line '%s' in the shim's log", key);
    static const char *const has[] = {"allreduce<=1K routed 1 fallback 0", NULL};
    check_summary(grown, has);
}
#else
static void mode_grow(void)
{
    printf("skip: this nccl.h has no ncclCommGrow\n");
    exit(SKIP);
}
#endif

#ifdef REC_HAVE_ncclCommSuspend
static void mode_suspend(void)
{
    ncclComm_t comm = new_comm();
    char line[LINE_LEN];
    want_allreduce(line, 256, comm);
    fake_log_clear();
    allreduce(comm, "before the suspend");
    check_routed("before the suspend", line, 1);
    if (ncclCommSuspend(comm, NCCL_SUSPEND_MEM) != ncclSuccess)
        FAIL("ncclCommSuspend failed");
    if (!strstr(read_file(getenv("MSCX_DEBUG_FILE")), "summary at destroy"))
        FAIL("the suspend did not release our state of the communicator");
    fake_log_clear();
    allreduce(comm, "suspended");
    check_routed("suspended", line, 0);
    if (ncclCommResume(comm) != ncclSuccess)
        FAIL("ncclCommResume failed");
    fake_log_clear();
    allreduce(comm, "after the resume");
    check_routed("after the resume", line, 1);
    char *log = read_file(getenv("MSCX_DEBUG_FILE"));
    char key[96];
    snprintf(key, sizeof(key), "comm %p (by ncclCommResume)", (void *)comm);
    if (!strstr(log, key))
        FAIL("no setup line '%s' in the shim's log", key);
    /* a communicator that was not suspended: its resume sets nothing up */
    ncclComm_t other = new_comm();
    if (ncclCommResume(other) != ncclSuccess)
        FAIL("ncclCommResume of a running communicator failed");
    snprintf(key, sizeof(key), "comm %p (by ncclCommResume)", (void *)other);
    if (strstr(read_file(getenv("MSCX_DEBUG_FILE")), key))
        FAIL("a resume without a suspend set the communicator up again");
    if (ncclCommDestroy(comm) != ncclSuccess || ncclCommDestroy(other) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
}
#else
static void mode_suspend(void)
{
    printf("skip: this nccl.h has no ncclCommSuspend\n");
    exit(SKIP);
}
#endif

/* Under MSCX_NCCL_LIB naming a library with only the common calls. */
static void mode_older_lib(void)
{
    int v = 0;
    const char *lib_version = getenv("FAKE_NCCL_VERSION");
    if (!lib_version || ncclGetVersion(&v) != ncclSuccess || v != atoi(lib_version))
        FAIL("ncclGetVersion gave %d: not the older library's version %s", v,
             lib_version ? lib_version : "(unset)");
    ncclResult_t r = ncclSend(sendb, 4, ncclFloat32, 0, NULL, STREAM);
    const char *e = ncclGetLastError(NULL);
    if (r != ncclInvalidUsage || !e || !strstr(e, "ncclSend is not in the real NCCL"))
        FAIL("ncclSend, missing from the library: %d '%s', expected ncclInvalidUsage and a reason", (int)r,
             e ? e : "(null)");
#ifdef REC_HAVE_ncclAllReduceConfig
    r = ncclAllReduceConfig(sendb, recvb, 4, ncclFloat32, ncclSum, NULL, STREAM, NULL);
    e = ncclGetLastError(NULL);
    if (r != ncclInvalidUsage || !e || !strstr(e, "ncclAllReduceConfig is not in the real NCCL"))
        FAIL("ncclAllReduceConfig: %d '%s', expected ncclInvalidUsage and a reason", (int)r,
             e ? e : "(null)");
#endif
#ifdef REC_HAVE_ncclCommGrow
    ncclComm_t grown = NULL;
    r = ncclCommGrow(NULL, 2, NULL, 1, &grown, NULL);
    e = ncclGetLastError(NULL);
    if (r != ncclInvalidUsage || grown || !e || !strstr(e, "ncclCommGrow is not in the real NCCL"))
        FAIL("ncclCommGrow: %d '%s', expected ncclInvalidUsage and a reason", (int)r, e ? e : "(null)");
#endif
    /* a call the library has still works after those */
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    memset(&id, 1, sizeof(id));
    if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)
        FAIL("ncclCommInitRank of the older library failed");
    else if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy of the older library failed");
}

static const struct shim_mode modes[] = {
    {"config-routed", mode_config_routed},
    {"config-forced", mode_config_forced},
    {"grow", mode_grow},
    {"suspend", mode_suspend},
    {"older-lib", mode_older_lib},
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
