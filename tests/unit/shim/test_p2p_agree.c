/* SPDX-License-Identifier: MIT */
/*
 * The host-side agreement on running a send/recv group as an alltoall
 * (shim/p2p_agree.c): ranks as threads of this process and as forked
 * processes vote through one shared segment; every rank must get the same
 * answer, commits only when all ranks vote yes at consistent positions, and
 * no wait outlives its timeout. The source is included for its segment
 * layout: a rank that dies holding the lock takes it directly.
 */
#include "p2p_agree.c"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test_common.h"
#include "test_p2p_agree_int.h"

static void random_secret(uint8_t secret[SHIM_SECRET_BYTES])
{
    FILE *f = fopen("/dev/urandom", "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fread(secret, 1, SHIM_SECRET_BYTES, f), SHIM_SECRET_BYTES);
    fclose(f);
}

static void pt_init(struct pt *pt, uint32_t n)
{
    memset(pt, 0, sizeof(*pt));
    at(pt, n, 0);
    pt->p.bytes = BYTES;
    pt->p.dtype = ncclFloat32;
    pt->p.yes = 1;
    pt->p.sent = pt->sent;
    pt->p.received = pt->received;
    pt->timeout_ms = LONG_MS;
}

static uint32_t elapsed_ms(uint64_t t0)
{
    return (uint32_t)((now_ns() - t0) / 1000000u);
}

static int timed_vote(struct shim_p2p_agree *a, const struct pt *pt, uint32_t *ms_p)
{
    uint64_t t0 = now_ns();
    int res = shim_p2p_agree_vote(a, &pt->p, pt->timeout_ms);
    *ms_p = elapsed_ms(t0);
    return res;
}

static struct world *world_new(const struct scen *sc)
{
    ck_assert(sc->n <= MAXR && sc->rounds <= MAXROUNDS);
    struct world *w = mmap(NULL, sizeof(*w), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(w, MAP_FAILED);
    memset(w, 0, sizeof(*w));
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    ck_assert_int_eq(pthread_barrier_init(&w->barrier, &attr, sc->n), 0);
    pthread_barrierattr_destroy(&attr);
    random_secret(w->secret);
    w->sc = sc;
    return w;
}

void world_free(struct world *w)
{
    pthread_barrier_destroy(&w->barrier);
    munmap(w, sizeof(*w));
}

/* The object of @p secret's segment no longer exists. */
static void check_unlinked(const uint8_t secret[SHIM_SECRET_BYTES])
{
    char name[AGREE_NAME_MAX];
    uint64_t check;
    agree_name(secret, name, &check);
    int fd = shm_open(name, O_RDONLY, 0);
    int err = errno;
    if (fd >= 0)
        close(fd);
    ck_assert_msg(fd < 0 && err == ENOENT, "%s still exists after every rank closed it", name);
}

static int name_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* One rank of a world: open, vote every round the scenario gives it, close. */
static void rank_run(struct world *w, uint32_t rank)
{
    const struct scen *sc = w->sc;
    struct shim_p2p_agree *a = NULL;
    w->open_st[rank] = shim_p2p_agree_open(w->secret, rank, sc->n, &a);
    pthread_barrier_wait(&w->barrier);
    for (uint32_t r = 0; r < sc->rounds; r++) {
        struct pt pt;
        pt_init(&pt, sc->n);
        w->result[r][rank] = SKIP;
        if (a && sc->point(sc, r, rank, &pt)) {
            struct timespec ts = {(time_t)(pt.delay_us / 1000000u), (long)(pt.delay_us % 1000000u) * 1000L};
            nanosleep(&ts, NULL);
            w->result[r][rank] = timed_vote(a, &pt, &w->ms[r][rank]);
        }
        if (sc->sync)
            pthread_barrier_wait(&w->barrier);
    }
    shim_p2p_agree_close(a);
}

struct rank_arg {
    struct world *w;
    uint32_t rank;
};

static void *rank_thread(void *p)
{
    struct rank_arg *ra = p;
    rank_run(ra->w, ra->rank);
    return NULL;
}

/* Wait for @p pid, at most @p ms; kill it when it outlives that. @return its wait status, or -1. */
static int wait_bounded(pid_t pid, uint32_t ms)
{
    uint64_t t0 = now_ns();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (elapsed_ms(t0) > ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    return st;
}

/* Run every rank of @p w's scenario, as threads or as processes; then the segment's name must be gone. */
static void world_run(struct world *w, enum mode mode)
{
    uint32_t n = w->sc->n;
    if (mode == THREADS) {
        pthread_t t[MAXR];
        struct rank_arg ra[MAXR];
        for (uint32_t i = 0; i < n; i++) {
            ra[i] = (struct rank_arg){w, i};
            ck_assert_int_eq(pthread_create(&t[i], NULL, rank_thread, &ra[i]), 0);
        }
        for (uint32_t i = 0; i < n; i++)
            pthread_join(t[i], NULL);
    } else {
        pid_t pid[MAXR];
        for (uint32_t i = 0; i < n; i++) {
            pid[i] = fork();
            ck_assert_int_ge(pid[i], 0);
            if (pid[i] == 0) {
                rank_run(w, i);
                _exit(0);
            }
        }
        for (uint32_t i = 0; i < n; i++) {
            int st = wait_bounded(pid[i], 30000);
            ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %u's process failed (%d)",
                          i, st);
        }
    }
    for (uint32_t i = 0; i < n; i++)
        ck_assert_int_eq(w->open_st[i], MSCX_OK);
    check_unlinked(w->secret);
}

/* A world of @p sc, run in mode @p m. */
struct world *world_ran(const struct scen *sc, enum mode m)
{
    struct world *w = world_new(sc);
    world_run(w, m);
    return w;
}

static const char *mode_name(enum mode m)
{
    return m == THREADS ? "threads" : "processes";
}

/* Every rank that voted in round @p r got @p want, within [min_ms, max_ms]. */
void expect_round(const struct world *w, enum mode m, uint32_t r, int want, uint32_t min_ms, uint32_t max_ms)
{
    for (uint32_t i = 0; i < w->sc->n; i++) {
        int got = w->result[r][i];
        if (got == SKIP)
            continue;
        ck_assert_msg(got == want, "%s: round %u rank %u: got %d, expected %d", mode_name(m), r, i, got,
                      want);
        ck_assert_msg(w->ms[r][i] >= min_ms && w->ms[r][i] <= max_ms,
                      "%s: round %u rank %u: took %u ms, expected %u..%u", mode_name(m), r, i, w->ms[r][i],
                      min_ms, max_ms);
    }
}

/*
 * Every rank that voted in round @p r got 0 within SHORT_MS + QUICK_MS, and
 * the one whose deadline ended the round waited its SHORT_MS (the others may
 * have started later).
 */
static void expect_timed_out(const struct world *w, enum mode m, uint32_t r)
{
    uint32_t longest = 0;
    expect_round(w, m, r, 0, 0, SHORT_MS + QUICK_MS);
    for (uint32_t i = 0; i < w->sc->n; i++)
        if (w->result[r][i] != SKIP && w->ms[r][i] > longest)
            longest = w->ms[r][i];
    ck_assert_msg(longest >= SHORT_MS, "%s: round %u ended after %u ms, before the timeout", mode_name(m), r,
                  longest);
}

static void expect_skipped(const struct world *w, uint32_t r, uint32_t rank)
{
    ck_assert_int_eq(w->result[r][rank], SKIP);
}

/* ---- every rank yes at consistent positions ---- */

static int point_all_yes(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    (void)rank;
    at(pt, sc->n, round);
    return 1;
}

START_TEST(test_commit_rounds)
{
    static const uint32_t ns[] = {1, 2, 4, 8};
    enum mode m = _i ? PROCS : THREADS;
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        struct scen sc = {ns[k], MAXROUNDS, 0, point_all_yes, 0};
        struct world *w = world_ran(&sc, m);
        for (uint32_t r = 0; r < sc.rounds; r++)
            expect_round(w, m, r, 1, 0, LONG_MS);
        world_free(w);
    }
}
END_TEST

/* ---- one rank never votes ---- */

static int point_never(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    if (round == 0)
        pt->timeout_ms = SHORT_MS;
    return !(round == 0 && rank == sc->arg);
}

START_TEST(test_never_votes)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {4, 2, 1, point_never, 3};
    struct world *w = world_ran(&sc, m);
    expect_skipped(w, 0, 3);
    expect_timed_out(w, m, 0);
    expect_round(w, m, 1, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

/* ---- rank 0 times out in round 0, and rank arg comes to that round after it left ---- */

static int point_comes_late(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    if (round == 0 && rank == 0)
        pt->timeout_ms = SHORT_MS;
    if (round == 0 && rank == sc->arg)
        pt->delay_us = 2 * SHORT_MS * 1000u;
    return 1;
}

/* Rank 0's timeout decides the round for rank 1 too: rank 2 cannot complete it after rank 0 left. */
START_TEST(test_timeout_decides)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {3, 2, 1, point_comes_late, 2};
    struct world *w = world_ran(&sc, m);
    expect_round(w, m, 0, 0, 0, SHORT_MS + QUICK_MS);
    ck_assert_uint_ge(w->ms[0][0], SHORT_MS);
    ck_assert_uint_lt(w->ms[0][1], SHORT_MS + QUICK_MS);
    ck_assert_uint_lt(w->ms[0][2], QUICK_MS);
    expect_round(w, m, 1, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

/*
 * Ranks that drift apart: a late rank must not spoil the round of the next
 * group. Rank 0 gives up on group 0 and posts group 1; rank 1 comes to
 * group 0 after that, then to group 1.
 */
START_TEST(test_drift)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {2, 2, 0, point_comes_late, 1};
    struct world *w = world_ran(&sc, m);
    expect_round(w, m, 0, 0, 0, SHORT_MS + QUICK_MS);
    ck_assert_uint_lt(w->ms[0][1], QUICK_MS);
    expect_round(w, m, 1, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

/* ---- random delays, timeouts and noes: whoever commits, every rank commits ---- */

static int point_random(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    unsigned seed = round * 7919u + rank * 104729u + 1u;
    at(pt, sc->n, round);
    pt->delay_us = (uint32_t)rand_r(&seed) % 3000u;
    pt->timeout_ms = 1 + (uint32_t)rand_r(&seed) % 8u;
    pt->p.yes = rand_r(&seed) % 20 != 0;
    return 1;
}

START_TEST(test_random_consistent)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {4, 150, 0, point_random, 0};
    struct world *w = world_ran(&sc, m);
    uint32_t commits = 0, abandons = 0;
    for (uint32_t r = 0; r < sc.rounds; r++) {
        int ones = 0;
        for (uint32_t i = 0; i < sc.n; i++)
            ones += w->result[r][i] == 1;
        ck_assert_msg(ones == 0 || ones == (int)sc.n, "%s: group %u: %d of %u ranks committed", mode_name(m),
                      r, ones, sc.n);
        commits += ones != 0;
        abandons += ones == 0;
    }
    fprintf(stderr, "%s: %u of %u random groups committed\n", mode_name(m), commits, sc.rounds);
    ck_assert_uint_gt(abandons, 0);
    world_free(w);
}
END_TEST

/* ---- a late rank: the others time out, it comes alone, then all meet again ---- */

static int point_late(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    int late = rank == sc->arg;
    if (round == 0) {
        pt->timeout_ms = SHORT_MS;
        return !late;
    }
    if (round == 1) /* the group the others gave up on */
        return late;
    at(pt, sc->n, 1);
    return 1;
}

START_TEST(test_late_rank)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {4, 3, 1, point_late, 3};
    struct world *w = world_ran(&sc, m);
    expect_skipped(w, 0, 3);
    expect_timed_out(w, m, 0);
    ck_assert_int_eq(w->result[1][3], 0);
    ck_assert_uint_lt(w->ms[1][3], QUICK_MS); /* it sees the others' votes on its group: no wait */
    expect_round(w, m, 2, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

/* ---- ranks that die ---- */

static int point_dead(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    return rank != sc->n - 1 && rank != sc->arg; /* the last rank is dead; arg: one more that stays away */
}

/*
 * The segment of @p secret mapped as an onlooker, not as a rank (it must
 * exist). Its creator sizes it after creating it: the mapping waits for the
 * size, as touching a page beyond a shorter object raises SIGBUS.
 */
static struct agree_seg *map_segment(const uint8_t secret[SHIM_SECRET_BYTES])
{
    char name[AGREE_NAME_MAX];
    uint64_t check;
    agree_name(secret, name, &check);
    int fd = shm_open(name, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    uint64_t t0 = now_ns();
    struct stat sb;
    while (fstat(fd, &sb) == 0 && (size_t)sb.st_size < sizeof(struct agree_seg)) {
        ck_assert_msg(elapsed_ms(t0) < 5000, "the segment was not sized");
        sched_yield();
    }
    ck_assert_uint_eq((size_t)sb.st_size, sizeof(struct agree_seg));
    void *p = mmap(NULL, sizeof(struct agree_seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ck_assert_ptr_ne(p, MAP_FAILED);
    return p;
}

/* Fork rank @p rank of @p w: it opens, posts yes at position 0 and waits; @return its pid once it has posted.
 */
static pid_t fork_poster(struct world *w, uint32_t rank, struct agree_seg **seg_p)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct shim_p2p_agree *a = NULL;
        struct pt pt;
        pt_init(&pt, w->sc->n);
        if (shim_p2p_agree_open(w->secret, rank, w->sc->n, &a) != MSCX_OK)
            _exit(1);
        shim_p2p_agree_vote(a, &pt.p, 60000);
        _exit(2);
    }
    uint64_t t0 = now_ns();
    char name[AGREE_NAME_MAX];
    uint64_t check;
    agree_name(w->secret, name, &check);
    while (!name_exists(name)) {
        ck_assert_msg(elapsed_ms(t0) < 5000, "the forked rank did not open");
        sched_yield();
    }
    *seg_p = map_segment(w->secret);
    while (!(__atomic_load_n(&(*seg_p)->posted_mask, __ATOMIC_ACQUIRE) & rank_bit(rank))) {
        ck_assert_msg(elapsed_ms(t0) < 5000, "the forked rank did not post");
        sched_yield();
    }
    return pid;
}

/*
 * The last of 4 ranks posts and is killed. _i 0: the others vote and the last
 * one's post finds the dead poster; _i 1: rank 2 stays away, and a waiting
 * rank's periodic look finds it. Neither waits for its timeout, and every
 * later vote on the segment gives 0 at once. A new communicator of the
 * survivors commits.
 */
START_TEST(test_dead_poster)
{
    mscx_test_allow_warn("process is gone");
    mscx_test_allow_warn("died holding its lock"); /* when it was killed in its periodic look */
    struct scen sc = {4, 2, 1, point_dead, _i ? 2u : 99u};
    struct world *w = world_new(&sc);
    struct agree_seg *seg = NULL;
    pid_t pid = fork_poster(w, 3, &seg);
    kill(pid, SIGKILL);
    ck_assert_int_ge(wait_bounded(pid, 5000), 0);
    /* the survivors as threads; rank 3's thread opens and never votes */
    world_run(w, THREADS);
    expect_round(w, THREADS, 0, 0, 0, QUICK_MS);
    expect_round(w, THREADS, 1, 0, 0, QUICK_MS);
    ck_assert(is_broken(seg));
    munmap(seg, sizeof(*seg));
    world_free(w);

    struct scen fresh = {3, 3, 0, point_all_yes, 0};
    w = world_new(&fresh);
    world_run(w, PROCS);
    for (uint32_t r = 0; r < fresh.rounds; r++)
        expect_round(w, PROCS, r, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

static int point_dead_holder(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    return rank == 0;
}

/* Rank 1 dies holding the lock (_i 1: after posting under it); rank 0 gets 0 at once, then and later. */
START_TEST(test_dead_holder)
{
    mscx_test_allow_warn("died holding its lock");
    struct scen sc = {2, 2, 1, point_dead_holder, 0};
    struct world *w = world_new(&sc);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct shim_p2p_agree *a = NULL;
        struct pt pt;
        pt_init(&pt, sc.n);
        if (shim_p2p_agree_open(w->secret, 1, sc.n, &a) != MSCX_OK || seg_lock(a, deadline_after(1000)) != 0)
            _exit(1);
        if (_i)
            post_entry(a, &pt.p);
        _exit(0);
    }
    int st = wait_bounded(pid, 5000);
    ck_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    world_run(w, THREADS);
    expect_round(w, THREADS, 0, 0, 0, QUICK_MS);
    expect_round(w, THREADS, 1, 0, 0, QUICK_MS);
    world_free(w);

    struct scen fresh = {2, 3, 0, point_all_yes, 0};
    w = world_new(&fresh);
    world_run(w, PROCS);
    for (uint32_t r = 0; r < fresh.rounds; r++)
        expect_round(w, PROCS, r, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

/* ---- open, close, names ---- */

START_TEST(test_open_args)
{
    uint8_t secret[SHIM_SECRET_BYTES];
    random_secret(secret);
    struct shim_p2p_agree *a = NULL;
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 65, &a), MSCX_ERR_UNSUPPORTED);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 64, 65, &a), MSCX_ERR_UNSUPPORTED);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 2, 2, &a), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 0, &a), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(shim_p2p_agree_open(NULL, 0, 2, &a), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 2, NULL), MSCX_ERR_INVALID_ARG);
    ck_assert_ptr_null(a);
    shim_p2p_agree_close(NULL);
    ck_assert_int_eq(shim_p2p_agree_vote(NULL, NULL, 10), 0);
    /* the name carries a hash, never the secret's bytes */
    char name[AGREE_NAME_MAX], hex[2 * SHIM_SECRET_BYTES + 1];
    uint64_t check;
    agree_name(secret, name, &check);
    ck_assert_str_eq(strstr(name, "/mscx-p2p-"), name);
    for (int i = 0; i < 4; i++)
        snprintf(hex + 2 * i, 3, "%02x", secret[i]);
    ck_assert_ptr_null(strstr(name, hex));
    /* 64 ranks: the full mask */
    ck_assert_int_eq(shim_p2p_agree_open(secret, 63, 64, &a), MSCX_OK);
    ck_assert_uint_eq(full_mask(64), ~0ull);
    shim_p2p_agree_close(a);
    check_unlinked(secret); /* the last to close unlinks, rank 0 or not */
    /* one rank: its own vote decides */
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 1, &a), MSCX_OK);
    struct pt pt;
    pt_init(&pt, 1);
    uint32_t ms;
    ck_assert_int_eq(timed_vote(a, &pt, &ms), 1);
    pt.p.yes = 0;
    ck_assert_int_eq(timed_vote(a, &pt, &ms), 0);
    ck_assert_int_eq(shim_p2p_agree_vote(a, NULL, 10), 0);
    shim_p2p_agree_close(a);
    check_unlinked(secret);
}
END_TEST

