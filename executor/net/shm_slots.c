/* SPDX-License-Identifier: MIT */
/*
 * Per-launch slot exchange in POSIX shared memory (see shm_slots.h). Plain C11
 * atomics on the mapped segments: they are lock-free for 64-bit values on
 * the targets we build for, hence address-free and valid across processes.
 */
#include "shm_slots.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mscx/log.h"

#define UREG_MAGIC 0x6d7363782d757267ull /* "mscx-urg" */
#define UREG_VERSION 1u

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2,
               "64-bit atomics must be lock-free to be shared between processes");

struct slots_entry {
    _Atomic uint64_t pub_seq;     /* launch whose publication is below (release, after the data) */
    _Atomic uint64_t verdict_seq; /* launch whose verdict is below (release, after the verdict) */
    int32_t status;
    int32_t verdict;
    uint32_t bytes;
    uint32_t pad;
    unsigned char payload[MSCX_SLOTS_PAYLOAD_MAX];
};

struct slots_seg {
    uint64_t magic;
    uint32_t version, rank;
    struct slots_entry e[2]; /* by launch parity */
};

struct mscx_slots {
    uint32_t rank, nranks;
    char tag[96];
    char name[MSCX_SLOTS_NAME_MAX];
    int named; /* our name is still linked */
    struct slots_seg *mine;
    struct slots_seg **peer; /* [nranks], mapped read-only; peer[rank] == mine */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t fresh_id(void)
{
    static _Atomic uint64_t counter;
    uint64_t x = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &x, sizeof(x)) != (ssize_t)sizeof(x))
            x = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    x ^= ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ (atomic_fetch_add(&counter, 1) << 48);
    return x;
}

/* The inode of this process's PID namespace, 0 when unknown. */
static unsigned long long pid_namespace(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

/*
 * Segments of processes that died between create and the last attach (a
 * crash, SIGKILL): their names carry the creator's PID namespace and pid.
 * Unlinked here are only those of our namespace, owned by us, whose creator
 * no longer exists; a pid of another namespace cannot be checked and is left.
 * @return how many were removed
 */
static unsigned reap_stale(void)
{
    unsigned long long ns = pid_namespace(), their_ns, id;
    long pid;
    unsigned rank, n = 0;
    DIR *d = ns ? opendir("/dev/shm") : NULL;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char name[MSCX_SLOTS_NAME_MAX + 1];
        struct stat sb;
        if (sscanf(de->d_name, "mscx-slots-%llx-%ld-%u-%llx", &their_ns, &pid, &rank, &id) != 4 ||
            their_ns != ns || pid <= 0 || pid == (long)getpid() ||
            fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH ||
            snprintf(name, sizeof(name), "/%s", de->d_name) >= (int)sizeof(name))
            continue;
        if (shm_unlink(name) == 0) {
            n++;
            MSCX_INFO(MSCX_SUB_NET, "removed %s, left by process %ld, which is gone", name, pid);
        }
    }
    closedir(d);
    return n;
}

