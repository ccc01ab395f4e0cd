/* SPDX-License-Identifier: MIT */
/**
 * @file dev_types.h
 * The host/device contract: enums, packet layouts and the compact executable
 * encoding of plan operations. Written in the common subset of C11 and CUDA
 * C++; the layout is pinned by static asserts at the end of this file.
 */
#ifndef MSCX_DEV_TYPES_H
#define MSCX_DEV_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
#define MSCX_STATIC_ASSERT(c, m) static_assert(c, m)
#define MSCX_ALIGNAS(n) alignas(n)
#else
#define MSCX_STATIC_ASSERT(c, m) _Static_assert(c, m)
#define MSCX_ALIGNAS(n) _Alignas(n)
#endif

/* Binary limits. Every one of them is checked when a plan is loaded. */
#define MSCX_MAX_OPERANDS 10    /* per src_buff or dst_buff list */
#define MSCX_MAX_CHAN_PER_OP 8  /* channel_ids of one op */
#define MSCX_MAX_CHAN_PER_TB 16 /* per channel type in a thread block's table */
#define MSCX_MAX_SEM_PER_OP 16
#define MSCX_MAX_BARRIERS 16
#define MSCX_MAX_OPS_PER_TB 1024 /* counting pipeline bodies */
#define MSCX_MAX_TB 1024
#define MSCX_MAX_RANKS 1024
#define MSCX_MAX_THREADS_PER_BLOCK 1024

/* Operation codes, in the order of the MSCCL++ binary enum (trace ids depend on it). */
enum mscx_opcode {
    MSCX_OP_NOP = 0,
    MSCX_OP_BARRIER,
    MSCX_OP_PUT,
    MSCX_OP_PUT_PACKETS,
    MSCX_OP_READ_PUT_PACKETS,
    MSCX_OP_PUT_WITH_SIGNAL,
    MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH,
    MSCX_OP_GET,
    MSCX_OP_COPY,
    MSCX_OP_COPY_PACKETS,
    MSCX_OP_UNPACK_PACKETS,
    MSCX_OP_SIGNAL,
    MSCX_OP_WAIT,
    MSCX_OP_FLUSH,
    MSCX_OP_REDUCE,
    MSCX_OP_REDUCE_PACKETS,
    MSCX_OP_REDUCE_COPY_PACKETS,
    MSCX_OP_REDUCE_SEND,
    MSCX_OP_REDUCE_SEND_PACKETS,
    MSCX_OP_REDUCE_COPY_SEND_PACKETS,
    MSCX_OP_READ_REDUCE,
    MSCX_OP_READ_REDUCE_SEND,
    MSCX_OP_MULTI_LOAD_REDUCE_STORE,
    MSCX_OP_RELAXED_SIGNAL,
    MSCX_OP_RELAXED_WAIT,
    MSCX_OP_PIPELINE,
    MSCX_OP_SEM_RELEASE,
    MSCX_OP_SEM_ACQUIRE,
    MSCX_OP_MULTI_STORE,
    MSCX_OP_MULTI_STORE_PKT,
    MSCX_OP_COUNT
};

/* Buffer types; the values index per-type tables. */
enum mscx_buf_type { MSCX_BUF_INPUT = 0, MSCX_BUF_OUTPUT = 1, MSCX_BUF_SCRATCH = 2, MSCX_BUF_COUNT };

enum mscx_chan_type {
    MSCX_CHAN_NONE = 0,
    MSCX_CHAN_MEMORY = 1,
    MSCX_CHAN_PORT = 2,
    MSCX_CHAN_SWITCH = 3,
    MSCX_CHAN_COUNT
};

/* Element types. The first five can be reduced; the rest only move bytes. */
enum mscx_dtype {
    MSCX_DT_FP32 = 0,
    MSCX_DT_FP16,
    MSCX_DT_BF16,
    MSCX_DT_INT32,
    MSCX_DT_UINT32,
    MSCX_DT_INT8,
    MSCX_DT_UINT8,
    MSCX_DT_INT64,
    MSCX_DT_UINT64,
    MSCX_DT_FP64,
    MSCX_DT_COUNT
};
#define MSCX_DT_REDUCIBLE_MASK 0x1fu

enum mscx_redop { MSCX_REDOP_SUM = 0, MSCX_REDOP_PROD, MSCX_REDOP_MIN, MSCX_REDOP_MAX, MSCX_REDOP_COUNT };

/* LL packet formats. The plan does not choose; each launch does. */
enum mscx_pkt_format {
    MSCX_PKT_LL16 = 0, /* 16 B: {data1, flag1, data2, flag2}, 8 B payload */
    MSCX_PKT_LL8 = 1,  /* 8 B: {data, flag}, 4 B payload */
};

