/* SPDX-License-Identifier: MIT */
/* The text output, column for column as nccl-tests (2.13 and later) prints it. */
#include <inttypes.h>

#include "perf.h"

void mscx_perf_print_config(FILE *out, const struct perf_opts *o, int nranks)
{
    fprintf(out, "# mscx-perf %s, %d rank%s\n", mscx_perf_coll_name(o->coll), nranks, nranks == 1 ? "" : "s");
    fprintf(out,
            "# nThread 1 nGpus %d minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64
            "(%s) warmup iters: %d iters: %d agg iters: 1 validation: %d graph: %d\n",
            o->ngpus, o->min_bytes, o->max_bytes, o->step_factor > 1 ? o->step_factor : o->step_bytes,
            o->step_factor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->check, o->graph_iters);
    fprintf(out, "#\n");
}

void mscx_perf_print_header(FILE *out)
{
    fprintf(out, "#\n");
    fprintf(out,
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
            "", "", "", "", "");
    fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
            "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)",
            "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/* nccl-tests keeps the time column 7 wide by dropping decimals as it grows. */
static void put_body(FILE *out, double us, double algbw, double busbw, int64_t wrong, int na)
{
    char t[32];
    if (na) {
        fprintf(out, "  %7s  %6s  %6s  %5s", "n/a", "n/a", "n/a", "n/a");
        return;
    }
    if (us >= 10000.0)
        snprintf(t, sizeof(t), "%7.0f", us);
    else if (us >= 100.0)
        snprintf(t, sizeof(t), "%7.1f", us);
    else
        snprintf(t, sizeof(t), "%7.2f", us);
    if (wrong >= 0)
        fprintf(out, "  %7s  %6.2f  %6.2f  %5g", t, algbw, busbw, (double)wrong);
    else
        fprintf(out, "  %7s  %6.2f  %6.2f  %5s", t, algbw, busbw, "N/A");
}

void mscx_perf_print_row(FILE *out, const struct perf_result *r)
{
    fprintf(out, "%12" PRIu64 "  %12" PRIu64 "  %8s  %6s  %6d", r->bytes, r->count,
            mscx_perf_type_name(r->type), mscx_perf_op_name(r->op), r->root);
    for (int k = 0; k < 2; k++)
        put_body(out, r->time_us[k], r->algbw[k], r->busbw[k], r->wrong[k], r->na[k]);
    fprintf(out, "\n");
}

void mscx_perf_print_footer(FILE *out, int64_t wrong, double avg_busbw)
{
    fprintf(out, "# %-20s : %" PRId64 " %s\n", "Out of bounds values", wrong, wrong ? "FAILED" : "OK");
    fprintf(out, "# %-20s : %g \n", "Avg bus bandwidth", avg_busbw);
    fprintf(out, "#\n");
}

void mscx_perf_print_na(FILE *out, const struct perf_result *rows, size_t nrows)
{
    size_t n = 0;
    for (size_t i = 0; i < nrows; i++)
        n += (rows[i].na[0] || rows[i].na[1]) ? 1 : 0;
    if (n)
        fprintf(out, "# %-20s : %zu of %zu (the backend cannot run them; why is on stderr)\n", "Rows n/a", n,
                nrows);
}

void mscx_perf_progress(FILE *out, size_t k, size_t n, uint64_t bytes)
{
    fprintf(out, "\r# mscx-perf: size %zu/%zu (%" PRIu64 " B) %3d%%", k + 1, n, bytes,
            n ? (int)((100 * (k + 1)) / n) : 100);
    if (k + 1 == n)
        fprintf(out, "\n");
    fflush(out);
}
