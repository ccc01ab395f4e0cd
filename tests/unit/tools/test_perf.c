/* SPDX-License-Identifier: MIT */
/* mscx-perf's pure-C parts: arguments, sweep, data, output columns, JSON, bootstrap. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perf.h"
#include "ref.h"
#include "test_common.h"

static int parse(const char *line, struct perf_opts *o, char *err, size_t errlen)
{
    char buf[512], *argv[64], *save = NULL;
    int argc = 0;
    snprintf(buf, sizeof(buf), "%s", line);
    for (char *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    return mscx_perf_args_parse(argc, argv, o, err, errlen);
}

START_TEST(test_args_good)
{
    struct perf_opts o;
    char err[256] = "";
    ck_assert_int_eq(
        parse("mscx-perf -b 8 -e 128M -f 2 -d all -o all -n 7 -w 0 -c 0 -G 3 -a 3", &o, err, sizeof(err)), 0);
    ck_assert_uint_eq(o.min_bytes, 8);
    ck_assert_uint_eq(o.max_bytes, 128u << 20);
    ck_assert_uint_eq(o.step_factor, 2);
    ck_assert_uint_eq(o.type_mask, (1u << PERF_TYPE_COUNT) - 1);
    ck_assert_uint_eq(o.op_mask, (1u << PERF_OP_COUNT) - 1);
    ck_assert_int_eq(o.iters, 7);
    ck_assert_int_eq(o.warmup, 0);
    ck_assert_int_eq(o.check, 0);
    ck_assert_int_eq(o.graph_iters, 3);
    ck_assert_int_eq(o.average, 3);
    ck_assert_int_eq(o.coll, PERF_ALLREDUCE);
    ck_assert_int_eq(parse("/opt/bin/all_gather_perf -d bfloat16 -o sum", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.coll, PERF_ALLGATHER);
    ck_assert_uint_eq(o.type_mask, 1u << PERF_BF16);
    ck_assert_int_eq(
        parse("mscx-perf --op reducescatter -o min --json x.json --nproc 4 --progress", &o, err, sizeof(err)),
        0);
    ck_assert_int_eq(o.coll, PERF_REDUCESCATTER);
    ck_assert_uint_eq(o.op_mask, 1u << PERF_MIN);
    ck_assert_str_eq(o.json_path, "x.json");
    ck_assert_int_eq(o.nproc, 4);
    ck_assert_int_eq(o.progress, 1);
    ck_assert_int_eq(parse("mscx-perf --executor 8 --plan p.json -d half", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.executor_nranks, 8);
    ck_assert_str_eq(o.plan_path, "p.json");
    ck_assert_int_eq(o.baseline, 0);
    ck_assert_int_eq(parse("mscx-perf --executor 4 --baseline -b 1K -e 1M -f 2 -d float,half,bf16,int32 -G 2",
                           &o, err, sizeof(err)),
                     0);
    ck_assert_int_eq(o.baseline, 1);
    ck_assert_int_eq(o.executor_nranks, 4);
    ck_assert_int_eq(o.graph_iters, 2);
    ck_assert_uint_eq(o.type_mask,
                      (1u << PERF_FLOAT) | (1u << PERF_HALF) | (1u << PERF_BF16) | (1u << PERF_INT32));
    /* the option order does not matter */
    ck_assert_int_eq(parse("mscx-perf --baseline --executor 2", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.baseline, 1);
    ck_assert_int_eq(o.executor_nranks, 2);
    ck_assert_int_eq(o.nccl_window, 0);
    ck_assert_int_eq(parse("mscx-perf --nccl-window --nproc 2", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.nccl_window, 1);
}
END_TEST

static const struct {
    const char *line, *needle;
} bad_args[] = {
    {"mscx-perf -b", "needs a value"},
    {"mscx-perf -b 12Q", "bad size for -b"},
    {"mscx-perf -b -5", "bad size for -b"},
    {"mscx-perf -b 1G -e 1M", "larger than -e"},
    {"mscx-perf -f 0", "step factor"},
    {"mscx-perf -g 2", "one GPU per process"},
    {"mscx-perf -d float128", "unknown data type"},
    {"mscx-perf -o xor", "unknown reduction or collective"},
    {"mscx-perf --coll broadcast", "unknown collective"},
    {"mscx-perf -n 0", "-n"},
    {"mscx-perf -c 2", "-c"},
    {"mscx-perf -a 4", "-a"},
    {"mscx-perf --nproc 0", "--nproc"},
    {"mscx-perf --bogus", "unknown option"},
    {"mscx-perf extra", "unexpected argument"},
    {"mscx-perf -d int32 -o avg", "floating-point"},
    {"mscx-perf --executor 4 --nproc 2", "cannot be combined"},
    {"mscx-perf --executor 4 --baseline --nproc 2",
     "--baseline runs the hand-written kernel for all --executor N "
     "ranks in one process; it cannot be combined with --nproc"},
    {"mscx-perf --baseline --nproc 2", "--baseline"},
    {"mscx-perf --baseline", "--baseline needs --executor N"},
    {"mscx-perf --executor 2 --baseline --coll allgather", "allreduce only"},
    {"mscx-perf --baseline=1 --executor 2", "unknown option"},
    {"mscx-perf --nccl-window --executor 2", "--nccl-window registers the NCCL backend's buffers"},
};

START_TEST(test_args_bad)
{
    struct perf_opts o;
    char err[256] = "";
    ck_assert_int_eq(parse(bad_args[_i].line, &o, err, sizeof(err)), -1);
    ck_assert_msg(strstr(err, bad_args[_i].needle) != NULL, "'%s': message '%s' lacks '%s'",
                  bad_args[_i].line, err, bad_args[_i].needle);
}
END_TEST

START_TEST(test_sweep_counts_bw)
{
    struct perf_opts o;
    uint64_t sz[64], s, r, t;
    double alg, bus;
    mscx_perf_opts_default(&o);
    o.min_bytes = 8;
    o.max_bytes = 1024;
    o.step_factor = 2;
    ck_assert_uint_eq(mscx_perf_sweep(&o, sz, 64), 8);
    ck_assert_uint_eq(sz[0], 8);
    ck_assert_uint_eq(sz[7], 1024);
    o.step_factor = 1;
    o.step_bytes = 300;
    ck_assert_uint_eq(mscx_perf_sweep(&o, sz, 64), 4); /* 8 308 608 908 */
    ck_assert_uint_eq(sz[3], 908);
    mscx_perf_counts(PERF_ALLGATHER, 1000, 4, 3, &s, &r, &t);
    ck_assert_uint_eq(s, 83);
    ck_assert_uint_eq(r, 249);
    ck_assert_uint_eq(t, 249);
    mscx_perf_counts(PERF_REDUCESCATTER, 1000, 4, 3, &s, &r, &t);
    ck_assert_uint_eq(s, 249);
    ck_assert_uint_eq(r, 83);
    mscx_perf_bw(PERF_ALLREDUCE, 1000000, 10.0, 8, &alg, &bus);
    ck_assert_double_eq_tol(alg, 100.0, 1e-9);
    ck_assert_double_eq_tol(bus, 175.0, 1e-9);
    mscx_perf_bw(PERF_ALLGATHER, 1000000, 10.0, 8, &alg, &bus);
    ck_assert_double_eq_tol(bus, 87.5, 1e-9);
    mscx_perf_bw(PERF_REDUCESCATTER, 1000000, 10.0, 1, &alg, &bus);
    ck_assert_double_eq_tol(bus, 0.0, 1e-12);
}
END_TEST

/*
 * alltoall as nccl-tests' alltoall_perf: blocks of count/n rounded down to whole 16 bytes, n of them each
 * way, busbw = algbw (n-1)/n; the check accepts exactly the exchange (rank q's block r in block q of rank r).
 */
START_TEST(test_alltoall)
{
    struct perf_opts o;
    char err[256];
    uint64_t s, r, t;
    double alg, bus;
    ck_assert_int_eq(parse("/opt/bin/alltoall_perf -b 1K -e 1M", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.coll, PERF_ALLTOALL);
    ck_assert_str_eq(mscx_perf_coll_name(o.coll), "alltoall");
    ck_assert_int_eq(parse("mscx-perf --coll alltoall", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(o.coll, PERF_ALLTOALL);
    mscx_perf_counts(PERF_ALLTOALL, 1000, 4, 3, &s, &r, &t); /* 83 per peer, down to 80 */
    ck_assert_uint_eq(s, 240);
    ck_assert_uint_eq(r, 240);
    ck_assert_uint_eq(t, 240);
    mscx_perf_counts(PERF_ALLTOALL, 4096, 8, 8, &s, &r, &t); /* 64 per peer */
    ck_assert_uint_eq(s, 512);
    mscx_perf_bw(PERF_ALLTOALL, 1000000, 10.0, 8, &alg, &bus);
    ck_assert_double_eq_tol(alg, 100.0, 1e-9);
    ck_assert_double_eq_tol(bus, 87.5, 1e-9);
    enum { N = 4, PART = 6 };
    float in[N][N * PART], out[N * PART];
    for (int q = 0; q < N; q++)
        mscx_perf_fill(PERF_ALLTOALL, PERF_FLOAT, PERF_SUM, q, N, 5, in[q], N * PART);
    for (int rank = 0; rank < N; rank++) {
        for (int q = 0; q < N; q++)
            memcpy(out + q * PART, in[q] + rank * PART, PART * sizeof(float));
        ck_assert_int_eq(mscx_perf_check(PERF_ALLTOALL, PERF_FLOAT, PERF_SUM, rank, N, 5, out, N * PART), 0);
        float keep = out[PART + 1];
        out[PART + 1] = in[1][rank * PART + 2]; /* the right peer, the wrong element */
        ck_assert_int_eq(mscx_perf_check(PERF_ALLTOALL, PERF_FLOAT, PERF_SUM, rank, N, 5, out, N * PART), 1);
        out[PART + 1] = keep;
        memcpy(out, in[0] + ((rank + 1) % N) * PART, PART * sizeof(float)); /* another rank's block */
        ck_assert_int_eq(mscx_perf_check(PERF_ALLTOALL, PERF_FLOAT, PERF_SUM, rank, N, 5, out, N * PART),
                         PART);
    }
    /* the hand-written alltoall of mscx-bench-gpu: the one-shot packet plans only, whole 8-byte units per
     * peer */
    const char *why = NULL;
    ck_assert_int_eq(mscx_ref_algo_of_plan("alltoall_n4_rpn4_oneshot_1K_64K"), MSCX_REF_ALLTOALL);
    ck_assert_int_eq(mscx_ref_algo_of_plan("alltoall_n4_rpn4_direct_64K_2M"), MSCX_REF_NONE);
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n4_rpn4_oneshot_1K_4K"), MSCX_REF_ONESHOT);
    ck_assert_int_eq(mscx_ref_supports(MSCX_REF_ALLTOALL, MSCX_DT_FP64, MSCX_REDOP_PROD, 4, 96, &why), 1);
    ck_assert_int_eq(mscx_ref_supports(MSCX_REF_ALLTOALL, MSCX_DT_FP32, MSCX_REDOP_SUM, 4, 104, &why), 0);
    ck_assert_str_eq(why, "size is not a positive multiple of 8 bytes per peer");
    ck_assert_uint_eq(mscx_ref_scratch_bytes(MSCX_REF_ALLTOALL, 4, 1024), 2 * 4 * 16 * 32);
}
END_TEST

START_TEST(test_half_bf16_exact)
{
    uint16_t h[1];
    for (int v = -2048; v <= 2048; v++) {
        mscx_perf_store(PERF_HALF, h, 0, v);
        ck_assert_double_eq(mscx_perf_load(PERF_HALF, h, 0), (double)v);
        if (v >= -256 && v <= 256) {
            mscx_perf_store(PERF_BF16, h, 0, v);
            ck_assert_double_eq(mscx_perf_load(PERF_BF16, h, 0), (double)v);
        }
    }
    mscx_perf_store(PERF_HALF, h, 0, 0.5);
    ck_assert_double_eq(mscx_perf_load(PERF_HALF, h, 0), 0.5);
}
END_TEST

/*
 * Simulate each collective on the host in the data type itself (store and
 * load through the type), then check: no element is wrong; one corrupted
 * element is exactly one wrong.
 */
START_TEST(test_data_check_roundtrip)
{
    const int n = 5;
    const uint64_t part = 37, total = part * n;
    for (int c = 0; c < PERF_COLL_COUNT; c++) {
        for (int t = 0; t < PERF_TYPE_COUNT; t++) {
            for (int op = 0; op < PERF_OP_COUNT; op++) {
                size_t es = mscx_perf_type_size((enum perf_type)t);
                uint64_t sendc = c == PERF_ALLGATHER ? part : total;
                uint64_t recvc = c == PERF_REDUCESCATTER ? part : total;
                char *in = malloc(n * sendc * es), *out = malloc(recvc * es);
                if (op == PERF_AVG && !mscx_perf_type_is_float((enum perf_type)t))
                    goto next;
                for (int q = 0; q < n; q++)
                    mscx_perf_fill(c, t, op, q, n, 3, in + q * sendc * es, sendc);
                for (int rank = 0; rank < n; rank++) {
                    for (uint64_t i = 0; i < recvc; i++) {
                        double acc;
                        if (c == PERF_ALLGATHER) {
                            acc = mscx_perf_load(t, in + (i / part) * sendc * es, i % part);
                        } else if (c == PERF_ALLTOALL) {
                            acc = mscx_perf_load(t, in + (i / part) * sendc * es, rank * part + i % part);
                        } else {
                            uint64_t j = c == PERF_REDUCESCATTER ? rank * part + i : i;
                            acc = mscx_perf_load(t, in, j);
                            for (int q = 1; q < n; q++) {
                                double v = mscx_perf_load(t, in + q * sendc * es, j);
                                acc = op == PERF_PROD  ? acc * v
                                      : op == PERF_MIN ? fmin(acc, v)
                                      : op == PERF_MAX ? fmax(acc, v)
                                                       : acc + v;
                            }
                            if (op == PERF_AVG)
                                acc /= n;
                        }
                        mscx_perf_store(t, out, i, acc);
                    }
                    ck_assert_msg(mscx_perf_check(c, t, op, rank, n, 3, out, recvc) == 0, "%s %s %s rank %d",
                                  mscx_perf_coll_name(c), mscx_perf_type_name(t), mscx_perf_op_name(op),
                                  rank);
                    mscx_perf_store(t, out, recvc / 2, 99);
                    ck_assert_int_eq(mscx_perf_check(c, t, op, rank, n, 3, out, recvc), 1);
                    /* A different seed's data (a stale buffer) is mostly wrong. */
                    mscx_perf_store(t, out, recvc / 2,
                                    mscx_perf_expected(c, t, op, rank, n, 3, recvc, recvc / 2));
                    if (op != PERF_PROD)
                        ck_assert_int_gt(mscx_perf_check(c, t, op, rank, n, 4, out, recvc),
                                         (int64_t)recvc / 4);
                }
            next:
                free(in);
                free(out);
            }
        }
    }
}
END_TEST

/* A backend with deterministic times: out-of-place 5 + bytes/100 us, in-place 1 us more. */
static int fake_run(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p)
{
    (void)ctx;
    (void)iters;
    (void)graph_iters;
    *us_p = 5.0 + (double)call->bytes / 100.0 + call->in_place;
    return 0;
}

static int fake_check(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p)
{
    (void)ctx;
    (void)seed;
    *wrong_p = (call->bytes == 8192 && call->in_place) ? 3 : 0;
    return 0;
}

static char *run_fake(const char *args, struct perf_result **rows_p, size_t *nrows_p, int64_t *wrong_p,
                      double *bw_p)
{
    struct perf_opts o;
    struct perf_boot b = {.rank = 0, .nranks = 1};
    struct perf_backend be = {"fake", 4, NULL, fake_run, fake_check};
    char err[256], *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    ck_assert_int_eq(parse(args, &o, err, sizeof(err)), 0);
    ck_assert_int_eq(mscx_perf_sweep_run(&o, &b, &be, out, rows_p, nrows_p, wrong_p, bw_p), 0);
    mscx_perf_print_footer(out, *wrong_p, *bw_p);
    fclose(out);
    return text;
}

START_TEST(test_golden_columns)
{
    struct perf_result *rows = NULL;
    size_t nrows = 0, len = 0;
    int64_t wrong = 0;
    double bw = 0;
    char *text = run_fake("mscx-perf -b 8 -e 8M -f 32 -d float", &rows, &nrows, &wrong, &bw);
    char *golden = mscx_test_read_file(mscx_test_src("tests/unit/tools/golden-allreduce.txt"), &len);
    ck_assert_ptr_nonnull(golden);
    ck_assert_msg(strcmp(text, golden) == 0, "output differs from golden-allreduce.txt:\n%s", text);
    ck_assert_uint_eq(nrows, 5);
    ck_assert_int_eq(wrong, 3);
    free(golden);
    free(text);
    free(rows);
}
END_TEST

START_TEST(test_rows_types_ops)
{
    struct perf_result *rows = NULL;
    size_t nrows = 0;
    int64_t wrong = 0;
    double bw = 0;
    /* 4 sizes x (int32: sum prod max min; float: + avg) = 36 rows; allgather prints "none". */
    free(run_fake("mscx-perf -b 1K -e 8K -f 2 -d int32,float -o all", &rows, &nrows, &wrong, &bw));
    ck_assert_uint_eq(nrows, 36);
    free(rows);
    rows = NULL;
    char *t = run_fake("mscx-perf -b 1K -e 8K -f 2 -d float -o all --coll reducescatter", &rows, &nrows,
                       &wrong, &bw);
    ck_assert_uint_eq(nrows, 20);
    ck_assert_ptr_nonnull(strstr(t, "     float     avg      -1"));
    free(t);
    free(rows);
    rows = NULL;
    t = run_fake("all_gather_perf -b 1K -e 8K -f 2 -d half", &rows, &nrows, &wrong, &bw);
    ck_assert_uint_eq(nrows, 4);
    ck_assert_ptr_nonnull(strstr(t, "      half    none      -1"));
    ck_assert_double_eq_tol(rows[3].busbw[0], rows[3].algbw[0] * 0.75, 1e-12);
    free(t);
    free(rows);
}
END_TEST

START_TEST(test_json_roundtrip)
{
    struct perf_opts o;
    struct perf_result rows[2] = {
        {8, 2, PERF_FLOAT, PERF_SUM, -1, {5.5, 6.5}, {0.001, 0.002}, {0.0015, 0.003}, {0, 2}, {0, 0}},
        {1048576, 262144, PERF_FLOAT, PERF_SUM, -1, {50.25, 51}, {20.9, 20.5}, {31.3, 30.8}, {0, 0}, {0, 0}},
    };
    char path[] = "/tmp/mscx-perf-json-XXXXXX", err[256];
    json_error_t jerr;
    json_t *root, *res;
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(parse("mscx-perf -b 8 -e 1M -f 2", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(mscx_perf_json_write(path, &o, "nccl", 8, rows, 2, 2, 15.5), 0);
    root = json_load_file(path, 0, &jerr);
    ck_assert_msg(root != NULL, "invalid JSON: %s line %d", jerr.text, jerr.line);
    ck_assert_str_eq(json_string_value(json_object_get(root, "tool")), "mscx-perf");
    ck_assert_str_eq(json_string_value(json_object_get(root, "backend")), "nccl");
    ck_assert_str_eq(json_string_value(json_object_get(root, "collective")), "allreduce");
    ck_assert_int_eq(json_integer_value(json_object_get(root, "nranks")), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(root, "wrong")), 2);
    res = json_object_get(root, "results");
    ck_assert_uint_eq(json_array_size(res), 2);
    json_t *r1 = json_array_get(res, 1), *ip0 = json_object_get(json_array_get(res, 0), "in_place");
    ck_assert_int_eq(json_integer_value(json_object_get(r1, "size")), 1048576);
    ck_assert_str_eq(json_string_value(json_object_get(r1, "type")), "float");
    ck_assert_double_eq_tol(json_real_value(json_object_get(json_object_get(r1, "out_of_place"), "time_us")),
                            50.25, 1e-9);
    ck_assert_int_eq(json_integer_value(json_object_get(ip0, "wrong")), 2);
    json_decref(root);
    /* Unchecked: wrong is null, not 0. */
    o.check = 0;
    rows[0].wrong[0] = rows[0].wrong[1] = rows[1].wrong[0] = rows[1].wrong[1] = -1;
    ck_assert_int_eq(mscx_perf_json_write(path, &o, "nccl", 8, rows, 2, 0, 15.5), 0);
    root = json_load_file(path, 0, &jerr);
    ck_assert_ptr_nonnull(root);
    ck_assert(json_is_null(json_object_get(root, "wrong")));
    ck_assert(json_is_null(json_object_get(
        json_object_get(json_array_get(json_object_get(root, "results"), 0), "in_place"), "wrong")));
    json_decref(root);
    /* n/a: "na" true and no numbers at all */
    rows[0].na[0] = 1;
    ck_assert_int_eq(mscx_perf_json_write(path, &o, "baseline", 8, rows, 2, 0, 15.5), 0);
    root = json_load_file(path, 0, &jerr);
    ck_assert_ptr_nonnull(root);
    json_t *oop = json_object_get(json_array_get(json_object_get(root, "results"), 0), "out_of_place");
    ck_assert(json_is_true(json_object_get(oop, "na")));
    ck_assert(json_is_null(json_object_get(oop, "time_us")));
    ck_assert(json_is_null(json_object_get(oop, "busbw")));
    ck_assert(json_is_real(json_object_get(
        json_object_get(json_array_get(json_object_get(root, "results"), 0), "in_place"), "time_us")));
    json_decref(root);
    unlink(path);
    ck_assert_int_eq(mscx_perf_json_write("/nonexistent-dir/x.json", &o, "nccl", 8, rows, 2, 0, 0), -1);
}
END_TEST

/* A backend that cannot run sizes below 1K nor in-place 64K: those bodies print n/a. */
static int na_run(void *ctx, const struct perf_call *call, int iters, int graph_iters, double *us_p)
{
    int *calls = ctx;
    (void)graph_iters;
    if (call->bytes < 1024 || (call->bytes == 65536 && call->in_place))
        return PERF_NA;
    calls[0]++;
    if (iters == 3 && calls[2] < 2) /* a warm-up (-w 3): its size, in order */
        calls[3 + calls[2]++] = (int)call->bytes;
    *us_p = 5.0 + (double)call->bytes / 100.0;
    return 0;
}

static int na_check(void *ctx, const struct perf_call *call, int seed, int64_t *wrong_p)
{
    int *calls = ctx;
    (void)seed;
    if (call->bytes < 1024 || (call->bytes == 65536 && call->in_place))
        return PERF_NA;
    calls[1]++;
    *wrong_p = 0;
    return 0;
}

START_TEST(test_na_rows)
{
    struct perf_opts o;
    struct perf_boot b = {.rank = 0, .nranks = 1};
    int calls[5] = {0, 0, 0, 0, 0};
    struct perf_backend be = {"fake", 4, calls, na_run, na_check};
    struct perf_result *rows = NULL;
    size_t nrows = 0, len = 0;
    int64_t wrong = -5;
    double bw = 0;
    char err[256], *text = NULL;
    FILE *out = open_memstream(&text, &len);
    ck_assert_int_eq(parse("mscx-perf -b 256 -e 64K -f 16 -d float -w 3", &o, err, sizeof(err)), 0);
    ck_assert_int_eq(mscx_perf_sweep_run(&o, &b, &be, out, &rows, &nrows, &wrong, &bw), 0);
    mscx_perf_print_na(out, rows, nrows);
    mscx_perf_print_footer(out, wrong, bw);
    fclose(out);
    ck_assert_uint_eq(nrows, 3); /* 256, 4K, 64K */
    ck_assert(rows[0].na[0] && rows[0].na[1]);
    ck_assert(!rows[1].na[0] && !rows[1].na[1]);
    ck_assert(!rows[2].na[0] && rows[2].na[1]);
    ck_assert_int_eq(rows[0].wrong[0], -1);
    ck_assert_int_eq(wrong, 0);
    /* the warm-up ran at 64K (the largest size the backend runs) and at 4K (the smallest), then 3 timed
       bodies; 3 checks */
    ck_assert_int_eq(calls[0], 1 + 1 + 3);
    ck_assert_int_eq(calls[2], 2);
    ck_assert_int_eq(calls[3], 65536);
    ck_assert_int_eq(calls[4], 4096);
    ck_assert_int_eq(calls[1], 3);
    /* the columns keep their widths: n/a where the numbers would be */
    ck_assert_msg(
        strstr(text, "         256            64     float     sum      -1      n/a     n/a     n/a    n/a"
                     "      n/a     n/a     n/a    n/a\n") != NULL,
        "%s", text);
    ck_assert_msg(strstr(text, "# Rows n/a             : 2 of 3") != NULL, "%s", text);
    /* avg busbw over the 3 measured bodies only */
    double want = (rows[1].busbw[0] + rows[1].busbw[1] + rows[2].busbw[0]) / 3;
    ck_assert_double_eq_tol(bw, want, 1e-12);
    free(text);
    free(rows);
}
END_TEST

/* The hand-written baselines' rules (tools/bench/ref/ref.c): what runs, and the scratch it needs. */
START_TEST(test_ref_rules)
{
    const char *why = NULL;
    char err[256];
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n8_rpn8_oneshot_1K_64K"), MSCX_REF_ONESHOT);
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n8_rpn8_twophase_64K_1M"), MSCX_REF_TWOPHASE);
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_pkt_n4"), MSCX_REF_TWOPHASE);
    /* mscx-plangen --algo twophase --blocks G (tools/bench/bench-variants.sh) */
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n8_rpn8_twophase_cols8_64K_1M"), MSCX_REF_TWOPHASE);
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n4_rpn4_twophase_rows4_64K_1M"), MSCX_REF_TWOPHASE);
    ck_assert_int_eq(mscx_ref_algo_of_plan("allreduce_n8_rpn4_hier2_1K_64K"), MSCX_REF_NONE);
    ck_assert_int_eq(mscx_ref_algo_of_plan(NULL), MSCX_REF_NONE);
    const enum mscx_dtype ok_types[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16, MSCX_DT_INT32,
                                        MSCX_DT_UINT32};
    for (size_t i = 0; i < sizeof(ok_types) / sizeof(ok_types[0]); i++) {
        ck_assert(mscx_ref_supports(MSCX_REF_ONESHOT, ok_types[i], MSCX_REDOP_SUM, 8, 1024, &why));
        ck_assert_ptr_null(why);
        ck_assert(mscx_ref_supports(MSCX_REF_TWOPHASE, ok_types[i], MSCX_REDOP_SUM, 8, 8, NULL));
    }
    ck_assert(!mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP64, MSCX_REDOP_SUM, 8, 1024, &why));
    ck_assert_ptr_nonnull(strstr(why, "data type"));
    ck_assert(!mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP32, MSCX_REDOP_MAX, 8, 1024, &why));
    ck_assert_ptr_nonnull(strstr(why, "sum"));
    ck_assert(!mscx_ref_supports(MSCX_REF_TWOPHASE, MSCX_DT_FP32, MSCX_REDOP_SUM, 8, 1028, &why));
    ck_assert_ptr_nonnull(strstr(why, "multiple of 8"));
    ck_assert(!mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP32, MSCX_REDOP_SUM, 8, 0, NULL));
    ck_assert(
        mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP32, MSCX_REDOP_SUM, 1, 1024, NULL)); /* launch probe */
    ck_assert(!mscx_ref_supports(MSCX_REF_TWOPHASE, MSCX_DT_FP32, MSCX_REDOP_SUM, 1, 1024, &why));
    ck_assert_ptr_nonnull(strstr(why, "two-phase"));
    ck_assert(!mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP32, MSCX_REDOP_SUM, 0, 1024, NULL));
    ck_assert(!mscx_ref_supports(MSCX_REF_ONESHOT, MSCX_DT_FP32, MSCX_REDOP_SUM, 17, 1024, NULL));
    ck_assert(!mscx_ref_supports(MSCX_REF_NONE, MSCX_DT_FP32, MSCX_REDOP_SUM, 8, 1024, &why));
    ck_assert_ptr_nonnull(strstr(why, "no hand-written kernel"));
    /* oneshot: 2 halves x n slots x 2 bytes per byte; twophase: 2 halves x 2 regions x n chunks, rounded up
     */
    ck_assert_uint_eq(mscx_ref_scratch_bytes(MSCX_REF_ONESHOT, 8, 1024), 2 * 8 * 2 * 1024);
    ck_assert_uint_eq(mscx_ref_scratch_bytes(MSCX_REF_TWOPHASE, 8, 1024), 8 * 1024);
    ck_assert_uint_eq(mscx_ref_scratch_bytes(MSCX_REF_TWOPHASE, 8, 24), 2 * 2 * 8 * 16 * 1);
    ck_assert_uint_eq(mscx_ref_scratch_bytes(MSCX_REF_NONE, 8, 1024), 0);
    /* launch arguments */
    static uint32_t state[MSCX_REF_STATE_WORDS];
    static char scr[2][4096] __attribute__((aligned(16)));
    static uint64_t buf[64];
    struct mscx_ref_launch l = {.algo = MSCX_REF_TWOPHASE,
                                .dtype = MSCX_DT_FP32,
                                .send = buf,
                                .recv = buf,
                                .scratch = {scr[0], scr[1]},
                                .scratch_bytes = 4096,
                                .state = state,
                                .rank = 1,
                                .nranks = 2,
                                .bytes = 512,
                                .blocks = 2,
                                .threads = 512};
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), 0);
    l.bytes = 1024; /* needs 8K of scratch */
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "needs 8192 bytes of scratch, 4096 allocated"));
    l.bytes = 512;
    l.blocks = MSCX_REF_MAX_BLOCKS + 1;
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), -1);
    l.blocks = 2;
    l.scratch[1] = scr[1] + 8;
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "16-byte aligned"));
    l.scratch[1] = scr[1];
    l.rank = 2;
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), -1);
    l.rank = 1;
    l.dtype = MSCX_DT_INT64;
    ck_assert_int_eq(mscx_ref_check_launch(&l, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "data type"));
}
END_TEST

