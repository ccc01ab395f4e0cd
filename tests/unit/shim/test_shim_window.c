/* SPDX-License-Identifier: MIT */
/*
 * Calls on buffers registered with ncclCommWindowRegister, under the shim
 * built with the fake executor (fake_exec.c), against the fake libnccl and
 * a world of one rank (the one-rank allreduce and broadcast plans cover
 * 1K-4M). Each call is seen either launching on our executor or reaching
 * NCCL (FAKE_NCCL_LOG); the summary at destroy (MSCX_DEBUG_FILE) counts the
 * fallbacks under the reason "window".
 *
 *   tracked  shipped plans (none marked "beats_nccl_window"): a call with a
 *            buffer in a window of its communicator goes to NCCL, the same
 *            call on other buffers routes; one byte inside either edge
 *            counts, adjacent does not; a window of another communicator
 *            does not count; a broadcast's send buffer does not count; the
 *            pnccl* names; deregister makes the call route again; a window
 *            registered inside a group counts until its communicator ends
 *   marked   MSCX_PLAN_DIR holds the allreduce plan with "beats_nccl_window":
 *            true and the broadcast plan without: the registered allreduce
 *            routes, the registered broadcast does not
 *   ends     destroy and abort forget a communicator's windows: the next
 *            communicator at its address routes the same buffers
 *   lost     more windows than the shim keeps (window.c's WIN_MAX): every
 *            buffer of that communicator goes to NCCL until it ends, with
 *            one warning; another communicator is not affected
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
#define OUT_OFF 40960          /* a buffer outside every window */
#define WIN_MAX_KEPT (1 << 14) /* window.c's WIN_MAX */

static _Alignas(4096) char mem[1 << 16];

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    (void)bytes;
    return MSCX_OK;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
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

static ncclWindow_t reg(ncclComm_t comm, void *buff, size_t size)
{
    ncclWindow_t w = NULL;
    ncclResult_t r = ncclCommWindowRegister(comm, buff, size, &w, NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess || !w)
        FAIL("ncclCommWindowRegister returned %d, window %p", (int)r, (void *)w);
    return w;
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
    want_allreduce("nothing registered", a, 0, OUT_OFF, 1);
    ncclWindow_t w = reg(a, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("send buffer inside", a, WIN_OFF, OUT_OFF, 0);
    want_allreduce("recv buffer inside", a, 0, WIN_OFF + 1024, 0);
    want_allreduce("outside", a, 0, OUT_OFF, 1);
    want_allreduce("adjacent below", a, WIN_OFF - CALL_BYTES, OUT_OFF, 1);
    want_allreduce("one byte in at the start", a, WIN_OFF - CALL_BYTES + 1, OUT_OFF, 0);
    want_allreduce("adjacent above", a, 0, WIN_OFF + WIN_BYTES, 1);
    want_allreduce("one byte in at the end", a, 0, WIN_OFF + WIN_BYTES - 1, 0);
    want_allreduce("a window of another communicator", b, WIN_OFF, OUT_OFF, 1);
    want_bcast("broadcast: the send buffer (used at the root only) inside", a, WIN_OFF, OUT_OFF, 1);
    want_bcast("broadcast: the recv buffer inside", a, 0, WIN_OFF, 0);

    ncclWindow_t pw = NULL;
    if (pncclCommWindowRegister(b, mem, CALL_BYTES, &pw, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess || !pw)
        FAIL("pncclCommWindowRegister failed");
    want_allreduce("registered through pnccl*", b, 0, OUT_OFF, 0);
    if (pncclCommWindowDeregister(b, pw) != ncclSuccess)
        FAIL("pncclCommWindowDeregister failed");
    want_allreduce("deregistered through pnccl*", b, 0, OUT_OFF, 1);

    dereg(a, w);
    want_allreduce("deregistered", a, WIN_OFF, OUT_OFF, 1);
    want_allreduce("deregistered, one byte in", a, 0, WIN_OFF + WIN_BYTES - 1, 1);

    /* in a group the handle may be written only at its end: the range counts until the comm ends */
    ncclGroupStart();
    ncclWindow_t gw = reg(a, mem + WIN_OFF, WIN_BYTES);
    ncclGroupEnd();
    want_allreduce("registered in a group", a, WIN_OFF, OUT_OFF, 0);
    dereg(a, gw);
    want_allreduce("registered in a group, deregistered", a, WIN_OFF, OUT_OFF, 0);
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
    want_allreduce("registered", a, WIN_OFF, OUT_OFF, 0);
    destroy(a); /* without deregistering */
    ncclComm_t again = comm_at(a);
    want_allreduce("a new communicator where a destroyed one was", again, WIN_OFF, OUT_OFF, 1);
    reg(again, mem + WIN_OFF, WIN_BYTES);
    want_allreduce("registered", again, WIN_OFF, OUT_OFF, 0);
    if (ncclCommAbort(again) != ncclSuccess)
        FAIL("ncclCommAbort failed");
    ncclComm_t third = comm_at(a);
    want_allreduce("a new communicator where an aborted one was", third, WIN_OFF, OUT_OFF, 1);
    destroy(third);
    check_summary(a, "reasons: window 1", NULL); /* the first communicator at that address */
}

static void mode_lost(void)
{
    ncclComm_t a = new_comm(), b = new_comm();
    char *far = (char *)(uintptr_t)0x7e0000000000ull; /* nowhere near mem: only their number counts */
    for (int i = 0; i < WIN_MAX_KEPT + 1; i++) {
        ncclWindow_t w = NULL;
        if (ncclCommWindowRegister(a, far + (size_t)i * 64, 64, &w, 0) != ncclSuccess) {
            FAIL("registration %d failed", i);
            break;
        }
    }
    fake_log_clear();
    want_allreduce("a communicator whose windows were not all kept", a, 0, OUT_OFF, 0);
    want_allreduce("another communicator", b, 0, OUT_OFF, 1);
    if (!strstr(read_file(getenv("MSCX_DEBUG_FILE")), "cannot keep NCCL window"))
        FAIL("no warning that a window could not be kept");
    destroy(a);
    ncclComm_t again = comm_at(a);
    want_allreduce("a new communicator where that one was", again, 0, OUT_OFF, 1);
    destroy(again);
    destroy(b);
    check_summary(a, "reasons: window 1", NULL);
}

static const struct shim_mode modes[] = {
    {"tracked", mode_tracked}, {"marked", mode_marked}, {"ends", mode_ends}, {"lost", mode_lost}};
#else
static void mode_skip(void)
{
    printf("nccl.h older than 2.27: no windows\n");
}
static const struct shim_mode modes[] = {
    {"tracked", mode_skip}, {"marked", mode_skip}, {"ends", mode_skip}, {"lost", mode_skip}};
#endif

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
