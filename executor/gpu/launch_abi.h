/* SPDX-License-Identifier: MIT */
/*
 * The layout shared by the GPU executor's host side (runtime/) and its
 * kernel (kernels/exec_kernel.cu): one device context per (plan, rank) and
 * the per-launch kernel arguments. C11 and CUDA C++ common subset.
 */
#ifndef MSCX_LAUNCH_ABI_H
#define MSCX_LAUNCH_ABI_H

#include <stddef.h>
#include <stdint.h>
#include "mscx/dev_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Remote buffer kinds in the device table. */
enum mscx_gpu_rbuf_kind {
    MSCX_GPU_RBUF_SCRATCH = 0, /* ptr: the owner's scratch base */
    MSCX_GPU_RBUF_USER = 1,    /* pub: the owner's published user pointers (owner in this process) */
    MSCX_GPU_RBUF_MAPPED = 2,  /* owner in another process: pub gives the launch's flag only, the pointer
                                  is args.uptr[uslot] (its buffer mapped through CUDA IPC by the host) */
    MSCX_GPU_RBUF_NET = 3,     /* owner on another node, reached only by proxied port puts: the kernel names
                                  the buffer and the byte offset, the owner's proxy resolves its own launch's
                                  buffer (runtime/late_bound.c) */
};

/* Distinct (owner, input|output) user buffers of other processes one rank's launch can reach. */
#define MSCX_GPU_MAX_UPTR 16

/* The pointers a rank publishes at each launch, by flag parity. */
struct mscx_gpu_pub {
    void *ptr[2][2];      /* [parity][0: input, 1: output] */
    uint64_t bytes[2][2]; /* [parity][0: input, 1: output]: their sizes (the owner's proxy checks puts) */
    uint32_t flag[2];     /* [parity]: flag of the launch that published ptr[parity] and bytes (release) */
    uint32_t pad[2];
};

/* Private op flag set at upload (never in a plan): __syncthreads() before the op. */
#define MSCX_GPU_OPF_SYNC 0x80u

/* Distinct per-rank chunk geometries a launch carries (rank's own is class 0). */
#define MSCX_GPU_MAX_GEOM 4

/* Geometry of one class for one launch (bytes). */
struct mscx_gpu_geom {
    uint64_t slot, in_chunk, out_chunk;
};

/**
 * Scratch clearing at a flag wrap: the launches with the last two flags before
 * the wrap each clear, after every block of the rank has finished, the whole
 * scratch except the other half of their own geometry; together they clear
 * everything, so that no line written before the wrap can match a flag after
 * it. @return non-zero when the launch with @p flag clears.
 */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline int
    mscx_gpu_wrap_clear(uint32_t flag)
{
    return flag >= 0xfffffffeu;
}

struct mscx_gpu_rbuf {
    void *ptr;                /* scratch base of the owner */
    struct mscx_gpu_pub *pub; /* user pointers of the owner */
    uint32_t kind;            /* enum mscx_gpu_rbuf_kind */
    uint32_t type;            /* enum mscx_buf_type */
    uint64_t half;            /* the owner's scratch half (0: single buffered), fixed per context */
    uint32_t geom;            /* index into mscx_gpu_args.geom: the owner's chunk geometry */
    uint32_t uslot;           /* MSCX_GPU_RBUF_MAPPED: index into mscx_gpu_args.uptr */
};

/* Error record written by the first failing thread. */
struct mscx_gpu_err {
    int32_t code; /* 0, MSCX_ERR_TIMEOUT, MSCX_ERR_REMOTE */
    uint32_t block, op, opcode;
};

/*
 * Port channels served by the CPU proxy (runtime/ports.c, kernels/exec_port.cuh):
 * device state of one context's request FIFO (port_fifo.h).
 */
