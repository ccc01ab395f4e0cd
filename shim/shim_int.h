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
#include "mscx/scale.h"
#include "mscx/status.h"
#include "shim_api_gen.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
/* The path of every collective call, kept together in .text.hot: a call after other work misses fewer lines
 */
#define SHIM_HOT __attribute__((hot))
/* Taken once per object or on errors: out of the hot path's lines */
#define SHIM_COLD __attribute__((cold, noinline))

/* 64-bit FNV-1a, the hash of what ranks compare: settings, the plan set, the agreement's secret. */
#define SHIM_FNV_BASIS 0xcbf29ce484222325ull
static inline uint64_t shim_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- loader.c: the real NCCL and the last error ---- */

/**
 * The real function @p id, loading the real NCCL on first use. NULL when it
 * is unavailable; the thread's last error then says why.
 */
void *shim_real_fn(enum shim_fn id);
/** Non-zero when calls may route: the configuration is published and MSCX_DISABLE is unset. */
int shim_routing_on(void);
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
/** The rule that found the real NCCL: "MSCX_NCCL_LIB", "already loaded", "pip wheel (VIRTUAL_ENV)", ... */
const char *shim_real_how(void);
/** Symbol @p name of the real NCCL (loading it on first use), or NULL. */
void *shim_real_sym(const char *name);
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

/* ---- nccl_map.c: NCCL's enums and ours ---- */

/** The one mapping from mscx_status_t to ncclResult_t. */
ncclResult_t shim_status_to_nccl(mscx_status_t st);
/** @return 0 and the mscx type, or -1 when NCCL's type has none. */
int shim_dtype_map(ncclDataType_t dt, enum mscx_dtype *out_p);
/** @return 0 and the mscx op, or -1 (ncclAvg, PreMulSum and other dynamic ops). */
int shim_redop_map(ncclRedOp_t op, enum mscx_redop *out_p);
/** Bytes of one element of a valid NCCL datatype. */
size_t shim_dtype_bytes(ncclDataType_t dt);
/*
 * The datatype count of the newest NCCL the shim knows (fp8 ends at 11 since 2.24). A type at or past
 * the ncclNumTypes of the nccl.h the shim was built on but below this count is one that header lacks
 * (fp8 on a header before 2.24): only the library knows whether it takes it, so the call is NCCL's.
 */
#define SHIM_NCCL_NUM_TYPES_NEWEST 12

/** 1 for a datatype newer than the nccl.h the shim was built on. */
static inline int shim_dtype_newer(ncclDataType_t dt)
{
    return (int)dt >= (int)ncclNumTypes && (int)dt < SHIM_NCCL_NUM_TYPES_NEWEST;
}

/* ---- route.c: pure routing decision ---- */

enum shim_reason {
    SHIM_WHY_ROUTED = 0,
    SHIM_WHY_NO_STATE, /* comm has no executor (disabled, no plan, init outside our reach) */
    SHIM_WHY_FORCED,   /* MSCX_FORCE_FALLBACK */
    SHIM_WHY_GROUP,    /* its group ended in ncclGroupSimulateEnd: NCCL simulated it, nothing ran */
    SHIM_WHY_DTYPE,    /* datatype has no mscx equivalent or no plan supports it */
    SHIM_WHY_OP,       /* an op no plan supports, ncclAvg of integers, a PreMulSum op not kept */
    SHIM_WHY_SIZE,     /* no plan covers the message size */
    SHIM_WHY_ROOT,     /* no broadcast plan for this root */
    SHIM_WHY_NO_PLAN,  /* no plan for this collective and communicator */
    SHIM_WHY_LAUNCH,   /* the executor refused the launch before enqueueing anything */
    SHIM_WHY_WINDOW,   /* buffers in symmetric NCCL windows, where the plan does not beat NCCL */
    SHIM_WHY_SENDRECV, /* a send/recv group shaped as an alltoall that not every rank ran as one */
    SHIM_WHY_CONFIG,   /* its ncclCollConfig_t picks NCCL's algorithm or protocol, or asks what we cannot give
                        */
    SHIM_WHY_COUNT
};

