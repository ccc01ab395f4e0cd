/* SPDX-License-Identifier: MIT */
/* The fake libnccl's log, result and output-writing hooks (see fake_nccl.h). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

/* The result a hook of this file chose for the current call (ncclSuccess: none), once. */
static __thread ncclResult_t special_result;

ncclResult_t fake_result(void)
{
    ncclResult_t special = special_result;
    special_result = ncclSuccess;
    if (special != ncclSuccess)
        return special;
    ncclResult_t hooked = fake_dev_result();
    if (hooked != ncclSuccess)
        return hooked;
    return (ncclResult_t)env_int("FAKE_NCCL_RESULT", ncclSuccess);
}

/*
 * Communicators come from a static pool: the fidelity driver destroys
 * synthetic handles, not these, and the pool keeps LeakSanitizer quiet.
 */
static unsigned pool[256][16];

/* Fields of a pool entry past its magic and number. */
enum { SLOT_NB = 2, SLOT_POLLS, SLOT_LRANK, SLOT_LSIZE, SLOT_WRANK, SLOT_WSIZE };

static ncclComm_t fake_comm(void)
{
    static unsigned next;
    unsigned *c = pool[next % 256];
    memset(c, 0, sizeof(pool[0]));
    c[0] = 0xfa4ec033u;
    c[1] = ++next;
    return (ncclComm_t)c;
}

/* The pool entry of @p comm, or NULL for a handle the fake never made. */
static unsigned *fake_slot(ncclComm_t comm)
{
    const char *p = (const char *)comm, *lo = (const char *)pool, *hi = lo + sizeof(pool);
    if (p < lo || p >= hi || (size_t)(p - lo) % sizeof(pool[0]) != 0)
        return NULL;
    return (unsigned *)comm;
}

/*
 * Non-blocking communicators (FAKE_NCCL_NB_POLLS=N > 0): an init with
 * config->blocking == 0 answers ncclInProgress, and so does each
 * ncclAllGather on such a communicator; after each, ncclCommGetAsyncError
 * says ncclInProgress N times, then ncclSuccess.
 */
static void nb_start(ncclComm_t comm)
{
    unsigned *c = fake_slot(comm);
    int polls = env_int("FAKE_NCCL_NB_POLLS", 0);
    if (!c || !c[SLOT_NB] || polls <= 0)
        return;
    c[SLOT_POLLS] = (unsigned)polls;
    special_result = ncclInProgress;
}

/*
 * One process holding every rank (FAKE_NCCL_LOCAL=1): the communicators of
 * ncclCommInitAll, or of ncclCommInitRank with their own rank and count,
 * are the ranks of one communicator, and their ncclAllGather calls (from
 * one thread each) meet in memory.
 */
static int local_on(void)
{
    return env_int("FAKE_NCCL_LOCAL", 0) == 1;
}

static void local_mark(ncclComm_t comm, int rank, int nranks)
{
    unsigned *c = fake_slot(comm);
    if (c && local_on() && nranks > 0 && nranks <= 64) {
        c[SLOT_LRANK] = (unsigned)rank + 1;
        c[SLOT_LSIZE] = (unsigned)nranks;
    }
}

static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t local_cv = PTHREAD_COND_INITIALIZER;
static unsigned local_arrived, local_gen;
static const void *local_send[64];

/* Wait until @p n threads are here. A wait of FAKE_NCCL_WAIT_MS (default 20000) ends the process: a hang. */
static void local_barrier(unsigned n, unsigned rank)
{
    pthread_mutex_lock(&local_mu);
    unsigned gen = local_gen;
    if (++local_arrived == n) {
        local_arrived = 0;
        local_gen++;
        pthread_cond_broadcast(&local_cv);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += env_int("FAKE_NCCL_WAIT_MS", 20000) / 1000 + 1;
    while (gen == local_gen) {
        if (pthread_cond_timedwait(&local_cv, &local_mu, &ts) != 0) {
            fprintf(stderr, "fake nccl: local rank %u waited for the others in an allgather: a hang\n", rank);
            _exit(99);
        }
    }
    pthread_mutex_unlock(&local_mu);
}

/* @return 1 when @p comm is a local rank: the allgather was done here. */
static int local_allgather(const void *sendbuff, void *recvbuff, size_t bytes, ncclComm_t comm)
{
    unsigned *c = fake_slot(comm);
    if (!c || !c[SLOT_LRANK])
        return 0;
    unsigned n = c[SLOT_LSIZE], me = c[SLOT_LRANK] - 1;
    local_send[me] = sendbuff;
    local_barrier(n, me);
    for (unsigned r = 0; r < n; r++)
        if ((const char *)recvbuff + (size_t)r * bytes != local_send[r])
            memmove((char *)recvbuff + (size_t)r * bytes, local_send[r], bytes);
    local_barrier(n, me); /* nobody's input is reused before everyone read it */
    return 1;
}

void fake_hook_ncclGetVersion(int *version)
{
    if (version)
        *version = env_int("FAKE_NCCL_VERSION", NCCL_VERSION_CODE);
}

#ifdef REC_HAVE_ncclCommGetUniqueId
void fake_hook_ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId)
{
    (void)comm;
    fake_hook_ncclGetUniqueId(uniqueId);
}
#endif

