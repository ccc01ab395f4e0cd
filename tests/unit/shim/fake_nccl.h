/* SPDX-License-Identifier: MIT */
/*
 * A fake libnccl (soname libnccl.so.2) for tests without a GPU: every
 * function of nccl.h appends one line "name argbytes..." to the file named by
 * FAKE_NCCL_LOG and returns FAKE_NCCL_RESULT (default ncclSuccess).
 */
#ifndef FAKE_NCCL_H
#define FAKE_NCCL_H
#include <nccl.h>
#include "rec_gen.h"

#define FAKE_EXPORT __attribute__((visibility("default")))
#define FAKE_REC_MAX 2048

void fake_record(const char *rec);
ncclResult_t fake_result(void);

void fake_hook_ncclGetVersion(int *version);
void fake_hook_ncclGetUniqueId(ncclUniqueId *uniqueId);
void fake_hook_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
void fake_hook_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                      ncclConfig_t *config);
void fake_hook_ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                        ncclUniqueId *commIds, ncclConfig_t *config);
void fake_hook_ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
void fake_hook_ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
#ifdef REC_HAVE_ncclCommGetUniqueId
void fake_hook_ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
#endif
#ifdef REC_HAVE_ncclCommGrow
void fake_hook_ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                            ncclComm_t *newcomm, ncclConfig_t *config);
#endif
void fake_hook_ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                              ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
void fake_hook_ncclCommCount(const ncclComm_t comm, int *count);
void fake_hook_ncclCommUserRank(const ncclComm_t comm, int *rank);
void fake_hook_ncclCommCuDevice(const ncclComm_t comm, int *device);
void fake_hook_ncclMemAlloc(void **ptr, size_t size);
void fake_hook_ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
void fake_hook_ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                        ncclScalarResidence_t residence, ncclComm_t comm);
void fake_hook_ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                             ncclComm_t comm, cudaStream_t stream);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
/* A distinct window handle per registration, never reused. */
void fake_hook_ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                      int winFlags);
#endif
/* 1 when FAKE_NCCL_WORLD names a directory: ncclAllGather then moves host bytes between processes. */
int mscxFakeNcclHostMemory(void);

/* fake_dev.c: the device model of the abort tests (FAKE_NCCL_DEV=1) */
void fake_hook_ncclCommAbort(ncclComm_t comm);
void fake_hook_ncclCommRevoke(ncclComm_t comm, int revokeFlags);
void fake_hook_ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
/** ncclCommShrink's part: with NCCL_SHRINK_ABORT, the fake's abort of @p comm. */
void fake_dev_shrink(ncclComm_t comm, int shrinkFlags);
/** The result a hook chose for the current call (ncclSuccess: none), once. */
ncclResult_t fake_dev_result(void);
#endif
