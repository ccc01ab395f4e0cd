/* SPDX-License-Identifier: MIT */
/*
 * The routing decision: a pure function of rank-uniform facts (collective,
 * rank count, ranks per node, message size, datatype, op, root, group state
 * and the forced-fallback list). Pointers, alignment and caches never enter.
 */
#include <string.h>

#include "shim_int.h"

static int coll_reduces(enum mscx_coll coll)
{
    return coll == MSCX_COLL_ALLREDUCE || coll == MSCX_COLL_REDUCESCATTER;
}

/* The checks that come before any plan: @return 0 with the mscx type and op, or -1 with the reason. */
SHIM_HOT static int pick_precheck(const struct shim_route_query *q, enum mscx_dtype *dt_p,
                                  enum mscx_redop *op_p, enum shim_reason *why_p)
{
    *op_p = MSCX_REDOP_SUM;
    if (q->forced_mask & (1u << q->coll)) {
        *why_p = SHIM_WHY_FORCED;
        return -1;
    }
    if (q->group_fallback) {
        *why_p = SHIM_WHY_GROUP;
        return -1;
    }
    if (shim_dtype_map(q->dtype, dt_p) != 0) {
        *why_p = SHIM_WHY_DTYPE;
        return -1;
    }
    struct mscx_scale scale; /* ncclAvg and PreMulSum run as sums: the plan must support the sum */
    if (coll_reduces(q->coll) && shim_redop_resolve(q->comm, q->nranks, q->op, q->dtype, op_p, &scale) != 0) {
        *why_p = SHIM_WHY_OP;
        return -1;
    }
    return 0;
}

/*
 * The first plan that takes the call, else the most specific reason among
 * the plans of its collective and layout (size, then root, then dtype or
 * op). A broadcast plan serves its own root only: "root" means that plans
 * of this layout take the size, none for the call's root.
 */
SHIM_HOT static int pick_plan(const struct shim_route_query *q, const struct shim_route_plan *plans,
                              size_t nplans, enum mscx_dtype dt, enum mscx_redop op, enum shim_reason *why_p)
{
    enum shim_reason best = SHIM_WHY_NO_PLAN;
    for (size_t i = 0; i < nplans; i++) {
        const struct shim_route_plan *p = &plans[i];
        if (p->coll != q->coll || p->nranks != q->nranks || p->ranks_per_node != q->ranks_per_node)
            continue;
        if (q->msg_bytes == 0 || q->msg_bytes < p->min_bytes || q->msg_bytes > p->max_bytes ||
            (p->elem_multiple > 1 && (q->msg_bytes / mscx_dtype_size(dt)) % p->elem_multiple)) {
            if (best == SHIM_WHY_NO_PLAN)
                best = SHIM_WHY_SIZE;
            continue;
        }
        if (q->coll == MSCX_COLL_BROADCAST && (q->root < 0 || (uint32_t)q->root != p->root)) {
            if (best == SHIM_WHY_NO_PLAN || best == SHIM_WHY_SIZE)
                best = SHIM_WHY_ROOT;
            continue;
        }
        if (!p->supports[dt][op]) {
            if (best == SHIM_WHY_NO_PLAN || best == SHIM_WHY_ROOT || best == SHIM_WHY_SIZE)
                best = coll_reduces(q->coll) ? SHIM_WHY_OP : SHIM_WHY_DTYPE;
            continue;
        }
        *why_p = SHIM_WHY_ROUTED;
        return (int)i;
    }
    *why_p = best;
    return -1;
}

int shim_route_pick(const struct shim_route_query *q, const struct shim_route_plan *plans, size_t nplans,
                    enum shim_reason *why_p)
{
    enum mscx_dtype dt;
    enum mscx_redop op;
    if (pick_precheck(q, &dt, &op, why_p) != 0)
        return -1;
    return pick_plan(q, plans, nplans, dt, op, why_p);
}

SHIM_HOT static int bin_of(uint64_t bytes)
{
    return 63 - __builtin_clzll(bytes);
}

