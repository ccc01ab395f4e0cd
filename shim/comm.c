/* SPDX-License-Identifier: MIT */
/*
 * Our state beside each real communicator, found by the real ncclComm_t in
 * comm_table.c: the executor, the plans usable on this communicator, and the
 * routing statistics printed at destroy.
 *
 * Every collective looks its communicator up without a lock. State objects
 * are recycled, never freed: a call that found one keeps reading valid
 * memory whatever a concurrent teardown does. A call holds a reference,
 * taken only while the count is not zero and kept only when the object
 * still belongs to the call's communicator; the last reference releases the
 * executor and the plan arrays and puts the object on the free list. The
 * count orders every access to the other fields: they are written only
 * while it is zero, or before the communicator is handed to the application.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "mscx/env.h"
#include "mscx/exec.h"
#include "mscx/fork.h"
#include "mscx/log.h"
#include "shim_int.h"

#ifndef MSCX_VERSION
#define MSCX_VERSION "unknown"
#endif

#define NSTAT_COLL SHIM_NSTAT_COLL

struct shim_comm {
    atomic_int refs; /* 0: on the free list or being set up; first, outside what setup clears */
    /* what every call reads, on the first cache line */
    ncclComm_t comm;
    struct mscx_exec *exec;
    const volatile int32_t *exec_error; /* mscx_exec_error_word(exec), or NULL */
    struct shim_route_plan *route;      /* [nroute], priority order */
    _Atomic int deferred;               /* enum comm_deferred: setup still to run at the first collective */
    _Atomic int err; /* mscx_status_t of the first failed kernel: the communicator's sticky error, 0: none */
    uint32_t nranks, rpn;
    unsigned forced;
    /* a call's collective's window, on a line of its own: a call of a size no plan takes reads no more */
    _Alignas(64) struct shim_route_window win[MSCX_COLL_COUNT]; /* of route, for this comm's layout */
    size_t nroute;
    uint32_t *exec_id; /* [nroute] */
    /* the rest */
    struct shim_comm *next_free;
    int prof;        /* of the init, for a deferred setup's calls of the real NCCL */
    const char *how; /* how it was created, for a deferred setup's messages */
    uint32_t rank;
    int device;
    struct mscx_bootstrap *bs;
    const char **route_name;       /* [nroute] plan paths */
    _Atomic uint64_t *route_calls; /* [nroute]: calls each plan ran */
    _Atomic uint64_t
        identity_calls[NSTAT_COLL]; /* in-place calls at one rank, answered without moving data */
    int stopped; /* stopped by an abort, revoke or shrink: the release must not wait on the device */
    uint8_t secret[SHIM_SECRET_BYTES]; /* rank 0's random draw, shared by the fixed exchange */
    _Atomic uint64_t counts[NSTAT_COLL][SHIM_NBUCKETS][SHIM_WHY_COUNT]; /* as struct shim_stats */
    /* sends and recvs, counted from the init on (a blocking setup with an executor), else NULL */
    int p2p_counted;                  /* set before the build: the count starts with the communicator */
    _Atomic uint64_t *p2p_sent;       /* [nranks]: sends to rank j handed to NCCL or run as an AlltoAll */
    _Atomic uint64_t *p2p_received;   /* [nranks]: recvs from rank j */
    struct shim_p2p_agree *p2p_agree; /* opened at the first vote, by the thread of the group */
    pthread_mutex_t p2p_lock;         /* guards p2p_agree's opening */
    _Atomic int p2p_gave_up;          /* a vote timed out: this rank votes no from then on */
};

/*
 * A non-blocking communicator is published at init as a placeholder, its
 * setup deferred to its first collective outside a group
 * (shim_comm_setup_deferred): its init may still be running.
 */
enum comm_deferred {
    DEFER_NONE = 0, /* set up (or never to be): route as the state says */
    DEFER_SETUP,    /* the full setup runs at the first collective */
    DEFER_DISABLED, /* MSCX_DISABLE or a bad setting: there only the fixed exchange, voting "fall back" */
    DEFER_RUNNING,  /* the setup is running on the thread of the first collective */
};

static pthread_mutex_t free_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void free_fork_init(void)
{
    mscx_fork_protect(&free_lock, MSCX_FORK_SHIM_FREE);
}
static struct shim_comm *free_list;

/* A reference to @p c when it still belongs to @p key. @return 1 when taken. */
SHIM_HOT static int comm_ref(struct shim_comm *c, uintptr_t key)
{
    int n = atomic_load_explicit(&c->refs, memory_order_relaxed);
    do {
        if (n == 0)
            return 0; /* released: being recycled */
    } while (!atomic_compare_exchange_weak_explicit(&c->refs, &n, n + 1, memory_order_acquire,
                                                    memory_order_relaxed));
    if ((uintptr_t)c->comm == key)
        return 1;
    shim_comm_put(c); /* recycled for another communicator meanwhile */
    return 0;
}

SHIM_HOT struct shim_comm *shim_comm_get(ncclComm_t comm)
{
    uintptr_t key = (uintptr_t)comm;
    struct shim_comm *c = key ? shim_table_find(key) : NULL;
    return c && comm_ref(c, key) ? c : NULL;
}

/* A cleared object for a new communicator, its count still 0. */
static struct shim_comm *comm_alloc(void)
{
    pthread_mutex_lock(&free_lock);
    struct shim_comm *c = free_list;
    if (c)
        free_list = c->next_free;
    pthread_mutex_unlock(&free_lock);
    if (!c) {
        /* on a cache line of its own: the fields every call reads share one */
        size_t size = (sizeof(*c) + 63) / 64 * 64;
        c = aligned_alloc(64, size);
        if (c)
            memset(c, 0, size);
        return c;
    }
    /* calls that still hold the old address only ever read the count while it is 0 */
    memset((char *)c + offsetof(struct shim_comm, comm), 0, sizeof(*c) - offsetof(struct shim_comm, comm));
    return c;
}

static void comm_release(struct shim_comm *c)
{
    if (c->stopped) {
        mscx_exec_destroy_deferred(c->exec);
        shim_boot_destroy_deferred(c->bs);
    } else {
        if (c->exec)
            mscx_exec_destroy(c->exec);
        shim_boot_destroy(c->bs);
    }
    free(c->route);
    free(c->exec_id);
    free(c->route_name);
    free((void *)c->route_calls);
    free((void *)c->p2p_sent);
    free((void *)c->p2p_received);
    shim_p2p_agree_close(c->p2p_agree);
    pthread_mutex_lock(&free_lock);
    c->next_free = free_list;
    free_list = c;
    pthread_mutex_unlock(&free_lock);
}

SHIM_HOT void shim_comm_put(struct shim_comm *c)
{
    if (!c)
        return;
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_release) == 1) {
        atomic_thread_fence(memory_order_acquire);
        comm_release(c);
    }
}

/*
 * Publish @p c with the table's reference. A communicator NCCL handed out at
 * the address of one still in the table replaces it: *old_p receives the
 * object replaced, whose table reference the caller must put.
 * @return 0, or -1 when every slot is taken
 */
static int table_insert(struct shim_comm *c, struct shim_comm **old_p)
{
    void *old;
    atomic_store_explicit(&c->refs, 1, memory_order_release);
    if (shim_table_insert((uintptr_t)c->comm, c, &old) != 0) {
        atomic_store_explicit(&c->refs, 0, memory_order_relaxed);
        return -1;
    }
    *old_p = old;
    return 0;
}

/* Unlink; the caller owns the table's reference and must put it. */
static struct shim_comm *table_remove(ncclComm_t comm)
{
    return comm ? shim_table_remove((uintptr_t)comm) : NULL;
}

/* ---- statistics ---- */

SHIM_HOT static void stats_add(struct shim_comm *c, enum mscx_coll coll, uint64_t bytes, enum shim_reason why)
{
    if ((unsigned)coll >= NSTAT_COLL)
        return;
    atomic_fetch_add_explicit(&c->counts[coll][shim_size_bucket(bytes)][why], 1, memory_order_relaxed);
}

