/* SPDX-License-Identifier: MIT */
/*
 * A group of sends and recvs of an AlltoAll's shape across processes, through the shim.
 *
 *   test-gpu-sendrecv SHIM NRANKS [global|threadlocal]
 *
 * NRANKS processes on GPU 0 are the ranks of one communicator: the shim
 * (opened with dlopen) over the fake NCCL of MSCX_NCCL_LIB
 * (tests/gpu/fake_gpu_nccl.c, whose ranks meet through files in a fresh
 * FAKE_GPU_NCCL_WORLD). Every rank, per count of SIZES (inside the shipped
 * plans' oneshot range at 2 and 4 ranks):
 *
 *   1. an eager ncclAlltoAll on the group's buffers, checked (it maps the
 *      peers' buffers, which a launch under capture can only use once
 *      mapped: executor/gpu/runtime/peer_buffers.h)
 *   2. one group captured in a CUDA graph (capture mode of argv[3],
 *      global by default): for every rank j, ncclSend of block j and
 *      ncclRecv into block j, each block `count` floats of one buffer
 *   3. three replays, each with new send values: recv block j must be
 *      rank j's send block for this rank, bit for bit, the 64 floats past
 *      the end untouched; no call reaches the fake NCCL
 *
 * then the same group once eagerly, which must reach the fake NCCL as
 * NRANKS sends and NRANKS recvs (its data is not checked: the fake moves
 * none). After ncclCommDestroy each rank reads its MSCX_SUMMARY_FILE
 * (PATH.<rank>): at least two routed calls per count, and the fallbacks
 * exactly {"sendrecv": 1}, the eager group. The ranks meet at file
 * barriers before every group (the agreement waits at most 2 s); a rank
 * that fails marks the world, so the others stop at their next barrier.
 * Each rank has an alarm; the parent kills what is left after its own
 * deadline. Exits 0, 1 when a rank failed, 77 without a GPU.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define MAX_RANKS 8
#define GUARD 64
#define REPLAYS 3
#define RANK_ALARM_S 120
#define PARENT_DEADLINE_S 150
#define BARRIER_WAIT_MS 30000
#define SUMMARY_BYTES (1 << 16)

/* floats per peer: two sizes in the oneshot plans' range (1K-64K in all) at 2 and 4 ranks */
static const size_t SIZES[] = {256, 2048};
#define NSIZES (sizeof(SIZES) / sizeof(SIZES[0]))

struct api {
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*alltoall)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
};

struct fake_calls {
    long long sends, recvs, alltoalls;
};

struct rank_ctx {
    int rank, nranks;
    const char *world;
    enum cudaStreamCaptureMode mode;
    struct api a;
    void (*fake_calls)(long long *, long long *, long long *);
    ncclComm_t comm;
    cudaStream_t s;
    unsigned barriers;
};

#define RFAIL(c, ...)                                                                                        \
    do {                                                                                                     \
        fprintf(stderr, "FAIL: rank %d/%d: ", (c)->rank, (c)->nranks);                                       \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        fputc('\n', stderr);                                                                                 \
    } while (0)

/* ---- the world: barriers and the failure mark, files in its directory ---- */

static void world_path(const struct rank_ctx *c, char *out, size_t len, const char *name, unsigned k, int r)
{
    snprintf(out, len, "%s/%s.%u.%d", c->world, name, k, r);
}

static int touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    return fd >= 0 && close(fd) == 0 ? 0 : -1;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void mark_failed(const struct rank_ctx *c)
{
    char p[4096];
    world_path(c, p, sizeof(p), "failed", 0, c->rank);
    touch(p);
}

/* The rank of a failure mark, or -1 when none. */
static int failed_rank(const struct rank_ctx *c)
{
    char p[4096];
    for (int r = 0; r < c->nranks; r++) {
        world_path(c, p, sizeof(p), "failed", 0, r);
        if (exists(p))
            return r;
    }
    return -1;
}

