/* SPDX-License-Identifier: MIT */
/*
 * The fixed first exchange of a blocking communicator: every rank sends a
 * record of hashes of its routing settings, its plan set and the library
 * version, its vote and its host, and every rank decides from the same
 * gathered records whether the communicator routes, and how many of its
 * ranks share a node.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "comm_int.h"
#include "rendezvous.h"
#include "mscx/env.h"
#include "mscx/log.h"

/*
 * The fixed first exchange of every blocking communicator of more than one
 * rank (see shim_agree()). Its layout never changes size (SHIM_BOOT_FIXED_BYTES);
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

static uint64_t hash_str(const char *s)
{
    return shim_fnv1a(SHIM_FNV_BASIS, s ? s : "", s ? strlen(s) + 1 : 1);
}

static uint64_t hash_u64(uint64_t v)
{
    return shim_fnv1a(SHIM_FNV_BASIS, &v, sizeof(v));
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
void shim_agree_vote_warn(ncclComm_t comm, uint32_t rank, uint32_t nranks, const char *why, int warn)
{
    if (warn)
        MSCX_WARN("mscx: comm %p rank %u/%u: %s; this rank votes to fall back, and every rank of the "
                  "communicator falls back to NCCL",
                  (void *)comm, rank, nranks, why);
    else
        MSCX_INFO(MSCX_SUB_SHIM, "comm %p rank %u/%u: %s; this rank votes to fall back", (void *)comm, rank,
                  nranks, why);
}

/* The ranks named in @p a, as "1,3,7 ..." into @p buf. */
static void absent_str(const struct shim_rdv_absent *a, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < a->n && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%u", i ? "," : "", a->rank[i]);
    if (a->count > a->n && at < n)
        snprintf(buf + at, n - at, " and %u more", a->count - a->n);
}

/* The one warning of an exchange that did not complete (@p st) on @p comm. */
static void exchange_warn(ncclComm_t comm, uint32_t nranks, const struct shim_join *j, mscx_status_t st,
                          const struct shim_rdv_absent *absent)
{
    char ranks[160];
    if (j->kind == SHIM_JOIN_RDV && st == MSCX_ERR_REMOTE) {
        absent_str(absent, ranks, sizeof(ranks));
        shim_warn_once("agree:absent",
                       "mscx: comm %p of %u ranks: rank(s) %s did not reach the setup rendezvous in time "
                       "(a process without the shim, or one far behind); every rank falls back to NCCL on "
                       "this communicator",
                       (void *)comm, nranks, ranks);
    } else if (j->kind == SHIM_JOIN_RDV) {
        shim_warn_once("agree:rdv",
                       "mscx: comm %p of %u ranks: the setup rendezvous failed here (%s); every rank falls "
                       "back to NCCL on this communicator",
                       (void *)comm, nranks, mscx_status_str(st));
    } else {
        MSCX_WARN("mscx: the agreement exchange failed on comm %p: %s; calls go to NCCL", (void *)comm,
                  mscx_status_str(st));
    }
}

/*
 * The fixed exchange of @p mine into @p all (NULL: not read), as @p j says:
 * at the id's rendezvous, or over the communicator through @p bs.
 */
static mscx_status_t agree_exchange(const struct shim_join *j, struct mscx_bootstrap *bs, uint32_t rank,
                                    uint32_t nranks, const struct agree_record *mine,
                                    struct agree_record *all, struct shim_rdv_absent *absent)
{
    if (j->kind == SHIM_JOIN_RDV)
        return shim_rdv_gather(&j->id, rank, nranks, mine, sizeof(*mine), all, absent);
    return shim_boot_fixed(bs, mine, all);
}

/*
 * The fixed exchange for rank @p rank of @p nranks that has no bootstrap:
 * a "fall back" vote with this process's settings (so that the others see
 * the vote, not a difference), without reading the others' records.
 * @return MSCX_OK when every rank took part
 */
mscx_status_t shim_agree_vote_only(int prof, ncclComm_t comm, const struct shim_join *j,
                                   const struct mscx_config *cfg, uint32_t rank, uint32_t nranks, int device)
{
    struct agree_record mine;
    struct shim_rdv_absent absent = {0};
    agree_fill(&mine, cfg, rank, nranks, 0);
    mine.vote = 0;
    mscx_status_t st = j->kind == SHIM_JOIN_RDV
                           ? agree_exchange(j, NULL, rank, nranks, &mine, NULL, &absent)
                           : shim_boot_fixed_once(comm, prof, rank, nranks, device, &mine, NULL);
    if (st != MSCX_OK && j->kind == SHIM_JOIN_RDV)
        exchange_warn(comm, nranks, j, st, &absent);
    else if (st != MSCX_OK && st != MSCX_ERR_UNSUPPORTED)
        MSCX_WARN(
            "mscx: comm %p rank %u/%u could not take part in the agreement exchange either (%s); the other "
            "ranks may wait for it",
            (void *)comm, rank, nranks, mscx_status_str(st));
    explicit_bzero(&mine, sizeof(mine));
    return st;
}

/*
 * The fixed first exchange: every rank of a blocking communicator joins it,
 * whatever its settings, plans or MSCX_DISABLE, so that no rank waits in an
 * exchange another skipped. It carries a hash of each routing-relevant
 * setting, the plan set, the library version, a vote and the host identity;
 * rank 0 adds the connection secret. The ranks meet as @p j says; @p bs is
 * the communicator's bootstrap (NULL with one rank, or at a rendezvous).
 * @return 1 when every rank may go on to route (then *rpn_p and @p secret
 * are set), 0 when all fall back (the same on every rank), -1 when the
 * exchange did not complete (some rank may not run the shim).
 */
int shim_agree(ncclComm_t comm, struct mscx_bootstrap *bs, const struct shim_join *j,
               const struct mscx_config *cfg, uint32_t rank, uint32_t nranks, uint64_t plan_hash,
               uint32_t *rpn_p, uint8_t secret[SHIM_SECRET_BYTES])
{
    struct agree_record mine, *all = NULL;
    struct shim_rdv_absent absent = {0};
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
        shim_agree_vote_warn(comm, rank, nranks, "out of memory for the agreement", 1);
        mine.vote = 0;
        /* take part all the same; the others' records are not needed */
        if (nranks > 1 && agree_exchange(j, bs, rank, nranks, &mine, NULL, &absent) != MSCX_OK)
            ok = -1;
        goto out;
    }
    if (nranks == 1) {
        all[0] = mine;
    } else {
        mscx_status_t st = agree_exchange(j, bs, rank, nranks, &mine, all, &absent);
        if (st != MSCX_OK) {
            exchange_warn(comm, nranks, j, st, &absent);
            ok = -1;
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
