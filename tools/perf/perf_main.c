/* SPDX-License-Identifier: MIT */
/* mscx-perf: nccl-tests compatible collective benchmark (NCCL API or the mscx executor). */
#include <stdlib.h>
#include <string.h>

#include "perf.h"

int main(int argc, char **argv)
{
    struct perf_opts o;
    struct perf_boot b;
    struct perf_backend be;
    struct perf_result *rows = NULL;
    size_t nrows = 0;
    int64_t wrong = 0;
    double bw = 0;
    char err[512];
    int rc = 1, opened;

    if (mscx_perf_args_parse(argc, argv, &o, err, sizeof(err))) {
        fprintf(stderr, "mscx-perf: %s (see --help)\n", err);
        return 2;
    }
    if (o.help) {
        mscx_perf_usage(stdout, argv[0]);
        return 0;
    }
    if (o.executor_nranks)
        memset(&b, 0, sizeof(b)), b.nranks = 1;
    else if ((o.nproc ? mscx_perf_boot_launch(&b, &o, err, sizeof(err))
                      : mscx_perf_boot_init(&b, &o, err, sizeof(err)))) {
        fprintf(stderr, "mscx-perf: %s\n", err);
        return 2;
    }
    FILE *out = b.rank == 0 ? stdout : NULL;
    if (out)
        mscx_perf_print_config(out, &o, o.executor_nranks ? o.executor_nranks : b.nranks);
    opened = o.executor_nranks ? mscx_perf_exec_open(&o, out, &be) : mscx_perf_nccl_open(&o, &b, out, &be);
    if (opened)
        goto out_boot;
    if (mscx_perf_sweep_run(&o, &b, &be, out, &rows, &nrows, &wrong, &bw))
        goto out_close;
    if (out) {
        mscx_perf_print_na(out, rows, nrows);
        mscx_perf_print_footer(out, wrong, bw);
        fflush(out);
        if (o.json_path &&
            mscx_perf_json_write(o.json_path, &o, be.name, be.nranks, rows, nrows, o.check ? wrong : 0, bw))
            goto out_close;
    }
    rc = wrong ? 1 : 0;
out_close:
    if (o.executor_nranks)
        mscx_perf_exec_close(&be);
    else
        mscx_perf_nccl_close(&be);
out_boot:
    mscx_perf_boot_fini(&b);
    free(rows);
    return rc;
}