/*
 * The name goes once every rank has opened the segment (the mappings stay);
 * before that rank 0's close, or the last close, takes it away. Processes
 * that end without closing leave nothing behind.
 */
START_TEST(test_unlink_orders)
{
    uint8_t secret[SHIM_SECRET_BYTES];
    random_secret(secret);
    char name[AGREE_NAME_MAX];
    uint64_t check;
    agree_name(secret, name, &check);
    struct shim_p2p_agree *a0 = NULL, *a1 = NULL, *a2 = NULL;
    ck_assert_int_eq(shim_p2p_agree_open(secret, 2, 3, &a2), MSCX_OK);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 1, 3, &a1), MSCX_OK);
    ck_assert(name_exists(name));
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 3, &a0), MSCX_OK);
    check_unlinked(secret);
    struct pt pt;
    pt_init(&pt, 3);
    pt.timeout_ms = 1;
    uint32_t ms;
    ck_assert_int_eq(timed_vote(a1, &pt, &ms), 0); /* still one segment: the others did not vote */
    shim_p2p_agree_close(a0);
    shim_p2p_agree_close(a1);
    shim_p2p_agree_close(a2);
    check_unlinked(secret);

    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 3, &a0), MSCX_OK);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 1, 3, &a1), MSCX_OK);
    shim_p2p_agree_close(a0); /* rank 0 leaves before rank 2 came */
    check_unlinked(secret);
    shim_p2p_agree_close(a1);
    check_unlinked(secret);

    ck_assert_int_eq(shim_p2p_agree_open(secret, 1, 3, &a1), MSCX_OK); /* alone: it makes a fresh one */
    ck_assert(name_exists(name));
    shim_p2p_agree_close(a1); /* the last handle */
    check_unlinked(secret);

    /* ranks that end without closing */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (uint32_t r = 0; r < 3; r++)
            if (shim_p2p_agree_open(secret, r, 3, &a0) != MSCX_OK)
                _exit(1);
        _exit(0);
    }
    int st = wait_bounded(pid, 5000);
    ck_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    check_unlinked(secret);
}
END_TEST