/** One usable plan as routing sees it. */
struct shim_route_plan {
    enum mscx_coll coll;
    uint32_t nranks;
    uint32_t ranks_per_node;
    uint64_t min_bytes, max_bytes; /* inclusive */
    uint64_t elem_multiple;        /* mscx_plan_elem_multiple(); 0 or 1: any count */
    uint32_t root;                 /* broadcast: the root the plan serves (mscx_plan_root()) */
    uint8_t beats_nccl_window;     /* mscx_plan_beats_nccl_window() */
    uint8_t supports[MSCX_DT_COUNT][MSCX_REDOP_COUNT]; /* mscx_plan_supports() */
};

/** A call, reduced to the rank-uniform facts routing may use. */
struct shim_route_query {
    enum mscx_coll coll;
    uint32_t nranks;
    uint32_t ranks_per_node;
    uint64_t msg_bytes; /* as mscx_coll_sizes(): output bytes for allgather */
    ncclDataType_t dtype;
    ncclRedOp_t op;       /* ignored for allgather and broadcast */
    int root;             /* broadcast only */
    unsigned forced_mask; /* 1u << enum mscx_coll of MSCX_FORCE_FALLBACK */
    int group_fallback;   /* this thread's group ends in ncclGroupSimulateEnd: every call goes to NCCL */
    ncclComm_t comm;      /* the communicator of a PreMulSum op (redop_table.c) */
};

/**
 * Pick the first plan (in the given order) that matches @p q.
 * @return the plan index, or -1 with the reason in *why_p
 */
int shim_route_pick(const struct shim_route_query *q, const struct shim_route_plan *plans, size_t nplans,
                    enum shim_reason *why_p);

/**
 * The sizes some plan of one collective and layout may take, by power of
 * two: a call of that collective and layout whose size is 0 or in a bin
 * no plan reaches routes nowhere. It lets a call that goes to NCCL skip
 * the plans.
 */
struct shim_route_window {
    uint64_t bins;   /* bit b: some plan's range meets [2^b, 2^(b+1)) */
    uint32_t nplans; /* how many plans have that collective and layout */
};
/** The window of the plans for @p coll, @p nranks and @p ranks_per_node among @p plans. */
void shim_route_window_init(struct shim_route_window *w, const struct shim_route_plan *plans, size_t nplans,
                            enum mscx_coll coll, uint32_t nranks, uint32_t ranks_per_node);
/**
 * shim_route_pick() for a query of the collective and layout that @p w was
 * made for from the same plans: the same plan and reason, without looking at
 * the plans when no plan reaches the size's bin.
 */
int shim_route_pick_windowed(const struct shim_route_query *q, const struct shim_route_plan *plans,
                             size_t nplans, const struct shim_route_window *w, enum shim_reason *why_p);

/* ---- decide.c: sizes that overflow ---- */

/**
 * Non-zero, with *@p res_p ncclInvalidArgument and the reason set, when
 * @p count elements of @p dt (times the rank count of @p comm when
 * @p per_rank) do not fit in a size_t. @p fn names the call in the reason.
 */
int shim_count_overflows(int prof, const char *fn, size_t count, ncclDataType_t dt, int per_rank,
                         ncclComm_t comm, ncclResult_t *res_p);

/* ---- redop_table.c, redop.c: ncclAvg and PreMulSum ops as scaled sums ---- */

/**
 * What the executor runs for op @p op of a call of @p dtype on @p comm of
 * @p nranks ranks: a built-in op as it is; ncclAvg of fp32, fp16 or bf16 as
 * a sum scaled by NCCL's 1/nranks (no scale at one rank); a PreMulSum op
 * that NCCL made on @p comm for @p dtype as a sum scaled by its scalar.
 * @return 0 with *op_p and *scale_p, or -1: the op goes to NCCL (integer
 *         averages, unknown or destroyed ops, another datatype's op)
 */
