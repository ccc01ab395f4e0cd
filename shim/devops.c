/* SPDX-License-Identifier: MIT */
/*
 * The device operations of the shim: a bootstrap's buffers, streams and
 * device scope (boot.c), the events that join the streams of a group
 * (group.c), the capture query of a send/recv group (p2p.c), and the setup
 * faults of the test suite.
 *
 * Three implementations: CUDA (built where MSCX_SHIM_CUDA is defined), none
 * (every operation fails: no device, no event, no capture), and, in the test
 * build of the shim alone (MSCX_SHIM_TEST_DOUBLES), the doubles that the
 * test suite's fake NCCL exports. The table is chosen once, part by part: in
 * the test build a part comes from the fake where the real library exports
 * it (mscxFakeNcclHostMemory answering 1: host memory for the bootstrap;
 * mscxFakeCudaEvent*: the events; mscxFakeCudaStreamIsCapturing: the
 * capture query; mscxFakeNcclSetupFault: the faults), else from CUDA, else
 * from none. The product library looks up no such symbol and has no setup
 * faults.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim_int.h"

#ifdef MSCX_SHIM_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- none: no device ---- */

static int none_have_device(void)
{
    return 0;
}

static int none_alloc(void **p, size_t n)
{
    (void)n;
    *p = NULL;
    return 0;
}

static void none_free(void *p)
{
    (void)p;
}

static int none_alloc_ordered(void **p, size_t n, cudaStream_t stream, int device)
{
    (void)stream, (void)device;
    return none_alloc(p, n);
}

static void none_free_ordered(void *p, cudaStream_t stream, int device)
{
    (void)p, (void)stream, (void)device;
}

static int none_copy(void *dst, const void *src, size_t n, cudaStream_t stream)
{
    (void)dst, (void)src, (void)n, (void)stream;
    return 0;
}

static int none_stream_fails(cudaStream_t stream)
{
    (void)stream;
    return 0;
}

static cudaStream_t none_stream_create(void)
{
    return NULL;
}

static void none_stream_destroy(cudaStream_t stream)
{
    (void)stream;
}

static int none_stream_idle(cudaStream_t stream)
{
    (void)stream;
    return 1;
}

static int none_enter(int device, struct shim_dev_scope *sc)
{
    (void)device;
    sc->prev_dev = -1;
    sc->mode_set = 0;
    return 0;
}

static void none_leave(const struct shim_dev_scope *sc)
{
    (void)sc;
}

static void none_use_device(int device)
{
    (void)device;
}

static int none_event_create(int device, void **ev_p)
{
    (void)device, (void)ev_p;
    return -1;
}

static void none_event_destroy(void *ev)
{
    (void)ev;
}

static int none_event_record(void *ev, void *stream)
{
    (void)ev, (void)stream;
    return -1;
}

static int none_stream_wait(void *stream, void *ev)
{
    (void)stream, (void)ev;
    return -1;
}

static int none_fault(const char *point)
{
    (void)point;
    return 0;
}

static const struct shim_dev_ops none_ops = {
    .setup =
        {
            .host = 0,
            .have_device = none_have_device,
            .alloc = none_alloc,
            .free = none_free,
            .alloc_ordered = none_alloc_ordered,
            .free_ordered = none_free_ordered,
            .alloc_pinned = none_alloc,
            .free_pinned = none_free,
            .put = none_copy,
            .get = none_copy,
            .sync = none_stream_fails,
            .stream_create = none_stream_create,
            .stream_destroy = none_stream_destroy,
            .stream_idle = none_stream_idle,
            .enter = none_enter,
            .leave = none_leave,
            .use_device = none_use_device,
        },
    .join =
        {
            .event_create = none_event_create,
            .event_destroy = none_event_destroy,
            .event_record = none_event_record,
            .stream_wait = none_stream_wait,
            .get_device = NULL,
            .set_device = NULL,
        },
    .capturing = none_stream_fails,
    .fault = none_fault,
    .error_text = NULL,
};

/* ---- CUDA ---- */

#ifdef MSCX_SHIM_CUDA
/* 1 when this process has a CUDA device. */
static int cuda_have_device(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0)
        return 1;
    cudaGetLastError(); /* clear the sticky "no device" */
    return 0;
}

static int cuda_alloc(void **p, size_t n)
{
    if (cudaMalloc(p, n) == cudaSuccess)
        return 1;
    cudaGetLastError();
    *p = NULL;
    return 0;
}

static void cuda_free(void *p)
{
    cudaFree(p);
}