/* A segment that is not the communicator's: of another size, of another rank count, never initialised. */
START_TEST(test_foreign_segment)
{
    mscx_test_allow_warn("bytes, expected");
    mscx_test_allow_warn("is not this communicator's");
    uint8_t secret[SHIM_SECRET_BYTES];
    random_secret(secret);
    char name[AGREE_NAME_MAX];
    uint64_t check;
    agree_name(secret, name, &check);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 100), 0);
    close(fd);
    struct shim_p2p_agree *a = NULL, *b = NULL;
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 2, &a), MSCX_ERR_SYSTEM);
    ck_assert_ptr_null(a);
    ck_assert_int_eq(mscx_test_warn_count(), 1);
    shm_unlink(name);

    struct pt pt;
    uint32_t ms;
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 2, &a), MSCX_OK);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 1, 3, &b), MSCX_OK);
    pt_init(&pt, 3);
    ck_assert_int_eq(timed_vote(b, &pt, &ms), 0);
    ck_assert_uint_lt(ms, QUICK_MS);
    ck_assert_int_eq(timed_vote(b, &pt, &ms), 0);
    ck_assert_int_eq(mscx_test_warn_count(), 2); /* said once */
    pt_init(&pt, 2);
    ck_assert_int_eq(timed_vote(a, &pt, &ms), 0); /* broken for the rightful ranks too */
    ck_assert_uint_lt(ms, QUICK_MS);
    shim_p2p_agree_close(b);
    shim_p2p_agree_close(a);
    check_unlinked(secret);

    /* an initialiser that never finished: the vote waits its timeout, then says 0 */
    random_secret(secret);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 2, &a), MSCX_OK);
    atomic_store(&a->seg->init, INIT_BUSY);
    ck_assert_int_eq(shim_p2p_agree_open(secret, 1, 2, &b), MSCX_OK);
    pt.timeout_ms = SHORT_MS;
    ck_assert_int_eq(timed_vote(b, &pt, &ms), 0);
    ck_assert_uint_ge(ms, SHORT_MS);
    ck_assert_uint_lt(ms, SHORT_MS + QUICK_MS);
    shim_p2p_agree_close(b);
    shim_p2p_agree_close(a);
    check_unlinked(secret);
}
END_TEST

