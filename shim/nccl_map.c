/* SPDX-License-Identifier: MIT */
/* NCCL's datatypes and ops to ours, and our status to NCCL's result: the one mapping of each. */
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

SHIM_HOT int shim_dtype_map(ncclDataType_t dt, enum mscx_dtype *out_p)
{
    switch (dt) {
    case ncclInt8:
        *out_p = MSCX_DT_INT8;
        return 0;
    case ncclUint8:
        *out_p = MSCX_DT_UINT8;
        return 0;
    case ncclInt32:
        *out_p = MSCX_DT_INT32;
        return 0;
    case ncclUint32:
        *out_p = MSCX_DT_UINT32;
        return 0;
    case ncclInt64:
        *out_p = MSCX_DT_INT64;
        return 0;
    case ncclUint64:
        *out_p = MSCX_DT_UINT64;
        return 0;
    case ncclFloat16:
        *out_p = MSCX_DT_FP16;
        return 0;
    case ncclFloat32:
        *out_p = MSCX_DT_FP32;
        return 0;
    case ncclFloat64:
        *out_p = MSCX_DT_FP64;
        return 0;
    case ncclBfloat16:
        *out_p = MSCX_DT_BF16;
        return 0;
    default:
        return -1; /* fp8 types and anything newer */
    }
}

SHIM_HOT int shim_redop_map(ncclRedOp_t op, enum mscx_redop *out_p)
{
    switch (op) {
    case ncclSum:
        *out_p = MSCX_REDOP_SUM;
        return 0;
    case ncclProd:
        *out_p = MSCX_REDOP_PROD;
        return 0;
    case ncclMin:
        *out_p = MSCX_REDOP_MIN;
        return 0;
    case ncclMax:
        *out_p = MSCX_REDOP_MAX;
        return 0;
    default:
        return -1; /* ncclAvg and PreMulSum (dynamic) ops */
    }
}

SHIM_HOT size_t shim_dtype_bytes(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 1; /* fp8 */
    }
}