struct mscx_pfifo;
struct mscx_gpu_port {
    struct mscx_pfifo *fifo; /* device view of the mapped FIFO */
    unsigned long long head; /* next FIFO position; advanced by the kernel */
    const uint8_t *proxied;  /* [nchan port]: 1 when the channel goes through the proxy */
    uint32_t *dirty;         /* [ntb]: the block pushed requests since its last flush */
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
    uint32_t *bflag;    /* [ntb] flag of block b's last launch (0: none yet); every block advances its own */
    uint32_t done;      /* blocks finished, counted only at a wrap-clearing launch */
    uint32_t err_claim; /* first failing thread of the context claims the error record */
    uint32_t publish;   /* some peer reads this rank's user buffers: publish them at each launch */
    uint32_t sys_scope; /* some channel peer is another device: system-scope signals */
    uint32_t max_ops;   /* most ops of one block (pipeline bodies counted) */
    struct mscx_gpu_host *host; /* device view of the rank's mapped host block */
    struct mscx_gpu_pub pub;
    unsigned long long barrier[MSCX_MAX_BARRIERS];
    /* tables, fixed after the plan upload */
    uint32_t ntb, nrbuf, nsem, nchan[MSCX_CHAN_COUNT];
    const struct mscx_dev_op *ops;
    const uint32_t *tb_begin; /* [ntb + 1] */
    const struct mscx_gpu_rbuf *rbuf;
    int32_t *sem;
    unsigned long long *inbound[MSCX_CHAN_COUNT];       /* [nchan] tokens received */
    unsigned long long *expected[MSCX_CHAN_COUNT];      /* [nchan] tokens consumed */
    unsigned long long **peer_inbound[MSCX_CHAN_COUNT]; /* [nchan] the paired channel's token on the peer */
    char *scratch;
    uint64_t scratch_bytes;     /* allocated */
    struct mscx_gpu_port *port; /* NULL when no port channel goes through the proxy */
};

/*
 * The compiled program of a launch (args.program): for a given message size the
 * host resolves every data op of every block into its operands' byte
 * offsets, slice lengths and unit counts (exactly as the interpreter would at
 * run time), so the kernel runs a data op with a handful of instructions and
 * no dependent loads. The program is encoded as block records
 * (struct mscx_record_head) kept in device memory per size
 * (runtime/programs.c), and the launch passes a pointer to them. An op the
 * compiler does not take (signals, waits, barriers, semaphores, user buffers
 * of peers, anything that is not flat in memory) is a GENERIC entry that the
 * interpreter runs from the uploaded op table. A block with a pipeline runs
 * entirely in the interpreter; a rank whose program does not fit here (or a
 * launch whose user pointers are not 16-byte aligned) runs the interpreter
 * alone (no program: args.program NULL).
 */
#define MSCX_PROGRAM_MAX_BLOCKS 32
#define MSCX_PROGRAM_MAX_OPS 96
#define MSCX_PROGRAM_MAX_OPND 320
#define MSCX_PROGRAM_MAX_RBUF 32

enum mscx_entry_kind {
    MSCX_ENTRY_GENERIC = 0, /* run ops[obase[b] + op] in the interpreter */
    MSCX_ENTRY_PACK,        /* src[0] raw/flat -> dst[0..ndst) lines */
    MSCX_ENTRY_UNPACK,      /* src[0] lines -> dst[0] flat */
    MSCX_ENTRY_FWD,         /* src[0] lines -> dst[0..ndst) lines */
    MSCX_ENTRY_REDPKT,      /* src[0] flat, or lines if lsrc0, (+) src[1..] lines (src[fsrc] flat if fsrc)
                             -> dst[0] flat (if ndst), dst[1..] lines */
    MSCX_ENTRY_COPY,        /* src[0] flat -> dst[0] flat, 16-byte units */
    MSCX_ENTRY_REDUCE,      /* src[0..] flat folded -> dst[0..] flat, 16-byte units */
    MSCX_ENTRY_SKIP,        /* nothing to move (zero units); still a sync point when marked */
};

