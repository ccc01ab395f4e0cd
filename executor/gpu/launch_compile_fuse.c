/* SPDX-License-Identifier: MIT */
/*
 * The peepholes of the launch compiler: passes over a rank's compiled
 * program (launch_compile.c) that merge entries, so that the kernel makes
 * fewer passes over the same bytes, with the same result bit for bit. Within
 * one block, an UNPACK followed by the REDPKT that starts from its output
 * becomes one REDPKT, and PACKs of one source become one PACK with several
 * destinations; across the rank's program, a PACK into the rank's own
 * scratch read back by a later REDPKT is folded into that REDPKT. The
 * entries merged away become SKIPs, which a last pass drops.
 */
#include "launch_abi.h"
#include "launch_compile_int.h"
#include "plan_model.h"

static int prog_same(const struct mscx_entry_opnd *x, const struct mscx_entry_opnd *y)
{
    return x->base == y->base && x->off == y->off;
}

/*
 * Entries [kb, ke) of one block: an UNPACK of lines A into flat X directly
 * followed by a REDPKT whose flat source and first destination are that X,
 * over the same units, becomes one REDPKT that starts from A's lines (the
 * generated one-shot AllReduce unpacks rank 0's packets and then folds in
 * the other ranks', so that every rank sums in rank order). Each thread
 * keeps the units it had in both, so X gets the same values, with one pass
 * fewer; the UNPACK's place stays as a SKIP that keeps its barrier.
 */
static uint32_t prog_fuse_unpack(struct mscx_program *prog, uint32_t kb, uint32_t ke)
{
    uint32_t fused = 0;
    for (uint32_t i = kb; i + 1 < ke; i++) {
        struct mscx_entry *u = &prog->entry[i], *r = &prog->entry[i + 1];
        if (u->kind != MSCX_ENTRY_UNPACK || r->kind != MSCX_ENTRY_REDPKT || r->lsrc0 || r->ndst == 0 ||
            u->units != r->units)
            continue;
        const struct mscx_entry_opnd *ua = &prog->opnd[u->opnd], *ux = &prog->opnd[u->opnd + 1];
        struct mscx_entry_opnd *r0 = &prog->opnd[r->opnd];
        if (!prog_same(ux, r0) || !prog_same(ux, &prog->opnd[r->opnd + r->nsrc]))
            continue;
        /* no other source or destination of the reduction may be X (it would see X before the unpack) */
        int clash = 0;
        for (uint32_t j = 1; j < (uint32_t)r->nsrc + r->ndst; j++)
            if (j != r->nsrc && prog_same(ux, &prog->opnd[r->opnd + j]))
                clash = 1;
        if (clash)
            continue;
        *r0 = *ua;
        r->lsrc0 = 1;
        u->kind = MSCX_ENTRY_SKIP;
        u->units = 0;
        fused++;
    }
    return fused;
}

/*
 * Entries [kb, ke) of one block: PACK entries in a row that read the same
 * flat source over the same units (a put-packets op with several
 * destinations compiles to one PACK per pair) become one PACK with all
 * their destinations, so each thread loads a unit once and stores it to
 * every destination. Each thread keeps its units and, per destination, the
 * order of its stores. Only entries laid out as prog_op (launch_compile.c) makes them (operands
 * in a row: source, destination) and without a barrier between them are
 * merged; the merged-away entries become SKIPs.
 */
