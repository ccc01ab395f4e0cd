/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory slot exchange of the GPU executor's user-buffer
 * registration (executor/net/shm_slots.c): forked processes exchanging over
 * thousands of launches, a peer that never publishes (bounded timeout), the
 * "cannot" marker, stale and ahead entries, abort, names unlinked.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mscx/log.h"
#include "proc_mesh.h"
#include "test_common.h"
#include "shm_slots.h"

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct payload {
    uint32_t rank;
    uint32_t pad;
    uint64_t seq;
    uint64_t word[8];
};

/* Two exchanges of one process, ranks 0 and 1, attached to each other and unlinked. */
static void pair_make(struct mscx_slots **u)
{
    char name[2][MSCX_SLOTS_NAME_MAX];
    for (uint32_t r = 0; r < 2; r++)
        ck_assert_int_eq(mscx_slots_create("test", r, 2, name[r], &u[r]), MSCX_OK);
    ck_assert_int_eq(mscx_slots_attach(u[0], 1, name[1]), MSCX_OK);
    ck_assert_int_eq(mscx_slots_attach(u[1], 0, name[0]), MSCX_OK);
    for (uint32_t r = 0; r < 2; r++)
        mscx_slots_unlink(u[r]);
    for (uint32_t r = 0; r < 2; r++) { /* the names are gone, the mappings stay */
        int fd = shm_open(name[r], O_RDONLY, 0);
        ck_assert_int_lt(fd, 0);
        ck_assert_int_eq(errno, ENOENT);
    }
}

/* Rank @p r of a forked exchange among m->nranks processes: @p iters launches. @return exit code. */
static int mesh_rank(struct proc_mesh *m, uint64_t iters)
{
    char name[MSCX_SLOTS_NAME_MAX], all[PROC_MESH_MAX][MSCX_SLOTS_NAME_MAX];
    struct mscx_slots *u;
    struct mscx_slots_limits lim = {10000, NULL};
    uint32_t ranks[PROC_MESH_MAX];
    if (mscx_slots_create("mesh", m->rank, m->nranks, name, &u) != MSCX_OK)
        return 10;
    if (proc_mesh_allgather(m, name, all, MSCX_SLOTS_NAME_MAX) != MSCX_OK)
        return 11;
    for (uint32_t q = 0; q < m->nranks; q++) {
        ranks[q] = q;
        if (q != m->rank && mscx_slots_attach(u, q, all[q]) != MSCX_OK)
            return 12;
    }
    if (proc_mesh_barrier(m) != 0)
        return 13;
    mscx_slots_unlink(u);
    srand(m->rank + 1);
    for (uint64_t s = 1; s <= iters; s++) {
        struct payload p = {m->rank, 0, s, {0}};
        for (int k = 0; k < 8; k++)
            p.word[k] = s * 1000003u + m->rank * 7919u + (uint64_t)k;
        if (rand() % 16 == 0) { /* let the others run ahead and find our entry stale */
            struct timespec nap = {0, (rand() % 200) * 1000};
            nanosleep(&nap, NULL);
        }
        if (mscx_slots_publish(u, s, MSCX_OK, &p, sizeof(p)) != MSCX_OK)
            return 14;
        for (uint32_t q = 0; q < m->nranks; q++) {
            struct payload g;
            int32_t st = -100;
            if (q == m->rank)
                continue;
            if (mscx_slots_wait(u, q, s, &lim, &st, &g, sizeof(g)) != MSCX_OK || st != MSCX_OK)
                return 15;
            if (g.rank != q || g.seq != s)
                return 16;
            for (int k = 0; k < 8; k++)
                if (g.word[k] != s * 1000003u + q * 7919u + (uint64_t)k)
                    return 17;
        }
        uint32_t bad_rank = 0;
        int32_t bad = -100;
        if (mscx_slots_verdict(u, s, MSCX_OK) != MSCX_OK ||
            mscx_slots_agree(u, ranks, m->nranks, s, &lim, &bad_rank, &bad) != MSCX_OK)
            return 18;
        if (bad_rank != UINT32_MAX || bad != MSCX_OK)
            return 19;
    }
    mscx_slots_destroy(u);
    return 0;
}

