/* SPDX-License-Identifier: MIT */
/*
 * The setup rendezvous (rendezvous.c): a TCP exchange keyed by the NCCL
 * unique id, which can time out and can tell a rank that never comes (it
 * runs without the shim) from one that is late.
 *
 * ncclGetUniqueId's intercept marks the id: it starts a listener in the
 * calling process and writes the listener's address and a random nonce into
 * the last SHIM_RDV_MARK_BYTES of the id, which NCCL leaves zero and never
 * reads. Each rank later sends its record to that listener; the listener
 * answers every rank with the full table, or, when the bound passes first,
 * with "fall back" and the ranks that never came.
 */
#ifndef MSCX_SHIM_RENDEZVOUS_H
#define MSCX_SHIM_RENDEZVOUS_H
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#include "mscx/env.h"
#include "mscx/status.h"

/** Bytes at the end of the id that hold the marker. */
#define SHIM_RDV_MARK_BYTES 64
/** The bound on the wait for every rank without MSCX_TIMEOUT_MS, in ms from the first rank's arrival. */
#define SHIM_RDV_DEFAULT_BOUND_MS 10000u
/** Absent ranks named in a "fall back" answer (the count covers them all). */
#define SHIM_RDV_ABSENT_MAX 16

/** The ranks that never came, on MSCX_ERR_REMOTE. */
struct shim_rdv_absent {
    uint32_t count;                     /* every absent rank */
    uint32_t n;                         /* the entries of rank[] set: min(count, SHIM_RDV_ABSENT_MAX) */
    uint32_t rank[SHIM_RDV_ABSENT_MAX]; /* the lowest absent ranks, ascending */
};

/**
 * The bound for this process's settings: SHIM_RDV_DEFAULT_BOUND_MS, or
 * MSCX_TIMEOUT_MS where it is set and larger. @p cfg may be NULL.
 */
uint32_t shim_rdv_bound_ms(const struct mscx_config *cfg);

/**
 * Mark @p id (filled by NCCL's ncclGetUniqueId, or by ncclCommGetUniqueId
 * for a communicator of @p grow_from ranks; 0 for the former) for the
 * rendezvous: start a listener on the IP address of NCCL's bootstrap handle
 * in the id (port chosen by the system) that waits @p bound_ms after the
 * first rank's arrival, and write its address, a nonce and @p grow_from
 * into the id's tail.
 * @return MSCX_OK; otherwise the id is unchanged (and an INFO says why):
 * MSCX_ERR_UNSUPPORTED (the handle's address is neither IPv4 nor IPv6, or the
 * tail is not zero), MSCX_ERR_SYSTEM (no listener), MSCX_ERR_INVALID_ARG.
 */
mscx_status_t shim_rdv_mark(ncclUniqueId *id, uint32_t bound_ms, uint32_t grow_from);

/**
 * @p id (marked by this process) serves a communicator of one rank, which
 * gathers nothing: its listener exits now rather than after an idle hour.
 * Does nothing for an id marked elsewhere or not at all.
 */
void shim_rdv_release(const ncclUniqueId *id);

/** 1 when @p id carries a marker. */
int shim_rdv_marked(const ncclUniqueId *id);

/** The rank count of the communicator a marked grow id extends; 0 for any other id. */
uint32_t shim_rdv_grow_from(const ncclUniqueId *id);

/** What an id tells of the process that made it. */
enum shim_rdv_id {
    SHIM_RDV_ID_MARKED,  /* made through the shim: its ranks meet at the rendezvous */
    SHIM_RDV_ID_BARE,    /* NCCL's layout, its tail empty: made without the shim, or left unmarked */
    SHIM_RDV_ID_FOREIGN, /* another layout (a tail in use, no socket address): it tells nothing */
};

/** The kind of @p id (not NULL). */
enum shim_rdv_id shim_rdv_id_kind(const ncclUniqueId *id);

/**
 * Rank @p rank of @p nranks gathers every rank's @p bytes from @p mine into
 * @p all ([nranks][bytes], rank order; NULL: the table is read and dropped,
 * for a rank that votes "fall back") through the listener named in @p id.
 * Waits at most about twice the marker's bound. @return MSCX_OK (@p all
 * filled where given, the same bytes on every rank), MSCX_ERR_REMOTE (some ranks never
 * came within the bound: every rank that came gets this answer, with
 * *@p absent set when not NULL), MSCX_ERR_UNSUPPORTED (no marker in the id:
 * at once, nothing sent), MSCX_ERR_INVALID_ARG, MSCX_ERR_NO_MEMORY, or
 * MSCX_ERR_SYSTEM / MSCX_ERR_TIMEOUT (the listener could not be reached or
 * gave no valid answer in time).
 */
mscx_status_t shim_rdv_gather(const ncclUniqueId *id, uint32_t rank, uint32_t nranks, const void *mine,
                              size_t bytes, void *all, struct shim_rdv_absent *absent);

#endif /* MSCX_SHIM_RENDEZVOUS_H */