/* Every rank at barrier number c->barriers. @return 0, or -1 (said why) on a failure mark or a timeout */
static int barrier(struct rank_ctx *c, const char *what)
{
    char p[4096];
    unsigned k = c->barriers++;
    world_path(c, p, sizeof(p), "barrier", k, c->rank);
    if (touch(p) != 0) {
        RFAIL(c, "cannot create %s: %s", p, strerror(errno));
        return -1;
    }
    for (int ms = 0; ms < BARRIER_WAIT_MS; ms++) {
        int all = 1;
        for (int r = 0; r < c->nranks && all; r++) {
            world_path(c, p, sizeof(p), "barrier", k, r);
            all = exists(p);
        }
        if (all)
            return 0;
        int f = failed_rank(c);
        if (f >= 0) {
            RFAIL(c, "stopping before %s: rank %d failed", what, f);
            return -1;
        }
        usleep(1000);
    }
    RFAIL(c, "the other ranks did not reach the barrier before %s in %d s", what, BARRIER_WAIT_MS / 1000);
    return -1;
}

/* ---- values: unique per (seed, sending rank, block, element), integers exact in fp32 ---- */

static uint32_t value_bits(const struct rank_ctx *c, size_t count, unsigned seed, int src, int blk, size_t i)
{
    size_t span = (size_t)c->nranks * c->nranks * count;
    float v = (float)(seed * span + ((size_t)src * c->nranks + blk) * count + i);
    uint32_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

/* Whether every value of @p seed stays below 2^24, where fp32 holds every integer. */
static int values_exact(const struct rank_ctx *c, size_t count, unsigned max_seed)
{
    return (max_seed + 1) * (size_t)c->nranks * c->nranks * count <= (1u << 24);
}

/* What a wrong word is, for the message: the sentinel, or the (seed, rank, block, element) it encodes. */
static void describe(const struct rank_ctx *c, size_t count, uint32_t bits, char *out, size_t len)
{
    float v;
    memcpy(&v, &bits, sizeof(v));
    size_t span = (size_t)c->nranks * c->nranks * count;
    if (bits == 0xffffffffu) {
        snprintf(out, len, "the sentinel: nothing was written there");
    } else if (v >= 0 && v < (float)(1u << 24) && v == (float)(size_t)v) {
        size_t x = (size_t)v, idx = x % span;
        snprintf(out, len, "%.1f = seed %zu, rank %zu's block %zu element %zu", v, x / span,
                 idx / count / c->nranks, idx / count % c->nranks, idx % count);
    } else {
        snprintf(out, len, "%g (0x%08x)", v, bits);
    }
}

/* ---- one rank ---- */

struct bufs {
    size_t count;
    float *send, *recv;    /* device: nranks x count, and nranks x count + GUARD */
    uint32_t *host;        /* pinned: the send values, then what came back */
    size_t send_n, recv_n; /* elements */
};

static int bufs_alloc(struct rank_ctx *c, struct bufs *b, size_t count)
{
    memset(b, 0, sizeof(*b));
    b->count = count;
    b->send_n = (size_t)c->nranks * count;
    b->recv_n = b->send_n + GUARD;
    if (cudaMalloc((void **)&b->send, b->send_n * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&b->recv, b->recv_n * sizeof(float)) != cudaSuccess ||
        cudaMallocHost((void **)&b->host, b->recv_n * sizeof(uint32_t)) != cudaSuccess) {
        RFAIL(c, "cannot allocate the buffers of count %zu", count);
        return -1;
    }
    return 0;
}

static void bufs_free(struct bufs *b)
{
    cudaFree(b->send);
    cudaFree(b->recv);
    cudaFreeHost(b->host);
}

/* On c->s: the send values of @p seed, the recv buffer and its guard all 0xff bytes. */
static int refill(struct rank_ctx *c, struct bufs *b, unsigned seed)
{
    for (int j = 0; j < c->nranks; j++)
        for (size_t i = 0; i < b->count; i++)
            b->host[(size_t)j * b->count + i] = value_bits(c, b->count, seed, c->rank, j, i);
    if (cudaMemcpyAsync(b->send, b->host, b->send_n * sizeof(float), cudaMemcpyHostToDevice, c->s) !=
            cudaSuccess ||
        cudaMemsetAsync(b->recv, 0xff, b->recv_n * sizeof(float), c->s) != cudaSuccess ||
        cudaStreamSynchronize(c->s) != cudaSuccess) {
        RFAIL(c, "refilling the buffers (seed %u) failed", seed);
        return -1;
    }
    return 0;
}

/* b->host (the recv buffer and its guard): block j must be rank j's send block for this rank (@p seed). */
static int compare(const struct rank_ctx *c, const struct bufs *b, unsigned seed, const char *what)
{
    size_t bad = 0, first = 0;
    uint32_t want_first = 0;
    for (size_t k = 0; k < b->recv_n; k++) {
        uint32_t want = k < b->send_n
                            ? value_bits(c, b->count, seed, (int)(k / b->count), c->rank, k % b->count)
                            : 0xffffffffu;
        if (b->host[k] != want && bad++ == 0) {
            first = k;
            want_first = want;
        }
    }
    if (!bad)
        return 0;
    char got[160], want[160];
    describe(c, b->count, b->host[first], got, sizeof(got));
    describe(c, b->count, want_first, want, sizeof(want));
    if (first < b->send_n)
        RFAIL(c, "%s: %zu of %zu words wrong; first at block %zu element %zu: got %s, want %s", what, bad,
              b->recv_n, first / b->count, first % b->count, got, want);
    else
        RFAIL(c, "%s: %zu of %zu words wrong; first in the guard past the end (float %zu): got %s", what, bad,
              b->recv_n, first - b->send_n, got);
    return -1;
}

/* The recv buffer copied back and compared. */
static int check(struct rank_ctx *c, struct bufs *b, unsigned seed, const char *what)
{
    if (cudaMemcpyAsync(b->host, b->recv, b->recv_n * sizeof(float), cudaMemcpyDeviceToHost, c->s) !=
            cudaSuccess ||
        cudaStreamSynchronize(c->s) != cudaSuccess) {
        RFAIL(c, "%s: copying the recv buffer back failed: %s", what, cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    return compare(c, b, seed, what);
}

static struct fake_calls fake_now(const struct rank_ctx *c)
{
    struct fake_calls f;
    c->fake_calls(&f.sends, &f.recvs, &f.alltoalls);
    return f;
}

/* The calls that reached the fake NCCL since @p before must be @p sends, @p recvs and no AlltoAll. */
static int fake_delta(const struct rank_ctx *c, struct fake_calls before, long long sends, long long recvs,
                      const char *what)
{
    struct fake_calls now = fake_now(c);
    long long ds = now.sends - before.sends, dr = now.recvs - before.recvs,
              da = now.alltoalls - before.alltoalls;
    if (ds == sends && dr == recvs && da == 0)
        return 0;
    RFAIL(c, "%s: the fake NCCL got %lld sends, %lld recvs, %lld AlltoAlls; want %lld, %lld, 0", what, ds, dr,
          da, sends, recvs);
    return -1;
}

/* The group: one send and one recv per rank, block j of each buffer for rank j. @return the first error */
static ncclResult_t issue_group(struct rank_ctx *c, struct bufs *b)
{
    ncclResult_t res = c->a.group_start();
    for (int j = 0; j < c->nranks && res == ncclSuccess; j++) {
        res = c->a.send(b->send + (size_t)j * b->count, b->count, ncclFloat32, j, c->comm, c->s);
        if (res == ncclSuccess)
            res = c->a.recv(b->recv + (size_t)j * b->count, b->count, ncclFloat32, j, c->comm, c->s);
    }
    ncclResult_t end = c->a.group_end(); /* ends the group even after a failed call */
    return res != ncclSuccess ? res : end;
}

/* The group captured: @return the instantiated graph, or NULL (said why). */
static cudaGraphExec_t capture_group(struct rank_ctx *c, struct bufs *b, const char *what)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (cudaStreamBeginCapture(c->s, c->mode) != cudaSuccess) {
        RFAIL(c, "%s: cudaStreamBeginCapture failed", what);
        return NULL;
    }
    ncclResult_t r = issue_group(c, b);
    cudaError_t ce = cudaStreamEndCapture(c->s, &g);
    if (r != ncclSuccess || ce != cudaSuccess) {
        RFAIL(c, "%s: the captured group returned %d, cudaStreamEndCapture %s%s", what, (int)r,
              cudaGetErrorString(ce),
              ce != cudaSuccess ? " (a CUDA call the capture mode forbids? try the threadlocal argument)"
                                : "");
        cudaGetLastError();
        return NULL;
    }
    size_t nodes = 0;
    cudaGraphGetNodes(g, NULL, &nodes);
    ce = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        RFAIL(c, "%s: cudaGraphInstantiate: %s", what, cudaGetErrorString(ce));
        return NULL;
    }
    printf("rank %d/%d: %s: captured, %zu graph nodes\n", c->rank, c->nranks, what, nodes);
    return ge;
}

/* Steps 1-3 of the header at one count. */
static int run_count(struct rank_ctx *c, size_t count)
{
    struct bufs b;
    struct fake_calls f0;
    cudaGraphExec_t ge = NULL;
    ncclResult_t r;
    char what[160];
    int bad = 0;
    if (!values_exact(c, count, REPLAYS + 1)) {
        RFAIL(c, "count %zu at %d ranks: the test's values are not exact in fp32", count, c->nranks);
        return -1;
    }
    if (bufs_alloc(c, &b, count) != 0)
        return -1;
    snprintf(what, sizeof(what), "count %zu (%zu B), eager ncclAlltoAll", count, count * c->nranks * 4);
    if (refill(c, &b, 1) != 0 || barrier(c, what) != 0)
        goto fail;
    f0 = fake_now(c);
    r = c->a.alltoall(b.send, b.recv, count, ncclFloat32, c->comm, c->s);
    if (r != ncclSuccess) {
        RFAIL(c, "%s returned %d", what, (int)r);
        goto fail;
    }
    if (check(c, &b, 1, what) != 0 || fake_delta(c, f0, 0, 0, what) != 0)
        goto fail;
    snprintf(what, sizeof(what), "count %zu (%zu B), the captured group", count, count * c->nranks * 4);
    if (barrier(c, what) != 0)
        goto fail;
    f0 = fake_now(c);
    ge = capture_group(c, &b, what);
    if (!ge || fake_delta(c, f0, 0, 0, what) != 0)
        goto fail;
    for (unsigned k = 0; k < REPLAYS && !bad; k++) {
        unsigned seed = 2 + k;
        snprintf(what, sizeof(what), "count %zu (%zu B), replay %u", count, count * c->nranks * 4, k);
        if (refill(c, &b, seed) != 0)
            bad = 1;
        else if (cudaGraphLaunch(ge, c->s) != cudaSuccess) {
            RFAIL(c, "%s: cudaGraphLaunch: %s", what, cudaGetErrorString(cudaGetLastError()));
            bad = 1;
        } else {
            bad = check(c, &b, seed, what) != 0;
        }
    }
    cudaGraphExecDestroy(ge);
    ge = NULL;
    if (bad || fake_delta(c, f0, 0, 0, "the replays") != 0)
        goto fail;
    printf("rank %d/%d: count %zu: eager AlltoAll and %d replays of the captured group right\n", c->rank,
           c->nranks, count, REPLAYS);
    bufs_free(&b);
    return 0;
fail:
    if (ge)
        cudaGraphExecDestroy(ge);
    bufs_free(&b);
    return -1;
}

/* Step 4: the group eagerly goes to NCCL as it was issued. */
static int run_eager_group(struct rank_ctx *c)
{
    struct bufs b;
    const char *what = "the eager group";
    if (bufs_alloc(c, &b, SIZES[0]) != 0)
        return -1;
    int bad = refill(c, &b, 1) != 0 || barrier(c, what) != 0;
    if (!bad) {
        struct fake_calls f0 = fake_now(c);
        ncclResult_t r = issue_group(c, &b);
        if (r != ncclSuccess || cudaStreamSynchronize(c->s) != cudaSuccess) {
            RFAIL(c, "%s returned %d", what, (int)r);
            bad = 1;
        } else {
            bad = fake_delta(c, f0, c->nranks, c->nranks, what) != 0;
        }
    }
    bufs_free(&b);
    if (!bad)
        printf("rank %d/%d: %s went to NCCL as %d sends and %d recvs\n", c->rank, c->nranks, what, c->nranks,
               c->nranks);
    return bad ? -1 : 0;
}

static size_t read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return n;
}

