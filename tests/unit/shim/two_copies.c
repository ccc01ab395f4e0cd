/* SPDX-License-Identifier: MIT */
/*
 * Two NCCL copies in one process, as PyTorch (its wheel's libnccl) beside a
 * ctypes client that opens another libnccl.so.2 by path (vLLM's pynccl with
 * VLLM_NCCL_SO_PATH). The PyTorch side is USER_LIB, linked with copy A (the
 * fake libnccl, which the shim finds loaded and takes as the real NCCL) and
 * opened RTLD_LOCAL as Python opens libtorch_cuda.so. The client side opens
 * copy B (copyb/fake_copyb.c, another libnccl.so.2) by path with RTLD_NOW |
 * RTLD_LOCAL, as ctypes does. What is called through B's handle must behave
 * as without the shim: B's calls to its own exported functions stay in B and
 * copy A never sees them; USER_LIB's calls go where they went before (the
 * shim, then its real NCCL).
 *
 *   shim-two-copies USER_LIB B_PATH --expect=a|b [--expect-shim]
 *     --expect=a     USER_LIB's calls reach copy A
 *     --expect=b     they reach copy B (MSCX_NCCL_LIB=B_PATH)
 *     --expect-shim  USER_LIB's NCCL functions must come from libmscx_nccl.so (else from copy A)
 *     --log-has=TEXT afterwards the shim's MSCX_DEBUG_FILE must contain TEXT (repeatable)
 * FAKE_NCCL_LOG names copy A's call log.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "copyb/fake_copyb.h"
#include "shim_check.h"

static const char *a_log;

/* The shim's log (MSCX_DEBUG_FILE) must contain @p text. */
static void check_shim_log(const char *text)
{
    static char buf[1 << 16];
    const char *path = getenv("MSCX_DEBUG_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    if (!strstr(buf, text))
        FAIL("the shim's log %s lacks '%s'; it holds:\n%s", path ? path : "(MSCX_DEBUG_FILE unset)", text,
             buf);
}

/* Copy B's functions, from its handle as a ctypes client gets them. */
struct copy_b {
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*destroy)(ncclComm_t);
    __typeof__(fakeb_comm_info) *info;
};

/* The library linked with copy A. */
struct user {
    ncclResult_t (*init)(ncclComm_t *);
    ncclResult_t (*all_reduce)(const float *, float *, size_t, ncclComm_t);
    ncclResult_t (*bcast)(float *, size_t, ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*owner)(void);
};

static void a_log_clear(void)
{
    FILE *f = fopen(a_log, "w");
    if (f)
        fclose(f);
}

/* Copy A's log since the last a_log_clear() (static buffer). */
static const char *a_log_text(void)
{
    static char buf[1 << 16];
    FILE *f = fopen(a_log, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

static int load_b(const char *path, struct copy_b *b)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        FAIL("cannot open copy B %s: %s", path, dlerror());
        return -1;
    }
    *(void **)&b->get_version = dlsym(h, "ncclGetVersion");
    *(void **)&b->init_rank = dlsym(h, "ncclCommInitRank");
    *(void **)&b->all_reduce = dlsym(h, "ncclAllReduce");
    *(void **)&b->bcast = dlsym(h, "ncclBcast");
    *(void **)&b->destroy = dlsym(h, "ncclCommDestroy");
    *(void **)&b->info = dlsym(h, "fakeb_comm_info");
    if (!b->get_version || !b->init_rank || !b->all_reduce || !b->bcast || !b->destroy || !b->info) {
        FAIL("copy B %s lacks a function", path);
        return -1;
    }
    return 0;
}

static void fill(float *p, size_t n, float base)
{
    for (size_t i = 0; i < n; i++)
        p[i] = base + (float)(i % 1000) * 0.25f;
}

/* B's fp32 sum AllReduce at world size 1, 1 KB to 256 KB: the result is the input. */
static void b_all_reduce(const struct copy_b *b, ncclComm_t comm)
{
    static float send[65536], recv[65536], want[65536];
    for (size_t bytes = 1024; bytes <= sizeof(send); bytes *= 4) {
        size_t n = bytes / sizeof(float);
        int v = 0, before = 0, after = 0;
        fill(send, n, (float)bytes);
        memcpy(want, send, bytes);
        fill(recv, n, -1.0f);
        b->info(comm, &v, &before);
        ncclResult_t r = b->all_reduce(send, recv, n, ncclFloat32, ncclSum, comm, NULL);
        b->info(comm, &v, &after);
        if (r != ncclSuccess)
            FAIL("copy B ncclAllReduce of %zu bytes returned %d", bytes, (int)r);
        else if (memcmp(recv, want, bytes) != 0)
            FAIL("copy B ncclAllReduce of %zu bytes: wrong result (recv[0] %g, expected %g)", bytes,
                 (double)recv[0], (double)want[0]);
        if (after != before + 1)
            FAIL("copy B ncclAllReduce of %zu bytes: copy B ran %d operations, expected 1", bytes,
                 after - before);
    }
}

