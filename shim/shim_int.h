/* SPDX-License-Identifier: MIT */
/*
 * Private interface of the NCCL shim (libmscx_nccl.so). Only the nccl* and
 * pnccl* functions of nccl.h are exported (shim_api_gen.c, libnccl.map);
 * everything here is hidden.
 */
#ifndef MSCX_SHIM_INT_H
#define MSCX_SHIM_INT_H

#include <stddef.h>
#include <stdint.h>
#include <nccl.h>

#include "mscx/dev_types.h"
#include "mscx/env.h"
#include "mscx/plan.h"
#include "mscx/status.h"
#include "shim_api_gen.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

/* ---- loader.c: the real NCCL and the last error ---- */

/**
 * The real function @p id, loading the real NCCL on first use. NULL when it
 * is unavailable; the thread's last error then says why.
 */
void *shim_real_fn(enum shim_fn id);
/** The configuration, or NULL when it is degraded (a bad MSCX_* value): nothing routes, all is forwarded. */
const struct mscx_config *shim_config(void);
/**
 * The configuration even when it is degraded (bad values at their defaults;
 * NULL only without memory): for a setup exchange in which a degraded rank
 * (mscx_config_degraded()) votes "fall back". Never for routing.
 */
const struct mscx_config *shim_config_lenient(void);
/** Path and version of the real NCCL ("" and 0 before a successful load). */
const char *shim_real_path(void);
int shim_real_version(void);

/** The result every call returns while the real NCCL is unavailable. */
ncclResult_t shim_err_result(void);
/** The reason text of the thread's last shim error. */
const char *shim_err_text(void);
/** Set the thread's last error (printf format) and return @p res. */
ncclResult_t shim_err_set(ncclResult_t res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Forget the thread's last shim error: the real NCCL's applies again. */
void shim_err_clear(void);
/** Non-zero when the thread's last error is ours. */
int shim_err_is_set(void);

/* ---- caller.c: calls from inside an NCCL library ---- */

/**
 * The caller's own definition of @p id when the call (returning to @p ret)
 * comes from inside an NCCL library other than us: the call must go there
 * with its arguments untouched, and shim_caller_end() follow it. NULL for
 * every other caller. Lock-free once the caller's object is known.
 */
void *shim_caller_begin(enum shim_fn id, const void *ret);
/** After the call that shim_caller_begin() sent back has returned. */
void shim_caller_end(void);

/* ---- status_map.c ---- */

/** The one mapping from mscx_status_t to ncclResult_t. */
ncclResult_t shim_status_to_nccl(mscx_status_t st);

/* ---- route.c: pure routing decision ---- */

enum shim_reason {
    SHIM_WHY_ROUTED = 0,
    SHIM_WHY_NO_STATE,      /* comm has no executor (disabled, no plan, init outside our reach) */
    SHIM_WHY_FORCED,        /* MSCX_FORCE_FALLBACK */
    SHIM_WHY_GROUP,         /* inside ncclGroupStart/End */
    SHIM_WHY_DTYPE,         /* datatype has no mscx equivalent or no plan supports it */
    SHIM_WHY_OP,            /* ncclAvg, PreMulSum, or an op no plan supports */
    SHIM_WHY_SIZE,          /* no plan covers the message size */
    SHIM_WHY_ROOT,          /* broadcast root other than 0 */
    SHIM_WHY_NO_PLAN,       /* no plan for this collective and communicator */
    SHIM_WHY_LAUNCH,        /* the executor refused the launch before enqueueing anything */
    SHIM_WHY_COUNT
};

/** One usable plan as routing sees it. */
struct shim_route_plan {
    enum mscx_coll coll;
    uint32_t nranks;
    uint32_t ranks_per_node;
    uint64_t min_bytes, max_bytes;                  /* inclusive */
    uint64_t elem_multiple;                         /* mscx_plan_elem_multiple(); 0 or 1: any count */
    uint8_t supports[MSCX_DT_COUNT][MSCX_REDOP_COUNT]; /* mscx_plan_supports() */
};

/** A call, reduced to the rank-uniform facts routing may use. */
struct shim_route_query {
    enum mscx_coll coll;
    uint32_t nranks;
    uint32_t ranks_per_node;
    uint64_t msg_bytes;      /* as mscx_coll_sizes(): output bytes for allgather */
    ncclDataType_t dtype;
    ncclRedOp_t op;          /* ignored for allgather and broadcast */
    int root;                /* broadcast only */
    unsigned forced_mask;    /* 1u << enum mscx_coll of MSCX_FORCE_FALLBACK */
    int in_group;
};

/**
 * Pick the first plan (in the given order) that matches @p q.
 * @return the plan index, or -1 with the reason in *why_p
 */
int shim_route_pick(const struct shim_route_query *q, const struct shim_route_plan *plans, size_t nplans,
                    enum shim_reason *why_p);

/**
 * The sizes some plan of one collective and layout may take: a call of that
 * collective and layout whose size is 0 or outside [lo, hi] routes nowhere.
 */
struct shim_route_window {
    uint64_t lo, hi; /* lowest min_bytes and highest max_bytes of those plans (UINT64_MAX, 0: none) */
    size_t nplans;   /* how many plans have that collective and layout */
};
/** The window of the plans for @p coll, @p nranks and @p ranks_per_node among @p plans. */
void shim_route_window_init(struct shim_route_window *w, const struct shim_route_plan *plans, size_t nplans,
                            enum mscx_coll coll, uint32_t nranks, uint32_t ranks_per_node);
/**
 * shim_route_pick() for a query of the collective and layout that @p w was
 * made for from the same plans: the same plan and reason, without looking at
 * the plans when the size is outside the window.
 */
int shim_route_pick_windowed(const struct shim_route_query *q, const struct shim_route_plan *plans,
                             size_t nplans, const struct shim_route_window *w, enum shim_reason *why_p);

/** @return 0 and the mscx type, or -1 when NCCL's type has none. */
int shim_dtype_map(ncclDataType_t dt, enum mscx_dtype *out_p);
/** @return 0 and the mscx op, or -1 (ncclAvg, PreMulSum and other dynamic ops). */
int shim_redop_map(ncclRedOp_t op, enum mscx_redop *out_p);
/** Bytes of one element of a valid NCCL datatype. */
size_t shim_dtype_bytes(ncclDataType_t dt);
/** Parse MSCX_FORCE_FALLBACK ("allreduce,allgather", "all", "") into a mask. */
int shim_parse_forced(const char *list, unsigned *mask_p);
const char *shim_reason_name(enum shim_reason why);

#define SHIM_NBUCKETS 8
/** Size bucket of the summary: <=1K, <=8K, <=64K, <=512K, <=4M, <=32M, <=256M, more. */
int shim_size_bucket(uint64_t bytes);
const char *shim_bucket_name(int bucket);
/** Upper byte limit of @p bucket (inclusive); UINT64_MAX for the last. */
uint64_t shim_bucket_limit(int bucket);

/* ---- summary.c: MSCX_SUMMARY_FILE ---- */

#define SHIM_NSTAT_COLL 5 /* allreduce, allgather, reducescatter, alltoall (unused), broadcast */
/** Calls per collective, size bucket and reason (SHIM_WHY_ROUTED counts routed calls). */
struct shim_stats {
    uint64_t counts[SHIM_NSTAT_COLL][SHIM_NBUCKETS][SHIM_WHY_COUNT];
};
/** A communicator was set up: arms the exit hook and picks the file's rank suffix. */
void shim_summary_note_comm(uint32_t rank, uint32_t nranks);
/** One communicator's JSON object (malloc'd, NULL on no memory). */
char *shim_summary_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks, const char *at);
/** A communicator ended (@p at: "destroy" or "abort"): add it and rewrite the file. */
void shim_summary_finish(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks,
                         const char *at);

