/* SPDX-License-Identifier: MIT */
/*
 * Late-bound puts over the TCP transport, two endpoints of this process on
 * loopback: the receiver resolves each put's destination from what its
 * launch published, holds the put and the signal behind it until that
 * launch starts, and fails the connection when it never does.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "mscx/dev_types.h"
#include "proxy.h"
#include "test_common.h"
#include "test_tcp_int.h"
#include "transport.h"

/*
 * Late-bound puts: the receiver (ep1) resolves (buffer, launch, offset) from
 * what its "kernel" published for that launch (mscx_late_pick over a
 * publication by flag parity, as the GPU runtime does from device memory).
 */
struct late_rx {
    struct mscx_late_pub pub[2]; /* by parity; flag written last (release) */
    _Atomic int calls;
};

static mscx_status_t late_test_resolve(void *ctx, uint32_t buf, uint32_t launch, uint64_t off, uint64_t len,
                                       void **dst_p, unsigned *mr_flags_p)
{
    struct late_rx *x = ctx;
    struct mscx_late_pub p;
    atomic_fetch_add(&x->calls, 1);
    p.flag = __atomic_load_n(&x->pub[launch & 1u].flag, __ATOMIC_ACQUIRE);
    memcpy(p.ptr, x->pub[launch & 1u].ptr, sizeof(p.ptr));
    memcpy(p.bytes, x->pub[launch & 1u].bytes, sizeof(p.bytes));
    *mr_flags_p = 0;
    return mscx_late_pick(&p, 1, "late-test", buf, launch, off, len, dst_p);
}

static void late_publish(struct late_rx *x, uint32_t flag, void *in, uint64_t in_bytes, void *out,
                         uint64_t out_bytes)
{
    struct mscx_late_pub *p = &x->pub[flag & 1u];
    p->ptr[0] = in;
    p->ptr[1] = out;
    p->bytes[0] = in_bytes;
    p->bytes[1] = out_bytes;
    __atomic_store_n(&p->flag, flag, __ATOMIC_RELEASE);
}

struct late_pair {
    struct mscx_tp_ep *ep0, *ep1;
    struct mscx_tp_conn *c0, *c1;
    struct mscx_tp_mr *src_mr, *sig_mr, *late_mr;
    struct mscx_tp_rdesc sig_d, late_d;
};

static void late_pair_setup(struct late_pair *lp, struct late_rx *x, uint8_t *src, size_t src_bytes,
                            uint64_t *sig, uint64_t timeout_ms)
{
    struct mscx_tp_params p0 = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_params p1 = {.rank = 1, .nranks = 2, .comm_id = COMM_ID, .late_timeout_ms = timeout_ms};
    struct mscx_tp_rdesc unused;
    uint8_t b0[MSCX_TP_BLOB_BYTES], b1[MSCX_TP_BLOB_BYTES];
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p0, &lp->ep0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.ep_create(&p1, &lp->ep1), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register(lp->ep0, src, src_bytes, 0, -1, &lp->src_mr, &unused), MSCX_OK);
    ck_assert_int_eq(
        mscx_tp_tcp.mr_register(lp->ep1, sig, 8, MSCX_TP_MR_REMOTE_WRITE, -1, &lp->sig_mr, &lp->sig_d),
        MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.mr_register_late(lp->ep1, late_test_resolve, x, &lp->late_mr, &lp->late_d),
                     MSCX_OK);
    ck_assert_uint_ne(lp->late_d.flags & MSCX_TP_MR_LATE, 0);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(lp->ep0, 1, b0, &lp->c0), MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.conn_prepare(lp->ep1, 0, b1, &lp->c1), MSCX_OK);
    struct est_arg e1 = {lp->c1, b0, MSCX_ERR_INTERNAL};
    pthread_t thr;
    ck_assert_int_eq(pthread_create(&thr, NULL, establish_thread, &e1), 0);
    mscx_status_t st0 = mscx_tp_tcp.conn_establish(lp->c0, b1, mscx_tp_deadline(5000));
    pthread_join(thr, NULL);
    ck_assert_int_eq(st0, MSCX_OK);
    ck_assert_int_eq(e1.st, MSCX_OK);
}

