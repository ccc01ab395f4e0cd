/* SPDX-License-Identifier: MIT */
/*
 * Recovery loops (torchft, PyTorch's abort-then-new-group, nccl-tests -T)
 * abort a communicator and make a new one, over and over: nothing of the
 * aborted ones may pile up.
 *
 *   test-gpu-recreate SHIM CYCLES
 *   test-gpu-recreate SHIM capture
 *
 * The shim is opened with dlopen over the NCCL of MSCX_NCCL_LIB. At world
 * size 1, CYCLES times: ncclCommInitRank, a 4 KB fp32 AllReduce that a plan
 * takes (routed: the communicator has an executor), ncclCommAbort. Device
 * memory in use (cudaMemGetInfo) and host RSS are printed after a warm-up of
 * WARMUP cycles and at the end; the test fails when either grew by more than
 * its bound (DEVICE_BOUND, RSS_BOUND): one executor leaked per cycle is
 * several MB of device memory, far past them at 1,000 cycles.
 *
 * "capture": a communicator is made (and its executor set up) while another
 * thread captures a graph in global mode; the capture must survive, as it
 * does with NCCL alone, which switches to relaxed capture mode around its
 * allocations.
 *
 * Exits 77 without a GPU or when MSCX_NCCL_LIB cannot be opened.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include "gpu_test.h"

#define WARMUP 50
#define DEVICE_BOUND (64ll << 20)
#define RSS_BOUND (32ll << 20)
#define COUNT 1024

struct api {
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*allreduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t);
};

static int api_load(void *h, struct api *a)
{
    a->get_id = (ncclResult_t(*)(ncclUniqueId *))dlsym(h, "ncclGetUniqueId");
    a->init = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(h, "ncclCommInitRank");
    a->allreduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                    cudaStream_t))dlsym(h, "ncclAllReduce");
    a->abort = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommAbort");
    a->destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
    return a->destroy && a->get_id && a->init && a->allreduce && a->abort ? 0 : -1;
}

static long long device_used(void)
{
    size_t free_b = 0, total = 0;
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? (long long)(total - free_b) : -1;
}

static long long host_rss(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    int ok = f && fscanf(f, "%ld %ld", &pages, &rss) == 2;
    if (f)
        fclose(f);
    return ok ? (long long)rss * sysconf(_SC_PAGESIZE) : -1;
}

/* One cycle: init, a routed allreduce, abort. @return 0 or -1 */
static int cycle(const struct api *a, float *buf, cudaStream_t s)
{
    ncclUniqueId id;
    ncclComm_t c = NULL;
    if (a->get_id(&id) != ncclSuccess || a->init(&c, 1, id, 0) != ncclSuccess || !c)
        return -1;
    int ok = a->allreduce(buf, buf + COUNT, COUNT, ncclFloat32, ncclSum, c, s) == ncclSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess;
    return a->abort(c) == ncclSuccess && ok ? 0 : -1;
}

/* The shim's log (MSCX_DEBUG_FILE at INFO) says the communicators had an executor and routed. */
static int routed(void)
{
    static char buf[1 << 16];
    const char *path = getenv("MSCX_DEBUG_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return strstr(buf, "usable here") && !strstr(buf, "no executor") && strstr(buf, "routed 1 ");
}

/* The capturing thread and the main thread take turns: 1 capturing, 2 communicator made, 3 capture ended. */
struct capture {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int step;
    float *buf;
    cudaError_t end_rc;
    int replay_ok;
};

static void step_set(struct capture *c, int step)
{
    pthread_mutex_lock(&c->lock);
    c->step = step;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

static void step_wait(struct capture *c, int step)
{
    pthread_mutex_lock(&c->lock);
    while (c->step < step)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* Captures two memsets in global mode around the other thread's communicator setup, then replays the graph.
 */
static void *capturer(void *arg)
{
    struct capture *c = arg;
    cudaStream_t cs;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge;
    size_t half = COUNT * sizeof(float);
    c->end_rc = cudaErrorUnknown;
    if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) != cudaSuccess) {
        step_set(c, 1);
        return NULL;
    }
    int ok = cudaMemsetAsync(c->buf, 0x11, half, cs) == cudaSuccess;
    step_set(c, 1);
    step_wait(c, 2);
    ok = ok && cudaMemsetAsync((char *)c->buf + half, 0x22, half, cs) == cudaSuccess;
    c->end_rc = cudaStreamEndCapture(cs, &g);
    if (!ok && c->end_rc == cudaSuccess)
        c->end_rc = cudaErrorUnknown;
    unsigned char h[2] = {0, 0};
    c->replay_ok = c->end_rc == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
                   cudaGraphLaunch(ge, cs) == cudaSuccess && cudaStreamSynchronize(cs) == cudaSuccess &&
                   cudaMemcpy(&h[0], c->buf, 1, cudaMemcpyDeviceToHost) == cudaSuccess &&
                   cudaMemcpy(&h[1], (char *)c->buf + half, 1, cudaMemcpyDeviceToHost) == cudaSuccess &&
                   h[0] == 0x11 && h[1] == 0x22;
    step_set(c, 3);
    return NULL;
}

/*
 * A communicator made while another thread captures in global mode; 0 when
 * both survived (and, with @p shim, the call was routed).
 */
static int capture_run(const struct api *a, float *buf, cudaStream_t s, int shim)
{
    struct capture c = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, buf, cudaSuccess, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, capturer, &c) != 0) {
        fprintf(stderr, "FAIL: no thread\n");
        return 1;
    }
    step_wait(&c, 1);
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    int made = a->get_id(&id) == ncclSuccess && a->init(&comm, 1, id, 0) == ncclSuccess && comm;
    step_set(&c, 2);
    pthread_join(t, NULL);
    int ran = made && a->allreduce(buf, buf + COUNT, COUNT, ncclFloat32, ncclSum, comm, s) == ncclSuccess &&
              cudaStreamSynchronize(s) == cudaSuccess;
    if (comm)
        a->destroy(comm);
    int failures = 0;
    if (!made || !ran) {
        fprintf(stderr, "FAIL: communicator made during the capture: init %s, allreduce %s\n",
                made ? "ok" : "failed", ran ? "ok" : "failed");
        failures++;
    }
    if (c.end_rc != cudaSuccess || !c.replay_ok) {
        fprintf(stderr, "FAIL: the other thread's capture: end %s, replay %s\n", cudaGetErrorString(c.end_rc),
                c.replay_ok ? "ok" : "wrong or failed");
        failures++;
    }
    if (shim && !routed()) {
        fprintf(stderr,
                "FAIL: the shim's log shows no executor or no routed call: the test proves nothing\n");
        failures++;
    }
    if (!failures && shim)
        printf("communicator and executor set up while another thread captured in global mode: capture "
               "intact\n");
    return failures ? 1 : 0;
}