mscx_status_t mscx_slots_create(const char *tag, uint32_t rank, uint32_t nranks, char *name_p,
                                struct mscx_slots **u_p)
{
    if (!name_p || !u_p || rank >= nranks)
        return MSCX_ERR_INVALID_ARG;
    struct mscx_slots *u = calloc(1, sizeof(*u));
    if (!u)
        return MSCX_ERR_NO_MEMORY;
    u->peer = calloc(nranks, sizeof(*u->peer));
    if (!u->peer) {
        free(u);
        return MSCX_ERR_NO_MEMORY;
    }
    u->rank = rank;
    u->nranks = nranks;
    snprintf(u->tag, sizeof(u->tag), "%s", tag ? tag : "?");
    reap_stale();
    unsigned long long ns = pid_namespace();
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        snprintf(u->name, sizeof(u->name), "/mscx-slots-%llx-%ld-%u-%016llx", ns, (long)getpid(), rank,
                 (unsigned long long)fresh_id());
        fd = shm_open(u->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        MSCX_WARN("%s: rank %u: shm_open(%s) for the user-buffer exchange: %s", u->tag, rank, u->name,
                  strerror(errno));
        goto err_free;
    }
    u->named = 1;
    if (ftruncate(fd, (off_t)sizeof(struct slots_seg)) != 0) {
        MSCX_WARN("%s: rank %u: ftruncate(%s, %zu): %s", u->tag, rank, u->name, sizeof(struct slots_seg),
                  strerror(errno));
        goto err_close;
    }
    void *p = mmap(NULL, sizeof(struct slots_seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        MSCX_WARN("%s: rank %u: mmap of %s: %s", u->tag, rank, u->name, strerror(errno));
        goto err_close;
    }
    close(fd);
    u->mine = p;
    memset(u->mine, 0, sizeof(*u->mine)); /* sequence 0: nothing published */
    u->mine->version = UREG_VERSION;
    u->mine->rank = rank;
    atomic_store_explicit((_Atomic uint64_t *)&u->mine->magic, UREG_MAGIC, memory_order_release);
    u->peer[rank] = u->mine;
    memcpy(name_p, u->name, MSCX_SLOTS_NAME_MAX);
    *u_p = u;
    return MSCX_OK;
err_close:
    close(fd);
    shm_unlink(u->name);
err_free:
    free(u->peer);
    free(u);
    return MSCX_ERR_SYSTEM;
}

mscx_status_t mscx_slots_attach(struct mscx_slots *u, uint32_t peer, const char *name)
{
    if (!u || !name || peer >= u->nranks || peer == u->rank || u->peer[peer] ||
        strnlen(name, MSCX_SLOTS_NAME_MAX) == MSCX_SLOTS_NAME_MAX || name[0] != '/') {
        MSCX_WARN("internal bug: %s: rank %u: bad attach to rank %u", u ? u->tag : "?", u ? u->rank : 0,
                  peer);
        return MSCX_ERR_INVALID_ARG;
    }
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        MSCX_WARN(
            "%s: rank %u: cannot open rank %u's user-buffer exchange segment %s: %s (not on this host, or "
            "already unlinked)",
            u->tag, u->rank, peer, name, strerror(errno));
        return MSCX_ERR_SYSTEM;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != sizeof(struct slots_seg)) {
        MSCX_WARN("%s: rank %u: rank %u's segment %s has %lld bytes, expected %zu", u->tag, u->rank, peer,
                  name, (long long)sb.st_size, sizeof(struct slots_seg));
        close(fd);
        return MSCX_ERR_SYSTEM;
    }
    void *p = mmap(NULL, sizeof(struct slots_seg), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        MSCX_WARN("%s: rank %u: mmap of rank %u's segment %s: %s", u->tag, u->rank, peer, name,
                  strerror(errno));
        return MSCX_ERR_SYSTEM;
    }
    struct slots_seg *s = p;
    if (atomic_load_explicit((_Atomic uint64_t *)&s->magic, memory_order_acquire) != UREG_MAGIC ||
        s->version != UREG_VERSION || s->rank != peer) {
        MSCX_WARN("%s: rank %u: segment %s is not rank %u's exchange segment (rank %u, version %u)", u->tag,
                  u->rank, name, peer, s->rank, s->version);
        munmap(p, sizeof(struct slots_seg));
        return MSCX_ERR_SYSTEM;
    }
    u->peer[peer] = s;
    return MSCX_OK;
}

void mscx_slots_unlink(struct mscx_slots *u)
{
    if (u && u->named) {
        shm_unlink(u->name);
        u->named = 0;
    }
}

mscx_status_t mscx_slots_publish(struct mscx_slots *u, uint64_t seq, int32_t status, const void *payload,
                                 size_t bytes)
{
    if (!u || seq == 0 || bytes > MSCX_SLOTS_PAYLOAD_MAX || (bytes && !payload))
        return MSCX_ERR_INVALID_ARG;
    struct slots_entry *e = &u->mine->e[seq & 1u];
    e->status = status;
    e->bytes = (uint32_t)bytes;
    if (bytes)
        memcpy(e->payload, payload, bytes);
    atomic_store_explicit(&e->pub_seq, seq, memory_order_release); /* after the data */
    return MSCX_OK;
}

mscx_status_t mscx_slots_verdict(struct mscx_slots *u, uint64_t seq, int32_t verdict)
{
    if (!u || seq == 0)
        return MSCX_ERR_INVALID_ARG;
    struct slots_entry *e = &u->mine->e[seq & 1u];
    e->verdict = verdict;
    atomic_store_explicit(&e->verdict_seq, seq, memory_order_release);
    return MSCX_OK;
}

/*
 * Wait until *at == seq. Values below seq are earlier launches (wait on);
 * above, the peer is at another launch than we are: the ranks issued
 * different numbers of launches, which no wait can repair.
 */
