/* SPDX-License-Identifier: MIT */
/*
 * --json output, read by tools/ab/mscx-ab. Schema (version 1):
 * {"tool": "mscx-perf", "version": 1, "collective", "backend", "nranks",
 *  "config": {...}, "results": [{"size", "count", "type", "redop", "root",
 *  "out_of_place": {"time_us", "algbw", "busbw", "wrong"}, "in_place": {...}}],
 *  "wrong", "avg_busbw"}; "wrong" is null when results were not checked. A
 * call the backend cannot run (printed n/a) has "na": true and null
 * "time_us", "algbw", "busbw" and "wrong".
 */
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "perf.h"

static json_t *body(const struct perf_result *r, int k)
{
    if (r->na[k])
        return json_pack("{s:n, s:n, s:n, s:n, s:b}", "time_us", "algbw", "busbw", "wrong", "na", 1);
    return json_pack("{s:f, s:f, s:f, s:o}", "time_us", r->time_us[k], "algbw", r->algbw[k], "busbw",
                     r->busbw[k], "wrong", r->wrong[k] >= 0 ? json_integer(r->wrong[k]) : json_null());
}

int mscx_perf_json_write(const char *path, const struct perf_opts *o, const char *backend, int nranks,
                         const struct perf_result *rows, size_t nrows, int64_t wrong, double avg_busbw)
{
    int rc = -1;
    json_t *root, *results, *config;

    results = json_array();
    config = json_pack("{s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:i}", "min_bytes", (json_int_t)o->min_bytes,
                       "max_bytes", (json_int_t)o->max_bytes, "step_factor", (json_int_t)o->step_factor,
                       "step_bytes", (json_int_t)o->step_bytes, "iters", o->iters, "warmup_iters", o->warmup,
                       "check", o->check, "graph", o->graph_iters, "average", o->average);
    root = json_pack("{s:s, s:i, s:s, s:s, s:i, s:o, s:o, s:o, s:f}", "tool", "mscx-perf", "version", 1,
                     "collective", mscx_perf_coll_name(o->coll), "backend", backend, "nranks", nranks,
                     "config", config, "results", results, "wrong",
                     o->check ? json_integer(wrong) : json_null(), "avg_busbw", avg_busbw);
    if (root == NULL || results == NULL) {
        fprintf(stderr, "mscx-perf: out of memory building the JSON output\n");
        goto out;
    }
    for (size_t i = 0; i < nrows; i++) {
        const struct perf_result *r = &rows[i];
        json_t *row = json_pack("{s:I, s:I, s:s, s:s, s:i, s:o, s:o}", "size", (json_int_t)r->bytes, "count",
                                (json_int_t)r->count, "type", mscx_perf_type_name(r->type), "redop",
                                mscx_perf_op_name(r->op), "root", r->root, "out_of_place", body(r, 0),
                                "in_place", body(r, 1));
        if (row == NULL || json_array_append_new(results, row)) {
            fprintf(stderr, "mscx-perf: out of memory building the JSON output\n");
            goto out;
        }
    }
    if (json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) != 0) {
        fprintf(stderr, "mscx-perf: cannot write %s: %s\n", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}
