/* SPDX-License-Identifier: MIT */
/*
 * The path of every collective call: a count whose size overflows is the
 * caller's error; on a communicator of ours, its sticky error, NCCL's
 * argument checks, the decision (route.c's pick, then the symmetric window
 * rule), and the launch on the executor, or the answer "go to NCCL" with
 * the reason counted.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "comm_int.h"
#include "mscx/env.h"
#include "mscx/log.h"

/*
 * The datatype count of the newest NCCL the shim knows (fp8 ends at 11 since 2.24). A type at or past
 * the ncclNumTypes of the nccl.h the shim was built on but below this count is one that header lacks
 * (fp8 on a header before 2.24): only the library knows whether it takes it, so the call is NCCL's.
 */
#define SHIM_NCCL_NUM_TYPES_NEWEST 12

SHIM_HOT static int dtype_newer(ncclDataType_t dt)
{
    return (int)dt >= (int)ncclNumTypes && (int)dt < SHIM_NCCL_NUM_TYPES_NEWEST;
}

/*
 * The size of a call must be a number: count x element size, times the rank
 * count for the collectives whose buffers hold one block per rank (AllGather,
 * ReduceScatter, AlltoAll), must fit in a size_t. A count past that is a
 * caller's error, answered with ncclInvalidArgument and its reason before
 * anything is routed, kept or forwarded: a wrapped byte count would
 * otherwise look like a small message.
 */
/* The rank count of @p comm from the real NCCL, 0 when it cannot say. */
static uint64_t comm_ranks(int prof, ncclComm_t comm)
{
    shim_fn_ncclCommCount_t count = SHIM_REAL(prof, ncclCommCount);
    int n = 0;
    if (!count || !comm || count(comm, &n) != ncclSuccess || n <= 0)
        return 0;
    return (uint64_t)n;
}

int shim_count_overflows(int prof, const char *fn, size_t count, ncclDataType_t dt, int per_rank,
                         ncclComm_t comm, ncclResult_t *res_p)
{
    uint64_t es = shim_dtype_bytes(dt), n;
    if (count > SIZE_MAX / es) {
        *res_p =
            shim_err_set(ncclInvalidArgument, "mscx: %s: count %zu x %llu-byte elements overflows a size_t",
                         fn, count, (unsigned long long)es);
        return 1;
    }
    uint64_t bytes = (uint64_t)count * es;
    if (!per_rank || bytes <= SIZE_MAX / INT_MAX) /* no rank count can take it past SIZE_MAX */
        return 0;
    n = comm_ranks(prof, comm);
    if (n == 0 || bytes <= SIZE_MAX / n)
        return 0;
    *res_p = shim_err_set(ncclInvalidArgument,
                          "mscx: %s: count %zu x %llu-byte elements x %llu ranks overflows a size_t", fn,
                          count, (unsigned long long)es, (unsigned long long)n);
    return 1;
}

/* NCCL's own answer to a bad datatype, op or broadcast root of a collective on one of our comms. */
SHIM_HOT static ncclResult_t check_args(const struct shim_comm *c, const struct shim_coll_call *call)
{
    int has_op = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    int bad_root = call->root < 0 || (uint32_t)call->root >= c->nranks;
    if (call->coll == MSCX_COLL_BROADCAST && c->nranks && bad_root)
        return shim_err_set(ncclInvalidArgument,
                            "mscx: %s: invalid root %d (root should be in the 0..%u range)", call->fn,
                            call->root, c->nranks - 1);
    if ((int)call->dtype < 0 || ((int)call->dtype >= (int)ncclNumTypes && !dtype_newer(call->dtype)))
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid datatype %d", call->fn, (int)call->dtype);
    if (has_op && (int)call->op < 0)
        return shim_err_set(ncclInvalidArgument, "mscx: %s: invalid reduction operation %d", call->fn,
                            (int)call->op);
    return ncclSuccess;
}

