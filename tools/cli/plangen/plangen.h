/* SPDX-License-Identifier: MIT */
/*
 * mscx-plangen internals: a small builder for MSCCL++-format JSON plans
 * (pg_build.c) and the collective algorithms written with it (pg_algo.c).
 *
 * The builder keeps, per rank, the channel declarations, the remote buffer
 * table and the thread blocks; per thread block, the local channel and
 * remote-buffer tables that the ops' channel_ids and buffer_id index. The
 * algorithms only name peers and buffers; the tables fill themselves in
 * first-use order, so the output is deterministic.
 */
#ifndef MSCX_PLANGEN_H
#define MSCX_PLANGEN_H

#include <stdbool.h>
#include <stdint.h>
#include <jansson.h>
#include "mscx/plan.h"

#define PG_MAX_PEERS 64 /* channels of one type per rank */
#define PG_MAX_RBUF 128 /* remote buffers per rank */
#define PG_MAX_TB 64    /* thread blocks per rank */
#define PG_TB_TABLE 16  /* per type, per thread block (MSCX_MAX_CHAN_PER_TB) */

enum pg_chan { PG_CH_MEMORY = 0, PG_CH_PORT = 1, PG_CH_COUNT };

/** What to generate (command-line parameters). */
struct pg_params {
    enum mscx_coll coll;
    const char *algo; /* copy, oneshot, twophase, allpairs, hier2 */
    uint32_t nranks;
    uint32_t rpn; /* ranks per node */
    uint64_t min_size;
    uint64_t max_size;
    uint32_t tbs_per_peer; /* thread blocks per peer group (the slicing factor) */
    uint32_t blocks;       /* oneshot, twophase: thread blocks per rank, overriding tbs_per_peer * (ranks - 1)
                              (twophase: each rank's share split in that many sub-chunks); 0: not set */
    const char *layout;    /* twophase with blocks: "rows" (default, the DSL's allreduce_pkt) or "cols" */
    uint32_t nthreads;     /* num_threads_per_block */
    const char *packet;    /* "ll16" or "ll8": a hint only, not recorded */
    const char *name;      /* plan name; NULL: derived from the parameters */
    uint32_t root;         /* broadcast root */
};

struct pg_tb {
    json_t *ops;
    uint32_t nch[PG_CH_COUNT];
    uint32_t ch[PG_CH_COUNT][PG_TB_TABLE]; /* rank-level channel index */
    uint32_t nrb[PG_CH_COUNT];
    uint32_t rb[PG_CH_COUNT][PG_TB_TABLE]; /* index into the rank's remote buffers */
};

struct pg_rbuf {
    uint32_t rank;
    char type;
    enum pg_chan chan;
};

struct pg_gpu {
    uint32_t input_chunks, output_chunks, scratch_chunks;
    uint32_t nch[PG_CH_COUNT];
    uint32_t peer[PG_CH_COUNT][PG_MAX_PEERS]; /* connected_to, one channel per peer */
    uint32_t nrbuf;
    struct pg_rbuf rbuf[PG_MAX_RBUF];
    uint32_t ntb;
    struct pg_tb tb[PG_MAX_TB];
};

struct pg_plan {
    const struct pg_params *par;
    char name[128];
    bool packet; /* LL protocol, double scratch */
    bool inplace;
    uint32_t nranks;
    struct pg_gpu *gpus;
};

/* ---- builder (pg_build.c); all return -1 with a message on stderr on error ---- */
int pg_plan_init(struct pg_plan *p, const struct pg_params *par, bool packet, bool inplace);
void pg_plan_fini(struct pg_plan *p);
/** Set the chunk counts of every rank. */
void pg_plan_chunks(struct pg_plan *p, uint32_t in, uint32_t out, uint32_t scratch);
/** Declare a channel (idempotent); declaring all up front fixes their order. */
int pg_connect(struct pg_plan *p, uint32_t rank, enum pg_chan type, uint32_t peer);
/** Append a thread block to @p rank; @return its index or -1. */
int pg_tb_new(struct pg_plan *p, uint32_t rank);
/** Append @p n thread blocks to @p rank. @return 0 or -1. */
int pg_tbs_new(struct pg_plan *p, uint32_t rank, uint32_t n);
/** Declare memory channels to every other rank of @p rank's node of @p P ranks, ascending. */
void pg_connect_node(struct pg_plan *p, uint32_t rank, uint32_t P);
/**
 * A rank of a plan of @p M nodes of @p P ranks: memory channels within its
 * node, a port channel to the rank of the same local index on every other
 * node, and @p nblocks thread blocks. @return 0 or -1.
 */
int pg_hier_rank(struct pg_plan *p, uint32_t rank, uint32_t P, uint32_t M, uint32_t nblocks);

/* Operands (new references). */
json_t *pg_loc(char type, uint32_t index, uint32_t size);
/** A remote operand of @p owner's buffer reached from thread block @p tb of @p rank. */
json_t *pg_rem(struct pg_plan *p, uint32_t rank, uint32_t tb, enum pg_chan type, uint32_t owner, char btype,
               uint32_t index, uint32_t size);
/** Local channel index of the channel to @p peer in the thread block's table. */
int pg_tb_chan(struct pg_plan *p, uint32_t rank, uint32_t tb, enum pg_chan type, uint32_t peer);

/** Thread-block-group slice; size 1 means none. */
struct pg_tbg {
    uint32_t id, size;
};

/**
 * Append an op to a thread block. @p src and @p dst are arrays (stolen) or
 * NULL; @p chan_type is "memory", "port" or NULL; @p chan_ids (stolen) or
 * NULL; @p reduce adds reduce_op "sum".
 */
void pg_op(struct pg_plan *p, uint32_t rank, uint32_t tb, const char *name, json_t *src, json_t *dst,
           const char *chan_type, json_t *chan_ids, bool reduce, struct pg_tbg tbg);
/** A barrier op over @p ntb blocks. */
void pg_barrier(struct pg_plan *p, uint32_t rank, uint32_t tb, uint32_t id, uint32_t ntb);

/** Serialise (deterministic). @return malloc'd string or NULL. */
char *pg_plan_dump(const struct pg_plan *p);

/* ---- algorithms (pg_algo.c) ---- */
/** Build the plan described by @p par. @return 0, or -1 with a message on stderr. */
int pg_generate(const struct pg_params *par, struct pg_plan *p);

/* ---- broadcast (pg_bcast.c) ---- */
/** Broadcast from par->root: oneshot or direct on one node, @p hier across nodes. @return 0 or -1. */
int pg_bcast(const struct pg_params *par, struct pg_plan *p, bool hier);

/* ---- alltoall (pg_alltoall.c) ---- */
/** AlltoAll: oneshot (LL) or direct (Simple) on one node, @p hier across nodes. @return 0, or -1 with a
 * message. */
int pg_alltoall(const struct pg_params *par, struct pg_plan *p, bool hier);

/** "1K", "64K", "1M", or the number of bytes. */
void pg_size_label(uint64_t v, char *buf, size_t len);

#endif