int shim_redop_resolve(ncclComm_t comm, uint32_t nranks, ncclRedOp_t op, ncclDataType_t dtype,
                       enum mscx_redop *op_p, struct mscx_scale *scale_p);
/** Keep PreMulSum op (@p comm, @p op) of @p dtype and its scale. @return 0, or -1 when the table is full. */
int shim_redop_record(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dtype, const struct mscx_scale *scale);
/** Forget op (@p comm, @p op), if kept. */
void shim_redop_forget(ncclComm_t comm, ncclRedOp_t op);
/** Forget every op of @p comm (it ended): a later communicator at its address starts with none. */
void shim_redop_forget_comm(ncclComm_t comm);
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

#define SHIM_NSTAT_COLL                                                                                      \
    5 /* allreduce, allgather, reducescatter, alltoall, broadcast (enum mscx_coll order) */
#define SHIM_NSTAT_PLANS 64 /* the plans a summary names; more used ones are counted as omitted */
/** One plan that ran calls of a communicator: its name, collective, size range and calls. */
struct shim_plan_use {
    const char *name; /* the plan file's name without its folder and ".json" (valid while the comm is) */
    size_t name_len;
    enum mscx_coll coll;
    uint64_t min_bytes, max_bytes; /* the range it serves on this communicator */
    uint64_t calls;
};
/** Calls per collective, size bucket and reason (SHIM_WHY_ROUTED counts routed calls), and per plan. */
struct shim_stats {
    uint64_t counts[SHIM_NSTAT_COLL][SHIM_NBUCKETS][SHIM_WHY_COUNT];
    size_t nplans, plans_omitted;
    struct shim_plan_use plans[SHIM_NSTAT_PLANS];
};
/** A communicator was set up: arms the exit hook and picks the file's rank suffix. */
void shim_summary_note_comm(uint32_t rank, uint32_t nranks);
/** One communicator's JSON object (malloc'd, NULL on no memory). */
char *shim_summary_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks,
                        const char *at);
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

/* ---- window.c: the NCCL windows the application registered ---- */

struct shim_coll_call;
/**
 * 1 when NCCL would consider its symmetric kernels for @p call: its send
 * and receive buffers (a broadcast's receive buffer) each start inside a
 * window registered on its communicator with NCCL_WIN_COLL_SYMMETRIC. The
 * same on every rank. One relaxed atomic load and no lock while no such
 * window is registered anywhere.
 */
int shim_window_covers_call(const struct shim_coll_call *call);
/** Forget every window of @p comm (it ended): a later communicator at its address starts with none. */
void shim_window_forget_comm(ncclComm_t comm);

/* ---- comm.c, setup.c, deferred.c: our state beside each communicator, and its setup ---- */

struct shim_comm;
/** The state of @p comm or NULL; the caller must shim_comm_put() it. Lock-free. */
struct shim_comm *shim_comm_get(ncclComm_t comm);
void shim_comm_put(struct shim_comm *c);
/* ---- join.c: how the ranks of a new communicator meet for its fixed exchange ---- */

enum shim_join_kind {
    SHIM_JOIN_NONE, /* not at all: some rank may run without the shim (why says how); calls go to NCCL */
    SHIM_JOIN_COMM, /* over the communicator: every rank is known to run the shim */
    SHIM_JOIN_RDV,  /* at the rendezvous named in the id the communicator was created with */
    SHIM_JOIN_GROW, /* not decided yet: an ncclCommGrow's, which shim_join_resolve() makes COMM or NONE */
};

/* The facts one rank of an ncclCommGrow holds (SHIM_JOIN_GROW). */
struct shim_join_grow {
    ncclComm_t parent; /* NULL on a new rank */
    int nranks;        /* of the grown communicator */
    int rank;          /* a new rank's; -1 on the parent's ranks */
    int has_id;        /* the id below is this rank's: the parent's root, or a new rank */
    int nonblocking;   /* its config asks for a non-blocking communicator */
    int prof;
};