/*
 * Whether the packet kernel (MSCX_BODY_PACKET, kernels/exec_ops.cuh)
 * holds entries of kind @p kind: the host picks it only for programs of these
 * (mscx_gpu_program_is_packet), and the kernel refuses any other.
 */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline int
    mscx_entry_is_packet(uint32_t kind)
{
    return kind == MSCX_ENTRY_PACK || kind == MSCX_ENTRY_UNPACK || kind == MSCX_ENTRY_FWD ||
           kind == MSCX_ENTRY_REDPKT || kind == MSCX_ENTRY_SKIP;
}

/* Operand bases: MSCX_KB_IN, MSCX_KB_OUT, MSCX_KB_SCRATCH (own, this launch's half), MSCX_KB_RBUF + k (peer
 * scratch). */
#define MSCX_KB_IN 0u
#define MSCX_KB_OUT 1u
#define MSCX_KB_SCRATCH 2u
#define MSCX_KB_RBUF 3u

struct mscx_entry_opnd {
    uint32_t base; /* MSCX_KB_* */
    uint32_t off;  /* bytes from the base: a real offset (flat operands) or a line offset (packet operands) */
};

/*
 * One compiled entry: 16 bytes, one word of a block record (the kernel
 * stages it with a single 16-byte load, see mscx_stage_word).
 */
struct mscx_entry {
    uint8_t kind;   /* enum mscx_entry_kind */
    uint8_t opcode; /* enum mscx_opcode of the op (trace, errors) */
    uint8_t nsrc, ndst;
    uint8_t sync;  /* __syncthreads() before */
    uint8_t lsrc0; /* REDPKT: src[0] is lines (an unpack fused in), not flat */
    uint16_t op;   /* index of the op in its block */
    uint16_t opnd; /* first operand in mscx_program.opnd: nsrc sources, then ndst destinations */
    uint8_t fsrc;  /* REDPKT: 0, or the one source in [1, nsrc) that is flat, not lines (a pack into the
                      rank's own scratch fused in: the pack's flat source, read here instead of its lines) */
    uint8_t pad2;
    uint32_t units; /* units (payload bytes of a line, or 16 for COPY/REDUCE) of this block's slice */
};
MSCX_STATIC_ASSERT(sizeof(struct mscx_entry) == 16, "a compiled entry is one 16-byte word of its record");

struct mscx_program {
    uint32_t interp_mask; /* blocks that run the interpreter */
    uint32_t pad;
    uint16_t kbegin[MSCX_PROGRAM_MAX_BLOCKS + 1]; /* block b's entries: [kbegin[b], kbegin[b + 1]) */
    uint16_t obase[MSCX_PROGRAM_MAX_BLOCKS];      /* block b's first op in the uploaded table */
    uint16_t pbegin[MSCX_PROGRAM_MAX_BLOCKS + 1]; /* block b's operands: [pbegin[b], pbegin[b + 1]) */
    char *rsc[MSCX_PROGRAM_MAX_RBUF];             /* peer scratch bases */
    uint64_t rhalf[MSCX_PROGRAM_MAX_RBUF];        /* their half sizes at this launch's geometry */
    struct mscx_entry entry[MSCX_PROGRAM_MAX_OPS];
    struct mscx_entry_opnd opnd[MSCX_PROGRAM_MAX_OPND];
};

/*
 * Per-launch arguments (passed by value, __grid_constant__). The context's
 * fixed tables are repeated here so that a block reaches its ops with one
 * dependent load (tb_begin) instead of three.
 */
