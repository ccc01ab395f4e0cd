/* SPDX-License-Identifier: MIT */
/*
 * What the pieces of the GPU executor's host side share: the executor and
 * its plan contexts, and the steps one piece calls in another.
 *
 *   context.c   executors: create, destroy, in-process groups, errors
 *   upload.c    mscx_exec_add_plan: the context, scratch and staging
 *               allocations, the layout, geometry classes, this rank's record
 *   finalize.c  a context's tables, once every rank's record is known: CUDA
 *               IPC mappings, the device image, peer buffers and port setup
 *   launch.c    mscx_exec_launch: the cached arguments, buffer placement
 *   programs.c  the compiled programs kept per context
 *   trace.c     MSCX_TRACE: the records of every traced executor
 *   order.c     the order of launches across streams (launch_order.h)
 *
 * The kernel is in kernels/exec_kernel.cu; the device layout in launch_abi.h.
 */
#ifndef MSCX_RUNTIME_INT_H
#define MSCX_RUNTIME_INT_H

#include <stdint.h>
#include <cuda_runtime_api.h>
#include "mscx/exec.h"
#include "mscx/status.h"
#include "mscx/trace.h"
#include "plan_model.h"
#include "launch_abi.h"
#include "gpu_port.h"
#include "peer_buffers.h"
#include "launch_order.h"

#define MSCX_GPU_MAX_PLANS 64

/* compiled programs kept per plan context (sizes, dtypes and packet formats seen) and their arena */
#define MSCX_GPU_PROGRAM_SLOTS 64
#define MSCX_GPU_PROGRAM_ARENA (256u * 1024u)

#define MSCX_TRACE_CAP 8192u /* MSCX_TRACE: records kept per thread block (the latest ones) */

/* What a rank tells its peers about one plan context. */
struct gpu_rec {
    int64_t pid;
    uint64_t host; /* host identity: a pid names a process only together with it */
    int32_t device;
    int32_t vnodes;   /* MSCX_VIRTUAL_NODES as this rank read it */
    uint64_t ctx_dev; /* struct mscx_gpu_ctx * in the owner's address space */
    uint64_t scratch_dev;
    uint64_t scratch_bytes; /* allocated; its half is the fixed offset of the even-flag launches */
    cudaIpcMemHandle_t ctx_ipc;
    cudaIpcMemHandle_t scratch_ipc;
};

/* One compiled program of a plan context (programs.c). */
struct prog_slot {
    uint64_t msg;
    int dtype, pkt;
    size_t off;
    uint32_t stride, kmax_ops, kmax_opnd, interp_mask;
    int split;  /* for out-of-place calls on an in-place AllReduce plan (mscx_gpu_program_split) */
    int usable; /* 0: a split program that cannot be had at this shape (remembered, not retried) */
    int alias; /* out-of-place plan: the program may run an in-place call as it is (mscx_gpu_program_alias_ok)
                */
    int whole; /* every block compiled, no GENERIC entry */
    int packet;   /* whole, and every entry a packet kind (mscx_gpu_program_is_packet) */
    int uploaded; /* copied outside capture (a copy captured in a graph runs only with it) */
};

