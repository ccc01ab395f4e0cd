/* SPDX-License-Identifier: MIT */
/*
 * The plan loader: MSCCL++ JSON (jansson) -> struct mscx_plan, with the
 * thread-block tables resolved into the ops. Structural errors (types,
 * missing fields, unknown names, local table indices) are found here; the
 * semantic checks are in plan_validate.c. The reading helpers (paths,
 * errors, typed getters, names) are in plan_json_read.c, thread blocks and
 * ops in plan_json_ops.c.
 *
 * jansson keeps no per-node positions, so the loader keeps the JSON path of
 * the node it is looking at (a small component stack, rendered only on
 * error) and, on error, finds the line and column of that path with a light
 * tokenizer pass over the text (plan_pos.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "plan_model.h"
#include "json_arena.h"
#include "plan_json_int.h"

#define push_key mscx_pj_push_key
#define push_idx mscx_pj_push_idx
#define pop mscx_pj_pop
#define fail mscx_pj_failf

/*
 * jansson refuses integers above INT64_MAX, and the MSCCL++ DSL writes an
 * unbounded max_message_size as 2^64-1. Rather than parse the whole plan a
 * second time with every integer as a double, rewrite such a size literal to
 * INT64_MAX, padded with spaces so that every line:column stays right; the
 * getter of max_message_size reads INT64_MAX there as unbounded.
 * @return a malloc'd copy when something was rewritten, else NULL
 */
static char *rewrite_huge_sizes(const char *json, size_t len)
{
    static const char *const keys[] = {"\"max_message_size\"", "\"min_message_size\""};
    char *copy = NULL;
    for (size_t i = 0; i < len; i++) {
        if (json[i] < '0' || json[i] > '9' || (i > 0 && json[i - 1] >= '0' && json[i - 1] <= '9'))
            continue;
        size_t e = i;
        while (e < len && json[e] >= '0' && json[e] <= '9')
            e++;
        if (e - i < 19 || e - i > 20 || (e < len && (json[e] == '.' || json[e] == 'e' || json[e] == 'E'))) {
            i = e;
            continue;
        }
        char num[24];
        memcpy(num, json + i, e - i);
        num[e - i] = '\0';
        errno = 0;
        unsigned long long v = strtoull(num, NULL, 10);
        size_t k = i;
        while (k > 0 &&
               (json[k - 1] == ' ' || json[k - 1] == '\t' || json[k - 1] == '\n' || json[k - 1] == '\r'))
            k--;
        bool size_key = false;
        if (k > 0 && json[k - 1] == ':') {
            k--;
            while (k > 0 &&
                   (json[k - 1] == ' ' || json[k - 1] == '\t' || json[k - 1] == '\n' || json[k - 1] == '\r'))
                k--;
            for (int q = 0; q < 2; q++) {
                size_t kl = strlen(keys[q]);
                size_key |= k >= kl && memcmp(json + k - kl, keys[q], kl) == 0;
            }
        }
        if (errno == 0 && v > (unsigned long long)INT64_MAX && size_key) {
            if (copy == NULL) {
                copy = malloc(len + 1);
                if (copy == NULL)
                    return NULL;
                memcpy(copy, json, len);
                copy[len] = '\0';
            }
            memcpy(copy + i, "9223372036854775807", 19);
            if (e - i == 20)
                copy[i + 19] = ' ';
        }
        i = e;
    }
    return copy;
}

/* ---- gpu-level declarations ---- */

struct chan_acc { /* growing per-type channel lists while reading "channels" */
    uint32_t n, cap;
    struct mscx_chan *v;
};

