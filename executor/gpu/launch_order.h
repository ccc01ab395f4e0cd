/* SPDX-License-Identifier: MIT */
/*
 * The order of one executor's launches across streams. NCCL runs every
 * launch of a communicator after the previous one, whatever its stream; our
 * kernels share one flag and scratch per plan context (and the staging
 * buffer), so two of them running at once would mix their packets. This is
 * the bookkeeping, plain C so that it is tested on the host
 * (tests/unit/test_launch_order.c); runtime/order.c carries the steps out
 * with two CUDA events: `done` (eager records, and one record node per
 * captured graph) and `join` (recorded inside a capture only).
 *
 * A launch on the stream of the previous one, both eager, costs one pointer
 * compare (mscx_order.last). A switch to another stream records `done` on
 * the previous stream then and makes the new one wait for it. Once a launch
 * of the executor was captured, every launch takes the slow path: eager
 * ones wait for `done` and record it after themselves, and a graph waits for
 * `done` when it is replayed (an external wait node before its first
 * launch) and records it once all its launches are done (one record node
 * that every captured launch of it precedes), as NCCL orders graphs against
 * eager launches.
 */
#ifndef MSCX_LAUNCH_ORDER_H
#define MSCX_LAUNCH_ORDER_H

#include <stdint.h>

/* mscx_order.last when the next launch must take the slow path whatever its stream */
#define MSCX_ORDER_QUERY ((void *)~(uintptr_t)0)

enum mscx_order_steps {
    MSCX_ORDER_MARK_PREV = 1u << 0,     /* record `done` on `from` (the previous launch's stream), now */
    MSCX_ORDER_WAIT = 1u << 1,          /* the launch's stream waits for `done` */
    MSCX_ORDER_WAIT_EXTERNAL = 1u << 2, /* ... as an external wait node of the capture (at each replay) */
    MSCX_ORDER_JOIN = 1u << 3,          /* record `join` on `from` (same capture), the stream waits for it */
    MSCX_ORDER_MARK_AFTER = 1u << 4,    /* after the launch: record `done` on its stream */
    MSCX_ORDER_SINK_NEW = 1u << 5,      /* after the launch: the capture's record node of `done`, after it */
    MSCX_ORDER_SINK_AFTER = 1u << 6,    /* after the launch: that record node also waits for this launch */
};
#define MSCX_ORDER_AFTER (MSCX_ORDER_MARK_AFTER | MSCX_ORDER_SINK_NEW | MSCX_ORDER_SINK_AFTER)

struct mscx_order {
    void *last;                /* the previous launch's stream; MSCX_ORDER_QUERY: none or not to be trusted */
    void *cap_last;            /* the stream of the latest launch captured in cap_id */
    unsigned long long cap_id; /* the capture of the latest captured launch, 0: none yet */
    int mixed;                 /* a launch was captured: eager launches mark `done` */
    int started;               /* a launch was made */
};

struct mscx_order_step {
    unsigned steps;
    void *from; /* the stream MSCX_ORDER_MARK_PREV or MSCX_ORDER_JOIN records on */
};

static inline void mscx_order_init(struct mscx_order *o)
{
    o->last = MSCX_ORDER_QUERY;
    o->cap_last = MSCX_ORDER_QUERY;
    o->cap_id = 0;
    o->mixed = 0;
    o->started = 0;
}

/*
 * The steps of a launch on @p stream, captured in capture @p cap (0: not
 * captured), and the state after it. Called when @p stream differs from
 * o->last (the caller's fast path skips it otherwise: no step).
 */
static inline struct mscx_order_step mscx_order_next(struct mscx_order *o, void *stream,
                                                     unsigned long long cap)
{
    struct mscx_order_step st = {0, NULL};
    if (cap != 0 && cap == o->cap_id) { /* a later launch of the same capture, maybe another branch */
        if (stream != o->cap_last) {
            st.steps |= MSCX_ORDER_JOIN;
            st.from = o->cap_last;
        }
        st.steps |= MSCX_ORDER_SINK_AFTER;
    } else if (cap != 0) { /* the first launch of a capture: its replays wait for the latest launch */
        if (o->started && !o->mixed) {
            st.steps |= MSCX_ORDER_MARK_PREV;
            st.from = o->last;
        }
        st.steps |= MSCX_ORDER_WAIT_EXTERNAL | MSCX_ORDER_SINK_NEW;
        o->cap_id = cap;
    } else if (o->mixed) {
        st.steps = MSCX_ORDER_WAIT | MSCX_ORDER_MARK_AFTER;
    } else if (o->started && stream != o->last) {
        st.steps = MSCX_ORDER_MARK_PREV | MSCX_ORDER_WAIT;
        st.from = o->last;
    }
    if (cap != 0) {
        o->cap_last = stream;
        o->mixed = 1;
    }
    o->started = 1;
    o->last = o->mixed ? MSCX_ORDER_QUERY : stream;
    return st;
}

#endif /* MSCX_LAUNCH_ORDER_H */
