/* SPDX-License-Identifier: MIT */
/*
 * GPU memory on the RDMA transport: a dmabuf of the memory
 * (cuMemGetHandleForAddressRange, reached through the runtime's driver
 * entry point, so nothing links libcuda) registered on the endpoint, so
 * that peers on other nodes write it directly (GPUDirect RDMA).
 */
#include <unistd.h>
#include "mscx/log.h"
#include "port_int.h"

typedef int (*get_handle_fn)(void *handle, unsigned long long dptr, size_t size, int type,
                             unsigned long long flags);
#define DMABUF_HANDLE_TYPE 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */

static get_handle_fn dmabuf_entry(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return (get_handle_fn)fn;
}

int mscx_gpu_dmabuf_available(void)
{
    return dmabuf_entry() != NULL;
}

mscx_status_t mscx_gpu_ib_register(struct gpu_net *n, void *base, size_t len, struct mscx_tp_mr **mr_p,
                                   struct mscx_tp_rdesc *desc_p)
{
    get_handle_fn get = dmabuf_entry();
    uintptr_t a = (uintptr_t)base & ~(uintptr_t)4095, e = ((uintptr_t)base + len + 4095) & ~(uintptr_t)4095;
    int fd = -1;
    if (!get) {
        MSCX_WARN(
            "ib: cuMemGetHandleForAddressRange is not available: no GPUDirect RDMA (set MSCX_TRANSPORT tcp)");
        return MSCX_ERR_UNSUPPORTED;
    }
    int rc = get(&fd, (unsigned long long)a, e - a, DMABUF_HANDLE_TYPE, 0);
    if (rc != 0 || fd < 0) {
        MSCX_WARN(
            "ib: no dmabuf for GPU memory %p + %zu (cuMemGetHandleForAddressRange error %d): no GPUDirect "
            "RDMA here (set MSCX_TRANSPORT tcp)",
            base, len, rc);
        return MSCX_ERR_UNSUPPORTED;
    }
    mscx_status_t st = n->tp->mr_register(n->ep, (void *)a, e - a, MSCX_TP_MR_GPU | MSCX_TP_MR_REMOTE_WRITE,
                                          fd, mr_p, desc_p);
    close(fd); /* the registration holds its own reference */
    if (st == MSCX_OK) {
        desc_p->addr =
            (uint64_t)(uintptr_t)base; /* remote addresses are virtual: the cover's key reaches these */
        desc_p->len = len;
    }
    return st;
}
