/* SPDX-License-Identifier: MIT */
/*
 * The plan loader: MSCCL++ JSON (jansson) -> struct mscx_plan, with the
 * thread-block tables resolved into the ops. Structural errors (types,
 * missing fields, unknown names, local table indices) are found here; the
 * semantic checks are in plan_validate.c.
 *
 * jansson keeps no per-node positions, so the loader keeps the JSON path of
 * the node it is looking at (a small component stack, rendered only on
 * error) and, on error, finds the line and column of that path with a light
 * tokenizer pass over the text (plan_pos.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "plan_int.h"
#include "json_arena.h"
#include "plan_json_int.h"

#define PATH_DEPTH 16

struct pcomp {
    const char *key; /* ".key"; NULL: "[idx]" */
    size_t idx;
};

struct pctx {
    struct pcomp path[PATH_DEPTH];
    int depth;
    char msg[512];
    char where[512];
    bool failed;
    bool nomem;
    const char *historical[8];
    int nhistorical;
    uint32_t nranks, rank; /* of the plan, and of the gpu being read */
};

/* ---- paths and errors ---- */

static void push_key(struct pctx *c, const char *key)
{
    if (c->depth < PATH_DEPTH)
        c->path[c->depth] = (struct pcomp){key, 0};
    c->depth++;
}

static void push_idx(struct pctx *c, size_t idx)
{
    if (c->depth < PATH_DEPTH)
        c->path[c->depth] = (struct pcomp){NULL, idx};
    c->depth++;
}

static void pop(struct pctx *c)
{
    c->depth--;
}

static void render_path(const struct pctx *c, const char *leaf, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->depth && i < PATH_DEPTH && n < len; i++) {
        const struct pcomp *p = &c->path[i];
        if (p->key)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "." : "", p->key);
        else
            n += (size_t)snprintf(buf + n, len - n, "[%zu]", p->idx);
    }
    if (leaf && n < len)
        snprintf(buf + n, len - n, "%s%s", n ? "." : "", leaf);
}

/* Describe a JSON value for "got ..." */
static void describe_value(const json_t *v, char *buf, size_t len)
{
    if (v == NULL) {
        snprintf(buf, len, "nothing (field missing)");
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        snprintf(buf, len, "an object");
        break;
    case JSON_ARRAY:
        snprintf(buf, len, "an array of %zu", json_array_size(v));
        break;
    case JSON_STRING:
        snprintf(buf, len, "\"%.60s%s\"", json_string_value(v), json_string_length(v) > 60 ? "..." : "");
        break;
    case JSON_INTEGER:
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        snprintf(buf, len, "%.17g", json_real_value(v));
        break;
    case JSON_TRUE:
        snprintf(buf, len, "true");
        break;
    case JSON_FALSE:
        snprintf(buf, len, "false");
        break;
    default:
        snprintf(buf, len, "null");
        break;
    }
}

/* Record the first error: path (current stack + leaf) and "expected <what>, got <value>". */
static int fail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
{
    char what[256], val[128];
    va_list ap;
    if (c->failed)
        return -1;
    c->failed = true;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    describe_value(got, val, sizeof(val));
    render_path(c, leaf, c->where, sizeof(c->where));
    snprintf(c->msg, sizeof(c->msg), "expected %s, got %s", what, val);
    return -1;
}

static int nomem(struct pctx *c)
{
    if (!c->failed) {
        c->failed = true;
        c->nomem = true;
        snprintf(c->msg, sizeof(c->msg), "out of memory");
    }
    return -1;
}

static void note_historical(struct pctx *c, const char *name)
{
    for (int i = 0; i < c->nhistorical; i++)
        if (strcmp(c->historical[i], name) == 0)
            return;
    if (c->nhistorical < 8)
        c->historical[c->nhistorical++] = name;
}