static int parse_switch_chan(struct pctx *c, struct mscx_gpu *g, const json_t *ch, size_t *cap_p)
{
    bool aerr;
    struct mscx_switch_chan *sc;
    if (g->nswitch == *cap_p) {
        size_t ncap = *cap_p ? *cap_p * 2 : 2;
        struct mscx_switch_chan *nv = realloc(g->switch_chan, ncap * sizeof(*nv));
        if (nv == NULL)
            return mscx_pj_nomem(c);
        memset(nv + *cap_p, 0, (ncap - *cap_p) * sizeof(*nv));
        g->switch_chan = nv;
        *cap_p = ncap;
    }
    sc = &g->switch_chan[g->nswitch++];
    if (mscx_pj_buf_type(c, ch, "buffer_type", &sc->buf_type))
        return -1;
    const json_t *groups = mscx_pj_array(c, ch, "rank_groups", false, &aerr);
    if (aerr)
        return -1;
    size_t ng = groups ? json_array_size(groups) : 0;
    if (ng == 0)
        return 0;
    sc->group_size = calloc(ng, sizeof(uint32_t));
    sc->group_ranks = calloc(ng, sizeof(uint32_t *));
    if (sc->group_size == NULL || sc->group_ranks == NULL)
        return mscx_pj_nomem(c);
    sc->ngroups = (uint32_t)ng;
    push_key(c, "rank_groups");
    for (size_t k = 0; k < ng; k++) {
        const json_t *grp = json_array_get(groups, k);
        push_idx(c, k);
        if (mscx_pj_object(c, grp))
            return -1;
        const json_t *ranks = mscx_pj_array(c, grp, "ranks", true, &aerr);
        if (aerr)
            return -1;
        size_t nr = json_array_size(ranks);
        sc->group_size[k] = (uint32_t)nr;
        sc->group_ranks[k] = calloc(nr ? nr : 1, sizeof(uint32_t));
        if (sc->group_ranks[k] == NULL)
            return mscx_pj_nomem(c);
        push_key(c, "ranks");
        for (size_t j = 0; j < nr; j++) {
            uint64_t r;
            push_idx(c, j);
            if (mscx_pj_u64_v(c, json_array_get(ranks, j), MSCX_MAX_RANKS - 1, &r))
                return -1;
            sc->group_ranks[k][j] = (uint32_t)r;
            pop(c);
        }
        pop(c);
        pop(c);
    }
    pop(c);
    return 0;
}

static int parse_gpu_channels(struct pctx *c, struct mscx_gpu *g, const json_t *gj)
{
    bool aerr;
    struct chan_acc acc[MSCX_CHAN_COUNT];
    size_t sw_cap = 0;
    int rc = -1;
    memset(acc, 0, sizeof(acc));
    const json_t *chans = mscx_pj_array(c, gj, "channels", false, &aerr);
    if (aerr)
        return -1;
    push_key(c, "channels");
    for (size_t i = 0; chans && i < json_array_size(chans); i++) {
        const json_t *ch = json_array_get(chans, i);
        uint8_t type;
        push_idx(c, i);
        if (mscx_pj_object(c, ch) ||
            mscx_pj_chan_type(c, json_object_get(ch, "channel_type"), "channel_type", false, &type))
            goto out;
        if (type == MSCX_CHAN_SWITCH) {
            if (parse_switch_chan(c, g, ch, &sw_cap))
                goto out;
        } else {
            const json_t *to = mscx_pj_array(c, ch, "connected_to", true, &aerr);
            if (aerr)
                goto out;
            push_key(c, "connected_to");
            for (size_t k = 0; k < json_array_size(to); k++) {
                uint64_t peer;
                struct chan_acc *a = &acc[type];
                push_idx(c, k);
                if (mscx_pj_u64_v(c, json_array_get(to, k), UINT32_MAX, &peer))
                    goto out;
                if (peer >= c->nranks || peer == c->rank) {
                    fail(c, NULL, json_array_get(to, k), "a peer rank below %u other than this rank (%u)",
                         c->nranks, c->rank);
                    goto out;
                }
                if (a->n >= UINT16_MAX) {
                    fail(c, NULL, json_array_get(to, k), "at most %u %s channels per rank", UINT16_MAX - 1,
                         type == MSCX_CHAN_MEMORY ? "memory" : "port");
                    goto out;
                }
                if (a->n == a->cap) {
                    uint32_t ncap = a->cap ? a->cap * 2 : 8;
                    struct mscx_chan *nv = realloc(a->v, ncap * sizeof(*nv));
                    if (nv == NULL) {
                        mscx_pj_nomem(c);
                        goto out;
                    }
                    a->v = nv;
                    a->cap = ncap;
                }
                memset(&a->v[a->n], 0, sizeof(a->v[0]));
                a->v[a->n++].peer = (uint32_t)peer;
                pop(c);
            }
            pop(c);
        }
        pop(c);
    }
    pop(c);
    rc = 0;
out:
    for (int t = 0; t < MSCX_CHAN_COUNT; t++) {
        g->chan[t] = acc[t].v;
        g->nchan[t] = acc[t].n;
    }
    return rc;
}