struct shim_join {
    enum shim_join_kind kind;
    const char *why;            /* SHIM_JOIN_NONE: the reason, for the log */
    ncclUniqueId id;            /* SHIM_JOIN_RDV, SHIM_JOIN_GROW with has_id */
    struct shim_join_grow grow; /* SHIM_JOIN_GROW */
};

/** The join of a communicator created with @p id (NULL: none known). */
void shim_join_by_id(struct shim_join *j, const ncclUniqueId *id);
/** The join of a communicator made from @p parent (split, shrink) or resumed (@p parent itself). */
void shim_join_by_parent(struct shim_join *j, ncclComm_t parent);
/** Over the communicator: its ranks are this process's (ncclCommInitAll), or must all run the shim. */
void shim_join_over_comm(struct shim_join *j);

/* ---- grow.c: how the ranks of a grown communicator meet ---- */

/**
 * The join of the communicator an ncclCommGrow made, from this rank's
 * arguments (@p parent NULL on a new rank, @p id NULL on the parent's ranks
 * but its root): SHIM_JOIN_GROW, to be resolved outside any group.
 */
void shim_join_grow(struct shim_join *j, int prof, ncclComm_t parent, int nranks, const ncclUniqueId *id,
                    int rank);
/**
 * Decide a SHIM_JOIN_GROW join (anything else is left as it is): COMM when
 * every rank of the grown communicator is seen to run the shim, else NONE,
 * the same on every rank. The parent's root and the new ranks meet at the
 * id's rendezvous; the parent's ranks then learn the root's verdict over
 * the parent. Every rank of an ncclCommGrow calls it, once, before any
 * other call on the parent.
 */
void shim_join_resolve(struct shim_join *j);
/**
 * The fixed exchange of @p comm, joined as @p j says, is over (@p complete:
 * it gathered every rank's record). Over the communicator, or at a
 * rendezvous that every rank reached, every rank of @p comm runs the shim:
 * what is made from it may then exchange over it.
 */
void shim_join_done(ncclComm_t comm, const struct shim_join *j, int complete);
/** @p comm is destroyed or aborted: its handle may come back for another communicator. */
void shim_join_forget(ncclComm_t comm);
/** 1 when every rank of @p comm was seen to run the shim (shim_join_done()). */
int shim_join_vouched(ncclComm_t comm);

/**
 * The real NCCL's size of @p comm, this rank in it and its CUDA device.
 * @return 0, or -1 when it does not answer (or the size is not positive)
 */
int shim_comm_place(int prof, ncclComm_t comm, int *nranks_p, int *rank_p, int *device_p);
/**
 * Set up our state beside a freshly initialised real communicator whose
 * ranks meet as @p j says. @return ncclSuccess, or an error (strict mode)
 * after which the real comm was destroyed
 */
ncclResult_t shim_comm_setup(int prof, ncclComm_t comm, const char *how, const struct shim_join *j);
/**
 * As shim_comm_setup() without the collective exchange: state for statistics only, calls go to NCCL
 * (a non-blocking communicator created in a group, comms a group could not keep).
 */
ncclResult_t shim_comm_setup_nonblocking(int prof, ncclComm_t comm, const char *how);
/**
 * A non-blocking communicator outside a group, whose init may still run: a placeholder (statistics
 * only) whose setup shim_comm_setup_deferred() runs at its first collective.
 */
ncclResult_t shim_comm_defer_setup(int prof, ncclComm_t comm, const char *how, const struct shim_join *j);
/**
 * The first collective on a deferred communicator (@p c referenced, its setup deferred): outside a
 * group and once the real ncclCommGetAsyncError says the init completed, its full setup runs here,
 * on this thread, before the call. Never from ncclCommGetAsyncError. @return the state to route the
 * call with, referenced (the reference to @p c is taken over), or NULL: the call goes to NCCL untouched.
 */
struct shim_comm *shim_comm_setup_deferred(struct shim_comm *c);
/**
 * Non-zero once a deferred communicator exists under MSCX_DISABLE or a bad setting: collectives must
 * then reach shim_comm_try_route(), which runs its fixed exchange.
 */