/*
 * jansson refuses integers above INT64_MAX, and the MSCCL++ DSL writes an
 * unbounded max_message_size as 2^64-1. Rather than parse the whole plan a
 * second time with every integer as a double, rewrite such a size literal to
 * INT64_MAX, padded with spaces so that every line:column stays right; the
 * getter below reads INT64_MAX there as unbounded.
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
        while (k > 0 && (json[k - 1] == ' ' || json[k - 1] == '\t' || json[k - 1] == '\n' || json[k - 1] == '\r'))
            k--;
        bool size_key = false;
        if (k > 0 && json[k - 1] == ':') {
            k--;
            while (k > 0 && (json[k - 1] == ' ' || json[k - 1] == '\t' || json[k - 1] == '\n' || json[k - 1] == '\r'))
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

/* ---- typed field getters ---- */

/* Integral value of a number node, -1 when not an integral number. */
static int num_value(const json_t *v, double *d_p, json_int_t *i_p, bool *is_int_p)
{
    if (json_is_integer(v)) {
        *i_p = json_integer_value(v);
        *is_int_p = true;
        return 0;
    }
    if (json_is_real(v)) { /* only in the too-big-integer fallback parse, or 1.5 */
        double d = json_real_value(v);
        if (d != floor(d))
            return -1;
        *d_p = d;
        *is_int_p = false;
        return 0;
    }
    return -1;
}

/*
 * Unsigned integer field. @p have_dflt: missing is allowed and gives @p dflt.
 * @p clamp: values too large for uint64 become max (max_message_size).
 */
static int get_u64_v(struct pctx *c, const json_t *v, const char *leaf, uint64_t max, uint64_t *out_p, bool clamp)
{
    double d = 0;
    json_int_t i = 0;
    bool is_int;
    if (num_value(v, &d, &i, &is_int))
        return fail(c, leaf, v, "an unsigned integer");
    if (is_int) {
        if (i < 0)
            return fail(c, leaf, v, "an unsigned integer");
        if (clamp && i == INT64_MAX && max == UINT64_MAX) { /* see rewrite_huge_sizes() */
            *out_p = UINT64_MAX;
            return 0;
        }
        if ((uint64_t)i > max)
            return fail(c, leaf, v, "an integer at most %" PRIu64, max);
        *out_p = (uint64_t)i;
        return 0;
    }
    if (d < 0)
        return fail(c, leaf, v, "an unsigned integer");
    if (d >= 18446744073709551616.0) {
        if (!clamp || max != UINT64_MAX)
            return fail(c, leaf, v, "an integer at most %" PRIu64, max);
        *out_p = UINT64_MAX;
        return 0;
    }
    if ((uint64_t)d > max)
        return fail(c, leaf, v, "an integer at most %" PRIu64, max);
    *out_p = (uint64_t)d;
    return 0;
}

static int get_u64(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint64_t dflt, uint64_t max,
                   uint64_t *out_p)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        if (!have_dflt)
            return fail(c, key, NULL, "an unsigned integer");
        *out_p = dflt;
        return 0;
    }
    return get_u64_v(c, v, key, max, out_p, key[0] == 'm' && strcmp(key, "max_message_size") == 0);
}

static int get_u32(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint32_t dflt, uint32_t max,
                   uint32_t *out_p)
{
    uint64_t v;
    if (get_u64(c, obj, key, have_dflt, dflt, max, &v))
        return -1;
    *out_p = (uint32_t)v;
    return 0;
}

static int get_bool(struct pctx *c, const json_t *obj, const char *key, bool dflt, bool *out_p)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        *out_p = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return fail(c, key, v, "true or false");
    *out_p = json_is_true(v);
    return 0;
}

static const char *get_str(struct pctx *c, const json_t *obj, const char *key, bool required)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        if (required)
            fail(c, key, NULL, "a string");
        return NULL;
    }
    if (!json_is_string(v)) {
        fail(c, key, v, "a string");
        return NULL;
    }
    return json_string_value(v);
}

/* Array field; missing gives an empty array when !required. */
static const json_t *get_array(struct pctx *c, const json_t *obj, const char *key, bool required, bool *err_p)
{
    const json_t *v = json_object_get(obj, key);
    *err_p = false;
    if (v == NULL) {
        if (required) {
            fail(c, key, NULL, "an array");
            *err_p = true;
        }
        return NULL;
    }
    if (!json_is_array(v)) {
        fail(c, key, v, "an array");
        *err_p = true;
        return NULL;
    }
    return v;
}

