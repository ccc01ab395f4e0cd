/* SPDX-License-Identifier: MIT */
/*
 * The launch compiler's judgement of a compiled program's accesses to the
 * user buffers, for calls whose placement differs from the plan's: an
 * out-of-place call on an in-place AllReduce plan runs the program split
 * onto both buffers (mscx_gpu_program_split), and an in-place call on an
 * out-of-place plan runs it on the aliased buffers when that gives the same
 * result (mscx_gpu_program_alias_ok). Either way the launch needs no staging
 * copy; where the program cannot be judged, the launch stages as before.
 */
#include "launch_abi.h"
#include "launch_compile_int.h"

/* ---- user-buffer accesses: mscx_gpu_program_split and mscx_gpu_program_alias_ok ---- */

/* One operand of a compiled entry that names the input or the output. */
struct prog_acc {
    uint64_t lo, hi;   /* bytes of the one buffer both name (in place, or aliased by the caller) */
    uint32_t blk, ent; /* the block, and the entry (index in prog->entry) */
    uint16_t opnd;     /* index in prog->opnd */
    uint8_t in;        /* names the input (else the output) */
    uint8_t wr;        /* a destination */
    uint8_t self;      /* a write: a COPY of exactly these bytes onto themselves */
};

static int prog_user(uint32_t base)
{
    return base == MSCX_KB_IN || base == MSCX_KB_OUT;
}

/*
 * Every operand of @p prog that names the input (at byte @p in_at of the one
 * buffer) or the output (at @p out_at), into @p acc (MSCX_PROGRAM_MAX_OPND).
 * @return the count, or -1 when the program cannot be judged: not compiled
 *         whole (an interpreter block, a GENERIC entry) or packet lines in a
 *         user buffer
 */
static int prog_accesses(const struct mscx_program *prog, uint32_t ntb, uint32_t pl, uint64_t in_at,
                         uint64_t out_at, struct prog_acc *acc)
{
    uint32_t n = 0;
    if (ntb == 0 || ntb > MSCX_PROGRAM_MAX_BLOCKS || prog->interp_mask)
        return -1;
    for (uint32_t b = 0; b < ntb; b++)
        for (uint32_t e = prog->kbegin[b]; e < prog->kbegin[b + 1]; e++) {
            const struct mscx_entry *k = &prog->entry[e];
            if (k->kind == MSCX_ENTRY_GENERIC)
                return -1;
            if (k->kind == MSCX_ENTRY_SKIP) /* moves nothing (an unpack fused away keeps its operands) */
                continue;
            for (uint32_t j = 0; j < (uint32_t)k->nsrc + k->ndst; j++) {
                const struct mscx_entry_opnd *d = &prog->opnd[k->opnd + j];
                uint64_t ext;
                if (!prog_user(d->base))
                    continue;
                if (!mscx_program_opnd_flat(k, j, pl, &ext) || n == MSCX_PROGRAM_MAX_OPND)
                    return -1;
                const int is_in = d->base == MSCX_KB_IN, wr = j >= k->nsrc;
                const uint64_t lo = (is_in ? in_at : out_at) + d->off;
                const struct mscx_entry_opnd *s0 = &prog->opnd[k->opnd];
                acc[n++] = (struct prog_acc){lo,
                                             lo + ext,
                                             b,
                                             e,
                                             (uint16_t)(k->opnd + j),
                                             (uint8_t)is_in,
                                             (uint8_t)wr,
                                             (uint8_t)(wr && k->kind == MSCX_ENTRY_COPY &&
                                                       s0->base == MSCX_KB_IN && in_at + s0->off == lo)};
            }
        }
    return (int)n;
}

/*
 * How far from @p lo the writes among @p acc cover without a gap, counting
 * only writes of block @p blk by entries before @p ent (UINT32_MAX for
 * either: any).
 */
static uint64_t prog_cover_end(const struct prog_acc *acc, uint32_t n, uint32_t blk, uint32_t ent,
                               uint64_t lo, uint64_t hi)
{
    uint64_t at = lo;
    for (int moved = 1; at < hi && moved;) {
        moved = 0;
        for (uint32_t i = 0; i < n; i++)
            if (acc[i].wr && (blk == UINT32_MAX || acc[i].blk == blk) &&
                (ent == UINT32_MAX || acc[i].ent < ent) && acc[i].lo <= at && at < acc[i].hi) {
                at = acc[i].hi;
                moved = 1;
            }
    }
    return at;
}