/* Step 5: this rank's summary (MSCX_SUMMARY_FILE.<rank>), written at the destroy. */
static int check_summary(struct rank_ctx *c)
{
    static char buf[SUMMARY_BYTES];
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", getenv("MSCX_SUMMARY_FILE"), c->rank);
    if (read_file(path, buf, sizeof(buf)) == 0) {
        RFAIL(c, "no routing summary in %s", path);
        return -1;
    }
    const char *r = strstr(buf, "\"routed\": "), *f = strstr(buf, "\"fallback\": ");
    const char *fend = f ? strchr(f, '}') : NULL;
    unsigned long long routed = r ? strtoull(r + strlen("\"routed\": "), NULL, 10) : 0;
    char fallback[256] = "(none)";
    if (f && fend) {
        f += strlen("\"fallback\": ");
        snprintf(fallback, sizeof(fallback), "%.*s", (int)(fend + 1 - f), f);
    }
    printf("rank %d/%d: summary: routed %llu, fallback %s\n", c->rank, c->nranks, routed, fallback);
    if (!r || routed < 2 * NSIZES || strcmp(fallback, "{\"sendrecv\": 1}") != 0) {
        RFAIL(c,
              "summary %s: want routed >= %zu (an eager AlltoAll and a captured group per count) and "
              "fallback {\"sendrecv\": 1} (the eager group); it is:\n%s",
              path, 2 * NSIZES, buf);
        return -1;
    }
    return 0;
}