static int expect_object(struct pctx *c, const json_t *v)
{
    if (!json_is_object(v))
        return fail(c, NULL, v, "an object");
    return 0;
}

/* ---- enumerations ---- */

static int parse_buf_type(struct pctx *c, const json_t *obj, const char *key, uint8_t *out_p)
{
    const char *s = get_str(c, obj, key, true);
    if (s == NULL)
        return -1;
    if (strcmp(s, "i") == 0 || strcmp(s, "input") == 0)
        *out_p = MSCX_BUF_INPUT;
    else if (strcmp(s, "o") == 0 || strcmp(s, "output") == 0)
        *out_p = MSCX_BUF_OUTPUT;
    else if (strcmp(s, "s") == 0 || strcmp(s, "scratch") == 0)
        *out_p = MSCX_BUF_SCRATCH;
    else
        return fail(c, key, json_object_get(obj, key), "a buffer type (\"i\", \"o\" or \"s\")");
    return 0;
}

static int chan_type_from(struct pctx *c, const json_t *v, const char *leaf, bool allow_none, uint8_t *out_p)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s == NULL)
        return fail(c, leaf, v, "a channel type (memory, port, switch%s)", allow_none ? " or none" : "");
    if (strcmp(s, "memory") == 0) {
        *out_p = MSCX_CHAN_MEMORY;
    } else if (strcmp(s, "port") == 0) {
        *out_p = MSCX_CHAN_PORT;
    } else if (strcmp(s, "switch") == 0) {
        *out_p = MSCX_CHAN_SWITCH;
    } else if (allow_none && strcmp(s, "none") == 0) {
        *out_p = MSCX_CHAN_NONE;
    } else if (strcmp(s, "sm") == 0) {
        note_historical(c, "sm");
        *out_p = MSCX_CHAN_MEMORY;
    } else if (strcmp(s, "proxy") == 0) {
        note_historical(c, "proxy");
        *out_p = MSCX_CHAN_PORT;
    } else if (strcmp(s, "nvls") == 0) {
        note_historical(c, "nvls");
        *out_p = MSCX_CHAN_SWITCH;
    } else {
        return fail(c, leaf, v, "a channel type (memory, port, switch%s)", allow_none ? " or none" : "");
    }
    return 0;
}

static const struct {
    const char *name;
    uint8_t op;
    bool historical;
} opcode_table[] = {
    {"nop", MSCX_OP_NOP, false},
    {"barrier", MSCX_OP_BARRIER, false},
    {"put", MSCX_OP_PUT, false},
    {"ppkt", MSCX_OP_PUT_PACKETS, false},
    {"rppkt", MSCX_OP_READ_PUT_PACKETS, false},
    {"pws", MSCX_OP_PUT_WITH_SIGNAL, false},
    {"pwsf", MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH, false},
    {"get", MSCX_OP_GET, false},
    {"copy", MSCX_OP_COPY, false},
    {"cpkt", MSCX_OP_COPY_PACKETS, false},
    {"upkt", MSCX_OP_UNPACK_PACKETS, false},
    {"signal", MSCX_OP_SIGNAL, false},
    {"wait", MSCX_OP_WAIT, false},
    {"flush", MSCX_OP_FLUSH, false},
    {"re", MSCX_OP_REDUCE, false},
    {"repkt", MSCX_OP_REDUCE_PACKETS, false},
    {"recpkt", MSCX_OP_REDUCE_COPY_PACKETS, false},
    {"res", MSCX_OP_REDUCE_SEND, false},
    {"respkt", MSCX_OP_REDUCE_SEND_PACKETS, false},
    {"recspkt", MSCX_OP_REDUCE_COPY_SEND_PACKETS, false},
    {"rre", MSCX_OP_READ_REDUCE, false},
    {"rres", MSCX_OP_READ_REDUCE_SEND, false},
    {"glres", MSCX_OP_MULTI_LOAD_REDUCE_STORE, false},
    {"rlxsignal", MSCX_OP_RELAXED_SIGNAL, false},
    {"rlxwait", MSCX_OP_RELAXED_WAIT, false},
    {"pipeline", MSCX_OP_PIPELINE, false},
    {"sem_release", MSCX_OP_SEM_RELEASE, false},
    {"sem_acquire", MSCX_OP_SEM_ACQUIRE, false},
    {"gstore", MSCX_OP_MULTI_STORE, false},
    {"gstorepkt", MSCX_OP_MULTI_STORE_PKT, false},
    /* Historical names (before be6a941f). The old cpkt (unpack) is ambiguous and read as today's cpkt. */
    {"rpkt", MSCX_OP_REDUCE_PACKETS, true},
    {"rspkt", MSCX_OP_REDUCE_SEND_PACKETS, true},
    {"tpkt", MSCX_OP_COPY_PACKETS, true},
    {"rs", MSCX_OP_REDUCE_SEND, true},
    {"rrc", MSCX_OP_READ_REDUCE, true},
    {"rrcs", MSCX_OP_READ_REDUCE_SEND, true},
    /* The DSL's unfused group load-reduce, as the MSCCL++ switch demonstrations write it. */
    {"glre", MSCX_OP_MULTI_LOAD_REDUCE_STORE, true},
};

