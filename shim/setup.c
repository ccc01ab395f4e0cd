/* SPDX-License-Identifier: MIT */
/*
 * The setup of our state beside a new communicator: its rank and device,
 * the fixed exchange (agree.c), the executor and the plans it runs here,
 * and the routing windows. Also the setup of several communicators created
 * together on one thread, each on a thread of its own.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "rendezvous.h"
#include "mscx/env.h"
#include "mscx/log.h"

/* Strict mode: fail the init after destroying the real comm, as NCCL would have failed it. */
static ncclResult_t strict_fail(int prof, struct shim_comm *c, const char *why)
{
    ncclComm_t comm = c->comm;
    if (shim_table_find((uintptr_t)comm) != c) {
        /* a deferred setup, not yet published: the communicator is the application's and stays on NCCL */
        shim_comm_release(c);
        return shim_err_set(ncclInvalidUsage, "mscx: MSCX_STRICT: %s", why);
    }
    struct shim_comm *t = shim_comm_unlink(comm);
    shim_comm_put(t);
    shim_fn_ncclCommDestroy_t destroy = SHIM_REAL(prof, ncclCommDestroy);
    if (destroy)
        destroy(comm);
    return shim_err_set(ncclInvalidUsage, "mscx: MSCX_STRICT: %s", why);
}

int shim_comm_place(int prof, ncclComm_t comm, int *nranks_p, int *rank_p, int *device_p)
{
    shim_fn_ncclCommCount_t count = SHIM_REAL(prof, ncclCommCount);
    shim_fn_ncclCommUserRank_t user_rank = SHIM_REAL(prof, ncclCommUserRank);
    shim_fn_ncclCommCuDevice_t cu_device = SHIM_REAL(prof, ncclCommCuDevice);
    if (!count || !user_rank || !cu_device || count(comm, nranks_p) != ncclSuccess ||
        user_rank(comm, rank_p) != ncclSuccess || cu_device(comm, device_p) != ncclSuccess || *nranks_p <= 0)
        return -1;
    return 0;
}

