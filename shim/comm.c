/* SPDX-License-Identifier: MIT */
/*
 * Our state beside each real communicator, keyed by the real ncclComm_t in a
 * locked hash table: the executor, the plans usable on this communicator,
 * and the routing statistics printed at destroy.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/exec.h"
#include "mscx/log.h"
#include "shim_int.h"

#ifndef MSCX_VERSION
#define MSCX_VERSION "unknown"
#endif

#define TABLE_SIZE 256
#define NSTAT_COLL SHIM_NSTAT_COLL

struct shim_comm {
    ncclComm_t comm;
    struct shim_comm *next;
    int refs;
    uint32_t rank, nranks, rpn;
    int device;
    unsigned forced;
    struct mscx_bootstrap *bs;
    struct mscx_exec *exec;
    size_t nroute;
    struct shim_route_plan *route;  /* [nroute], priority order */
    uint32_t *exec_id;              /* [nroute] */
    const char **route_name;        /* [nroute] plan paths */
    pthread_mutex_t stats_lock;
    struct shim_stats stats;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_comm *table[TABLE_SIZE];

static size_t slot_of(ncclComm_t comm)
{
    uintptr_t p = (uintptr_t)comm;
    p ^= p >> 17;
    p *= 0x9e3779b97f4a7c15ull;
    return (size_t)(p >> 56) % TABLE_SIZE;
}

struct shim_comm *shim_comm_get(ncclComm_t comm)
{
    if (!comm)
        return NULL;
    pthread_mutex_lock(&table_lock);
    struct shim_comm *c = table[slot_of(comm)];
    while (c && c->comm != comm)
        c = c->next;
    if (c)
        c->refs++;
    pthread_mutex_unlock(&table_lock);
    return c;
}

static void comm_free(struct shim_comm *c)
{
    if (c->exec)
        mscx_exec_destroy(c->exec);
    shim_boot_destroy(c->bs);
    free(c->route);
    free(c->exec_id);
    free(c->route_name);
    pthread_mutex_destroy(&c->stats_lock);
    free(c);
}

void shim_comm_put(struct shim_comm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&table_lock);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&table_lock);
    if (last)
        comm_free(c);
}

static void table_insert(struct shim_comm *c)
{
    pthread_mutex_lock(&table_lock);
    size_t s = slot_of(c->comm);
    c->refs = 1; /* the table's reference */
    c->next = table[s];
    table[s] = c;
    pthread_mutex_unlock(&table_lock);
}

/* Unlink; the caller owns the table's reference and must put it. */
static struct shim_comm *table_remove(ncclComm_t comm)
{
    if (!comm)
        return NULL;
    pthread_mutex_lock(&table_lock);
    struct shim_comm **pp = &table[slot_of(comm)];
    while (*pp && (*pp)->comm != comm)
        pp = &(*pp)->next;
    struct shim_comm *c = *pp;
    if (c)
        *pp = c->next;
    pthread_mutex_unlock(&table_lock);
    return c;
}

/* ---- statistics ---- */

static void stats_add(struct shim_comm *c, enum mscx_coll coll, uint64_t bytes, enum shim_reason why)
{
    if ((unsigned)coll >= NSTAT_COLL)
        return;
    pthread_mutex_lock(&c->stats_lock);
    c->stats.counts[coll][shim_size_bucket(bytes)][why]++;
    pthread_mutex_unlock(&c->stats_lock);
}

