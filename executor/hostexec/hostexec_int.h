/* SPDX-License-Identifier: MIT */
/*
 * Internals of the host reference executor, shared by hostexec.c (threads,
 * memory, waiting, proxy) and hostexec_ops.c (operation semantics). Tests
 * and sim.c may use the hook entry point at the end.
 */
#ifndef MSCX_HOSTEXEC_INT_H
#define MSCX_HOSTEXEC_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "mscx/hostexec.h"
#include "plan_model.h"

#define HX_PIECE 4096u /* bytes of logical payload processed per step */

/* Wake-up point of one rank: producers bump it, waiters of that rank block on it. */
struct hx_wake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t epoch;
    _Atomic int waiters;
};

/* A request of a port channel, served by the rank's proxy thread. */
enum hx_req_kind { HX_REQ_COPY, HX_REQ_PKT_COPY, HX_REQ_SIGNAL };

struct hx_loc {
    uint32_t rank;
    uint8_t type;
    uint64_t off; /* logical offset (raw) or packet-space offset (packet copies), SO not included */
    uint64_t len;
};

struct hx_req {
    uint8_t kind;
    uint64_t so; /* scratch half offset of the requesting launch */
    struct hx_loc src, dst;
    uint32_t sig_rank, sig_chan; /* HX_REQ_SIGNAL: inbound port counter to bump */
};

struct hx_fifo {
    pthread_mutex_t mu;
    struct hx_req *req;
    uint64_t cap;
    _Atomic uint64_t head; /* pushed */
    _Atomic uint64_t done; /* completed by the proxy */
    _Atomic int stop;
};

struct hx_barrier {
    _Atomic uint32_t count;
    _Atomic uint32_t gen;
};

struct hx_run;

struct hx_rank {
    uint32_t rank;
    struct hx_run *run;
    const struct mscx_gpu *gpu;
    struct mscx_geom geom;
    uint8_t *mem[MSCX_BUF_COUNT]; /* input and output may alias */
    uint64_t size[MSCX_BUF_COUNT];
    uint64_t chunk[MSCX_BUF_COUNT];
    uint8_t *alloc_io; /* allocation behind input/output */
    uint8_t *saved_in; /* a scaled launch of an out-of-place plan: the input as filled */
    uint32_t flag;     /* flag of the current launch (written when no block runs) */
    uint64_t so;       /* scratch half offset of the current launch */
    _Atomic uint64_t *inbound[MSCX_CHAN_COUNT];
    _Atomic uint64_t *expected[MSCX_CHAN_COUNT];
    struct hx_barrier barrier[MSCX_MAX_BARRIERS];
    _Atomic int32_t *sem;
    struct hx_fifo fifo;
    struct hx_wake wake;
    /* launch control */
    _Atomic uint32_t launch_gen;  /* incremented to start a launch */
    _Atomic uint32_t blocks_done; /* blocks finished with the current launch */
    _Atomic uint32_t cur_iter;
    pthread_t ctl_thread, proxy_thread;
    pthread_t *tb_thread;
    bool ctl_started, proxy_started;
    uint32_t tb_started;
};

struct hx_hooks;

struct hx_run {
    const struct mscx_plan *plan;
    const struct mscx_hostexec_cfg *cfg;
    const struct hx_hooks *hooks;
    const struct mscx_scale *scale; /* NULL: a plain reduction */
    uint64_t timeout_ms;
    struct hx_rank *ranks;
    _Atomic int abort;
    _Atomic uint32_t filled0; /* ranks done with their first fill */
    pthread_mutex_t err_mu;
    mscx_status_t status;
    char errmsg[512];
};

/* One executing thread block. */
struct hx_tb {
    struct hx_run *run;
    struct hx_rank *rk;
    uint32_t tb;
    uint32_t op_idx; /* index inside the block, for messages */
    const struct mscx_dev_op *op;
    uint64_t rng;
    bool no_deadline;       /* launch control waits: only an abort ends them */
    uint8_t *buf_a, *buf_b; /* HX_PIECE bytes each */
};

/* ---- hostexec.c ---- */
uint64_t hx_now_ms(void);
void hx_bump(struct hx_run *run, uint32_t rank);
/*
 * Wait until cond(arg) holds, blocking on the wake point of @p rank. On
 * deadline or abort returns false; the deadline path records the message
 * built by describe().
 */
typedef bool (*hx_cond_fn)(void *arg);
typedef void (*hx_describe_fn)(void *arg, char *buf, size_t len);
bool hx_wait(struct hx_tb *t, uint32_t rank, hx_cond_fn cond, hx_describe_fn describe, void *arg);
/* Record the first failure and abort every thread. */
void hx_fail(struct hx_run *run, mscx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail from an op, prefixing "rank R tb T op I (name): ". */
void hx_op_fail(struct hx_tb *t, mscx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void hx_sched_point(struct hx_tb *t);
bool hx_fifo_push(struct hx_tb *t, const struct hx_req *req, uint64_t *pos_p);
/* Wait until the rank's proxy has completed every request up to FIFO position @p pos. */
bool hx_wait_flush(struct hx_tb *t, uint64_t pos);

/* Memory access (payload bytes through the raw mapping; scratch gets SO). */
void hx_raw_read(struct hx_run *run, const struct hx_loc *l, uint64_t so, uint8_t *dst);
void hx_raw_write(struct hx_run *run, const struct hx_loc *l, uint64_t so, const uint8_t *src);
/* Packet-space pointer of [off, off+len) in a buffer, NULL when out of range. */
uint8_t *hx_pkt_ptr(struct hx_run *run, uint32_t rank, uint8_t type, uint64_t off, uint64_t len, uint64_t so);
void hx_copy_pkt_atomic(uint8_t *dst, const uint8_t *src, uint64_t len);

/* ---- hostexec_ops.c ---- */
/* Run the op at gpu->ops[t->op_begin + *idx]; advances *idx past pipeline bodies. */
bool hx_exec_op(struct hx_tb *t, const struct mscx_tb *tbd, uint32_t *idx);

/* ---- hooks for the checked simulation (sim.c) ---- */
struct hx_hooks {
    /* Before launch @p iter of @p rank, after fill: may seed this launch's scratch half. */
    void (*scratch_pre)(void *ctx, uint32_t rank, uint32_t iter, uint32_t flag, uint8_t *scratch,
                        uint64_t scratch_bytes, uint64_t so);
    /* After every thread has stopped, on the calling thread, once per rank (not after a failure). */
    void (*final)(void *ctx, uint32_t rank, const uint8_t *in, uint64_t in_bytes, const uint8_t *out,
                  uint64_t out_bytes, const uint8_t *scratch, uint64_t scratch_bytes);
};

mscx_status_t mscx_hostexec_run_hooks(const struct mscx_plan *plan, const struct mscx_hostexec_cfg *cfg,
                                      const struct hx_hooks *hooks, char *err, size_t errlen);
/** mscx_hostexec_run_hooks() of a scaled sum (mscx_hostexec_run_scaled()); @p scale NULL: none. */
mscx_status_t mscx_hostexec_run_hooks_scaled(const struct mscx_plan *plan,
                                             const struct mscx_hostexec_cfg *cfg,
                                             const struct hx_hooks *hooks, const struct mscx_scale *scale,
                                             char *err, size_t errlen);

#endif /* MSCX_HOSTEXEC_INT_H */
