/* SPDX-License-Identifier: MIT */
/*
 * The plan loader's reading helpers, shared by its files through
 * plan_json_int.h: the JSON path of the node being read, the first error
 * (where, expected what, got what), typed field getters, and the names of
 * buffer types, channel types and operations (with their historical
 * spellings, which are noted for one INFO line per plan).
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_model.h"
#include "plan_json_int.h"

/* ---- paths and errors ---- */

static void push_key(struct pctx *c, const char *key)
{
    if (c->depth < MSCX_PJ_PATH_DEPTH)
        c->path[c->depth] = (struct pcomp){key, 0};
    c->depth++;
}

static void push_idx(struct pctx *c, size_t idx)
{
    if (c->depth < MSCX_PJ_PATH_DEPTH)
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
    for (int i = 0; i < c->depth && i < MSCX_PJ_PATH_DEPTH && n < len; i++) {
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
static int vfail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static int vfail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, va_list ap)
{
    char what[256], val[128];
    if (c->failed)
        return -1;
    c->failed = true;
    vsnprintf(what, sizeof(what), fmt, ap);
    describe_value(got, val, sizeof(val));
    render_path(c, leaf, c->where, sizeof(c->where));
    snprintf(c->msg, sizeof(c->msg), "expected %s, got %s", what, val);
    return -1;
}

static int fail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, leaf, got, fmt, ap);
    va_end(ap);
    return rc;
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
static int get_u64_v(struct pctx *c, const json_t *v, const char *leaf, uint64_t max, uint64_t *out_p,
                     bool clamp)
{
    double d = 0;
    json_int_t i = 0;
    bool is_int;
    if (num_value(v, &d, &i, &is_int))
        return fail(c, leaf, v, "an unsigned integer");
    if (is_int) {
        if (i < 0)
            return fail(c, leaf, v, "an unsigned integer");
        if (clamp && i == INT64_MAX && max == UINT64_MAX) { /* see rewrite_huge_sizes() in plan_json.c */
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

static int get_u64(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint64_t dflt,
                   uint64_t max, uint64_t *out_p)
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

static int get_u32(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint32_t dflt,
                   uint32_t max, uint32_t *out_p)
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
    return fail(c, "name", v,
                "an operation name (nop, barrier, put, ppkt, rppkt, pws, pwsf, get, copy, cpkt, upkt, "
                "signal, wait, flush, re, repkt, ...)");
}

/* ---- the interface of plan_json_int.h ---- */

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

int mscx_pj_failf(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, leaf, got, fmt, ap);
    va_end(ap);
    return rc;
}

int mscx_pj_nomem(struct pctx *c)
{
    return nomem(c);
}

int mscx_pj_u32(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint32_t dflt,
                uint32_t max, uint32_t *out_p)
{
    return get_u32(c, obj, key, have_dflt, dflt, max, out_p);
}

int mscx_pj_u64(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint64_t dflt,
                uint64_t max, uint64_t *out_p)
{
    return get_u64(c, obj, key, have_dflt, dflt, max, out_p);
}

int mscx_pj_u64_v(struct pctx *c, const json_t *v, uint64_t max, uint64_t *out_p)
{
    return get_u64_v(c, v, NULL, max, out_p, false);
}

int mscx_pj_u32_v(struct pctx *c, const json_t *v, uint32_t max, uint32_t *out_p)
{
    uint64_t x;
    if (get_u64_v(c, v, NULL, max, &x, false))
        return -1;
    *out_p = (uint32_t)x;
    return 0;
}

int mscx_pj_bool(struct pctx *c, const json_t *obj, const char *key, bool dflt, bool *out_p)
{
    return get_bool(c, obj, key, dflt, out_p);
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