/* Whether @p device has memory pools, for buffers ordered on @p stream (none on the legacy stream). */
static int cuda_pooled(cudaStream_t stream, int device)
{
    int pools = 0;
    if (!stream)
        return 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess)
        return pools != 0;
    (void)cudaGetLastError();
    return 0;
}

static int cuda_alloc_ordered(void **p, size_t n, cudaStream_t stream, int device)
{
    if (!cuda_pooled(stream, device))
        return cuda_alloc(p, n);
    if (cudaMallocAsync(p, n, stream) == cudaSuccess)
        return 1;
    (void)cudaGetLastError();
    *p = NULL;
    return 0;
}

static void cuda_free_ordered(void *p, cudaStream_t stream, int device)
{
    if (!cuda_pooled(stream, device)) {
        cuda_free(p);
        return;
    }
    if (cudaFreeAsync(p, stream) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_alloc_pinned(void **p, size_t n)
{
    if (cudaMallocHost(p, n) == cudaSuccess)
        return 1;
    (void)cudaGetLastError();
    *p = NULL;
    return 0;
}

static void cuda_free_pinned(void *p)
{
    cudaFreeHost(p);
}

static int cuda_put(void *dst, const void *src, size_t n, cudaStream_t stream)
{
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream) == cudaSuccess;
}

static int cuda_get(void *dst, const void *src, size_t n, cudaStream_t stream)
{
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess;
}

static int cuda_sync(cudaStream_t stream)
{
    return cudaStreamSynchronize(stream) == cudaSuccess;
}

static cudaStream_t cuda_stream_create(void)
{
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess)
        return stream;
    cudaGetLastError();
    return NULL;
}

static void cuda_stream_destroy(cudaStream_t stream)
{
    cudaStreamDestroy(stream);
}

static int cuda_stream_idle(cudaStream_t stream)
{
    cudaError_t rc = cudaStreamQuery(stream);
    if (rc != cudaSuccess && rc != cudaErrorNotReady)
        (void)cudaGetLastError();
    return rc == cudaSuccess;
}

static int cuda_enter(int device, struct shim_dev_scope *sc)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    sc->prev_dev = -1;
    sc->mode_set = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    sc->mode = (int)mode;
    return cudaGetDevice(&sc->prev_dev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
}

static void cuda_leave(const struct shim_dev_scope *sc)
{
    if (sc->prev_dev >= 0)
        cudaSetDevice(sc->prev_dev);
    if (sc->mode_set) {
        enum cudaStreamCaptureMode m = (enum cudaStreamCaptureMode)sc->mode;
        cudaThreadExchangeStreamCaptureMode(&m);
    }
}

static void cuda_set_device(int device)
{
    if (device >= 0 && cudaSetDevice(device) != cudaSuccess)
        cudaGetLastError();
}

static int cuda_get_device(void)
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return dev;
}

static int cuda_event_create(int device, void **ev_p)
{
    int prev = -1;
    cudaEvent_t ev;
    if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *ev_p = ev;
    return 0;
}

static void cuda_event_destroy(void *ev)
{
    cudaEventDestroy((cudaEvent_t)ev);
}

static int cuda_event_record(void *ev, void *stream)
{
    return cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream) == cudaSuccess ? 0 : -1;
}

static int cuda_stream_wait(void *stream, void *ev)
{
    return cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0) == cudaSuccess ? 0 : -1;
}

static int cuda_capturing(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return st == cudaStreamCaptureStatusActive;
}

static const char *cuda_error_text(void)
{
    return cudaGetErrorString(cudaGetLastError());
}

static const struct shim_dev_ops cuda_ops = {
    .setup =
        {
            .host = 0,
            .have_device = cuda_have_device,
            .alloc = cuda_alloc,
            .free = cuda_free,
            .alloc_ordered = cuda_alloc_ordered,
            .free_ordered = cuda_free_ordered,
            .alloc_pinned = cuda_alloc_pinned,
            .free_pinned = cuda_free_pinned,
            .put = cuda_put,
            .get = cuda_get,
            .sync = cuda_sync,
            .stream_create = cuda_stream_create,
            .stream_destroy = cuda_stream_destroy,
            .stream_idle = cuda_stream_idle,
            .enter = cuda_enter,
            .leave = cuda_leave,
            .use_device = cuda_set_device,
        },
    .join =
        {
            .event_create = cuda_event_create,
            .event_destroy = cuda_event_destroy,
            .event_record = cuda_event_record,
            .stream_wait = cuda_stream_wait,
            .get_device = cuda_get_device,
            .set_device = cuda_set_device,
        },
    .capturing = cuda_capturing,
    .fault = none_fault,
    .error_text = cuda_error_text,
};
static const struct shim_dev_ops *const runtime_ops = &cuda_ops;
#else
static const struct shim_dev_ops *const runtime_ops = NULL; /* built without CUDA */
#endif

