/* SPDX-License-Identifier: MIT */
/*
 * How the ranks of a grown communicator meet (ncclCommGrow). Its ranks hold
 * different facts: the new ranks and the parent's root hold the id the
 * root's ncclCommGetUniqueId made, the parent's other ranks only the parent.
 * None of them alone knows that every rank runs the shim, which an exchange
 * over the grown communicator needs. So:
 *
 *   1. The root and the new ranks meet at the id's rendezvous (the id
 *      carries the parent's rank count, so each new rank knows its place).
 *      The root votes "yes" when the parent is vouched for; a new rank that
 *      comes votes "yes". The verdict: every one came and voted yes.
 *   2. Where the parent is vouched for, its ranks exchange one record over
 *      it, in which the root gives the verdict; elsewhere the parent's
 *      ranks other than the root take "no" (the root voted no).
 *   3. Verdict yes: the grown communicator exchanges over itself, as after
 *      ncclCommInitRank; no: every rank leaves it to NCCL.
 *
 * Each step runs on a rank only where every other rank of that step runs it
 * too, from facts they share: the id and its mark (root and new ranks), and
 * whether the parent is vouched for (the parent's ranks). A rank without the
 * shim is absent from the rendezvous, which then answers every rank that
 * came within its bound.
 */
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "rendezvous.h"
#include "shim_int.h"

#define GROW_MAGIC 0x57524724u /* "$GRW" */

/* A rank's record at the grow rendezvous. */
struct grow_vote {
    uint32_t magic;
    uint32_t yes;
};

/* A parent rank's record over the parent. */
struct grow_word {
    uint32_t magic;
    uint32_t is_root;
    uint32_t verdict; /* the root's */
    uint8_t pad[SHIM_BOOT_FIXED_BYTES - 12];
};

void shim_join_grow(struct shim_join *j, int prof, ncclComm_t parent, int nranks, const ncclUniqueId *id,
                    int rank)
{
    memset(j, 0, sizeof(*j));
    j->kind = SHIM_JOIN_GROW;
    j->grow = (struct shim_join_grow){
        .parent = parent, .nranks = nranks, .rank = rank, .has_id = id != NULL, .prof = prof};
    if (id)
        j->id = *id;
}

/* "rank(s) 3,4 (new)" or "the root" for the participants of the rendezvous named in @p a. */
static void absent_names(const struct shim_rdv_absent *a, uint32_t from, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < a->n && at < n; i++) {
        if (a->rank[i] == 0)
            at += (size_t)snprintf(buf + at, n - at, "%sthe parent's root", i ? ", " : "");
        else
            at += (size_t)snprintf(buf + at, n - at, "%snew rank %u", i ? ", " : "", from + a->rank[i] - 1);
    }
    if (a->count > a->n && at < n)
        snprintf(buf + at, n - at, " and %u more", a->count - a->n);
}

/*
 * Step 1 on the root (@p root, voting @p yes) or a new rank. @return the
 * verdict, 1 or 0, the same on every participant that came.
 */
static int rdv_verdict(const struct shim_join *j, int root, int yes)
{
    const struct shim_join_grow *g = &j->grow;
    uint32_t from = shim_rdv_grow_from(&j->id);
    if (from == 0) {
        MSCX_INFO(
            MSCX_SUB_SHIM,
            "ncclCommGrow to %d ranks: its id was not made by ncclCommGetUniqueId through the shim; the "
            "grown communicator stays on NCCL",
            g->nranks);
        return 0;
    }
    if ((int)from >= g->nranks || (!root && (g->rank < (int)from || g->rank >= g->nranks))) {
        /* not the id's grow: the others' rendezvous ends at its bound without this rank */
        MSCX_WARN("mscx: ncclCommGrow to %d ranks (rank %d) with an id for a communicator of %u ranks; the "
                  "grown communicator stays on NCCL",
                  g->nranks, g->rank, from);
        return 0;
    }
    uint32_t n = (uint32_t)g->nranks - from + 1, me = root ? 0 : (uint32_t)g->rank - from + 1;
    struct grow_vote mine = {GROW_MAGIC, (uint32_t)(yes != 0)}, *all = calloc(n, sizeof(*all));
    struct shim_rdv_absent absent = {0};
    if (!all) {
        MSCX_WARN("mscx: ncclCommGrow: out of memory for the setup rendezvous; this rank votes no");
        mine.yes = 0; /* it still comes, so that nobody waits for it */
    }
    mscx_status_t st = shim_rdv_gather(&j->id, me, n, &mine, sizeof(mine), all, &absent);
    int verdict = st == MSCX_OK && all;
    for (uint32_t i = 0; verdict && i < n; i++)
        verdict = all[i].magic == GROW_MAGIC && all[i].yes;
    free(all);
    if (st == MSCX_ERR_REMOTE) {
        char names[200];
        absent_names(&absent, from, names, sizeof(names));
        shim_warn_once("grow:absent",
                       "mscx: ncclCommGrow to %d ranks: %s did not reach the setup rendezvous in time (a "
                       "process without the shim, or one far behind); every rank leaves the grown "
                       "communicator to NCCL",
                       g->nranks, names);
    } else if (st != MSCX_OK) {
        shim_warn_once("grow:rdv",
                       "mscx: ncclCommGrow to %d ranks: the setup rendezvous failed here (%s); every rank "
                       "leaves the grown communicator to NCCL",
                       g->nranks, mscx_status_str(st));
    }
    return verdict;
}