struct gpu_plan {
    const struct mscx_plan *plan;
    uint32_t ntb, nthreads;
    char *d_ctx; /* the context allocation: struct mscx_gpu_ctx + tables */
    size_t ctx_bytes;
    size_t off_ops, off_tb, off_rbuf, off_sem, off_bflag, off_tok[MSCX_CHAN_COUNT], off_exp[MSCX_CHAN_COUNT],
        off_pin[MSCX_CHAN_COUNT];
    char *scratch;
    uint64_t scratch_bytes;
    uint64_t scratch_half; /* fixed per context: scratch_bytes / 2 when double buffered, else 0 */
    char *tmp;             /* staging for calls whose in-place-ness differs from the plan's */
    uint64_t tmp_bytes;
    struct gpu_rec *recs; /* [nranks] */
    void **opened;        /* [2 * nranks] IPC mappings to close */
    int ready;
    uint32_t smem_ops; /* ops staged in shared memory per block (0: none) */
    uint32_t ngeom;    /* geometry classes; geom_rank[c] represents class c (class 0: this rank) */
    uint32_t geom_rank[MSCX_GPU_MAX_GEOM];
    int reduce;             /* the plan has reduction ops */
    int idle;               /* this rank's program is only nops: no kernel is needed */
    int ident;              /* one rank, the identity program (mscx_gpu_onerank_identity): no kernel either */
    int pdl;                /* launch with programmatic dependent launch (pdl_usable) */
    int publish, sys_scope; /* copies of the context's flags (kernel arguments) */
    struct mscx_dev_op *h_ops;           /* the uploaded op image (sync marks set), for the launch compiler */
    struct mscx_compile_rbuf *prog_rbuf; /* [nrbuf] remote buffers as the compiler sees them */
    /*
     * Compiled programs, one per (size, dtype, packet format) seen, appended
     * to an arena in device memory (and its pinned mirror, the copy source)
     * and never freed before the context: a captured graph keeps pointing at
     * its program. When the arena is full, new sizes run the interpreter.
     */
    struct mscx_program *prog_tmp; /* the compiler's output before encoding */
    char *prog_dev, *prog_pin;
    size_t prog_cap, prog_used;
    uint32_t prog_nslot;
    int prog_full_said;
    struct prog_slot prog_slot[MSCX_GPU_PROGRAM_SLOTS];
    int c_pkt;
    int c_kent;                     /* the cached launch's program: prog_slot index, -1: none */
    int c_kent_split;               /* its out-of-place split form: index, -1: none, -2: not looked up */
    struct mscx_trace_rec *d_trace; /* MSCX_TRACE: [ntb][MSCX_TRACE_CAP] device records */
    uint32_t *d_trace_n;            /* [ntb] ring positions */
    struct gpu_port *port;          /* port channels through the CPU proxy (NULL: none) */
    struct peer_bufs *peer_bufs;    /* user buffers shared with other processes (NULL: none) */
    /* launch cache */
    uint64_t c_msg;
    int c_dtype;
    struct mscx_gpu_args c_args;
};

/* The executors of one process made by mscx_exec_create_local_group. */
struct local_group {
    uint32_t nranks;
    uint32_t refs;
    struct mscx_exec **execs;
    uint32_t added[MSCX_GPU_MAX_PLANS];
};

#define MSCX_EXEC_STREAMS 4

struct mscx_exec {
    struct mscx_bootstrap bs;
    int device;
    int pdl_ok;                 /* the device and the code chosen for it allow early starts (device_caps.h) */
    struct mscx_gpu_host *host; /* mapped */
    struct mscx_gpu_host *host_dev; /* its device view */
    struct local_group *group;
    int traced;                      /* MSCX_TRACE was set at create: plans record per-op times */
    struct gpu_net *net;             /* proxy streams and TCP endpoint (NULL until a plan needs them) */
    cudaStream_t ustream;            /* setup copies and program uploads: non-blocking, the executor's own */
    struct mscx_exec *next_deferred; /* on the list of mscx_exec_destroy_deferred (context.c) */
    /* the streams its launches went to, so that the end of an aborted one's work can be proven (context.c) */
    cudaStream_t launch_streams[MSCX_EXEC_STREAMS];
    unsigned nlaunch_streams;
    int streams_unknown;                    /* more streams, or the per-thread one: kept until a destroy */
    cudaEvent_t done_ev[MSCX_EXEC_STREAMS]; /* recorded at the abort after every launch on each stream */
    unsigned ndone_ev;
    struct mscx_order ord; /* launches in the order they were made (order.c) */
    cudaEvent_t ord_done, ord_join;
    cudaGraphNode_t ord_sink;     /* the record node of ord_done of capture ord.cap_id */
    cudaGraphNode_t ord_sink_dep; /* the node it was last made to follow, when that was one node */
    uint32_t nplans;
    struct gpu_plan plans[MSCX_GPU_MAX_PLANS];
};

/** Remember @p stream as one that ran a launch of @p ex (a compare when it is the last one). */
static inline void mscx_gpu_stream_note(struct mscx_exec *ex, cudaStream_t stream)
{
    unsigned n = ex->nlaunch_streams;
    if (n && ex->launch_streams[n - 1] == stream)
        return;
    for (unsigned i = 0; i + 1 < n; i++)
        if (ex->launch_streams[i] == stream)
            return;
    if (n < MSCX_EXEC_STREAMS && stream != cudaStreamPerThread)
        ex->launch_streams[ex->nlaunch_streams++] = stream;
    else
        ex->streams_unknown = 1; /* the abort's thread cannot name another thread's per-thread stream */
}

