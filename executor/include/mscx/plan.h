/* SPDX-License-Identifier: MIT */
/**
 * @file plan.h
 * Execution plans in the MSCCL++ JSON format: loading with validation, the
 * fusion pass, writing, and the per-launch geometry of a message size.
 *
 * A loaded plan is immutable and fully validated; nothing else is ever handed
 * out. Errors name the file, the JSON path, line and column, and what was
 * expected, for example:
 *   plan bug: p.json:12:27: gpus[1].threadblocks[0].ops[2].src_buff[0].index:
 *   expected a chunk index below 4, got 7
 */
#ifndef MSCX_PLAN_H
#define MSCX_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "mscx/status.h"
#include "mscx/dev_types.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mscx_plan;

enum mscx_coll {
    MSCX_COLL_ALLREDUCE = 0,
    MSCX_COLL_ALLGATHER,
    MSCX_COLL_REDUCESCATTER,
    MSCX_COLL_ALLTOALL,
    MSCX_COLL_BROADCAST,
    MSCX_COLL_SENDRECV,
    MSCX_COLL_TEST, /* the DSL's single-op demonstrations: no collective definition */
    MSCX_COLL_COUNT
};

/** Size of the error buffers that the functions below fill. */
#define MSCX_PLAN_ERR_LEN 1024

/**
 * Load and validate a plan file.
 * @param path   JSON file in the MSCCL++ execution-plan format
 * @param plan_p set on success only
 * @param err    receives the one-line reason on failure; may be NULL
 * @param errlen size of @p err
 * @return MSCX_OK, MSCX_ERR_PLAN (bad plan), MSCX_ERR_SYSTEM (unreadable file),
 *         MSCX_ERR_NO_MEMORY
 */
mscx_status_t mscx_plan_load(const char *path, struct mscx_plan **plan_p, char *err, size_t errlen);

/**
 * As mscx_plan_load(), from memory. @p origin names the source in messages.
 */
mscx_status_t mscx_plan_load_buffer(const char *json, size_t len, const char *origin,
                                    struct mscx_plan **plan_p, char *err, size_t errlen);

/** Free a plan; NULL is accepted. */
void mscx_plan_destroy(struct mscx_plan *plan);

/* Accessors of the plan header. */
const char *mscx_plan_name(const struct mscx_plan *plan);
const char *mscx_plan_origin(const struct mscx_plan *plan); /* file name or origin given at load */
enum mscx_coll mscx_plan_collective(const struct mscx_plan *plan);
uint32_t mscx_plan_nranks(const struct mscx_plan *plan);
/** Ranks per node: our "mscx" extension field, else inferred from memory-channel connectivity. */
uint32_t mscx_plan_ranks_per_node(const struct mscx_plan *plan);
/** Broadcast root: our "mscx" extension's "root", else 0 (0 for every other collective). */
uint32_t mscx_plan_root(const struct mscx_plan *plan);
/**
 * Non-zero when our "mscx" extension's "beats_nccl_window" is true: the
 * plan's size range was measured faster than NCCL on buffers registered
 * with ncclCommWindowRegister (mscx-tune), so the shim routes it there too.
 */
int mscx_plan_beats_nccl_window(const struct mscx_plan *plan);
/**
 * Non-zero when some rank's program reads or writes another rank's input or
 * output buffer (the "direct" plans): the buffers the caller passes at each
 * launch, which ranks in other processes can only reach after exchanging
 * their handles at that launch, each host waiting for its peers.
 */
int mscx_plan_reaches_peer_user(const struct mscx_plan *plan);
int mscx_plan_inplace(const struct mscx_plan *plan);
/** Thread blocks of @p rank's program; 0 when @p rank is not below the plan's ranks. */
uint32_t mscx_plan_threadblocks(const struct mscx_plan *plan, uint32_t rank);
/** num_threads_per_block as the plan gives it (the executor may launch fewer). */
uint32_t mscx_plan_threads_per_block(const struct mscx_plan *plan);
/** Valid message size range in bytes (the output size for allgather, as in MSCCL++). */
void mscx_plan_size_range(const struct mscx_plan *plan, uint64_t *min_p, uint64_t *max_p);
/**
 * Message sizes the plan runs are a whole multiple of this many elements
 * (1 for most plans). An allgather's output, a reducescatter's input and
 * both buffers of an alltoall hold one section per rank; chunks split
 * unevenly would not line up with the sections, so there the element count
 * must be a multiple of that buffer's
 * chunk count (nranks for plans with one chunk per rank, which every size
 * already meets). mscx_plan_geom refuses other sizes.
 */
uint64_t mscx_plan_elem_multiple(const struct mscx_plan *plan);
/** @return non-zero when the plan may run @p dtype with @p op (op ignored for non-reducing plans). */
int mscx_plan_supports(const struct mscx_plan *plan, enum mscx_dtype dtype, enum mscx_redop op);
/**
 * @return MSCX_OK when the executors can run the plan, or MSCX_ERR_UNSUPPORTED
 *         with the reason in @p err (multicast operations are parsed but refused).
 */
mscx_status_t mscx_plan_executable(const struct mscx_plan *plan, char *err, size_t errlen);