/* One more entry of the summary's plans, or one more omitted once they are full. */
static void plan_use_add(struct shim_stats *s, struct shim_plan_use u)
{
    if (s->nplans == SHIM_NSTAT_PLANS)
        s->plans_omitted++;
    else
        s->plans[s->nplans++] = u;
}

/* The plans of @p c that ran calls, named as in the summary. */
static void plans_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    s->nplans = s->plans_omitted = 0;
    for (size_t i = 0; c->route_calls && i < c->nroute; i++) {
        uint64_t n = atomic_load_explicit(&c->route_calls[i], memory_order_relaxed);
        if (n == 0)
            continue;
        const char *path = c->route_name[i], *slash = strrchr(path, '/');
        const char *name = slash ? slash + 1 : path;
        size_t len = strlen(name);
        if (len > 5 && strcmp(name + len - 5, ".json") == 0)
            len -= 5;
        plan_use_add(s, (struct shim_plan_use){
                            .name = name,
                            .name_len = len,
                            .coll = c->route[i].coll,
                            .min_bytes = c->route[i].min_bytes,
                            .max_bytes = c->route[i].max_bytes,
                            .calls = n,
                        });
    }
}

/* The in-place calls at one rank, named "identity" in the summary's plans. */
static void identity_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    for (int k = 0; k < NSTAT_COLL; k++) {
        uint64_t n = atomic_load_explicit(&c->identity_calls[k], memory_order_relaxed);
        if (n > 0)
            plan_use_add(s, (struct shim_plan_use){.name = "identity",
                                                   .name_len = 8,
                                                   .coll = (enum mscx_coll)k,
                                                   .min_bytes = 1,
                                                   .max_bytes = UINT64_MAX,
                                                   .calls = n});
    }
}

static void stats_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    for (int k = 0; k < NSTAT_COLL; k++)
        for (int b = 0; b < SHIM_NBUCKETS; b++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                s->counts[k][b][w] = atomic_load_explicit(&c->counts[k][b][w], memory_order_relaxed);
    plans_snapshot(c, s);
    identity_snapshot(c, s);
}

static void stats_print(const struct shim_comm *c, const struct shim_stats *s, const char *how)
{
    char line[2048];
    size_t at = 0;
    uint64_t routed = 0, fallback = 0;

    uint64_t reasons[SHIM_WHY_COUNT] = {0};
    for (int k = 0; k < NSTAT_COLL; k++) {
        for (int b = 0; b < SHIM_NBUCKETS; b++) {
            uint64_t f = 0, r = s->counts[k][b][SHIM_WHY_ROUTED];
            for (int w = 1; w < SHIM_WHY_COUNT; w++) {
                f += s->counts[k][b][w];
                reasons[w] += s->counts[k][b][w];
            }
            routed += r;
            fallback += f;
            if ((f || r) && at < sizeof(line))
                at += (size_t)snprintf(line + at, sizeof(line) - at, " %s%s routed %llu fallback %llu;",
                                       mscx_coll_name((enum mscx_coll)k), shim_bucket_name(b),
                                       (unsigned long long)r, (unsigned long long)f);
        }
    }
    if (at < sizeof(line))
        at += (size_t)snprintf(line + at, sizeof(line) - at, " reasons:");
    for (int w = 1; w < SHIM_WHY_COUNT; w++)
        if (reasons[w] && at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s %llu",
                                   shim_reason_name((enum shim_reason)w), (unsigned long long)reasons[w]);
    if (s->nplans && at < sizeof(line))
        at += (size_t)snprintf(line + at, sizeof(line) - at, "; plans:");
    for (size_t i = 0; i < s->nplans && at < sizeof(line); i++)
        at += (size_t)snprintf(line + at, sizeof(line) - at, " %.*s %llu", (int)s->plans[i].name_len,
                               s->plans[i].name, (unsigned long long)s->plans[i].calls);
    /* calls sent to NCCL for their size, type or op are ordinary routing: one line, at INFO */
    MSCX_INFO(MSCX_SUB_SHIM, "summary at %s: comm %p rank %u/%u: routed %llu fallback %llu:%s", how,
              (void *)c->comm, c->rank, c->nranks, (unsigned long long)routed, (unsigned long long)fallback,
              line);
}

/* ---- setup ---- */

/*
 * The fixed first exchange of every blocking communicator of more than one
 * rank (see agree()). Its layout never changes size (SHIM_BOOT_FIXED_BYTES);
 * a new field takes reserved bytes and a new magic.
 */
#define AGREE_MAGIC 0x3130474158435345ull /* "ESCXAG01" */

enum agree_field {
    AGREE_VERSION,   /* the library version */
    AGREE_DISABLE,   /* MSCX_DISABLE */
    AGREE_PLANS,     /* the plan set: names and contents of every plan loaded; 0 under MSCX_DISABLE */
    AGREE_PACKET,    /* MSCX_PACKET */
    AGREE_SCRATCH,   /* MSCX_SCRATCH_MAX */
    AGREE_FORCED,    /* MSCX_FORCE_FALLBACK */
    AGREE_TRANSPORT, /* MSCX_TRANSPORT */
    AGREE_VNODES,    /* MSCX_VIRTUAL_NODES */
    AGREE_NFIELD
};

static const char *const agree_names[AGREE_NFIELD] = {
    "the library version", "MSCX_DISABLE",       "the plan set (MSCX_PLAN_DIR and its plans)",
    "MSCX_PACKET",         "MSCX_SCRATCH_MAX",   "MSCX_FORCE_FALLBACK",
    "MSCX_TRANSPORT",      "MSCX_VIRTUAL_NODES",
};

struct agree_record {
    uint64_t magic;
    uint64_t field[AGREE_NFIELD]; /* hashes, enum agree_field */
    uint32_t vote;                /* 1: this rank can route; 0: it falls back */
    uint32_t reserved;
    uint8_t secret[SHIM_SECRET_BYTES]; /* rank 0's is everyone's */
    char host[SHIM_HOSTID_LEN];
    uint8_t pad[SHIM_BOOT_FIXED_BYTES - 16 - 8 * AGREE_NFIELD - SHIM_SECRET_BYTES - SHIM_HOSTID_LEN];
};
_Static_assert(sizeof(struct agree_record) == SHIM_BOOT_FIXED_BYTES, "one size in every version");

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t hash_str(const char *s)
{
    return hash_bytes(0xcbf29ce484222325ull, s ? s : "", s ? strlen(s) + 1 : 1);
}

static uint64_t hash_u64(uint64_t v)
{
    return hash_bytes(0xcbf29ce484222325ull, &v, sizeof(v));
}

/*
 * 1 when this rank must vote "fall back" whatever the others do: the one
 * place a degraded state of this process (MSCX_DISABLE, a bad setting)
 * enters the agreement.
 */
static int rank_degraded(const struct mscx_config *cfg)
{
    return cfg->disable != 0 || mscx_config_degraded();
}

static void agree_fill(struct agree_record *r, const struct mscx_config *cfg, uint32_t rank, uint32_t nranks,
                       uint64_t plan_hash)
{
    memset(r, 0, sizeof(*r));
    r->magic = AGREE_MAGIC;
    r->field[AGREE_VERSION] = hash_str(MSCX_VERSION);
    r->field[AGREE_PLANS] = plan_hash;
    r->field[AGREE_DISABLE] = hash_u64((uint64_t)cfg->disable);
    r->field[AGREE_PACKET] = hash_u64((uint64_t)(int64_t)cfg->packet);
    r->field[AGREE_SCRATCH] = hash_u64(cfg->scratch_max);
    r->field[AGREE_FORCED] = hash_str(cfg->force_fallback);
    r->field[AGREE_TRANSPORT] = hash_str(cfg->transport);
    r->field[AGREE_VNODES] = hash_u64(cfg->virtual_nodes);
    r->vote = !rank_degraded(cfg);
    shim_topo_host_id(rank, nranks, cfg->virtual_nodes, r->host);
}

/*
 * The first field in which some rank differs from rank 0, AGREE_NFIELD for
 * the vote, -1 when all agree. The vote comes before the plan set and the
 * settings: a rank that votes "fall back" read no plans, and its reason is
 * the vote, not the plan set it never loaded.
 */