void fake_hook_ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return;
    memset(uniqueId->internal, 0x5a, sizeof(uniqueId->internal));
    if (env_int("FAKE_NCCL_ID_INET", 0)) {
        /* as NCCL's: a 64-bit magic, the root's IPv4 address (127.0.0.1:7), zeros */
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(7)};
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        memset(uniqueId->internal + 8, 0, sizeof(uniqueId->internal) - 8);
        memcpy(uniqueId->internal + 8, &sin, sizeof(sin));
    }
}

void fake_hook_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    (void)commId;
    if (comm) {
        *comm = fake_comm();
        local_mark(*comm, rank, nranks);
    }
}

void fake_hook_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                      ncclConfig_t *config)
{
    fake_hook_ncclCommInitRank(comm, nranks, commId, rank);
    unsigned *c = comm ? fake_slot(*comm) : NULL;
    if (c && env_int("FAKE_NCCL_NB_POLLS", 0) > 0 && config && config->blocking == 0) {
        c[SLOT_NB] = 1;
        nb_start(*comm);
    }
}

void fake_hook_ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                        ncclUniqueId *commIds, ncclConfig_t *config)
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
    for (int i = 0; comm && i < ndev; i++) {
        comm[i] = fake_comm();
        local_mark(comm[i], i, ndev);
    }
}

void fake_hook_ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    (void)comm;
    (void)key;
    (void)config;
    if (newcomm)
        *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : fake_comm();
}

#ifdef REC_HAVE_ncclCommGrow
/*
 * The grown communicator, a new one as after ncclCommInitRank (rank -1: a
 * rank of the parent, which keeps its rank). In a world of processes its
 * ncclAllGather calls meet among its own ranks, apart from the parent's.
 */
void fake_hook_ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                            ncclComm_t *newcomm, ncclConfig_t *config)
{
    (void)uniqueId;
    if (!newcomm)
        return;
    *newcomm = fake_comm();
    unsigned *c = fake_slot(comm), *g = fake_slot(*newcomm);
    int at = rank >= 0                  ? rank
             : c && c[SLOT_LRANK]       ? (int)c[SLOT_LRANK] - 1
             : mscxFakeNcclHostMemory() ? env_int("FAKE_NCCL_RANK", 0)
                                        : 0;
    local_mark(*newcomm, at, nRanks);
    if (g && !local_on() && mscxFakeNcclHostMemory()) {
        g[SLOT_WRANK] = (unsigned)at + 1;
        g[SLOT_WSIZE] = (unsigned)nRanks;
    }
    if (g && env_int("FAKE_NCCL_NB_POLLS", 0) > 0 && config && config->blocking == 0) {
        g[SLOT_NB] = 1; /* as a non-blocking ncclCommInitRankConfig */
        nb_start(*newcomm);
    }
}
#endif

#ifdef REC_HAVE_ncclCommShrink
void fake_hook_ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                              ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    (void)excludeRanksList;
    (void)excludeRanksCount;
    (void)config;
    fake_dev_shrink(comm, shrinkFlags);
    if (newcomm)
        *newcomm = fake_comm();
}
#endif

void fake_hook_ncclCommCount(const ncclComm_t comm, int *count)
{
    const unsigned *c = fake_slot(comm);
    if (count)
        *count = c && c[SLOT_LRANK]   ? (int)c[SLOT_LSIZE]
                 : c && c[SLOT_WRANK] ? (int)c[SLOT_WSIZE]
                                      : env_int("FAKE_NCCL_NRANKS", 1);
}

void fake_hook_ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    const unsigned *c = fake_slot(comm);
    if (rank)
        *rank = c && c[SLOT_LRANK]   ? (int)c[SLOT_LRANK] - 1
                : c && c[SLOT_WRANK] ? (int)c[SLOT_WRANK] - 1
                                     : env_int("FAKE_NCCL_RANK", 0);
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

