/* SPDX-License-Identifier: MIT */
#include "mscx/status.h"

const char *mscx_status_str(mscx_status_t status)
{
    switch (status) {
    case MSCX_OK:
        return "success";
    case MSCX_INPROGRESS:
        return "operation in progress";
    case MSCX_ERR_INVALID_ARG:
        return "invalid argument";
    case MSCX_ERR_NO_MEMORY:
        return "out of memory";
    case MSCX_ERR_CUDA:
        return "CUDA error";
    case MSCX_ERR_IBV:
        return "verbs (RDMA) error";
    case MSCX_ERR_SYSTEM:
        return "system error";
    case MSCX_ERR_PLAN:
        return "invalid execution plan";
    case MSCX_ERR_TIMEOUT:
        return "timed out";
    case MSCX_ERR_UNSUPPORTED:
        return "unsupported";
    case MSCX_ERR_INTERNAL:
        return "internal error";
    case MSCX_ERR_REMOTE:
        return "remote peer failed";
    }
    return "unknown status";
}