static int agree_differs(const struct agree_record *all, uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        if (all[r].magic != all[0].magic)
            return AGREE_VERSION;
    for (int f = 0; f < AGREE_NFIELD; f++) {
        for (uint32_t r = 0; f == AGREE_PLANS && r < n; r++)
            if (!all[r].vote)
                return AGREE_NFIELD;
        for (uint32_t r = 1; r < n; r++)
            if (all[r].field[f] != all[0].field[f])
                return f;
    }
    return -1;
}

/* The one warning of a disagreement: which setting, which ranks. */
static void agree_warn(ncclComm_t comm, const struct agree_record *all, uint32_t n, int f)
{
    char ranks[256];
    size_t at = 0;
    unsigned listed = 0;
    for (uint32_t r = 0; r < n && at < sizeof(ranks); r++) {
        int odd = f == AGREE_NFIELD    ? !all[r].vote
                  : f == AGREE_VERSION ? all[r].magic != all[0].magic || all[r].field[f] != all[0].field[f]
                                       : all[r].field[f] != all[0].field[f];
        if (!odd)
            continue;
        if (listed++ == 16) {
            at += (size_t)snprintf(ranks + at, sizeof(ranks) - at, " ...");
            break;
        }
        at += (size_t)snprintf(ranks + at, sizeof(ranks) - at, "%s%u", listed > 1 ? "," : "", r);
    }
    char key[64];
    snprintf(key, sizeof(key), "agree:%d", f);
    if (f == AGREE_NFIELD)
        shim_warn_once(key,
                       "mscx: comm %p of %u ranks: rank(s) %s vote to fall back (MSCX_DISABLE, a bad "
                       "setting or a failed setup there); every rank falls back to NCCL on this communicator",
                       (void *)comm, n, ranks);
    else
        shim_warn_once(key,
                       "mscx: comm %p of %u ranks: rank(s) %s differ from rank 0 in %s; every rank "
                       "falls back to NCCL on this communicator",
                       (void *)comm, n, ranks, agree_names[f]);
}

/* What made this rank vote "fall back": a WARN when nothing said it yet, else INFO. */
static void vote_warn(ncclComm_t comm, uint32_t rank, uint32_t nranks, const char *why, int warn)
{
    if (warn)
        MSCX_WARN("mscx: comm %p rank %u/%u: %s; this rank votes to fall back, and every rank of the "
                  "communicator falls back to NCCL",
                  (void *)comm, rank, nranks, why);
    else
        MSCX_INFO(MSCX_SUB_SHIM, "comm %p rank %u/%u: %s; this rank votes to fall back", (void *)comm, rank,
                  nranks, why);
}

/*
 * The fixed exchange for rank @p rank of @p nranks that has no bootstrap:
 * a "fall back" vote with this process's settings (so that the others see
 * the vote, not a difference), without reading the others' records.
 */
static void vote_only(int prof, ncclComm_t comm, const struct mscx_config *cfg, uint32_t rank,
                      uint32_t nranks, int device)
{
    struct agree_record mine;
    agree_fill(&mine, cfg, rank, nranks, 0);
    mine.vote = 0;
    mscx_status_t st = shim_boot_fixed_vote(comm, prof, rank, nranks, device, &mine);
    if (st != MSCX_OK && st != MSCX_ERR_UNSUPPORTED)
        MSCX_WARN(
            "mscx: comm %p rank %u/%u could not take part in the agreement exchange either (%s); the other "
            "ranks may wait for it",
            (void *)comm, rank, nranks, mscx_status_str(st));
    explicit_bzero(&mine, sizeof(mine));
}

/*
 * The fixed first exchange: every rank of a blocking communicator joins it,
 * whatever its settings, plans or MSCX_DISABLE, so that no rank waits in an
 * exchange another skipped. It carries a hash of each routing-relevant
 * setting, the plan set, the library version, a vote and the host identity;
 * rank 0 adds the connection secret. @p bs is the communicator's bootstrap
 * (NULL with one rank). @return 1 when every rank may go on to route (then
 * *rpn_p and @p secret are set), 0 when all fall back (the same on every rank).
 */
static int agree(ncclComm_t comm, struct mscx_bootstrap *bs, const struct mscx_config *cfg, uint32_t rank,
                 uint32_t nranks, uint64_t plan_hash, uint32_t *rpn_p, uint8_t secret[SHIM_SECRET_BYTES])
{
    struct agree_record mine, *all = NULL;
    char *ids = NULL;
    int ok = 0;
    agree_fill(&mine, cfg, rank, nranks, plan_hash);
    if (rank == 0 && getrandom(mine.secret, sizeof(mine.secret), 0) != (ssize_t)sizeof(mine.secret)) {
        MSCX_WARN("mscx: getrandom for the connection secret failed: %m; this communicator falls back");
        mine.vote = 0;
    }
    if (!shim_boot_fault("agree-alloc")) {
        all = calloc(nranks, sizeof(*all));
        ids = calloc(nranks, SHIM_HOSTID_LEN);
    }
    if (!all || !ids) {
        vote_warn(comm, rank, nranks, "out of memory for the agreement", 1);
        mine.vote = 0;
        if (nranks > 1)
            shim_boot_fixed(bs, &mine, NULL); /* take part all the same; the others' records are not needed */
        goto out;
    }
    if (nranks == 1) {
        all[0] = mine;
    } else {
        mscx_status_t st = shim_boot_fixed(bs, &mine, all);
        if (st != MSCX_OK) {
            MSCX_WARN("mscx: the agreement exchange failed on comm %p: %s; calls go to NCCL", (void *)comm,
                      mscx_status_str(st));
            goto out;
        }
    }
    int f = agree_differs(all, nranks);
    if (f >= 0) {
        int some_vote = 0;
        for (uint32_t r = 0; r < nranks; r++)
            some_vote |= all[r].vote != 0;
        /*
         * No news: all voting "fall back" with equal settings, or this rank's
         * own vote, whose cause (MSCX_DISABLE, a bad setting) it has told.
         */
        if (f != AGREE_NFIELD || (some_vote && all[rank].vote))
            agree_warn(comm, all, nranks, f);
        goto out;
    }
    for (uint32_t r = 0; r < nranks; r++)
        memcpy(ids + (size_t)r * SHIM_HOSTID_LEN, all[r].host, SHIM_HOSTID_LEN);
    *rpn_p = shim_topo_ranks_per_node(ids, nranks);
    memcpy(secret, all[0].secret, SHIM_SECRET_BYTES);
    MSCX_INFO(MSCX_SUB_SHIM, "comm %p: its %u ranks agree on their settings, plan set and version",
              (void *)comm, nranks);
    ok = 1;
out:
    explicit_bzero(&mine, sizeof(mine));
    if (all)
        explicit_bzero(all, (size_t)nranks * sizeof(*all));
    free(all);
    free(ids);
    return ok;
}

/* Strict mode: fail the init after destroying the real comm, as NCCL would have failed it. */
static ncclResult_t strict_fail(int prof, struct shim_comm *c, const char *why)
{
    ncclComm_t comm = c->comm;
    if (shim_table_find((uintptr_t)comm) != c) {
        /* a deferred setup, not yet published: the communicator is the application's and stays on NCCL */
        comm_release(c);
        return shim_err_set(ncclInvalidUsage, "mscx: MSCX_STRICT: %s", why);
    }
    struct shim_comm *t = table_remove(comm);
    shim_comm_put(t);
    shim_fn_ncclCommDestroy_t destroy = SHIM_REAL(prof, ncclCommDestroy);
    if (destroy)
        destroy(comm);
    return shim_err_set(ncclInvalidUsage, "mscx: MSCX_STRICT: %s", why);
}

static int query(int prof, ncclComm_t comm, struct shim_comm *c)
{
    shim_fn_ncclCommCount_t count = SHIM_REAL(prof, ncclCommCount);
    shim_fn_ncclCommUserRank_t user_rank = SHIM_REAL(prof, ncclCommUserRank);
    shim_fn_ncclCommCuDevice_t cu_device = SHIM_REAL(prof, ncclCommCuDevice);
    int n = 0, r = 0, d = 0;
    if (!count || !user_rank || !cu_device || count(comm, &n) != ncclSuccess ||
        user_rank(comm, &r) != ncclSuccess || cu_device(comm, &d) != ncclSuccess || n <= 0)
        return -1;
    c->nranks = (uint32_t)n;
    c->rank = (uint32_t)r;
    c->device = d;
    return 0;
}