static mscx_status_t wait_seq(const struct mscx_slots *u, uint32_t peer, _Atomic uint64_t *at, uint64_t seq,
                              const struct mscx_slots_limits *lim, const char *what)
{
    uint64_t t0 = 0;
    for (uint32_t spins = 0;; spins++) {
        uint64_t v = atomic_load_explicit(at, memory_order_acquire);
        if (v == seq)
            return MSCX_OK;
        if (v > seq) {
            MSCX_WARN(
                "%s: rank %u waits for rank %u's %s of launch %llu and finds launch %llu: the ranks issued "
                "different launches (a launch that failed on one rank only?)",
                u->tag, u->rank, peer, what, (unsigned long long)seq, (unsigned long long)v);
            return MSCX_ERR_INTERNAL;
        }
        if (lim && lim->abort && *lim->abort)
            return MSCX_ERR_REMOTE;
        if (spins < 64) {
            sched_yield();
            continue;
        }
        uint64_t t = now_ms();
        if (t0 == 0)
            t0 = t;
        if (lim && lim->timeout_ms && t - t0 > lim->timeout_ms) {
            MSCX_WARN(
                "%s: rank %u: no %s of launch %llu from rank %u within %llu ms (MSCX_TIMEOUT_MS; it has "
                "launch %llu): the peer is late, hung or gone",
                u->tag, u->rank, what, (unsigned long long)seq, peer, (unsigned long long)lim->timeout_ms,
                (unsigned long long)v);
            return MSCX_ERR_TIMEOUT;
        }
        struct timespec nap = {0, spins < 4096 ? 2000 : 50000};
        nanosleep(&nap, NULL);
    }
}

mscx_status_t mscx_slots_wait(struct mscx_slots *u, uint32_t peer, uint64_t seq,
                              const struct mscx_slots_limits *lim, int32_t *status_p, void *payload,
                              size_t bytes)
{
    if (!u || seq == 0 || peer >= u->nranks || !u->peer[peer] || !status_p || (bytes && !payload))
        return MSCX_ERR_INVALID_ARG;
    struct slots_entry *e = &u->peer[peer]->e[seq & 1u];
    MSCX_CHECK(wait_seq(u, peer, &e->pub_seq, seq, lim, "publication"));
    uint32_t n = e->bytes;
    if (n > MSCX_SLOTS_PAYLOAD_MAX)
        n = MSCX_SLOTS_PAYLOAD_MAX;
    if (bytes) {
        memset(payload, 0, bytes);
        memcpy(payload, e->payload, n < bytes ? n : bytes);
    }
    int32_t st = e->status;
    /* the entry cannot change before our verdict of seq + 1 (shm_slots.h); a change here is a protocol bug */
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&e->pub_seq, memory_order_relaxed) != seq) {
        MSCX_WARN("internal bug: %s: rank %u: rank %u's publication of launch %llu changed while read",
                  u->tag, u->rank, peer, (unsigned long long)seq);
        return MSCX_ERR_INTERNAL;
    }
    *status_p = st;
    return MSCX_OK;
}

mscx_status_t mscx_slots_agree(struct mscx_slots *u, const uint32_t *ranks, uint32_t n, uint64_t seq,
                               const struct mscx_slots_limits *lim, uint32_t *bad_rank_p, int32_t *bad_p)
{
    if (!u || seq == 0 || (n && !ranks) || !bad_rank_p || !bad_p)
        return MSCX_ERR_INVALID_ARG;
    uint32_t bad_rank = UINT32_MAX;
    int32_t bad = MSCX_OK;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = ranks[i];
        if (r >= u->nranks || !u->peer[r])
            return MSCX_ERR_INVALID_ARG;
        struct slots_entry *e = &u->peer[r]->e[seq & 1u];
        MSCX_CHECK(wait_seq(u, r, &e->verdict_seq, seq, lim, "verdict"));
        int32_t v = e->verdict;
        /* a rank that failed only because another did says MSCX_ERR_REMOTE: name the other one */
        if (v != MSCX_OK && (bad_rank == UINT32_MAX || (bad == MSCX_ERR_REMOTE && v != MSCX_ERR_REMOTE))) {
            bad_rank = r;
            bad = v;
        }
    }
    *bad_rank_p = bad_rank;
    *bad_p = bad;
    return MSCX_OK;
}

void mscx_slots_destroy(struct mscx_slots *u)
{
    if (!u)
        return;
    mscx_slots_unlink(u);
    for (uint32_t r = 0; r < u->nranks; r++)
        if (u->peer[r])
            munmap(u->peer[r], sizeof(struct slots_seg));
    free(u->peer);
    free(u);
}
