/* SPDX-License-Identifier: MIT */
/* The fake libnccl's log, result and output-writing hooks (see fake_nccl.h). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_nccl.h"

static int env_int(const char *name, int dflt)
{
    const char *s = getenv(name); /* the fake may read its own settings */
    return s && *s ? atoi(s) : dflt;
}

void fake_record(const char *rec)
{
    const char *path = getenv("FAKE_NCCL_LOG");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0)
        return;
    char line[FAKE_REC_MAX + 2];
    size_t n = strlen(rec);
    memcpy(line, rec, n);
    line[n++] = '\n';
    ssize_t w = write(fd, line, n);
    (void)w;
    close(fd);
}

ncclResult_t fake_result(void)
{
    return (ncclResult_t)env_int("FAKE_NCCL_RESULT", ncclSuccess);
}

/*
 * Communicators come from a static pool: the fidelity driver destroys
 * synthetic handles, not these, and the pool keeps LeakSanitizer quiet.
 */
static ncclComm_t fake_comm(void)
{
    static unsigned pool[256][16];
    static unsigned next;
    unsigned *c = pool[next % 256];
    c[0] = 0xfa4ec033u;
    c[1] = ++next;
    return (ncclComm_t)c;
}

void fake_hook_ncclGetVersion(int *version)
{
    if (version)
        *version = env_int("FAKE_NCCL_VERSION", NCCL_VERSION_CODE);
}

void fake_hook_ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (uniqueId)
        memset(uniqueId->internal, 0x5a, sizeof(uniqueId->internal));
}

void fake_hook_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    (void)nranks;
    (void)commId;
    (void)rank;
    if (comm)
        *comm = fake_comm();
}

void fake_hook_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                      ncclConfig_t *config)
{
    (void)config;
    fake_hook_ncclCommInitRank(comm, nranks, commId, rank);
}

void fake_hook_ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                                        ncclConfig_t *config)
{
    (void)nranks;
    (void)myrank;
    (void)nId;
    (void)commIds;
    (void)config;
    if (newcomm)
        *newcomm = fake_comm();
}

void fake_hook_ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    (void)devlist;
    for (int i = 0; comm && i < ndev; i++)
        comm[i] = fake_comm();
}

void fake_hook_ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    (void)comm;
    (void)key;
    (void)config;
    if (newcomm)
        *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : fake_comm();
}

void fake_hook_ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                              ncclConfig_t *config, int shrinkFlags)
{
    (void)comm;
    (void)excludeRanksList;
    (void)excludeRanksCount;
    (void)config;
    (void)shrinkFlags;
    if (newcomm)
        *newcomm = fake_comm();
}

void fake_hook_ncclCommCount(const ncclComm_t comm, int *count)
{
    (void)comm;
    if (count)
        *count = env_int("FAKE_NCCL_NRANKS", 1);
}

void fake_hook_ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    (void)comm;
    if (rank)
        *rank = 0;
}

void fake_hook_ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    (void)comm;
    if (device)
        *device = 0;
}

/*
 * The fidelity driver frees synthetic pointers, not the ones handed out, so
 * allocations come from a static arena that never needs freeing (no leak
 * under LeakSanitizer). Sizes beyond the arena get NULL.
 */
void fake_hook_ncclMemAlloc(void **ptr, size_t size)
{
    static _Alignas(256) char arena[1 << 16];
    static size_t used;
    size_t n = (size + 255) & ~(size_t)255;
    if (!ptr)
        return;
    if (n == 0)
        n = 256;
    if (n > sizeof(arena)) {
        *ptr = NULL;
        return;
    }
    if (used + n > sizeof(arena))
        used = 0;
    *ptr = arena + used;
    used += n;
}

void fake_hook_ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    (void)comm;
    if (asyncError)
        *asyncError = ncclSuccess;
}
