/* SPDX-License-Identifier: MIT */
/* The sweep loop shared by every backend: timing, checking, printing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf.h"

/*
 * Combine one value from every process per -a: 0 rank 0, 1 average, 2 minimum, 3 maximum.
 * NAN (a process could not run the call) from any process makes the result NAN.
 */
static int combine_time(struct perf_boot *b, int average, double mine, double *out_p)
{
    double *all = calloc((size_t)b->nranks, sizeof(double)), v;
    if (all == NULL || mscx_perf_allgather(b, &mine, all, sizeof(double))) {
        free(all);
        return -1;
    }
    v = all[0];
    for (int r = 0; r < b->nranks; r++) {
        if (isnan(all[r])) {
            *out_p = NAN;
            free(all);
            return 0;
        }
    }
    for (int r = 1; r < b->nranks; r++) {
        if (average == 1)
            v += all[r];
        else if (average == 2 && all[r] < v)
            v = all[r];
        else if (average == 3 && all[r] > v)
            v = all[r];
    }
    *out_p = average == 1 ? v / b->nranks : v;
    free(all);
    return 0;
}

static int sum_wrong(struct perf_boot *b, int64_t mine, int64_t *out_p)
{
    int64_t *all = calloc((size_t)b->nranks, sizeof(int64_t)), v = 0;
    if (all == NULL || mscx_perf_allgather(b, &mine, all, sizeof(int64_t))) {
        free(all);
        return -1;
    }
    for (int r = 0; r < b->nranks; r++)
        v += all[r];
    *out_p = v;
    free(all);
    return 0;
}

/* avg is defined for floating-point types only; nccl-tests skips the rest too. */
static int combo_ok(enum perf_type t, enum perf_op op)
{
    return op != PERF_AVG || mscx_perf_type_is_float(t);
}

static int run_one(const struct perf_opts *o, struct perf_boot *b, const struct perf_backend *be,
                   struct perf_call *call, int seed, struct perf_result *r)
{
    for (int ip = 0; ip < 2; ip++) {
        double us = 0, t;
        int64_t wrong = -1;
        int rc;
        call->in_place = ip;
        if ((rc = be->run(be->ctx, call, o->iters, o->graph_iters, &us)) < 0 ||
            combine_time(b, o->average, rc == PERF_NA ? NAN : us, &t))
            return -1;
        r->wrong[ip] = -1;
        if (isnan(t)) { /* every process skips the row alike */
            r->na[ip] = 1;
            r->time_us[ip] = r->algbw[ip] = r->busbw[ip] = 0;
            continue;
        }
        r->time_us[ip] = t;
        mscx_perf_bw(o->coll, r->bytes, t, be->nranks, &r->algbw[ip], &r->busbw[ip]);
        if (o->check) {
            int64_t mine = 0;
            if ((rc = be->check(be->ctx, call, seed * 2 + ip, &mine)) != 0 || sum_wrong(b, mine, &wrong)) {
                if (rc == PERF_NA)
                    fprintf(stderr,
                            "mscx-perf: internal bug: the backend ran %llu bytes but cannot check them\n",
                            (unsigned long long)call->bytes);
                return -1;
            }
        }
        r->wrong[ip] = wrong;
    }
    return 0;
}

/* o->warmup untimed iterations of @p call at @p bytes: the backend's run result (PERF_NA: it cannot). */
static int warm_up(const struct perf_opts *o, const struct perf_backend *be, struct perf_call *call,
                   size_t es, uint64_t bytes)
{
    double dummy;
    call->bytes = bytes;
    mscx_perf_counts(o->coll, bytes, es, be->nranks, &call->send_count, &call->recv_count, &(uint64_t){0});
    return be->run(be->ctx, call, o->warmup, 0, &dummy);
}

/* The state of one sweep. */
struct sweep {
    const struct perf_opts *o;
    struct perf_boot *b;
    const struct perf_backend *be;
    FILE *out;
    const uint64_t *sizes;
    size_t nsizes;
    struct perf_result *rows;
    size_t nrows, step, nsteps;
    int64_t wrong;
    double bw; /* the sum of nbw bus bandwidths */
    size_t nbw;
    int progress;
};

/* The sweep runs type @p t with reduction @p op. */
static int selected(const struct perf_opts *o, int t, int op)
{
    return (o->type_mask >> t & 1) && (o->op_mask >> op & 1) && combo_ok((enum perf_type)t, (enum perf_op)op);
}

/*
 * Warm up as nccl-tests does: at the largest size of the sweep the backend
 * runs, then at the smallest, so that what a path does on its first call (for
 * mscx: a size's program compiled and uploaded, user buffers registered) is
 * not timed in the first row when the largest size takes another path.
 * @return 0 or -1
 */
