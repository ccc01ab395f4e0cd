/* SPDX-License-Identifier: MIT */
/*
 * ncclGroupStart/End on this thread: the depth, and the communicators
 * created inside a group, which are set up after the outermost
 * ncclGroupEnd (their real init completes there).
 */
#include "shim_int.h"

#define GROUP_MAX_PENDING 64

static __thread int group_depth;
static __thread ncclComm_t group_pending[GROUP_MAX_PENDING];
static __thread int group_npending;
static __thread int group_overflow;

int shim_group_depth(void)
{
    return group_depth;
}

void shim_group_defer(ncclComm_t comm)
{
    if (group_npending < GROUP_MAX_PENDING)
        group_pending[group_npending++] = comm;
    else
        group_overflow = 1;
}

/* After the outermost ncclGroupEnd succeeded: set up the communicators created in the group. */
ncclResult_t shim_group_flush(int prof)
{
    int n = group_npending;
    int overflow = group_overflow;
    group_npending = 0;
    group_overflow = 0;
    if (overflow) {
        /* more than we kept: none of them can run an exchange with the others */
        ncclResult_t res = ncclSuccess;
        for (int i = 0; i < n; i++) {
            ncclResult_t r = shim_comm_setup_nonblocking(prof, group_pending[i], "in a group");
            if (r != ncclSuccess && res == ncclSuccess)
                res = r;
        }
        return res;
    }
    return shim_comm_setup_several(prof, group_pending, n, "in a group");
}

void shim_group_drop(void)
{
    group_npending = 0;
    group_overflow = 0;
}

void shim_group_enter(void)
{
    group_depth++;
}

int shim_group_leave(void)
{
    if (group_depth > 0)
        group_depth--;
    return group_depth;
}
