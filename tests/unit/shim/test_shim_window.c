/* SPDX-License-Identifier: MIT */
/*
 * Calls on buffers registered with ncclCommWindowRegister, under the shim
 * built with the fake executor (fake_exec.c), against the fake libnccl and
 * a world of one rank (the one-rank allreduce and broadcast plans cover
 * 1K-4M). Each call is seen either launching on our executor or reaching
 * NCCL (FAKE_NCCL_LOG); the summary at destroy (MSCX_DEBUG_FILE) counts the
 * fallbacks under the reason "window".
 *
 *   tracked  shipped plans (none marked "beats_nccl_window"): a call whose
 *            send and receive buffers both start in symmetric windows of its
 *            communicator goes to NCCL (NCCL's test for its symmetric
 *            kernels); one buffer outside, a buffer starting below the
 *            window, a window of another communicator or one registered
 *            with NCCL_WIN_DEFAULT: the call routes; a broadcast's send
 *            buffer does not count; the pnccl* names; deregister makes the
 *            call route again; a window registered inside a group counts
 *            until its communicator ends
 *   marked   MSCX_PLAN_DIR holds the allreduce plan with "beats_nccl_window":
 *            true and the broadcast plan without: the registered allreduce
 *            routes, the registered broadcast does not
 *   ends     destroy and abort forget a communicator's windows: the next
 *            communicator at its address routes the same buffers
 *   many     20,000 symmetric windows: every one is kept (no cap, nothing
 *            counted as registered that is not), without a warning
 *   uneven   run as rank FAKE_NCCL_RANK of two: an NCCL_WIN_DEFAULT window
 *            covers the buffers on rank 0 only, and both ranks route the
 *            call; then a symmetric window on both: both send it to NCCL
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/status.h"
#include "shim_check.h"

#define STREAM ((cudaStream_t)(uintptr_t)0x5200)
#define CALL_BYTES 4096 /* 1024 floats */
#define WIN_OFF 16384   /* the window: [mem + WIN_OFF, mem + WIN_OFF + WIN_BYTES) */
#define WIN_BYTES 8192
#define OUT_OFF 40960 /* a buffer outside every window */
#define MANY 20000

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    (void)bytes;
    return MSCX_OK;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
static _Alignas(4096) char mem[1 << 16];

/* 1 when the call launched on our executor, 0 when it reached NCCL; a FAIL when neither or both. */
static int allreduce_routed(ncclComm_t comm, size_t send_off, size_t recv_off)
{
    fake_log_clear();
    ncclResult_t r =
        ncclAllReduce(mem + send_off, mem + recv_off, CALL_BYTES / 4, ncclFloat32, ncclSum, comm, STREAM);
    if (r != ncclSuccess)
        FAIL("ncclAllReduce at %zu, %zu returned %d", send_off, recv_off, (int)r);
    int launched = fake_got("mscx_exec_launch"), nccl = fake_got("ncclAllReduce");
    if (launched == nccl)
        FAIL("ncclAllReduce at %zu, %zu: launched %d, reached NCCL %d", send_off, recv_off, launched, nccl);
    return launched;
}

static int bcast_routed(ncclComm_t comm, size_t send_off, size_t recv_off)
{
    fake_log_clear();
    ncclResult_t r =
        ncclBroadcast(mem + send_off, mem + recv_off, CALL_BYTES / 4, ncclFloat32, 0, comm, STREAM);
    if (r != ncclSuccess)
        FAIL("ncclBroadcast at %zu, %zu returned %d", send_off, recv_off, (int)r);
    int launched = fake_got("mscx_exec_launch"), nccl = fake_got("ncclBroadcast");
    if (launched == nccl)
        FAIL("ncclBroadcast at %zu, %zu: launched %d, reached NCCL %d", send_off, recv_off, launched, nccl);
    return launched;
}

static void want_allreduce(const char *what, ncclComm_t comm, size_t send_off, size_t recv_off, int routed)
{
    if (allreduce_routed(comm, send_off, recv_off) != routed)
        FAIL("%s: allreduce at %zu, %zu %s", what, send_off, recv_off, routed ? "went to NCCL" : "routed");
}

static void want_bcast(const char *what, ncclComm_t comm, size_t send_off, size_t recv_off, int routed)
{
    if (bcast_routed(comm, send_off, recv_off) != routed)
        FAIL("%s: broadcast at %zu, %zu %s", what, send_off, recv_off, routed ? "went to NCCL" : "routed");
}