/** Counts reported by the fusion pass. */
struct mscx_fuse_stats {
    uint32_t ops_before;
    uint32_t ops_after;
    uint32_t rule_hits[8]; /* indexed by enum mscx_fuse_rule */
};

enum mscx_fuse_rule {
    MSCX_FUSE_REPKT_CPKT = 0, /* repkt + cpkt -> recpkt */
    MSCX_FUSE_RECPKT_PPKT,    /* recpkt + memory ppkt -> recspkt */
    MSCX_FUSE_RECPKT_RPPKT,   /* recpkt + memory rppkt -> recspkt */
    MSCX_FUSE_RPPKT_RPPKT,    /* rppkt + rppkt, same source -> one rppkt */
    MSCX_FUSE_REPKT_PPKT,     /* repkt/respkt + memory ppkt -> respkt */
    MSCX_FUSE_OTHER,          /* the remaining DSL rules */
    MSCX_FUSE_RULE_COUNT
};

/**
 * The fusion pass. Produces a new, validated plan whose result equals the
 * input's for every message size, datatype, op and packet format.
 * @param stats_p optional
 */
mscx_status_t mscx_plan_fuse(const struct mscx_plan *plan, struct mscx_plan **fused_p,
                             struct mscx_fuse_stats *stats_p);

/**
 * Serialise to MSCCL++ JSON (plus our optional "mscx" extension object).
 * @param json_p malloc'd, NUL-terminated; free() it
 */
mscx_status_t mscx_plan_to_json(const struct mscx_plan *plan, char **json_p);

/** Write mscx_plan_to_json() output to @p path. */
mscx_status_t mscx_plan_save(const struct mscx_plan *plan, const char *path);

/**
 * Print a readable summary: ranks, thread blocks, op counts per type,
 * channels, scratch needed for each size in @p sizes.
 */
void mscx_plan_describe(const struct mscx_plan *plan, FILE *out, const uint64_t *sizes, size_t nsizes);

/** Bytes per element of @p dtype (1, 2, 4 or 8). */
uint32_t mscx_dtype_size(enum mscx_dtype dtype);
/** Names used on command lines and in plans: "fp32", "sum", "ll16", "allreduce"... */
const char *mscx_dtype_name(enum mscx_dtype dtype);
const char *mscx_redop_name(enum mscx_redop op);
const char *mscx_coll_name(enum mscx_coll coll);
const char *mscx_opcode_name(enum mscx_opcode op);
/** Parse a name; @return 0 on success, -1 when unknown. */
int mscx_dtype_parse(const char *name, enum mscx_dtype *dtype_p);
int mscx_redop_parse(const char *name, enum mscx_redop *op_p);
int mscx_coll_parse(const char *name, enum mscx_coll *coll_p);

/**
 * The byte geometry of one launch. Plans count in unit chunks; this maps
 * chunks to bytes for a message size.
 *
 * Raw buffers (input, output) are split into chunks of `in_chunk`/`out_chunk`
 * bytes, ceil(elements / chunks) elements each, so any whole number of
 * elements works; the last chunks may be short or empty. Every chunk also has
 * a logical slot of `slot` bytes (the largest chunk rounded up to the
 * alignment), which is how scratch is laid out and how all operations count:
 * an operand of chunks [i, i+k) covers logical bytes [i*slot, (i+k)*slot).
 * Logical bytes past a raw chunk's real end read as zero and are never
 * written; packet lines are always written whole, zero-padded, so a reader of
 * scratch never waits for a packet that nobody sends.
 */
struct mscx_geom {
    uint64_t in_bytes;      /* real input size */
    uint64_t out_bytes;     /* real output size */
    uint64_t in_chunk;      /* bytes per input chunk (0 when input_chunks is 0) */
    uint64_t out_chunk;     /* bytes per output chunk (0 when output_chunks is 0) */
    uint64_t slot;          /* logical chunk size, a multiple of 16 and of the alignment */
    uint64_t scratch_bytes; /* scratch this rank needs (both halves when double buffered) */
    uint64_t scratch_half;  /* offset of the second half, 0 when not double buffered */
    uint32_t esize;         /* element size */
};

/**
 * Compute the geometry of @p rank for a launch.
 * @param in_bytes, out_bytes the per-rank buffer sizes as the collective
 *        defines them (allgather: out = in * nranks)
 * @return MSCX_ERR_INVALID_ARG with a reason when the sizes do not fit the
 *         plan (not whole elements, input and output chunks disagree, beyond
 *         the 4 GiB limit)
 */
mscx_status_t mscx_plan_geom(const struct mscx_plan *plan, uint32_t rank, uint64_t in_bytes,
                             uint64_t out_bytes, enum mscx_dtype dtype, struct mscx_geom *geom_p, char *err,
                             size_t errlen);

/**
 * Buffer sizes per rank for a collective of @p bytes: the message size the
 * plan's range refers to (input bytes, output bytes for allgather).
 */
void mscx_coll_sizes(enum mscx_coll coll, uint32_t nranks, uint64_t msg_bytes, uint64_t *in_bytes_p,
                     uint64_t *out_bytes_p);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_PLAN_H */
