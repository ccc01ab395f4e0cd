/* SPDX-License-Identifier: MIT */
/* The GPU executor API in builds without CUDA: every call is unsupported. */
#include <stddef.h>
#include "mscx/exec.h"

mscx_status_t mscx_exec_create(const struct mscx_bootstrap *bs, int cuda_device, struct mscx_exec **exec_p)
{
    (void)bs;
    (void)cuda_device;
    if (exec_p)
        *exec_p = NULL;
    return MSCX_ERR_UNSUPPORTED;
}

mscx_status_t mscx_exec_add_plan(struct mscx_exec *ex, const struct mscx_plan *plan, uint64_t max_msg_bytes,
                                 uint32_t *plan_id_p)
{
    (void)ex;
    (void)plan;
    (void)max_msg_bytes;
    (void)plan_id_p;
    return MSCX_ERR_UNSUPPORTED;
}

mscx_status_t mscx_exec_launch(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf, void *recvbuf,
                               uint64_t msg_bytes, enum mscx_dtype dtype, enum mscx_redop op,
                               enum mscx_pkt_format pkt, void *stream)
{
    (void)ex;
    (void)plan_id;
    (void)sendbuf;
    (void)recvbuf;
    (void)msg_bytes;
    (void)dtype;
    (void)op;
    (void)pkt;
    (void)stream;
    return MSCX_ERR_UNSUPPORTED;
}

mscx_status_t mscx_exec_launch_scaled(struct mscx_exec *ex, uint32_t plan_id, const void *sendbuf,
                                      void *recvbuf, uint64_t msg_bytes, enum mscx_dtype dtype,
                                      enum mscx_redop op, const struct mscx_scale *scale,
                                      enum mscx_pkt_format pkt, void *stream)
{
    (void)scale;
    return mscx_exec_launch(ex, plan_id, sendbuf, recvbuf, msg_bytes, dtype, op, pkt, stream);
}

mscx_status_t mscx_exec_async_error(struct mscx_exec *ex)
{
    (void)ex;
    return MSCX_ERR_UNSUPPORTED;
}

const volatile int32_t *mscx_exec_error_word(struct mscx_exec *ex)
{
    (void)ex;
    return NULL;
}

void mscx_exec_abort(struct mscx_exec *ex)
{
    (void)ex;
}

void mscx_exec_destroy(struct mscx_exec *ex)
{
    (void)ex;
}

void mscx_exec_destroy_deferred(struct mscx_exec *ex)
{
    (void)ex;
}

mscx_status_t mscx_exec_create_local_group(uint32_t nranks, int cuda_device, struct mscx_exec **execs)
{
    (void)nranks;
    (void)cuda_device;
    (void)execs;
    return MSCX_ERR_UNSUPPORTED;
}