static ncclWindow_t reg_flags(ncclComm_t comm, void *buff, size_t size, int flags)
{
    ncclWindow_t w = NULL;
    ncclResult_t r = ncclCommWindowRegister(comm, buff, size, &w, flags);
    if (r != ncclSuccess || !w)
        FAIL("ncclCommWindowRegister returned %d, window %p", (int)r, (void *)w);
    return w;
}

static ncclWindow_t reg(ncclComm_t comm, void *buff, size_t size)
{
    return reg_flags(comm, buff, size, NCCL_WIN_COLL_SYMMETRIC);
}

static void dereg(ncclComm_t comm, ncclWindow_t w)
{
    if (ncclCommWindowDeregister(comm, w) != ncclSuccess)
        FAIL("ncclCommWindowDeregister failed");
}

/* The summary line of @p comm at its destroy must contain @p has (and not @p hasnt, when given). */
static void check_summary(ncclComm_t comm, const char *has, const char *hasnt)
{
    char *line = summary_line(comm);
    if (line && has && !strstr(line, has))
        FAIL("summary of comm %p: no '%s' in: %s", (void *)comm, has, line);
    if (line && hasnt && strstr(line, hasnt))
        FAIL("summary of comm %p: '%s' in: %s", (void *)comm, hasnt, line);
}

static void destroy(ncclComm_t comm)
{
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
}