struct voter {
    struct shim_p2p_agree *a;
    struct pt pt;
    int result;
    uint32_t ms;
};

static void *voter_thread(void *p)
{
    struct voter *v = p;
    v->result = timed_vote(v->a, &v->pt, &v->ms);
    return NULL;
}

static void vote_all(struct voter *v, int n)
{
    pthread_t t[MAXR];
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, voter_thread, &v[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* Two communicators at once: one commits while the other, whose rank 1 says no, does not. */
START_TEST(test_two_secrets)
{
    uint8_t sa[SHIM_SECRET_BYTES], sb[SHIM_SECRET_BYTES];
    random_secret(sa);
    random_secret(sb);
    struct voter v[4];
    for (int i = 0; i < 4; i++) {
        pt_init(&v[i].pt, 2);
        ck_assert_int_eq(shim_p2p_agree_open(i < 2 ? sa : sb, (uint32_t)i % 2, 2, &v[i].a), MSCX_OK);
    }
    ck_assert_str_ne(v[0].a->name, v[2].a->name);
    v[3].pt.p.yes = 0;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 4; i++)
            at(&v[i].pt, 2, (uint64_t)round);
        vote_all(v, 4);
        ck_assert_int_eq(v[0].result, 1);
        ck_assert_int_eq(v[1].result, 1);
        ck_assert_int_eq(v[2].result, 0);
        ck_assert_int_eq(v[3].result, 0);
        ck_assert_uint_lt(v[2].ms, QUICK_MS);
    }
    for (int i = 0; i < 4; i++)
        shim_p2p_agree_close(v[i].a);
    check_unlinked(sa);
    check_unlinked(sb);
}
END_TEST

