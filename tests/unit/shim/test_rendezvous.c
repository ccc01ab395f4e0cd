/* SPDX-License-Identifier: MIT */
/*
 * The setup rendezvous keyed by the unique id (shim/rendezvous.c): ranks are
 * forked processes on the loopback address, the listener runs in the test's
 * process (the one that marked the id, as ncclGetUniqueId's caller does).
 * Every rank present gets the same table; a rank that never comes is named
 * to the others within the bound; a late one within the bound is waited
 * for; an unmarked id is told at once; strangers do not disturb the
 * exchange; marking leaves NCCL's part of the id alone. The source is
 * included for its marker layout.
 */
#include "rendezvous.c"

#include <sys/mman.h>
#include <sys/wait.h>

#include "test_common.h"

#define MAXR 8
#define REC 256u
#define QUICK_MS 500u /* "at once" on a loaded machine */

/* What each forked rank saw, in shared memory. */
struct result {
    int done;
    int st;
    uint32_t ms;
    struct shim_rdv_absent absent;
    uint8_t table[MAXR * REC];
};

static struct result *shared_results(void)
{
    struct result *r =
        mmap(NULL, MAXR * sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(r, MAP_FAILED);
    memset(r, 0, MAXR * sizeof(*r));
    return r;
}

static void record_of(uint32_t rank, uint8_t *rec)
{
    for (uint32_t i = 0; i < REC; i++)
        rec[i] = (uint8_t)(rank * 131u + i * 7u + 1u);
}

/* An id as NCCL's ncclGetUniqueId leaves it: a random magic, the root's address, zeros. */
static void nccl_like_id(ncclUniqueId *id, int family)
{
    memset(id, 0, sizeof(*id));
    ck_assert_int_eq(getrandom(id->internal, 8, 0), 8);
    if (family == AF_INET) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(40001)};
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        memcpy(id->internal + HANDLE_ADDR_OFF, &sin, sizeof(sin));
    } else if (family == AF_INET6) {
        struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_port = htons(40001)};
        sin6.sin6_addr = in6addr_loopback;
        memcpy(id->internal + HANDLE_ADDR_OFF, &sin6, sizeof(sin6));
    } else {
        sa_family_t f = (sa_family_t)family;
        memcpy(id->internal + HANDLE_ADDR_OFF, &f, sizeof(f));
    }
}

static void marked_id(ncclUniqueId *id, int family, uint32_t bound_ms)
{
    nccl_like_id(id, family);
    ck_assert_int_eq(shim_rdv_mark(id, bound_ms, 0), MSCX_OK);
    ck_assert(shim_rdv_marked(id));
}

/*
 * Fork a rank for every r < n whose delay_ms[r] is not SKIP: it waits that
 * long, gathers, and leaves its result in @p res[r]. Waits for them all.
 */