static int parse_access_types(struct pctx *c, const json_t *obj, uint8_t *mask_p)
{
    bool aerr;
    const json_t *a = mscx_pj_array(c, obj, "access_channel_types", true, &aerr);
    if (aerr)
        return -1;
    *mask_p = 0;
    push_key(c, "access_channel_types");
    for (size_t k = 0; k < json_array_size(a); k++) {
        uint8_t t;
        push_idx(c, k);
        if (mscx_pj_chan_type(c, json_array_get(a, k), NULL, false, &t))
            return -1;
        *mask_p |= (uint8_t)(1u << t);
        pop(c);
    }
    pop(c);
    return 0;
}

static int parse_gpu_decls(struct pctx *c, struct mscx_gpu *g, const json_t *gj)
{
    bool aerr;
    const json_t *rb = mscx_pj_array(c, gj, "remote_buffers", false, &aerr);
    if (aerr)
        return -1;
    size_t n = rb ? json_array_size(rb) : 0;
    if (n > UINT16_MAX)
        return fail(c, "remote_buffers", rb, "at most %u remote buffers", UINT16_MAX);
    if (n) {
        g->rbuf = calloc(n, sizeof(*g->rbuf));
        if (g->rbuf == NULL)
            return mscx_pj_nomem(c);
        g->nrbuf = (uint32_t)n;
    }
    push_key(c, "remote_buffers");
    for (size_t i = 0; i < n; i++) {
        const json_t *b = json_array_get(rb, i);
        push_idx(c, i);
        if (mscx_pj_object(c, b) || mscx_pj_u32(c, b, "rank", false, 0, UINT32_MAX, &g->rbuf[i].rank) ||
            mscx_pj_buf_type(c, b, "type", &g->rbuf[i].type) ||
            parse_access_types(c, b, &g->rbuf[i].access_mask))
            return -1;
        pop(c);
    }
    pop(c);

    const json_t *sems = mscx_pj_array(c, gj, "semaphores", false, &aerr);
    if (aerr)
        return -1;
    n = sems ? json_array_size(sems) : 0;
    if (n > UINT16_MAX)
        return fail(c, "semaphores", sems, "at most %u semaphores", UINT16_MAX);
    if (n) {
        g->sem_init = calloc(n, sizeof(int32_t));
        if (g->sem_init == NULL)
            return mscx_pj_nomem(c);
        g->nsem = (uint32_t)n;
    }
    push_key(c, "semaphores");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(sems, i);
        const json_t *iv;
        push_idx(c, i);
        if (mscx_pj_object(c, s))
            return -1;
        iv = json_object_get(s, "init_value");
        if (iv != NULL) {
            if (!json_is_integer(iv) || json_integer_value(iv) < INT32_MIN ||
                json_integer_value(iv) > INT32_MAX)
                return fail(c, "init_value", iv, "a 32-bit integer");
            g->sem_init[i] = (int32_t)json_integer_value(iv);
        }
        pop(c);
    }
    pop(c);
    return 0;
}

/* ---- thread blocks and ops (plan_json_ops.c) ---- */

static int parse_gpu(struct pctx *c, struct mscx_gpu *g, const json_t *gj, uint32_t rank)
{
    if (mscx_pj_object(c, gj))
        return -1;
    if (mscx_pj_u32(c, gj, "id", false, 0, UINT32_MAX, &g->id))
        return -1;
    if (g->id != rank)
        return fail(c, "id", json_object_get(gj, "id"), "the rank's position in gpus, %u", rank);
    if (mscx_pj_u32(c, gj, "input_chunks", false, 0, UINT32_MAX, &g->input_chunks) ||
        mscx_pj_u32(c, gj, "output_chunks", false, 0, UINT32_MAX, &g->output_chunks) ||
        mscx_pj_u32(c, gj, "scratch_chunks", false, 0, UINT32_MAX, &g->scratch_chunks))
        return -1;
    if (parse_gpu_channels(c, g, gj) || parse_gpu_decls(c, g, gj))
        return -1;
    return mscx_plan_json_tbs(c, g, gj);
}

/* ---- top level ---- */