int shim_comm_deferred_disabled(void);
/**
 * Set up @p n communicators that this thread created together (ncclCommInitAll,
 * several inits in one group), each joining as @p joins[i] says (NULL: all
 * over the communicator). @return the first error, as shim_comm_setup()
 */
ncclResult_t shim_comm_setup_several(int prof, const ncclComm_t *comms, const struct shim_join *joins, int n,
                                     const char *how);

/* ---- group.c, group_end.c: ncclGroupStart/End on this thread ---- */

/** Thread-local group depth (outermost ncclGroupStart). */
int shim_group_depth(void);
/** Comms initialised inside a group (joining as @p j says): set up after the outermost ncclGroupEnd. */
void shim_group_defer(ncclComm_t comm, const struct shim_join *j);
void shim_group_enter(void);
/**
 * After the real ncclGroupEnd (or ncclGroupSimulateEnd) returned @p res:
 * leave one level; at the outermost, when @p res is ncclSuccess or
 * ncclInProgress (NCCL took the group), set up the communicators created in
 * the group and launch the calls kept for after its end. @return the result
 * for the application
 */
ncclResult_t shim_group_end(int prof, ncclResult_t res);
struct shim_coll_call;
/**
 * Non-zero while this thread is inside a group whose routable collectives
 * are kept for our executor. Read by every forwarder of a function that
 * takes a communicator.
 */
extern __thread int shim_group_collecting;
/**
 * Keep @p call (routable on a communicator of @p device) until the group
 * ends. @return ncclSuccess, or an error (no memory, no CUDA event for a
 * join) set for ncclGetLastError: the call did not run
 */
ncclResult_t shim_group_keep(const struct shim_coll_call *call, int device);
/**
 * @p comm (NULL: none) has an NCCL-bound call in the group: what is kept
 * on it from now on launches after NCCL's end.
 */
void shim_group_mark_forwarded(ncclComm_t comm);
/** Keep @p r as the group's error when it is the first one (ncclGroupEnd returns it). */
void shim_group_note_err(ncclResult_t r);
/** ncclGroupSimulateEnd comes: the kept calls go to NCCL, and so does the rest of the group. */
void shim_group_before_simulate(void);
/** Non-zero while this thread's group ends in ncclGroupSimulateEnd: every call goes to NCCL (reason group).
 */
int shim_group_simulated(void);
/**
 * Before the real ncclGroupEnd: at the outermost one, decide what the kept
 * sends and recvs become and launch the collectives kept before the group's
 * first NCCL-bound call.
 */
void shim_group_before_end(void);
/** Non-zero while sends and recvs may be kept: the group keeps no collective and forwarded nothing. */
int shim_group_p2p_open(void);
/** Make room for one more kept call. @return 0, or -1 without memory */
int shim_group_reserve(void);

/* ---- p2p.c: ncclSend and ncclRecv, and send/recv groups of an alltoall's shape ---- */

/** One ncclSend (sendbuf) or ncclRecv (recvbuf). */
struct shim_p2p_call {
    int prof;
    int is_send;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    ncclDataType_t dtype;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};
/** The intercepts of ncclSend and ncclRecv: kept in a collecting group, or forwarded and counted. */
ncclResult_t shim_p2p_call(const struct shim_p2p_call *p);
/** How many sends and recvs the collecting group keeps (all of one communicator). */
int shim_p2p_nkept(void);
/** The communicator of the kept sends and recvs (NULL: none kept). */
ncclComm_t shim_p2p_comm(void);
/** Forward the kept sends and recvs to NCCL in issue order. @return the first error */
ncclResult_t shim_p2p_to_nccl(void);
/**
 * A forwarder's hook before a call of the collecting group on @p comm (NULL:
 * none) goes to NCCL: the kept sends and recvs go first, and the
 * collectives kept on @p comm from now on launch after NCCL's group end.
 */
