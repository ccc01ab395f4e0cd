/* SPDX-License-Identifier: MIT */
/*
 * Per-launch slot exchange between the processes of one node, in POSIX
 * shared memory (no CUDA here; peer_buffers.c puts CUDA IPC handles of user
 * buffers in the payloads). Each rank owns one small segment that it creates
 * and writes; peers map it and only read it. A segment holds two entries,
 * indexed by the parity of the launch sequence number, each with:
 *   - a publication: status and payload, then pub_seq (release);
 *   - a verdict: this rank's outcome of the launch, then verdict_seq (release).
 * Readers wait (bounded) for pub_seq or verdict_seq to equal the launch's
 * sequence number (acquire), so an entry of an earlier launch is never taken.
 *
 * Two entries suffice because every launch ends with mscx_slots_agree over all
 * ranks of the exchange: a rank can publish launch s + 2 (overwriting s's
 * entry) only after every rank posted its verdict of s + 1, which each posts
 * only after it finished reading everything of launch s.
 */
#ifndef MSCX_SHM_SLOTS_H
#define MSCX_SHM_SLOTS_H

#include <stddef.h>
#include <stdint.h>
#include "mscx/status.h"

#define MSCX_SLOTS_NAME_MAX 64
#define MSCX_SLOTS_PAYLOAD_MAX 512

struct mscx_slots;

/* Bounds of every wait. */
struct mscx_slots_limits {
    uint64_t timeout_ms;           /* 0: no limit (MSCX_TIMEOUT_MS 0) */
    const volatile int32_t *abort; /* non-zero: give up with MSCX_ERR_REMOTE (NULL: none) */
};

/**
 * Create this rank's segment under a fresh name (O_EXCL, mode 0600) that
 * carries this process's PID namespace and pid. First, segments of this
 * namespace and owner whose creating process is gone (it died before the
 * last peer attached and the name was unlinked) are removed.
 * @param tag names the exchange in messages (a plan name), copied
 * @param name_p receives the segment's name (MSCX_SLOTS_NAME_MAX bytes) to hand to the peers
 * @return MSCX_OK, MSCX_ERR_SYSTEM, MSCX_ERR_NO_MEMORY, MSCX_ERR_INVALID_ARG
 */
mscx_status_t mscx_slots_create(const char *tag, uint32_t rank, uint32_t nranks, char *name_p,
                                struct mscx_slots **u_p);

/** Map rank @p peer's segment @p name (read only). @return MSCX_OK, MSCX_ERR_SYSTEM, MSCX_ERR_INVALID_ARG */
mscx_status_t mscx_slots_attach(struct mscx_slots *u, uint32_t peer, const char *name);

/** Remove this rank's segment name (once every peer attached); the mappings stay. Idempotent. */
void mscx_slots_unlink(struct mscx_slots *u);

/**
 * Publish launch @p seq (> 0): @p status (MSCX_OK, or the error that makes
 * the payload unusable: the "cannot" marker) and @p bytes of @p payload.
 */
mscx_status_t mscx_slots_publish(struct mscx_slots *u, uint64_t seq, int32_t status, const void *payload,
                                 size_t bytes);

/**
 * Wait until rank @p peer published launch @p seq, then copy its status to
 * @p status_p and up to @p bytes of its payload to @p payload.
 * @return MSCX_OK, MSCX_ERR_TIMEOUT, MSCX_ERR_REMOTE (aborted), MSCX_ERR_INTERNAL
 *         (the peer is at another launch: the exchange lost step), MSCX_ERR_INVALID_ARG
 */
mscx_status_t mscx_slots_wait(struct mscx_slots *u, uint32_t peer, uint64_t seq,
                              const struct mscx_slots_limits *lim, int32_t *status_p, void *payload,
                              size_t bytes);

/** Post this rank's verdict of launch @p seq (MSCX_OK or its error). */
mscx_status_t mscx_slots_verdict(struct mscx_slots *u, uint64_t seq, int32_t verdict);

/**
 * Wait for the verdicts of launch @p seq of the @p n ranks in @p ranks (this
 * rank may be among them). @p bad_rank_p receives the first rank whose
 * verdict is an error, preferring one that is not MSCX_ERR_REMOTE (the
 * verdict of a rank that failed only because another did), UINT32_MAX when
 * none, and @p bad_p its verdict.
 * @return as mscx_slots_wait()
 */
mscx_status_t mscx_slots_agree(struct mscx_slots *u, const uint32_t *ranks, uint32_t n, uint64_t seq,
                               const struct mscx_slots_limits *lim, uint32_t *bad_rank_p, int32_t *bad_p);

/** Unmap everything and unlink this rank's name if still there. NULL accepted. */
void mscx_slots_destroy(struct mscx_slots *u);

#endif /* MSCX_SHM_SLOTS_H */