/*
 * A process that dies between opening an agreement and the last rank's open
 * leaves its segment; the next open of any agreement once it is a minute
 * old removes it, and leaves one whose opener is alive.
 */
START_TEST(test_stale_reaped)
{
    uint8_t dead[SHIM_SECRET_BYTES], live[SHIM_SECRET_BYTES], next[SHIM_SECRET_BYTES];
    char dead_name[AGREE_NAME_MAX], live_name[AGREE_NAME_MAX];
    uint64_t check;
    random_secret(dead);
    random_secret(live);
    random_secret(next);
    agree_name(dead, dead_name, &check);
    agree_name(live, live_name, &check);
    pid_t pid = fork();
    if (pid == 0) {
        struct shim_p2p_agree *a;
        _exit(shim_p2p_agree_open(dead, 0, 2, &a) == MSCX_OK ? 0 : 1); /* dies with it open */
    }
    ck_assert_int_eq(wait_bounded(pid, 10000), 0);
    ck_assert_msg(name_exists(dead_name), "the dead process's segment %s is not there to reap", dead_name);
    struct shim_p2p_agree *l, *n;
    ck_assert_int_eq(shim_p2p_agree_open(live, 0, 2, &l), MSCX_OK); /* changed just now: left alone */
    ck_assert_msg(name_exists(dead_name), "%s was removed while its peers may still be opening it",
                  dead_name);
    shim_p2p_agree_close(l);
    char path[sizeof("/dev/shm") + AGREE_NAME_MAX];
    snprintf(path, sizeof(path), "/dev/shm%s", dead_name);
    struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0); /* an hour old */
    ck_assert_int_eq(shim_p2p_agree_open(live, 0, 2, &l), MSCX_OK);
    ck_assert_msg(!name_exists(dead_name), "%s of a dead process survived the next open", dead_name);
    ck_assert_int_eq(shim_p2p_agree_open(next, 0, 2, &n), MSCX_OK);
    ck_assert_msg(name_exists(live_name), "%s of a live process was removed", live_name);
    shim_p2p_agree_close(n);
    shim_p2p_agree_close(l);
    check_unlinked(live);
    check_unlinked(next);
}
END_TEST