void shim_p2p_before_forward(ncclComm_t comm);
/**
 * At the outermost ncclGroupEnd, before NCCL's: the kept sends and recvs
 * become one kept AlltoAll when they have its shape and every rank agrees
 * (shim_comm_p2p_agree()); otherwise they go to NCCL in issue order.
 * @return the first error of a forwarded call
 */
ncclResult_t shim_p2p_group_end(void);

/* ---- teardown.c: the end of a communicator, async errors ---- */

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
/** Our asynchronous error of @p comm as an NCCL result (ncclSuccess when none). */
ncclResult_t shim_comm_async_error(ncclComm_t comm);

/* ---- route_call.c: routing a collective on a communicator of ours ---- */

/** Route or forward one collective: the body of the four intercepts. */
struct shim_coll_call {
    const char *fn;   /* the NCCL function called, for messages */
    enum shim_fn api; /* the same function (SHIM_FN_nccl*), to forward the call */
    int prof;         /* called through the pnccl* name */
    enum mscx_coll coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count; /* NCCL's count argument */
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;
    ncclComm_t comm;
    cudaStream_t stream;
    const void *config; /* the ncclCollConfig_t of an nccl<Coll>Config call (NULL: none) */
    int config_nccl;    /* that config asks for NCCL itself (coll_config.c): the call goes to NCCL */
};
/**
 * Try our executor. A count whose size overflows is NCCL's argument error;
 * a communicator not in our table goes to NCCL untouched; on one of ours,
 * bad arguments get NCCL's answer here. @return 1 when the
 * call was answered here (*res_p set: it ran on our executor or was refused),
 * 0 when it must go to NCCL.
 */
int shim_comm_try_route(const struct shim_coll_call *call, ncclResult_t *res_p);
/* p2p.c: the positions of a communicator and its vote on a send/recv group */
/** A send (@p is_send) or recv with @p peer on @p comm was handed to NCCL: count it in the positions. */
void shim_comm_p2p_count(ncclComm_t comm, int is_send, int peer);
/** Rank, size and device of @p comm when its sends and recvs are counted (a blocking setup). @return 0, or -1
 */
int shim_comm_p2p_tracked(ncclComm_t comm, uint32_t *rank_p, uint32_t *nranks_p, int *device_p);
/**
 * Whether the AlltoAll @p alltoall, made of one send/recv group whose local
 * conditions are @p yes (self included, one contiguous buffer per side,
 * under capture when ranks > 1), runs on our executor: with one rank, when
 * a plan takes it; with more, when every rank agrees (p2p_agree.c) on the
 * same group. On 1 the positions advance past the group; on 0 it is
 * counted as an AlltoAll that fell back (reason "sendrecv") and the caller
 * forwards the sends and recvs.
 */
int shim_comm_p2p_agree(const struct shim_coll_call *alltoall, int yes);
/**
 * The shim's answer to a collective call, plain or nccl<Coll>Config (intercept.c): shim_comm_try_route()
 * while the shim routes; a call it leaves to NCCL inside a collecting group first tells the group
 * (shim_p2p_before_forward()). @return 1 when answered (*@p res_p).
 */
int shim_coll_try_route(const struct shim_coll_call *call, ncclResult_t *res_p);
/** Look up the real @p name as @p fn, or return the loader's error from the calling intercept. */
#define REAL_OR_FAIL(fn, prof, name)                                                                         \
    shim_fn_##name##_t fn = SHIM_REAL(prof, name);                                                           \
    if (!fn)                                                                                                 \
        return shim_err_result();                                                                            \
    shim_err_clear()
/** Forward a collective to the real NCCL (forward.c: the function and name it was called by). */
ncclResult_t shim_coll_forward(const struct shim_coll_call *call);
/**
 * After the real ncclCommResume of a communicator whose state ncclCommSuspend dropped
 * (suspend.c): set it up again as after a blocking init (@p res: the real result).
 */
ncclResult_t shim_comm_after_resume(int prof, ncclResult_t res, ncclComm_t comm);

