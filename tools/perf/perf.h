/* SPDX-License-Identifier: MIT */
/*
 * mscx-perf: an nccl-tests compatible benchmark. The pure-C parts (argument
 * parsing, size sweep, data generation and checking, output formatting, JSON)
 * live in their own files so the unit tests call them without a GPU.
 */
#ifndef MSCX_PERF_H
#define MSCX_PERF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Collectives, in the order of the names table in perf_args.c. */
enum perf_coll { PERF_ALLREDUCE = 0, PERF_ALLGATHER, PERF_REDUCESCATTER, PERF_ALLTOALL, PERF_COLL_COUNT };

/* Data types, numbered as ncclDataType_t. */
enum perf_type {
    PERF_INT8 = 0,
    PERF_UINT8,
    PERF_INT32,
    PERF_UINT32,
    PERF_INT64,
    PERF_UINT64,
    PERF_HALF,
    PERF_FLOAT,
    PERF_DOUBLE,
    PERF_BF16,
    PERF_TYPE_COUNT
};

/* Reduction operators, numbered as ncclRedOp_t. */
enum perf_op { PERF_SUM = 0, PERF_PROD, PERF_MAX, PERF_MIN, PERF_AVG, PERF_OP_COUNT };

struct perf_opts {
    enum perf_coll coll;
    uint64_t min_bytes, max_bytes, step_bytes;
    uint64_t step_factor; /* > 1: multiply; else add step_bytes */
    int ngpus;            /* -g: GPUs per process; only 1 */
    unsigned type_mask;   /* 1 << enum perf_type */
    unsigned op_mask;     /* 1 << enum perf_op */
    int iters, warmup, check, graph_iters, average;
    int nproc;             /* --nproc: fork this many ranks; 0 = from the environment */
    int progress;          /* --progress, or stderr is a TTY */
    const char *json_path; /* --json */
    int executor_nranks;   /* --executor N; 0 = NCCL */
    int baseline;          /* --baseline: the hand-written kernels instead of the executor */
    int nccl_window;       /* --nccl-window: buffers from ncclMemAlloc, registered as a window */
    const char *plan_path; /* --plan */
    const char *boot_dir;  /* --bootstrap-dir */
    int device;            /* --device: first CUDA device (default local rank) */
    int help;
};

/* One row: [0] out-of-place, [1] in-place. */
struct perf_result {
    uint64_t bytes, count;
    enum perf_type type;
    enum perf_op op; /* PERF_OP_COUNT: no reduction ("none") */
    int root;
    double time_us[2], algbw[2], busbw[2];
    int64_t wrong[2]; /* -1: not checked (printed N/A) */
    int na[2];        /* the backend cannot run this call: printed n/a, no numbers */
};

/* perf_args.c */
void mscx_perf_opts_default(struct perf_opts *o);
/** Parse argv; @return 0, or -1 with a message in @p err. argv[0]'s basename may name the collective. */
int mscx_perf_args_parse(int argc, char **argv, struct perf_opts *o, char *err, size_t errlen);
void mscx_perf_usage(FILE *out, const char *prog);
const char *mscx_perf_coll_name(enum perf_coll c);
const char *mscx_perf_type_name(enum perf_type t);
const char *mscx_perf_op_name(enum perf_op op);
size_t mscx_perf_type_size(enum perf_type t);
int mscx_perf_type_is_float(enum perf_type t);
/** Parse a size with an optional K/M/G suffix (powers of 1024); @return 0 or -1. */
int mscx_perf_parse_size(const char *s, uint64_t *v_p);

/* perf_sweep.c */
/** Sizes of the sweep: writes up to @p max into @p sizes; @return how many there are in all. */
size_t mscx_perf_sweep(const struct perf_opts *o, uint64_t *sizes, size_t max);
/** Per-rank element counts for a size: send, recv, and the printed total. */
void mscx_perf_counts(enum perf_coll c, uint64_t bytes, size_t esize, int nranks, uint64_t *send_p,
                      uint64_t *recv_p, uint64_t *total_p);
/** algbw and busbw in GB/s for @p total_bytes moved in @p time_us. */
void mscx_perf_bw(enum perf_coll c, uint64_t total_bytes, double time_us, int nranks, double *algbw_p,
                  double *busbw_p);