static int api_load(void *h, struct api *a)
{
    a->init = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(h, "ncclCommInitRank");
    a->destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
    a->alltoall = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                   cudaStream_t))dlsym(h, "ncclAlltoAll");
    a->send = (ncclResult_t(*)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))dlsym(
        h, "ncclSend");
    a->recv =
        (ncclResult_t(*)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))dlsym(h, "ncclRecv");
    a->group_start = (ncclResult_t(*)(void))dlsym(h, "ncclGroupStart");
    a->group_end = (ncclResult_t(*)(void))dlsym(h, "ncclGroupEnd");
    return a->init && a->destroy && a->alltoall && a->send && a->recv && a->group_start && a->group_end ? 0
                                                                                                        : -1;
}

/* Open the fake (for its counters) and the shim over it, create the communicator. */
static int rank_open(struct rank_ctx *c, const char *shim_path)
{
    const char *fake_path = getenv("MSCX_NCCL_LIB");
    void *fake = fake_path ? dlopen(fake_path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    c->fake_calls =
        fake ? (void (*)(long long *, long long *, long long *))dlsym(fake, "mscxFakeGpuP2pCalls") : NULL;
    if (!c->fake_calls) {
        RFAIL(c, "MSCX_NCCL_LIB %s is not the fake GPU NCCL with send/recv counters",
              fake_path ? fake_path : "(unset)");
        return -1;
    }
    void *h = dlopen(shim_path, RTLD_NOW | RTLD_LOCAL);
    if (!h || api_load(h, &c->a) != 0) {
        RFAIL(c, "cannot open the shim %s or find its calls: %s", shim_path, dlerror());
        return -1;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (cudaSetDevice(0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking) != cudaSuccess) {
        RFAIL(c, "cannot set up GPU 0 and a stream");
        return -1;
    }
    ncclResult_t r = c->a.init(&c->comm, c->nranks, id, c->rank);
    if (r != ncclSuccess || !c->comm) {
        RFAIL(c, "ncclCommInitRank through the shim returned %d", (int)r);
        return -1;
    }
    return 0;
}

static int rank_main(struct rank_ctx *c, const char *shim_path)
{
    char log[4096];
    snprintf(log, sizeof(log), "%s/log.%d", c->world, c->rank);
    setenv("MSCX_DEBUG_FILE", log, 1);
    setenv("MSCX_DEBUG", "INFO", 0);
    setenv("MSCX_DEBUG_SUBSYS", "SHIM", 0);
    alarm(RANK_ALARM_S);
    if (rank_open(c, shim_path) != 0)
        return 1;
    for (size_t k = 0; k < NSIZES; k++)
        if (run_count(c, SIZES[k]) != 0)
            return 1;
    if (run_eager_group(c) != 0)
        return 1;
    ncclResult_t r = c->a.destroy(c->comm);
    if (r != ncclSuccess) {
        RFAIL(c, "ncclCommDestroy returned %d", (int)r);
        return 1;
    }
    return check_summary(c) != 0;
}

/* ---- the parent ---- */

/* Whether a GPU is there, asked in a child: CUDA must not start here before the forks. */
static int gpu_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 1;
    waitpid(pid, &status, 0);
    return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The shim's summary lines of rank @p r's log (all of it when @p all). */
static void print_log(const char *world, int r, int all)
{
    static char buf[1 << 20];
    char path[4096];
    snprintf(path, sizeof(path), "%s/log.%d", world, r);
    size_t n = read_file(path, buf, sizeof(buf));
    if (all) {
        const char *from = n > 16384 ? buf + n - 16384 : buf;
        printf("---- rank %d's log %s (last 16 KB) ----\n%s\n", r, path, from);
        return;
    }
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "summary at") || strstr(line, "routed"))
            printf("rank %d log: %s\n", r, line);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Wait for every rank until the deadline, then kill what is left. @return the number of ranks that failed */
static int wait_ranks(const pid_t *pids, int n)
{
    int left = n, failed = 0, done[MAX_RANKS] = {0};
    time_t deadline = time(NULL) + PARENT_DEADLINE_S;
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            int status = 0;
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            done[r] = 1;
            left--;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                continue;
            failed++;
            if (WIFSIGNALED(status))
                fprintf(stderr, "FAIL: rank %d ended by signal %d%s\n", r, WTERMSIG(status),
                        WTERMSIG(status) == SIGALRM ? " (its alarm: it hung)" : "");
            else
                fprintf(stderr, "FAIL: rank %d exited with %d\n", r, WEXITSTATUS(status));
        }
        if (left > 0 && time(NULL) > deadline) {
            for (int r = 0; r < n; r++)
                if (!done[r]) {
                    fprintf(stderr, "FAIL: rank %d still runs after %d s: killed\n", r, PARENT_DEADLINE_S);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    done[r] = 1;
                    failed++;
                    left--;
                }
        }
        usleep(10000);
    }
    return failed;
}

