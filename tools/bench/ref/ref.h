/* SPDX-License-Identifier: MIT */
/*
 * Hand-written LL16 packet allreduce kernels: the baselines that mscx-perf
 * --baseline and mscx-bench-gpu run against the plan-driven executor. Each
 * is the algorithm of one generated plan, written directly:
 *   oneshot:  every rank sends its whole buffer to every peer as packets
 *             and reduces locally (plans/allreduce_*_oneshot_*.json)
 *   twophase: reduce-scatter by packets (rank g owns chunk g), then
 *             all-gather of the reduced chunks by packets
 *             (plans/allreduce_*_twophase_*.json, the DSL's allreduce_pkt)
 * Every rank reduces in rank order (rank 0's data first), so every rank gets
 * the same bits, as the generated plans do.
 * One-shot also runs for one rank (a copy through the same kernel), which
 * mscx-bench-gpu uses to time a launch with no peers.
 * And one LL16 packet alltoall (ref_alltoall.cu), out of place:
 *   alltoall: every rank sends its block for peer p as packets straight into
 *             slot `rank` of p's scratch, copies its own block, and unpacks
 *             each peer's slot into that peer's block of the output
 *             (plans/alltoall_*_oneshot_*.json)
 *
 * The flag scheme is the executor's: flags live in device memory and the
 * kernel advances them itself, so launches may be captured in CUDA graphs
 * and replayed. Consecutive launches alternate the two scratch halves.
 * The pure-C part (ref.c: what is supported, scratch sizes) builds without
 * CUDA for the unit tests; ref_kernels.cu holds the kernels and the launch.
 */
#ifndef MSCX_REF_H
#define MSCX_REF_H

#include <stddef.h>
#include <stdint.h>

#include "mscx/dev_types.h"

#ifdef __cplusplus
extern "C" {
#endif

enum mscx_ref_algo { MSCX_REF_NONE = 0, MSCX_REF_ONESHOT, MSCX_REF_TWOPHASE, MSCX_REF_ALLTOALL };

#define MSCX_REF_MAX_RANKS 16
#define MSCX_REF_MAX_BLOCKS 1024
/* Per rank: one flag per block, then the error word (non-zero: a wait timed out). */
#define MSCX_REF_STATE_WORDS (MSCX_REF_MAX_BLOCKS + 1)
#define MSCX_REF_STATE_BYTES (MSCX_REF_STATE_WORDS * sizeof(uint32_t))

/** One rank's launch. */
struct mscx_ref_launch {
    enum mscx_ref_algo algo;
    enum mscx_dtype dtype;
    const void *send;                  /* this rank's input */
    void *recv;                        /* its output; may equal send (in place) */
    char *scratch[MSCX_REF_MAX_RANKS]; /* every rank's scratch, addressable from this rank */
    uint64_t scratch_bytes;            /* bytes of each scratch (both halves) */
    uint32_t *state;                   /* this rank's MSCX_REF_STATE_WORDS words, zeroed once */
    uint32_t rank, nranks;
    uint64_t bytes; /* the message size: the buffer (allreduce), the input (alltoall) */
    uint32_t blocks, threads;
    uint64_t timeout_ns; /* spin limit per wait; 0: wait forever */
    uint32_t pdl;        /* 1: programmatic dependent launch, as the executor's MSCX_PDL
                            (Hopper and later, and only where every rank's blocks fit on
                            the GPU twice: one launch per stream may wait ahead) */
};

/**
 * The algorithm a plan of this name runs: an "alltoall" name with "oneshot", else a name with "oneshot",
 * "twophase" or "allreduce_pkt".
 */
enum mscx_ref_algo mscx_ref_algo_of_plan(const char *plan_name);
const char *mscx_ref_algo_name(enum mscx_ref_algo algo);

/**
 * Can the kernels run this call?
 * @param why_p receives a short reason when not (may be NULL)
 * @return 1 when supported, 0 when not
 */
int mscx_ref_supports(enum mscx_ref_algo algo, enum mscx_dtype dtype, enum mscx_redop op, uint32_t nranks,
                      uint64_t bytes, const char **why_p);

/** Scratch bytes per rank (both halves) that @p bytes need with @p algo; 0 for an unknown algorithm. */
uint64_t mscx_ref_scratch_bytes(enum mscx_ref_algo algo, uint32_t nranks, uint64_t bytes);

/**
 * Check the arguments of a launch (support, scratch size, blocks, threads).
 * @return 0, or -1 with the reason in @p err
 */
int mscx_ref_check_launch(const struct mscx_ref_launch *l, char *err, size_t errlen);

/**
 * Enqueue one rank's kernel on @p stream (a cudaStream_t); legal in graph capture.
 * @return 0, -1 for arguments mscx_ref_check_launch() refuses (reason in @p err),
 *         or a cudaError_t from the launch (reason in @p err)
 */
int mscx_ref_launch(const struct mscx_ref_launch *l, void *stream, char *err, size_t errlen);
/** The alltoall kernel's launch (ref_alltoall.cu), for mscx_ref_launch(); arguments already checked. */
int mscx_ref_launch_alltoall(const struct mscx_ref_launch *l, void *stream, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_REF_H */