struct mscx_gpu_args {
    /*
     * What the whole-program kernels read on every launch comes first, in the
     * first 64 bytes. The argument block is read through the constant
     * cache, cold at each launch, and a launch that cannot overlap the
     * kernel ahead (no programmatic launch, or one after a join of streams)
     * waits for each of its lines in turn: the hot fields fill as few lines
     * as they can, and what the address of a block's record needs (program,
     * kstride) lies in the first, with the driver's memory descriptor. The
     * whole-program kernels do not read interp_mask (they run whole programs
     * only). The rest is read by the interpreter kernel, on slow paths or by
     * the host.
     */
    const char *program; /* the compiled program of this launch in device memory (block records,
                          struct mscx_record_head), NULL: interpreter only */
    uint32_t kstride;    /* bytes of one block's record: 16 * (1 + kmax_ops + kmax_opnd) */
    uint32_t kmax_ops;   /* entry slots of a record */
    uint32_t *bflag;     /* = ctx->bflag */
    const void *in;
    void *out;
    uint64_t scratch_half; /* scratch_bytes / 2 when double buffered, else 0: the odd-flag launches use
                              [0, half), the even ones [half, 2 * half), whatever their message size */
    struct mscx_gpu_ctx *ctx;
    uint32_t op;
    uint32_t pad1;
    /* end of the first 64 bytes */
    uint64_t timeout_ns;  /* 0: never */
    uint32_t interp_mask; /* blocks that run the interpreter even with a program (0: whole-program kernels) */
    uint32_t pad2;
    const struct mscx_dev_op *ops; /* = ctx->ops */
    const uint32_t *tb_begin;      /* = ctx->tb_begin */
    char *scratch;                 /* = ctx->scratch */
    uint64_t scratch_bytes;        /* = ctx->scratch_bytes */
    uint32_t publish;              /* = ctx->publish */
    uint32_t sys_scope;            /* = ctx->sys_scope */
    uint64_t in_bytes, out_bytes;
    struct mscx_gpu_geom geom[MSCX_GPU_MAX_GEOM]; /* [0]: this rank's */
    uint32_t dtype, pkt;
    uint32_t reduce;              /* the plan has reduction ops (else the copy-only kernel runs) */
    uint32_t smem_ops;            /* ops of a block staged in shared memory (0: read from global) */
    uint32_t trace_cap;           /* MSCX_TRACE: records per block in trace (a ring), 0: tracing off */
    uint32_t port;                /* = ctx->port != NULL: some port channel goes through the proxy */
    struct mscx_trace_rec *trace; /* [ntb][trace_cap] */
    uint32_t *trace_n;            /* [ntb] records written by block b so far (ring position) */
    uint32_t kmax_opnd;           /* operand slots of a record */
    uint32_t whole;               /* the program is the whole launch (no interpreter, proxy or publishing):
                                     a whole-program kernel runs it */
    uint32_t packet;              /* with whole: every entry is a packet kind (mscx_gpu_program_is_packet), so
                                     the packet kernel may run it (sums, untraced) */
    uint32_t pad0;
    void *uptr[MSCX_GPU_MAX_UPTR]; /* this launch's user buffers of peers in other processes, mapped here
                                      (peer_buffers.c), by mscx_gpu_rbuf.uslot */
};
MSCX_STATIC_ASSERT(offsetof(struct mscx_gpu_args, timeout_ns) == 64, "the hot fields fill 64 bytes");

/*
 * The compiled program as the kernel reads it: one record per block at
 * program + block * kstride, all of fixed layout within a launch, so that a
 * block stages its record with one round of coalesced loads (no load
 * depends on another): a head, kmax_ops entries (struct mscx_entry, opnd
 * counted from the block's first operand), then kmax_opnd operands. An
 * operand is a pointer per scratch half: v[p] for launches of flag parity
 * p (mscx_scratch_offset), already resolved, or a user buffer (tag in the
 * top bits of v[0]) plus an offset, resolved against the launch's in/out.
 */
struct mscx_record_head {
    uint32_t nk, np; /* entries and operands of the block */
    uint32_t obase;  /* the block's first op in the uploaded table (GENERIC entries) */
    uint32_t pad;
};

struct mscx_tagged_ptr {
    uint64_t v[2];
};

#define MSCX_TAGGED_TAG_SHIFT 62
#define MSCX_TAGGED_IN (1ull << MSCX_TAGGED_TAG_SHIFT)
#define MSCX_TAGGED_OUT (2ull << MSCX_TAGGED_TAG_SHIFT)
#define MSCX_TAGGED_OFF_MASK ((1ull << MSCX_TAGGED_TAG_SHIFT) - 1u)