/* The routing decision for a call of @p msg bytes: @return the route, or -1 with the reason. */
SHIM_HOT static int decide(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                           enum shim_reason *why_p)
{
    if (!c->exec) {
        *why_p = SHIM_WHY_NO_STATE;
        return -1;
    }
    if (call->config_nccl) { /* the same config on every rank (NCCL's rule for nccl<Coll>Config) */
        *why_p = SHIM_WHY_CONFIG;
        return -1;
    }
    struct shim_route_query q = {
        .coll = call->coll,
        .nranks = c->nranks,
        .ranks_per_node = c->rpn,
        .msg_bytes = msg,
        .dtype = call->dtype,
        .op = call->op,
        .root = call->root,
        .forced_mask = c->forced,
        .group_fallback = shim_group_simulated(),
        .comm = call->comm,
    };
    int pick = (unsigned)call->coll < MSCX_COLL_COUNT
                   ? shim_route_pick_windowed(&q, c->route, c->nroute, &c->win[call->coll], why_p)
                   : shim_route_pick(&q, c->route, c->nroute, why_p);
    /*
     * Buffers in symmetric NCCL windows may take NCCL's symmetric kernels, faster than the NCCL
     * our plans' ranges were measured against: only a plan measured faster than those takes them.
     * A local fact, but rank-uniform as NCCL's own choice of those kernels is: a symmetric window
     * binds every rank to pass such buffers at the same offsets.
     */
    if (pick >= 0 && !c->route[pick].beats_nccl_window && shim_window_covers_call(call)) {
        *why_p = SHIM_WHY_WINDOW;
        return -1;
    }
    return pick;
}

/* decide(), out of line for the vote on a send/recv group (p2p.c). */
int shim_comm_decide(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                     enum shim_reason *why_p)
{
    return decide(c, call, msg, why_p);
}

/*
 * Launch a call on route @p pick. Out of line: the fallback path, which
 * never gets here, then saves fewer registers.
 * @return as shim_comm_try_route()
 */
__attribute__((noinline)) static int launch(struct shim_comm *c, const struct shim_coll_call *call,
                                            uint64_t msg, int pick, ncclResult_t *res_p)
{
    if (!call->recvbuf || (!call->sendbuf && call->coll != MSCX_COLL_BROADCAST)) {
        *res_p = shim_err_set(ncclInvalidArgument, "mscx: %s: null buffer with count %zu",
                              mscx_coll_name(call->coll), call->count);
        return 1;
    }
    enum mscx_dtype dt;
    enum mscx_redop op = MSCX_REDOP_SUM;
    struct mscx_scale scale = {MSCX_SCALE_NONE, 0, NULL}; /* ncclAvg, PreMulSum: a scaled sum */
    shim_dtype_map(call->dtype, &dt);
    if ((call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER) &&
        shim_redop_resolve(call->comm, c->nranks, call->op, call->dtype, &op, &scale) != 0) {
        shim_stats_add(c, call->coll, msg,
                       SHIM_WHY_OP); /* its PreMulSum op was destroyed since the decision */
        return 0;
    }
    const struct mscx_config *cfg = shim_config();
    enum mscx_pkt_format pkt = cfg && cfg->packet >= 0 ? (enum mscx_pkt_format)cfg->packet : MSCX_PKT_LL16;
    mscx_status_t st = mscx_exec_launch_scaled(c->exec, c->exec_id[pick], call->sendbuf, call->recvbuf, msg,
                                               dt, op, &scale, pkt, (void *)call->stream);
    if (st == MSCX_OK) {
        shim_stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
        atomic_fetch_add_explicit(&c->route_calls[pick], 1, memory_order_relaxed);
        *res_p = ncclSuccess;
        return 1;
    }
    if (st == MSCX_ERR_INVALID_ARG || st == MSCX_ERR_UNSUPPORTED) {
        /* refused before anything was enqueued: this call goes to NCCL */
        char key[1200];
        snprintf(key, sizeof(key), "launch:%s", c->route_name[pick]);
        shim_warn_once(key, "mscx: plan %s refused a launch of %llu bytes (%s); such calls go to NCCL",
                       c->route_name[pick], (unsigned long long)msg, mscx_status_str(st));
        shim_stats_add(c, call->coll, msg, SHIM_WHY_LAUNCH);
        return 0;
    }
    *res_p = shim_err_set(shim_status_to_nccl(st), "mscx: %s launch failed: %s", mscx_coll_name(call->coll),
                          mscx_status_str(st));
    return 1;
}