static int parse_opcode(struct pctx *c, const json_t *op, uint8_t *out_p)
{
    const json_t *v = json_object_get(op, "name");
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s) {
        for (size_t i = 0; i < sizeof(opcode_table) / sizeof(opcode_table[0]); i++) {
            if (strcmp(opcode_table[i].name, s) == 0) {
                if (opcode_table[i].historical)
                    note_historical(c, opcode_table[i].name);
                *out_p = opcode_table[i].op;
                return 0;
            }
        }
    }
    return fail(c, "name", v, "an operation name (nop, barrier, put, ppkt, rppkt, pws, pwsf, get, copy, cpkt, upkt, "
                               "signal, wait, flush, re, repkt, ...)");
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
            return nomem(c);
        memset(nv + *cap_p, 0, (ncap - *cap_p) * sizeof(*nv));
        g->switch_chan = nv;
        *cap_p = ncap;
    }
    sc = &g->switch_chan[g->nswitch++];
    if (parse_buf_type(c, ch, "buffer_type", &sc->buf_type))
        return -1;
    const json_t *groups = get_array(c, ch, "rank_groups", false, &aerr);
    if (aerr)
        return -1;
    size_t ng = groups ? json_array_size(groups) : 0;
    if (ng == 0)
        return 0;
    sc->group_size = calloc(ng, sizeof(uint32_t));
    sc->group_ranks = calloc(ng, sizeof(uint32_t *));
    if (sc->group_size == NULL || sc->group_ranks == NULL)
        return nomem(c);
    sc->ngroups = (uint32_t)ng;
    push_key(c, "rank_groups");
    for (size_t k = 0; k < ng; k++) {
        const json_t *grp = json_array_get(groups, k);
        push_idx(c, k);
        if (expect_object(c, grp))
            return -1;
        const json_t *ranks = get_array(c, grp, "ranks", true, &aerr);
        if (aerr)
            return -1;
        size_t nr = json_array_size(ranks);
        sc->group_size[k] = (uint32_t)nr;
        sc->group_ranks[k] = calloc(nr ? nr : 1, sizeof(uint32_t));
        if (sc->group_ranks[k] == NULL)
            return nomem(c);
        push_key(c, "ranks");
        for (size_t j = 0; j < nr; j++) {
            uint64_t r;
            push_idx(c, j);
            if (get_u64_v(c, json_array_get(ranks, j), NULL, MSCX_MAX_RANKS - 1, &r, false))
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
    const json_t *chans = get_array(c, gj, "channels", false, &aerr);
    if (aerr)
        return -1;
    push_key(c, "channels");
    for (size_t i = 0; chans && i < json_array_size(chans); i++) {
        const json_t *ch = json_array_get(chans, i);
        uint8_t type;
        push_idx(c, i);
        if (expect_object(c, ch) ||
            chan_type_from(c, json_object_get(ch, "channel_type"), "channel_type", false, &type))
            goto out;
        if (type == MSCX_CHAN_SWITCH) {
            if (parse_switch_chan(c, g, ch, &sw_cap))
                goto out;
        } else {
            const json_t *to = get_array(c, ch, "connected_to", true, &aerr);
            if (aerr)
                goto out;
            push_key(c, "connected_to");
            for (size_t k = 0; k < json_array_size(to); k++) {
                uint64_t peer;
                struct chan_acc *a = &acc[type];
                push_idx(c, k);
                if (get_u64_v(c, json_array_get(to, k), NULL, UINT32_MAX, &peer, false))
                    goto out;
                if (peer >= c->nranks || peer == c->rank) {
                    fail(c, NULL, json_array_get(to, k), "a peer rank below %u other than this rank (%u)", c->nranks,
                         c->rank);
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
                        nomem(c);
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
    const json_t *a = get_array(c, obj, "access_channel_types", true, &aerr);
    if (aerr)
        return -1;
    *mask_p = 0;
    push_key(c, "access_channel_types");
    for (size_t k = 0; k < json_array_size(a); k++) {
        uint8_t t;
        push_idx(c, k);
        if (chan_type_from(c, json_array_get(a, k), NULL, false, &t))
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
    const json_t *rb = get_array(c, gj, "remote_buffers", false, &aerr);
    if (aerr)
        return -1;
    size_t n = rb ? json_array_size(rb) : 0;
    if (n > UINT16_MAX)
        return fail(c, "remote_buffers", rb, "at most %u remote buffers", UINT16_MAX);
    if (n) {
        g->rbuf = calloc(n, sizeof(*g->rbuf));
        if (g->rbuf == NULL)
            return nomem(c);
        g->nrbuf = (uint32_t)n;
    }
    push_key(c, "remote_buffers");
    for (size_t i = 0; i < n; i++) {
        const json_t *b = json_array_get(rb, i);
        push_idx(c, i);
        if (expect_object(c, b) || get_u32(c, b, "rank", false, 0, UINT32_MAX, &g->rbuf[i].rank) ||
            parse_buf_type(c, b, "type", &g->rbuf[i].type) || parse_access_types(c, b, &g->rbuf[i].access_mask))
            return -1;
        pop(c);
    }
    pop(c);

    const json_t *sems = get_array(c, gj, "semaphores", false, &aerr);
    if (aerr)
        return -1;
    n = sems ? json_array_size(sems) : 0;
    if (n > UINT16_MAX)
        return fail(c, "semaphores", sems, "at most %u semaphores", UINT16_MAX);
    if (n) {
        g->sem_init = calloc(n, sizeof(int32_t));
        if (g->sem_init == NULL)
            return nomem(c);
        g->nsem = (uint32_t)n;
    }
    push_key(c, "semaphores");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(sems, i);
        const json_t *iv;
        push_idx(c, i);
        if (expect_object(c, s))
            return -1;
        iv = json_object_get(s, "init_value");
        if (iv != NULL) {
            if (!json_is_integer(iv) || json_integer_value(iv) < INT32_MIN || json_integer_value(iv) > INT32_MAX)
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
    if (expect_object(c, gj))
        return -1;
    if (get_u32(c, gj, "id", false, 0, UINT32_MAX, &g->id))
        return -1;
    if (g->id != rank)
        return fail(c, "id", json_object_get(gj, "id"), "the rank's position in gpus, %u", rank);
    if (get_u32(c, gj, "input_chunks", false, 0, UINT32_MAX, &g->input_chunks) ||
        get_u32(c, gj, "output_chunks", false, 0, UINT32_MAX, &g->output_chunks) ||
        get_u32(c, gj, "scratch_chunks", false, 0, UINT32_MAX, &g->scratch_chunks))
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
    const json_t *a = get_array(c, ext, key, false, &aerr);
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
    if (expect_object(c, ext) || get_u32(c, ext, "version", true, 1, UINT32_MAX, &v))
        return -1;
    if (v != 1)
        return fail(c, "version", json_object_get(ext, "version"), "mscx extension version 1");
    if (json_object_get(ext, "ranks_per_node")) {
        if (get_u32(c, ext, "ranks_per_node", false, 0, MSCX_MAX_RANKS, &p->ranks_per_node))
            return -1;
        p->ranks_per_node_given = true;
    }
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
        if (expect_object(c, fu) || get_u32(c, fu, "ops_before", false, 0, UINT32_MAX, &p->fuse.ops_before) ||
            get_u32(c, fu, "ops_after", false, 0, UINT32_MAX, &p->fuse.ops_after))
            return -1;
        const json_t *hits = get_array(c, fu, "rule_hits", false, &aerr);
        if (aerr)
            return -1;
        push_key(c, "rule_hits");
        for (size_t i = 0; hits && i < json_array_size(hits) && i < 8; i++) {
            uint64_t h;
            push_idx(c, i);
            if (get_u64_v(c, json_array_get(hits, i), NULL, UINT32_MAX, &h, false))
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
    "name", "collective", "protocol", "inplace", "reuse_resources", "num_threads_per_block",
    "use_double_scratch_buffer", "buffer_alignment", "min_message_size", "max_message_size", "gpus",
    "version", "mscx",
};

static int parse_top(struct pctx *c, const json_t *root, struct mscx_plan *p)
{
    const char *s, *key;
    const json_t *val;
    bool aerr;

    if (!json_is_object(root))
        return fail(c, NULL, root, "a plan object");
    json_object_foreach((json_t *)root, key, val) {
        size_t k;
        for (k = 0; k < sizeof(known_top) / sizeof(known_top[0]); k++)
            if (strcmp(known_top[k], key) == 0)
                break;
        if (k == sizeof(known_top) / sizeof(known_top[0]))
            MSCX_INFO(MSCX_SUB_PLAN, "plan: ignoring unknown top-level field \"%s\"", key);
    }
    if (parse_version(c, root, p))
        return -1;
    if ((s = get_str(c, root, "name", true)) == NULL)
        return -1;
    if ((p->name = strdup(s)) == NULL)
        return nomem(c);
    if ((s = get_str(c, root, "collective", true)) == NULL)
        return -1;
    if ((p->collective_name = strdup(s)) == NULL)
        return nomem(c);
    if (mscx_coll_parse(s, &p->coll))
        return fail(c, "collective", json_object_get(root, "collective"),
                    "a collective (allreduce, allgather, reducescatter, alltoall, broadcast, sendrecv or test)");
    s = get_str(c, root, "protocol", false);
    if (c->failed)
        return -1;
    if (s == NULL || strcasecmp(s, "Simple") == 0)
        p->protocol = MSCX_PROTO_SIMPLE;
    else if (strcasecmp(s, "LL") == 0)
        p->protocol = MSCX_PROTO_LL;
    else
        return fail(c, "protocol", json_object_get(root, "protocol"), "a protocol (\"Simple\" or \"LL\")");
    if (get_bool(c, root, "inplace", false, &p->inplace) ||
        get_bool(c, root, "reuse_resources", false, &p->reuse_resources) ||
        get_bool(c, root, "use_double_scratch_buffer", false, &p->double_scratch) ||
        get_u32(c, root, "num_threads_per_block", true, 1024, UINT32_MAX, &p->nthreads) ||
        get_u32(c, root, "buffer_alignment", true, 16, UINT32_MAX, &p->alignment) ||
        get_u64(c, root, "min_message_size", true, 0, UINT64_MAX, &p->min_size) ||
        get_u64(c, root, "max_message_size", true, UINT64_MAX, UINT64_MAX, &p->max_size))
        return -1;
    if (parse_extension(c, root, p))
        return -1;

    const json_t *gpus = get_array(c, root, "gpus", true, &aerr);
    if (aerr)
        return -1;
    size_t n = json_array_size(gpus);
    if (n == 0 || n > MSCX_MAX_RANKS)
        return fail(c, "gpus", gpus, "1 to %u ranks", MSCX_MAX_RANKS);
    p->gpus = calloc(n, sizeof(*p->gpus));
    if (p->gpus == NULL)
        return nomem(c);
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
    MSCX_INFO(MSCX_SUB_PLAN, "plan %s (%s) uses historical names (%s); read with their current meaning", p->name,
              origin, list);
}

mscx_status_t mscx_plan_load_buffer(const char *json, size_t len, const char *origin, struct mscx_plan **plan_p,
                                    char *err, size_t errlen)
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
            int line = 0, col = 0;
            mscx_plan_json_locate(json, len, c->where, &line, &col);
            snprintf(tmp, sizeof(tmp), "plan bug: %s:%d:%d: %s%s%s", origin, line, col, c->where,
                     c->where[0] ? ": " : "", c->msg);
        }
        goto err_report;
    }
    if (c->nhistorical)
        log_historical(c, p, origin);
    st = mscx_plan_validate(p, c->where, sizeof(c->where), c->msg, sizeof(c->msg));
    if (st != MSCX_OK) {
        if (st == MSCX_ERR_PLAN) {
            int line = 0, col = 0;
            mscx_plan_json_locate(json, len, c->where, &line, &col);
            snprintf(tmp, sizeof(tmp), "plan bug: %s:%d:%d: %s%s%s", origin, line, col, c->where,
                     c->where[0] ? ": " : "", c->msg);
        } else {
            snprintf(tmp, sizeof(tmp), "%s", c->msg);
        }
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

err_sys: {
    int e = errno;
    if (err && errlen)
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
    MSCX_INFO(MSCX_SUB_PLAN, "cannot read %s: %s", path, strerror(e));
    return MSCX_ERR_SYSTEM;
}
}

/* ---- hooks for plan_json_ops.c ---- */

void mscx_pj_push_key(struct pctx *c, const char *key)
{
    push_key(c, key);
}

void mscx_pj_push_idx(struct pctx *c, size_t idx)
{
    push_idx(c, idx);
}

void mscx_pj_pop(struct pctx *c)
{
    pop(c);
}

int mscx_pj_fail(struct pctx *c, const char *leaf, const json_t *got, const char *what)
{
    return fail(c, leaf, got, "%s", what);
}

int mscx_pj_nomem(struct pctx *c)
{
    return nomem(c);
}

int mscx_pj_u32(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint32_t dflt, uint32_t max,
                uint32_t *out_p)
{
    return get_u32(c, obj, key, have_dflt, dflt, max, out_p);
}

int mscx_pj_u32_v(struct pctx *c, const json_t *v, uint32_t max, uint32_t *out_p)
{
    uint64_t x;
    if (get_u64_v(c, v, NULL, max, &x, false))
        return -1;
    *out_p = (uint32_t)x;
    return 0;
}

const json_t *mscx_pj_array(struct pctx *c, const json_t *obj, const char *key, bool required, bool *err_p)
{
    return get_array(c, obj, key, required, err_p);
}

int mscx_pj_object(struct pctx *c, const json_t *v)
{
    return expect_object(c, v);
}

int mscx_pj_chan_type(struct pctx *c, const json_t *v, const char *leaf, bool allow_none, uint8_t *out_p)
{
    return chan_type_from(c, v, leaf, allow_none, out_p);
}

int mscx_pj_buf_type(struct pctx *c, const json_t *obj, const char *key, uint8_t *out_p)
{
    return parse_buf_type(c, obj, key, out_p);
}

int mscx_pj_opcode(struct pctx *c, const json_t *op, uint8_t *out_p)
{
    return parse_opcode(c, op, out_p);
}

const char *mscx_pj_str(struct pctx *c, const json_t *obj, const char *key, bool required)
{
    return get_str(c, obj, key, required);
}
