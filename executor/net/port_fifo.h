/* SPDX-License-Identifier: MIT */
/*
 * The GPU -> CPU proxy request FIFO of one plan context: fixed-size requests
 * in mapped host memory (cudaHostAlloc, mapped), written by the kernel
 * (kernels/exec_port.cuh) and served by the process's proxy thread
 * (proxy.c). C11 and CUDA C++ common subset; the layout is pinned below.
 *
 * Protocol (one producer side, the kernel, many threads; one consumer, the
 * proxy):
 *  - a thread reserves position p with an atomic add on a counter in device
 *    memory (struct mscx_gpu_port.head), waits while p - tail >= CAP, writes
 *    the fields of slot p % CAP, fences (system scope), then writes
 *    seq = p + 1. The slot is valid when seq == p + 1 (seq of an older lap is
 *    smaller), so the proxy never reads a half-written request;
 *  - the proxy takes requests strictly in position order, copies the slot
 *    out, then advances tail (the kernel may then reuse the slot);
 *  - a FLUSH at position p is complete when done >= p + 1: every request
 *    before it is complete (see MSCX_PREQ_F_LOCAL for the weaker drain).
 * Requests of one FIFO are executed in position order, on every channel, so
 * a SIGNAL is applied only after every earlier PUT of its channel landed.
 */
#ifndef MSCX_PORT_FIFO_H
#define MSCX_PORT_FIFO_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Slots per FIFO (a power of two). */
#define MSCX_PFIFO_CAP 512u

enum mscx_preq_kind {
    MSCX_PREQ_NONE = 0,
    MSCX_PREQ_PUT = 1,     /* raw bytes: src -> peer scratch + dst_off */
    MSCX_PREQ_PUT_PKT = 2, /* LL lines (whole aligned 8-byte units) */
    MSCX_PREQ_SIGNAL = 3,  /* +1 on the paired channel's inbound token at the peer */
    MSCX_PREQ_FLUSH = 4,   /* complete everything before; then done = position + 1 */
    MSCX_PREQ_KIND_COUNT
};

/* FLUSH flag: only the local side must be complete (every source was read), not the landing at the peer. */
#define MSCX_PREQ_F_LOCAL 0x1u
/*
 * PUT flags: the destination is the peer's input (or output) buffer of its
 * launch with flag `launch`, not its scratch; dst_off is a byte offset in
 * that buffer (real bytes, not logical). When `reserved` is not zero it is
 * the address of that buffer mapped in this process (a peer of the same
 * node, peer_buffers.c): the cuda link copies there. Otherwise the peer's proxy
 * resolves the buffer from its own launch `launch` (TCP; docs/transports.md).
 */
#define MSCX_PREQ_F_USER_IN 0x2u
#define MSCX_PREQ_F_USER_OUT 0x4u

struct mscx_preq {
    uint64_t src;     /* PUT*: source address in the requesting process (device memory) */
    uint64_t dst_off; /* PUT*: byte offset in the peer's scratch allocation */
    uint64_t len;     /* PUT*: bytes */
    uint32_t kind;    /* enum mscx_preq_kind */
    uint32_t chan;    /* PUT*, SIGNAL: port channel index of the context */
    uint32_t flags;   /* FLUSH: MSCX_PREQ_F_LOCAL; PUT: MSCX_PREQ_F_USER_* */
    uint32_t block;   /* diagnostics: thread block and op index that pushed it, and the launch flag */
    uint32_t op;
    uint32_t launch;   /* PUT to a user buffer: the launch whose buffer it is (same flag on every rank) */
    uint64_t reserved; /* PUT with MSCX_PREQ_F_USER_*: the mapped destination address, or 0 */
    uint64_t seq;      /* written last: position + 1 */
};

struct mscx_pfifo {
    struct mscx_preq slot[MSCX_PFIFO_CAP];
    uint64_t tail; /* proxy: requests taken (the kernel reads it before reusing a slot) */
    uint64_t pad0[7];
    uint64_t done; /* proxy: every request below this position is complete (advanced at flushes) */
    uint64_t pad1[7];
};

#ifdef __cplusplus
#define MSCX_PF_ASSERT(c, m) static_assert(c, m)
#else
#define MSCX_PF_ASSERT(c, m) _Static_assert(c, m)
#endif
MSCX_PF_ASSERT(sizeof(struct mscx_preq) == 64, "a request is one 64-byte slot");
MSCX_PF_ASSERT(__builtin_offsetof(struct mscx_preq, seq) == 56, "seq is the last word of a slot");
MSCX_PF_ASSERT(__builtin_offsetof(struct mscx_pfifo, tail) == 64u * MSCX_PFIFO_CAP, "fifo layout");
MSCX_PF_ASSERT(__builtin_offsetof(struct mscx_pfifo, done) == 64u * MSCX_PFIFO_CAP + 64u, "fifo layout");
MSCX_PF_ASSERT((MSCX_PFIFO_CAP & (MSCX_PFIFO_CAP - 1u)) == 0, "capacity is a power of two");

#ifdef __cplusplus
}
#endif
#endif /* MSCX_PORT_FIFO_H */