START_TEST(test_mesh_many_launches)
{
    struct proc_mesh m;
    pid_t pids[PROC_MESH_MAX];
    int code[PROC_MESH_MAX];
    const uint32_t n = 4;
    int r = proc_mesh_fork(&m, n, 20000, pids);
    if (r >= 0)
        _exit(mesh_rank(&m, 3000));
    ck_assert_int_eq(r, -1);
    ck_assert_int_eq(proc_mesh_wait(pids, n, 100, code), 0);
    for (uint32_t q = 0; q < n; q++)
        ck_assert_msg(code[q] == 0, "rank %u exited with %d", q, code[q]);
}
END_TEST

/* A forked peer that attaches but never publishes launch 2: the wait ends in a bounded timeout. */
START_TEST(test_peer_never_publishes)
{
    struct proc_mesh m;
    pid_t pids[2];
    int code[2];
    int r = proc_mesh_fork(&m, 2, 20000, pids);
    if (r >= 0) {
        char name[MSCX_SLOTS_NAME_MAX], all[2][MSCX_SLOTS_NAME_MAX];
        struct mscx_slots *u;
        struct mscx_slots_limits lim = {300, NULL};
        int32_t st;
        struct payload g;
        if (mscx_slots_create("silent", m.rank, 2, name, &u) != MSCX_OK ||
            proc_mesh_allgather(&m, name, all, sizeof(name)) != MSCX_OK ||
            mscx_slots_attach(u, 1 - m.rank, all[1 - m.rank]) != MSCX_OK || proc_mesh_barrier(&m) != 0)
            _exit(10);
        mscx_slots_unlink(u);
        if (mscx_slots_publish(u, 1, MSCX_OK, &g, sizeof(g)) != MSCX_OK)
            _exit(11);
        if (m.rank == 1) {
            /* publishes launch 1 only, then stays alive until rank 0 gave up */
            _exit(proc_mesh_barrier(&m) == 0 ? 0 : 12);
        }
        if (mscx_slots_wait(u, 1, 1, &lim, &st, &g, sizeof(g)) != MSCX_OK || st != MSCX_OK)
            _exit(13);
        mscx_test_allow_warn("no publication of launch 2 from rank 1 within 300 ms");
        double t0 = ms_now();
        mscx_status_t ws = mscx_slots_wait(u, 1, 2, &lim, &st, &g, sizeof(g));
        double ms = ms_now() - t0;
        int ok = ws == MSCX_ERR_TIMEOUT && ms >= 250 && ms < 3000 &&
                 strstr(mscx_test_last_warn(), "no publication of launch 2 from rank 1") != NULL;
        if (!ok)
            fprintf(stderr, "wait: %s after %.0f ms, warn \"%s\"\n", mscx_status_str(ws), ms,
                    mscx_test_last_warn());
        proc_mesh_barrier(&m);
        mscx_slots_destroy(u);
        _exit(ok ? 0 : 14);
    }
    ck_assert_int_eq(r, -1);
    ck_assert_int_eq(proc_mesh_wait(pids, 2, 60, code), 0);
    ck_assert_msg(code[0] == 0 && code[1] == 0, "exit codes %d %d", code[0], code[1]);
}
END_TEST

/* The "cannot" marker is delivered at once (no wait until the timeout) and every rank agrees on the failure.
 */