START_TEST(tcp_late_puts)
{
    /* below the loopback socket buffers: a stalled put's payload waits in the socket without blocking the
     * sender (a bigger one blocks the sender's send until the launch starts, bounded by its deadline) */
    static uint8_t src[192u << 10];
    static uint8_t out3[256u << 10], out5[256u << 10], in5[64];
    static uint64_t sig;
    struct late_rx x;
    struct late_pair lp;
    memset(&x, 0, sizeof(x));
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = pattern(i, 5);
    late_publish(&x, 3, in5, sizeof(in5), out3,
                 sizeof(out3)); /* the receiver's previous launch of the parity */
    late_pair_setup(&lp, &x, src, sizeof(src), &sig, 10000);

    /* launch 5 has not started at the receiver: the put and the signal behind it wait; nothing lands in
     * launch 3's buffer */
    uint64_t off = 1000, len = sizeof(src) - 4096;
    ck_assert_int_eq(mscx_tp_tcp.put_late(lp.c0, lp.src_mr, 0, &lp.late_d, MSCX_BUF_OUTPUT, 5, off, len, 0,
                                          mscx_tp_deadline(5000)),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.signal(lp.c0, &lp.sig_d, 0, mscx_tp_deadline(5000)), MSCX_OK);
    struct timespec nap = {0, 100000000};
    nanosleep(&nap, NULL);
    ck_assert_int_ge(atomic_load(&x.calls), 2); /* asked again while waiting */
    ck_assert_uint_eq(__atomic_load_n(&sig, __ATOMIC_ACQUIRE), 0);
    for (size_t i = 0; i < sizeof(out3); i++)
        ck_assert_uint_eq(out3[i], 0);
    ck_assert_msg(mscx_tp_tcp.progress(lp.ep1) == MSCX_OK, "the waiting connection failed: %s",
                  mscx_test_last_warn());

    late_publish(&x, 5, in5, sizeof(in5), out5, sizeof(out5));
    ck_assert_int_eq(wait_word(&sig, 1, 10000), 0);
    /* the signal came after the data: all of it is there */
    for (uint64_t i = 0; i < len; i++)
        if (out5[off + i] != src[i])
            ck_abort_msg("byte %llu of the late put differs", (unsigned long long)i);
    for (uint64_t i = 0; i < off; i++)
        ck_assert_uint_eq(out5[i], 0);
    for (size_t i = 0; i < sizeof(out3); i++)
        ck_assert_uint_eq(out3[i], 0);
    /* a second put of the same launch goes straight through; flush answers after it */
    ck_assert_int_eq(mscx_tp_tcp.put_late(lp.c0, lp.src_mr, 0, &lp.late_d, MSCX_BUF_INPUT, 5, 8, 56, 0,
                                          mscx_tp_deadline(5000)),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_tcp.flush(lp.c0, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(memcmp(in5 + 8, src, 56), 0);
    /* a plain put to the late region and a late put to a plain one are refused by the sender */
    mscx_test_allow_warn("caller bug");
    ck_assert_int_eq(mscx_tp_tcp.put(lp.c0, lp.src_mr, 0, &lp.late_d, 0, 8, 0, mscx_tp_deadline(5000)),
                     MSCX_ERR_INVALID_ARG);
    ck_assert_int_eq(mscx_tp_tcp.put_late(lp.c0, lp.src_mr, 0, &lp.sig_d, MSCX_BUF_INPUT, 5, 0, 8, 0,
                                          mscx_tp_deadline(5000)),
                     MSCX_ERR_INVALID_ARG);
    /* a put past the receiver's buffer fails the connection at the receiver, with the resolver's WARN */
    mscx_test_allow_warn("reaches past its 64 bytes");
    mscx_test_allow_warn("could not be resolved");
    ck_assert_int_eq(mscx_tp_tcp.put_late(lp.c0, lp.src_mr, 0, &lp.late_d, MSCX_BUF_INPUT, 5, 60, 8, 0,
                                          mscx_tp_deadline(5000)),
                     MSCX_OK);
    uint64_t dl = mscx_tp_deadline(5000);
    while (mscx_tp_tcp.progress(lp.ep1) == MSCX_OK && mscx_tp_now_ns() < dl)
        sched_yield();
    ck_assert_int_eq(mscx_tp_tcp.progress(lp.ep1), MSCX_ERR_REMOTE);
    mscx_test_allow_warn("peer closed");
    mscx_tp_tcp.ep_destroy(lp.ep0);
    mscx_tp_tcp.ep_destroy(lp.ep1);
}
END_TEST

/* A launch that never starts at the receiver: the late put fails its connection within the bound, loudly. */
START_TEST(tcp_late_put_times_out)
{
    static uint8_t src[4096], out[4096];
    static uint64_t sig;
    struct late_rx x;
    struct late_pair lp;
    memset(&x, 0, sizeof(x));
    late_publish(&x, 6, out, sizeof(out), out, sizeof(out));
    late_pair_setup(&lp, &x, src, sizeof(src), &sig, 300);
    mscx_test_allow_warn("waited");
    uint64_t t0 = mscx_tp_now_ns();
    ck_assert_int_eq(mscx_tp_tcp.put_late(lp.c0, lp.src_mr, 0, &lp.late_d, MSCX_BUF_OUTPUT, 8, 0, sizeof(src),
                                          0, mscx_tp_deadline(5000)),
                     MSCX_OK);
    uint64_t dl = mscx_tp_deadline(5000);
    while (mscx_tp_tcp.progress(lp.ep1) == MSCX_OK && mscx_tp_now_ns() < dl)
        sched_yield();
    double ms = (double)(mscx_tp_now_ns() - t0) / 1e6;
    ck_assert_int_eq(mscx_tp_tcp.progress(lp.ep1), MSCX_ERR_TIMEOUT);
    ck_assert_msg(ms >= 290 && ms < 3000, "failed after %.0f ms (bound 300)", ms);
    ck_assert_msg(
        strstr(mscx_test_last_warn(), "a put into buffer 1 of launch 8 (4096 bytes at offset 0) waited") &&
            strstr(mscx_test_last_warn(), "MSCX_TIMEOUT_MS 300"),
        "%s", mscx_test_last_warn());
    for (size_t i = 0; i < sizeof(out); i++)
        ck_assert_uint_eq(out[i], 0);
    mscx_test_allow_warn("peer closed");
    mscx_tp_tcp.ep_destroy(lp.ep0);
    mscx_tp_tcp.ep_destroy(lp.ep1);
}
END_TEST

void tcp_add_late_put_cases(TCase *tc)
{
    tcase_add_test(tc, tcp_late_puts);
    tcase_add_test(tc, tcp_late_put_times_out);
}
