/* SPDX-License-Identifier: MIT */
/*
 * Recovery loops (torchft, PyTorch's abort-then-new-group, nccl-tests -T)
 * abort a communicator and make a new one, over and over: nothing of the
 * aborted ones may pile up.
 *
 *   test-gpu-recreate SHIM CYCLES
 *
 * The shim is opened with dlopen over the real NCCL (MSCX_NCCL_LIB). At world
 * size 1, CYCLES times: ncclCommInitRank, a 4 KB fp32 AllReduce that a plan
 * takes (routed: the communicator has an executor), ncclCommAbort. Device
 * memory in use (cudaMemGetInfo) and host RSS are printed after a warm-up of
 * WARMUP cycles and at the end; the test fails when either grew by more than
 * its bound (DEVICE_BOUND, RSS_BOUND): one executor leaked per cycle is
 * several MB of device memory, far past them at 1,000 cycles.
 *
 * Exits 77 without a GPU or when MSCX_NCCL_LIB cannot be opened.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define WARMUP 50
#define DEVICE_BOUND (64ll << 20)
#define RSS_BOUND (32ll << 20)
#define COUNT 1024

struct api {
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
    return a->get_id && a->init && a->allreduce && a->abort ? 0 : -1;
}

/* Whether a GPU is there, asked in a child: CUDA must not start here before the fork. */
static int gpu_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 1;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
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

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SHIM CYCLES\n", argv[0]);
        return 2;
    }
    int cycles = atoi(argv[2]);
    const char *real = getenv("MSCX_NCCL_LIB");
    if (!gpu_present() || !real || !dlopen(real, RTLD_NOW | RTLD_GLOBAL)) {
        printf("skip: no GPU, or MSCX_NCCL_LIB %s cannot be opened\n", real ? real : "(unset)");
        return 77;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    struct api a;
    if (!h || api_load(h, &a) != 0 || cycles <= WARMUP) {
        fprintf(stderr, "FAIL: cannot load the shim %s, or CYCLES %d is not above %d\n", argv[1], cycles, WARMUP);
        return 1;
    }
    float *buf = NULL;
    cudaStream_t s;
    if (cudaMalloc((void **)&buf, 2 * COUNT * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "FAIL: no buffer or stream\n");
        return 1;
    }
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
           "(after %d cycles -> at the end)\n", cycles, dev0 / 1048576.0, dev1 / 1048576.0, rss0 / 1048576.0,
           rss1 / 1048576.0, WARMUP);
    int failures = 0;
    if (!routed()) {
        fprintf(stderr, "FAIL: the shim's log shows no executor or no routed call: the test proves nothing\n");
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