/* perf_data.c */
/** The exact input value of element @p i (of the rank's send buffer) on @p rank. */
double mscx_perf_value(enum perf_op op, int rank, int nranks, uint64_t i, int seed);
void mscx_perf_store(enum perf_type t, void *buf, uint64_t i, double v);
double mscx_perf_load(enum perf_type t, const void *buf, uint64_t i);
/** Fill a rank's send buffer (@p count elements) with its inputs. */
void mscx_perf_fill(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                    void *buf, uint64_t count);
/** Expected value of output element @p i of @p rank (recv count @p recv). */
double mscx_perf_expected(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                          uint64_t recv, uint64_t i);
/** Count elements of @p out that differ from the expected output. */
int64_t mscx_perf_check(enum perf_coll c, enum perf_type t, enum perf_op op, int rank, int nranks, int seed,
                        const void *out, uint64_t recv);

/* perf_format.c */
void mscx_perf_print_config(FILE *out, const struct perf_opts *o, int nranks);
void mscx_perf_print_header(FILE *out);
void mscx_perf_print_row(FILE *out, const struct perf_result *r);
void mscx_perf_print_footer(FILE *out, int64_t wrong, double avg_busbw);
/** One comment line counting the n/a rows; prints nothing when there are none. */
void mscx_perf_print_na(FILE *out, const struct perf_result *rows, size_t nrows);
/** The progress line for size @p k of @p n (no newline; starts with '\r'). */
void mscx_perf_progress(FILE *out, size_t k, size_t n, uint64_t bytes);

/* perf_json.c */
/** Write results as JSON; @p backend names what ran ("nccl", "executor"). @return 0 or -1. */
int mscx_perf_json_write(const char *path, const struct perf_opts *o, const char *backend, int nranks,
                         const struct perf_result *rows, size_t nrows, int64_t wrong, double avg_busbw);

/* perf_boot.c */
struct perf_boot {
    int rank, nranks, local_rank;
    char dir[512];
    unsigned seq;
    int owns_dir; /* the launcher made the directory and removes it */
};
/** Rank and size from --nproc or the launcher's environment; @return 0 or -1 with a message. */
int mscx_perf_boot_init(struct perf_boot *b, const struct perf_opts *o, char *err, size_t errlen);
/** Fork o->nproc ranks; returns 0 in each child (b set up), or exits with their status in the parent. */
int mscx_perf_boot_launch(struct perf_boot *b, const struct perf_opts *o, char *err, size_t errlen);
/** all[r * bytes ...] receives rank r's @p mine, through files in b->dir. @return 0 or -1 (timeout). */
int mscx_perf_allgather(struct perf_boot *b, const void *mine, void *all, size_t bytes);
void mscx_perf_boot_fini(struct perf_boot *b);

/* One collective call of the sweep, as a backend sees it. */
struct perf_call {
    enum perf_coll coll;
    enum perf_type type;
    enum perf_op op;
    uint64_t bytes; /* the size of the sweep step */
    uint64_t send_count, recv_count;
    int in_place;
};

/* A backend's run or check returns this when it cannot run the call (no plan or kernel for the size,
 * type or reduction): the row prints n/a. Every process of a multi-process run must agree. */
#define PERF_NA 1

/* What runs the calls: NCCL (one rank per process), the executor or the baseline kernels (all ranks here). */
struct perf_backend {
    const char *name; /* "nccl", "executor", "baseline", "fake" */
    int nranks;       /* ranks of the collective */
    void *ctx;
    /**
     * Run @p iters calls (captured in a graph launched @p graph_iters times when > 0); time per call in us.
     * @return 0, PERF_NA, or -1 after printing why
     */
    int (*run)(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p);
    /** Fill exact inputs, run once, count wrong output elements of the ranks in this process; returns as run.
     */
    int (*check)(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p);
};

/* perf_run.c */
/**
 * The sweep: types x ops x sizes, out-of-place then in-place, timings
 * combined across processes per -a through @p b. Rank 0 prints rows to
 * @p out (NULL: print nothing) as they finish.
 * @param rows_p receives a malloc'd array of results; free() it
 * @return 0, or -1 after printing why
 */
int mscx_perf_sweep_run(const struct perf_opts *o, struct perf_boot *b, const struct perf_backend *be,
                        FILE *out, struct perf_result **rows_p, size_t *nrows_p, int64_t *wrong_p,
                        double *avg_busbw_p);

/* perf_nccl.c / perf_exec.c: set up a backend, and tear it down. */
int mscx_perf_nccl_open(const struct perf_opts *o, struct perf_boot *b, FILE *out, struct perf_backend *be);
void mscx_perf_nccl_close(struct perf_backend *be);
int mscx_perf_exec_open(const struct perf_opts *o, FILE *out, struct perf_backend *be);
void mscx_perf_exec_close(struct perf_backend *be);

#define PERF_MAX_SIZES 4096

#endif