/* launch_compile.c: what the compiler needs to know about the rank's remote buffers. */
struct mscx_compile_rbuf {
    char *ptr;     /* peer scratch base, NULL: not a scratch buffer (not compiled) */
    uint32_t geom; /* geometry class of the owner */
    uint64_t half; /* the owner's fixed scratch half */
};

/**
 * Compile rank @p rank's program for the geometry in @p a (pkt, in_bytes,
 * out_bytes, geom[]) into @p prog.
 * @param ops the rank's uploaded op image (sync marks set)
 * @return 1 when compiled, 0 when the program does not fit (interpreter only)
 */
struct mscx_plan;
int mscx_gpu_compile(const struct mscx_plan *plan, uint32_t rank, const struct mscx_dev_op *ops,
                     const struct mscx_compile_rbuf *rbuf, const struct mscx_gpu_args *a,
                     struct mscx_program *prog);

/**
 * Rewrite @p prog, a program compiled whole for an in-place AllReduce plan
 * (input and output one buffer, operands tagged MSCX_KB_IN or MSCX_KB_OUT
 * on the same bytes), so that it runs an out-of-place call directly: every
 * write goes to the output buffer; a read goes to the input buffer when no
 * entry before it has written those bytes, and to the output buffer when an
 * earlier entry of the same block wrote all of them. No staging copy is
 * needed then, and the input is never written.
 * @param pl packet payload bytes per line (8 for LL16, 4 for LL8)
 * @param out_bytes the call's buffer size: the writes must cover [0, out_bytes)
 * @return 1 when rewritten; 0 when the program cannot run split (@p prog is
 *         then unchanged): a read of bytes that another block writes, a read
 *         partly written before, packets in the user buffer, a GENERIC entry,
 *         or bytes of the buffer that no entry writes
 */
int mscx_gpu_program_split(struct mscx_program *prog, uint32_t ntb, uint32_t pl, uint64_t out_bytes);

/**
 * Whether @p prog, a program compiled whole for an out-of-place plan, gives
 * the same result when the call is in place, run as it is on the aliased
 * buffers (no staging copy): the input at byte @p in_at and the output at
 * byte @p out_at of one buffer (AllGather: in_at = rank * in_bytes; Reduce-
 * Scatter: out_at = rank * out_bytes; AllReduce: both 0). That holds when no
 * entry writes the input, and every write to bytes that alias the input
 * either copies them onto themselves, or comes after every read of them in
 * the same block with a barrier between, or is the same element-wise entry
 * that reads exactly those bytes; and no read of the output meets input
 * bytes that this block did not write first.
 * @return 1 when it may run aliased, 0 otherwise (stage as before)
 */
int mscx_gpu_program_alias_ok(const struct mscx_program *prog, uint32_t ntb, uint32_t pl, uint64_t in_at,
                              uint64_t out_at, uint64_t in_bytes);

/**
 * Whether every entry of @p prog (of @p ntb blocks) is a packet kind (PACK,
 * UNPACK, FWD, REDPKT) or a SKIP, so that the packet kernel can run it.
 */
int mscx_gpu_program_is_packet(const struct mscx_program *prog, uint32_t ntb);

/**
 * Encode @p prog (of @p ntb blocks) as the kernel's block records into @p dst
 * (at most @p cap bytes), resolving scratch operands for both halves: own
 * scratch at @p scratch with halves of @p scratch_half.
 * @return the bytes written (ntb * stride), 0 when they do not fit in @p cap
 */
size_t mscx_gpu_program_encode(const struct mscx_program *prog, uint32_t ntb, char *scratch,
                               uint64_t scratch_half, void *dst, size_t cap, uint32_t *stride,
                               uint32_t *kmax_ops, uint32_t *kmax_opnd);