static void mode_tracked(void)
{
    ncclComm_t a = new_comm(), b = new_comm();
    size_t in = WIN_OFF + 1024, in2 = WIN_OFF + 1024 + CALL_BYTES;
    want_allreduce("nothing registered", a, in, in2, 1);
    ncclWindow_t dw = reg_flags(a, mem + WIN_OFF, WIN_BYTES, NCCL_WIN_DEFAULT);
    want_allreduce("both inside a window registered with NCCL_WIN_DEFAULT", a, in, in2, 1);
    dereg(a, dw);
    ncclWindow_t w = reg(a, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("both inside", a, in, in2, 0);
    want_allreduce("in place inside", a, in, in, 0);
    want_allreduce("send buffer inside only", a, in, OUT_OFF, 1);
    want_allreduce("recv buffer inside only", a, 0, in, 1);
    want_allreduce("outside", a, 0, OUT_OFF, 1);
    want_allreduce("starting one byte below", a, WIN_OFF - 1, WIN_OFF - 1, 1);
    want_allreduce("starting at the window's first byte", a, WIN_OFF, WIN_OFF, 0);
    want_allreduce("starting at its last byte", a, WIN_OFF + WIN_BYTES - 1, WIN_OFF + WIN_BYTES - 1, 0);
    want_allreduce("starting just above", a, WIN_OFF + WIN_BYTES, WIN_OFF + WIN_BYTES, 1);
    want_allreduce("a window of another communicator", b, in, in2, 1);
    want_bcast("broadcast: the send buffer (used at the root only) inside", a, in, OUT_OFF, 1);
    want_bcast("broadcast: the recv buffer inside", a, 0, in, 0);

    ncclWindow_t pw = NULL;
    if (pncclCommWindowRegister(b, mem, 2 * CALL_BYTES, &pw, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess || !pw)
        FAIL("pncclCommWindowRegister failed");
    want_allreduce("registered through pnccl*", b, 0, CALL_BYTES, 0);
    if (pncclCommWindowDeregister(b, pw) != ncclSuccess)
        FAIL("pncclCommWindowDeregister failed");
    want_allreduce("deregistered through pnccl*", b, 0, CALL_BYTES, 1);

    dereg(a, w);
    want_allreduce("deregistered", a, in, in2, 1);

    /* in a group the handle may be written only at its end: the range counts until the comm ends */
    ncclGroupStart();
    ncclWindow_t gw = reg(a, mem + WIN_OFF, WIN_BYTES);
    ncclGroupEnd();
    want_allreduce("registered in a group", a, in, in2, 0);
    dereg(a, gw);
    want_allreduce("registered in a group, deregistered", a, in, in2, 0);
    destroy(a);
    destroy(b);
    check_summary(a, "reasons: window 7", NULL);
    check_summary(b, "reasons: window 1", NULL);
}

static void mode_marked(void)
{
    ncclComm_t a = new_comm();
    ncclWindow_t w = reg(a, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("a plan that beats NCCL's window: inside", a, WIN_OFF, WIN_OFF + CALL_BYTES, 1);
    want_bcast("a broadcast plan without the mark: inside", a, WIN_OFF, WIN_OFF + CALL_BYTES, 0);
    dereg(a, w);
    destroy(a);
    check_summary(a, "reasons: window 1", NULL);
}

/* A communicator at the address of @p old (the fake hands its 256 handles out in turn). */
static ncclComm_t comm_at(ncclComm_t old)
{
    for (int i = 0; i < 300; i++) {
        ncclComm_t c = new_comm();
        if (c == old)
            return c;
        destroy(c);
    }
    FAIL("no new communicator at %p", (void *)old);
    exit(1);
}

static void mode_ends(void)
{
    ncclComm_t a = new_comm();
    reg(a, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("registered", a, WIN_OFF, WIN_OFF, 0);
    destroy(a); /* without deregistering */
    ncclComm_t again = comm_at(a);
    want_allreduce("a new communicator where a destroyed one was", again, WIN_OFF, WIN_OFF, 1);
    reg(again, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("registered", again, WIN_OFF, WIN_OFF, 0);
    if (ncclCommAbort(again) != ncclSuccess)
        FAIL("ncclCommAbort failed");
    ncclComm_t third = comm_at(a);
    want_allreduce("a new communicator where an aborted one was", third, WIN_OFF, WIN_OFF, 1);
    destroy(third);
    check_summary(a, "reasons: window 1", NULL); /* the first communicator at that address */
}

static void mode_many(void)
{
    ncclComm_t a = new_comm();
    ncclWindow_t *w = calloc(MANY, sizeof(*w));
    if (!w) {
        FAIL("no memory");
        return;
    }
    char *far = (char *)(uintptr_t)0x7e0000000000ull; /* nowhere near mem: only their number counts */
    for (int i = 0; i < MANY; i++)
        w[i] = reg(a, far + (size_t)i * 64, 64);
    ncclWindow_t last = reg(a, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("outside every one of many windows", a, 0, OUT_OFF, 1);
    want_allreduce("inside the last of many windows", a, WIN_OFF, WIN_OFF, 0);
    for (int i = 0; i < MANY; i++)
        dereg(a, w[i]);
    want_allreduce("inside the last, the others deregistered", a, WIN_OFF, WIN_OFF, 0);
    dereg(a, last);
    want_allreduce("all deregistered", a, WIN_OFF, WIN_OFF, 1);
    free(w);
    if (strstr(read_file(getenv("MSCX_DEBUG_FILE")), "WARN"))
        FAIL("a warning in %s", getenv("MSCX_DEBUG_FILE"));
    destroy(a);
    check_summary(a, "reasons: window 2", NULL);
}

/* One rank of two: registration is collective, so both register, each its own buffer. */
static void mode_uneven(void)
{
    int rank = atoi(getenv("FAKE_NCCL_RANK") ? getenv("FAKE_NCCL_RANK") : "0");
    ncclUniqueId id;
    ncclComm_t c = NULL;
    memset(&id, 7, sizeof(id));
    if (ncclCommInitRank(&c, 2, id, rank) != ncclSuccess || !c) {
        FAIL("ncclCommInitRank of rank %d of 2 failed", rank);
        return;
    }
    size_t in = WIN_OFF + 1024, in2 = WIN_OFF + 1024 + CALL_BYTES;
    want_allreduce("nothing registered", c, in, in2, 1);
    /* legal in NCCL: a default window binds no rank to the others' offsets */
    ncclWindow_t dw = reg_flags(c, mem + (rank == 0 ? WIN_OFF : OUT_OFF), WIN_BYTES, NCCL_WIN_DEFAULT);
    want_allreduce("a default window over the buffers on rank 0 only", c, in, in2, 1);
    ncclWindow_t sw = reg(c, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("a symmetric window over the buffers on every rank", c, in, in2, 0);
    dereg(c, sw);
    dereg(c, dw);
    want_allreduce("deregistered", c, in, in2, 1);
    destroy(c);
    check_summary(c, "reasons: window 1", NULL);
}

static const struct shim_mode modes[] = {{"tracked", mode_tracked},
                                         {"marked", mode_marked},
                                         {"ends", mode_ends},
                                         {"many", mode_many},
                                         {"uneven", mode_uneven}};
#else
static void mode_skip(void)
{
    printf("nccl.h older than 2.27: no windows\n");
}
static const struct shim_mode modes[] = {{"tracked", mode_skip},
                                         {"marked", mode_skip},
                                         {"ends", mode_skip},
                                         {"many", mode_skip},
                                         {"uneven", mode_skip}};
#endif

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