START_TEST(test_cannot_marker)
{
    struct mscx_slots *u[2];
    struct mscx_slots_limits lim = {5000, NULL};
    pair_make(u);
    ck_assert_int_eq(mscx_slots_publish(u[0], 1, MSCX_ERR_UNSUPPORTED, NULL, 0), MSCX_OK);
    int32_t st = 0;
    struct payload g;
    memset(&g, 0x5a, sizeof(g));
    double t0 = ms_now();
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 1, &lim, &st, &g, sizeof(g)), MSCX_OK);
    ck_assert_double_lt(ms_now() - t0, 1000);
    ck_assert_int_eq(st, MSCX_ERR_UNSUPPORTED);
    ck_assert_uint_eq(g.rank, 0); /* no payload: zeroes, not what the buffer held */
    /* rank 0 knows it failed, rank 1 saw the marker: both post an error; both agree on rank 0 */
    ck_assert_int_eq(mscx_slots_verdict(u[0], 1, MSCX_ERR_UNSUPPORTED), MSCX_OK);
    ck_assert_int_eq(mscx_slots_verdict(u[1], 1, MSCX_ERR_REMOTE), MSCX_OK);
    const uint32_t both[2] = {0, 1};
    for (int r = 0; r < 2; r++) {
        uint32_t bad_rank = 7;
        int32_t bad = 0;
        ck_assert_int_eq(mscx_slots_agree(u[r], both, 2, 1, &lim, &bad_rank, &bad), MSCX_OK);
        ck_assert_uint_eq(bad_rank, 0);
        ck_assert_int_eq(bad, MSCX_ERR_UNSUPPORTED);
    }
    /* the next launch is clean again */
    ck_assert_int_eq(mscx_slots_publish(u[0], 2, MSCX_OK, NULL, 0), MSCX_OK);
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 2, &lim, &st, NULL, 0), MSCX_OK);
    ck_assert_int_eq(st, MSCX_OK);
    mscx_slots_destroy(u[0]);
    mscx_slots_destroy(u[1]);
}
END_TEST

/* An entry of an earlier launch with the same parity is never taken; one of a later launch is an error. */
START_TEST(test_stale_and_ahead)
{
    struct mscx_slots *u[2];
    struct mscx_slots_limits lim = {200, NULL};
    pair_make(u);
    struct payload p = {0, 0, 1, {1}}, g;
    int32_t st;
    ck_assert_int_eq(mscx_slots_publish(u[0], 1, MSCX_OK, &p, sizeof(p)), MSCX_OK);
    ck_assert_int_eq(mscx_slots_verdict(u[0], 1, MSCX_OK), MSCX_OK);
    mscx_test_allow_warn("no publication of launch 3 from rank 0");
    double t0 = ms_now();
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 3, &lim, &st, &g, sizeof(g)), MSCX_ERR_TIMEOUT);
    ck_assert_double_ge(ms_now() - t0, 150);
    ck_assert_double_lt(ms_now() - t0, 3000);
    mscx_test_allow_warn("no verdict of launch 3 from rank 0");
    uint32_t bad_rank = 9;
    int32_t bad = 9;
    const uint32_t zero = 0;
    ck_assert_int_eq(mscx_slots_agree(u[1], &zero, 1, 3, &lim, &bad_rank, &bad), MSCX_ERR_TIMEOUT);
    ck_assert_uint_eq(bad_rank, 9); /* outputs untouched on failure */
    ck_assert_int_eq(bad, 9);
    /* ahead: rank 0 at launch 5 while rank 1 asks for 3 */
    p.seq = 5;
    ck_assert_int_eq(mscx_slots_publish(u[0], 5, MSCX_OK, &p, sizeof(p)), MSCX_OK);
    mscx_test_allow_warn("different launches");
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 3, &lim, &st, &g, sizeof(g)), MSCX_ERR_INTERNAL);
    /* the matching launch is taken */
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 5, &lim, &st, &g, sizeof(g)), MSCX_OK);
    ck_assert_uint_eq(g.seq, 5);
    mscx_slots_destroy(u[0]);
    mscx_slots_destroy(u[1]);
}
END_TEST

/* An abort flag ends a wait that has no timeout. */
START_TEST(test_abort_ends_wait)
{
    struct mscx_slots *u[2];
    volatile int32_t abort_flag = 1;
    struct mscx_slots_limits lim = {0, &abort_flag};
    int32_t st;
    pair_make(u);
    ck_assert_int_eq(mscx_slots_wait(u[1], 0, 1, &lim, &st, NULL, 0), MSCX_ERR_REMOTE);
    mscx_slots_destroy(u[0]);
    mscx_slots_destroy(u[1]);
}
END_TEST

