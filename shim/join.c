/* SPDX-License-Identifier: MIT */
/*
 * How the ranks of a new communicator meet for its fixed exchange
 * (agree.c), decided from what every rank sees alike: the unique id they
 * were created with, or the communicator they were made from.
 *
 * A rank that runs without the shim never joins an exchange, so one may run
 * over the communicator only where every rank is known to run the shim. An
 * id made through the shim carries the address of a rendezvous that can
 * tell an absent rank from a late one (rendezvous.c); an id in NCCL's
 * layout without that mark was made by a process without the shim. A
 * communicator whose ranks all took part in an exchange is vouched for, and
 * so are those split, shrunk or resumed from it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/fork.h"
#include "rendezvous.h"
#include "shim_int.h"

/*
 * The vouched communicators: every rank was seen in an exchange. Recording
 * one must not fail on one rank alone (its children would then skip an
 * exchange the others run), so the first VOUCH_FIXED live ones need no
 * allocation; past them a failed allocation is such a rank-local failure.
 */
#define VOUCH_FIXED 1024
static pthread_mutex_t vouch_lock = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t vouched_fixed[VOUCH_FIXED];
static ncclComm_t *vouched = vouched_fixed;
static size_t nvouched, cap_vouched = VOUCH_FIXED;

__attribute__((constructor)) static void vouch_fork_init(void)
{
    mscx_fork_protect(&vouch_lock, MSCX_FORK_SHIM_WARN);
}

static int vouch_find(ncclComm_t comm, size_t *at)
{
    for (size_t i = 0; i < nvouched; i++)
        if (vouched[i] == comm) {
            *at = i;
            return 1;
        }
    return 0;
}

/* Room for one more vouched handle. Called with vouch_lock held. @return 0, or -1 without memory */
static int vouch_room(void)
{
    if (nvouched < cap_vouched)
        return 0;
    size_t cap = 2 * cap_vouched;
    ncclComm_t *v = vouched == vouched_fixed ? malloc(cap * sizeof(*v)) : realloc(vouched, cap * sizeof(*v));
    if (!v)
        return -1;
    if (vouched == vouched_fixed)
        memcpy(v, vouched_fixed, sizeof(vouched_fixed));
    vouched = v;
    cap_vouched = cap;
    return 0;
}

void shim_join_done(ncclComm_t comm, const struct shim_join *j, int complete)
{
    size_t at;
    /* over the communicator every rank entered the exchange, whatever it met there */
    if (j->kind != SHIM_JOIN_COMM && !complete)
        return;
    pthread_mutex_lock(&vouch_lock);
    if (comm && !vouch_find(comm, &at) && vouch_room() == 0)
        vouched[nvouched++] = comm;
    pthread_mutex_unlock(&vouch_lock);
}

void shim_join_forget(ncclComm_t comm)
{
    size_t at;
    pthread_mutex_lock(&vouch_lock);
    if (vouch_find(comm, &at))
        vouched[at] = vouched[--nvouched];
    pthread_mutex_unlock(&vouch_lock);
}

int shim_join_vouched(ncclComm_t comm)
{
    size_t at;
    pthread_mutex_lock(&vouch_lock);
    int v = comm && vouch_find(comm, &at);
    pthread_mutex_unlock(&vouch_lock);
    return v;
}

void shim_join_by_id(struct shim_join *j, const ncclUniqueId *id)
{
    memset(j, 0, sizeof(*j));
    switch (id ? shim_rdv_id_kind(id) : SHIM_RDV_ID_FOREIGN) {
    case SHIM_RDV_ID_MARKED:
        j->kind = SHIM_JOIN_RDV;
        j->id = *id;
        break;
    case SHIM_RDV_ID_BARE:
        j->kind = SHIM_JOIN_NONE;
        j->why =
            "its unique id was made without the shim (or left unmarked), so its ranks may run without it";
        break;
    case SHIM_RDV_ID_FOREIGN:
        j->kind = SHIM_JOIN_COMM; /* not NCCL's layout: an id of the application's own making */
        break;
    }
}

void shim_join_by_parent(struct shim_join *j, ncclComm_t parent)
{
    memset(j, 0, sizeof(*j));
    j->kind = shim_join_vouched(parent) ? SHIM_JOIN_COMM : SHIM_JOIN_NONE;
    if (j->kind == SHIM_JOIN_NONE)
        j->why = "the communicator it comes from was not seen to run the shim on every rank";
}

void shim_join_over_comm(struct shim_join *j)
{
    memset(j, 0, sizeof(*j));
    j->kind = SHIM_JOIN_COMM;
}
