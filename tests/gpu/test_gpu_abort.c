/* SPDX-License-Identifier: MIT */
/*
 * Abort and revoke through the shim never wait on a foreign kernel.
 *
 *   test-gpu-abort SHIM MODE
 *
 * The shim is opened with dlopen; its real NCCL is MSCX_NCCL_LIB (the
 * environment sets it: tests/gpu/fake_gpu_nccl.c, or the real NCCL for
 * "timed" where it is loadable), opened here too for direct calls.
 *
 *   spin    a foreign kernel on another stream that only the real abort's
 *           flag ends (the fake's abort sets it, then frees, as NCCL does):
 *           the shim's ncclCommAbort returns within 1 s of the fake's own
 *           (a watchdog sets the flag after 10 s and fails the test)
 *   timed   a foreign kernel that ends by itself after 2 s: the shim's
 *           abort takes no longer than the real library's own abort in
 *           the same situation (+0.5 s)
 *   revoke  two processes as the ranks of one communicator (the fake, over
 *           files): rank 0's allreduce spins on our kernel waiting for
 *           rank 1; ncclCommRevoke returns, our kernel ends (MSCX_TIMEOUT_MS
 *           is far away), and the next allreduce gets NCCL's error
 *
 * Exits 77 without a GPU, or (timed) when MSCX_NCCL_LIB cannot be opened.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include "gpu_test.h"

int abort_test_spin_until(volatile int *flag_dev, cudaStream_t s);
int abort_test_spin_for(uint64_t ns, cudaStream_t s);

struct api {
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*allreduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*abort)(ncclComm_t);
    ncclResult_t (*revoke)(ncclComm_t, int);
    ncclResult_t (*destroy)(ncclComm_t);
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int api_load(void *h, struct api *a)
{
    a->get_id = (ncclResult_t(*)(ncclUniqueId *))dlsym(h, "ncclGetUniqueId");
    a->init = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(h, "ncclCommInitRank");
    a->allreduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                    cudaStream_t))dlsym(h, "ncclAllReduce");
    a->abort = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommAbort");
    a->revoke = (ncclResult_t(*)(ncclComm_t, int))dlsym(h, "ncclCommRevoke");
    a->destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
    return a->get_id && a->init && a->allreduce && a->abort && a->destroy ? 0 : -1;
}

static ncclComm_t one_rank(const struct api *a)
{
    ncclUniqueId id;
    ncclComm_t c = NULL;
    if (a->get_id(&id) != ncclSuccess || a->init(&c, 1, id, 0) != ncclSuccess || !c)
        return NULL;
    return c;
}

/*
 * The shim's log (MSCX_DEBUG_FILE, INFO) says a communicator got an
 * executor: else every call went to NCCL and the test proves nothing.
 */
static int has_executor(void)
{
    static char buf[1 << 16];
    const char *path = getenv("MSCX_DEBUG_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    if (!strstr(buf, "usable here") || strstr(buf, "no executor")) {
        FAIL("the shim set up no executor (log %s):\n%s", path ? path : "(MSCX_DEBUG_FILE unset)", buf);
        return 0;
    }
    return 1;
}

struct abort_call {
    const struct api *a;
    ncclComm_t comm;
    long long ns;
    volatile int done;
};

