/* SPDX-License-Identifier: MIT */
/*
 * Two-process helpers for the transport tests: the test process (rank 0)
 * forks its peer (rank 1) over a socketpair, and reaps it within a deadline;
 * a bootstrap allgather over the pair, and byte-sized handshakes between the
 * two (exact reads and writes and the bounded reap from
 * tests/common/proc_mesh.h, whose ranks are all children of the parent).
 */
#ifndef MSCX_TEST_NET_PAIR_H
#define MSCX_TEST_NET_PAIR_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mscx/status.h"
#include "proc_mesh.h"

struct net_pair {
    int fd;        /* our end of the socketpair */
    uint32_t rank; /* 0 (parent) or 1 (child) */
};

/**
 * Fork the peer over a new socketpair; the parent keeps one end, the child
 * the other, in @p fd_p. @return the child's pid in the parent, 0 in the
 * child, -1 when socketpair or fork failed (nothing left open).
 */
static inline pid_t net_pair_fork(int *fd_p)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    close(sv[pid == 0 ? 0 : 1]);
    *fd_p = sv[pid == 0 ? 1 : 0];
    return pid;
}

/**
 * Parent: reap the child @p pid within @p deadline_s seconds. @return its exit
 * code (128 + signal when a signal ended it), or -1 when it was still running
 * at the deadline (it is killed then).
 */
static inline int net_pair_reap(pid_t pid, int deadline_s)
{
    int code = -1;
    return proc_mesh_wait(&pid, 1, deadline_s, &code) == 0 ? code : -1;
}

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
