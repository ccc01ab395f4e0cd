/* SPDX-License-Identifier: MIT */
/*
 * Private header of the multi-process GPU test, shared by test_gpu_mproc.c
 * and test_gpu_mproc_peerbufs.c: the per-rank context, the failure message
 * macro, the helpers of test_gpu_mproc.c that the peerbufs mode uses, and
 * the functions of test_gpu_mproc_peerbufs.c that test_gpu_mproc.c calls.
 */
#ifndef MSCX_TEST_MPROC_INT_H
#define MSCX_TEST_MPROC_INT_H

#include <stdint.h>
#include <stdio.h>
#include <cuda_runtime_api.h>

#include "mscx/exec.h"
#include "mscx/plan.h"
#include "proc_mesh.h"

extern const char *g_mode;

#define RFAIL(m, ...)                                                                                        \
    do {                                                                                                     \
        fprintf(stderr, "FAIL rank %u (%s): ", (m)->rank, g_mode);                                           \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        fputc('\n', stderr);                                                                                 \
    } while (0)

struct rank_ctx {
    struct proc_mesh *m;
    struct mscx_plan *plan;
    struct mscx_exec *ex;
    uint32_t pid;
    cudaStream_t st;
    uint8_t *dbuf;       /* BUF_BYTES */
    uint8_t *din, *dout; /* in dbuf, laid out as the plan's placement says */
    uint8_t *host;
};

#define BUF_BYTES (65536 * 4)

/* test_gpu_mproc.c */
void fill(uint8_t *p, uint64_t n, enum mscx_dtype dt, uint32_t rank, uint32_t iter, uint64_t size);
void report_error(struct proc_mesh *m, struct mscx_exec *ex, mscx_status_t st, const char *when);
void layout(const struct mscx_plan *plan, uint32_t rank, uint64_t in_b, uint64_t out_b, uint8_t *base,
            uint8_t **in_p, uint8_t **out_p);
int rank_setup(struct rank_ctx *c, struct proc_mesh *m, const char *path, const char *timeout_ms, int vnodes);
void rank_teardown(struct rank_ctx *c);
int size_ok(const struct mscx_plan *plan, uint64_t size, enum mscx_dtype dt, enum mscx_redop op);

/* test_gpu_mproc_peerbufs.c */
uint32_t first_exporter(const struct mscx_plan *plan);
int rank_peerbufs(struct proc_mesh *m, const char *path);

#endif