/*
 * The executor part of setup: everything here is collective over the comm,
 * entered by every rank because its inputs (the agreed settings and plan
 * set, the rank count, the ranks per node) are the same everywhere.
 */
static ncclResult_t setup_exec(struct shim_comm *c, const struct mscx_config *cfg,
                               const struct shim_plan_entry *plans, size_t nplans)
{
    mscx_status_t st;
    /*
     * From here on every step that can fail on one rank alone is followed by
     * an agreement round (shim_boot_agree), so all ranks take the same
     * decision and none waits in an exchange that a failed rank skipped.
     */
    c->bs->secret = c->secret;
    st = mscx_exec_create(c->bs, c->device, &c->exec);
    if (st != MSCX_OK)
        c->exec = NULL;
    c->exec_error = c->exec ? mscx_exec_error_word(c->exec) : NULL;
    mscx_status_t agreed = shim_boot_agree(c->bs, st == MSCX_OK);
    if (agreed != MSCX_OK) {
        /* a machine without a device is no news; a setup that failed is */
        if (st == MSCX_ERR_UNSUPPORTED && (agreed == MSCX_ERR_UNSUPPORTED || agreed == MSCX_ERR_REMOTE))
            MSCX_INFO(MSCX_SUB_SHIM, "no executor (%s here, %s overall): comm %p stays on NCCL",
                      mscx_status_str(st), mscx_status_str(agreed), (void *)c->comm);
        else
            MSCX_WARN(
                "mscx: the executor setup of comm %p rank %u/%u failed (%s here, %s overall): its calls go "
                "to NCCL",
                (void *)c->comm, c->rank, c->nranks, mscx_status_str(st), mscx_status_str(agreed));
        if (c->exec)
            mscx_exec_destroy(c->exec);
        c->exec = NULL;
        c->exec_error = NULL;
        goto out;
    }
    c->route = calloc(nplans, sizeof(*c->route));
    c->exec_id = calloc(nplans, sizeof(*c->exec_id));
    c->route_name = calloc(nplans, sizeof(*c->route_name));
    c->route_calls = calloc(nplans, sizeof(*c->route_calls));
    if (!c->route || !c->exec_id || !c->route_name || !c->route_calls)
        goto out;
    for (size_t i = 0; i < nplans; i++) {
        const struct shim_plan_entry *e = &plans[i];
        char err[MSCX_PLAN_ERR_LEN] = "";
        char why[MSCX_PLAN_ERR_LEN + 128];
        if (e->route.nranks != c->nranks)
            continue;
        why[0] = '\0';
        if (e->route.ranks_per_node != c->rpn) {
            /* a plan for another node layout: ordinary, as a plan for another rank count is */
            MSCX_INFO(MSCX_SUB_SHIM, "plan %s needs %u ranks per node, comm %p has %u: not used there",
                      e->path, e->route.ranks_per_node, (void *)c->comm, c->rpn);
            continue;
        }
        if (mscx_plan_executable(e->plan, err, sizeof(err)) != MSCX_OK)
            snprintf(why, sizeof(why), "not executable: %s", err);
        if (!why[0]) {
            struct shim_route_plan r = e->route;
            if (r.max_bytes > cfg->scratch_max)
                r.max_bytes = cfg->scratch_max;
            uint64_t rounds = shim_boot_rounds(c->bs);
            st = mscx_exec_add_plan(c->exec, e->plan, r.max_bytes, &c->exec_id[c->nroute]);
            if (st != MSCX_OK && shim_boot_rounds(c->bs) == rounds)
                shim_boot_agree(c->bs, 0); /* stand in for the exchange the other ranks are in */
            agreed = shim_boot_agree(c->bs, st == MSCX_OK);
            if (agreed == MSCX_OK) {
                c->route[c->nroute] = r;
                c->route_name[c->nroute] = e->path;
                c->nroute++;
                continue;
            }
            if (st != MSCX_OK)
                snprintf(why, sizeof(why), "the executor refused it: %s", mscx_status_str(st));
            else
                snprintf(why, sizeof(why), "another rank could not add it");
        }
        char key[1200];
        snprintf(key, sizeof(key), "%s:%u", e->path, c->nranks);
        shim_warn_once(key, "mscx: plan %s does not fit comm of %u ranks: %s; its calls go to NCCL", e->path,
                       c->nranks, why);
        if (cfg->strict)
            return shim_err_set(ncclInvalidUsage, "plan %s: %s", e->path, why);
    }
out:
    return ncclSuccess;
}

/*
 * MSCX_DISABLE=1 or a bad setting: no state and no routing, but a blocking communicator of
 * several ranks still joins the fixed exchange, voting "fall back", so that
 * ranks where the shim is enabled do not wait for this one.
 */
static void disabled_setup(int prof, ncclComm_t comm, const struct mscx_config *cfg)
{
    struct shim_comm probe;
    struct mscx_bootstrap *bs = NULL;
    uint32_t rpn;
    uint8_t secret[SHIM_SECRET_BYTES];

    memset(&probe, 0, sizeof(probe));
    if (query(prof, comm, &probe) != 0 || probe.nranks < 2)
        return;
    if (shim_boot_create(comm, prof, probe.rank, probe.nranks, probe.device, &bs) != MSCX_OK) {
        vote_only(prof, comm, cfg, probe.rank, probe.nranks, probe.device);
        return;
    }
    agree(comm, bs, cfg, probe.rank, probe.nranks, 0, &rpn, secret); /* no plans read under MSCX_DISABLE */
    explicit_bzero(secret, sizeof(secret));
    shim_boot_destroy(bs);
}

/*
 * A rank of a blocking communicator whose setup failed locally (@p why)
 * before the fixed exchange: it still joins the exchange, voting "fall
 * back", so that every rank falls back together and none waits for it.
 * @p warn: whether @p why is news (a WARN), or was warned of already.
 */
static void vote_fall_back(int prof, ncclComm_t comm, const struct mscx_config *cfg, const char *why,
                           int warn)
{
    struct shim_comm probe;
    memset(&probe, 0, sizeof(probe));
    if (query(prof, comm, &probe) != 0 || probe.nranks < 2)
        return;
    vote_warn(comm, probe.rank, probe.nranks, why, warn);
    vote_only(prof, comm, cfg, probe.rank, probe.nranks, probe.device);
}

/* A cleared object for @p comm with its settings, not yet published. NULL without memory. */
static struct shim_comm *comm_new(int prof, ncclComm_t comm, const char *how, const struct mscx_config *cfg)
{
    struct shim_comm *c = shim_boot_fault("comm-alloc") ? NULL : comm_alloc();
    if (!c)
        return NULL; /* no state: calls go to NCCL */
    c->comm = comm;
    c->prof = prof;
    c->how = how;
    if (cfg && shim_parse_forced(cfg->force_fallback, &c->forced) != 0) {
        shim_warn_once("force-fallback",
                       "mscx: bad MSCX_FORCE_FALLBACK '%s': expected a comma list of allreduce, "
                       "allgather, reducescatter, alltoall, broadcast or all; everything falls back",
                       cfg->force_fallback);
        c->forced = ~0u;
    }
    return c;
}

/* Publish @p c with the table's reference. @return 0, or -1 when the table is full (@p c released). */
static int comm_publish(struct shim_comm *c)
{
    struct shim_comm *old;
    if (shim_boot_fault("table") || table_insert(c, &old) != 0) {
        shim_warn_once("comm-table",
                       "mscx: more than %u communicators at once; the next ones stay on NCCL "
                       "without routing statistics",
                       SHIM_TABLE_SIZE);
        comm_release(c);
        return -1;
    }
    shim_comm_put(old); /* state of a communicator NCCL freed without us seeing it, or a placeholder */
    return 0;
}

