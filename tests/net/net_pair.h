/* SPDX-License-Identifier: MIT */
/*
 * Two-process helpers for the transport tests: a bootstrap allgather over a
 * socketpair, and byte-sized handshakes between the two test processes
 * (exact reads and writes from tests/common/proc_mesh.h).
 */
#ifndef MSCX_TEST_NET_PAIR_H
#define MSCX_TEST_NET_PAIR_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "mscx/status.h"
#include "proc_mesh.h"

struct net_pair {
    int fd;        /* our end of the socketpair */
    uint32_t rank; /* 0 (parent) or 1 (child) */
};

static inline int net_pair_write(int fd, const void *buf, size_t len)
{
    return proc_mesh_write(fd, buf, len);
}

static inline int net_pair_read(int fd, void *buf, size_t len)
{
    return proc_mesh_read(fd, buf, len, -1);
}

/* struct mscx_bootstrap-shaped allgather for two ranks. */
static inline mscx_status_t net_pair_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct net_pair *np = ctx;
    char *a = all;
    if (net_pair_write(np->fd, mine, bytes) < 0)
        return MSCX_ERR_REMOTE;
    memcpy(a + np->rank * bytes, mine, bytes);
    if (net_pair_read(np->fd, a + (1 - np->rank) * bytes, bytes) < 0)
        return MSCX_ERR_REMOTE;
    return MSCX_OK;
}

#endif