/* The answer to a call on a communicator whose kernel failed, with NCCL's code for the error. */
static ncclResult_t comm_error_result(const struct shim_comm *c, const struct shim_coll_call *call,
                                      mscx_status_t st)
{
    return shim_err_set(shim_status_to_nccl(st),
                        "mscx: %s on comm %p: an earlier mscx kernel of this "
                        "communicator failed (%s); the communicator must be aborted",
                        call->fn, (void *)c->comm, mscx_status_str(st));
}

/*
 * At one rank a collective in place with a built-in operation leaves its
 * buffer as it is: NCCL itself launches nothing for it. When no plan takes
 * such a call because of what it is (its size, datatype, op or root, or no
 * plan of its collective), the shim answers it instead of forwarding it,
 * which costs the caller less than NCCL's own checks. In a group it is no
 * NCCL-bound call: it has no effect to order.
 * Not when the call must go to NCCL (forced, a simulated group, a
 * registered window, a refused launch), not for ncclAvg and PreMulSum ops
 * (NCCL scales, a kernel), and not with a null buffer (NCCL's argument
 * error).
 */
static int identity_serves(const struct shim_comm *c, const struct shim_coll_call *call, uint64_t msg,
                           enum shim_reason why)
{
    enum mscx_redop op;
    int reduces = call->coll == MSCX_COLL_ALLREDUCE || call->coll == MSCX_COLL_REDUCESCATTER;
    int plans_lack = why == SHIM_WHY_SIZE || why == SHIM_WHY_NO_PLAN || why == SHIM_WHY_DTYPE ||
                     why == SHIM_WHY_OP || why == SHIM_WHY_ROOT;
    return c->nranks == 1 && plans_lack && msg > 0 && call->recvbuf && call->sendbuf == call->recvbuf &&
           (!reduces || shim_redop_map(call->op, &op) == 0);
}

SHIM_HOT int shim_comm_try_route(const struct shim_coll_call *call, ncclResult_t *res_p)
{
    struct shim_comm *c = shim_comm_get(call->comm);
    if (c && atomic_load_explicit(&c->deferred, memory_order_relaxed))
        c = shim_comm_setup_deferred(c);
    if (!c) {
        if (shim_group_collecting)
            shim_group_before_forward(call->comm); /* a call of the group that is not ours */
        return 0;                                  /* not a communicator we set up: NCCL's alone */
    }
    int answered = 1;
    mscx_status_t failed = shim_comm_error(c);
    if (failed != MSCX_OK) {
        *res_p = comm_error_result(c, call, failed);
    } else if ((*res_p = check_args(c, call)) == ncclSuccess) {
        uint64_t msg = (uint64_t)call->count * shim_dtype_bytes(call->dtype);
        if (call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER ||
            call->coll == MSCX_COLL_ALLTOALL)
            msg *= c->nranks ? c->nranks : 1;
        enum shim_reason why;
        int pick = -1;
        if (dtype_newer(call->dtype))
            why = SHIM_WHY_DTYPE;
        else
            pick = decide(c, call, msg, &why);
        if (pick >= 0 && shim_group_collecting) {
            *res_p = shim_group_keep(call, c->device); /* launched around the group's end (group.c) */
        } else if (pick >= 0) {
            answered = launch(c, call, msg, pick, res_p);
        } else if (!dtype_newer(call->dtype) && identity_serves(c, call, msg, why)) {
            shim_stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
            if ((unsigned)call->coll < NSTAT_COLL)
                atomic_fetch_add_explicit(&c->identity_calls[call->coll], 1, memory_order_relaxed);
        } else {
            if (shim_group_collecting)
                shim_group_before_forward(call->comm);
            shim_stats_add(c, call->coll, msg, why);
            answered = 0;
        }
    }
    shim_comm_unref(c);
    return answered;
}

SHIM_HOT int shim_coll_try_route(const struct shim_coll_call *call, ncclResult_t *res_p)
{
    int per_rank = call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER ||
                   call->coll == MSCX_COLL_ALLTOALL;
    return (shim_routing_on() || shim_comm_deferred_disabled()) &&
           (shim_count_overflows(call->prof, call->fn, call->count, call->dtype, per_rank, call->comm,
                                 res_p) ||
            shim_comm_try_route(call, res_p));
}