static int warm_up_sweep(const struct sweep *sw, struct perf_call *call, size_t es)
{
    const struct perf_opts *o = sw->o;
    size_t warm_hi = sw->nsizes;
    for (size_t s = sw->nsizes; o->warmup && s-- > 0;) {
        int wrc = warm_up(o, sw->be, call, es, sw->sizes[s]);
        if (wrc < 0)
            return -1;
        if (wrc == 0) {
            warm_hi = s;
            break;
        }
    }
    for (size_t s = 0; o->warmup && warm_hi < sw->nsizes && s < warm_hi; s++) {
        int wrc = warm_up(o, sw->be, call, es, sw->sizes[s]);
        if (wrc < 0)
            return -1;
        if (wrc == 0)
            break;
    }
    return 0;
}

/* One row: size @p s of the sweep, timed, checked, counted and printed. @return 0 or -1 */
static int run_size(struct sweep *sw, struct perf_call *call, size_t es, size_t s)
{
    const struct perf_opts *o = sw->o;
    struct perf_result *r = &sw->rows[sw->nrows];
    call->bytes = sw->sizes[s];
    mscx_perf_counts(o->coll, call->bytes, es, sw->be->nranks, &call->send_count, &call->recv_count,
                     &r->count);
    r->bytes = r->count * es;
    r->type = call->type;
    r->op = (o->coll == PERF_ALLGATHER || o->coll == PERF_ALLTOALL) ? PERF_OP_COUNT : call->op;
    r->root = -1;
    if (run_one(o, sw->b, sw->be, call, (int)s, r))
        return -1;
    sw->nrows++;
    for (int k = 0; k < 2; k++) {
        if (r->na[k])
            continue;
        sw->wrong += r->wrong[k] > 0 ? r->wrong[k] : 0;
        sw->bw += r->busbw[k];
        sw->nbw++;
    }
    if (sw->out && sw->b->rank == 0) {
        if (sw->progress && sw->nsteps > 1)
            fprintf(stderr, "\r\033[K");
        mscx_perf_print_row(sw->out, r);
        fflush(sw->out);
        if (sw->progress && sw->nsteps > 1)
            mscx_perf_progress(stderr, sw->step, sw->nsteps, sw->sizes[s]);
    }
    return 0;
}

/* Every size of the sweep for type @p t and reduction @p op, after the warm-up. @return 0 or -1 */
static int run_combo(struct sweep *sw, int t, int op)
{
    struct perf_call call = {sw->o->coll, (enum perf_type)t, (enum perf_op)op, 0, 0, 0, 0};
    size_t es = mscx_perf_type_size((enum perf_type)t);
    if (warm_up_sweep(sw, &call, es))
        return -1;
    for (size_t s = 0; s < sw->nsizes; s++, sw->step++)
        if (run_size(sw, &call, es, s))
            return -1;
    return 0;
}

int mscx_perf_sweep_run(const struct perf_opts *o, struct perf_boot *b, const struct perf_backend *be,
                        FILE *out, struct perf_result **rows_p, size_t *nrows_p, int64_t *wrong_p,
                        double *avg_busbw_p)
{
    uint64_t *sizes = calloc(PERF_MAX_SIZES, sizeof(uint64_t));
    struct sweep sw = {.o = o, .b = b, .be = be, .out = out, .sizes = sizes};
    int rc = -1;

    sw.progress = o->progress || isatty(STDERR_FILENO);
    if (sizes == NULL)
        goto out;
    sw.nsizes = mscx_perf_sweep(o, sizes, PERF_MAX_SIZES);
    if (sw.nsizes > PERF_MAX_SIZES) {
        fprintf(stderr, "mscx-perf: the sweep has %zu sizes; at most %d\n", sw.nsizes, PERF_MAX_SIZES);
        goto out;
    }
    sw.rows = calloc(sw.nsizes * PERF_TYPE_COUNT * PERF_OP_COUNT, sizeof(*sw.rows));
    if (sw.rows == NULL)
        goto out;
    for (int t = 0; t < PERF_TYPE_COUNT; t++)
        for (int op = 0; op < PERF_OP_COUNT; op++)
            if (selected(o, t, op))
                sw.nsteps += sw.nsizes;
    if (out && b->rank == 0)
        mscx_perf_print_header(out);
    for (int t = 0; t < PERF_TYPE_COUNT; t++)
        for (int op = 0; op < PERF_OP_COUNT; op++)
            if (selected(o, t, op) && run_combo(&sw, t, op))
                goto out;
    *rows_p = sw.rows;
    sw.rows = NULL;
    *nrows_p = sw.nrows;
    *wrong_p = sw.wrong;
    *avg_busbw_p = sw.nbw ? sw.bw / (double)sw.nbw : 0.0;
    rc = 0;
out:
    free(sw.rows);
    free(sizes);
    return rc;
}
