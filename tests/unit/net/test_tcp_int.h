/* SPDX-License-Identifier: MIT */
/*
 * Private header of the TCP transport test, shared by test_tcp.c and
 * test_tcp_late_puts.c: the communicator id of their endpoints, the byte
 * pattern of their puts, the wait for a signal word, conn_establish on a
 * thread, and the cases of test_tcp_late_puts.c that test_tcp.c adds.
 */
#ifndef MSCX_TEST_TCP_INT_H
#define MSCX_TEST_TCP_INT_H

#include <stdint.h>

#include "test_common.h"
#include "transport.h"

#define COMM_ID 0x5eedc0ffee123ull

struct est_arg {
    struct mscx_tp_conn *c;
    const void *blob;
    mscx_status_t st;
};

static inline void *establish_thread(void *arg)
{
    struct est_arg *e = arg;
    e->st = mscx_tp_tcp.conn_establish(e->c, e->blob, mscx_tp_deadline(5000));
    return NULL;
}

static inline int wait_word(volatile uint64_t *w, uint64_t v, int ms)
{
    uint64_t dl = mscx_tp_deadline((uint64_t)ms);
    while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < v)
        if (mscx_tp_now_ns() > dl)
            return -1;
    return 0;
}

static inline uint8_t pattern(uint64_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u) >> 13 ^ seed);
}

/* test_tcp_late_puts.c */
void tcp_add_late_put_cases(TCase *tc);

#endif
