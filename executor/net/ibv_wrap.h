/* SPDX-License-Identifier: MIT */
/**
 * @file ibv_wrap.h
 * libibverbs opened at run time (dlopen of MSCX_IBV_SO) behind one table, so
 * nothing links against it and the shim loads where there is no RDMA stack.
 * The data-path calls ibv_post_send() / ibv_poll_cq() are static inlines of
 * verbs.h that go through the context's ops table and need no symbol.
 */
#ifndef MSCX_IBV_WRAP_H
#define MSCX_IBV_WRAP_H

#include <infiniband/verbs.h>

#include "mscx/status.h"

struct mscx_ibv {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    /** NULL when the library predates IBVERBS_1.12 (no dmabuf, so no GPUDirect that way). */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                                    int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx, struct ibv_comp_channel *ch,
                                int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
};

/**
 * Load libibverbs from the configured MSCX_IBV_SO (once per distinct path;
 * a changed override loads the new path). Symbols are resolved with dlvsym
 * against IBVERBS_1.1 (IBVERBS_1.12 for ibv_reg_dmabuf_mr), falling back to
 * IBVERBS_1.0 / unversioned lookup.
 * @param ibv_p receives a table valid until process exit
 * @return MSCX_OK, MSCX_ERR_UNSUPPORTED when the library cannot be opened
 *         (logged at INFO: no RDMA here is normal), MSCX_ERR_IBV when a
 *         required symbol is missing
 */
mscx_status_t mscx_ibv_load(const struct mscx_ibv **ibv_p);

/** @return a static name for a completion status (ibv_wc_status_str without the symbol). */
const char *mscx_ibv_wc_status_str(enum ibv_wc_status st);

#endif /* MSCX_IBV_WRAP_H */
