/* SPDX-License-Identifier: MIT */
/*
 * The fake libnccl's CUDA events, which the shim uses to join the streams
 * of a group when the real library exports them (shim/group.c). Every call
 * is a line of FAKE_NCCL_LOG: "cudaEventCreate ev<N> <device>",
 * "cudaEventRecord ev<N> <stream>", "cudaStreamWaitEvent <stream> ev<N>",
 * "cudaEventDestroy ev<N>", N numbering the events in the order they were
 * made. With FAKE_CUDA_EVENT_FAIL=1 no event can be made.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fake_nccl.h"

#define FAKE_MAX_EVENTS 64

struct fake_event {
    int index;
    int device;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_event events[FAKE_MAX_EVENTS];
static int nevents;

static void record_fmt(const char *what, const void *a, const struct fake_event *ev, int ev_first)
{
    char line[128];
    if (ev_first)
        snprintf(line, sizeof(line), "%s ev%d %p", what, ev->index, a);
    else
        snprintf(line, sizeof(line), "%s %p ev%d", what, a, ev->index);
    fake_record(line);
}

FAKE_EXPORT int mscxFakeCudaEventCreate(int device, void **ev_p)
{
    const char *fail = getenv("FAKE_CUDA_EVENT_FAIL"); /* the fake's own setting */
    if (fail && *fail == '1')
        return -1;
    pthread_mutex_lock(&mu);
    struct fake_event *ev = nevents < FAKE_MAX_EVENTS ? &events[nevents] : NULL;
    if (ev) {
        ev->index = nevents++;
        ev->device = device;
    }
    pthread_mutex_unlock(&mu);
    if (!ev)
        return -1;
    char line[64];
    snprintf(line, sizeof(line), "cudaEventCreate ev%d %d", ev->index, device);
    fake_record(line);
    *ev_p = ev;
    return 0;
}

FAKE_EXPORT void mscxFakeCudaEventDestroy(void *ev)
{
    char line[64];
    snprintf(line, sizeof(line), "cudaEventDestroy ev%d", ((struct fake_event *)ev)->index);
    fake_record(line);
}

FAKE_EXPORT int mscxFakeCudaEventRecord(void *ev, void *stream)
{
    record_fmt("cudaEventRecord", stream, ev, 1);
    return 0;
}

FAKE_EXPORT int mscxFakeCudaStreamWaitEvent(void *stream, void *ev)
{
    record_fmt("cudaStreamWaitEvent", stream, ev, 0);
    return 0;
}

/*
 * Stream capture as the shim asks for it before a send/recv group becomes
 * an AlltoAll: FAKE_CUDA_CAPTURING is a comma list of the streams (hex
 * addresses, 0x...) being captured; no line is recorded.
 */
FAKE_EXPORT int mscxFakeCudaStreamIsCapturing(void *stream, int *capturing)
{
    const char *list = getenv("FAKE_CUDA_CAPTURING"); /* the fake's own setting */
    *capturing = 0;
    for (const char *p = list; p && *p;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 16);
        if (end == p)
            return -1;
        if ((uintptr_t)v == (uintptr_t)stream)
            *capturing = 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return 0;
}
