/* SPDX-License-Identifier: MIT */
/* Helpers shared by all port-channel transports (see transport.h). */
#define _GNU_SOURCE /* getifaddrs */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "mscx/env.h"
#include "mscx/log.h"
#include "transport.h"

mscx_status_t mscx_tp_socket_addr(char addr[MSCX_TP_ADDR_LEN], char ifname[MSCX_TP_IFNAME_LEN])
{
    const struct mscx_config *cfg;
    struct ifaddrs *list = NULL;
    const struct ifaddrs *pick = NULL, *named_no_ipv4 = NULL;
    MSCX_CHECK(mscx_config_get(&cfg));
    const char *want = cfg->socket_ifname && cfg->socket_ifname[0] ? cfg->socket_ifname : NULL;
    if (getifaddrs(&list) < 0) {
        MSCX_WARN("tcp: getifaddrs failed: %m");
        return MSCX_ERR_SYSTEM;
    }
    for (const struct ifaddrs *a = list; a && !pick; a = a->ifa_next) {
        int ipv4 = a->ifa_addr && a->ifa_addr->sa_family == AF_INET;
        if (want) {
            if (strcmp(a->ifa_name, want) != 0)
                continue;
            if (ipv4)
                pick = a;
            else
                named_no_ipv4 = a;
        } else if (ipv4 && (a->ifa_flags & IFF_UP) && (a->ifa_flags & IFF_RUNNING) &&
                   !(a->ifa_flags & IFF_LOOPBACK)) {
            pick = a;
        }
    }
    mscx_status_t st = MSCX_OK;
    if (pick) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)pick->ifa_addr;
        inet_ntop(AF_INET, &sin->sin_addr, addr, MSCX_TP_ADDR_LEN);
        snprintf(ifname, MSCX_TP_IFNAME_LEN, "%s", pick->ifa_name);
        if (want && !(pick->ifa_flags & IFF_UP))
            MSCX_WARN("tcp: MSCX_SOCKET_IFNAME names %s, which is down; using its address %s anyway", want,
                      addr);
        MSCX_INFO(MSCX_SUB_NET, "tcp: interface %s address %s (%s)", ifname, addr,
                  want ? "MSCX_SOCKET_IFNAME" : "first non-loopback interface that is up");
    } else if (want) {
        MSCX_WARN("MSCX_SOCKET_IFNAME names %s, but %s; set it to an interface with an IPv4 address (see "
                  "'ip -4 addr')",
                  want, named_no_ipv4 ? "that interface has no IPv4 address" : "there is no such interface");
        st = MSCX_ERR_INVALID_ARG;
    } else {
        snprintf(addr, MSCX_TP_ADDR_LEN, "127.0.0.1");
        snprintf(ifname, MSCX_TP_IFNAME_LEN, "lo");
        MSCX_INFO(
            MSCX_SUB_NET,
            "tcp: no non-loopback interface is up with an IPv4 address: listening on 127.0.0.1 (ranks on "
            "other hosts cannot connect)");
    }
    freeifaddrs(list);
    return st;
}

uint64_t mscx_tp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int mscx_tp_ct_equal(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(x[i] ^ y[i]);
    return d == 0;
}

uint64_t mscx_tp_deadline(uint64_t timeout_ms)
{
    if (timeout_ms == 0 || timeout_ms > UINT64_MAX / 2000000ull)
        return UINT64_MAX;
    return mscx_tp_now_ns() + timeout_ms * 1000000ull;
}

mscx_status_t mscx_tp_connect_all(const struct mscx_transport_ops *ops, struct mscx_tp_ep *ep, uint32_t rank,
                                  uint32_t nranks, const uint8_t *want,
                                  mscx_status_t (*allgather)(void *ctx, const void *mine, void *all,
                                                             size_t bytes),
                                  void *ag_ctx, uint64_t deadline_ns, struct mscx_tp_conn **conns)
{
    mscx_status_t st = MSCX_OK;
    size_t row = (size_t)nranks * MSCX_TP_BLOB_BYTES;
    struct mscx_tp_conn **tmp = NULL;
    uint8_t *mine = NULL, *all = NULL;

    if (!ops || !ep || !want || !allgather || !conns || rank >= nranks) {
        MSCX_WARN("caller bug: bad arguments to mscx_tp_connect_all");
        return MSCX_ERR_INVALID_ARG;
    }
    tmp = calloc(nranks, sizeof(*tmp));
    mine = calloc(1, row);
    all = calloc(nranks, row);
    if (!tmp || !mine || !all) {
        MSCX_WARN("out of memory connecting %u ranks", nranks);
        st = MSCX_ERR_NO_MEMORY;
        goto err_free;
    }
    /* Row r of the exchange holds what rank r wrote for each peer. */
    for (uint32_t p = 0; p < nranks; p++) {
        if (p == rank || !want[p])
            continue;
        MSCX_CHECK_GOTO(ops->conn_prepare(ep, p, mine + (size_t)p * MSCX_TP_BLOB_BYTES, &tmp[p]), st,
                        err_close);
    }
    MSCX_CHECK_GOTO(allgather(ag_ctx, mine, all, row), st, err_close);
    for (uint32_t p = 0; p < nranks && st == MSCX_OK; p++) {
        if (!tmp[p])
            continue;
        const uint8_t *blob = all + (size_t)p * row + (size_t)rank * MSCX_TP_BLOB_BYTES;
        st = ops->conn_establish(tmp[p], blob, deadline_ns);
    }
    /*
     * Barrier with every rank's outcome: nobody sends before all peers are
     * ready to receive (an RC QP must be in RTR before requests reach it),
     * and a rank that failed makes every rank fail instead of hang later.
     */
    int32_t mine_st = st, *sts = (int32_t *)all; /* reuse: nranks * 4 <= nranks * row */
    mscx_status_t bst = allgather(ag_ctx, &mine_st, sts, sizeof(mine_st));
    if (st != MSCX_OK)
        goto err_close;
    if (bst != MSCX_OK) {
        st = bst;
        goto err_close;
    }
    for (uint32_t p = 0; p < nranks; p++) {
        if (sts[p] != MSCX_OK) {
            MSCX_WARN("%s: rank %u failed to connect: %s", ops->name, p,
                      mscx_status_str((mscx_status_t)sts[p]));
            st = MSCX_ERR_REMOTE;
            goto err_close;
        }
    }
    memcpy(conns, tmp, nranks * sizeof(*tmp));
    goto err_free;

err_close:
    for (uint32_t p = 0; p < nranks; p++)
        if (tmp[p])
            ops->conn_close(tmp[p]);
err_free:
    free(all);
    free(mine);
    free(tmp);
    return st;
}

mscx_status_t mscx_tp_check_remote(const struct mscx_tp_rdesc *rd, uint32_t tp, uint32_t peer, uint64_t roff,
                                   uint64_t len)
{
    if (!rd || rd->tp != tp || rd->owner != peer || roff > rd->len || len > rd->len - roff) {
        MSCX_WARN("caller bug: %s access outside the remote region of peer %u (offset %llu, %llu bytes)",
                  tp == 'I' ? "ib" : "tcp", peer, (unsigned long long)roff, (unsigned long long)len);
        return MSCX_ERR_INVALID_ARG;
    }
    return MSCX_OK;
}
