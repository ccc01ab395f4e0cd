/* SPDX-License-Identifier: MIT */
/*
 * The PyTorch side of the two-copies test: a library linked with copy A (the
 * fake libnccl.so.2), opened RTLD_LOCAL as Python opens libtorch_cuda.so, so
 * that copy A is loaded as its dependency, outside the global scope. Its NCCL
 * calls bind to the preloaded shim when there is one, else to copy A.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include <nccl.h>

#define USER_EXPORT __attribute__((visibility("default")))

USER_EXPORT ncclResult_t user_init(ncclComm_t *comm);
USER_EXPORT ncclResult_t user_all_reduce(const float *send, float *recv, size_t count, ncclComm_t comm);
USER_EXPORT ncclResult_t user_bcast(float *buf, size_t count, ncclComm_t comm);
USER_EXPORT ncclResult_t user_destroy(ncclComm_t comm);
USER_EXPORT const char *user_nccl_owner(void);

ncclResult_t user_init(ncclComm_t *comm)
{
    ncclUniqueId id;
    memset(&id, 0x11, sizeof(id));
    return ncclCommInitRank(comm, 1, id, 0);
}

ncclResult_t user_all_reduce(const float *send, float *recv, size_t count, ncclComm_t comm)
{
    return ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL);
}

ncclResult_t user_bcast(float *buf, size_t count, ncclComm_t comm)
{
    return ncclBcast(buf, count, ncclFloat32, 0, comm, NULL);
}

ncclResult_t user_destroy(ncclComm_t comm)
{
    return ncclCommDestroy(comm);
}

/* The file of the ncclAllReduce this library's calls bind to. */
const char *user_nccl_owner(void)
{
    Dl_info info;
    void *fn = (void *)ncclAllReduce;
    return dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "?";
}