/* ---- devops.c: the device operations, from CUDA, none, or (test build) the fake NCCL's doubles ---- */

/**
 * Where a bootstrap runs (shim_dev_setup_ops.enter): its device current and
 * the thread in relaxed capture mode, as in NCCL's own setup, so that its
 * allocations and synchronisations never invalidate a graph capture of any
 * thread. What leave() restores:
 */
struct shim_dev_scope {
    int prev_dev; /* the caller's device, -1: unknown or unchanged */
    int mode;     /* the caller's capture mode (enum cudaStreamCaptureMode) */
    int mode_set; /* mode was exchanged: restore it */
};

/** A bootstrap's buffers, streams and device (boot.c). Every int result is 1 on success, 0 on failure. */
struct shim_dev_setup_ops {
    int host; /* buffers are host memory (the fake NCCL): nothing waits on a device */
    /** 1 when there is a device to set up on (always under host memory). */
    int (*have_device)(void);
    /** A buffer of @p n bytes in *@p p (NULL on failure). */
    int (*alloc)(void **p, size_t n);
    void (*free)(void *p);
    /** As alloc, but ordered on @p stream where @p device has memory pools: a free then waits for nothing
     * else. */
    int (*alloc_ordered)(void **p, size_t n, cudaStream_t stream, int device);
    void (*free_ordered)(void *p, cudaStream_t stream, int device);
    /** Pinned host memory, which the device reaches through unified addressing (NULL on failure). */
    int (*alloc_pinned)(void **p, size_t n);
    void (*free_pinned)(void *p);
    /** Host bytes into a buffer, ordered on @p stream. */
    int (*put)(void *dst, const void *src, size_t n, cudaStream_t stream);
    /** A buffer's bytes into host memory, after everything enqueued on @p stream. */
    int (*get)(void *dst, const void *src, size_t n, cudaStream_t stream);
    /** Wait for everything enqueued on @p stream. */
    int (*sync)(cudaStream_t stream);
    /** A private non-blocking stream on the current device; NULL when there is none. */
    cudaStream_t (*stream_create)(void);
    void (*stream_destroy)(cudaStream_t stream);
    /** 1 when nothing is left on @p stream (a query, which never waits). */
    int (*stream_idle)(cudaStream_t stream);
    /** Enter the scope of @p device; leave() it whatever this returns. */
    int (*enter)(int device, struct shim_dev_scope *sc);
    void (*leave)(const struct shim_dev_scope *sc);
    /** Make @p device (-1: none) this thread's current device; an error is left to the calls that follow. */
    void (*use_device)(int device);
};

/** The events that join the streams of a group (group.c). Every int result is 0 on success, -1 on failure. */
struct shim_dev_join_ops {
    /** An event without timing on @p device in *@p ev_p. */
    int (*event_create)(int device, void **ev_p);
    void (*event_destroy)(void *ev);
    int (*event_record)(void *ev, void *stream);
    /** Make @p stream wait for @p ev. */
    int (*stream_wait)(void *stream, void *ev);
    /** The current device, -1 when unknown; NULL (and set_device NULL): no devices to switch. */
    int (*get_device)(void);
    void (*set_device)(int device);
};

struct shim_dev_ops {
    struct shim_dev_setup_ops setup;
    struct shim_dev_join_ops join;
    /** 1 when @p stream is being captured into a graph; 0 when not or unknown. */
    int (*capturing)(cudaStream_t stream);
    /** 1 when the test suite asks for a local setup failure at @p point (shim_boot_fault()). */
    int (*fault)(const char *point);
    /** The text of the device runtime's last error, which it clears; NULL: no runtime. */
    const char *(*error_text)(void);
};

/**
 * The device operations, chosen once, part by part: in the test build of
 * the shim (MSCX_SHIM_TEST_DOUBLES), the test suite's fake NCCL's where the
 * real library exports them (host memory for the
 * bootstrap, its events, its capture query, its setup faults), else CUDA's
 * where the shim is built with CUDA, else none (no device, no event, no
 * capture: every operation fails).
 */