/** MSCX_OK when @p rc is cudaSuccess; else logs @p what with CUDA's message and returns MSCX_ERR_CUDA. */
mscx_status_t mscx_gpu_check(cudaError_t rc, const char *what);

/*
 * Where setup and teardown run: the executor's device current and the thread
 * in relaxed capture mode, as in NCCL's own setup, so that our allocations,
 * stream creations and synchronisations never invalidate a graph capture
 * this thread or another one is making in global mode.
 */
struct mscx_gpu_dev_scope {
    int prev_dev;                    /* the caller's device, -1 if unknown */
    enum cudaStreamCaptureMode mode; /* the caller's capture mode */
    int mode_set;                    /* mode was exchanged and is restored at leave */
};

/** Enter the setup scope on @p dev; leave it with mscx_gpu_dev_leave() whatever this returns. */
mscx_status_t mscx_gpu_dev_enter(int dev, struct mscx_gpu_dev_scope *sc);
/** The caller's device and capture mode again. */
void mscx_gpu_dev_leave(const struct mscx_gpu_dev_scope *sc);
/* mscx_gpu_check of a CUDA call, named by its text */
#define CU(call) mscx_gpu_check((call), #call)

#define GPU_CHECK_GOTO(call, st, label)                                                                      \
    do {                                                                                                     \
        if (((st) = mscx_gpu_check((call), #call)) != MSCX_OK)                                               \
            goto label;                                                                                      \
    } while (0)

/* upload.c */

/** The layout of the context allocation of @p gp for @p gpu (the off_* fields and ctx_bytes). */
void mscx_gpu_ctx_layout(struct gpu_plan *gp, const struct mscx_gpu *gpu);

/* finalize.c */

/**
 * Fill the tables of this rank's context once every rank's record is in
 * gp->recs, and copy them to the device. Collective over the bootstrap
 * (peer buffers, port channels) unless @p ex belongs to a local group.
 * Sets gp->ready on success.
 */
mscx_status_t mscx_gpu_plan_finalize(struct mscx_exec *ex, struct gpu_plan *gp);

/* programs.c */

/**
 * The compiled program for (@p msg, @p dtype, @p pkt, @p split) of this
 * rank's part of the plan, with the launch arguments @p a: an entry of the
 * context's arena, compiled and encoded on first use.
 * @return its index in gp->prog_slot, or -1 when the program does not compile
 *         or the arena is full (the interpreter runs)
 */
int mscx_progcache_find(struct gpu_plan *gp, const struct mscx_plan *plan, uint32_t rank, uint64_t msg,
                        int dtype, int pkt, int split, const struct mscx_gpu_args *a);

/** Make entry @p e's program visible to a kernel on any stream (copied once; see programs.c). */
mscx_status_t mscx_progcache_upload(struct mscx_exec *ex, struct gpu_plan *gp, struct prog_slot *e);

/* order.c */

/** At create: the events and the state of launch_order.h. */
mscx_status_t mscx_gpu_order_open(struct mscx_exec *ex);
/** At free. */
void mscx_gpu_order_close(struct mscx_exec *ex);
/**
 * Before a launch on @p s (called only when @p s differs from ex->ord.last):
 * make it wait for the previous launch. *@p steps_p receives what
 * mscx_gpu_order_leave() must do after the launch.
 */
mscx_status_t mscx_gpu_order_enter(struct mscx_exec *ex, cudaStream_t s, unsigned *steps_p);
/** After a launch whose steps include one of MSCX_ORDER_AFTER. */
mscx_status_t mscx_gpu_order_leave(struct mscx_exec *ex, cudaStream_t s, unsigned steps);

/* trace.c */

/** At create: whether MSCX_TRACE is set; if so the executor is counted until mscx_gpu_trace_detach(). */
int mscx_gpu_trace_attach(void);

/** Copy one plan's records back from the device and keep them for the trace file. */
void mscx_gpu_trace_collect(uint32_t rank, uint32_t plan_id, const struct gpu_plan *gp);

/** At destroy of a traced executor: the last one of the process writes the trace file. */
void mscx_gpu_trace_detach(void);

#endif /* MSCX_RUNTIME_INT_H */
