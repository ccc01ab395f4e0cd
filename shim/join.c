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

#include "rendezvous.h"
#include "shim_int.h"

/* The vouched communicators: every rank was seen in an exchange. */
static pthread_mutex_t vouch_lock = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t *vouched;
static size_t nvouched, cap_vouched;

static int vouch_find(ncclComm_t comm, size_t *at)
{
    for (size_t i = 0; i < nvouched; i++)
        if (vouched[i] == comm) {
            *at = i;
            return 1;
        }
    return 0;
}

void shim_join_vouch(ncclComm_t comm)
{
    size_t at;
    pthread_mutex_lock(&vouch_lock);
    if (comm && !vouch_find(comm, &at)) {
        if (nvouched == cap_vouched) {
            size_t cap = cap_vouched ? 2 * cap_vouched : 16;
            ncclComm_t *v = realloc(vouched, cap * sizeof(*v));
            if (v) {
                vouched = v;
                cap_vouched = cap;
            }
        }
        if (nvouched < cap_vouched) /* without memory its children go to NCCL: the same on every rank */
            vouched[nvouched++] = comm;
    }
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

static int is_vouched(ncclComm_t comm)
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
    j->kind = is_vouched(parent) ? SHIM_JOIN_COMM : SHIM_JOIN_NONE;
    if (j->kind == SHIM_JOIN_NONE)
        j->why = "the communicator it comes from was not seen to run the shim on every rank";
}

void shim_join_over_comm(struct shim_join *j)
{
    memset(j, 0, sizeof(*j));
    j->kind = SHIM_JOIN_COMM;
}