/*
 * Count the sends and recvs of @p c when a group of them may become an
 * AlltoAll: its count starts with the communicator, it has an executor and
 * an AlltoAll plan, and its ranks share this host (their agreement is in
 * shared memory). The same on every rank but the count's start.
 */
static void p2p_track(struct shim_comm *c)
{
    if (!c->p2p_counted || !c->exec || c->win[MSCX_COLL_ALLTOALL].nplans == 0)
        return;
    if (c->nranks > 1 && (c->rpn != c->nranks || c->nranks > SHIM_P2P_AGREE_MAX_RANKS))
        return;
    c->p2p_sent = calloc(c->nranks, sizeof(*c->p2p_sent));
    c->p2p_received = calloc(c->nranks, sizeof(*c->p2p_received));
    if (!c->p2p_sent || !c->p2p_received) {
        free((void *)c->p2p_sent);
        free((void *)c->p2p_received);
        c->p2p_sent = c->p2p_received = NULL;
        return;
    }
    pthread_mutex_init(&c->p2p_lock, NULL);
}

/*
 * The setup of @p c (from comm_new()): the plans, the fixed exchange when
 * @p exchange, the executor, the routing windows. @p stop (NULL: none) ends
 * a wait of the exchanges for a non-blocking NCCL call when it becomes
 * non-zero. @return ncclSuccess, or an error (strict mode) after which
 * @p c is released
 */
static ncclResult_t comm_build(struct shim_comm *c, const struct mscx_config *cfg, int exchange,
                               const int *stop)
{
    int prof = c->prof;
    ncclComm_t comm = c->comm;
    const struct shim_plan_entry *plans;
    size_t nplans, nfailed;
    uint64_t hash;
    shim_plans_get(&plans, &nplans, &nfailed, &hash);
    size_t ncand = 0;
    int queried = query(prof, comm, c) == 0;
    for (size_t i = 0; queried && i < nplans; i++)
        ncand += plans[i].route.nranks == c->nranks;
    /*
     * Queried, with an exchange: the fixed exchange, on every rank alike (a
     * rank without a bootstrap is one without a device, the same
     * everywhere). A rank alone has nobody to disagree with, and needs a
     * bootstrap only for the executor.
     */
    int agreed = 0;
    if (exchange && queried && (c->nranks > 1 || ncand)) {
        mscx_status_t st = shim_boot_create(c->comm, prof, c->rank, c->nranks, c->device, &c->bs);
        if (st == MSCX_ERR_UNSUPPORTED) {
            MSCX_INFO(MSCX_SUB_SHIM, "no bootstrap (%s): comm %p stays on NCCL", mscx_status_str(st),
                      (void *)comm);
        } else if (st != MSCX_OK) {
            char why[96];
            snprintf(why, sizeof(why), "its bootstrap could not be set up (%s)", mscx_status_str(st));
            vote_warn(comm, c->rank, c->nranks, why, 1);
            if (c->nranks > 1)
                vote_only(prof, comm, cfg, c->rank, c->nranks, c->device);
        } else {
            shim_boot_watch(c->bs, stop);
            agreed = agree(comm, c->bs, cfg, c->rank, c->nranks, hash, &c->rpn, c->secret);
        }
    }
    if (cfg->strict && nfailed)
        return strict_fail(prof, c, "a plan failed to load (see the warning naming it)");
    if (agreed && ncand) {
        ncclResult_t r = setup_exec(c, cfg, plans, nplans);
        if (r != ncclSuccess) {
            char why[1100];
            snprintf(why, sizeof(why), "%s", shim_err_text());
            return strict_fail(prof, c, why);
        }
    } else if (ncand && !exchange) {
        MSCX_INFO(MSCX_SUB_SHIM, "comm %p created %s: no exchange there, its calls go to NCCL", (void *)comm,
                  c->how);
    }
    if (!c->exec && c->bs) {
        shim_boot_destroy(c->bs); /* nothing left to exchange */
        c->bs = NULL;
    }
    for (int k = 0; k < MSCX_COLL_COUNT; k++)
        shim_route_window_init(&c->win[k], c->route, c->nroute, (enum mscx_coll)k, c->nranks, c->rpn);
    p2p_track(c);
    shim_summary_note_comm(c->rank, c->nranks);
    MSCX_INFO(MSCX_SUB_SHIM,
              "mscx %s comm %p (%s) rank %u/%u ranks/node %u: real NCCL %s version %d (shim built "
              "on nccl.h %d); %zu plans from %s, %zu usable here%s",
              MSCX_VERSION, (void *)comm, c->how, c->rank, c->nranks, c->rpn, shim_real_path(),
              shim_real_version(), NCCL_VERSION_CODE, nplans, shim_plans_dir(), c->nroute,
              c->exec ? "" : " (no executor: NCCL only)");
    return ncclSuccess;
}

static ncclResult_t comm_setup(int prof, ncclComm_t comm, const char *how, int exchange)
{
    const struct mscx_config *cfg = shim_config(), *lenient = shim_config_lenient();
    if (!lenient || !comm)
        return ncclSuccess;
    if (!cfg || cfg->disable) {
        /* disabled or degraded (a bad setting): no state; the agreement is joined with a "fall back" vote */
        if (exchange)
            disabled_setup(prof, comm, lenient);
        return ncclSuccess;
    }
    struct shim_comm *c = comm_new(prof, comm, how, cfg);
    if (!c) {
        if (exchange)
            vote_fall_back(prof, comm, cfg, "out of memory for its state", 1);
        return ncclSuccess;
    }
    c->p2p_counted = exchange; /* set up at its init: no send or recv can have come before */
    if (comm_publish(c) != 0) {
        if (exchange)
            vote_fall_back(prof, comm, cfg, "the communicator table is full", 0);
        return ncclSuccess;
    }
    return comm_build(c, cfg, exchange, NULL);
}

ncclResult_t shim_comm_setup(int prof, ncclComm_t comm, const char *how)
{
    return comm_setup(prof, comm, how, 1);
}

ncclResult_t shim_comm_setup_nonblocking(int prof, ncclComm_t comm, const char *how)
{
    return comm_setup(prof, comm, how, 0);
}

/* ---- non-blocking communicators: the setup at the first collective ---- */

/* Set once a placeholder under MSCX_DISABLE or a bad setting exists: their collectives then look it up. */
static atomic_int deferred_disabled;

int shim_comm_deferred_disabled(void)
{
    return atomic_load_explicit(&deferred_disabled, memory_order_relaxed);
}

ncclResult_t shim_comm_defer_setup(int prof, ncclComm_t comm, const char *how)
{
    const struct mscx_config *cfg = shim_config();
    if (!shim_config_lenient() || !comm)
        return ncclSuccess;
    int disabled = !cfg || cfg->disable;
    struct shim_comm *c = comm_new(prof, comm, how, cfg);
    if (!c)
        return ncclSuccess;
    atomic_store_explicit(&c->deferred, disabled ? DEFER_DISABLED : DEFER_SETUP, memory_order_relaxed);
    if (disabled)
        atomic_store_explicit(&deferred_disabled, 1, memory_order_relaxed);
    if (comm_publish(c) == 0)
        MSCX_INFO(MSCX_SUB_SHIM,
                  "comm %p created %s is non-blocking: its setup runs at its first collective "
                  "outside a group",
                  (void *)comm, how);
    return ncclSuccess;
}

/* @return 1 when the real init of @p p's communicator has completed; else says why not, at INFO. */
static int init_completed(const struct shim_comm *p)
{
    shim_fn_ncclCommGetAsyncError_t gae = SHIM_REAL(p->prof, ncclCommGetAsyncError);
    ncclResult_t async = ncclInProgress, r = gae ? gae(p->comm, &async) : ncclSystemError;
    if (r == ncclSuccess && async == ncclSuccess)
        return 1;
    shim_err_clear();
    MSCX_INFO(MSCX_SUB_SHIM,
              "comm %p created %s: its init had not completed at its first collective "
              "(ncclCommGetAsyncError: %d, %d); it stays on NCCL",
              (void *)p->comm, p->how, (int)r, (int)async);
    return 0;
}