#ifdef MSCX_SHIM_TEST_DOUBLES
/* ---- the fake NCCL: host memory, and the doubles it exports ---- */

static int host_have_device(void)
{
    return 1; /* host memory stands in for the device */
}

static int host_alloc(void **p, size_t n)
{
    return (*p = malloc(n)) != NULL;
}

static int host_alloc_ordered(void **p, size_t n, cudaStream_t stream, int device)
{
    (void)stream, (void)device;
    return host_alloc(p, n);
}

static void host_free_ordered(void *p, cudaStream_t stream, int device)
{
    (void)stream, (void)device;
    free(p);
}

static int host_copy(void *dst, const void *src, size_t n, cudaStream_t stream)
{
    (void)stream;
    memcpy(dst, src, n);
    return 1;
}

static int host_sync(cudaStream_t stream)
{
    (void)stream;
    return 1;
}

static int host_enter(int device, struct shim_dev_scope *sc)
{
    none_enter(device, sc);
    return 1;
}

/* A bootstrap's buffers in host memory, which the fake NCCL moves between its ranks; no stream, no device. */
static const struct shim_dev_setup_ops host_setup = {
    .host = 1,
    .have_device = host_have_device,
    .alloc = host_alloc,
    .free = free,
    .alloc_ordered = host_alloc_ordered,
    .free_ordered = host_free_ordered,
    .alloc_pinned = none_alloc,
    .free_pinned = free,
    .put = host_copy,
    .get = host_copy,
    .sync = host_sync,
    .stream_create = none_stream_create,
    .stream_destroy = none_stream_destroy,
    .stream_idle = none_stream_idle,
    .enter = host_enter,
    .leave = none_leave,
    .use_device = none_use_device,
};

static int (*fake_is_capturing)(void *stream, int *capturing);

static int fake_capturing(cudaStream_t stream)
{
    int on = 0;
    return fake_is_capturing((void *)stream, &on) == 0 && on;
}

/*
 * Symbol @p name of the fake NCCL: in the global scope, else in the real
 * library loaded by us, RTLD_LOCAL (the shim opened by path, as ctypes does).
 */
static void *fake_sym(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    return p ? p : shim_real_sym(name);
}

/* The fake's events, which record what a join does: all four, else none. @return 1 when found */
static int fake_join(struct shim_dev_join_ops *j)
{
    j->event_create = (int (*)(int, void **))shim_real_sym("mscxFakeCudaEventCreate");
    j->event_destroy = (void (*)(void *))shim_real_sym("mscxFakeCudaEventDestroy");
    j->event_record = (int (*)(void *, void *))shim_real_sym("mscxFakeCudaEventRecord");
    j->stream_wait = (int (*)(void *, void *))shim_real_sym("mscxFakeCudaStreamWaitEvent");
    j->get_device = NULL; /* no devices to switch */
    j->set_device = NULL;
    return j->event_create && j->event_destroy && j->event_record && j->stream_wait;
}

/* The fake's doubles in place of the parts of @p ops that the fake NCCL exports. */
static void choose_fake(struct shim_dev_ops *ops)
{
    int (*host_memory)(void) = (int (*)(void))fake_sym("mscxFakeNcclHostMemory");
    if (host_memory && host_memory())
        ops->setup = host_setup;
    struct shim_dev_join_ops j;
    if (fake_join(&j))
        ops->join = j;
    fake_is_capturing = (int (*)(void *, int *))shim_real_sym("mscxFakeCudaStreamIsCapturing");
    if (fake_is_capturing)
        ops->capturing = fake_capturing;
    int (*fault)(const char *) = (int (*)(const char *))fake_sym("mscxFakeNcclSetupFault");
    if (fault)
        ops->fault = fault;
}
#endif /* MSCX_SHIM_TEST_DOUBLES */

/* ---- the choice ---- */

static struct shim_dev_ops chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    chosen = runtime_ops ? *runtime_ops : none_ops;
#ifdef MSCX_SHIM_TEST_DOUBLES
    choose_fake(&chosen);
#endif
}

const struct shim_dev_ops *shim_dev_ops(void)
{
    pthread_once(&chosen_once, choose);
    return &chosen;
}

int shim_boot_fault(const char *point)
{
#ifdef MSCX_SHIM_TEST_DOUBLES
    return shim_dev_ops()->fault(point);
#else
    (void)point;
    return 0; /* the product has no setup faults */
#endif
}
