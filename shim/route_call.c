/* SPDX-License-Identifier: MIT */
/*
 * The path of every collective call on a communicator of ours: its sticky
 * error, the decision (decide.c), and the launch on the executor, kept for
 * the end of a collecting group, or the answer "go to NCCL" with the reason
 * counted.
 */
#include <stdio.h>

#include "comm_int.h"
#include "mscx/env.h"
#include "mscx/log.h"
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
    int per_rank = call->coll == MSCX_COLL_ALLGATHER || call->coll == MSCX_COLL_REDUCESCATTER ||
                   call->coll == MSCX_COLL_ALLTOALL;
    if (shim_count_overflows(call->prof, call->fn, call->count, call->dtype, per_rank, call->comm, res_p))
        return 1;
    struct shim_comm *c = shim_comm_get(call->comm);
    if (c && atomic_load_explicit(&c->deferred, memory_order_relaxed))
        c = shim_comm_setup_deferred(c);
    if (!c)
        return 0; /* not a communicator we set up: NCCL's alone */
    int answered = 1;
    mscx_status_t failed = shim_comm_error(c);
    if (failed != MSCX_OK) {
        *res_p = comm_error_result(c, call, failed);
    } else {
        uint64_t msg = 0;
        enum shim_reason why = SHIM_WHY_ROUTED;
        int pick = shim_comm_pick(c, call, &msg, &why, res_p);
        if (pick == SHIM_PICK_ANSWERED) {
            /* NCCL's own answer to a bad argument */
        } else if (pick >= 0 && shim_group_collecting) {
            if (shim_p2p_nkept() > 0)
                shim_p2p_before_forward(NULL); /* sends and recvs beside a collective are no AlltoAll */
            *res_p = shim_group_keep(call, c->device); /* launched around the group's end (group_end.c) */
        } else if (pick >= 0) {
            answered = launch(c, call, msg, pick, res_p);
        } else if (!shim_dtype_newer(call->dtype) && identity_serves(c, call, msg, why)) {
            shim_stats_add(c, call->coll, msg, SHIM_WHY_ROUTED);
            if ((unsigned)call->coll < NSTAT_COLL)
                atomic_fetch_add_explicit(&c->identity_calls[call->coll], 1, memory_order_relaxed);
        } else {
            shim_stats_add(c, call->coll, msg, why);
            answered = 0;
        }
    }
    shim_comm_unref(c);
    return answered;
}
