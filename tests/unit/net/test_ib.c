/* SPDX-License-Identifier: MIT */
/*
 * RDMA transport against the libibverbs test double (fake_ibverbs.c), loaded
 * through the executor's dlopen wrapper by pointing MSCX_IBV_SO at it.
 * Built twice: against the double (unit suite) and, with MSCX_TEST_REAL_IBV,
 * against the real library (rdma suite, skips with 77 without a device).
 */
#define _GNU_SOURCE /* memfd_create */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ibv_wrap.h"
#include "mscx/env.h"
#include "net_pair.h"
#include "test_common.h"
#include "transport.h"

#define COMM_ID 0xab12cd34ull
#define DATA (8u << 20)

enum { FAKE_FAIL_REG = 1, FAKE_QP_ERR = 2, FAKE_DEV0_DOWN = 4 };

#ifndef MSCX_TEST_REAL_IBV
static void *(*fake_alloc)(size_t);
static void (*fake_inject)(unsigned);
static unsigned (*fake_regs)(int);
#endif

static void *buf_alloc(size_t n)
{
#ifdef MSCX_TEST_REAL_IBV
    void *p = NULL;
    return posix_memalign(&p, 4096, n) == 0 ? memset(p, 0, n) : NULL;
#else
    return fake_alloc(n);
#endif
}

static void use_double(void)
{
#ifndef MSCX_TEST_REAL_IBV
    ck_assert_int_eq(mscx_config_override("MSCX_IBV_SO", FAKE_IBV_PATH), MSCX_OK);
#endif
}

struct rank_state {
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn *conn;
    uint8_t *data;
    uint64_t *sig;
    struct mscx_tp_mr *mr, *sig_mr;
    struct mscx_tp_rdesc desc[2]; /* mine: data, sig */
};

static void rank_init(struct rank_state *r, uint32_t rank)
{
    struct mscx_tp_params p = {.rank = rank, .nranks = 2, .comm_id = COMM_ID};
    ck_assert_int_eq(mscx_tp_ib.ep_create(&p, &r->ep), MSCX_OK);
    r->data = buf_alloc(DATA);
    r->sig = buf_alloc(4096);
    ck_assert(r->data && r->sig);
    ck_assert_int_eq(
        mscx_tp_ib.mr_register(r->ep, r->data, DATA, MSCX_TP_MR_REMOTE_WRITE, -1, &r->mr, &r->desc[0]),
        MSCX_OK);
    ck_assert_int_eq(
        mscx_tp_ib.mr_register(r->ep, r->sig, 4096, MSCX_TP_MR_REMOTE_WRITE, -1, &r->sig_mr, &r->desc[1]),
        MSCX_OK);
}

