/* SPDX-License-Identifier: MIT */
/*
 * The bookkeeping of launch_order.h: the steps that keep one executor's
 * launches in the order they were made across streams. A model of streams
 * and one event checks, over random eager sequences on four streams, that
 * every launch comes after the previous one and that a launch on the
 * previous launch's stream takes no step; scenarios check the steps around
 * captured graphs (two branches of one capture, eager launches before and
 * after, two captures).
 */
#include <stdint.h>
#include <stdlib.h>

#include "launch_order.h"
#include "test_common.h"

#define NSTREAMS 4

static void *stream_of(int i)
{
    return (void *)(uintptr_t)(0x1000 + 0x100 * i);
}

static int index_of(void *s)
{
    return (int)(((uintptr_t)s - 0x1000) / 0x100);
}

/*
 * Eager launches: pos[s] is the latest launch that stream s's next work
 * follows, done the one the event holds. A launch must follow the previous
 * one. The caller's fast path (same stream as o.last) takes no step.
 */
static void run_eager(struct mscx_order *o, const int *seq, int n, int *slow_p)
{
    int pos[NSTREAMS] = {0}, done = 0, slow = 0;
    for (int k = 1; k <= n; k++) {
        int s = seq[k - 1];
        unsigned steps = 0;
        if (stream_of(s) != o->last) {
            struct mscx_order_step st = mscx_order_next(o, stream_of(s), 0);
            steps = st.steps;
            slow++;
            ck_assert_uint_eq(steps & (MSCX_ORDER_JOIN | MSCX_ORDER_WAIT_EXTERNAL | MSCX_ORDER_SINK_NEW |
                                       MSCX_ORDER_SINK_AFTER),
                              0);
            if (steps & MSCX_ORDER_MARK_PREV)
                done = pos[index_of(st.from)];
            if (steps & MSCX_ORDER_WAIT)
                pos[s] = pos[s] > done ? pos[s] : done;
        }
        ck_assert_msg(pos[s] == k - 1, "launch %d on stream %d follows launch %d only", k, s, pos[s]);
        pos[s] = k;
        if (steps & MSCX_ORDER_MARK_AFTER)
            done = k;
    }
    *slow_p = slow;
}

START_TEST(test_eager_random)
{
    srand(7);
    for (int round = 0; round < 200; round++) {
        int seq[64], changes = 0, slow;
        struct mscx_order o;
        mscx_order_init(&o);
        for (int i = 0; i < 64; i++) {
            seq[i] = rand() % 3 == 0 ? rand() % NSTREAMS : (i ? seq[i - 1] : 0);
            changes += i == 0 || seq[i] != seq[i - 1];
        }
        run_eager(&o, seq, 64, &slow);
        ck_assert_int_eq(slow, changes); /* the first launch and each change of stream, nothing else */
    }
}
END_TEST

START_TEST(test_same_stream_free)
{
    struct mscx_order o;
    mscx_order_init(&o);
    struct mscx_order_step st = mscx_order_next(&o, stream_of(0), 0);
    ck_assert_uint_eq(st.steps, 0); /* nothing before the first launch */
    ck_assert_ptr_eq(o.last, stream_of(0));
    st = mscx_order_next(&o, stream_of(1), 0);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_MARK_PREV | MSCX_ORDER_WAIT);
    ck_assert_ptr_eq(st.from, stream_of(0));
    ck_assert_ptr_eq(o.last, stream_of(1)); /* the next launch on stream 1 is one compare */
}
END_TEST

/* Eager launches, then one capture with two branches, then eager launches again. */
START_TEST(test_capture_two_branches)
{
    struct mscx_order o;
    mscx_order_init(&o);
    void *e = stream_of(0), *b1 = stream_of(1), *b2 = stream_of(2);
    mscx_order_next(&o, e, 0);
    /* first captured launch: the eager one marked now, the graph waits for `done` at each replay */
    struct mscx_order_step st = mscx_order_next(&o, b1, 42);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_MARK_PREV | MSCX_ORDER_WAIT_EXTERNAL | MSCX_ORDER_SINK_NEW);
    ck_assert_ptr_eq(st.from, e);
    ck_assert_ptr_eq(o.last, MSCX_ORDER_QUERY); /* every launch now asks where it is */
    /* the other branch: joined inside the capture, and before the graph's record of `done` */
    st = mscx_order_next(&o, b2, 42);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_JOIN | MSCX_ORDER_SINK_AFTER);
    ck_assert_ptr_eq(st.from, b1);
    /* the same branch again: no join */
    st = mscx_order_next(&o, b2, 42);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_SINK_AFTER);
    st = mscx_order_next(&o, b1, 42);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_JOIN | MSCX_ORDER_SINK_AFTER);
    ck_assert_ptr_eq(st.from, b2);
    /* eager again, on any stream, the previous one included: wait for `done`, mark it after */
    for (int i = 0; i < 3; i++) {
        st = mscx_order_next(&o, e, 0);
        ck_assert_uint_eq(st.steps, MSCX_ORDER_WAIT | MSCX_ORDER_MARK_AFTER);
    }
    st = mscx_order_next(&o, b1, 0);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_WAIT | MSCX_ORDER_MARK_AFTER);
}
END_TEST

/* An eager launch in the middle of a capture does not cut the capture's chain; a second capture starts anew.
 */
START_TEST(test_capture_interleaved)
{
    struct mscx_order o;
    mscx_order_init(&o);
    void *b1 = stream_of(1), *b2 = stream_of(2), *e = stream_of(3);
    /* a capture as the first launch: nothing to mark, the replays still wait */
    struct mscx_order_step st = mscx_order_next(&o, b1, 7);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_WAIT_EXTERNAL | MSCX_ORDER_SINK_NEW);
    st = mscx_order_next(&o, e, 0);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_WAIT | MSCX_ORDER_MARK_AFTER);
    st = mscx_order_next(&o, b2, 7);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_JOIN | MSCX_ORDER_SINK_AFTER);
    ck_assert_ptr_eq(st.from, b1);
    /* another capture: `done` already marked by every eager launch, so no mark; a new record node */
    st = mscx_order_next(&o, b1, 8);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_WAIT_EXTERNAL | MSCX_ORDER_SINK_NEW);
    st = mscx_order_next(&o, b1, 8);
    ck_assert_uint_eq(st.steps, MSCX_ORDER_SINK_AFTER);
}
END_TEST

/* After a capture, eager launches on random streams still follow each other (through `done`). */
START_TEST(test_mixed_eager_random)
{
    srand(11);
    for (int round = 0; round < 50; round++) {
        struct mscx_order o;
        int seq[64], slow;
        mscx_order_init(&o);
        mscx_order_next(&o, stream_of(0), 5);
        for (int i = 0; i < 64; i++)
            seq[i] = rand() % NSTREAMS;
        run_eager(&o, seq, 64, &slow);
        ck_assert_int_eq(slow, 64); /* after a capture every launch takes the slow path */
    }
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("launch-order");
    TCase *tc = mscx_tcase("order");
    tcase_add_test(tc, test_eager_random);
    tcase_add_test(tc, test_same_stream_free);
    tcase_add_test(tc, test_capture_two_branches);
    tcase_add_test(tc, test_capture_interleaved);
    tcase_add_test(tc, test_mixed_eager_random);
    suite_add_tcase(s, tc);
    return s;
}