/* Unlink placeholder @p p, if still linked, and drop the call's reference. */
static void placeholder_drop(struct shim_comm *p)
{
    struct shim_comm *t = table_remove(p->comm);
    void *old = NULL;
    if (t == p)
        shim_comm_put(t);
    else if (t)
        shim_table_insert((uintptr_t)t->comm, t, &old); /* not ours to unlink */
    shim_comm_put(p);
}

static void stats_copy(struct shim_comm *to, const struct shim_comm *from)
{
    for (int k = 0; k < NSTAT_COLL; k++)
        for (int b = 0; b < SHIM_NBUCKETS; b++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                atomic_store_explicit(&to->counts[k][b][w],
                                      atomic_load_explicit(&from->counts[k][b][w], memory_order_relaxed),
                                      memory_order_relaxed);
}

static int comm_stopped(const struct shim_comm *c)
{
    return __atomic_load_n(&c->stopped, __ATOMIC_ACQUIRE);
}

/*
 * The full setup of placeholder @p p, on this thread, in place of it: the
 * new state is published only once complete, so that a concurrent
 * ncclCommGetAsyncError (a watchdog thread) never reads it half made.
 * @return the new state referenced, or NULL (the call goes to NCCL)
 */
static struct shim_comm *deferred_build(struct shim_comm *p)
{
    const struct mscx_config *cfg = shim_config();
    struct shim_comm *c = cfg ? comm_new(p->prof, p->comm, p->how, cfg) : NULL;
    if (!c) {
        if (cfg)
            vote_fall_back(p->prof, p->comm, cfg, "out of memory for its state", 1);
        return NULL;
    }
    if (comm_build(c, cfg, 1, &p->stopped) != ncclSuccess) {
        MSCX_WARN("%s; comm %p stays on NCCL", shim_err_text(), (void *)p->comm);
        shim_err_clear();
        return NULL;
    }
    if (c->bs)
        shim_boot_watch(c->bs, &c->stopped); /* from now on its own: @p p is recycled */
    stats_copy(c, p);
    if (comm_stopped(p)) {
        c->stopped = 1; /* aborted meanwhile: nothing of it may wait on the device */
        comm_release(c);
        return NULL;
    }
    if (comm_publish(c) != 0)
        return NULL;
    shim_err_clear(); /* what the setup met is logged; this call's answer is its own */
    if (comm_stopped(p)) {
        shim_comm_stop_finish(shim_comm_stop(p->comm), "abort"); /* aborted while being published */
        return NULL;
    }
    return shim_comm_get(p->comm);
}

struct shim_comm *shim_comm_setup_deferred(struct shim_comm *p)
{
    int kind = atomic_load_explicit(&p->deferred, memory_order_relaxed);
    if (kind == DEFER_RUNNING || shim_group_depth() > 0 ||
        !atomic_compare_exchange_strong_explicit(&p->deferred, &kind, DEFER_RUNNING, memory_order_relaxed,
                                                 memory_order_relaxed)) {
        if (kind != DEFER_DISABLED)
            return p; /* no executor yet: this call goes to NCCL, counted */
        shim_comm_put(p);
        return NULL;
    }
    if (!init_completed(p)) {
        atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
        if (kind != DEFER_DISABLED)
            return p;
        placeholder_drop(p);
        return NULL;
    }
    if (kind == DEFER_DISABLED) {
        const struct mscx_config *lenient = shim_config_lenient();
        if (lenient)
            disabled_setup(p->prof, p->comm, lenient);
        atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
        placeholder_drop(p);
        return NULL;
    }
    struct shim_comm *c = deferred_build(p);
    atomic_store_explicit(&p->deferred, DEFER_NONE, memory_order_relaxed);
    if (!c)
        return p; /* the placeholder serves for statistics */
    shim_comm_put(p);
    return c;
}

/* ---- several communicators created together on one thread ---- */

/* Holds every setup thread until all exist: none may start an exchange a missing one would never join. */
struct several_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go; /* 0: wait; 1: set up with the exchange; -1: without (a thread could not start) */
};

struct several_one {
    struct several_gate *gate;
    int prof;
    ncclComm_t comm;
    const char *how;
    ncclResult_t res;
    char err[1024];
};

static void *several_main(void *arg)
{
    struct several_one *o = arg;
    struct several_gate *g = o->gate;
    pthread_mutex_lock(&g->mu);
    while (g->go == 0)
        pthread_cond_wait(&g->cv, &g->mu);
    int exchange = g->go > 0;
    pthread_mutex_unlock(&g->mu);
    shim_fn_ncclCommCuDevice_t cu_device = SHIM_REAL(o->prof, ncclCommCuDevice);
    int dev = -1;
    if (exchange && cu_device && cu_device(o->comm, &dev) == ncclSuccess)
        shim_boot_use_device(dev); /* the current device of this thread: the executor's memory, peer access */
    o->res = comm_setup(o->prof, o->comm, o->how, exchange);
    if (o->res != ncclSuccess)
        snprintf(o->err, sizeof(o->err), "%s", shim_err_text());
    return NULL;
}

/* One thread per communicator, then all let go (or all without the exchange). @return the threads started */
static int several_start(struct several_gate *g, struct several_one *one, pthread_t *tid, int n)
{
    int started = 0;
    while (started < n && pthread_create(&tid[started], NULL, several_main, &one[started]) == 0)
        started++;
    pthread_mutex_lock(&g->mu);
    g->go = started == n ? 1 : -1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (started < n)
        MSCX_WARN("mscx: cannot start a setup thread for each of %d communicators created together; "
                  "they stay on NCCL",
                  n);
    return started;
}

/*
 * Several communicators created together on one thread (ncclCommInitAll,
 * or several inits in one group): their exchanges cannot run one after the
 * other on one thread, so each runs in a thread of its own, with the
 * communicator's device current there (the caller's thread and its device
 * are left as they are), and all are joined. Each ends as if set up alone;
 * a failure in one makes it and its peers fall back (the agreement rounds).
 */
ncclResult_t shim_comm_setup_several(int prof, const ncclComm_t *comms, int n, const char *how)
{
    if (n <= 1)
        return n == 1 ? comm_setup(prof, comms[0], how, 1) : ncclSuccess;
    struct several_gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct several_one *one = calloc((size_t)n, sizeof(*one));
    pthread_t *tid = calloc((size_t)n, sizeof(*tid));
    int started = 0;
    for (int i = 0; one && tid && i < n; i++)
        one[i] = (struct several_one){.gate = &g, .prof = prof, .comm = comms[i], .how = how};
    if (one && tid)
        started = several_start(&g, one, tid, n);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n; i++) {
        ncclResult_t r = i < started ? one[i].res : comm_setup(prof, comms[i], how, 0);
        if (r != ncclSuccess && res == ncclSuccess)
            res = i < started ? shim_err_set(r, "%s", one[i].err) : r;
    }
    free(one);
    free(tid);
    return res;
}

/* ---- routing a call ---- */

/* NCCL's own answer to a bad datatype, op or broadcast root of a collective on one of our comms. */
SHIM_HOT static ncclResult_t check_args(const struct shim_comm *c, const struct shim_coll_call *call)
{
    int has_op = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    int bad_root = call->root < 0 || (uint32_t)call->root >= c->nranks;
    if (call->coll == MSCX_COLL_BROADCAST && c->nranks && bad_root)
        return shim_err_set(ncclInvalidArgument,
                            "mscx: %s: invalid root %d (root should be in the 0..%u range)", call->fn,
                            call->root, c->nranks - 1);
    if ((int)call->dtype < 0 || (int)call->dtype >= (int)ncclNumTypes)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid datatype %d", call->fn, (int)call->dtype);
    if (has_op && (int)call->op < 0)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid reduction operation %d", call->fn,
                            (int)call->op);
    return ncclSuccess;
}