int main(int argc, char **argv)
{
    int nranks = argc >= 3 ? atoi(argv[2]) : 0;
    const char *mode = argc >= 4 ? argv[3] : "global";
    if (argc < 3 || argc > 4 || nranks < 2 || nranks > MAX_RANKS ||
        (strcmp(mode, "global") != 0 && strcmp(mode, "threadlocal") != 0)) {
        fprintf(stderr, "usage: %s SHIM NRANKS(2-%d) [global|threadlocal]\n", argv[0], MAX_RANKS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!gpu_present()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    char world[] = "/tmp/mscx-sendrecv-world-XXXXXX", summary[4096];
    if (!mkdtemp(world)) {
        fprintf(stderr, "FAIL: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(summary, sizeof(summary), "%s/summary", world);
    setenv("FAKE_GPU_NCCL_WORLD", world, 1); /* the fake's exchange directory, fresh */
    setenv("MSCX_SUMMARY_FILE", summary, 1);
    printf("%d ranks on GPU 0, capture mode %s, world %s\n", nranks, mode, world);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            struct rank_ctx c = {.rank = r, .nranks = nranks, .world = world};
            c.mode = !strcmp(mode, "global") ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal;
            int rc = rank_main(&c, argv[1]);
            if (rc)
                mark_failed(&c);
            fflush(stdout);
            _exit(rc);
        }
        if (pids[r] < 0) {
            fprintf(stderr, "FAIL: fork: %s\n", strerror(errno));
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            return 1;
        }
    }
    int failed = wait_ranks(pids, nranks);
    for (int r = 0; r < nranks; r++)
        print_log(world, r, failed > 0);
    if (failed) {
        printf("failed: %d of %d ranks (their files are in %s)\n", failed, nranks, world);
        return 1;
    }
    nftw(world, remove_one, 8, FTW_DEPTH | FTW_PHYS);
    printf("ok\n");
    return 0;
}
