/* SPDX-License-Identifier: MIT */
/*
 * mscx-info: print every MSCX_* variable with its default, current value and
 * help, and the real NCCL the shim would forward to; with --explain FILE,
 * say what ran and why from a routing summary.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "mscx/env.h"
#include "mscx/nccl_find.h"
#include "summary_explain.h"

struct nccl_pick {
    char path[4096];
    const char *how;
    int version;
    char why[4200];
};

/* Whether @p h is libmscx_nccl itself (which forwards, never serves). */
static int is_shim(void *gv)
{
    Dl_info info;
    if (!dladdr(gv, &info) || !info.dli_fname)
        return 0;
    const char *base = strrchr(info.dli_fname, '/');
    return strncmp(base ? base + 1 : info.dli_fname, "libmscx_nccl", 12) == 0;
}

static int pick(const char *path, const char *how, void *ctx)
{
    struct nccl_pick *p = ctx;
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(p->why, sizeof(p->why), "dlopen %s: %s", path, e ? e : "unknown error");
        return -1;
    }
    int (*gv)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
    if (!gv || is_shim((void *)gv)) {
        snprintf(p->why, sizeof(p->why), "%s: %s", path, gv ? "is libmscx_nccl itself" : "no ncclGetVersion");
        dlclose(h);
        return -1;
    }
    Dl_info info;
    int named = dladdr((void *)gv, &info) && info.dli_fname;
    snprintf(p->path, sizeof(p->path), "%s", named ? info.dli_fname : path);
    p->how = how;
    if (gv(&p->version) != 0)
        p->version = 0;
    return 0; /* kept loaded: the process ends soon */
}

/* The real NCCL as the shim finds it when no copy is loaded yet (shim/loader.c). */
static void print_nccl(FILE *out, const struct mscx_config *cfg)
{
    struct nccl_pick p = {.why = "no candidate"};
    int found = cfg && cfg->nccl_lib[0] ? pick(cfg->nccl_lib, "MSCX_NCCL_LIB", &p) == 0
                                        : mscx_nccl_find(pick, &p) == 0;
    if (found)
        fprintf(out, "real NCCL: %s (%s), version %d\n", p.path, p.how, p.version);
    else
        fprintf(out, "real NCCL: none found (%s)\n", p.why);
#ifdef MSCX_NCCL_H_VERSION
    fprintf(out, "shim built on: nccl.h %s\n", MSCX_NCCL_H_VERSION);
#endif
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mscx-info               every MSCX_* environment variable: default, current value,\n"
               "                                 help; then the real NCCL the shim would forward to\n"
               "       mscx-info --nccl          only that real NCCL: path, how it was found, version;\n"
               "                                 and the nccl.h version the shim was built on\n"
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
    const struct mscx_config *cfg;
    if (argc == 2 && !strcmp(argv[1], "--nccl")) {
        mscx_status_t st = mscx_config_get_lenient(&cfg);
        print_nccl(stdout, st == MSCX_OK || st == MSCX_ERR_INVALID_ARG ? cfg : NULL);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "mscx-info: unknown argument %s\n", argv[1]);
        usage(stderr);
        return 2;
    }
    mscx_status_t st = mscx_config_get(&cfg);
    mscx_config_dump(stdout);
    print_nccl(stdout, st == MSCX_OK ? cfg : NULL);
    return st == MSCX_OK ? 0 : 1;
}
