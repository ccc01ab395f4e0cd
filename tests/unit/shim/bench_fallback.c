/* SPDX-License-Identifier: MIT */
/*
 * The host cost of a collective that goes to NCCL: nanoseconds per call of
 * one collective on a communicator of its own per thread, in a loop.
 *
 *   shim-bench-fallback [--direct=LIB] [--coll=NAME] [--bytes=N] [--nranks=N] [--calls=N] [--reps=N]
 *                       [--threads=N]
 *     --direct=LIB  call LIB's functions (the NCCL without the shim); else the process's
 *                   nccl* symbols, which must be the preloaded shim's
 *     --coll        allreduce (default), allgather, reducescatter or broadcast
 *     --bytes       message bytes (default 2 MiB, float elements)
 *     --nranks      ranks the communicator reports (default 1)
 *     --out-of-place  send and receive buffers apart (default: in place, one buffer)
 *     --evict=N     before each call, write N bytes elsewhere (as the real NCCL's own work
 *                   would) and time that call alone: the cost with cold caches
 *     --churn=N     no timing: each thread creates a communicator, makes --calls calls on it
 *                   and destroys it, N times, while the other threads do the same; the
 *                   process's resident memory is printed after a tenth of them and at the end
 *     --rss-growth=KB  with --churn: fail when the resident memory grew by more than KB from
 *                   the tenth to the end (what every communicator leaves behind adds up)
 *     --group=N     N calls in each ncclGroupStart/ncclGroupEnd (the time is still per call)
 *
 * Under the shim, give MSCX_NCCL_LIB the silent bench NCCL (bench_nccl.c)
 * and MSCX_PLAN_DIR the shipped plans: the communicator then has the shim's
 * state, and each call takes the decision path; with BENCH_NCCL_HOST=1 and
 * the shim built over the fake executor (libmscx_nccl_fake_exec.so) that
 * state has an executor, as on a GPU machine. Prints, per thread, the
 * fastest and the median of the repetitions.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#define MAX_THREADS 16
#define MAX_REPS 101

typedef ncclResult_t (*init_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*destroy_fn)(ncclComm_t);
typedef ncclResult_t (*allreduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);
typedef ncclResult_t (*allgather_fn)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*broadcast_fn)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                                     cudaStream_t);
typedef ncclResult_t (*group_fn)(void);

enum coll { COLL_ALLREDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_BROADCAST };

static struct {
    init_fn init;
    destroy_fn destroy;
    allreduce_fn allreduce, reducescatter;
    allgather_fn allgather;
    broadcast_fn broadcast;
    group_fn group_start, group_end;
} api;

static enum coll coll = COLL_ALLREDUCE;
static size_t bytes = 2u << 20;
static int nranks = 1;
static long calls = 1000000;
static int reps = 15;
static size_t evict;
static long churn;
static long rss_growth_kb = -1;
static _Atomic long churned;   /* communicators made and destroyed, over all threads */
static long churn_total;       /* churn x threads */
static long rss_tenth_kb = -1; /* resident memory when a tenth of them were done */
static int out_of_place;
static long group; /* calls per group; 0: no groups */
static unsigned char *evict_buf;
static pthread_barrier_t barrier;