/* The routing decision for a call of @p msg bytes: @return the route, or -1 with the reason. */
SHIM_HOT static int decide(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                           enum shim_reason *why_p)
{
    if (!c->exec) {
        *why_p = SHIM_WHY_NO_STATE;
        return -1;
    }
    if (call->config_nccl) { /* the same config on every rank (NCCL's rule for nccl<Coll>Config) */
        *why_p = SHIM_WHY_CONFIG;
        return -1;
    }
    struct shim_route_query q = {
        .coll = call->coll,
        .nranks = c->nranks,
        .ranks_per_node = c->rpn,
        .msg_bytes = msg,
        .dtype = call->dtype,
        .op = call->op,
        .root = call->root,
        .forced_mask = c->forced,
        .group_fallback = shim_group_simulated(),
        .comm = call->comm,
    };
    int pick = (unsigned)call->coll < MSCX_COLL_COUNT
                   ? shim_route_pick_windowed(&q, c->route, c->nroute, &c->win[call->coll], why_p)
                   : shim_route_pick(&q, c->route, c->nroute, why_p);
    /*
     * Buffers in symmetric NCCL windows may take NCCL's symmetric kernels, faster than the NCCL
     * our plans' ranges were measured against: only a plan measured faster than those takes them.
     * A local fact, but rank-uniform as NCCL's own choice of those kernels is: a symmetric window
     * binds every rank to pass such buffers at the same offsets.
     */
    if (pick >= 0 && !c->route[pick].beats_nccl_window && shim_window_covers_call(call)) {
        *why_p = SHIM_WHY_WINDOW;
        return -1;
    }
    return pick;
}

/*
 * Launch a call on route @p pick. Out of line: the fallback path, which
 * never gets here, then saves fewer registers.
 * @return as shim_comm_try_route()
 */
__attribute__((noinline)) static int launch(struct shim_comm *c, const struct shim_coll_call *call,
                                            uint64_t msg, int pick, ncclResult_t *res_p)
{
    if (!call->recvbuf || (!call->sendbuf && call->coll != MSCX_COLL_BROADCAST)) {
        *res_p = shim_err_set(ncclInvalidArgument, "mscx: %s: null buffer with count %zu",
                              mscx_coll_name(call->coll), call->count);
        return 1;
    }
    enum mscx_dtype dt;
    enum mscx_redop op = MSCX_REDOP_SUM;
    struct mscx_scale scale = {MSCX_SCALE_NONE, 0, NULL}; /* ncclAvg, PreMulSum: a scaled sum */
    shim_dtype_map(call->dtype, &dt);
    if ((call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER) &&
        shim_redop_resolve(call->comm, c->nranks, call->op, call->dtype, &op, &scale) != 0) {
        stats_add(c, call->coll, msg, SHIM_WHY_OP); /* its PreMulSum op was destroyed since the decision */
        return 0;
    }
    const struct mscx_config *cfg = shim_config();
    enum mscx_pkt_format pkt = cfg && cfg->packet >= 0 ? (enum mscx_pkt_format)cfg->packet : MSCX_PKT_LL16;
    mscx_status_t st = mscx_exec_launch_scaled(c->exec, c->exec_id[pick], call->sendbuf, call->recvbuf, msg,
                                               dt, op, &scale, pkt, (void *)call->stream);
    if (st == MSCX_OK) {
        stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
        atomic_fetch_add_explicit(&c->route_calls[pick], 1, memory_order_relaxed);
        *res_p = ncclSuccess;
        return 1;
    }
    if (st == MSCX_ERR_INVALID_ARG || st == MSCX_ERR_UNSUPPORTED) {
        /* refused before anything was enqueued: this call goes to NCCL */
        char key[1200];
        snprintf(key, sizeof(key), "launch:%s", c->route_name[pick]);
        shim_warn_once(key, "mscx: plan %s refused a launch of %llu bytes (%s); such calls go to NCCL",
                       c->route_name[pick], (unsigned long long)msg, mscx_status_str(st));
        stats_add(c, call->coll, msg, SHIM_WHY_LAUNCH);
        return 0;
    }
    *res_p = shim_err_set(shim_status_to_nccl(st), "mscx: %s launch failed: %s", mscx_coll_name(call->coll),
                          mscx_status_str(st));
    return 1;
}

/*
 * The sticky error of @p c: once one of its kernels failed (a timeout, an
 * abort, a peer's error), the communicator is broken for good, as an NCCL
 * communicator is after an asynchronous error. One relaxed load once set;
 * before that, one read of the executor's error word (host memory).
 * @return MSCX_OK or the first error
 */
SHIM_HOT static mscx_status_t comm_error(struct shim_comm *c)
{
    int e = atomic_load_explicit(&c->err, memory_order_relaxed);
    if (e != 0 || !c->exec)
        return (mscx_status_t)e;
    if (c->exec_error && *c->exec_error == 0)
        return MSCX_OK;
    mscx_status_t st = mscx_exec_async_error(c->exec);
    if (st == MSCX_OK)
        return MSCX_OK;
    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&c->err, &expected, (int)st, memory_order_relaxed,
                                                memory_order_relaxed))
        MSCX_WARN("mscx: a kernel of comm %p rank %u/%u failed: %s; every later call on it returns an error "
                  "(abort the communicator and create a new one)",
                  (void *)c->comm, c->rank, c->nranks, mscx_status_str(st));
    return (mscx_status_t)atomic_load_explicit(&c->err, memory_order_relaxed);
}

/* The answer to a call on a communicator whose kernel failed, with NCCL's code for the error. */
static ncclResult_t comm_error_result(const struct shim_comm *c, const struct shim_coll_call *call,
                                      mscx_status_t st)
{
    return shim_err_set(shim_status_to_nccl(st),
                        "mscx: %s on comm %p: an earlier mscx kernel of this "
                        "communicator failed (%s); the communicator must be aborted",
                        call->fn, (void *)c->comm, mscx_status_str(st));
}

/*
 * At one rank a collective in place with a built-in operation leaves its
 * buffer as it is: NCCL itself launches nothing for it. When no plan takes
 * such a call because of what it is (its size, datatype, op or root, or no
 * plan of its collective), the shim answers it instead of forwarding it,
 * which costs the caller less than NCCL's own checks. In a group it is no
 * NCCL-bound call: it has no effect to order.
 * Not when the call must go to NCCL (forced, a simulated group, a
 * registered window, a refused launch), not for ncclAvg and PreMulSum ops
 * (NCCL scales, a kernel), and not with a null buffer (NCCL's argument
 * error).
 */
static int identity_serves(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                           enum shim_reason why)
{
    enum mscx_redop op;
    int reduces = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    int plans_lack = why == SHIM_WHY_SIZE || why == SHIM_WHY_NO_PLAN || why == SHIM_WHY_DTYPE ||
                     why == SHIM_WHY_OP || why == SHIM_WHY_ROOT;
    return c->nranks == 1 && plans_lack && msg > 0 && call->recvbuf && call->sendbuf == call->recvbuf &&
           (!reduces || shim_redop_map(call->op, &op) == 0);
}

SHIM_HOT int shim_comm_try_route(const struct shim_coll_call *call, ncclResult_t *res_p)
{
    struct shim_comm *c = shim_comm_get(call->comm);
    if (c && atomic_load_explicit(&c->deferred, memory_order_relaxed))
        c = shim_comm_setup_deferred(c);
    if (!c) {
        if (shim_group_collecting)
            shim_group_before_forward(call->comm); /* a call of the group that is not ours */
        return 0;                                  /* not a communicator we set up: NCCL's alone */
    }
    int answered = 1;
    mscx_status_t failed = comm_error(c);
    if (failed != MSCX_OK) {
        *res_p = comm_error_result(c, call, failed);
    } else if ((*res_p = check_args(c, call)) == ncclSuccess) {
        uint64_t msg = (uint64_t)call->count * shim_dtype_bytes(call->dtype);
        if (call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER ||
            call->coll == MSCX_COLL_ALLTOALL)
            msg *= c->nranks ? c->nranks : 1;
        enum shim_reason why;
        int pick = decide(c, call, msg, &why);
        if (pick >= 0 && shim_group_collecting) {
            *res_p = shim_group_keep(call, c->device); /* launched around the group's end (group.c) */
        } else if (pick >= 0) {
            answered = launch(c, call, msg, pick, res_p);
        } else if (identity_serves(c, call, msg, why)) {
            stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
            if ((unsigned)call->coll < NSTAT_COLL)
                atomic_fetch_add_explicit(&c->identity_calls[call->coll], 1, memory_order_relaxed);
        } else {
            if (shim_group_collecting)
                shim_group_before_forward(call->comm);
            stats_add(c, call->coll, msg, why);
            answered = 0;
        }
    }
    shim_comm_put(c);
    return answered;
}

