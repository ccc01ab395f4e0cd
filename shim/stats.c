/* SPDX-License-Identifier: MIT */
/*
 * The routing statistics of a communicator: a snapshot of its counters and
 * of the plans that ran its calls, and the summary line logged at its end
 * (the summary file is summary.c's). The counting itself is
 * shim_stats_add(), inline in the routing path.
 */
#include <stdio.h>
#include <string.h>

#include "comm_int.h"
#include "mscx/log.h"

/* One more entry of the summary's plans, or one more omitted once they are full. */
static void plan_use_add(struct shim_stats *s, struct shim_plan_use u)
{
    if (s->nplans == SHIM_NSTAT_PLANS)
        s->plans_omitted++;
    else
        s->plans[s->nplans++] = u;
}

/* The plans of @p c that ran calls, named as in the summary. */
static void plans_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    s->nplans = s->plans_omitted = 0;
    for (size_t i = 0; c->route_calls && i < c->nroute; i++) {
        uint64_t n = atomic_load_explicit(&c->route_calls[i], memory_order_relaxed);
        if (n == 0)
            continue;
        const char *path = c->route_name[i], *slash = strrchr(path, '/');
        const char *name = slash ? slash + 1 : path;
        size_t len = strlen(name);
        if (len > 5 && strcmp(name + len - 5, ".json") == 0)
            len -= 5;
        plan_use_add(s, (struct shim_plan_use){
                            .name = name,
                            .name_len = len,
                            .coll = c->route[i].coll,
                            .min_bytes = c->route[i].min_bytes,
                            .max_bytes = c->route[i].max_bytes,
                            .calls = n,
                        });
    }
}

/* The in-place calls at one rank, named "identity" in the summary's plans. */
static void identity_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    for (int k = 0; k < NSTAT_COLL; k++) {
        uint64_t n = atomic_load_explicit(&c->identity_calls[k], memory_order_relaxed);
        if (n > 0)
            plan_use_add(s, (struct shim_plan_use){.name = "identity",
                                                   .name_len = 8,
                                                   .coll = (enum mscx_coll)k,
                                                   .min_bytes = 1,
                                                   .max_bytes = UINT64_MAX,
                                                   .calls = n});
    }
}

void shim_stats_snapshot(const struct shim_comm *c, struct shim_stats *s)
{
    for (int k = 0; k < NSTAT_COLL; k++)
        for (int b = 0; b < SHIM_NBUCKETS; b++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                s->counts[k][b][w] = atomic_load_explicit(&c->counts[k][b][w], memory_order_relaxed);
    plans_snapshot(c, s);
    identity_snapshot(c, s);
}

void shim_stats_print(const struct shim_comm *c, const struct shim_stats *s, const char *how)
{
    char line[2048];
    size_t at = 0;
    uint64_t routed = 0, fallback = 0;

    uint64_t reasons[SHIM_WHY_COUNT] = {0};
    for (int k = 0; k < NSTAT_COLL; k++) {
        for (int b = 0; b < SHIM_NBUCKETS; b++) {
            uint64_t f = 0, r = s->counts[k][b][SHIM_WHY_ROUTED];
            for (int w = 1; w < SHIM_WHY_COUNT; w++) {
                f += s->counts[k][b][w];
                reasons[w] += s->counts[k][b][w];
            }
            routed += r;
            fallback += f;
            if ((f || r) && at < sizeof(line))
                at += (size_t)snprintf(line + at, sizeof(line) - at, " %s%s routed %llu fallback %llu;",
                                       mscx_coll_name((enum mscx_coll)k), shim_bucket_name(b),
                                       (unsigned long long)r, (unsigned long long)f);
        }
    }
    if (at < sizeof(line))
        at += (size_t)snprintf(line + at, sizeof(line) - at, " reasons:");
    for (int w = 1; w < SHIM_WHY_COUNT; w++)
        if (reasons[w] && at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s %llu",
                                   shim_reason_name((enum shim_reason)w), (unsigned long long)reasons[w]);
    if (s->nplans && at < sizeof(line))
        at += (size_t)snprintf(line + at, sizeof(line) - at, "; plans:");
    for (size_t i = 0; i < s->nplans && at < sizeof(line); i++)
        at += (size_t)snprintf(line + at, sizeof(line) - at, " %.*s %llu", (int)s->plans[i].name_len,
                               s->plans[i].name, (unsigned long long)s->plans[i].calls);
    /* calls sent to NCCL for their size, type or op are ordinary routing: one line, at INFO */
    MSCX_INFO(MSCX_SUB_SHIM, "summary at %s: comm %p rank %u/%u: routed %llu fallback %llu:%s", how,
              (void *)c->comm, c->rank, c->nranks, (unsigned long long)routed, (unsigned long long)fallback,
              line);
}