/* Op handles as NCCL makes them: ncclNumOps and up (here never reused: a destroyed op stays invalid). */
void fake_hook_ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                        ncclScalarResidence_t residence, ncclComm_t comm)
{
    static int next;
    (void)scalar;
    (void)datatype;
    (void)residence;
    (void)comm;
    if (op)
        *op = (ncclRedOp_t)((int)ncclNumOps + next++);
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
/* Handles as opaque as NCCL's: the shim only compares them. */
void fake_hook_ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                      int winFlags)
{
    static unsigned long next;
    (void)comm;
    (void)buff;
    (void)size;
    (void)winFlags;
    if (win)
        *win = (ncclWindow_t)(0x3a000000ul + 0x40ul * ++next);
}
#endif

void fake_hook_ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    unsigned *c = fake_slot(comm);
    int busy = c && c[SLOT_POLLS] > 0;
    if (busy)
        c[SLOT_POLLS]--;
    if (asyncError)
        *asyncError = busy ? ncclInProgress : ncclSuccess;
}

/*
 * Several processes as the ranks of one communicator: with FAKE_NCCL_WORLD
 * set to a directory shared by FAKE_NCCL_NRANKS processes (each with its
 * FAKE_NCCL_RANK), ncclAllGather moves host bytes through files there (the
 * directory is created when absent and must start empty). The
 * n-th call of each process meets the n-th call of every other; on a
 * communicator of ncclCommGrow, the n-th call on such a one of each of its
 * ranks (FAKE_NCCL_NRANKS is the size of the others). A rank that
 * waits FAKE_NCCL_WAIT_MS (default 20000) for the others ends its process
 * with status 99 and a message: in a real job that call would hang.
 */
FAKE_EXPORT int mscxFakeNcclHostMemory(void)
{
    const char *w = getenv("FAKE_NCCL_WORLD");
    return (w && *w) || local_on();
}

/*
 * A local setup failure of this rank, for the shim's tests: 1 when
 * FAKE_NCCL_SETUP_FAULT names @p point (a place on the shim's way to its
 * fixed exchange: comm-alloc, table, boot, agree-alloc). A real NCCL never
 * exports it, and only the shim's test build looks it up: the product has no
 * such switch.
 */
FAKE_EXPORT int mscxFakeNcclSetupFault(const char *point)
{
    const char *f = getenv("FAKE_NCCL_SETUP_FAULT");
    return f && point && !strcmp(f, point);
}

static size_t fake_dtype_bytes(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 4;
    }
}

static int wait_file(const char *path, void *dst, size_t bytes, int wait_ms)
{
    for (int waited = 0; waited <= wait_ms; waited++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(dst, 1, bytes, f);
            fclose(f);
            if (n == bytes)
                return 0;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

void fake_hook_ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                             ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    static unsigned seq, grown_seq;
    if (!mscxFakeNcclHostMemory() || !sendbuff || !recvbuff)
        return;
    nb_start(comm);
    if (local_allgather(sendbuff, recvbuff, sendcount * fake_dtype_bytes(datatype), comm))
        return;
    const char *world = getenv("FAKE_NCCL_WORLD");
    const unsigned *c = fake_slot(comm);
    int grown = c && c[SLOT_WRANK]; /* a grown communicator's calls meet apart from the others' */
    int n = grown ? (int)c[SLOT_WSIZE] : env_int("FAKE_NCCL_NRANKS", 1);
    int me = grown ? (int)c[SLOT_WRANK] - 1 : env_int("FAKE_NCCL_RANK", 0);
    const char *kind = grown ? "grown" : "ag";
    size_t bytes = sendcount * fake_dtype_bytes(datatype);
    unsigned call = grown ? grown_seq++ : seq++;
    char path[4096], tmp[4200];
    mkdir(world, 0755); /* created on first use; it must not hold a previous run's files */
    snprintf(path, sizeof(path), "%s/%s.%u.%d", world, kind, call, me);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(sendbuff, 1, bytes, f) != bytes || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "fake nccl: cannot write %s\n", tmp);
        _exit(98);
    }
    unsigned char *mine = malloc(bytes ? bytes : 1);
    if (!mine)
        _exit(98);
    memcpy(mine, sendbuff, bytes); /* in place: sendbuff may lie inside recvbuff */
    for (int r = 0; r < n; r++) {
        snprintf(path, sizeof(path), "%s/%s.%u.%d", world, kind, call, r);
        if (r == me) {
            memcpy((char *)recvbuff + (size_t)r * bytes, mine, bytes);
            continue;
        }
        char *dst = (char *)recvbuff + (size_t)r * bytes;
        if (wait_file(path, dst, bytes, env_int("FAKE_NCCL_WAIT_MS", 20000))) {
            fprintf(stderr, "fake nccl: rank %d waited for rank %d in allgather %u of %zu bytes: a hang\n",
                    me, r, call, bytes);
            _exit(99);
        }
    }
    free(mine);
}
