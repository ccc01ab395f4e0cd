/* SPDX-License-Identifier: MIT */
/*
 * Multi-process test helpers: fork N ranks from one parent with a
 * socketpair between every two of them, a struct mscx_bootstrap-shaped
 * allgather and a barrier over those sockets (bounded by a timeout: a dead
 * peer gives EOF, a hung one a timeout, never a hang), and a parent-side wait
 * with a hard deadline that kills every rank when it passes.
 * tests/unit/net/net_pair.h (two ranks, the parent one of them) uses the same
 * exact read and write and the same bounded wait.
 */
#ifndef MSCX_TEST_PROC_MESH_H
#define MSCX_TEST_PROC_MESH_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mscx/status.h"

#define PROC_MESH_MAX 16
#define PROC_MESH_MAX_BYTES 65536 /* per rank and exchange: all writes fit in the socket buffers */

struct proc_mesh {
    uint32_t rank, nranks;
    int fd[PROC_MESH_MAX]; /* our end of the socketpair with rank q; -1 for ourself */
    int timeout_ms;        /* per exchange; < 0: none */
};

/* Account one read(2) or write(2) result @p n in @p done. @return 0 (moved on, or EINTR: try again), -1 (EOF
 * or error). */
static inline int proc_mesh_step(ssize_t n, size_t *done)
{
    if (n < 0 && errno == EINTR)
        return 0;
    if (n <= 0)
        return -1;
    *done += (size_t)n;
    return 0;
}

/** Write all of @p buf. @return 0, or -1 (peer gone). */
static inline int proc_mesh_write(int fd, const void *buf, size_t len)
{
    for (size_t done = 0; done < len;)
        if (proc_mesh_step(write(fd, (const char *)buf + done, len - done), &done) < 0)
            return -1;
    return 0;
}

/** Read exactly @p len bytes, waiting at most @p timeout_ms in all (< 0: no limit). @return 0, or -1. */
static inline int proc_mesh_read(int fd, void *buf, size_t len, int timeout_ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t done = 0; done < len;) {
        if (timeout_ms >= 0) {
            struct timespec t1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long spent = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
            struct pollfd pfd = {fd, POLLIN, 0};
            int left = spent >= timeout_ms ? 0 : (int)(timeout_ms - spent);
            int r = poll(&pfd, 1, left);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return -1;
        }
        if (proc_mesh_step(read(fd, (char *)buf + done, len - done), &done) < 0)
            return -1;
    }
    return 0;
}

/** The bootstrap allgather of struct mscx_bootstrap: @p ctx is a struct proc_mesh. */
static inline mscx_status_t proc_mesh_allgather(void *ctx, const void *mine, void *all, size_t bytes)
{
    struct proc_mesh *m = (struct proc_mesh *)ctx;
    char *a = (char *)all;
    if (bytes > PROC_MESH_MAX_BYTES) {
        fprintf(stderr, "proc_mesh: rank %u: allgather of %zu bytes is over the %d-byte limit\n", m->rank,
                bytes, PROC_MESH_MAX_BYTES);
        return MSCX_ERR_INVALID_ARG;
    }
    for (uint32_t q = 0; q < m->nranks; q++)
        if (q != m->rank && proc_mesh_write(m->fd[q], mine, bytes) < 0) {
            fprintf(stderr, "proc_mesh: rank %u: rank %u is gone (write)\n", m->rank, q);
            return MSCX_ERR_REMOTE;
        }
    memcpy(a + (size_t)m->rank * bytes, mine, bytes);
    for (uint32_t q = 0; q < m->nranks; q++)
        if (q != m->rank && proc_mesh_read(m->fd[q], a + (size_t)q * bytes, bytes, m->timeout_ms) < 0) {
            fprintf(stderr, "proc_mesh: rank %u: no data from rank %u within %d ms (dead or hung)\n", m->rank,
                    q, m->timeout_ms);
            return MSCX_ERR_REMOTE;
        }
    return MSCX_OK;
}

static inline int proc_mesh_barrier(struct proc_mesh *m)
{
    uint8_t mine = 1, all[PROC_MESH_MAX];
    return proc_mesh_allgather(m, &mine, all, 1) == MSCX_OK ? 0 : -1;
}

/**
 * Fork @p n ranks. In a child: returns its rank with @p m ready (the parent's
 * other descriptors closed, so a dead peer reads as EOF). In the parent:
 * returns -1 with @p pids filled, or -2 when a fork failed (ranks already
 * started are killed).
 */
static inline int proc_mesh_fork(struct proc_mesh *m, uint32_t n, int timeout_ms, pid_t *pids)
{
    int sv[PROC_MESH_MAX][PROC_MESH_MAX][2];
    if (n < 1 || n > PROC_MESH_MAX)
        return -2;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++)
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i][j]) != 0)
                return -2;
    fflush(NULL);
    for (uint32_t r = 0; r < n; r++) {
        pid_t p = fork();
        if (p < 0) {
            for (uint32_t k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            return -2;
        }
        if (p == 0) {
            m->rank = r;
            m->nranks = n;
            m->timeout_ms = timeout_ms;
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = i + 1; j < n; j++) {
                    /* rank i keeps end 0 of (i, j), rank j end 1 */
                    if (i == r)
                        m->fd[j] = sv[i][j][0];
                    else
                        close(sv[i][j][0]);
                    if (j == r)
                        m->fd[i] = sv[i][j][1];
                    else
                        close(sv[i][j][1]);
                }
            m->fd[r] = -1;
            return (int)r;
        }
        pids[r] = p;
    }
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++) {
            close(sv[i][j][0]);
            close(sv[i][j][1]);
        }
    return -1;
}

/**
 * Parent: reap the @p n ranks, at most @p deadline_s seconds in all; past it,
 * SIGKILL every rank still running. @p code receives each rank's exit code
 * (128 + signal when killed by a signal). @return 0, or -1 after the deadline.
 */
static inline int proc_mesh_wait(const pid_t *pids, uint32_t n, int deadline_s, int *code)
{
    int left = (int)n, late = 0;
    int reaped[PROC_MESH_MAX] = {0};
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (left > 0) {
        int progressed = 0;
        for (uint32_t r = 0; r < n; r++) {
            int ws;
            if (reaped[r])
                continue;
            pid_t p = waitpid(pids[r], &ws, WNOHANG);
            if (p == pids[r]) {
                code[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
                reaped[r] = 1;
                left--;
                progressed = 1;
            }
        }
        if (progressed)
            continue;
        struct timespec t1, nap = {0, 20000000};
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (!late && t1.tv_sec - t0.tv_sec >= deadline_s) {
            fprintf(stderr, "proc_mesh: ranks still running after %d s: killing them\n", deadline_s);
            for (uint32_t r = 0; r < n; r++)
                if (!reaped[r]) {
                    fprintf(stderr, "proc_mesh: rank %u (pid %d) killed at the deadline\n", r, (int)pids[r]);
                    kill(pids[r], SIGKILL);
                }
            late = 1;
        }
        nanosleep(&nap, NULL);
    }
    return late ? -1 : 0;
}

#endif /* MSCX_TEST_PROC_MESH_H */
