/* SPDX-License-Identifier: MIT */
/*
 * Private interface between the plan loader's files: plan_json.c (top level,
 * gpu declarations, entry points), plan_json_read.c (paths, errors, typed
 * getters, names), plan_json_ops.c (thread blocks and ops) and plan_pos.c
 * (line and column of a JSON path).
 */
#ifndef MSCX_PLAN_JSON_INT_H
#define MSCX_PLAN_JSON_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan_model.h"

#define MSCX_PJ_PATH_DEPTH 16 /* path components kept; deeper ones are counted, not named */

struct pcomp {
    const char *key; /* ".key"; NULL: "[idx]" */
    size_t idx;
};

/* The loader's state while reading one plan. */
struct pctx {
    struct pcomp path[MSCX_PJ_PATH_DEPTH];
    int depth;
    char msg[512];
    char where[512];
    bool failed;
    bool nomem;
    const char *historical[8];
    int nhistorical;
    uint32_t nranks, rank; /* of the plan, and of the gpu being read */
};

/* Path stack, errors and getters (plan_json_read.c). Every failing helper returns -1. */
void mscx_pj_push_key(struct pctx *c, const char *key);
void mscx_pj_push_idx(struct pctx *c, size_t idx);
void mscx_pj_pop(struct pctx *c);
/* "expected <what>, got <got>" at the current path plus @p leaf (may be NULL). */
int mscx_pj_fail(struct pctx *c, const char *leaf, const json_t *got, const char *what);
/* The same with <what> formatted from @p fmt. */
int mscx_pj_failf(struct pctx *c, const char *leaf, const json_t *got, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int mscx_pj_nomem(struct pctx *c);
int mscx_pj_u32(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint32_t dflt,
                uint32_t max, uint32_t *out_p);
int mscx_pj_u32_v(struct pctx *c, const json_t *v, uint32_t max, uint32_t *out_p);
/* Unsigned field @p key of @p obj (missing: @p dflt when @p have_dflt); max_message_size may be 2^64-1. */
int mscx_pj_u64(struct pctx *c, const json_t *obj, const char *key, bool have_dflt, uint64_t dflt,
                uint64_t max, uint64_t *out_p);
int mscx_pj_u64_v(struct pctx *c, const json_t *v, uint64_t max, uint64_t *out_p);
int mscx_pj_bool(struct pctx *c, const json_t *obj, const char *key, bool dflt, bool *out_p);
const json_t *mscx_pj_array(struct pctx *c, const json_t *obj, const char *key, bool required, bool *err_p);
int mscx_pj_object(struct pctx *c, const json_t *v);
int mscx_pj_chan_type(struct pctx *c, const json_t *v, const char *leaf, bool allow_none, uint8_t *out_p);
int mscx_pj_buf_type(struct pctx *c, const json_t *obj, const char *key, uint8_t *out_p);
int mscx_pj_opcode(struct pctx *c, const json_t *op, uint8_t *out_p);
const char *mscx_pj_str(struct pctx *c, const json_t *obj, const char *key, bool required);

/* Thread blocks of one rank, after its channels and remote buffers (plan_json_ops.c). */
int mscx_plan_json_tbs(struct pctx *c, struct mscx_gpu *g, const json_t *gj);

/*
 * Find the 1-based line and column of the value at @p path ("gpus[1].ops[2].x")
 * in the JSON text, or of its deepest existing ancestor (plan_pos.c). Leaves
 * 0:0 when nothing matches.
 */
void mscx_plan_json_locate(const char *text, size_t len, const char *path, int *line_p, int *col_p);

#endif /* MSCX_PLAN_JSON_INT_H */