static int parse_version(struct pctx *c, const json_t *root, struct mscx_plan *p)
{
    const json_t *v = json_object_get(root, "version");
    if (v == NULL)
        return 0;
    if (json_is_integer(v) && json_integer_value(v) == 1) {
        p->version = 1;
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (s[0] == '1' && (s[1] == '\0' || s[1] == '.')) {
            p->version = 1;
            return 0;
        }
    }
    return fail(c, "version", v, "plan format version 1");
}

static int parse_name_list(struct pctx *c, const json_t *ext, const char *key, bool dtypes, uint32_t *mask_p)
{
    bool aerr;
    const json_t *a = mscx_pj_array(c, ext, key, false, &aerr);
    if (aerr)
        return -1;
    if (a == NULL)
        return 1;
    *mask_p = 0;
    push_key(c, key);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        push_idx(c, i);
        if (dtypes) {
            enum mscx_dtype dt;
            if (s == NULL || mscx_dtype_parse(s, &dt))
                return fail(c, NULL, v, "a datatype name (fp32, fp16, bf16, int32, ...)");
            *mask_p |= 1u << dt;
        } else {
            enum mscx_redop op;
            if (s == NULL || mscx_redop_parse(s, &op))
                return fail(c, NULL, v, "a reduction name (sum, prod, min, max)");
            *mask_p |= 1u << op;
        }
        pop(c);
    }
    pop(c);
    return 0;
}

static int parse_extension(struct pctx *c, const json_t *root, struct mscx_plan *p)
{
    const json_t *ext = json_object_get(root, "mscx");
    uint32_t v = 1;
    int rc;
    if (ext == NULL)
        return 0;
    push_key(c, "mscx");
    if (mscx_pj_object(c, ext) || mscx_pj_u32(c, ext, "version", true, 1, UINT32_MAX, &v))
        return -1;
    if (v != 1)
        return fail(c, "version", json_object_get(ext, "version"), "mscx extension version 1");
    if (json_object_get(ext, "ranks_per_node")) {
        if (mscx_pj_u32(c, ext, "ranks_per_node", false, 0, MSCX_MAX_RANKS, &p->ranks_per_node))
            return -1;
        p->ranks_per_node_given = true;
    }
    if (json_object_get(ext, "root")) {
        if (mscx_pj_u32(c, ext, "root", false, 0, MSCX_MAX_RANKS - 1, &p->root))
            return -1;
        p->root_given = true;
    }
    if (mscx_pj_bool(c, ext, "beats_nccl_window", false, &p->beats_nccl_window))
        return -1;
    p->dtype_mask = (1u << MSCX_DT_COUNT) - 1;
    p->redop_mask = (1u << MSCX_REDOP_COUNT) - 1;
    rc = parse_name_list(c, ext, "dtypes", true, &p->dtype_mask);
    if (rc < 0)
        return -1;
    p->masks_given = rc == 0;
    rc = parse_name_list(c, ext, "reduce_ops", false, &p->redop_mask);
    if (rc < 0)
        return -1;
    p->masks_given = p->masks_given || rc == 0;
    const json_t *fu = json_object_get(ext, "fusion");
    if (fu) {
        bool aerr;
        push_key(c, "fusion");
        if (mscx_pj_object(c, fu) ||
            mscx_pj_u32(c, fu, "ops_before", false, 0, UINT32_MAX, &p->fuse.ops_before) ||
            mscx_pj_u32(c, fu, "ops_after", false, 0, UINT32_MAX, &p->fuse.ops_after))
            return -1;
        const json_t *hits = mscx_pj_array(c, fu, "rule_hits", false, &aerr);
        if (aerr)
            return -1;
        push_key(c, "rule_hits");
        for (size_t i = 0; hits && i < json_array_size(hits) && i < 8; i++) {
            uint64_t h;
            push_idx(c, i);
            if (mscx_pj_u64_v(c, json_array_get(hits, i), UINT32_MAX, &h))
                return -1;
            p->fuse.rule_hits[i] = (uint32_t)h;
            pop(c);
        }
        pop(c);
        p->fused = true;
        pop(c);
    }
    pop(c);
    return 0;
}

static const char *const known_top[] = {
    "name",
    "collective",
    "protocol",
    "inplace",
    "reuse_resources",
    "num_threads_per_block",
    "use_double_scratch_buffer",
    "buffer_alignment",
    "min_message_size",
    "max_message_size",
    "gpus",
    "version",
    "mscx",
    "ranks_may_differ",
};