struct result {
    double best, median;
    int failed;
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* @return the number of calls that did not succeed */
static long run_calls(ncclComm_t comm, void *buf, long n)
{
    size_t count = bytes / sizeof(float);
    void *recv = out_of_place ? (char *)buf + 64 : buf; /* the stand-in NCCL never touches them */
    long bad = 0;
    for (long i = 0; i < n; i++) {
        ncclResult_t r;
        if (group && i % group == 0)
            bad += api.group_start() != ncclSuccess;
        switch (coll) {
        case COLL_ALLREDUCE:
            r = api.allreduce(buf, recv, count, ncclFloat32, ncclSum, comm, NULL);
            break;
        case COLL_ALLGATHER:
            r = api.allgather(buf, recv, count / (size_t)nranks, ncclFloat32, comm, NULL);
            break;
        case COLL_REDUCESCATTER:
            r = api.reducescatter(buf, recv, count / (size_t)nranks, ncclFloat32, ncclSum, comm, NULL);
            break;
        default:
            r = api.broadcast(buf, recv, count, ncclFloat32, 0, comm, NULL);
            break;
        }
        bad += r != ncclSuccess;
        if (group && (i % group == group - 1 || i == n - 1))
            bad += api.group_end() != ncclSuccess;
    }
    return bad;
}

/* Calls one at a time after evicting the caches: @return ns spent in the calls alone */
static double run_cold(ncclComm_t comm, void *buf, long n, long *bad_p)
{
    double sum = 0;
    for (long i = 0; i < n; i++) {
        for (size_t k = 0; k < evict; k += 64)
            evict_buf[k] = (unsigned char)(evict_buf[k] + 1);
        double t0 = now_ns();
        *bad_p += run_calls(comm, buf, 1);
        sum += now_ns() - t0;
    }
    return sum;
}

/* The process's resident memory in KB, -1 when unknown. */
static long rss_kb(void)
{
    long pages = 0, rss = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    if (f)
        fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Communicators made, used and destroyed in turn: @return 0 when every call succeeded. */
static int run_churn(void)
{
    static char buf[128];
    ncclUniqueId id;
    memset(&id, 0x42, sizeof(id));
    pthread_barrier_wait(&barrier);
    for (long k = 0; k < churn; k++) {
        ncclComm_t comm = NULL;
        if (api.init(&comm, nranks, id, 0) != ncclSuccess || !comm)
            return -1;
        long bad = run_calls(comm, buf, calls);
        if (api.destroy(comm) != ncclSuccess || bad)
            return -1;
        if (atomic_fetch_add(&churned, 1) + 1 == churn_total / 10)
            rss_tenth_kb = rss_kb();
    }
    return 0;
}

static void *bench_thread(void *arg)
{
    struct result *res = arg;
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    static char buf[128];
    double t[MAX_REPS];
    if (churn) {
        res->failed = run_churn() != 0;
        return NULL;
    }
    memset(&id, 0x42, sizeof(id));
    pthread_barrier_wait(&barrier); /* one init at a time would serialise nothing measured */
    if (api.init(&comm, nranks, id, 0) != ncclSuccess || !comm) {
        res->failed = 1;
        pthread_barrier_wait(&barrier);
        return NULL;
    }
    long bad = run_calls(comm, buf, calls / 10); /* warm up */
    pthread_barrier_wait(&barrier);
    for (int r = 0; r < reps; r++) {
        if (evict) {
            t[r] = run_cold(comm, buf, calls, &bad) / (double)calls;
            continue;
        }
        double t0 = now_ns();
        bad += run_calls(comm, buf, calls);
        t[r] = (now_ns() - t0) / (double)calls;
    }
    qsort(t, (size_t)reps, sizeof(t[0]), cmp_double);
    res->best = t[0];
    res->median = t[reps / 2];
    res->failed = bad != 0 || api.destroy(comm) != ncclSuccess;
    return NULL;
}

static const char *const coll_names[] = {"allreduce", "allgather", "reducescatter", "broadcast"};

static int load_api(const char *direct)
{
    void *h = RTLD_DEFAULT;
    if (direct && !(h = dlopen(direct, RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "cannot open %s: %s\n", direct, dlerror());
        return -1;
    }
    api.init = (init_fn)dlsym(h, "ncclCommInitRank");
    api.destroy = (destroy_fn)dlsym(h, "ncclCommDestroy");
    api.allreduce = (allreduce_fn)dlsym(h, "ncclAllReduce");
    api.reducescatter = (allreduce_fn)dlsym(h, "ncclReduceScatter");
    api.allgather = (allgather_fn)dlsym(h, "ncclAllGather");
    api.broadcast = (broadcast_fn)dlsym(h, "ncclBroadcast");
    api.group_start = (group_fn)dlsym(h, "ncclGroupStart");
    api.group_end = (group_fn)dlsym(h, "ncclGroupEnd");
    if (!api.init || !api.destroy || !api.allreduce || !api.reducescatter || !api.allgather ||
        !api.broadcast || !api.group_start || !api.group_end) {
        fprintf(stderr, "%s lacks an NCCL function the bench calls\n", direct ? direct : "the process");
        return -1;
    }
    Dl_info info;
    if (!direct && (!dladdr((void *)api.allreduce, &info) || !info.dli_fname ||
                    !strstr(info.dli_fname, "libmscx_nccl"))) {
        fprintf(stderr,
                "ncclAllReduce is not the shim's (LD_PRELOAD missing?); use --direct=LIB without it\n");
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, const char **direct_p, int *threads_p)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--direct=", 9)) {
            *direct_p = a + 9;
        } else if (!strncmp(a, "--coll=", 7)) {
            int k = 0;
            while (k < 4 && strcmp(a + 7, coll_names[k]))
                k++;
            if (k == 4)
                return -1;
            coll = (enum coll)k;
        } else if (!strncmp(a, "--bytes=", 8)) {
            bytes = strtoull(a + 8, NULL, 0);
        } else if (!strncmp(a, "--nranks=", 9)) {
            nranks = atoi(a + 9);
        } else if (!strncmp(a, "--calls=", 8)) {
            calls = atol(a + 8);
        } else if (!strncmp(a, "--reps=", 7)) {
            reps = atoi(a + 7);
        } else if (!strncmp(a, "--churn=", 8)) {
            churn = atol(a + 8);
        } else if (!strncmp(a, "--rss-growth=", 13)) {
            rss_growth_kb = atol(a + 13);
        } else if (!strncmp(a, "--group=", 8)) {
            group = atol(a + 8);
            if (group < 1)
                return -1;
        } else if (!strcmp(a, "--out-of-place")) {
            out_of_place = 1;
        } else if (!strncmp(a, "--evict=", 8)) {
            evict = strtoull(a + 8, NULL, 0);
        } else if (!strncmp(a, "--threads=", 10)) {
            *threads_p = atoi(a + 10);
        } else {
            return -1;
        }
    }
    return nranks >= 1 && calls >= 10 && reps >= 1 && reps <= MAX_REPS && *threads_p >= 1 &&
                   *threads_p <= MAX_THREADS && bytes >= sizeof(float) * (size_t)nranks
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    const char *direct = NULL;
    int nthreads = 1, failed = 0;
    if (parse_args(argc, argv, &direct, &nthreads) != 0) {
        fprintf(stderr,
                "usage: %s [--direct=LIB] [--coll=allreduce|allgather|reducescatter|broadcast] "
                "[--bytes=N] [--nranks=N] [--calls=N>=10] [--reps=1..%d] [--threads=1..%d] [--out-of-place] "
                "[--evict=N] "
                "[--churn=N [--rss-growth=KB]] [--group=N]\n",
                argv[0], MAX_REPS, MAX_THREADS);
        return 2;
    }
    if (load_api(direct) != 0)
        return 2;
    if (evict && nthreads > 1) {
        fprintf(stderr, "--evict runs one thread\n");
        return 2;
    }
    if (evict && !(evict_buf = calloc(1, evict))) {
        fprintf(stderr, "no memory for --evict=%zu\n", evict);
        return 2;
    }
    pthread_t tid[MAX_THREADS];
    struct result res[MAX_THREADS];
    memset(res, 0, sizeof(res));
    churn_total = churn * nthreads;
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&tid[i], NULL, bench_thread, &res[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2; /* the threads started wait at the barrier: nothing to join */
        }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(tid[i], NULL);
        failed |= res[i].failed;
        if (churn)
            continue;
        printf(
            "%s %s %zu bytes%s, %d ranks, thread %d/%d%s: %.1f ns/call (median %.1f) over %d x %ld calls\n",
            direct ? "direct" : "shim", coll_names[coll], bytes, out_of_place ? " out of place" : "", nranks,
            i, nthreads, evict ? ", cold" : "", res[i].best, res[i].median, reps, calls);
    }
    pthread_barrier_destroy(&barrier);
    free(evict_buf);
    if (churn) {
        long end_kb = rss_kb();
        printf("churn: %d threads made %ld communicators each, %ld calls on each; resident memory %ld KB "
               "after a tenth of them, %ld KB at the end\n",
               nthreads, churn, calls, rss_tenth_kb, end_kb);
        if (rss_growth_kb >= 0 && (rss_tenth_kb < 0 || end_kb < 0 || end_kb - rss_tenth_kb > rss_growth_kb)) {
            fprintf(stderr, "resident memory grew by %ld KB, more than %ld\n", end_kb - rss_tenth_kb,
                    rss_growth_kb);
            failed = 1;
        }
    }
    if (failed) {
        fprintf(stderr, "a call failed\n");
        return 1;
    }
    return 0;
}
