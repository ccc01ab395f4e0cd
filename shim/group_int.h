/* SPDX-License-Identifier: MIT */
/*
 * This thread's group, as group.c keeps it while calls come and
 * group_end.c ends it: private to those two files.
 */
#ifndef MSCX_SHIM_GROUP_INT_H
#define MSCX_SHIM_GROUP_INT_H

#include "shim_int.h"

#define GROUP_MAX_PENDING 64
#define GROUP_MAX_FORWARDED 32

struct kept_call {
    struct shim_coll_call call;
#ifdef SHIM_HAVE_ncclAllReduceConfig
    ncclCollConfig_t config; /* a copy of an nccl<Coll>Config call's config, which may not outlive the call */
#endif
    int device;
    int before;      /* issued before any NCCL-bound call of its communicator in the group */
    int lead;        /* index of the first kept call of the same communicator: its stream is the join's */
    int new_stream;  /* the first kept call of its communicator on this stream */
    int join_failed; /* on a lead: joining its communicator's streams failed, none of its calls run */
};

struct shim_group_state {
    int depth;
    ncclComm_t pending[GROUP_MAX_PENDING];     /* communicators created in the group */
    struct shim_join joins[GROUP_MAX_PENDING]; /* of pending */
    int npending;
    int overflow; /* more were created than pending holds */
    struct kept_call *kept;
    int nkept, cap_kept;
    ncclComm_t forwarded[GROUP_MAX_FORWARDED]; /* communicators with an NCCL-bound call in the group */
    int nforwarded;                            /* -1: more than the list holds, every one counts */
    int nlaunched;                             /* kept calls launched before the real ncclGroupEnd */
    int simulated;                             /* the group ends in ncclGroupSimulateEnd */
    ncclResult_t err; /* the first error of a call forwarded in the group or launched before its end */
};

extern __thread struct shim_group_state shim_grp;

/*
 * The stream operations of a join (devops.c): CUDA's, or in the shim's test
 * build the test suite's fake NCCL's, which record what a join does. Without
 * either there is no event: keeping a call on a second stream of a
 * communicator then fails.
 */
static inline const struct shim_dev_join_ops *shim_group_join_ops(void)
{
    return &shim_dev_ops()->join;
}

/** This thread's event on @p device, made on first use. @return NULL when there is none */
void *shim_group_event(int device);

#endif /* MSCX_SHIM_GROUP_INT_H */