/* Both ranks in this process: prepare both, swap blobs, establish both. */
static void local_pair(struct rank_state r[2])
{
    uint8_t b0[MSCX_TP_BLOB_BYTES], b1[MSCX_TP_BLOB_BYTES];
    rank_init(&r[0], 0);
    rank_init(&r[1], 1);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(r[0].ep, 1, b0, &r[0].conn), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(r[1].ep, 0, b1, &r[1].conn), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_establish(r[0].conn, b1, mscx_tp_deadline(1000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_establish(r[1].conn, b0, mscx_tp_deadline(1000)), MSCX_OK);
}

static void pair_destroy(struct rank_state r[2])
{
    for (int i = 0; i < 2; i++) {
        mscx_tp_ib.mr_deregister(r[i].ep, r[i].mr);
        mscx_tp_ib.mr_deregister(r[i].ep, r[i].sig_mr);
        mscx_tp_ib.ep_destroy(r[i].ep);
    }
}

START_TEST(ib_local_put_signal_flush)
{
    struct rank_state r[2];
    use_double();
    local_pair(r);
    for (uint32_t i = 0; i < DATA; i++)
        r[0].data[i] = (uint8_t)(i * 7 + 1);
    /* Many small puts with no flush in between: selective signaling must keep the SQ from overflowing. */
    for (uint32_t k = 0; k < 3000; k++)
        ck_assert_int_eq(
            mscx_tp_ib.put(r[0].conn, r[0].mr, k * 64, &r[1].desc[0], k * 64, 64, 0, mscx_tp_deadline(5000)),
            MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.put(r[0].conn, r[0].mr, 0, &r[1].desc[0], 0, DATA, MSCX_TP_PUT_PACKET,
                                    mscx_tp_deadline(5000)),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.signal(r[0].conn, &r[1].desc[1], 8, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.signal(r[0].conn, &r[1].desc[1], 8, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.flush(r[0].conn, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.progress(r[0].ep), MSCX_OK);
    ck_assert_int_eq(r[1].sig[1], 2);
    ck_assert_int_eq(memcmp(r[0].data, r[1].data, DATA), 0);
    /* Zero-length put and a flush with nothing outstanding. */
    ck_assert_int_eq(mscx_tp_ib.put(r[1].conn, r[1].mr, 0, &r[0].desc[0], 0, 0, 0, mscx_tp_deadline(5000)),
                     MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.flush(r[1].conn, mscx_tp_deadline(5000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.flush(r[1].conn, mscx_tp_deadline(5000)), MSCX_OK);
    pair_destroy(r);
}
END_TEST

#ifndef MSCX_TEST_REAL_IBV
/* Child of the cross-process test: wait for each signal, check the data landed before it. */
static int child_ib(int fd)
{
    struct net_pair np = {.fd = fd, .rank = 1};
    struct rank_state r;
    struct mscx_tp_rdesc all[4];
    struct mscx_tp_conn *conns[2] = {NULL, NULL};
    uint8_t want[2] = {1, 1};
    rank_init(&r, 1);
    if (net_pair_allgather(&np, r.desc, all, sizeof(r.desc)) != MSCX_OK)
        return 10;
    if (mscx_tp_connect_all(&mscx_tp_ib, r.ep, 1, 2, want, net_pair_allgather, &np, mscx_tp_deadline(5000),
                            conns) != MSCX_OK)
        return 11;
    for (uint64_t k = 1; k <= 20; k++) {
        uint64_t dl = mscx_tp_deadline(5000);
        while (__atomic_load_n(&r.sig[0], __ATOMIC_ACQUIRE) < k)
            if (mscx_tp_now_ns() > dl)
                return 12;
        /* Packet lines of round k: every line must hold {data, flag k}. */
        const uint64_t *lines = (const uint64_t *)r.data;
        for (uint64_t i = 0; i < (k * 4096) / 8; i++)
            if (lines[i] != ((k << 32) | (uint32_t)(i * 5 + k)))
                return 13;
        uint8_t ok = 1;
        net_pair_write(fd, &ok, 1);
    }
    uint8_t done;
    net_pair_read(fd, &done, 1);
    mscx_tp_ib.mr_deregister(r.ep, r.mr);
    mscx_tp_ib.mr_deregister(r.ep, r.sig_mr);
    mscx_tp_ib.ep_destroy(r.ep);
    return 0;
}

START_TEST(ib_two_processes)
{
    int fd = -1;
    use_double();
    pid_t pid = net_pair_fork(&fd);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_ib(fd));
    struct net_pair np = {.fd = fd, .rank = 0};
    struct rank_state r;
    struct mscx_tp_rdesc all[4];
    struct mscx_tp_conn *conns[2] = {NULL, NULL};
    uint8_t want[2] = {1, 1};
    rank_init(&r, 0);
    ck_assert_int_eq(net_pair_allgather(&np, r.desc, all, sizeof(r.desc)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_connect_all(&mscx_tp_ib, r.ep, 0, 2, want, net_pair_allgather, &np,
                                         mscx_tp_deadline(5000), conns),
                     MSCX_OK);
    for (uint64_t k = 1; k <= 20; k++) {
        uint64_t *lines = (uint64_t *)r.data;
        for (uint64_t i = 0; i < (k * 4096) / 8; i++)
            lines[i] = (k << 32) | (uint32_t)(i * 5 + k);
        /* Split in odd pieces: ordering across writes is what the signal relies on. */
        uint64_t len = k * 4096, off = 0;
        while (off < len) {
            uint64_t n = len - off < 1000 * 8 ? len - off : 1000 * 8;
            ck_assert_int_eq(mscx_tp_ib.put(conns[1], r.mr, off, &all[2], off, n, MSCX_TP_PUT_PACKET,
                                            mscx_tp_deadline(5000)),
                             MSCX_OK);
            off += n;
        }
        ck_assert_int_eq(mscx_tp_ib.signal(conns[1], &all[3], 0, mscx_tp_deadline(5000)), MSCX_OK);
        mscx_status_t st = mscx_tp_ib.flush(conns[1], mscx_tp_deadline(5000));
        ck_assert_msg(st == MSCX_OK, "round %llu: flush: %s", (unsigned long long)k, mscx_test_last_warn());
        uint8_t ok = 0;
        ck_assert_int_eq(net_pair_read(fd, &ok, 1), 0);
        ck_assert_int_eq(ok, 1);
    }
    uint8_t done = 1;
    net_pair_write(fd, &done, 1);
    int code = net_pair_reap(pid, 60);
    ck_assert_msg(code == 0, "child exit code %d", code);
    mscx_tp_ib.mr_deregister(r.ep, r.mr);
    mscx_tp_ib.mr_deregister(r.ep, r.sig_mr);
    mscx_tp_ib.ep_destroy(r.ep);
    close(fd);
}
END_TEST

START_TEST(ib_wrong_rkey)
{
    struct rank_state r[2];
    use_double();
    local_pair(r);
    struct mscx_tp_rdesc bad = r[1].desc[0];
    bad.key ^= 0x100;
    ck_assert_int_eq(mscx_tp_ib.put(r[0].conn, r[0].mr, 0, &bad, 0, 64, 0, mscx_tp_deadline(1000)), MSCX_OK);
    mscx_test_allow_warn("remote access error");
    ck_assert_int_eq(mscx_tp_ib.flush(r[0].conn, mscx_tp_deadline(1000)), MSCX_ERR_IBV);
    ck_assert_msg(strstr(mscx_test_last_warn(), "qp in error state"), "got: %s", mscx_test_last_warn());
    /* The connection stays failed. */
    ck_assert_int_eq(mscx_tp_ib.put(r[0].conn, r[0].mr, 0, &r[1].desc[0], 0, 64, 0, mscx_tp_deadline(1000)),
                     MSCX_ERR_IBV);
    ck_assert_int_eq(mscx_tp_ib.progress(r[0].ep), MSCX_ERR_IBV);
    pair_destroy(r);
}
END_TEST

START_TEST(ib_injected_errors)
{
    struct rank_state r[2];
    use_double();
    local_pair(r);
    fake_inject(FAKE_QP_ERR);
    ck_assert_int_eq(mscx_tp_ib.signal(r[0].conn, &r[1].desc[1], 0, mscx_tp_deadline(1000)), MSCX_OK);
    mscx_test_allow_warn("flushed (qp in error state)");
    ck_assert_int_eq(mscx_tp_ib.flush(r[0].conn, mscx_tp_deadline(1000)), MSCX_ERR_IBV);
    ck_assert_int_eq(r[1].sig[0], 0);
    /* The peer's requests now find no responder: they fail too, nothing hangs. */
    mscx_test_allow_warn("retry exceeded");
    ck_assert_int_eq(mscx_tp_ib.signal(r[1].conn, &r[0].desc[1], 0, mscx_tp_deadline(1000)), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.flush(r[1].conn, mscx_tp_deadline(1000)), MSCX_ERR_IBV);
    ck_assert_int_eq(r[0].sig[0], 0);

    /* Failed registration. */
    struct mscx_tp_mr *mr;
    struct mscx_tp_rdesc d;
    fake_inject(FAKE_FAIL_REG);
    mscx_test_allow_warn("registering");
    ck_assert_int_eq(mscx_tp_ib.mr_register(r[0].ep, r[0].data, 4096, 0, -1, &mr, &d), MSCX_ERR_IBV);
    fake_inject(0);

    /* dmabuf path (GPUDirect) vs host path; GPU memory without a dmabuf is refused. */
    unsigned dm = fake_regs(1);
    int fd = memfd_create("fake-dmabuf", 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(mscx_tp_ib.mr_register(r[0].ep, r[0].data, 4096, MSCX_TP_MR_GPU, fd, &mr, &d), MSCX_OK);
    ck_assert_int_eq(fake_regs(1), dm + 1);
    mscx_tp_ib.mr_deregister(r[0].ep, mr);
    close(fd);
    mscx_test_allow_warn("caller bug");
    ck_assert_int_eq(mscx_tp_ib.mr_register(r[0].ep, r[0].data, 4096, MSCX_TP_MR_GPU, -1, &mr, &d),
                     MSCX_ERR_INVALID_ARG);
    pair_destroy(r);
}
END_TEST

START_TEST(ib_bad_handshake)
{
    struct rank_state r[2];
    uint8_t b0[MSCX_TP_BLOB_BYTES], b1[MSCX_TP_BLOB_BYTES], bad[MSCX_TP_BLOB_BYTES];
    use_double();
    rank_init(&r[0], 0);
    rank_init(&r[1], 1);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(r[0].ep, 1, b0, &r[0].conn), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(r[1].ep, 0, b1, &r[1].conn), MSCX_OK);
    /* ib blob layout (transport_ib.c): magic, comm_id, version, rank, dst, qpn, psn, lid. */
    mscx_test_allow_warn("refused peer");
    memcpy(bad, b1, sizeof(bad));
    bad[0] ^= 1;
    ck_assert_int_eq(mscx_tp_ib.conn_establish(r[0].conn, bad, mscx_tp_deadline(1000)), MSCX_ERR_REMOTE);
    ck_assert_msg(strstr(mscx_test_last_warn(), "bad handshake magic"), "got: %s", mscx_test_last_warn());
    memcpy(bad, b1, sizeof(bad));
    bad[8] ^= 1;
    ck_assert_int_eq(mscx_tp_ib.conn_establish(r[0].conn, bad, mscx_tp_deadline(1000)), MSCX_ERR_REMOTE);
    ck_assert_msg(strstr(mscx_test_last_warn(), "communicator id"), "got: %s", mscx_test_last_warn());
    /* A wrong qpn is refused by the (double's) RTR transition. */
    memcpy(bad, b1, sizeof(bad));
    memset(bad + 28, 0xee, 3); /* no such qpn */
    mscx_test_allow_warn("INIT->RTR failed");
    ck_assert_int_eq(mscx_tp_ib.conn_establish(r[0].conn, bad, mscx_tp_deadline(1000)), MSCX_ERR_IBV);
    pair_destroy(r);
}
END_TEST

START_TEST(ib_device_choice)
{
    struct mscx_tp_params p = {.rank = 0, .nranks = 2, .comm_id = COMM_ID};
    struct mscx_tp_ep *ep;
    struct mscx_tp_conn *c;
    uint8_t blob[MSCX_TP_BLOB_BYTES];
    uint16_t lid;
    use_double();

    ck_assert_int_eq(mscx_config_override("MSCX_IB_HCA", "fake_mlx5_1"), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.ep_create(&p, &ep), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(ep, 1, blob, &c), MSCX_OK);
    memcpy(&lid, blob + 36, 2);
    ck_assert_int_eq(lid, 0x11);
    mscx_tp_ib.ep_destroy(ep);

    ck_assert_int_eq(mscx_config_override("MSCX_IB_HCA", "mlx5_9"), MSCX_OK);
    mscx_test_allow_warn("MSCX_IB_HCA names mlx5_9");
    ck_assert_int_eq(mscx_tp_ib.ep_create(&p, &ep), MSCX_ERR_IBV);

    /* Default: the first device with an active port. */
    ck_assert_int_eq(mscx_config_override("MSCX_IB_HCA", NULL), MSCX_OK);
    fake_inject(FAKE_DEV0_DOWN);
    ck_assert_int_eq(mscx_tp_ib.ep_create(&p, &ep), MSCX_OK);
    ck_assert_int_eq(mscx_tp_ib.conn_prepare(ep, 1, blob, &c), MSCX_OK);
    memcpy(&lid, blob + 36, 2);
    ck_assert_int_eq(lid, 0x11);
    mscx_tp_ib.ep_destroy(ep);
    fake_inject(0);

    /* PCI distance through the common ancestor in sysfs. */
    ck_assert_int_eq(mscx_tp_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                                             "/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0"),
                     2);
    ck_assert_int_eq(mscx_tp_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                                             "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"),
                     6);
    ck_assert_int_eq(mscx_tp_ib_pci_distance("/sys/devices/pci0000:00/0000:00:01.0",
                                             "/sys/devices/pci0000:00/0000:00:01.1"),
                     2);
}
END_TEST

START_TEST(ib_missing_library)
{
    const struct mscx_ibv *ibv;
    ck_assert_int_eq(mscx_config_override("MSCX_IBV_SO", "/nonexistent/libibverbs.so.1"), MSCX_OK);
    ck_assert_int_eq(mscx_ibv_load(&ibv), MSCX_ERR_UNSUPPORTED);
}
END_TEST
#endif

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("net-ib");
    TCase *tc = mscx_tcase("ib");
#ifdef MSCX_TEST_REAL_IBV
    const struct mscx_ibv *ibv;
    int n = 0;
    if (mscx_ibv_load(&ibv) != MSCX_OK)
        exit(77);
    struct ibv_device **l = ibv->get_device_list(&n);
    if (l)
        ibv->free_device_list(l);
    if (n == 0) {
        fprintf(stderr, "no RDMA device: skipping\n");
        exit(77);
    }
#else
    /* The double's shared world must exist before any fork. */
    void *h = dlopen(FAKE_IBV_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", FAKE_IBV_PATH, dlerror());
        exit(1);
    }
    int (*init)(size_t) = (int (*)(size_t))dlsym(h, "fake_ibv_world_init");
    *(void **)&fake_alloc = dlsym(h, "fake_ibv_alloc");
    *(void **)&fake_inject = dlsym(h, "fake_ibv_inject");
    *(void **)&fake_regs = dlsym(h, "fake_ibv_regs");
    if (!init || !fake_alloc || !fake_inject || !fake_regs || init(1u << 30) != 0)
        exit(1);
    tcase_add_test(tc, ib_two_processes);
    tcase_add_test(tc, ib_wrong_rkey);
    tcase_add_test(tc, ib_injected_errors);
    tcase_add_test(tc, ib_bad_handshake);
    tcase_add_test(tc, ib_device_choice);
    tcase_add_test(tc, ib_missing_library);
#endif
    tcase_add_test(tc, ib_local_put_signal_flush);
    suite_add_tcase(s, tc);
    return s;
}