START_TEST(test_bad_arguments)
{
    struct mscx_slots *u[2];
    char name[MSCX_SLOTS_NAME_MAX];
    int32_t st;
    pair_make(u);
    struct mscx_slots_limits lim = {100, NULL};
    ck_assert_int_eq(mscx_slots_publish(u[0], 0, MSCX_OK, NULL, 0), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_slots_publish(u[0], 1, MSCX_OK, name, MSCX_SLOTS_PAYLOAD_MAX + 1),
                     MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_slots_wait(u[0], 5, 1, &lim, &st, NULL, 0), MSCX_ERR_INVALID_ARG);
    mscx_test_allow_warn("bad attach");
    ck_assert_int_eq(mscx_slots_attach(u[0], 1, "/whatever"), MSCX_ERR_INVALID_ARG); /* already attached */
    mscx_slots_destroy(u[0]);
    mscx_slots_destroy(u[1]);
    ck_assert_int_eq(mscx_slots_create("test", 0, 2, name, &u[0]), MSCX_OK);
    mscx_test_allow_warn("cannot open rank 1's user-buffer exchange segment");
    ck_assert_int_eq(mscx_slots_attach(u[0], 1, "/mscx-shm_slots-no-such-segment"), MSCX_ERR_SYSTEM);
    mscx_slots_destroy(u[0]); /* unlinks: the name is gone */
    ck_assert_int_lt(shm_open(name, O_RDONLY, 0), 0);
    mscx_slots_destroy(NULL);
}
END_TEST

/* A child creates a segment, sends its name, then dies (@p die) or waits to be killed. */
static pid_t child_segment(int die, char name[MSCX_SLOTS_NAME_MAX])
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct mscx_slots *u;
        char mine[MSCX_SLOTS_NAME_MAX] = "";
        if (mscx_slots_create("stale", 0, 2, mine, &u) != MSCX_OK)
            _exit(1);
        ssize_t w = write(fds[1], mine, sizeof(mine));
        (void)w;
        if (die)
            raise(SIGKILL); /* no unlink, no exit handler: as a crash */
        pause();
        _exit(0);
    }
    close(fds[1]);
    ck_assert_int_eq(read(fds[0], name, MSCX_SLOTS_NAME_MAX), MSCX_SLOTS_NAME_MAX);
    close(fds[0]);
    return pid;
}

static int segment_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* A killed rank's segment is gone after the next setup; a live process's stays. */
START_TEST(test_stale_segment_removed)
{
    char dead[MSCX_SLOTS_NAME_MAX], live[MSCX_SLOTS_NAME_MAX], mine[MSCX_SLOTS_NAME_MAX];
    int st;
    pid_t l = child_segment(0, live);
    pid_t d = child_segment(1, dead);
    ck_assert_int_eq(waitpid(d, &st, 0), d);
    int dead_left = WIFSIGNALED(st) && segment_exists(dead);
    struct mscx_slots *u = NULL;
    mscx_status_t made = mscx_slots_create("setup", 0, 2, mine, &u);
    int dead_after = segment_exists(dead), live_after = segment_exists(live);
    kill(l, SIGKILL);
    waitpid(l, &st, 0);
    ck_assert_msg(dead_left, "the killed child left no segment %s: the test proves nothing", dead);
    ck_assert_int_eq(made, MSCX_OK);
    ck_assert_msg(!dead_after, "%s of the killed process is still there after the next setup", dead);
    ck_assert_msg(live_after, "%s of a live process was removed", live);
    waitpid(l, &st, 0);
    shm_unlink(live);
    mscx_slots_destroy(u);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("shm_slots");
    TCase *tc = mscx_tcase("exchange");
    tcase_add_test(tc, test_mesh_many_launches);
    tcase_add_test(tc, test_peer_never_publishes);
    tcase_add_test(tc, test_cannot_marker);
    tcase_add_test(tc, test_stale_and_ahead);
    tcase_add_test(tc, test_abort_ends_wait);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_stale_segment_removed);
    suite_add_tcase(s, tc);
    return s;
}