void shim_route_window_init(struct shim_route_window *w, const struct shim_route_plan *plans, size_t nplans,
                            enum mscx_coll coll, uint32_t nranks, uint32_t ranks_per_node)
{
    w->bins = 0;
    w->nplans = 0;
    for (size_t i = 0; i < nplans; i++) {
        const struct shim_route_plan *p = &plans[i];
        if (p->coll != coll || p->nranks != nranks || p->ranks_per_node != ranks_per_node)
            continue;
        w->nplans++;
        uint64_t lo = p->min_bytes ? p->min_bytes : 1;
        if (p->max_bytes < lo)
            continue; /* an empty range: a plan, but no size */
        int a = bin_of(lo), b = bin_of(p->max_bytes);
        w->bins |= (b == 63 ? ~0ull : (2ull << b) - 1) & ~((1ull << a) - 1);
    }
}

/*
 * A size of 0 or in a bin no plan reaches fails the size test of every plan
 * of the window's collective and layout, so the plan loop would end with
 * SIZE when there is such a plan and NO_PLAN when there is none: that is
 * decided here.
 */
SHIM_HOT int shim_route_pick_windowed(const struct shim_route_query *q, const struct shim_route_plan *plans,
                                      size_t nplans, const struct shim_route_window *w,
                                      enum shim_reason *why_p)
{
    enum mscx_dtype dt;
    enum mscx_redop op;
    if (pick_precheck(q, &dt, &op, why_p) != 0)
        return -1;
    if (q->msg_bytes == 0 || !(w->bins >> bin_of(q->msg_bytes) & 1)) {
        *why_p = w->nplans ? SHIM_WHY_SIZE : SHIM_WHY_NO_PLAN;
        return -1;
    }
    return pick_plan(q, plans, nplans, dt, op, why_p);
}

int shim_parse_forced(const char *list, unsigned *mask_p)
{
    unsigned mask = 0;
    const char *s = list ? list : "";
    while (*s) {
        size_t n = strcspn(s, ",");
        char name[32];
        if (n > 0) {
            if (n >= sizeof(name))
                return -1;
            memcpy(name, s, n);
            name[n] = '\0';
            if (!strcmp(name, "all"))
                mask = ~0u;
            else if (!strcmp(name, "allreduce"))
                mask |= 1u << MSCX_COLL_ALLREDUCE;
            else if (!strcmp(name, "allgather"))
                mask |= 1u << MSCX_COLL_ALLGATHER;
            else if (!strcmp(name, "reducescatter"))
                mask |= 1u << MSCX_COLL_REDUCESCATTER;
            else if (!strcmp(name, "broadcast"))
                mask |= 1u << MSCX_COLL_BROADCAST;
            else if (!strcmp(name, "alltoall"))
                mask |= 1u << MSCX_COLL_ALLTOALL;
            else
                return -1;
        }
        s += n;
        if (*s == ',')
            s++;
    }
    *mask_p = mask;
    return 0;
}

const char *shim_reason_name(enum shim_reason why)
{
    static const char *const names[SHIM_WHY_COUNT] = {
        "routed", "no-state", "forced", "group",  "dtype",    "op",     "size",
        "root",   "no-plan",  "launch", "window", "sendrecv", "config",
    };
    return (unsigned)why < SHIM_WHY_COUNT ? names[why] : "unknown";
}

/* Bucket b > 0 holds (1K << 3(b-1), 1K << 3b]: one more than (log2(bytes - 1) - 10) / 3. */
SHIM_HOT int shim_size_bucket(uint64_t bytes)
{
    if (bytes <= 1024)
        return 0;
    int b = (63 - __builtin_clzll(bytes - 1) - 10) / 3 + 1;
    return b < SHIM_NBUCKETS - 1 ? b : SHIM_NBUCKETS - 1;
}

uint64_t shim_bucket_limit(int bucket)
{
    if (bucket < 0 || bucket >= SHIM_NBUCKETS - 1)
        return UINT64_MAX;
    return 1024ull << (3 * bucket);
}

const char *shim_bucket_name(int bucket)
{
    static const char *const names[SHIM_NBUCKETS] = {"<=1K", "<=8K",  "<=64K",  "<=512K",
                                                     "<=4M", "<=32M", "<=256M", ">256M"};
    return bucket >= 0 && bucket < SHIM_NBUCKETS ? names[bucket] : "?";
}