static int parse_top(struct pctx *c, const json_t *root, struct mscx_plan *p)
{
    const char *s, *key;
    const json_t *val;
    bool aerr;

    if (!json_is_object(root))
        return fail(c, NULL, root, "a plan object");
    json_object_foreach((json_t *)root, key, val)
    {
        size_t k;
        for (k = 0; k < sizeof(known_top) / sizeof(known_top[0]); k++)
            if (strcmp(known_top[k], key) == 0)
                break;
        if (k == sizeof(known_top) / sizeof(known_top[0]))
            MSCX_INFO(MSCX_SUB_PLAN, "plan: ignoring unknown top-level field \"%s\"", key);
    }
    if (parse_version(c, root, p))
        return -1;
    if ((s = mscx_pj_str(c, root, "name", true)) == NULL)
        return -1;
    if ((p->name = strdup(s)) == NULL)
        return mscx_pj_nomem(c);
    if ((s = mscx_pj_str(c, root, "collective", true)) == NULL)
        return -1;
    if ((p->collective_name = strdup(s)) == NULL)
        return mscx_pj_nomem(c);
    if (mscx_coll_parse(s, &p->coll))
        return fail(
            c, "collective", json_object_get(root, "collective"),
            "a collective (allreduce, allgather, reducescatter, alltoall, broadcast, sendrecv or test)");
    s = mscx_pj_str(c, root, "protocol", false);
    if (c->failed)
        return -1;
    if (s == NULL || strcasecmp(s, "Simple") == 0)
        p->protocol = MSCX_PROTO_SIMPLE;
    else if (strcasecmp(s, "LL") == 0)
        p->protocol = MSCX_PROTO_LL;
    else
        return fail(c, "protocol", json_object_get(root, "protocol"), "a protocol (\"Simple\" or \"LL\")");
    if (mscx_pj_bool(c, root, "inplace", false, &p->inplace) ||
        mscx_pj_bool(c, root, "reuse_resources", false, &p->reuse_resources) ||
        mscx_pj_bool(c, root, "use_double_scratch_buffer", false, &p->double_scratch) ||
        mscx_pj_bool(c, root, "ranks_may_differ", false, &p->ranks_may_differ) ||
        mscx_pj_u32(c, root, "num_threads_per_block", true, 1024, UINT32_MAX, &p->nthreads) ||
        mscx_pj_u32(c, root, "buffer_alignment", true, 16, UINT32_MAX, &p->alignment) ||
        mscx_pj_u64(c, root, "min_message_size", true, 0, UINT64_MAX, &p->min_size) ||
        mscx_pj_u64(c, root, "max_message_size", true, UINT64_MAX, UINT64_MAX, &p->max_size))
        return -1;
    if (parse_extension(c, root, p))
        return -1;

    const json_t *gpus = mscx_pj_array(c, root, "gpus", true, &aerr);
    if (aerr)
        return -1;
    size_t n = json_array_size(gpus);
    if (n == 0 || n > MSCX_MAX_RANKS)
        return fail(c, "gpus", gpus, "1 to %u ranks", MSCX_MAX_RANKS);
    p->gpus = calloc(n, sizeof(*p->gpus));
    if (p->gpus == NULL)
        return mscx_pj_nomem(c);
    p->nranks = (uint32_t)n;
    push_key(c, "gpus");
    for (size_t r = 0; r < n; r++) {
        push_idx(c, r);
        c->nranks = p->nranks;
        c->rank = (uint32_t)r;
        if (parse_gpu(c, &p->gpus[r], json_array_get(gpus, r), (uint32_t)r))
            return -1;
        pop(c);
    }
    pop(c);
    return 0;
}

/* ---- entry points ---- */

static void log_historical(const struct pctx *c, const struct mscx_plan *p, const char *origin)
{
    char list[128];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; i < c->nhistorical && n < sizeof(list); i++)
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", c->historical[i]);
    MSCX_INFO(MSCX_SUB_PLAN, "plan %s (%s) uses historical names (%s); read with their current meaning",
              p->name, origin, list);
}