static uint32_t prog_fuse_pack(struct mscx_program *prog, uint32_t kb, uint32_t ke)
{
    uint32_t fused = 0;
    for (uint32_t i = kb; i < ke; i++) {
        struct mscx_entry *p = &prog->entry[i];
        if (p->kind != MSCX_ENTRY_PACK || p->nsrc != 1 || p->ndst != 1)
            continue;
        const struct mscx_entry_opnd *src = &prog->opnd[p->opnd];
        uint32_t j = i + 1;
        while (j < ke && j - i < UINT8_MAX) {
            const struct mscx_entry *q = &prog->entry[j];
            if (q->kind != MSCX_ENTRY_PACK || q->sync || q->nsrc != 1 || q->ndst != 1 ||
                q->units != p->units || q->opnd != p->opnd + 2u * (j - i) ||
                !prog_same(src, &prog->opnd[q->opnd]))
                break;
            j++;
        }
        if (j == i + 1)
            continue;
        /* [src, d0, src, d1, ...] -> [src, d0, d1, ...]: each destination moves to an earlier slot */
        for (uint32_t m = i + 1; m < j; m++) {
            struct mscx_entry *q = &prog->entry[m];
            prog->opnd[p->opnd + 1u + (m - i)] = prog->opnd[q->opnd + 1u];
            q->kind = MSCX_ENTRY_SKIP;
            q->units = 0;
            q->nsrc = q->ndst = 0;
        }
        p->ndst = (uint8_t)(j - i);
        fused += j - i - 1;
        i = j - 1;
    }
    return fused;
}

/*
 * Drop the SKIP entries that fusion left (a SKIP's barrier moves to the
 * entry after it; a SKIP that ends its block stays, with its barrier), so
 * that the kernel does not pay a loop step for them.
 */
static void prog_compact(struct mscx_program *prog, uint32_t ntb)
{
    uint32_t out = 0;
    for (uint32_t b = 0; b < ntb; b++) {
        uint32_t kb = prog->kbegin[b], ke = prog->kbegin[b + 1], pending = 0;
        prog->kbegin[b] = (uint16_t)out;
        for (uint32_t i = kb; i < ke; i++) {
            struct mscx_entry k = prog->entry[i];
            if (k.kind == MSCX_ENTRY_SKIP && i + 1 < ke) {
                pending |= k.sync;
                continue;
            }
            k.sync |= (uint8_t)pending;
            pending = 0;
            prog->entry[out++] = k;
        }
    }
    prog->kbegin[ntb] = (uint16_t)out;
}

/* ---- a pack into the rank's own scratch read flat by a later reduction ---- */

/* Bytes [lo, hi) of one memory of the rank; input and output count as one (an in-place call aliases them). */
struct prog_span {
    uint32_t space; /* MSCX_KB_IN (input or output), MSCX_KB_SCRATCH, MSCX_KB_RBUF + k */
    uint64_t lo, hi;
};

static struct prog_span prog_span_of(const struct mscx_program *prog, const struct mscx_entry *k, uint32_t j,
                                     uint32_t pl)
{
    const struct mscx_entry_opnd *d = &prog->opnd[k->opnd + j];
    uint64_t ext;
    mscx_program_opnd_flat(k, j, pl, &ext);
    return (struct prog_span){d->base == MSCX_KB_OUT ? MSCX_KB_IN : d->base, d->off, d->off + ext};
}

static int prog_meet(const struct prog_span *a, const struct prog_span *b)
{
    return a->space == b->space && a->lo < b->hi && b->lo < a->hi;
}

/*
 * Whether some op of the plan reads a peer's memory (get, read-reduce, a
 * multicast load: any remote or switch source). Such a peer could read the
 * lines of a pack this pass removes; the pass judges only this rank's
 * program, so it gives up on such plans altogether.
 */
static int prog_plan_reads_peers(const struct mscx_plan *plan)
{
    if (plan->has_multicast)
        return 1;
    for (uint32_t q = 0; q < plan->nranks; q++)
        for (uint32_t i = 0; i < plan->gpus[q].nops; i++) {
            const struct mscx_dev_op *op = &plan->gpus[q].ops[i];
            if (op->opcode == MSCX_OP_GET || op->opcode == MSCX_OP_READ_REDUCE ||
                op->opcode == MSCX_OP_READ_REDUCE_SEND || op->opcode == MSCX_OP_MULTI_LOAD_REDUCE_STORE)
                return 1;
            for (uint32_t s = 0; s < op->nsrc; s++)
                if (op->src[s].flags & (MSCX_OPND_REMOTE | MSCX_OPND_SWITCH))
                    return 1;
        }
    return 0;
}

/*
 * Whether some op of any rank (this one through its remote-buffer table
 * included) may write @p sp, bytes of rank @p rank's own memory: a write
 * into its user buffers at all, or into its scratch across @p sp (lines of
 * packet ops at twice the logical offset, whole operands, slices ignored).
 * @p slot: the rank's chunk slot at this launch (its scratch's geometry).
 */