static void stats_print(struct shim_comm *c, const char *how)
{
    char line[2048];
    size_t at = 0;
    uint64_t routed = 0, fallback = 0;

    if (!mscx_log_enabled(MSCX_LOG_INFO, MSCX_SUB_SHIM))
        return;
    uint64_t reasons[SHIM_WHY_COUNT] = {0};
    pthread_mutex_lock(&c->stats_lock);
    for (int k = 0; k < NSTAT_COLL; k++) {
        for (int b = 0; b < SHIM_NBUCKETS; b++) {
            uint64_t f = 0, r = c->stats.counts[k][b][SHIM_WHY_ROUTED];
            for (int w = 1; w < SHIM_WHY_COUNT; w++) {
                f += c->stats.counts[k][b][w];
                reasons[w] += c->stats.counts[k][b][w];
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
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s %llu", shim_reason_name((enum shim_reason)w),
                                   (unsigned long long)reasons[w]);
    pthread_mutex_unlock(&c->stats_lock);
    MSCX_INFO(MSCX_SUB_SHIM, "summary at %s: comm %p rank %u/%u: routed %llu fallback %llu:%s", how, (void *)c->comm,
              c->rank, c->nranks, (unsigned long long)routed, (unsigned long long)fallback, line);
}

/* ---- setup ---- */

struct boot_record {
    char host[SHIM_HOSTID_LEN];
    uint64_t plan_hash;
};

/* Strict mode: fail the init after destroying the real comm, as NCCL would have failed it. */
static ncclResult_t strict_fail(int prof, struct shim_comm *c, const char *why)
{
    ncclComm_t comm = c->comm;
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
 * entered by every rank because its inputs (plan set non-empty for this rank
 * count) are the same everywhere.
 */
static ncclResult_t setup_exec(int prof, struct shim_comm *c, const struct mscx_config *cfg,
                               const struct shim_plan_entry *plans, size_t nplans, uint64_t hash)
{
    mscx_status_t st = shim_boot_create(c->comm, prof, c->rank, c->nranks, c->device, &c->bs);
    if (st != MSCX_OK) {
        MSCX_INFO(MSCX_SUB_SHIM, "no bootstrap (%s): comm %p stays on NCCL", mscx_status_str(st), (void *)c->comm);
        return ncclSuccess;
    }
    struct boot_record mine, *all = calloc(c->nranks, sizeof(*all));
    char *ids = calloc(c->nranks, SHIM_HOSTID_LEN);
    if (!all || !ids)
        goto out;
    memset(&mine, 0, sizeof(mine));
    shim_topo_host_id(c->rank, c->nranks, cfg->virtual_nodes, mine.host);
    mine.plan_hash = hash;
    st = c->bs->allgather(c->bs->ctx, &mine, all, sizeof(mine));
    if (st != MSCX_OK) {
        MSCX_WARN("mscx: bootstrap exchange failed on comm %p: %s; calls go to NCCL", (void *)c->comm,
                  mscx_status_str(st));
        goto out;
    }
    for (uint32_t r = 0; r < c->nranks; r++) {
        memcpy(ids + (size_t)r * SHIM_HOSTID_LEN, all[r].host, SHIM_HOSTID_LEN);
        if (all[r].plan_hash != hash) {
            shim_warn_once("plan-hash", "mscx: ranks disagree on the plan set (rank %u hash %016llx, rank %u "
                           "%016llx); every rank falls back to NCCL", c->rank, (unsigned long long)hash, r,
                           (unsigned long long)all[r].plan_hash);
            goto out;
        }
    }
    c->rpn = shim_topo_ranks_per_node(ids, c->nranks);
    /*
     * From here on every step that can fail on one rank alone is followed by
     * an agreement round (shim_boot_agree), so all ranks take the same
     * decision and none waits in an exchange that a failed rank skipped.
     */
    st = mscx_exec_create(c->bs, c->device, &c->exec);
    if (st != MSCX_OK)
        c->exec = NULL;
    mscx_status_t agreed = shim_boot_agree(c->bs, st == MSCX_OK);
    if (agreed != MSCX_OK) {
        MSCX_INFO(MSCX_SUB_SHIM, "no executor (%s here, %s overall): comm %p stays on NCCL", mscx_status_str(st),
                  mscx_status_str(agreed), (void *)c->comm);
        if (c->exec)
            mscx_exec_destroy(c->exec);
        c->exec = NULL;
        goto out;
    }
    c->route = calloc(nplans, sizeof(*c->route));
    c->exec_id = calloc(nplans, sizeof(*c->exec_id));
    c->route_name = calloc(nplans, sizeof(*c->route_name));
    if (!c->route || !c->exec_id || !c->route_name)
        goto out;
    for (size_t i = 0; i < nplans; i++) {
        const struct shim_plan_entry *e = &plans[i];
        char err[MSCX_PLAN_ERR_LEN] = "";
        char why[MSCX_PLAN_ERR_LEN + 128];
        if (e->route.nranks != c->nranks)
            continue;
        why[0] = '\0';
        if (e->route.ranks_per_node != c->rpn)
            snprintf(why, sizeof(why), "needs %u ranks per node, the communicator has %u", e->route.ranks_per_node,
                     c->rpn);
        else if (mscx_plan_executable(e->plan, err, sizeof(err)) != MSCX_OK)
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
        if (cfg->strict) {
            free(all);
            free(ids);
            return shim_err_set(ncclInvalidUsage, "plan %s: %s", e->path, why);
        }
    }
out:
    free(all);
    free(ids);
    return ncclSuccess;
}

static ncclResult_t comm_setup(int prof, ncclComm_t comm, const char *how, int exchange)
{
    const struct mscx_config *cfg = shim_config();
    if (!cfg || cfg->disable || !comm)
        return ncclSuccess;
    struct shim_comm *c = calloc(1, sizeof(*c));
    if (!c)
        return ncclSuccess; /* no state: calls go to NCCL */
    c->comm = comm;
    pthread_mutex_init(&c->stats_lock, NULL);
    if (shim_parse_forced(cfg->force_fallback, &c->forced) != 0) {
        shim_warn_once("force-fallback", "mscx: bad MSCX_FORCE_FALLBACK '%s': expected a comma list of allreduce, "
                       "allgather, reducescatter, broadcast or all; everything falls back", cfg->force_fallback);
        c->forced = ~0u;
    }
    table_insert(c);

    const struct shim_plan_entry *plans;
    size_t nplans, nfailed;
    uint64_t hash;
    shim_plans_get(&plans, &nplans, &nfailed, &hash);
    if (cfg->strict && nfailed)
        return strict_fail(prof, c, "a plan failed to load (see the warning naming it)");
    size_t ncand = 0;
    if (nplans && query(prof, comm, c) == 0)
        for (size_t i = 0; i < nplans; i++)
            ncand += plans[i].route.nranks == c->nranks;
    if (ncand && exchange) {
        ncclResult_t r = setup_exec(prof, c, cfg, plans, nplans, hash);
        if (r != ncclSuccess) {
            char why[1100];
            snprintf(why, sizeof(why), "%s", shim_err_text());
            return strict_fail(prof, c, why);
        }
    } else if (ncand) {
        MSCX_INFO(MSCX_SUB_SHIM, "comm %p created %s: no exchange there, its calls go to NCCL", (void *)comm, how);
    }
    shim_summary_note_comm(c->rank, c->nranks);
    MSCX_INFO(MSCX_SUB_SHIM, "mscx %s comm %p (%s) rank %u/%u ranks/node %u: real NCCL %s version %d; %zu plans "
              "from %s, %zu usable here%s", MSCX_VERSION, (void *)comm, how, c->rank, c->nranks, c->rpn,
              shim_real_path(), shim_real_version(), nplans, shim_plans_dir(), c->nroute,
              c->exec ? "" : " (no executor: NCCL only)");
    return ncclSuccess;
}

ncclResult_t shim_comm_setup(int prof, ncclComm_t comm, const char *how)
{
    return comm_setup(prof, comm, how, 1);
}

ncclResult_t shim_comm_setup_nonblocking(int prof, ncclComm_t comm, const char *how)
{
    return comm_setup(prof, comm, how, 0);
}

/* ---- groups ---- */

static __thread int group_depth;
static __thread ncclComm_t group_pending[64];
static __thread int group_npending;
static __thread int group_overflow;

int shim_group_depth(void)
{
    return group_depth;
}

void shim_group_defer(ncclComm_t comm)
{
    if (group_npending < (int)(sizeof(group_pending) / sizeof(group_pending[0])))
        group_pending[group_npending++] = comm;
    else
        group_overflow = 1;
}

/*
 * After the outermost ncclGroupEnd. One comm created in the group (one GPU
 * per thread, as nccl-tests with MPI) gets the full setup; several comms on
 * one thread cannot run their exchanges one after the other without
 * deadlocking, so they stay on NCCL (documented limitation).
 */
ncclResult_t shim_group_flush(int prof)
{
    int n = group_npending, exchange = n == 1 && !group_overflow;
    ncclResult_t res = ncclSuccess;
    group_npending = 0;
    group_overflow = 0;
    for (int i = 0; i < n; i++) {
        ncclResult_t r = comm_setup(prof, group_pending[i], "in a group", exchange);
        if (r != ncclSuccess && res == ncclSuccess)
            res = r;
    }
    return res;
}

void shim_group_drop(void)
{
    group_npending = 0;
    group_overflow = 0;
}

/* Group depth bookkeeping lives here with the pending list. */
void shim_group_enter(void)
{
    group_depth++;
}

int shim_group_leave(void)
{
    if (group_depth > 0)
        group_depth--;
    return group_depth;
}

/* ---- routing a call ---- */

/* NCCL's own answer to a bad datatype or op of a collective on one of our comms. */
static ncclResult_t check_args(const struct shim_coll_call *call)
{
    int has_op = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    if ((int)call->dtype < 0 || (int)call->dtype >= (int)ncclNumTypes)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid datatype %d", call->fn, (int)call->dtype);
    if (has_op && (int)call->op < 0)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid reduction operation %d", call->fn,
                            (int)call->op);
    return ncclSuccess;
}

int shim_comm_try_route(const struct shim_coll_call *call, ncclResult_t *res_p)
{
    struct shim_comm *c = shim_comm_get(call->comm);
    if (!c)
        return 0; /* not a communicator we set up: NCCL's alone */
    if ((*res_p = check_args(call)) != ncclSuccess) {
        shim_comm_put(c);
        return 1;
    }
    size_t esize = shim_dtype_bytes(call->dtype);
    uint64_t msg = (uint64_t)call->count * esize;
    if (call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER)
        msg *= c->nranks ? c->nranks : 1;
    enum shim_reason why = SHIM_WHY_NO_STATE;
    int pick = -1;
    if (c->exec) {
        struct shim_route_query q = {
            .coll = call->coll, .nranks = c->nranks, .ranks_per_node = c->rpn, .msg_bytes = msg,
            .dtype = call->dtype, .op = call->op, .root = call->root, .forced_mask = c->forced,
            .in_group = shim_group_depth() > 0,
        };
        pick = shim_route_pick(&q, c->route, c->nroute, &why);
    }
    if (pick < 0) {
        stats_add(c, call->coll, msg, why);
        shim_comm_put(c);
        return 0;
    }
    if (!call->recvbuf || (!call->sendbuf && call->coll != MSCX_COLL_BROADCAST)) {
        *res_p = shim_err_set(ncclInvalidArgument, "mscx: %s: null buffer with count %zu",
                              mscx_coll_name(call->coll), call->count);
        shim_comm_put(c);
        return 1;
    }
    enum mscx_dtype dt;
    enum mscx_redop op = MSCX_REDOP_SUM;
    shim_dtype_map(call->dtype, &dt);
    if (call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER)
        shim_redop_map(call->op, &op);
    const struct mscx_config *cfg = shim_config();
    enum mscx_pkt_format pkt = cfg && cfg->packet >= 0 ? (enum mscx_pkt_format)cfg->packet : MSCX_PKT_LL16;
    mscx_status_t st = mscx_exec_launch(c->exec, c->exec_id[pick], call->sendbuf, call->recvbuf, msg, dt, op, pkt,
                                        (void *)call->stream);
    if (st == MSCX_OK) {
        stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
        shim_comm_put(c);
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
        shim_comm_put(c);
        return 0;
    }
    *res_p = shim_err_set(shim_status_to_nccl(st), "mscx: %s launch failed: %s", mscx_coll_name(call->coll),
                          mscx_status_str(st));
    shim_comm_put(c);
    return 1;
}

/* ---- teardown, async errors ---- */

void shim_comm_teardown(ncclComm_t comm, int abort)
{
    struct shim_comm *c = table_remove(comm);
    if (!c)
        return;
    if (abort && c->exec)
        mscx_exec_abort(c->exec);
    stats_print(c, abort ? "abort" : "destroy");
    struct shim_stats snap;
    pthread_mutex_lock(&c->stats_lock);
    snap = c->stats;
    pthread_mutex_unlock(&c->stats_lock);
    shim_summary_finish(&snap, c->comm, c->rank, c->nranks, abort ? "abort" : "destroy");
    shim_comm_put(c);
}

/* At exit: the communicators never destroyed. Reads counters only. */
char *shim_comm_live_json(void)
{
    char *out = NULL;
    size_t len = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t s = 0; s < TABLE_SIZE; s++)
        for (struct shim_comm *c = table[s]; c; c = c->next) {
            struct shim_stats snap;
            pthread_mutex_lock(&c->stats_lock);
            snap = c->stats;
            pthread_mutex_unlock(&c->stats_lock);
            char *obj = shim_summary_json(&snap, c->comm, c->rank, c->nranks, "exit");
            char *q = obj ? realloc(out, len + strlen(obj) + 3) : NULL;
            if (q) {
                out = q;
                len += (size_t)sprintf(out + len, "%s%s", len ? ",\n" : "", obj);
            }
            free(obj);
        }
    pthread_mutex_unlock(&table_lock);
    return out;
}

ncclResult_t shim_comm_async_error(ncclComm_t comm)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return ncclSuccess;
    mscx_status_t st = c->exec ? mscx_exec_async_error(c->exec) : MSCX_OK;
    shim_comm_put(c);
    return shim_status_to_nccl(st);
}