const struct shim_dev_ops *shim_dev_ops(void);
/**
 * 1 when the test suite's fake NCCL asks for a local setup failure at
 * @p point (comm-alloc, table, boot, agree-alloc), in the test build of the
 * shim alone; always 0 in the product and with a real NCCL.
 */
int shim_boot_fault(const char *point);

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
 * A real call on a non-blocking communicator that returns ncclInProgress is waited for by polling
 * ncclCommGetAsyncError; a wait of @p bs also ends when *@p stop becomes non-zero (NULL: never).
 */
void shim_boot_watch(struct mscx_bootstrap *bs, const int *stop);
/** Make @p device this thread's current CUDA device (nothing without CUDA or under the fake NCCL). */
void shim_boot_use_device(int device);
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
 * @p mine into @p all ([nranks] records; NULL: not read), with no header round.
 */
mscx_status_t shim_boot_fixed(struct mscx_bootstrap *bs, const void *mine, void *all);
/**
 * One fixed exchange over @p comm without a bootstrap of its own: for a rank
 * whose bootstrap could not be set up (@p mine, a "fall back" record, is
 * sent; @p all NULL: the others' records are not read), or for a single
 * exchange (@p all: [nranks] records). @return MSCX_OK, MSCX_ERR_UNSUPPORTED
 * (no device: no exchange anywhere) or the error that kept this rank out of it.
 */
mscx_status_t shim_boot_fixed_once(ncclComm_t comm, int prof, uint32_t rank, uint32_t nranks, int cuda_device,
                                   const void *mine, void *all);

/* ---- p2p_agree.c: host-side agreement to run a send/recv group as an alltoall ---- */

/** The most ranks an agreement segment serves (one bit each in a 64-bit mask). */
#define SHIM_P2P_AGREE_MAX_RANKS 64

struct shim_p2p_agree;

/**
 * What one rank brings to the agreement for one send/recv group. Give the
 * positions with a no too: a rank that comes after that round then gives up
 * at once. Vote once per group.
 */
struct shim_p2p_point {
    uint64_t bytes; /* bytes of every send and recv of the group */
    int32_t dtype;  /* ncclDataType_t of the group */
    int yes;        /* 0: this rank will not run the plan for this group (the others must not either) */
    const uint64_t
        *sent; /* [nranks]: sends to rank j this rank issued on the communicator before the group */
    const uint64_t *received; /* [nranks]: recvs from rank j this rank issued before the group */
};

/**
 * Map the agreement segment of a communicator whose @p nranks ranks are all
 * on this host; its name is derived from @p secret (the same on every rank),
 * never holding it. The first rank to come creates it, the others map it;
 * the last of the nranks to map it unlinks the name (the mappings stay).
 * @return MSCX_OK, MSCX_ERR_UNSUPPORTED (nranks > SHIM_P2P_AGREE_MAX_RANKS),
 * MSCX_ERR_SYSTEM, MSCX_ERR_NO_MEMORY or MSCX_ERR_INVALID_ARG
 */
mscx_status_t shim_p2p_agree_open(const uint8_t secret[SHIM_SECRET_BYTES], uint32_t rank, uint32_t nranks,
                                  struct shim_p2p_agree **a_p);
/**
 * Vote on one send/recv group; waits at most about @p timeout_ms for the
 * other ranks. @return 1 when every rank of the communicator posted yes for
 * the same logical group: run the plan; 0 when not (a no, positions that
 * disagree, a broken segment, or a round not complete in time). Every rank
 * that posted in one round gets the same answer.
 */
int shim_p2p_agree_vote(struct shim_p2p_agree *a, const struct shim_p2p_point *p, uint64_t timeout_ms);
/**
 * Unmap; rank 0 (and the last handle to close) also unlinks the name, which
 * is gone already once every rank has opened it. NULL is accepted.
 */
void shim_p2p_agree_close(struct shim_p2p_agree *a);

#endif /* MSCX_SHIM_INT_H */