static int prog_peer_writes(const struct mscx_plan *plan, uint32_t rank, uint64_t slot,
                            const struct prog_span *sp)
{
    for (uint32_t q = 0; q < plan->nranks; q++) {
        const struct mscx_gpu *g = &plan->gpus[q];
        for (uint32_t i = 0; i < g->nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            for (uint32_t d = 0; d < op->ndst; d++) {
                const struct mscx_dev_operand *o = &op->dst[d];
                if (o->flags & MSCX_OPND_SWITCH)
                    return 1;
                if (!(o->flags & MSCX_OPND_REMOTE))
                    continue;
                if (o->rbuf >= g->nrbuf)
                    return 1;
                if (g->rbuf[o->rbuf].rank != rank)
                    continue;
                if (g->rbuf[o->rbuf].type != MSCX_BUF_SCRATCH || (op->flags & MSCX_OPF_IN_PIPELINE))
                    return 1; /* user-buffer chunk mapping, pipeline strides: not judged here */
                if (sp->space != MSCX_KB_SCRATCH)
                    continue;
                uint64_t lo = (uint64_t)o->index * slot, hi = lo + (uint64_t)o->size * slot;
                if (mscx_opcode_is_packet(op->opcode)) { /* a peer's scratch in a packet op: lines */
                    lo *= 2u;
                    hi *= 2u;
                }
                if (lo < sp->hi && sp->lo < hi)
                    return 1;
            }
        }
    }
    return 0;
}

/*
 * Whether REDPKT entry @p ri (block @p b) may read source @p j, the lines L
 * that PACK entry @p pi of the same block wrote from flat X, as X itself:
 * the same bits whenever X holds at ri what it held at pi and nothing else
 * ever looks at L.
 */
static int prog_fold_ok(const struct mscx_program *prog, uint32_t ntb, uint32_t b, uint32_t pi, uint32_t ri,
                        uint32_t j, uint32_t pl)
{
    const struct mscx_entry *p = &prog->entry[pi], *r = &prog->entry[ri];
    const struct prog_span X = prog_span_of(prog, p, 0, pl), L = prog_span_of(prog, p, 1, pl);
    if (X.space >= MSCX_KB_RBUF)
        return 0; /* a peer's memory: it may change between the two */
    if (prog_meet(&X, &L))
        return 0;
    for (uint32_t bb = 0; bb < ntb; bb++)
        for (uint32_t e = prog->kbegin[bb]; e < prog->kbegin[bb + 1]; e++) {
            const struct mscx_entry *k = &prog->entry[e];
            /* a SKIP moves nothing (a fused unpack keeps its operands) */
            if (e == pi || k->kind == MSCX_ENTRY_SKIP)
                continue;
            for (uint32_t jj = 0; jj < (uint32_t)k->nsrc + k->ndst; jj++) {
                if (e == ri && jj == j)
                    continue;
                const struct prog_span s = prog_span_of(prog, k, jj, pl);
                if (prog_meet(&s, &L))
                    return 0; /* L is read or written elsewhere: it must keep the pack's lines */
                if (!prog_meet(&s, &X))
                    continue;
                if (e == ri) {
                    /* the flat destination may be X exactly: thread u reads unit u before it writes it */
                    if (jj == r->nsrc && s.lo == X.lo && s.hi == X.hi)
                        continue;
                    return 0; /* another source is X, or a destination overlaps it elsewhere */
                }
                if (jj < k->nsrc)
                    continue; /* another read of X changes nothing */
                if (bb != b || (pi < e && e < ri))
                    return 0; /* X may change between the pack and the reduction */
            }
        }
    return 1;
}