/*
 * The variants of the executor kernel, each instantiated per packet format
 * and dtype (kernels/exec_kernel.cu; kernel bodies in kernels/exec_ops.cuh):
 * the interpreter kernel (the interpreter, and compiled programs beside
 * interpreted blocks), the whole-program kernel (programs compiled whole only) and
 * the packet kernel (programs compiled whole of packet entries only,
 * summing only, without the trace), the last two for blocks of at most 1024
 * threads and for blocks of at most MSCX_KERNEL_SMALL_THREADS, which get more
 * registers a thread.
 */
enum mscx_kernel_variant {
    MSCX_KERNEL_INTERPRETER_1024,
    MSCX_KERNEL_WHOLE_1024,
    MSCX_KERNEL_WHOLE_512,
    MSCX_KERNEL_PACKET_1024,
    MSCX_KERNEL_PACKET_512,
    MSCX_KERNEL_VARIANTS
};
#define MSCX_KERNEL_SMALL_THREADS 512u

/* Whether variant @p v can run blocks of @p nthreads. */
static inline int mscx_gpu_kernel_variant_fits(enum mscx_kernel_variant v, uint32_t nthreads)
{
    return (v != MSCX_KERNEL_WHOLE_512 && v != MSCX_KERNEL_PACKET_512) ||
           nthreads <= MSCX_KERNEL_SMALL_THREADS;
}

/*
 * The variant a launch runs: the interpreter kernel unless the program is
 * the whole launch (args.whole); then the packet kernel when every
 * entry is a packet kind (args.packet), the reduction (if any) is a sum
 * and nothing is traced; else the whole-program kernel; the one for small blocks
 * when they are.
 */
static inline enum mscx_kernel_variant mscx_gpu_kernel_variant(const struct mscx_gpu_args *a,
                                                               uint32_t nthreads)
{
    if (!a->whole)
        return MSCX_KERNEL_INTERPRETER_1024;
    int small = nthreads <= MSCX_KERNEL_SMALL_THREADS;
    if (a->packet && a->trace_cap == 0 && (!a->reduce || a->op == MSCX_REDOP_SUM))
        return small ? MSCX_KERNEL_PACKET_512 : MSCX_KERNEL_PACKET_1024;
    return small ? MSCX_KERNEL_WHOLE_512 : MSCX_KERNEL_WHOLE_1024;
}

/* Implemented in kernels/exec_kernel.cu (dispatch) and the kernel instances (kernels/exec_k.cu.in). */
int mscx_gpu_kernel_launch(const struct mscx_gpu_args *args, uint32_t nblocks, uint32_t nthreads, int pdl,
                           void *stream);
/* Resident blocks per SM at @p nthreads and @p smem_bytes of dynamic shared memory, worst instance; or -1. */
int mscx_gpu_kernel_occupancy(uint32_t nthreads, uint32_t smem_bytes);
/* 0 (cudaSuccess) when the kernels load on the current device, else the CUDA error that stops them. */
int mscx_gpu_kernels_loadable(void);

/* launch_sync.c: set MSCX_GPU_OPF_SYNC on @p ops (an image of plan->gpus[rank].ops). */
struct mscx_plan;
void mscx_gpu_mark_syncs(const struct mscx_plan *plan, uint32_t rank, struct mscx_dev_op *ops);

/* Tests: set every block's flag of (ex, plan_id) to @p flag (the next launch uses its successor). Syncs. */
struct mscx_exec;
int mscx_gpu_debug_set_flag(struct mscx_exec *ex, uint32_t plan_id, uint32_t flag);
/* Tests: fill the whole scratch of (ex, plan_id) with the 32-bit word @p word. Syncs. */
int mscx_gpu_debug_fill_scratch(struct mscx_exec *ex, uint32_t plan_id, uint32_t word);
/* Tests: the rank's error record (block UINT32_MAX: recorded by the proxy; op 0xffff: the end-of-launch
 * drain). */
void mscx_gpu_debug_error(struct mscx_exec *ex, struct mscx_gpu_err *err_p);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_LAUNCH_ABI_H */