#define SKIP UINT32_MAX
static int drop_last;
static void run_ranks(const ncclUniqueId *id, uint32_t n, const uint32_t *delay_ms, struct result *res)
{
    pid_t pid[MAXR];
    for (uint32_t r = 0; r < n; r++) {
        pid[r] = -1;
        if (delay_ms && delay_ms[r] == SKIP)
            continue;
        pid[r] = fork();
        ck_assert_int_ge(pid[r], 0);
        if (pid[r] == 0) {
            if (delay_ms && delay_ms[r]) {
                struct timespec ts = {.tv_sec = delay_ms[r] / 1000,
                                      .tv_nsec = (long)(delay_ms[r] % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            uint8_t rec[REC];
            record_of(r, rec);
            uint64_t t = now_ms();
            /* the last rank drops the table (a "fall back" voter's way): the others still get it */
            void *all = drop_last && r == n - 1 ? NULL : res[r].table;
            res[r].st = shim_rdv_gather(id, r, n, rec, REC, all, &res[r].absent);
            res[r].ms = (uint32_t)(now_ms() - t);
            res[r].done = 1;
            _exit(0);
        }
    }
    for (uint32_t r = 0; r < n; r++)
        if (pid[r] > 0) {
            int ws = 0;
            ck_assert_int_eq(waitpid(pid[r], &ws, 0), pid[r]);
            ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank %u did not exit cleanly", r);
            ck_assert_msg(res[r].done, "rank %u left no result", r);
        }
}

static void check_tables(const struct result *res, uint32_t n)
{
    uint8_t want[MAXR * REC];
    for (uint32_t r = 0; r < n; r++)
        record_of(r, want + (size_t)r * REC);
    for (uint32_t r = 0; r < n; r++) {
        ck_assert_msg(res[r].st == MSCX_OK, "rank %u: %s", r, mscx_status_str(res[r].st));
        if (drop_last && r == n - 1)
            continue;
        ck_assert_msg(memcmp(res[r].table, want, (size_t)n * REC) == 0, "rank %u: another table", r);
    }
}

/* (a) every rank present: the same table everywhere, bit for bit; over IPv4 and IPv6 */
START_TEST(test_all_present)
{
    int family = _i == 0 ? AF_INET : AF_INET6;
    if (family == AF_INET6) {
        int fd = socket(AF_INET6, SOCK_STREAM, 0);
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (!ok)
            return; /* no IPv6 loopback here */
    }
    ncclUniqueId id;
    marked_id(&id, family, 5000);
    struct result *res = shared_results();
    run_ranks(&id, 4, NULL, res);
    check_tables(res, 4);
    /* a rank that gives no buffer for the table */
    marked_id(&id, family, 5000);
    memset(res, 0, MAXR * sizeof(*res));
    drop_last = 1;
    run_ranks(&id, 4, NULL, res);
    check_tables(res, 4);
    drop_last = 0;
    for (uint32_t r = 0; r < 4; r++)
        ck_assert_uint_lt(res[r].ms, 5000);
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* (b) rank 2 never comes: the other three hear "absent [2]" within the bound and a second, nobody hangs */
START_TEST(test_one_absent)
{
    const uint32_t bound = 1500;
    ncclUniqueId id;
    marked_id(&id, AF_INET, bound);
    struct result *res = shared_results();
    const uint32_t delay[4] = {0, 0, SKIP, 0};
    run_ranks(&id, 4, delay, res);
    for (uint32_t r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        ck_assert_msg(res[r].st == MSCX_ERR_REMOTE, "rank %u: %s", r, mscx_status_str(res[r].st));
        ck_assert_uint_eq(res[r].absent.count, 1);
        ck_assert_uint_eq(res[r].absent.n, 1);
        ck_assert_uint_eq(res[r].absent.rank[0], 2);
        ck_assert_uint_le(res[r].ms, bound + 1000);
        ck_assert_uint_ge(res[r].ms + 50, bound);
    }
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* Many absent: the count covers them all, the list names the lowest SHIM_RDV_ABSENT_MAX. */
START_TEST(test_many_absent)
{
    ncclUniqueId id;
    marked_id(&id, AF_INET, 800);
    struct result *res = shared_results();
    /* 2 of 40 ranks come: 38 absent */
    pid_t pid[2];
    for (uint32_t k = 0; k < 2; k++) {
        pid[k] = fork();
        ck_assert_int_ge(pid[k], 0);
        if (pid[k] == 0) {
            uint8_t rec[REC], *all = malloc(40 * REC);
            uint32_t rank = k == 0 ? 3 : 39;
            record_of(rank, rec);
            res[k].st = shim_rdv_gather(&id, rank, 40, rec, REC, all, &res[k].absent);
            res[k].done = 1;
            _exit(0);
        }
    }
    for (uint32_t k = 0; k < 2; k++) {
        int ws;
        ck_assert_int_eq(waitpid(pid[k], &ws, 0), pid[k]);
        ck_assert_int_eq(res[k].st, MSCX_ERR_REMOTE);
        ck_assert_uint_eq(res[k].absent.count, 38);
        ck_assert_uint_eq(res[k].absent.n, SHIM_RDV_ABSENT_MAX);
        const uint32_t want[SHIM_RDV_ABSENT_MAX] = {0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
        ck_assert_mem_eq(res[k].absent.rank, want, sizeof(want));
    }
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* (c) rank 1 comes 2 s after the others, within the 4 s bound: all gathered */
START_TEST(test_late_within_bound)
{
    ncclUniqueId id;
    marked_id(&id, AF_INET, 4000);
    struct result *res = shared_results();
    const uint32_t delay[4] = {0, 2000, 0, 0};
    run_ranks(&id, 4, delay, res);
    check_tables(res, 4);
    ck_assert_uint_ge(res[0].ms, 1900);
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* A rank later than the bound: the others fall back; it does not succeed either, and returns in time. */
START_TEST(test_late_beyond_bound)
{
    const uint32_t bound = 800;
    ncclUniqueId id;
    marked_id(&id, AF_INET, bound);
    struct result *res = shared_results();
    const uint32_t delay[3] = {0, 0, bound + 600};
    run_ranks(&id, 3, delay, res);
    for (uint32_t r = 0; r < 2; r++) {
        ck_assert_int_eq(res[r].st, MSCX_ERR_REMOTE);
        ck_assert_uint_eq(res[r].absent.rank[0], 2);
    }
    ck_assert_int_ne(res[2].st, MSCX_OK);
    ck_assert_uint_le(res[2].ms, 2 * bound + 1000);
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* (d) an unmarked id: the distinct status at once, nothing waited for */
START_TEST(test_unmarked)
{
    ncclUniqueId id;
    nccl_like_id(&id, AF_INET);
    uint8_t rec[REC], all[4 * REC];
    record_of(0, rec);
    uint64_t t = now_ms();
    ck_assert_int_eq(shim_rdv_gather(&id, 0, 4, rec, REC, all, NULL), MSCX_ERR_UNSUPPORTED);
    ck_assert_uint_lt(now_ms() - t, QUICK_MS);
    /* a damaged marker is no marker */
    marked_id(&id, AF_INET, 1000);
    id.internal[MARK_OFF + 40] ^= 1;
    ck_assert(!shim_rdv_marked(&id));
    ck_assert_int_eq(shim_rdv_gather(&id, 0, 4, rec, REC, all, NULL), MSCX_ERR_UNSUPPORTED);
    /* bad arguments */
    marked_id(&id, AF_INET, 1000);
    ck_assert_int_eq(shim_rdv_gather(&id, 4, 4, rec, REC, all, NULL), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(shim_rdv_gather(&id, 0, 0, rec, REC, all, NULL), MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(shim_rdv_gather(NULL, 0, 4, rec, REC, all, NULL), MSCX_ERR_INVALID_ARG);
}
END_TEST

static int dial_loopback(const ncclUniqueId *id)
{
    struct mark m;
    ck_assert(mark_read(id, &m));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, &m.addr.sa, m.addrlen), 0);
    return fd;
}

/* 1 when the listener closed @p fd within 3 s. */
static int closed_by_listener(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&p, 1, 3000) == 1 && recv(fd, &c, 1, 0) <= 0;
}

/* a communicator of one rank releases its id's listener, which exits at once */
START_TEST(test_release)
{
    ncclUniqueId id, other;
    marked_id(&id, AF_INET, 1000);
    marked_id(&other, AF_INET, 1000);
    int before = atomic_load(&live_listeners);
    ck_assert_int_ge(before, 2);
    shim_rdv_release(&id);
    for (int waited = 0; atomic_load(&live_listeners) == before && waited < 3000; waited += 10)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&live_listeners), before - 1);
    struct mark m;
    ck_assert(mark_read(&id, &m));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ne(connect(fd, &m.addr.sa, m.addrlen), 0); /* refused: nobody listens there */
    close(fd);
    close(dial_loopback(&other)); /* the other id's listener still serves */
    ck_assert_int_eq(atomic_load(&live_listeners), before - 1);
}
END_TEST

/* (e) strangers: garbage, a wrong nonce and a silent connection are turned away; the gather succeeds */
START_TEST(test_strangers)
{
    ncclUniqueId id;
    marked_id(&id, AF_INET, 3000);
    int garbage = dial_loopback(&id);
    uint8_t junk[HELLO_BYTES];
    memset(junk, 0xff, sizeof(junk));
    ck_assert_int_eq(send(garbage, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    int wrong = dial_loopback(&id);
    uint8_t hello[HELLO_BYTES] = {0};
    put32(hello, MSG_MAGIC);
    put16(hello + 4, MSG_VERSION);
    put16(hello + 6, KIND_HELLO);
    put32(hello + 24, 0);
    put32(hello + 28, 4);
    put32(hello + 32, REC);
    ck_assert_int_eq(send(wrong, hello, sizeof(hello), MSG_NOSIGNAL), (ssize_t)sizeof(hello));
    int silent = dial_loopback(&id);
    ck_assert(closed_by_listener(garbage));
    ck_assert(closed_by_listener(wrong));
    struct result *res = shared_results();
    run_ranks(&id, 4, NULL, res);
    check_tables(res, 4);
    close(garbage);
    close(wrong);
    close(silent);
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/*
 * A second connection for a rank that came already is turned away, and a rank
 * that hangs up once its record is in still counts: the exchange goes on.
 */
START_TEST(test_duplicate_rank)
{
    ncclUniqueId id;
    marked_id(&id, AF_INET, 3000);
    struct mark m;
    ck_assert(mark_read(&id, &m));
    int dup = dial_loopback(&id);
    uint8_t hello[HELLO_BYTES] = {0}, rec[REC];
    put32(hello, MSG_MAGIC);
    put16(hello + 4, MSG_VERSION);
    put16(hello + 6, KIND_HELLO);
    memcpy(hello + 8, m.nonce, NONCE_BYTES);
    put32(hello + 24, 1);
    put32(hello + 28, 2);
    put32(hello + 32, REC);
    record_of(1, rec);
    ck_assert_int_eq(send(dup, hello, sizeof(hello), MSG_NOSIGNAL), (ssize_t)sizeof(hello));
    ck_assert_int_eq(send(dup, rec, sizeof(rec), MSG_NOSIGNAL), (ssize_t)sizeof(rec));
    /* rank 1 is in (through dup); a second rank 1 and a rank 0 come */
    struct timespec ts = {.tv_nsec = 300 * 1000000L};
    nanosleep(&ts, NULL);
    int dup2 = dial_loopback(&id);
    ck_assert_int_eq(send(dup2, hello, sizeof(hello), MSG_NOSIGNAL), (ssize_t)sizeof(hello));
    ck_assert(closed_by_listener(dup2));
    /* rank 1 hangs up once its record is in: the record counts */
    close(dup);
    nanosleep(&ts, NULL);
    struct result *res = shared_results();
    const uint32_t delay[2] = {0, SKIP};
    run_ranks(&id, 2, delay, res);
    ck_assert_int_eq(res[0].st, MSCX_OK);
    uint8_t want[2 * REC];
    record_of(0, want);
    record_of(1, want + REC);
    ck_assert_mem_eq(res[0].table, want, sizeof(want));
    close(dup2);
    munmap(res, MAXR * sizeof(*res));
}
END_TEST

/* (f) marking keeps NCCL's part of the id, and only marks what it can */
START_TEST(test_mark)
{
    ncclUniqueId id, before;
    nccl_like_id(&id, AF_INET);
    before = id;
    ck_assert(!shim_rdv_marked(&id));
    ck_assert_int_eq(shim_rdv_mark(&id, 1000, 0), MSCX_OK);
    ck_assert_mem_eq(id.internal, before.internal, MARK_OFF);
    ck_assert(shim_rdv_marked(&id));
    struct mark m;
    ck_assert(mark_read(&id, &m));
    ck_assert_int_eq(m.addr.sa.sa_family, AF_INET);
    ck_assert_uint_eq(ntohl(m.addr.sin.sin_addr.s_addr), INADDR_LOOPBACK);
    ck_assert_uint_ne(ntohs(m.addr.sin.sin_port), 0);
    ck_assert_uint_ne(ntohs(m.addr.sin.sin_port), 40001);
    ck_assert_uint_eq(m.bound_ms, 1000);
    ck_assert_uint_eq(shim_rdv_grow_from(&id), 0);
    /* a grow id carries its parent's rank count, under the checksum */
    ncclUniqueId grow;
    nccl_like_id(&grow, AF_INET);
    ck_assert_int_eq(shim_rdv_mark(&grow, 1000, 6), MSCX_OK);
    ck_assert_uint_eq(shim_rdv_grow_from(&grow), 6);
    shim_rdv_release(&grow);
    grow.internal[MARK_OFF + 52] ^= 1;
    ck_assert(!shim_rdv_marked(&grow));
    ck_assert_uint_eq(shim_rdv_grow_from(&grow), 0);
    /* marked already: the tail is in use, the id stays */
    ncclUniqueId again = id;
    ck_assert_int_eq(shim_rdv_mark(&again, 1000, 0), MSCX_ERR_UNSUPPORTED);
    ck_assert_mem_eq(again.internal, id.internal, sizeof(id.internal));
    /* a tail not all zero (the test suite's fake id), another family, an address not ours: unchanged */
    memset(id.internal, 0x5a, sizeof(id.internal));
    before = id;
    ck_assert_int_eq(shim_rdv_mark(&id, 1000, 0), MSCX_ERR_UNSUPPORTED);
    ck_assert_mem_eq(id.internal, before.internal, sizeof(id.internal));
    nccl_like_id(&id, AF_UNIX);
    before = id;
    ck_assert_int_eq(shim_rdv_mark(&id, 1000, 0), MSCX_ERR_UNSUPPORTED);
    ck_assert_mem_eq(id.internal, before.internal, sizeof(id.internal));
    nccl_like_id(&id, AF_INET);
    struct sockaddr_in far = {.sin_family = AF_INET};
    far.sin_addr.s_addr = htonl(0xc0000201); /* 192.0.2.1, TEST-NET-1: no local interface has it */
    memcpy(id.internal + HANDLE_ADDR_OFF, &far, sizeof(far));
    before = id;
    ck_assert_int_eq(shim_rdv_mark(&id, 1000, 0), MSCX_ERR_SYSTEM);
    ck_assert_mem_eq(id.internal, before.internal, sizeof(id.internal));
    ck_assert_int_eq(shim_rdv_mark(NULL, 1000, 0), MSCX_ERR_INVALID_ARG);
}
END_TEST

/* The bound: 10 s, or MSCX_TIMEOUT_MS where larger. */
START_TEST(test_bound)
{
    struct mscx_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    ck_assert_uint_eq(shim_rdv_bound_ms(NULL), SHIM_RDV_DEFAULT_BOUND_MS);
    ck_assert_uint_eq(shim_rdv_bound_ms(&cfg), SHIM_RDV_DEFAULT_BOUND_MS);
    cfg.timeout_ms = 500;
    ck_assert_uint_eq(shim_rdv_bound_ms(&cfg), SHIM_RDV_DEFAULT_BOUND_MS);
    cfg.timeout_ms = 60000;
    ck_assert_uint_eq(shim_rdv_bound_ms(&cfg), 60000);
    cfg.timeout_ms = UINT64_MAX;
    ck_assert_uint_eq(shim_rdv_bound_ms(&cfg), UINT32_MAX);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("shim-rendezvous");
    TCase *tc = mscx_tcase("gather");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_all_present, 0, 2);
    tcase_add_test(tc, test_one_absent);
    tcase_add_test(tc, test_many_absent);
    tcase_add_test(tc, test_late_within_bound);
    tcase_add_test(tc, test_late_beyond_bound);
    tcase_add_test(tc, test_unmarked);
    tcase_add_test(tc, test_strangers);
    tcase_add_test(tc, test_release);
    tcase_add_test(tc, test_duplicate_rank);
    suite_add_tcase(s, tc);
    TCase *tm = mscx_tcase("mark");
    tcase_add_test(tm, test_mark);
    tcase_add_test(tm, test_bound);
    suite_add_tcase(s, tm);
    return s;
}
