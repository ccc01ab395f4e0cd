/* SPDX-License-Identifier: MIT */
/*
 * The process-wide plan set: every *.json of MSCX_PLAN_DIR (or of the
 * installed plan directory), in sorted name order, loaded once. The order is
 * the routing priority: the first matching plan wins.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/fork.h"
#include "mscx/log.h"
#include "shim_int.h"

#ifndef MSCX_PLAN_INSTALL_DIR
#define MSCX_PLAN_INSTALL_DIR "/usr/local/share/mscx/plans"
#endif

#define SHIM_MAX_PLANS 256

static pthread_once_t plans_once = PTHREAD_ONCE_INIT;
static struct shim_plan_entry *plans;
static size_t nplans, nfailed;
static uint64_t plans_hash;
static char plans_dir[512];

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void warn_fork_init(void)
{
    mscx_fork_protect(&warn_lock, MSCX_FORK_SHIM_WARN);
}
static char *warned[512];
static size_t nwarned;

int shim_warn_once(const char *key, const char *fmt, ...)
{
    pthread_mutex_lock(&warn_lock);
    for (size_t i = 0; i < nwarned; i++) {
        if (!strcmp(warned[i], key)) {
            pthread_mutex_unlock(&warn_lock);
            return 0;
        }
    }
    if (nwarned < sizeof(warned) / sizeof(warned[0]))
        warned[nwarned++] = strdup(key);
    pthread_mutex_unlock(&warn_lock);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    MSCX_WARN("%s", msg);
    return 1;
}

static uint64_t hash_file(uint64_t h, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return h;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        h = shim_fnv1a(h, buf, n);
    fclose(f);
    return h;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void fill_route(struct shim_plan_entry *e)
{
    struct shim_route_plan *r = &e->route;
    r->coll = mscx_plan_collective(e->plan);
    r->nranks = mscx_plan_nranks(e->plan);
    r->ranks_per_node = mscx_plan_ranks_per_node(e->plan);
    mscx_plan_size_range(e->plan, &r->min_bytes, &r->max_bytes);
    r->elem_multiple = mscx_plan_elem_multiple(e->plan);
    r->root = mscx_plan_root(e->plan);
    r->beats_nccl_window = mscx_plan_beats_nccl_window(e->plan) != 0;
    for (int d = 0; d < MSCX_DT_COUNT; d++)
        for (int o = 0; o < MSCX_REDOP_COUNT; o++)
            r->supports[d][o] = mscx_plan_supports(e->plan, (enum mscx_dtype)d, (enum mscx_redop)o) != 0;
}

static void plans_load(void)
{
    const struct mscx_config *cfg = shim_config();
    char *names[SHIM_MAX_PLANS];
    size_t nnames = 0;

    plans_hash = SHIM_FNV_BASIS;
    if (!cfg)
        return;
    snprintf(plans_dir, sizeof(plans_dir), "%s", cfg->plan_dir[0] ? cfg->plan_dir : MSCX_PLAN_INSTALL_DIR);
    DIR *d = opendir(plans_dir);
    if (!d) {
        if (cfg->plan_dir[0])
            shim_warn_once(plans_dir, "mscx: cannot open MSCX_PLAN_DIR %s; every call goes to NCCL",
                           plans_dir);
        else
            MSCX_INFO(MSCX_SUB_SHIM, "no installed plan directory %s", plans_dir);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL && nnames < SHIM_MAX_PLANS) {
        size_t len = strlen(de->d_name);
        if (len > 5 && !strcmp(de->d_name + len - 5, ".json") && de->d_name[0] != '.')
            names[nnames++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, nnames, sizeof(names[0]), cmp_names);
    plans = calloc(nnames ? nnames : 1, sizeof(*plans));
    for (size_t i = 0; i < nnames; i++) {
        if (!plans || !names[i])
            break;
        struct shim_plan_entry *e = &plans[nplans];
        char err[MSCX_PLAN_ERR_LEN] = "";
        snprintf(e->path, sizeof(e->path), "%s/%s", plans_dir, names[i]);
        mscx_status_t st = mscx_plan_load(e->path, &e->plan, err, sizeof(err));
        if (st != MSCX_OK) {
            shim_warn_once(e->path, "mscx: plan %s not used: %s", e->path,
                           err[0] ? err : mscx_status_str(st));
            nfailed++;
            continue;
        }
        plans_hash = shim_fnv1a(plans_hash, names[i], strlen(names[i]) + 1);
        plans_hash = hash_file(plans_hash, e->path);
        if (mscx_plan_reaches_peer_user(e->plan)) {
            /* NCCL's enqueue never waits for peers; such a launch would: the same on every rank */
            MSCX_INFO(MSCX_SUB_SHIM,
                      "plan %s not used: it reaches other ranks' input or output buffers, which would make "
                      "each launch wait on the host for its peers; its calls go to NCCL",
                      e->path);
            mscx_plan_destroy(e->plan);
            e->plan = NULL;
            continue;
        }
        fill_route(e);
        nplans++;
    }
    for (size_t i = 0; i < nnames; i++)
        free(names[i]);
    MSCX_INFO(MSCX_SUB_SHIM, "%zu plans loaded from %s (%zu failed), set hash %016llx", nplans, plans_dir,
              nfailed, (unsigned long long)plans_hash);
}

void shim_plans_get(const struct shim_plan_entry **plans_p, size_t *n_p, size_t *nfailed_p, uint64_t *hash_p)
{
    pthread_once(&plans_once, plans_load);
    *plans_p = plans;
    *n_p = nplans;
    if (nfailed_p)
        *nfailed_p = nfailed;
    if (hash_p)
        *hash_p = plans_hash;
}

const char *shim_plans_dir(void)
{
    return plans_dir;
}
