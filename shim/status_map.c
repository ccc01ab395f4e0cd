/* SPDX-License-Identifier: MIT */
/* The one mapping from mscx_status_t to ncclResult_t. */
#include "shim_int.h"

ncclResult_t shim_status_to_nccl(mscx_status_t st)
{
    switch (st) {
    case MSCX_OK:
        return ncclSuccess;
    case MSCX_INPROGRESS:
        return ncclInProgress;
    case MSCX_ERR_INVALID_ARG:
        return ncclInvalidArgument;
    case MSCX_ERR_PLAN:
    case MSCX_ERR_UNSUPPORTED:
        return ncclInvalidUsage;
    case MSCX_ERR_CUDA:
        return ncclUnhandledCudaError;
    case MSCX_ERR_REMOTE:
        return ncclRemoteError;
    case MSCX_ERR_NO_MEMORY:
    case MSCX_ERR_IBV:
    case MSCX_ERR_SYSTEM:
    case MSCX_ERR_TIMEOUT:
        return ncclSystemError;
    case MSCX_ERR_INTERNAL:
        return ncclInternalError;
    }
    return ncclInternalError;
}