/* The parent's size, this rank in it and its device. @return 1, or 0 (logged) where NCCL does not answer */
static int parent_place(const struct shim_join_grow *g, int *n, int *me, int *device)
{
    if (shim_comm_place(g->prof, g->parent, n, me, device) == 0 && *me >= 0 && *me < *n)
        return 1;
    MSCX_WARN("mscx: ncclCommGrow: the parent communicator %p does not answer its rank and size; this rank "
              "leaves the grown communicator to NCCL",
              (void *)g->parent);
    return 0;
}

/*
 * Step 2 on rank @p me of the vouched parent of @p n ranks: the root gives
 * @p verdict. @return the root's verdict as every parent rank reads it (0
 * where it cannot be read)
 */
static int parent_verdict(const struct shim_join_grow *g, int n, int me, int device, int root, int verdict)
{
    if (n == 1)
        return root && verdict; /* the root is the parent */
    struct grow_word mine = {
        .magic = GROW_MAGIC, .is_root = (uint32_t)(root != 0), .verdict = (uint32_t)(verdict != 0)};
    struct grow_word *all = calloc((size_t)n, sizeof(*all));
    /* without memory for the table this rank still takes part, so that nobody waits for it */
    mscx_status_t st =
        shim_boot_fixed_once(g->parent, g->prof, (uint32_t)me, (uint32_t)n, device, &mine, all);
    int roots = 0, said = 0, read = st == MSCX_OK && all;
    for (int r = 0; read && r < n; r++)
        if (all[r].magic == GROW_MAGIC && all[r].is_root) {
            roots++;
            said = all[r].verdict != 0;
        }
    free(all);
    if (!read) {
        MSCX_WARN("mscx: ncclCommGrow: this rank could not read the exchange over the parent (%s); it leaves "
                  "the grown communicator to NCCL, and the others may wait for it there",
                  st == MSCX_OK ? "out of memory" : mscx_status_str(st));
        return 0;
    }
    if (roots != 1) {
        MSCX_INFO(MSCX_SUB_SHIM,
                  "ncclCommGrow: %d of the parent's ranks passed the id; the grown communicator "
                  "stays on NCCL",
                  roots);
        return 0;
    }
    return said;
}

void shim_join_resolve(struct shim_join *j)
{
    if (j->kind != SHIM_JOIN_GROW)
        return;
    const struct shim_join_grow g = j->grow;
    int verdict;
    if (g.nranks <= 1) {
        /* one rank: nobody to meet */
        if (g.has_id)
            shim_rdv_release(&j->id);
        verdict = 1;
    } else if (!g.parent) {
        verdict = g.has_id && rdv_verdict(j, 0, 1);
    } else {
        /* the parent's ranks: the root votes yes for a vouched parent the id was made for */
        int n = 0, me = 0, device = -1, vouched = shim_join_vouched(g.parent);
        int placed = parent_place(&g, &n, &me, &device);
        int yes = vouched && placed && (uint32_t)n == shim_rdv_grow_from(&j->id);
        verdict = g.has_id ? rdv_verdict(j, 1, yes) : 0;
        /* a parent not vouched for: the root voted no, and its other ranks know no more */
        verdict = vouched && placed && parent_verdict(&g, n, me, device, g.has_id, verdict);
    }
    memset(j, 0, sizeof(*j));
    if (verdict) {
        j->kind = SHIM_JOIN_COMM;
    } else {
        j->kind = SHIM_JOIN_NONE;
        j->why = "its ranks were not all seen to run the shim when it grew";
    }
}