/* Three processes exchange through the file allgather, several rounds. */
START_TEST(test_boot_allgather)
{
    char dir[] = "/tmp/mscx-perf-boot-XXXXXX";
    pid_t kids[2];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (int r = 0; r < 3; r++) {
        pid_t p = r ? fork() : 0;
        if (r && p > 0) {
            kids[r - 1] = p;
            continue;
        }
        if (r == 0)
            continue;
        struct perf_boot b = {.rank = r, .nranks = 3};
        int bad = 0;
        snprintf(b.dir, sizeof(b.dir), "%s", dir);
        for (int k = 0; k < 5; k++) {
            int mine = 100 * k + r, all[3];
            bad |= mscx_perf_allgather(&b, &mine, all, sizeof(int));
            for (int q = 0; q < 3; q++)
                bad |= all[q] != 100 * k + q;
        }
        b.owns_dir = 1;
        mscx_perf_boot_fini(&b);
        _exit(bad ? 1 : 0);
    }
    struct perf_boot b = {.rank = 0, .nranks = 3, .owns_dir = 1};
    snprintf(b.dir, sizeof(b.dir), "%s", dir);
    for (int k = 0; k < 5; k++) {
        int mine = 100 * k, all[3];
        ck_assert_int_eq(mscx_perf_allgather(&b, &mine, all, sizeof(int)), 0);
        for (int q = 0; q < 3; q++)
            ck_assert_int_eq(all[q], 100 * k + q);
    }
    mscx_perf_boot_fini(&b);
    for (int i = 0; i < 2; i++) {
        int st;
        ck_assert_int_eq(waitpid(kids[i], &st, 0), kids[i]);
        ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("perf");
    TCase *tc = mscx_tcase("args");
    tcase_add_test(tc, test_args_good);
    tcase_add_loop_test(tc, test_args_bad, 0, (int)(sizeof(bad_args) / sizeof(bad_args[0])));
    suite_add_tcase(s, tc);
    tc = mscx_tcase("data");
    tcase_add_test(tc, test_sweep_counts_bw);
    tcase_add_test(tc, test_alltoall);
    tcase_add_test(tc, test_half_bf16_exact);
    tcase_add_test(tc, test_data_check_roundtrip);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("output");
    tcase_add_test(tc, test_golden_columns);
    tcase_add_test(tc, test_rows_types_ops);
    tcase_add_test(tc, test_json_roundtrip);
    tcase_add_test(tc, test_na_rows);
    tcase_add_test(tc, test_ref_rules);
    tcase_add_test(tc, test_boot_allgather);
    suite_add_tcase(s, tc);
    return s;
}
