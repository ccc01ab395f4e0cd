/* SPDX-License-Identifier: MIT */
/* Chrome trace JSON writer for the GPU executor's per-op timestamps. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/dev_types.h"
#include "mscx/log.h"
#include "mscx/plan.h"
#include "mscx/trace.h"

/* A record and its position in its block, for a stable sort by start. */
struct trace_ent {
    const struct mscx_trace_rec *rec;
    size_t pos;
};

static int ent_cmp(const void *a, const void *b)
{
    const struct trace_ent *x = a, *y = b;
    if (x->rec->start_ns != y->rec->start_ns)
        return x->rec->start_ns < y->rec->start_ns ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos);
}

static int block_cmp(const void *a, const void *b)
{
    const struct mscx_trace_block *x = *(const struct mscx_trace_block *const *)a;
    const struct mscx_trace_block *y = *(const struct mscx_trace_block *const *)b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return x->block < y->block ? -1 : (x->block > y->block);
}

/* Write @p s as a JSON string body (without quotes). */
static void put_json_str(FILE *out, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
}

/* Nanoseconds since @p t0 as microseconds with nanosecond resolution. */
static void put_us(FILE *out, uint64_t ns, uint64_t t0)
{
    uint64_t d = ns - t0;
    fprintf(out, "%" PRIu64 ".%03" PRIu64, d / 1000, d % 1000);
}

static void put_meta(FILE *out, const char *name, uint32_t pid, int tid, const char *key, const char *sval,
                     long ival, int *first)
{
    fprintf(out, "%s\n{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%" PRIu32, *first ? "" : ",", name, pid);
    if (tid >= 0)
        fprintf(out, ",\"tid\":%d", tid);
    fprintf(out, ",\"args\":{\"%s\":", key);
    if (sval) {
        fputc('"', out);
        put_json_str(out, sval);
        fputc('"', out);
    } else {
        fprintf(out, "%ld", ival);
    }
    fprintf(out, "}}");
    *first = 0;
}

/* Emit one track's events; returns the number written. */
static size_t put_track(FILE *out, const struct mscx_trace_block *b, struct trace_ent *ents, uint64_t t0,
                        int *first)
{
    size_t n = 0, clamped = 0;
    uint64_t prev_end = 0;
    for (size_t i = 0; i < b->nrecs; i++)
        if (b->recs[i].start_ns != 0)
            ents[n++] = (struct trace_ent){&b->recs[i], i};
    qsort(ents, n, sizeof(*ents), ent_cmp);
    for (size_t i = 0; i < n; i++) {
        const struct mscx_trace_rec *r = ents[i].rec;
        uint64_t start = r->start_ns, end = r->end_ns;
        if (start < prev_end) {
            start = prev_end;
            clamped++;
        }
        if (end < start) {
            end = start;
            clamped++;
        }
        prev_end = end;
        fprintf(out, "%s\n{\"ph\":\"X\",\"name\":\"", *first ? "" : ",");
        put_json_str(out, r->opcode == MSCX_TRACE_OP_PROLOGUE
                              ? "prologue"
                              : mscx_opcode_name((enum mscx_opcode)r->opcode));
        fprintf(out, "\",\"cat\":\"op\",\"pid\":%" PRIu32 ",\"tid\":%" PRIu32 ",\"ts\":", b->rank, b->block);
        put_us(out, start, t0);
        fprintf(out, ",\"dur\":");
        put_us(out, end, start);
        fprintf(out, ",\"args\":{\"op\":%" PRIu32 ",\"opcode\":%" PRIu32 "}}", r->op_index, r->opcode);
        *first = 0;
    }
    if (clamped)
        MSCX_INFO(MSCX_SUB_EXEC, "trace: rank %" PRIu32 " block %" PRIu32 ": clamped %zu out-of-order times",
                  b->rank, b->block, clamped);
    return n;
}

/*
 * Fill @p order with the blocks sorted by (rank, block), refusing a block
 * without its records and two tracks for one thread block; @p maxrecs_p gets
 * the most records of a block, @p t0_p the earliest start (UINT64_MAX: none).
 */
static mscx_status_t order_blocks(const struct mscx_trace_block *blocks, size_t nblocks,
                                  const struct mscx_trace_block **order, size_t *maxrecs_p, uint64_t *t0_p)
{
    size_t maxrecs = 0;
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < nblocks; i++) {
        if (blocks[i].recs == NULL && blocks[i].nrecs > 0) {
            MSCX_WARN("caller bug: trace block %zu has %zu records and no array", i, blocks[i].nrecs);
            return MSCX_ERR_INVALID_ARG;
        }
        order[i] = &blocks[i];
        if (blocks[i].nrecs > maxrecs)
            maxrecs = blocks[i].nrecs;
        for (size_t k = 0; k < blocks[i].nrecs; k++)
            if (blocks[i].recs[k].start_ns != 0 && blocks[i].recs[k].start_ns < t0)
                t0 = blocks[i].recs[k].start_ns;
    }
    qsort(order, nblocks, sizeof(*order), block_cmp);
    for (size_t i = 1; i < nblocks; i++) {
        if (order[i]->rank == order[i - 1]->rank && order[i]->block == order[i - 1]->block) {
            MSCX_WARN("caller bug: trace has two tracks for rank %" PRIu32 " block %" PRIu32, order[i]->rank,
                      order[i]->block);
            return MSCX_ERR_INVALID_ARG;
        }
    }
    *maxrecs_p = maxrecs;
    *t0_p = t0;
    return MSCX_OK;
}