/* ---- sends and recvs ---- */

/* How long a rank waits for the others' votes on one send/recv group: it waits only under capture. */
#define P2P_VOTE_WAIT_MS 2000

void shim_comm_p2p_count(ncclComm_t comm, int is_send, int peer)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return;
    _Atomic uint64_t *n = is_send ? c->p2p_sent : c->p2p_received;
    if (n && peer >= 0 && (uint32_t)peer < c->nranks)
        atomic_fetch_add_explicit(&n[peer], 1, memory_order_relaxed);
    shim_comm_put(c);
}

int shim_comm_p2p_tracked(ncclComm_t comm, uint32_t *rank_p, uint32_t *nranks_p, int *device_p)
{
    struct shim_comm *c = shim_comm_get(comm);
    int ok = c && c->p2p_sent && !atomic_load_explicit(&c->deferred, memory_order_relaxed);
    if (ok) {
        *rank_p = c->rank;
        *nranks_p = c->nranks;
        *device_p = c->device;
    }
    shim_comm_put(c);
    return ok ? 0 : -1;
}

/* The agreement segment of @p c, opened on first use. NULL when it cannot be. */
static struct shim_p2p_agree *p2p_agreement(struct shim_comm *c)
{
    pthread_mutex_lock(&c->p2p_lock);
    if (!c->p2p_agree) {
        mscx_status_t st = shim_p2p_agree_open(c->secret, c->rank, c->nranks, &c->p2p_agree);
        if (st != MSCX_OK) {
            shim_warn_once("p2p-agree",
                           "mscx: no shared memory for the agreement on send/recv groups (%s); "
                           "such groups go to NCCL",
                           mscx_status_str(st));
            atomic_store_explicit(&c->p2p_gave_up, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&c->p2p_lock);
    return c->p2p_agree;
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The vote of this rank on @p a2a's group. @return 1 when every rank runs it */
static int p2p_vote(struct shim_comm *c, const struct shim_coll_call *a2a, uint64_t msg, int yes)
{
    uint64_t sent[SHIM_P2P_AGREE_MAX_RANKS], received[SHIM_P2P_AGREE_MAX_RANKS];
    for (uint32_t j = 0; j < c->nranks; j++) {
        sent[j] = atomic_load_explicit(&c->p2p_sent[j], memory_order_relaxed);
        received[j] = atomic_load_explicit(&c->p2p_received[j], memory_order_relaxed);
    }
    struct shim_p2p_agree *a = p2p_agreement(c);
    if (!a)
        return 0; /* the others, waiting for this rank's vote, give up in time */
    struct shim_p2p_point pt = {
        .bytes = msg / c->nranks,
        .dtype = (int32_t)a2a->dtype,
        .yes = yes && !c->p2p_gave_up,
        .sent = sent,
        .received = received,
    };
    uint64_t t0 = now_ms();
    int run = shim_p2p_agree_vote(a, &pt, P2P_VOTE_WAIT_MS);
    if (!run && pt.yes && now_ms() - t0 >= P2P_VOTE_WAIT_MS) {
        /* a rank that never votes: stop waiting for it, here and, through this rank's no, everywhere */
        atomic_store_explicit(&c->p2p_gave_up, 1, memory_order_relaxed);
        MSCX_WARN("mscx: comm %p rank %u/%u: a send/recv group waited %d ms for the other ranks' agreement; "
                  "such groups of this communicator go to NCCL from now on",
                  (void *)c->comm, c->rank, c->nranks, P2P_VOTE_WAIT_MS);
    }
    return run;
}

int shim_comm_p2p_agree(const struct shim_coll_call *a2a, int yes)
{
    struct shim_comm *c = shim_comm_get(a2a->comm);
    if (!c)
        return 0;
    int run = 0;
    if (c->p2p_sent) {
        uint64_t msg = (uint64_t)a2a->count * shim_dtype_bytes(a2a->dtype) * c->nranks;
        enum shim_reason why = SHIM_WHY_SENDRECV;
        int pick = decide(c, a2a, msg, &why);
#ifdef SHIM_HAVE_ncclAlltoAll
        /* a launch the executor refuses goes to NCCL's AlltoAll, the same on every rank */
        yes = yes && shim_real_fn(a2a->prof ? SHIM_FN_pncclAlltoAll : SHIM_FN_ncclAlltoAll);
#else
        yes = 0;
#endif
        yes = yes && pick >= 0 && comm_error(c) == MSCX_OK;
        run = c->nranks == 1 ? yes : p2p_vote(c, a2a, msg, yes);
        if (run) {
            for (uint32_t j = 0; j < c->nranks; j++) {
                atomic_fetch_add_explicit(&c->p2p_sent[j], j != c->rank, memory_order_relaxed);
                atomic_fetch_add_explicit(&c->p2p_received[j], j != c->rank, memory_order_relaxed);
            }
        } else {
            stats_add(c, MSCX_COLL_ALLTOALL, msg, pick >= 0 ? SHIM_WHY_SENDRECV : why);
        }
    }
    shim_comm_put(c);
    return run;
}

/* ---- teardown, async errors ---- */

/*
 * An abort, revoke or shrink with NCCL_SHRINK_ABORT comes in two halves
 * around the real call. Before it: unlink (later calls go to NCCL) and set
 * the abort word our kernels poll, so that the real call, which may wait
 * for every kernel on the device, never waits for ours. After it: the
 * summary, and the release, deferred (comm_release): a CUDA free there
 * would wait for kernels that only the application's next abort ends.
 */
struct shim_comm *shim_comm_stop(ncclComm_t comm)
{
    shim_redop_forget_comm(comm);
    shim_window_forget_comm(comm);
    struct shim_comm *c = table_remove(comm);
    if (!c)
        return NULL;
    c->stopped = 1;
    if (c->exec)
        mscx_exec_abort(c->exec);
    return c;
}

void shim_comm_stop_finish(struct shim_comm *c, const char *how)
{
    if (!c)
        return;
    struct shim_stats snap;
    stats_snapshot(c, &snap);
    stats_print(c, &snap, how);
    shim_summary_finish(&snap, c->comm, c->rank, c->nranks, "abort");
    shim_comm_put(c);
}

void shim_comm_teardown(ncclComm_t comm, int abort)
{
    if (abort) {
        shim_comm_stop_finish(shim_comm_stop(comm), "abort");
        return;
    }
    shim_redop_forget_comm(comm);
    shim_window_forget_comm(comm);
    struct shim_comm *c = table_remove(comm);
    if (!c)
        return;
    struct shim_stats snap;
    stats_snapshot(c, &snap);
    stats_print(c, &snap, "destroy");
    shim_summary_finish(&snap, c->comm, c->rank, c->nranks, "destroy");
    shim_comm_put(c);
}

struct json_list {
    char *text;
    size_t len;
};

static void append_json(void *obj, void *ctx)
{
    const struct shim_comm *c = obj;
    struct json_list *l = ctx;
    struct shim_stats snap;
    stats_snapshot(c, &snap);
    char *one = shim_summary_json(&snap, c->comm, c->rank, c->nranks, "exit");
    char *q = one ? realloc(l->text, l->len + strlen(one) + 3) : NULL;
    if (q) {
        l->text = q;
        l->len += (size_t)sprintf(l->text + l->len, "%s%s", l->len ? ",\n" : "", one);
    }
    free(one);
}

/*
 * At exit: the communicators never destroyed. Reads counters only; the
 * table keeps every object it lists, with its reference, while it lists them.
 */
char *shim_comm_live_json(void)
{
    struct json_list l = {NULL, 0};
    shim_table_each(append_json, &l);
    return l.text;
}

ncclResult_t shim_comm_async_error(ncclComm_t comm)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return ncclSuccess;
    mscx_status_t st = comm_error(c);
    shim_comm_put(c);
    return shim_status_to_nccl(st);
}
