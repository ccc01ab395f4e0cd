/* SPDX-License-Identifier: MIT */
/* What the two-copies test knows of copy B (fake_copyb.c). */
#ifndef FAKE_COPYB_H
#define FAKE_COPYB_H
#include <nccl.h>

/* What copy B's ncclGetVersion says: not the version of copy A or of any real NCCL. */
#define FAKEB_VERSION 23001

/**
 * Not NCCL: the version copy B's ncclCommInitRank got from ncclGetVersion
 * and the collectives copy B ran on @p comm. @return -1 when @p comm is not
 * a live communicator of copy B.
 */
int fakeb_comm_info(ncclComm_t comm, int *version, int *ops);
#endif
