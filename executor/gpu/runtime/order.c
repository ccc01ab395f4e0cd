/* SPDX-License-Identifier: MIT */
/*
 * The steps of launch_order.h with CUDA events: launches of one executor
 * run in the order they were made, whatever their streams, captured graphs
 * included.
 */
#include "mscx/log.h"
#include "runtime_int.h"

mscx_status_t mscx_gpu_order_open(struct mscx_exec *ex)
{
    mscx_order_init(&ex->ord);
    MSCX_CHECK(CU(cudaEventCreateWithFlags(&ex->ord_done, cudaEventDisableTiming)));
    return CU(cudaEventCreateWithFlags(&ex->ord_join, cudaEventDisableTiming));
}

void mscx_gpu_order_close(struct mscx_exec *ex)
{
    if (ex->ord_done)
        cudaEventDestroy(ex->ord_done);
    if (ex->ord_join)
        cudaEventDestroy(ex->ord_join);
}

/* The capture @p s is in (0: none). */
static mscx_status_t capture_of(cudaStream_t s, unsigned long long *id_p)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
#if CUDART_VERSION >= 13000
    cudaError_t rc = cudaStreamGetCaptureInfo(s, &cs, &id, NULL, NULL, NULL, NULL);
#else
    cudaError_t rc = cudaStreamGetCaptureInfo(s, &cs, &id, NULL, NULL, NULL);
#endif
    if (rc != cudaSuccess)
        return mscx_gpu_check(rc, "launch order: capture status");
    *id_p = cs == cudaStreamCaptureStatusActive ? id : 0;
    return MSCX_OK;
}

/*
 * Record @p ev on @p from when it is in capture @p cap (0: eager). A stream
 * that changed its capture since our launch on it (a capture begun on it)
 * is left alone: recording there would tie the event to that capture.
 */
static mscx_status_t mark(cudaEvent_t ev, cudaStream_t from, unsigned long long cap, int *marked_p)
{
    unsigned long long now;
    *marked_p = 0;
    MSCX_CHECK(capture_of(from, &now));
    if (now != cap)
        return MSCX_OK;
    *marked_p = 1;
    return CU(cudaEventRecord(ev, from));
}

mscx_status_t mscx_gpu_order_enter(struct mscx_exec *ex, cudaStream_t s, unsigned *steps_p)
{
    unsigned long long cap, cap_before = ex->ord.cap_id;
    MSCX_CHECK(capture_of(s, &cap));
    struct mscx_order_step st = mscx_order_next(&ex->ord, (void *)s, cap);
    int marked;
    *steps_p = st.steps;
    if (st.steps & MSCX_ORDER_MARK_PREV)
        MSCX_CHECK(mark(ex->ord_done, (cudaStream_t)st.from, 0, &marked));
    if (st.steps & MSCX_ORDER_WAIT)
        MSCX_CHECK(CU(cudaStreamWaitEvent(s, ex->ord_done, 0)));
    if (st.steps & MSCX_ORDER_WAIT_EXTERNAL)
        MSCX_CHECK(CU(cudaStreamWaitEvent(s, ex->ord_done, cudaEventWaitExternal)));
    if (st.steps & MSCX_ORDER_JOIN) {
        MSCX_CHECK(mark(ex->ord_join, (cudaStream_t)st.from, cap_before, &marked));
        if (marked)
            MSCX_CHECK(CU(cudaStreamWaitEvent(s, ex->ord_join, 0)));
    }
    return MSCX_OK;
}

/*
 * The capture's record node of `done`: made after the first launch of the
 * capture with that launch's last nodes as its dependencies, and given
 * those of every later launch of the capture. It stays off the stream's
 * own sequence, so that the next kernel of the stream still follows ours
 * directly (programmatic launch).
 */
static mscx_status_t sink(struct mscx_exec *ex, cudaStream_t s, int fresh)
{
    enum cudaStreamCaptureStatus cs;
    cudaGraph_t g;
    const cudaGraphNode_t *deps = NULL;
    size_t n = 0;
#if CUDART_VERSION >= 13000
    cudaError_t rc = cudaStreamGetCaptureInfo(s, &cs, NULL, &g, &deps, NULL, &n);
#else
    cudaError_t rc = cudaStreamGetCaptureInfo(s, &cs, NULL, &g, &deps, &n);
#endif
    if (rc != cudaSuccess)
        return mscx_gpu_check(rc, "launch order: capture graph");
    if (fresh) {
        ex->ord_sink_dep = n == 1 ? deps[0] : NULL;
        return CU(cudaGraphAddEventRecordNode(&ex->ord_sink, g, deps, n, ex->ord_done));
    }
    if (n == 1 && deps[0] == ex->ord_sink_dep)
        return MSCX_OK; /* nothing enqueued since: the node already follows it */
    for (size_t i = 0; i < n; i++) {
#if CUDART_VERSION >= 13000
        rc = cudaGraphAddDependencies(g, &deps[i], &ex->ord_sink, NULL, 1);
#else
        rc = cudaGraphAddDependencies(g, &deps[i], &ex->ord_sink, 1);
#endif
        if (rc == cudaErrorInvalidValue && n > 1)
            (void)cudaGetLastError(); /* already a dependency (a launch that enqueued nothing) */
        else if (rc != cudaSuccess)
            return mscx_gpu_check(rc, "launch order: capture record node");
    }
    ex->ord_sink_dep = n == 1 ? deps[0] : NULL;
    return MSCX_OK;
}

mscx_status_t mscx_gpu_order_leave(struct mscx_exec *ex, cudaStream_t s, unsigned steps)
{
    if (steps & MSCX_ORDER_MARK_AFTER)
        return CU(cudaEventRecord(ex->ord_done, s));
    return sink(ex, s, (steps & MSCX_ORDER_SINK_NEW) != 0);
}