static void *abort_thread(void *arg)
{
    struct abort_call *ac = arg;
    long long t0 = now_ns();
    ac->a->abort(ac->comm);
    ac->ns = now_ns() - t0;
    __atomic_store_n(&ac->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* (a) the foreign kernel ends only at the real abort's flag. */
static void run_spin(const struct api *shim, void *real)
{
    void (*set_flag)(volatile int *) = (void (*)(volatile int *))dlsym(real, "mscxFakeGpuSetFlag");
    long long (*fake_ns)(void) = (long long (*)(void))dlsym(real, "mscxFakeGpuLastAbortNs");
    volatile int *flag, *flag_dev;
    cudaStream_t s;
    if (!set_flag || !fake_ns) {
        FAIL("MSCX_NCCL_LIB is not the fake GPU NCCL");
        return;
    }
    ncclComm_t comm = one_rank(shim);
    float *buf;
    if (!comm || cudaMalloc((void **)&buf, 4096) != cudaSuccess ||
        shim->allreduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        FAIL("init or the first allreduce through the shim failed");
        return;
    }
    if (!has_executor())
        return;
    cudaHostAlloc((void **)&flag, sizeof(int), cudaHostAllocMapped);
    *flag = 0;
    cudaHostGetDevicePointer((void **)&flag_dev, (void *)flag, 0);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    set_flag(flag);
    abort_test_spin_until(flag_dev, s);
    usleep(100000);
    struct abort_call ac = {shim, comm, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, abort_thread, &ac);
    for (int ms = 0; ms < 10000 && !__atomic_load_n(&ac.done, __ATOMIC_ACQUIRE); ms++)
        usleep(1000);
    if (!__atomic_load_n(&ac.done, __ATOMIC_ACQUIRE)) {
        FAIL("ncclCommAbort through the shim waited 10 s for a kernel only the real abort ends");
        *flag = 1; /* release it, so the test ends */
    }
    pthread_join(t, NULL);
    printf("spin: shim abort %.3f s, the fake's own %.3f s\n", ac.ns / 1e9, fake_ns() / 1e9);
    if (ac.ns > fake_ns() + 1000000000LL)
        FAIL("the shim's abort took more than 1 s longer than the real one");
    cudaStreamSynchronize(s);
}

/* One abort with a 2 s foreign kernel on another stream: @return its time. */
static long long timed_abort(const struct api *a, const char *who)
{
    cudaStream_t s;
    ncclComm_t comm = one_rank(a);
    if (!comm) {
        FAIL("%s: ncclCommInitRank failed", who);
        return 0;
    }
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    abort_test_spin_for(2000000000ull, s);
    usleep(100000);
    long long t0 = now_ns();
    a->abort(comm);
    long long ns = now_ns() - t0;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return ns;
}

/* (b) the shim's abort takes no longer than the real library's own. */
static void run_timed(const struct api *shim, const struct api *real)
{
    long long theirs = timed_abort(real, "real NCCL");
    long long ours = timed_abort(shim, "shim");
    printf("timed: the real library's abort %.3f s, through the shim %.3f s\n", theirs / 1e9, ours / 1e9);
    if (ours > theirs + 500000000LL)
        FAIL("the shim's abort took %.3f s, the real library's own %.3f s", ours / 1e9, theirs / 1e9);
    has_executor();
}

/* (c) rank 0 of two: revoke during our spinning allreduce. */
static int revoke_rank0(const struct api *shim, int to_peer)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    cudaStream_t s;
    float *buf;
    memset(&id, 0, sizeof(id));
    if (shim->init(&comm, 2, id, 0) != ncclSuccess || !comm || !shim->revoke) {
        FAIL("rank 0: init failed or no ncclCommRevoke");
        return 1;
    }
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&buf, 4096);
    if (shim->allreduce(buf, buf, 256, ncclFloat32, ncclSum, comm, s) != ncclSuccess)
        FAIL("rank 0: the allreduce failed to launch");
    usleep(300000);
    if (cudaStreamQuery(s) != cudaErrorNotReady)
        FAIL("rank 0: the allreduce did not spin (not routed to mscx?): the test proves nothing");
    long long t0 = now_ns();
    ncclResult_t r = shim->revoke(comm, 0);
    long long ns = now_ns() - t0;
    printf("revoke: %.3f s (result %d)\n", ns / 1e9, (int)r);
    if (r != ncclSuccess || ns > 1000000000LL)
        FAIL("rank 0: ncclCommRevoke returned %d after %.3f s", (int)r, ns / 1e9);
    int ended = 0;
    for (int ms = 0; ms < 5000 && !ended; ms++) {
        ended = cudaStreamQuery(s) != cudaErrorNotReady;
        usleep(1000);
    }
    if (!ended)
        FAIL("rank 0: our kernel still spins 5 s after the revoke");
    r = shim->allreduce(buf, buf, 256, ncclFloat32, ncclSum, comm, s);
    if (r == ncclSuccess)
        FAIL("rank 0: an allreduce after the revoke succeeded; NCCL refuses it");
    ssize_t w = write(to_peer, "x", 1);
    (void)w;
    shim->destroy(comm);
    return failures != 0;
}

static int revoke_rank1(const struct api *shim, int from_peer)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    char c;
    memset(&id, 0, sizeof(id));
    if (shim->init(&comm, 2, id, 1) != ncclSuccess || !comm)
        return 1;
    ssize_t r = read(from_peer, &c, 1); /* never joins the allreduce */
    (void)r;
    shim->abort(comm);
    return 0;
}

static int run_revoke(const char *shim_path)
{
    int p[2];
    if (pipe(p) != 0)
        return 1;
    char world[] = "/tmp/mscx-abort-world-XXXXXX";
    if (!mkdtemp(world))
        return 1;
    setenv("FAKE_GPU_NCCL_WORLD", world, 1); /* the fake's exchange directory, fresh */
    pid_t pid = fork();                      /* before any CUDA call in this process */
    void *h = dlopen(shim_path, RTLD_NOW | RTLD_LOCAL);
    struct api shim;
    if (!h || api_load(h, &shim) != 0) {
        fprintf(stderr, "cannot open the shim %s: %s\n", shim_path, dlerror());
        if (pid == 0)
            _exit(1);
        return 1;
    }
    if (pid == 0) {
        close(p[1]); /* rank 0's end: its exit, early or not, ends rank 1's wait */
        _exit(revoke_rank1(&shim, p[0]));
    }
    close(p[0]);
    int rc = revoke_rank0(&shim, p[1]);
    close(p[1]);
    rc |= !has_executor();
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("rank 1 ended with status %d", status);
    return rc || failures;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SHIM spin|timed|revoke\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2], *real_path = getenv("MSCX_NCCL_LIB");
    if (!strcmp(mode, "revoke")) {
        if (!gpu_present()) {
            printf("no GPU: skipped\n");
            return 77;
        }
        void *sh = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        int have = sh && dlsym(sh, "ncclCommRevoke");
        if (sh)
            dlclose(sh);
        if (!have) {
            printf("the shim has no ncclCommRevoke (built against an NCCL without it): skipped\n");
            return 77;
        }
        int rc = run_revoke(argv[1]);
        printf("%s\n", rc ? "failed" : "ok");
        return rc ? 1 : 0;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    void *real = real_path ? dlopen(real_path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    if (!real) {
        printf("MSCX_NCCL_LIB %s cannot be opened: skipped\n", real_path ? real_path : "(unset)");
        return 77;
    }
    void *sh = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    struct api shim, direct;
    if (!sh || api_load(sh, &shim) != 0 || api_load(real, &direct) != 0) {
        fprintf(stderr, "cannot open the shim or the real library: %s\n", dlerror());
        return 1;
    }
    if (!strcmp(mode, "spin"))
        run_spin(&shim, real);
    else if (!strcmp(mode, "timed"))
        run_timed(&shim, &direct);
    else
        return 2;
    printf("%s\n", failures ? "failed" : "ok");
    return failures ? 1 : 0;
}
