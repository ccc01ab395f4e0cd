/* SPDX-License-Identifier: MIT */
/*
 * The layout shared by the GPU executor's host side (gpu_exec.c) and its
 * kernel (kernels/exec_kernel.cu): one device context per (plan, rank) and
 * the per-launch kernel arguments. C11 and CUDA C++ common subset.
 */
#ifndef MSCX_GPU_INT_H
#define MSCX_GPU_INT_H

#include <stdint.h>
#include "mscx/dev_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Remote buffer kinds in the device table. */
enum mscx_gpu_rbuf_kind {
    MSCX_GPU_RBUF_SCRATCH = 0, /* ptr: the owner's scratch base */
    MSCX_GPU_RBUF_USER = 1,    /* pub: the owner's published user pointers */
};

/* The pointers a rank publishes at each launch, by flag parity. */
struct mscx_gpu_pub {
    void *ptr[2][2]; /* [parity][0: input, 1: output] */
};

struct mscx_gpu_rbuf {
    void *ptr;                     /* scratch base of the owner */
    struct mscx_gpu_pub *pub;      /* user pointers of the owner */
    uint32_t kind;                 /* enum mscx_gpu_rbuf_kind */
    uint32_t type;                 /* enum mscx_buf_type */
    uint32_t owner_scratch_chunks; /* for the owner's scratch half */
    uint32_t pad;
};

/* Error record written by the first failing thread. */
struct mscx_gpu_err {
    int32_t code; /* 0, MSCX_ERR_TIMEOUT, MSCX_ERR_REMOTE */
    uint32_t block, op, opcode;
};

/* Mapped host memory of one rank: the kernel records errors, the host aborts. */
struct mscx_gpu_host {
    struct mscx_gpu_err err;
    volatile int32_t abort;
    int32_t pad;
};

/**
 * Device state of one (plan, rank). Pointers reach into the same allocation
 * (tables) or other ranks' contexts (tokens, publication slots).
 */
struct mscx_gpu_ctx {
    /* advanced by the kernel */
    uint32_t flag;      /* flag of the last finished launch (0: none yet) */
    uint32_t done;      /* blocks finished in the current launch */
    uint32_t err_claim; /* first failing thread of the context claims the error record */
    uint32_t pad0;
    struct mscx_gpu_host *host; /* device view of the rank's mapped host block */
    struct mscx_gpu_pub pub;
    unsigned long long barrier[MSCX_MAX_BARRIERS];
    /* tables, fixed after the plan upload */
    uint32_t ntb, nrbuf, nsem, nchan[MSCX_CHAN_COUNT];
    uint32_t scratch_chunks;
    const struct mscx_dev_op *ops;
    const uint32_t *tb_begin;   /* [ntb + 1] */
    const struct mscx_gpu_rbuf *rbuf;
    int32_t *sem;
    unsigned long long *inbound[MSCX_CHAN_COUNT];   /* [nchan] tokens received */
    unsigned long long *expected[MSCX_CHAN_COUNT];  /* [nchan] tokens consumed */
    unsigned long long **peer_inbound[MSCX_CHAN_COUNT]; /* [nchan] the paired channel's token on the peer */
    char *scratch;
};

/* Per-launch arguments (passed by value). */
struct mscx_gpu_args {
    struct mscx_gpu_ctx *ctx;
    const void *in;
    void *out;
    uint64_t in_bytes, out_bytes, in_chunk, out_chunk, slot;
    uint64_t half_per_chunk; /* scratch_half / scratch_chunks (0 when not double buffered) */
    uint64_t timeout_ns;     /* 0: never */
    uint32_t dtype, op, pkt;
    uint32_t pad;
};

/* Implemented in kernels/exec_kernel.cu. */
int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads, void *stream);
/* Resident blocks per SM for @p nthreads, or -1 on error. */
int mscx_gpu_kernel_occupancy(uint32_t nthreads);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_GPU_INT_H */