static int query(int prof, ncclComm_t comm, struct shim_comm *c)
{
    int n = 0, r = 0, d = 0;
    if (shim_comm_place(prof, comm, &n, &r, &d) != 0)
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
void shim_comm_setup_disabled(int prof, ncclComm_t comm, const struct mscx_config *cfg,
                              const struct shim_join *j)
{
    struct shim_comm probe;
    struct mscx_bootstrap *bs = NULL;
    uint32_t rpn;
    uint8_t secret[SHIM_SECRET_BYTES];

    memset(&probe, 0, sizeof(probe));
    if (!j || j->kind == SHIM_JOIN_NONE || query(prof, comm, &probe) != 0 || probe.nranks < 2)
        return;
    if (j->kind == SHIM_JOIN_COMM &&
        shim_boot_create(comm, prof, probe.rank, probe.nranks, probe.device, &bs) != MSCX_OK) {
        shim_join_done(comm, j,
                       shim_agree_vote_only(prof, comm, j, cfg, probe.rank, probe.nranks, probe.device) ==
                           MSCX_OK);
        return;
    }
    /* no plans read under MSCX_DISABLE */
    shim_join_done(comm, j, shim_agree(comm, bs, j, cfg, probe.rank, probe.nranks, 0, &rpn, secret) >= 0);
    explicit_bzero(secret, sizeof(secret));
    if (bs)
        shim_boot_destroy(bs);
}

/*
 * A rank of a blocking communicator whose setup failed locally (@p why)
 * before the fixed exchange: it still joins the exchange, voting "fall
 * back", so that every rank falls back together and none waits for it.
 * @p warn: whether @p why is news (a WARN), or was warned of already.
 */
void shim_comm_vote_fall_back(int prof, ncclComm_t comm, const struct mscx_config *cfg, const char *why,
                              int warn, const struct shim_join *j)
{
    struct shim_comm probe;
    memset(&probe, 0, sizeof(probe));
    if (!j || j->kind == SHIM_JOIN_NONE || query(prof, comm, &probe) != 0 || probe.nranks < 2)
        return;
    shim_agree_vote_warn(comm, probe.rank, probe.nranks, why, warn);
    shim_join_done(
        comm, j, shim_agree_vote_only(prof, comm, j, cfg, probe.rank, probe.nranks, probe.device) == MSCX_OK);
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
 * The setup of @p c (from shim_comm_new()): the plans, the fixed exchange
 * with its ranks meeting as @p j says (NULL: none), the executor, the routing
 * windows. @p stop (NULL: none) ends a wait of the exchanges for a
 * non-blocking NCCL call when it becomes non-zero. @return ncclSuccess, or
 * an error (strict mode) after which @p c is released
 */
ncclResult_t shim_comm_build(struct shim_comm *c, const struct mscx_config *cfg, const struct shim_join *j,
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
    /* a rank alone has nobody to meet, however it was created: its id's listener may go */
    int exchange = j && (j->kind != SHIM_JOIN_NONE || (queried && c->nranks == 1));
    if (j && j->kind == SHIM_JOIN_RDV && queried && c->nranks == 1)
        shim_rdv_release(&j->id);
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
            shim_agree_vote_warn(comm, c->rank, c->nranks, why, 1);
            if (c->nranks > 1)
                shim_join_done(comm, j,
                               shim_agree_vote_only(prof, comm, j, cfg, c->rank, c->nranks, c->device) ==
                                   MSCX_OK);
        } else {
            shim_boot_watch(c->bs, stop);
            agreed = shim_agree(comm, c->bs, j, cfg, c->rank, c->nranks, hash, &c->rpn, c->secret);
            shim_join_done(comm, j, agreed >= 0);
            agreed = agreed > 0;
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
        MSCX_INFO(MSCX_SUB_SHIM, "comm %p created %s: %s; its calls go to NCCL", (void *)comm, c->how,
                  j && j->why ? j->why : "no exchange there");
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

/* The setup of @p comm, its ranks meeting as @p j says (NULL: no exchange, statistics only). */
static ncclResult_t comm_setup(int prof, ncclComm_t comm, const char *how, const struct shim_join *j)
{
    const struct mscx_config *cfg = shim_config(), *lenient = shim_config_lenient();
    if (!lenient || !comm)
        return ncclSuccess;
    if (!cfg || cfg->disable) {
        /* disabled or degraded (a bad setting): no state; the agreement is joined with a "fall back" vote */
        shim_comm_setup_disabled(prof, comm, lenient, j);
        return ncclSuccess;
    }
    struct shim_comm *c = shim_comm_new(prof, comm, how, cfg);
    if (!c) {
        shim_comm_vote_fall_back(prof, comm, cfg, "out of memory for its state", 1, j);
        return ncclSuccess;
    }
    c->p2p_counted = j != NULL; /* set up at its init: no send or recv can have come before */
    if (shim_comm_publish(c) != 0) {
        shim_comm_vote_fall_back(prof, comm, cfg, "the communicator table is full", 0, j);
        return ncclSuccess;
    }
    return shim_comm_build(c, cfg, j, NULL);
}

ncclResult_t shim_comm_setup(int prof, ncclComm_t comm, const char *how, const struct shim_join *j)
{
    return comm_setup(prof, comm, how, j);
}

ncclResult_t shim_comm_setup_nonblocking(int prof, ncclComm_t comm, const char *how)
{
    return comm_setup(prof, comm, how, NULL);
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
    struct shim_join join;
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
    o->res = comm_setup(o->prof, o->comm, o->how, exchange ? &o->join : NULL);
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
ncclResult_t shim_comm_setup_several(int prof, const ncclComm_t *comms, const struct shim_join *joins, int n,
                                     const char *how)
{
    struct shim_join over_comm;
    shim_join_over_comm(&over_comm);
    if (n <= 1)
        return n == 1 ? comm_setup(prof, comms[0], how, joins ? &joins[0] : &over_comm) : ncclSuccess;
    struct several_gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct several_one *one = calloc((size_t)n, sizeof(*one));
    pthread_t *tid = calloc((size_t)n, sizeof(*tid));
    int started = 0;
    for (int i = 0; one && tid && i < n; i++)
        one[i] = (struct several_one){
            .gate = &g, .prof = prof, .comm = comms[i], .join = joins ? joins[i] : over_comm, .how = how};
    if (one && tid)
        started = several_start(&g, one, tid, n);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n; i++) {
        ncclResult_t r = i < started ? one[i].res : comm_setup(prof, comms[i], how, NULL);
        if (r != ncclSuccess && res == ncclSuccess)
            res = i < started ? shim_err_set(r, "%s", one[i].err) : r;
    }
    free(one);
    free(tid);
    return res;
}
