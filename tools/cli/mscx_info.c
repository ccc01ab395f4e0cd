/* SPDX-License-Identifier: MIT */
/*
 * mscx-info: print every MSCX_* variable with its default, current value and
 * help; with --explain FILE, say what ran and why from a routing summary.
 */
#include <stdio.h>
#include <string.h>

#include "mscx/env.h"
#include "summary_explain.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: mscx-info               every MSCX_* environment variable: default, current value, help\n"
               "       mscx-info --explain FILE  per collective and size, what ran and why, from a routing\n"
               "                                 summary (MSCX_SUMMARY_FILE)\n");
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--explain")) {
        if (argc != 3) {
            usage(stderr);
            return 2;
        }
        return mscx_summary_explain(argv[2], stdout, stderr);
    }
    if (argc > 1) {
        fprintf(stderr, "mscx-info: unknown argument %s\n", argv[1]);
        usage(stderr);
        return 2;
    }
    const struct mscx_config *cfg;
    mscx_status_t st = mscx_config_get(&cfg);
    mscx_config_dump(stdout);
    return st == MSCX_OK ? 0 : 1;
}
