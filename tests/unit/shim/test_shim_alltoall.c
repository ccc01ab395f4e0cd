/* SPDX-License-Identifier: MIT */
/*
 * ncclAlltoAll under the shim built with the fake executor (fake_exec.c),
 * against the fake libnccl, a world of one rank and the shipped plans (the
 * one-rank AlltoAll plan covers 1K-4M). Each mode checks the exact sequence
 * of FAKE_NCCL_LOG (NCCL calls and our launches) and the communicator's
 * summary at its destroy (MSCX_DEBUG_FILE):
 *
 *   routed   1 KB and 4 MB launch on our executor with the message size
 *            count x ranks x element size; 4 MB + 4 B (no plan), an fp8
 *            type (no plan takes it) and a bad datatype (NCCL's
 *            ncclInvalidArgument at the call) do not
 *   forced   MSCX_FORCE_FALLBACK=alltoall: a covered size goes to NCCL
 *   ranks2   two communicators of ncclCommInitAll as the ranks of one
 *            (FAKE_NCCL_LOCAL=1; the 2-rank plans): 128 floats per peer
 *            launch as 1 KB, 8192 and 8193 as 64 KB and 64 KB + 8 (the
 *            packet plan, then the put plan), 262145 (above 2 MB) and 64
 *            (512 B, below 1 KB) go to NCCL
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

/* ncclAlltoAll is in nccl.h from 2.28 on; with an older one the test is skipped (exit 77). */
#ifdef REC_HAVE_ncclAlltoAll
static float sendb[(1 << 18) + 1], recvb[(1 << 18) + 1];

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    (void)bytes;
    return MSCX_OK;
}

/* The summary line of @p comm at its destroy must contain every string of @p has (NULL-terminated). */
static void check_summary(ncclComm_t comm, const char *const *has)
{
    char *line = summary_line(comm);
    if (!line)
        return;
    for (int k = 0; has[k]; k++)
        if (!strstr(line, has[k]))
            FAIL("summary of comm %p: no '%s' in: %s", (void *)comm, has[k], line);
}

static void alltoall(size_t count, ncclDataType_t dt, ncclComm_t comm)
{
    ncclResult_t r = ncclAlltoAll(sendb, recvb, count, dt, comm, STREAM);
    if (r != ncclSuccess)
        FAIL("ncclAlltoAll of %zu returned %d (%s)", count, (int)r, ncclGetLastError(NULL));
}

static void want_nccl(char *line, size_t count, ncclDataType_t dt, ncclComm_t comm)
{
    rec_fmt_ncclAlltoAll(line, LINE_LEN, sendb, recvb, count, dt, comm, STREAM);
}

static void want_launch(char *line, uint64_t bytes)
{
    snprintf(line, LINE_LEN, "mscx_exec_launch %llu %p", (unsigned long long)bytes, (void *)STREAM);
}

static void mode_routed(void)
{
    static char want[8][LINE_LEN];
    ncclComm_t comm = new_comm();
    fake_log_clear();
    alltoall(256, ncclFloat32, comm);
    alltoall(1 << 20, ncclFloat32, comm);
    alltoall((1 << 20) + 1, ncclFloat32, comm);
    alltoall(1024, ncclFloat8e4m3, comm);
    if (ncclAlltoAll(sendb, recvb, 256, (ncclDataType_t)-1, comm, STREAM) != ncclInvalidArgument)
        FAIL("a bad datatype was not refused with ncclInvalidArgument");
    want_launch(want[0], 1024);
    want_launch(want[1], 4 << 20);
    want_nccl(want[2], (1 << 20) + 1, ncclFloat32, comm);
    want_nccl(want[3], 1024, ncclFloat8e4m3, comm);
    check_log_lines("routed", want[0], LINE_LEN, 4);
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
    static const char *const has[] = {"routed 2 fallback 2:",
                                      "alltoall<=1K routed 1 fallback 1",
                                      "alltoall<=4M routed 1 fallback 0",
                                      "alltoall<=32M routed 0 fallback 1",
                                      "reasons: dtype 1 size 1",
                                      NULL};
    check_summary(comm, has);
}

static void mode_forced(void)
{
    static char want[1][LINE_LEN];
    ncclComm_t comm = new_comm();
    fake_log_clear();
    alltoall(256, ncclFloat32, comm);
    want_nccl(want[0], 256, ncclFloat32, comm);
    check_log_lines("forced", want[0], LINE_LEN, 1);
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
    static const char *const has[] = {"alltoall<=1K routed 0 fallback 1", "forced 1", NULL};
    check_summary(comm, has);
}

/* The log lines since fake_log_clear() that are exactly @p line. */
static int count_exact(const char *line)
{
    char *log = read_file(getenv("FAKE_NCCL_LOG"));
    char *save = NULL;
    int k = 0;
    for (char *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        k += strcmp(l, line) == 0;
    return k;
}

static void mode_ranks2(void)
{
    static const size_t counts[] = {128, 8192, 8193, 262145, 64};
    static const int routed[] = {1, 1, 0, 0, 0}; /* one node: LL packets up to 64 KB, NCCL above */
    ncclComm_t comms[2] = {NULL, NULL};
    int devs[2] = {0, 1};
    char line[LINE_LEN];
    if (ncclCommInitAll(comms, 2, devs) != ncclSuccess) {
        FAIL("ncclCommInitAll failed");
        return;
    }
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        fake_log_clear();
        for (int i = 0; i < 2; i++)
            alltoall(counts[k], ncclFloat32, comms[i]);
        want_launch(line, (uint64_t)counts[k] * 2 * sizeof(float));
        int launched = count_exact(line), forwarded = 0;
        for (int i = 0; i < 2; i++) {
            want_nccl(line, counts[k], ncclFloat32, comms[i]);
            forwarded += count_exact(line);
        }
        if (launched != (routed[k] ? 2 : 0) || forwarded != (routed[k] ? 0 : 2))
            FAIL("%zu floats per peer: %d launches of %llu bytes and %d calls to NCCL, expected %s",
                 counts[k], launched, (unsigned long long)counts[k] * 8, forwarded,
                 routed[k] ? "2 and 0" : "0 and 2");
    }
    for (int i = 0; i < 2; i++)
        if (ncclCommDestroy(comms[i]) != ncclSuccess)
            FAIL("ncclCommDestroy failed");
    static const char *const has[] = {"routed 2 fallback 3:",
                                      "alltoall<=1K routed 1 fallback 1",
                                      "alltoall<=64K routed 1",
                                      "alltoall<=512K routed 0 fallback 1",
                                      "alltoall<=4M routed 0 fallback 1",
                                      "reasons: size 3",
                                      NULL};
    check_summary(comms[0], has);
}

static const struct shim_mode modes[] = {
    {"routed", mode_routed}, {"forced", mode_forced}, {"ranks2", mode_ranks2}};
#endif

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... %s MODE\n", argv[0]);
        return 2;
    }
#ifdef REC_HAVE_ncclAlltoAll
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
#else
    printf("skip: this nccl.h has no ncclAlltoAll\n");
    return 77;
#endif
}