/* Everything through B's handle: B alone must see it. */
static void run_copy_b(const struct copy_b *b)
{
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    int v = 0, ops = 0;
    memset(&id, 0xb0, sizeof(id));
    a_log_clear();
    if (b->get_version(&v) != ncclSuccess || v != FAKEB_VERSION)
        FAIL("copy B ncclGetVersion gave %d, expected %d", v, FAKEB_VERSION);
    ncclResult_t r = b->init_rank(&comm, 1, id, 0);
    if (r != ncclSuccess || !comm) {
        FAIL("copy B ncclCommInitRank returned %d", (int)r);
        return;
    }
    if (b->info(comm, &v, &ops) != 0 || v != FAKEB_VERSION)
        FAIL("copy B's ncclCommInitRank asked ncclGetVersion and got %d, not its own %d", v, FAKEB_VERSION);
    b_all_reduce(b, comm);
    float buf[256];
    fill(buf, 256, 3.0f);
    b->info(comm, &v, &ops);
    int ops_after = ops;
    r = b->bcast(buf, 256, ncclFloat32, 0, comm, NULL);
    b->info(comm, &v, &ops_after);
    if (r != ncclSuccess || ops_after != ops + 1)
        FAIL("copy B ncclBcast returned %d and ran %d operations in copy B, expected 1", (int)r,
             ops_after - ops);
    if ((r = b->destroy(comm)) != ncclSuccess)
        FAIL("copy B ncclCommDestroy returned %d", (int)r);
    const char *seen = a_log_text();
    if (seen[0])
        FAIL("calls made through copy B reached copy A:\n%s", seen);
}

/* The PyTorch side: its calls reach the shim's real NCCL (or, without the shim, copy A). */
static void run_user(const struct user *u, const struct copy_b *b, int expect_b)
{
    ncclComm_t comm = NULL;
    static float send[1024], recv[1024];
    fill(send, 1024, 5.0f);
    fill(recv, 1024, -1.0f);
    a_log_clear();
    ncclResult_t r = u->init(&comm);
    if (r != ncclSuccess || !comm) {
        FAIL("ncclCommInitRank of the library linked with copy A returned %d", (int)r);
        return;
    }
    if ((r = u->all_reduce(send, recv, 1024, comm)) != ncclSuccess)
        FAIL("ncclAllReduce of the library linked with copy A returned %d", (int)r);
    if ((r = u->bcast(recv, 1024, comm)) != ncclSuccess)
        FAIL("ncclBcast of the library linked with copy A returned %d", (int)r);
    int v = 0, ops = 0, in_b = b->info(comm, &v, &ops) == 0;
    const char *seen = a_log_text();
    if (expect_b) {
        if (!in_b || ops != 2 || memcmp(recv, send, sizeof(send)) != 0)
            FAIL("the linked library's ncclAllReduce did not run in copy B (comm of B %d, B ops %d)", in_b,
                 ops);
        if (seen[0])
            FAIL("the linked library's calls reached copy A:\n%s", seen);
    } else {
        if (in_b)
            FAIL("the linked library's ncclCommInitRank made a comm of copy B");
        if (!strstr(seen, "ncclCommInitRank ") || !strstr(seen, "ncclAllReduce ") ||
            !strstr(seen, "ncclBcast "))
            FAIL("the linked library's calls did not reach copy A; its log:\n%s", seen);
    }
    if (u->destroy(comm) != ncclSuccess)
        FAIL("ncclCommDestroy of the library linked with copy A failed");
}

static int load_user(const char *path, struct user *u)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        FAIL("cannot open %s: %s", path, dlerror());
        return -1;
    }
    *(void **)&u->init = dlsym(h, "user_init");
    *(void **)&u->all_reduce = dlsym(h, "user_all_reduce");
    *(void **)&u->bcast = dlsym(h, "user_bcast");
    *(void **)&u->destroy = dlsym(h, "user_destroy");
    *(void **)&u->owner = dlsym(h, "user_nccl_owner");
    if (!u->init || !u->all_reduce || !u->bcast || !u->destroy || !u->owner) {
        FAIL("%s lacks a function", path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int expect_shim = 0, expect_b = -1, npaths = 0, ntexts = 0;
    const char *paths[2], *texts[4];
    a_log = getenv("FAKE_NCCL_LOG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expect-shim"))
            expect_shim = 1;
        else if (!strcmp(argv[i], "--expect=a"))
            expect_b = 0;
        else if (!strcmp(argv[i], "--expect=b"))
            expect_b = 1;
        else if (!strncmp(argv[i], "--log-has=", 10) && ntexts < 4)
            texts[ntexts++] = argv[i] + 10;
        else if (argv[i][0] != '-' && npaths < 2)
            paths[npaths++] = argv[i];
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (npaths != 2 || expect_b < 0 || !a_log) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=FILE %s USER_LIB B_PATH --expect=a|b [--expect-shim]\n",
                argv[0]);
        return 2;
    }
    const char *shim_log = getenv("MSCX_DEBUG_FILE");
    FILE *f = shim_log && ntexts ? fopen(shim_log, "w") : NULL; /* only this run's lines count */
    if (f)
        fclose(f);
    struct user u;
    struct copy_b b;
    if (load_user(paths[0], &u) != 0 || load_b(paths[1], &b) != 0)
        return 1;
    const char *owner = u.owner();
    if ((strstr(owner, "libmscx_nccl") != NULL) != expect_shim)
        FAIL("the linked library's ncclAllReduce comes from %s (%s the shim)", owner,
             expect_shim ? "expected" : "not");
    run_copy_b(&b);
    run_user(&u, &b, expect_b);
    run_copy_b(&b); /* again, now that the shim has loaded its real NCCL */
    for (int i = 0; i < ntexts; i++)
        check_shim_log(texts[i]);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