/* ---- out-of-place calls on an in-place AllReduce plan ---- */

int mscx_gpu_program_split(struct mscx_program *prog, uint32_t ntb, uint32_t pl, uint64_t out_bytes)
{
    static __thread struct prog_acc acc[MSCX_PROGRAM_MAX_OPND];
    static __thread uint8_t nbase[MSCX_PROGRAM_MAX_OPND];
    const int na = prog_accesses(prog, ntb, pl, 0, 0, acc);
    if (na < 0)
        return 0;
    const uint32_t n = (uint32_t)na;
    /* writes go to the output; reads to the input where nothing wrote before, to the output where this block
     * did */
    for (uint32_t i = 0; i < n; i++) {
        const struct prog_acc *r = &acc[i];
        if (r->wr) {
            nbase[r->opnd] = MSCX_KB_OUT;
            continue;
        }
        int before = 0;
        for (uint32_t q = 0; q < n; q++) {
            if (!acc[q].wr || acc[q].hi <= r->lo || r->hi <= acc[q].lo)
                continue;
            if (acc[q].blk != r->blk)
                return 0; /* another block writes these bytes: the order is not known here */
            before |= acc[q].ent < r->ent;
        }
        if (!before)
            nbase[r->opnd] = MSCX_KB_IN;
        else if (prog_cover_end(acc, n, r->blk, r->ent, r->lo, r->hi) >= r->hi)
            nbase[r->opnd] = MSCX_KB_OUT;
        else
            return 0; /* partly written before */
    }
    /* the result must be whole: bytes no entry writes would keep the output's old contents */
    if (prog_cover_end(acc, n, UINT32_MAX, UINT32_MAX, 0, out_bytes) < out_bytes)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        prog->opnd[acc[i].opnd].base = nbase[acc[i].opnd];
    return 1;
}

/* ---- in-place calls on an out-of-place plan ---- */

/* A barrier (a synced entry) after entry @p a and up to entry @p b, both of one block. */
static int prog_barrier_between(const struct mscx_program *prog, uint32_t a, uint32_t b)
{
    for (uint32_t e = a + 1; e <= b; e++)
        if (prog->entry[e].sync)
            return 1;
    return 0;
}

int mscx_gpu_program_alias_ok(const struct mscx_program *prog, uint32_t ntb, uint32_t pl, uint64_t in_at,
                              uint64_t out_at, uint64_t in_bytes)
{
    static __thread struct prog_acc acc[MSCX_PROGRAM_MAX_OPND];
    const int na = prog_accesses(prog, ntb, pl, in_at, out_at, acc);
    if (na < 0)
        return 0;
    const uint32_t n = (uint32_t)na;
    for (uint32_t i = 0; i < n; i++)
        if (acc[i].wr && acc[i].in)
            return 0; /* the plan writes its input: only staging keeps the caller's send buffer */
    const uint64_t ilo = in_at, ihi = in_at + in_bytes;
    for (uint32_t i = 0; i < n; i++) {
        const struct prog_acc *r = &acc[i];
        if (r->wr)
            continue;
        for (uint32_t q = 0; q < n; q++) {
            const struct prog_acc *w = &acc[q];
            if (!w->wr || w->self || w->hi <= r->lo || r->hi <= w->lo)
                continue;
            if (w->blk != r->blk)
                return 0; /* another block writes what this read needs: no order known */
            if (w->ent < r->ent) {
                if (r->in)
                    return 0; /* the input read would see what the write put there */
            } else if (w->ent == r->ent) {
                const uint8_t kind = prog->entry[r->ent].kind;
                if (!r->in || w->lo != r->lo || w->hi != r->hi ||
                    !(kind == MSCX_ENTRY_COPY || kind == MSCX_ENTRY_REDUCE || kind == MSCX_ENTRY_REDPKT))
                    return 0;
            } else if (r->in && !prog_barrier_between(prog, r->ent, w->ent)) {
                return 0; /* a later entry overwrites bytes an earlier one reads, with no barrier between */
            }
        }
        /* an output read where the input lies, not written here first: it would read the input */
        if (!r->in && r->lo < ihi && ilo < r->hi &&
            prog_cover_end(acc, n, r->blk, r->ent, r->lo, r->hi) < r->hi)
            return 0;
    }
    return 1;
}