/* Two handles as one rank, voting at once: a caller bug; both get 0 and the segment is broken. */
START_TEST(test_same_rank_twice)
{
    mscx_test_allow_warn("voted twice");
    uint8_t secret[SHIM_SECRET_BYTES];
    random_secret(secret);
    struct voter v[2];
    for (int i = 0; i < 2; i++) {
        pt_init(&v[i].pt, 2);
        ck_assert_int_eq(shim_p2p_agree_open(secret, 0, 2, &v[i].a), MSCX_OK);
    }
    vote_all(v, 2);
    ck_assert_int_eq(v[0].result, 0);
    ck_assert_int_eq(v[1].result, 0);
    ck_assert_uint_lt(v[0].ms, QUICK_MS);
    ck_assert_uint_lt(v[1].ms, QUICK_MS);
    ck_assert(is_broken(v[0].a->seg));
    for (int i = 0; i < 2; i++)
        shim_p2p_agree_close(v[i].a);
    check_unlinked(secret);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("shim-p2p-agree");
    TCase *tc = mscx_tcase("votes");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_commit_rounds, 0, 2);
    p2p_agree_add_disagree_cases(tc);
    tcase_add_loop_test(tc, test_never_votes, 0, 2);
    tcase_add_loop_test(tc, test_late_rank, 0, 2);
    tcase_add_loop_test(tc, test_timeout_decides, 0, 2);
    tcase_add_loop_test(tc, test_drift, 0, 2);
    tcase_add_loop_test(tc, test_random_consistent, 0, 2);
    tcase_add_loop_test(tc, test_dead_poster, 0, 2);
    tcase_add_loop_test(tc, test_dead_holder, 0, 2);
    suite_add_tcase(s, tc);
    TCase *tn = mscx_tcase("segments");
    tcase_set_timeout(tn, 30);
    tcase_add_test(tn, test_open_args);
    tcase_add_test(tn, test_unlink_orders);
    tcase_add_test(tn, test_foreign_segment);
    tcase_add_test(tn, test_two_secrets);
    tcase_add_test(tn, test_same_rank_twice);
    tcase_add_test(tn, test_stale_reaped);
    suite_add_tcase(s, tn);
    return s;
}