/* ---- topo.c ---- */

#define SHIM_HOSTID_LEN 96
/** Bytes of a communicator's connection secret, drawn at random by rank 0 and shared at setup. */
#define SHIM_SECRET_BYTES 32
/**
 * Ranks per node from every rank's host identity (nranks entries of
 * SHIM_HOSTID_LEN bytes). Nodes must hold equal, contiguous rank blocks.
 * @return ranks per node, or 0 when the layout is irregular
 */
uint32_t shim_topo_ranks_per_node(const char *ids, uint32_t nranks);
/** This process's host identity: hostname + boot id, split by MSCX_VIRTUAL_NODES. */
void shim_topo_host_id(uint32_t rank, uint32_t nranks, uint64_t virtual_nodes, char out[SHIM_HOSTID_LEN]);

/* ---- plans.c: the process-wide plan set ---- */

struct shim_plan_entry {
    struct mscx_plan *plan;
    char path[1024];
    struct shim_route_plan route;
};

/**
 * Load the plan set once (sorted *.json of MSCX_PLAN_DIR or the installed
 * directory). Plans that fail to load are skipped with one warning each.
 * @param nfailed_p receives how many files failed to load
 */
void shim_plans_get(const struct shim_plan_entry **plans_p, size_t *n_p, size_t *nfailed_p, uint64_t *hash_p);
/** The directory the plans came from. */
const char *shim_plans_dir(void);
/** Warn once per process about @p key (plan path and problem). @return 1 when this call warned. */
int shim_warn_once(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- comm_table.c: communicator -> state, lock-free lookups ---- */

#define SHIM_TABLE_SIZE 4096u /* communicators with state at once */
/** The slot a lookup of @p key starts at. */
size_t shim_table_home(uintptr_t key);
/** The object mapped to @p key, or NULL. Takes no lock: safe beside the writers below. */
void *shim_table_find(uintptr_t key);
/**
 * Map @p key (not 0) to @p obj; a key already mapped is mapped again and
 * *old_p receives its object (else NULL). @return 0, or -1 when every slot is taken
 */
int shim_table_insert(uintptr_t key, void *obj, void **old_p);
/** Unmap @p key. @return its object, or NULL when it was not mapped. */
void *shim_table_remove(uintptr_t key);
/** Call @p fn on every mapped object, the writers held off until it returns. */
void shim_table_each(void (*fn)(void *obj, void *ctx), void *ctx);

/* ---- comm.c: side table ---- */

struct shim_comm;
/** The state of @p comm or NULL; the caller must shim_comm_put() it. Lock-free. */
struct shim_comm *shim_comm_get(ncclComm_t comm);
void shim_comm_put(struct shim_comm *c);
/**
 * Set up our state beside a freshly initialised real communicator.
 * @return ncclSuccess, or an error (strict mode) after which the real comm was destroyed
 */
ncclResult_t shim_comm_setup(int prof, ncclComm_t comm, const char *how);
/** As shim_comm_setup() without the collective exchange: state for statistics only, calls go to NCCL. */
ncclResult_t shim_comm_setup_nonblocking(int prof, ncclComm_t comm, const char *how);
/**
 * Set up @p n communicators that this thread created together (ncclCommInitAll,
 * several inits in one group). @return the first error, as shim_comm_setup()
 */
ncclResult_t shim_comm_setup_several(int prof, const ncclComm_t *comms, int n, const char *how);

/* ---- group.c: ncclGroupStart/End on this thread ---- */

/** Thread-local group depth (outermost ncclGroupStart). */
int shim_group_depth(void);
/** Comms initialised inside a group: set up after the outermost ncclGroupEnd. */
void shim_group_defer(ncclComm_t comm);
ncclResult_t shim_group_flush(int prof);
void shim_group_drop(void);
void shim_group_enter(void);
/** @return the depth after leaving one level. */
int shim_group_leave(void);
/**
 * Before a real ncclCommAbort, ncclCommRevoke or ncclCommShrink with
 * NCCL_SHRINK_ABORT: unlink our state of @p comm (its later calls go to
 * NCCL untouched) and tell its kernels to stop. Waits on nothing.
 * @return the state for shim_comm_stop_finish(), NULL when there is none
 */
struct shim_comm *shim_comm_stop(ncclComm_t comm);
/**
 * After the real call returned: print the summary (@p how: "abort",
 * "revoke", "shrink") and release the state without waiting on the device
 * (mscx_exec_destroy_deferred). NULL accepted.
 */
void shim_comm_stop_finish(struct shim_comm *c, const char *how);
/** Drop our state of @p comm (stopping our kernels first when @p abort) and print its summary. */
void shim_comm_teardown(ncclComm_t comm, int abort);
/** The JSON objects of every live communicator, comma separated (malloc'd; NULL when none). */
char *shim_comm_live_json(void);
/** Our asynchronous error of @p comm as an NCCL result (ncclSuccess when none). */
ncclResult_t shim_comm_async_error(ncclComm_t comm);

/** Route or forward one collective: the body of the four intercepts. */
struct shim_coll_call {
    const char *fn;          /* the NCCL function called, for messages */
    enum mscx_coll coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;            /* NCCL's count argument */
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;
    ncclComm_t comm;
    cudaStream_t stream;
};
/**
 * Try our executor. A communicator not in our table goes to NCCL untouched;
 * on one of ours, bad arguments get NCCL's answer here. @return 1 when the
 * call was answered here (*res_p set: it ran on our executor or was refused),
 * 0 when it must go to NCCL.
 */
int shim_comm_try_route(const struct shim_coll_call *call, ncclResult_t *res_p);

/* ---- boot.c: the exchange over the real communicator ---- */
struct mscx_bootstrap;
/**
 * A bootstrap whose allgather is the real ncclAllGather on a small device
 * buffer and a private stream. @return MSCX_ERR_UNSUPPORTED without CUDA.
 */
mscx_status_t shim_boot_create(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                               struct mscx_bootstrap **bs_p);
void shim_boot_destroy(struct mscx_bootstrap *bs);
/**
 * shim_boot_destroy() for a stopped communicator: nothing that can wait on
 * the device. Its device buffer is freed by the next shim_boot_destroy().
 */
void shim_boot_destroy_deferred(struct mscx_bootstrap *bs);
/**
 * Every exchange of this bootstrap starts with a header round in which each
 * rank says whether it can take part; when one cannot, every rank's exchange
 * fails with MSCX_ERR_REMOTE instead of waiting. This runs a header round on
 * its own: @return MSCX_OK when every rank passed @p ok != 0, MSCX_ERR_REMOTE
 * when some rank did not (the same answer everywhere).
 */
mscx_status_t shim_boot_agree(struct mscx_bootstrap *bs, int ok);
/** Header rounds run so far (to see whether a call made its exchange). */
uint64_t shim_boot_rounds(const struct mscx_bootstrap *bs);
/**
 * Bytes of the fixed first exchange of every communicator (the agreement
 * record). The same in every version of the library, so that ranks running
 * different versions still meet in one ncclAllGather of equal size.
 */
#define SHIM_BOOT_FIXED_BYTES 256
/**
 * The fixed exchange: one ncclAllGather of SHIM_BOOT_FIXED_BYTES from
 * @p mine into @p all ([nranks] records), with no header round.
 */
mscx_status_t shim_boot_fixed(struct mscx_bootstrap *bs, const void *mine, void *all);

#endif /* MSCX_SHIM_INT_H */
