/* SPDX-License-Identifier: MIT */
/*
 * ncclRedOpCreatePreMulSum and ncclRedOpDestroy: forwarded to the real NCCL,
 * which makes and checks the op; an op it made on one of our communicators
 * for fp32, fp16 or bf16 is also kept (redop_table.c) with its scalar (read
 * now for ncclScalarHostImmediate, as NCCL does; the device pointer for
 * ncclScalarDevice, read by each launch), so that calls with it can route
 * as scaled sums. Any other op stays NCCL's: its calls go there.
 */
#include <string.h>

#include "shim_int.h"

/* Keep op @p op that NCCL made on @p comm, when a call with it can route. */
static void keep_op(ncclRedOp_t op, const void *scalar, ncclDataType_t datatype,
                    ncclScalarResidence_t residence, ncclComm_t comm)
{
    struct shim_comm *c = shim_comm_get(comm);
    if (!c)
        return; /* not a communicator we set up */
    shim_comm_put(c);
    struct mscx_scale s = {MSCX_SCALE_NONE, 0, NULL};
    enum mscx_dtype dt;
    int usable = scalar && shim_dtype_map(datatype, &dt) == 0 &&
                 (dt == MSCX_DT_FP32 || dt == MSCX_DT_FP16 || dt == MSCX_DT_BF16);
    if (usable && residence == ncclScalarHostImmediate) {
        uint32_t bits = 0;
        memcpy(&bits, scalar, dt == MSCX_DT_FP32 ? 4 : 2);
        s.kind = MSCX_SCALE_HOST;
        s.value_bits = bits;
    } else if (usable && residence == ncclScalarDevice) {
        s.kind = MSCX_SCALE_DEVICE;
        s.dev_ptr = scalar;
    }
    if (s.kind == MSCX_SCALE_NONE) {
        shim_redop_forget(comm, op);
        return;
    }
    if (shim_redop_record(comm, op, datatype, &s) != 0)
        shim_warn_once("redop-table-full",
                       "mscx: too many PreMulSum ops live at once; calls with the ops made "
                       "after the table filled go to NCCL");
}

ncclResult_t shim_ncclRedOpCreatePreMulSum(int prof, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                           ncclScalarResidence_t residence, ncclComm_t comm)
{
    shim_fn_ncclRedOpCreatePreMulSum_t fn = SHIM_REAL(prof, ncclRedOpCreatePreMulSum);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    ncclResult_t res = fn(op, scalar, datatype, residence, comm);
    if (res == ncclSuccess && op)
        keep_op(*op, scalar, datatype, residence, comm);
    return res;
}

ncclResult_t shim_ncclRedOpDestroy(int prof, ncclRedOp_t op, ncclComm_t comm)
{
    shim_fn_ncclRedOpDestroy_t fn = SHIM_REAL(prof, ncclRedOpDestroy);
    if (!fn)
        return shim_err_result();
    shim_err_clear();
    shim_redop_forget(comm, op); /* first: no call may route with it once NCCL has freed it */
    return fn(op, comm);
}
