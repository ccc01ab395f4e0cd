/* SPDX-License-Identifier: MIT */
/*
 * MSCX_TRACE: each traced plan context has a ring of records per thread
 * block in device memory (MSCX_TRACE_CAP, the latest kept). At destroy the
 * rings are copied back and kept here, for every traced executor of the
 * process; the last one to go writes them all to one file (mscx_trace_save).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "mscx/env.h"
#include "mscx/log.h"
#include "runtime_int.h"

static struct {
    pthread_mutex_t lock;
    uint32_t live; /* executors created while tracing is on and not yet destroyed */
    uint32_t lowest_rank;
    struct mscx_trace_block *blocks;
    size_t nblocks, cap;
} g_trace = {PTHREAD_MUTEX_INITIALIZER, 0, UINT32_MAX, NULL, 0, 0};

static int trace_on(void)
{
    const struct mscx_config *cfg;
    return mscx_config_get(&cfg) == MSCX_OK && cfg->trace && cfg->trace[0];
}

/* MSCX_TRACE with %p replaced by the pid and %r by the lowest rank of the process. */
static void trace_path(const char *tmpl, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = tmpl; *p && o + 1 < len; p++) {
        if (p[0] == '%' && (p[1] == 'p' || p[1] == 'r')) {
            int k = snprintf(out + o, len - o, "%lu",
                             p[1] == 'p' ? (unsigned long)getpid() : (unsigned long)g_trace.lowest_rank);
            o += k > 0 ? (size_t)k : 0;
            if (o >= len)
                o = len - 1;
            p++;
            continue;
        }
        out[o++] = *p;
    }
    out[o] = '\0';
}

/* Called with g_trace.lock held: the last traced executor of the process is gone. */
static void trace_flush_locked(void)
{
    const struct mscx_config *cfg;
    char path[4096];
    size_t nev = 0;
    if (g_trace.nblocks && mscx_config_get(&cfg) == MSCX_OK) {
        trace_path(cfg->trace, path, sizeof(path));
        mscx_status_t st = mscx_trace_save(path, "mscx executor", g_trace.blocks, g_trace.nblocks, &nev);
        if (st == MSCX_OK)
            MSCX_INFO(MSCX_SUB_EXEC, "MSCX_TRACE: wrote %zu op records of %zu thread blocks to %s", nev,
                      g_trace.nblocks, path);
        else
            MSCX_WARN("MSCX_TRACE: cannot write %s: %s", path, mscx_status_str(st));
    }
    for (size_t i = 0; i < g_trace.nblocks; i++)
        free((void *)g_trace.blocks[i].recs);
    free(g_trace.blocks);
    g_trace.blocks = NULL;
    g_trace.nblocks = g_trace.cap = 0;
    g_trace.lowest_rank = UINT32_MAX;
}

int mscx_gpu_trace_attach(void)
{
    if (!trace_on())
        return 0;
    pthread_mutex_lock(&g_trace.lock);
    g_trace.live++;
    pthread_mutex_unlock(&g_trace.lock);
    return 1;
}

void mscx_gpu_trace_detach(void)
{
    pthread_mutex_lock(&g_trace.lock);
    if (--g_trace.live == 0)
        trace_flush_locked();
    pthread_mutex_unlock(&g_trace.lock);
}

/* Copy one plan's rings back (oldest record first) and keep them for the trace file. */
void mscx_gpu_trace_collect(uint32_t rank, uint32_t plan_id, const struct gpu_plan *gp)
{
    uint32_t *pos = calloc(gp->ntb ? gp->ntb : 1, sizeof(uint32_t));
    struct mscx_trace_rec *all = malloc((size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(*all));
    if (!pos || !all ||
        cudaMemcpy(pos, gp->d_trace_n, gp->ntb * sizeof(uint32_t), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(all, gp->d_trace, (size_t)gp->ntb * MSCX_TRACE_CAP * sizeof(*all),
                   cudaMemcpyDeviceToHost) != cudaSuccess) {
        MSCX_WARN("MSCX_TRACE: rank %u plan %u: cannot read the trace records back", rank, plan_id);
        free(pos);
        free(all);
        return;
    }
    pthread_mutex_lock(&g_trace.lock);
    for (uint32_t b = 0; b < gp->ntb; b++) {
        uint32_t n = pos[b] < MSCX_TRACE_CAP ? pos[b] : MSCX_TRACE_CAP;
        if (n == 0)
            continue;
        if (g_trace.nblocks == g_trace.cap) {
            size_t nc = g_trace.cap ? 2 * g_trace.cap : 64;
            struct mscx_trace_block *nb = realloc(g_trace.blocks, nc * sizeof(*nb));
            if (!nb)
                break;
            g_trace.blocks = nb;
            g_trace.cap = nc;
        }
        struct mscx_trace_rec *r = malloc(n * sizeof(*r));
        if (!r)
            break;
        uint32_t first = pos[b] - n; /* ring order: the oldest kept record first */
        for (uint32_t i = 0; i < n; i++)
            r[i] = all[(size_t)b * MSCX_TRACE_CAP + (first + i) % MSCX_TRACE_CAP];
        /* one track per (rank, block); a second plan of the same rank gets blocks from 1000 * plan_id */
        g_trace.blocks[g_trace.nblocks++] = (struct mscx_trace_block){rank, plan_id * 1000u + b, r, n};
    }
    if (rank < g_trace.lowest_rank)
        g_trace.lowest_rank = rank;
    pthread_mutex_unlock(&g_trace.lock);
    free(pos);
    free(all);
}