/*
 * A PACK of flat X into lines L of the rank's own scratch, read back by a
 * later REDPKT of the same block over the same units as one of its line
 * sources (src[1..]): the REDPKT reads X flat there instead (fsrc) and the
 * PACK becomes a SKIP that keeps its barrier. The one-shot AllReduce has
 * this shape on every rank after 0: it packs its own input into its own
 * slot only to fold that slot back in rank order. The payload of a line is
 * the flat unit it was packed from, bit for bit, and each thread handles
 * the same units in both entries, so X gives the same values when nothing
 * writes X between the two and nothing else reads or writes L (prog_fold_ok),
 * and no peer can read or write them. At most one such source per REDPKT
 * (the kernel tests one index). Runs on the whole rank's program after
 * prog_fuse_unpack; @p slot is the rank's chunk slot at this launch.
 * @return the packs folded
 */
static uint32_t prog_fold_pack(struct mscx_program *prog, uint32_t ntb, const struct mscx_plan *plan,
                               uint32_t rank, const struct mscx_dev_op *ops, uint64_t slot, uint32_t pl)
{
    uint32_t folded = 0;
    int judged = 0;
    if (prog->interp_mask)
        return 0; /* an interpreter block's accesses are not in the program */
    for (uint32_t b = 0; b < ntb; b++)
        for (uint32_t ri = prog->kbegin[b]; ri < prog->kbegin[b + 1]; ri++) {
            struct mscx_entry *r = &prog->entry[ri];
            if (r->kind != MSCX_ENTRY_REDPKT)
                continue;
            for (uint32_t j = 1; j < r->nsrc && !r->fsrc; j++) {
                struct mscx_entry_opnd *s = &prog->opnd[r->opnd + j];
                if (s->base != MSCX_KB_SCRATCH)
                    continue;
                /* the block's last PACK before r into these lines (an earlier one fails prog_fold_ok) */
                uint32_t pi = UINT32_MAX;
                for (uint32_t e = prog->kbegin[b]; e < ri; e++)
                    if (prog->entry[e].kind == MSCX_ENTRY_PACK &&
                        prog_same(&prog->opnd[prog->entry[e].opnd + 1], s))
                        pi = e;
                if (pi == UINT32_MAX)
                    continue;
                struct mscx_entry *p = &prog->entry[pi];
                if (p->units != r->units)
                    continue;
                if (!judged) { /* once per program, and only where there is a candidate */
                    judged = 1;
                    if (prog_plan_reads_peers(plan))
                        return folded;
                    for (uint32_t bb = 0; bb < ntb; bb++)
                        for (uint32_t e = prog->kbegin[bb]; e < prog->kbegin[bb + 1]; e++) {
                            /* a data op left to the interpreter: its bytes are not known here */
                            const struct mscx_dev_op *op = &ops[prog->obase[bb] + prog->entry[e].op];
                            if (prog->entry[e].kind == MSCX_ENTRY_GENERIC && op->nsrc + op->ndst > 0)
                                return folded;
                        }
                }
                const struct mscx_entry_opnd *x = &prog->opnd[p->opnd];
                const struct prog_span X = prog_span_of(prog, p, 0, pl), L = prog_span_of(prog, p, 1, pl);
                if (!prog_fold_ok(prog, ntb, b, pi, ri, j, pl) || prog_peer_writes(plan, rank, slot, &L) ||
                    prog_peer_writes(plan, rank, slot, &X))
                    continue;
                *s = *x;
                r->fsrc = (uint8_t)j;
                p->kind = MSCX_ENTRY_SKIP;
                p->units = 0;
                folded++;
            }
        }
    return folded;
}

void mscx_program_fuse(struct mscx_program *prog, uint32_t ntb, const struct mscx_plan *plan, uint32_t rank,
                       const struct mscx_dev_op *ops, uint64_t slot, uint32_t pl)
{
    for (uint32_t b = 0; b < ntb; b++)
        if (!(prog->interp_mask & (1u << b)))
            prog_fuse_unpack(prog, prog->kbegin[b], prog->kbegin[b + 1]);
    /* the pack folded into a reduction first: merging packs would hide it among a peer-bound PACK's
     * destinations */
    prog_fold_pack(prog, ntb, plan, rank, ops, slot, pl);
    for (uint32_t b = 0; b < ntb; b++)
        if (!(prog->interp_mask & (1u << b)))
            prog_fuse_pack(prog, prog->kbegin[b], prog->kbegin[b + 1]);
    prog_compact(prog, ntb);
}
