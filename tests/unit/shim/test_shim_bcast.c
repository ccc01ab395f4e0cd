/* SPDX-License-Identifier: MIT */
/*
 * ncclBroadcast and ncclBcast roots under the shim built with the fake
 * executor (fake_exec.c), against the fake libnccl and the shipped plans
 * (one broadcast plan per root). Each mode checks the exact sequence of
 * FAKE_NCCL_LOG (NCCL calls and our launches):
 *
 *   bad-root  a world of one rank: roots 1 and -1 get NCCL's
 *             ncclInvalidArgument at the call, with ncclGetLastError naming
 *             the root, and reach neither NCCL nor the executor; root 0
 *             launches on our executor (the one-rank copy plan)
 *   roots     one rank of a two-process world (FAKE_NCCL_RANK): 4 KB from
 *             root 0 and from root 1 (ncclBroadcast, ncclBcast) launch on our
 *             executor; 2 MB (no plan) and root 2 (not a rank) do not
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

static float sendb[1 << 19], recvb[1 << 19];

/* Rank @p rank of a world of @p nranks processes. */
static ncclComm_t new_world_comm(int nranks, int rank)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    memset(&id, 5, sizeof(id)); /* the same id in every process of the world */
    if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess || !comm) {
        FAIL("ncclCommInitRank failed");
        exit(1);
    }
    return comm;
}

static ncclResult_t bcast(size_t count, int root, ncclComm_t comm)
{
    return ncclBroadcast(sendb, recvb, count, ncclFloat32, root, comm, STREAM);
}

static void want_launch(char *line, uint64_t bytes)
{
    snprintf(line, LINE_LEN, "mscx_exec_launch %llu %p", (unsigned long long)bytes, (void *)STREAM);
}

static void mode_bad_root(void)
{
    static char want[1][LINE_LEN];
    ncclComm_t comm = new_world_comm(1, 0);
    static const int bad[] = {1, -1};
    fake_log_clear();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ncclResult_t r = bcast(256, bad[i], comm);
        const char *e = ncclGetLastError(comm);
        if (r != ncclInvalidArgument)
            FAIL("root %d: ncclBroadcast returned %d, expected ncclInvalidArgument", bad[i], (int)r);
        if (!e || !strstr(e, "invalid root"))
            FAIL("root %d: ncclGetLastError says '%s'", bad[i], e ? e : "(null)");
    }
    if (ncclBcast(recvb, 256, ncclFloat32, 7, comm, STREAM) != ncclInvalidArgument)
        FAIL("ncclBcast with root 7 of 1 was not refused");
    if (bcast(256, 0, comm) != ncclSuccess)
        FAIL("root 0 failed");
    want_launch(want[0], 256 * sizeof(float));
    check_log_lines("bad-root", want[0], LINE_LEN, 1);
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
}

static void mode_roots(void)
{
    static char want[8][LINE_LEN];
    const char *rk = getenv("FAKE_NCCL_RANK");
    ncclComm_t comm = new_world_comm(2, rk ? atoi(rk) : 0);
    fake_log_clear();
    for (int root = 0; root < 2; root++)
        if (bcast(1024, root, comm) != ncclSuccess)
            FAIL("4 KB from root %d failed: %s", root, ncclGetLastError(comm));
    if (ncclBcast(recvb, 1024, ncclFloat32, 1, comm, STREAM) != ncclSuccess)
        FAIL("ncclBcast from root 1 failed");
    if (bcast(1 << 19, 1, comm) != ncclSuccess)
        FAIL("2 MB from root 1 failed");
    if (bcast(1024, 2, comm) != ncclInvalidArgument)
        FAIL("root 2 of 2 ranks was not refused");
    want_launch(want[0], 4096);
    want_launch(want[1], 4096);
    want_launch(want[2], 4096);
    rec_fmt_ncclBroadcast(want[3], LINE_LEN, sendb, recvb, 1 << 19, ncclFloat32, 1, comm, STREAM);
    check_log_lines("roots", want[0], LINE_LEN, 4);
    if (ncclCommDestroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy failed");
}

static const struct shim_mode modes[] = {{"bad-root", mode_bad_root}, {"roots", mode_roots}};

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... %s MODE\n", argv[0]);
        return 2;
    }
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