/* "plan bug: ORIGIN:LINE:COL: PATH: MESSAGE" for the error in @p c, at the place of its path in @p json. */
static void plan_bug(const struct pctx *c, const char *json, size_t len, const char *origin, char *buf,
                     size_t buflen)
{
    int line = 0, col = 0;
    mscx_plan_json_locate(json, len, c->where, &line, &col);
    snprintf(buf, buflen, "plan bug: %s:%d:%d: %s%s%s", origin, line, col, c->where, c->where[0] ? ": " : "",
             c->msg);
}

mscx_status_t mscx_plan_load_buffer(const char *json, size_t len, const char *origin,
                                    struct mscx_plan **plan_p, char *err, size_t errlen)
{
    struct pctx *c = NULL;
    struct mscx_plan *p = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    mscx_status_t st = MSCX_ERR_PLAN;
    char tmp[2 * MSCX_PLAN_ERR_LEN + 256];
    struct mscx_json_arena arena;

    if (origin == NULL)
        origin = "<buffer>";
    if (err && errlen)
        err[0] = '\0';
    /* the JSON tree lives only inside this function: parse it into an arena */
    mscx_json_arena_begin(&arena);
    char *rewritten = rewrite_huge_sizes(json, len);
    root = json_loadb(rewritten ? rewritten : json, len, JSON_REJECT_DUPLICATES, &jerr);
    free(rewritten);
    if (root == NULL && json_error_code(&jerr) == json_error_numeric_overflow) /* 2^64-1 sizes */
        root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    if (root == NULL) {
        snprintf(tmp, sizeof(tmp), "plan bug: %s:%d:%d: expected valid JSON, got %s", origin, jerr.line,
                 jerr.column, jerr.text);
        goto err_report;
    }
    c = calloc(1, sizeof(*c));
    p = calloc(1, sizeof(*p));
    if (c == NULL || p == NULL || (p->origin = strdup(origin)) == NULL) {
        st = MSCX_ERR_NO_MEMORY;
        snprintf(tmp, sizeof(tmp), "out of memory loading plan %s", origin);
        goto err_report;
    }
    p->dtype_mask = (1u << MSCX_DT_COUNT) - 1;
    p->redop_mask = (1u << MSCX_REDOP_COUNT) - 1;
    if (parse_top(c, root, p)) {
        if (c->nomem) {
            st = MSCX_ERR_NO_MEMORY;
            snprintf(tmp, sizeof(tmp), "out of memory loading plan %s", origin);
        } else {
            plan_bug(c, json, len, origin, tmp, sizeof(tmp));
        }
        goto err_report;
    }
    if (c->nhistorical)
        log_historical(c, p, origin);
    st = mscx_plan_validate(p, c->where, sizeof(c->where), c->msg, sizeof(c->msg));
    if (st != MSCX_OK) {
        if (st == MSCX_ERR_PLAN)
            plan_bug(c, json, len, origin, tmp, sizeof(tmp));
        else
            snprintf(tmp, sizeof(tmp), "%s", c->msg);
        goto err_report;
    }
    json_decref(root);
    mscx_json_arena_end(&arena);
    free(c);
    *plan_p = p;
    return MSCX_OK;

err_report:
    MSCX_INFO(MSCX_SUB_PLAN, "refusing plan: %s", tmp);
    if (err && errlen)
        snprintf(err, errlen, "%s", tmp);
    mscx_plan_free(p);
    free(c);
    json_decref(root);
    mscx_json_arena_end(&arena);
    return st;
}

mscx_status_t mscx_plan_load(const char *path, struct mscx_plan **plan_p, char *err, size_t errlen)
{
    FILE *f;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    mscx_status_t st;

    f = fopen(path, "rb");
    if (f == NULL)
        goto err_sys;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                if (err && errlen)
                    snprintf(err, errlen, "out of memory reading %s", path);
                return MSCX_ERR_NO_MEMORY;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                fclose(f);
                errno = EIO;
                goto err_sys;
            }
            break;
        }
    }
    fclose(f);
    st = mscx_plan_load_buffer(buf, len, path, plan_p, err, errlen);
    free(buf);
    return st;

err_sys : {
    int e = errno;
    if (err && errlen)
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
    MSCX_INFO(MSCX_SUB_PLAN, "cannot read %s: %s", path, strerror(e));
    return MSCX_ERR_SYSTEM;
}
}