static int buffers(float **buf_p, cudaStream_t *s_p)
{
    if (cudaMalloc((void **)buf_p, 2 * COUNT * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(s_p, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "FAIL: no buffer or stream\n");
        return -1;
    }
    return 0;
}

/* capture_run with NCCL alone (@p real) in a child first: where NCCL itself fails, there is nothing to match.
 */
static int capture_main(void *real, void *shim)
{
    struct api a;
    float *buf;
    cudaStream_t s;
    pid_t pid = fork();
    if (pid == 0)
        _exit(api_load(real, &a) == 0 && buffers(&buf, &s) == 0 ? capture_run(&a, buf, s, 0) : 1);
    int status = 1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("skip: NCCL alone cannot make a communicator while another thread captures in global mode\n");
        return 77;
    }
    if (api_load(shim, &a) != 0 || buffers(&buf, &s) != 0)
        return 1;
    return capture_run(&a, buf, s, 1);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SHIM CYCLES|capture\n", argv[0]);
        return 2;
    }
    int capture = strcmp(argv[2], "capture") == 0;
    int cycles = capture ? WARMUP + 1 : atoi(argv[2]);
    const char *real = getenv("MSCX_NCCL_LIB");
    void *rh = real && gpu_present() ? dlopen(real, RTLD_NOW | RTLD_GLOBAL) : NULL;
    if (!rh) {
        printf("skip: no GPU, or MSCX_NCCL_LIB %s cannot be opened\n", real ? real : "(unset)");
        return 77;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    struct api a;
    if (!h || api_load(h, &a) != 0 || cycles <= WARMUP) {
        fprintf(stderr, "FAIL: cannot load the shim %s, or CYCLES %d is not above %d\n", argv[1], cycles,
                WARMUP);
        return 1;
    }
    if (capture)
        return capture_main(rh, h);
    float *buf = NULL;
    cudaStream_t s;
    if (buffers(&buf, &s) != 0)
        return 1;
    long long dev0 = 0, rss0 = 0;
    for (int i = 0; i < cycles; i++) {
        if (cycle(&a, buf, s) != 0) {
            fprintf(stderr, "FAIL: cycle %d: init, allreduce or abort failed\n", i);
            return 1;
        }
        if (i + 1 == WARMUP) {
            dev0 = device_used();
            rss0 = host_rss();
        }
    }
    long long dev1 = device_used(), rss1 = host_rss();
    printf("%d abort-and-recreate cycles: device memory in use %.1f -> %.1f MB, host RSS %.1f -> %.1f MB "
           "(after %d cycles -> at the end)\n",
           cycles, dev0 / 1048576.0, dev1 / 1048576.0, rss0 / 1048576.0, rss1 / 1048576.0, WARMUP);
    int failures = 0;
    if (!routed()) {
        fprintf(stderr,
                "FAIL: the shim's log shows no executor or no routed call: the test proves nothing\n");
        failures++;
    }
    if (dev0 < 0 || dev1 - dev0 > DEVICE_BOUND) {
        fprintf(stderr, "FAIL: device memory grew by %.1f MB (bound %lld MB)\n", (dev1 - dev0) / 1048576.0,
                DEVICE_BOUND >> 20);
        failures++;
    }
    if (rss0 < 0 || rss1 - rss0 > RSS_BOUND) {
        fprintf(stderr, "FAIL: host RSS grew by %.1f MB (bound %lld MB)\n", (rss1 - rss0) / 1048576.0,
                RSS_BOUND >> 20);
        failures++;
    }
    return failures ? 1 : 0;
}