/*
 * LL16 line. The writer stores all 16 bytes at once; a transport may land the
 * two 8-byte halves independently, so each half carries its own flag copy and
 * a reader accepts the line only when both flags match. Data before flag in
 * each half is what makes a single 8-byte store self-validating.
 */
struct mscx_ll16 {
    MSCX_ALIGNAS(16) uint32_t data1;
    uint32_t flag1;
    uint32_t data2;
    uint32_t flag2;
};

/* LL8 line: one 8-byte store carries 4 bytes of payload and the flag. */
struct mscx_ll8 {
    MSCX_ALIGNAS(8) uint32_t data;
    uint32_t flag;
};

/* Operand flags */
#define MSCX_OPND_REMOTE 0x1u /* a peer's buffer, reached through rbuf */
#define MSCX_OPND_SWITCH 0x2u /* a multicast (switch channel) operand; never executed */

/**
 * One operand. Position and length are in unit chunks, as in the JSON; the
 * executors turn them into bytes per launch (see op_math.h), so one encoding
 * serves every message size.
 */
struct mscx_dev_operand {
    uint32_t index; /* first chunk */
    uint32_t size;  /* number of chunks */
    uint8_t type;   /* enum mscx_buf_type of the memory addressed */
    uint8_t flags;  /* MSCX_OPND_* */
    uint16_t rbuf;  /* remote: index into the rank's remote buffer table; switch: channel id */
};

/* Op flags */
#define MSCX_OPF_TBG 0x1u         /* tbg_id/tbg_size were given in the plan */
#define MSCX_OPF_IN_PIPELINE 0x2u /* the op is part of a pipeline body */

/**
 * One executable operation. Channels are rank-level channel indices of
 * chan_type (the plan's flattened "connected_to" numbering), remote operands
 * name rank-level remote buffers: thread-block tables are resolved at load.
 */
struct mscx_dev_op {
    uint8_t opcode;    /* enum mscx_opcode */
    uint8_t chan_type; /* enum mscx_chan_type */
    uint8_t nsrc;
    uint8_t ndst;
    uint8_t nchan;
    uint8_t nsem;
    uint8_t flags;     /* MSCX_OPF_* */
    uint8_t reduce_op; /* enum mscx_redop named by the plan; the launch's op is what runs */
    uint16_t tbg_id;   /* slice of a thread-block group, 0 when none */
    uint16_t tbg_size; /* 1 when none */
    uint16_t barrier_id;
    uint16_t barrier_ntb;
    uint16_t pipe_nops; /* PIPELINE: number of following ops in the body */
    uint16_t reserved0;
    uint32_t pipe_unit;    /* PIPELINE: unit_size in bytes */
    uint32_t pipe_nchunks; /* PIPELINE: num_chunks */
    uint16_t chan[MSCX_MAX_CHAN_PER_OP];
    uint16_t sem[MSCX_MAX_SEM_PER_OP];
    struct mscx_dev_operand src[MSCX_MAX_OPERANDS];
    struct mscx_dev_operand dst[MSCX_MAX_OPERANDS];
};

MSCX_STATIC_ASSERT(sizeof(struct mscx_ll16) == 16, "LL16 line is 16 bytes");
MSCX_STATIC_ASSERT(sizeof(struct mscx_ll8) == 8, "LL8 line is 8 bytes");
MSCX_STATIC_ASSERT(sizeof(struct mscx_dev_operand) == 12, "operand layout");
MSCX_STATIC_ASSERT(sizeof(struct mscx_dev_op) == 316, "op layout");
MSCX_STATIC_ASSERT(__builtin_offsetof(struct mscx_dev_op, chan) == 28, "op layout");
MSCX_STATIC_ASSERT(__builtin_offsetof(struct mscx_dev_op, src) == 28 + 16 + 32, "op layout");

/**
 * One executed op, as the device writes it. Times are nanoseconds of one
 * clock shared by every block of the trace (%globaltimer on the GPU).
 * A record whose start_ns is 0 was never written and is skipped.
 */
struct mscx_trace_rec {
    uint32_t op_index; /* index of the op in its thread block's op list */
    uint32_t opcode;   /* enum mscx_opcode */
    uint64_t start_ns;
    uint64_t end_ns;
};

/**
 * Pseudo-opcode of the record that covers a kernel's prologue: from the
 * block's first instruction to the start of its first op (flag, op staging).
 */
#define MSCX_TRACE_OP_PROLOGUE 0xffffu

#endif /* MSCX_DEV_TYPES_H */