/* The file's opening, up to the event array: the time unit, the tool and @p label. */
static void put_header(FILE *out, const char *label)
{
    fprintf(out, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"tool\":\"mscx\"");
    if (label && *label) {
        fprintf(out, ",\"label\":\"");
        put_json_str(out, label);
        fputc('"', out);
    }
    fprintf(out, "},\"traceEvents\":[");
}

/* The metadata events: one process per rank, one thread per block, in @p order. */
static void put_names(FILE *out, const struct mscx_trace_block *const *order, size_t nblocks, int *first)
{
    for (size_t i = 0; i < nblocks; i++) {
        const struct mscx_trace_block *b = order[i];
        char name[48];
        if (i == 0 || b->rank != order[i - 1]->rank) {
            snprintf(name, sizeof(name), "rank %" PRIu32, b->rank);
            put_meta(out, "process_name", b->rank, -1, "name", name, 0, first);
            put_meta(out, "process_sort_index", b->rank, -1, "sort_index", NULL, (long)b->rank, first);
        }
        snprintf(name, sizeof(name), "tb %" PRIu32, b->block);
        put_meta(out, "thread_name", b->rank, (int)b->block, "name", name, 0, first);
        put_meta(out, "thread_sort_index", b->rank, (int)b->block, "sort_index", NULL, (long)b->block, first);
    }
}

mscx_status_t mscx_trace_write(FILE *out, const char *label, const struct mscx_trace_block *blocks,
                               size_t nblocks, size_t *nevents_p)
{
    mscx_status_t st = MSCX_OK;
    const struct mscx_trace_block **order = NULL;
    struct trace_ent *ents = NULL;
    size_t maxrecs = 0, nevents = 0;
    uint64_t t0 = UINT64_MAX;
    int first = 1;

    if (out == NULL || (blocks == NULL && nblocks > 0)) {
        MSCX_WARN("caller bug: mscx_trace_write without %s", out == NULL ? "an output" : "blocks");
        return MSCX_ERR_INVALID_ARG;
    }
    order = calloc(nblocks ? nblocks : 1, sizeof(*order));
    if (order == NULL) {
        MSCX_WARN("trace: out of memory for %zu blocks", nblocks);
        return MSCX_ERR_NO_MEMORY;
    }
    MSCX_CHECK_GOTO(order_blocks(blocks, nblocks, order, &maxrecs, &t0), st, out_free);
    ents = calloc(maxrecs ? maxrecs : 1, sizeof(*ents));
    if (ents == NULL) {
        MSCX_WARN("trace: out of memory for %zu records", maxrecs);
        st = MSCX_ERR_NO_MEMORY;
        goto out_free;
    }
    if (t0 == UINT64_MAX)
        t0 = 0;

    put_header(out, label);
    put_names(out, order, nblocks, &first);
    for (size_t i = 0; i < nblocks; i++)
        nevents += put_track(out, order[i], ents, t0, &first);
    fprintf(out, "\n]}\n");
    if (fflush(out) != 0 || ferror(out)) {
        MSCX_WARN("trace: write failed: %s", strerror(errno));
        st = MSCX_ERR_SYSTEM;
        goto out_free;
    }
    if (nevents_p)
        *nevents_p = nevents;
out_free:
    free(ents);
    free(order);
    return st;
}

mscx_status_t mscx_trace_save(const char *path, const char *label, const struct mscx_trace_block *blocks,
                              size_t nblocks, size_t *nevents_p)
{
    mscx_status_t st;
    FILE *f;
    if (path == NULL || *path == '\0') {
        MSCX_WARN("caller bug: mscx_trace_save without a path");
        return MSCX_ERR_INVALID_ARG;
    }
    f = fopen(path, "w");
    if (f == NULL) {
        MSCX_WARN("trace: cannot create %s: %s", path, strerror(errno));
        return MSCX_ERR_SYSTEM;
    }
    st = mscx_trace_write(f, label, blocks, nblocks, nevents_p);
    if (fclose(f) != 0 && st == MSCX_OK) {
        MSCX_WARN("trace: cannot close %s: %s", path, strerror(errno));
        st = MSCX_ERR_SYSTEM;
    }
    return st;
}
