/* SPDX-License-Identifier: MIT */
/*
 * One rank of an ncclCommGrow, as one process of the fake NCCL's world
 * (FAKE_NCCL_WORLD, FAKE_NCCL_RANK, FAKE_NCCL_NRANKS: the grown size).
 *
 *   grow-driver --grow-from=P [--group] [--nonblocking] [--expect-shim]
 *
 * Ranks below P make a communicator of P ranks from the id rank 0 makes
 * (written to DRV_ID_FILE), and grow it: rank 0 as its root, with the id
 * its ncclCommGetUniqueId makes (written to DRV_ID_FILE.grow); the others
 * without one. The ranks from P on are new: they read that id and join.
 * Every rank then runs one AllReduce on the grown communicator and
 * destroys what it made. --group puts the ncclCommGrow in a group;
 * --nonblocking asks for a non-blocking communicator and polls
 * ncclCommGetAsyncError until its init completed. --expect-shim is taken and
 * ignored (agree.sh passes it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rec_gen.h"
#include "id_file.h"
#include "shim_check.h"

#ifdef REC_HAVE_ncclCommGrow
static ncclResult_t grow(ncclComm_t parent, int n, const ncclUniqueId *id, int rank, ncclComm_t *grown,
                         int group, int nb)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (group && ncclGroupStart() != ncclSuccess)
        return ncclInternalError;
    ncclResult_t r = ncclCommGrow(parent, n, id, rank, grown, nb ? &config : NULL);
    if (group) {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress)
            r = e == ncclSuccess ? r : e;
    }
    if (!nb || r != ncclInProgress || !*grown)
        return r;
    /* a non-blocking init: polled until it completed, as NCCL's users must */
    ncclResult_t async = ncclInProgress;
    for (int polls = 0; async == ncclInProgress && polls < 100000; polls++)
        if (ncclCommGetAsyncError(*grown, &async) != ncclSuccess)
            async = ncclInternalError;
    return async;
}

int main(int argc, char **argv)
{
    int from = 0, group = 0, nb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--grow-from=", 12))
            from = atoi(argv[i] + 12);
        else if (!strcmp(argv[i], "--group"))
            group = 1;
        else if (!strcmp(argv[i], "--nonblocking"))
            nb = 1;
        else if (strcmp(argv[i], "--expect-shim") != 0)
            from = -1;
    }
    const char *path = getenv("DRV_ID_FILE"), *r_env = getenv("FAKE_NCCL_RANK"),
               *n_env = getenv("FAKE_NCCL_NRANKS");
    if (from <= 0 || !path || !r_env || !n_env) {
        fprintf(stderr,
                "usage: DRV_ID_FILE=... FAKE_NCCL_RANK=r FAKE_NCCL_NRANKS=n %s --grow-from=P [--group] "
                "[--nonblocking]\n",
                argv[0]);
        return 2;
    }
    int me = atoi(r_env), n = atoi(n_env);
    char grow_path[4096];
    snprintf(grow_path, sizeof(grow_path), "%s.grow", path);
    ncclUniqueId id, gid;
    ncclComm_t parent = NULL, grown = NULL;
    ncclResult_t r;
    if (me < from) {
        char size[16];
        snprintf(size, sizeof(size), "%d", from);
        setenv("FAKE_NCCL_NRANKS", size, 1); /* the parent's size, for the fake's calls on it */
        if (me == 0 && (ncclGetUniqueId(&id) != ncclSuccess || id_file_write(path, &id)))
            return 1;
        if (me != 0 && id_file_read(path, &id, 30))
            return 1;
        if (ncclCommInitRank(&parent, from, id, me) != ncclSuccess) {
            FAIL("ncclCommInitRank of the parent failed");
            return 1;
        }
        if (me == 0 && (ncclCommGetUniqueId(parent, &gid) != ncclSuccess || id_file_write(grow_path, &gid)))
            return 1;
        r = grow(parent, n, me == 0 ? &gid : NULL, -1, &grown, group, nb);
    } else {
        if (id_file_read(grow_path, &gid, 30))
            return 1;
        r = grow(NULL, n, &gid, me, &grown, group, nb);
    }
    if (r != ncclSuccess || !grown) {
        FAIL("ncclCommGrow returned %d, comm %p", (int)r, (void *)grown);
        return 1;
    }
    float buf[256] = {0};
    if (ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, grown, NULL) != ncclSuccess)
        FAIL("ncclAllReduce on the grown communicator failed");
    if (ncclCommDestroy(grown) != ncclSuccess || (parent && ncclCommDestroy(parent) != ncclSuccess))
        FAIL("ncclCommDestroy failed");
    return failures ? 1 : 0;
}
#else
int main(void)
{
    printf("skip: this nccl.h has no ncclCommGrow\n");
    return 77;
}
#endif
